"""First contact with the `launcher` command line, through the real CLI (a subprocess):
`--version`, the help text (exit codes, metavars), `LAUNCHER_CONFIG`, `history`'s
positional config, and `logs --tail/--attempt`."""

from __future__ import annotations

import pytest

import launcher
from tests.supervise import run_cli

pytestmark = pytest.mark.timeout(90)


def test_version_prints_the_package_version() -> None:
    result = run_cli("--version")

    assert result.returncode == 0, result.stderr
    assert result.stdout.strip() == f"launcher {launcher.__version__}"


def test_help_lists_the_exit_codes() -> None:
    """Every exit code of the README's table is in `launcher --help` and a command's help."""
    for args in (("--help",), ("up", "--help"), ("status", "--help")):
        result = run_cli(*args)
        assert result.returncode == 0, result.stderr
        text = " ".join(result.stdout.split())
        assert "Exit codes: 0 ok" in text, args
        for code, meaning in (("1", "unexpected error"), ("2", "config or usage error"),
                              ("3", "status: some server not ready"),
                              ("4", "up: every server gave up")):
            assert f"{code} {meaning}" in text, (args, code)


@pytest.mark.parametrize(("command", "usage"), [
    ("up", "up [OPTIONS] CONFIG"),
    ("logs", "logs [OPTIONS] CONFIG SERVER"),
    ("history", "history [OPTIONS] [SERVER]"),
    ("diagnose", "diagnose [OPTIONS] LOGFILE"),
])
def test_help_metavars_are_conventional(command: str, usage: str) -> None:
    """Arguments read CONFIG / [SERVER], never typer's ``{config_path}``; flags carry no
    ``<bool>`` type; the top level's usage still names the subcommand."""
    result = run_cli(command, "--help")

    assert result.returncode == 0, result.stderr
    assert f"Usage: python -m launcher.cli {usage} " in result.stdout, result.stdout
    assert "{" not in result.stdout and "<bool>" not in result.stdout, result.stdout
    top = run_cli("--help").stdout
    assert "[OPTIONS] COMMAND [ARGS]..." in top and "<bool>" not in top, top
