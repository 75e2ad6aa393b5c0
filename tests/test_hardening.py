"""Hostile and broken input (issue 17): text from servers, hosts and configs is never rich
markup; forged run-directory files are reported and skipped; remote data is bounded."""

from __future__ import annotations

import io
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from rich.console import Console

from launcher import cli
from launcher.errors import RemoteCommandError
from launcher.supervisor import Snapshot
from tests.supervise import SimSetup, run_cli

pytestmark = pytest.mark.timeout(90)

MARKUP = "ValueError: x [/] [link=https://evil.example/]click[/link] [bold red]loud"


@pytest.fixture
def sim(tmp_path: Path) -> Iterator[SimSetup]:
    setup = SimSetup.create(tmp_path)
    try:
        yield setup
    finally:
        setup.cleanup()


def script_server(sim: SimSetup, code: str, **kwargs: Any) -> dict[str, Any]:
    """A config whose server is ``python -c code`` (the launcher's flags land in argv)."""
    return sim.data(mem_fraction_static=0.8, cuda_graph_max_bs=8,
                    server={"command": [sys.executable, "-c", code]}, **kwargs)


def test_up_quotes_a_dying_servers_markup_verbatim(sim: SimSetup) -> None:
    """A server whose last words are rich markup (an unbalanced ``[/]``, a ``[link=...]``)
    makes `up` give up with exit 1 and those words printed verbatim, not a MarkupError."""
    code = f"import sys; print({MARKUP!r}, flush=True); sys.exit(1)"
    config = sim.write_toml(script_server(sim, code))

    up = run_cli("up", str(config), "--until-ready", "--log-format", "json")

    assert 1 == up.returncode, up.stderr
    assert "MarkupError" not in up.stderr
    assert "sim0 gave up" in up.stderr
    assert MARKUP in up.stderr


def rendered(renderable: Any) -> str:
    console = Console(record=True, width=400, file=io.StringIO())
    console.print(renderable)
    return console.export_text()


def test_live_view_and_messages_show_server_text_verbatim() -> None:
    """The live view's note cell and every message line show markup, links and emoji codes
    as the characters they are."""
    text = MARKUP + " :warning:"
    snap = Snapshot(server="s[/]", host="h[bold]", state="gave_up", phase=None, progress=None,
                    attempt=1, params="0.8/8", elapsed_s=1.0, pid=None, reason=text)
    view = rendered(cli._view([snap]))
    assert text in view and "s[/]" in view and "h[bold]" in view

    console = Console(record=True, width=400, file=io.StringIO())
    cli._say(console, ("sim0 gave up", "red"), f": {text}")
    cli._error(console, RemoteCommandError(text), "s[/]: ")
    lines = console.export_text().splitlines()
    assert [f"sim0 gave up: {text}", f"s[/]: RemoteCommandError: {text}"] == lines
