"""The exit codes of the README's table, each made to happen with the real CLI (a subprocess)
against simulated servers on the local transport, and the systemd unit that relies on them."""

from __future__ import annotations

import json
import signal
import subprocess
import time
from pathlib import Path
from typing import Any

import pytest

from launcher.cli.app import (
    EXIT_ERROR,
    EXIT_GAVE_UP,
    EXIT_NOT_READY,
    EXIT_OK,
    EXIT_USAGE,
    EXIT_WONT_FIT,
)
from tests.simhost import free_port
from tests.supervise import SERVER, SimSetup, cli_argv, cli_env, json_lines, run_cli

pytestmark = pytest.mark.timeout(90)

UNIT = Path(__file__).resolve().parents[2] / "systemd" / "launcher@.service"


def quick(sim: SimSetup, **kwargs: Any) -> dict[str, Any]:
    return sim.data(mem_fraction_static=0.8, cuda_graph_max_bs=8, **kwargs)


def with_second_server(data: dict[str, Any], **changes: Any) -> dict[str, Any]:
    """``data`` plus a second server on GPU 1 and its own port."""
    second = dict(data["servers"][0], name="sim1", gpus=[1], port=free_port(), **changes)
    data["servers"].append(second)
    return data


@pytest.mark.parametrize("command", ["up", "check"])
def test_malformed_slack_webhook_is_a_config_error_before_anything_starts(
    sim: SimSetup, command: str,
) -> None:
    """A webhook URL without a scheme: exit 2 with one short error naming where the URL comes
    from and the fix, the value not shown, no traceback, nothing started (the bug: a 106-line
    traceback and exit 1). `check` validates it the same way."""
    config = sim.write_toml(quick(sim))
    bad = "hooks.slack.com/services/T000/B000/secret-token-value"

    args = ["--log-format", "json"] if command == "up" else []
    up = run_cli(command, str(config), *args, env={"LAUNCHER_SLACK_WEBHOOK": bad})

    assert EXIT_USAGE == up.returncode, up.stderr
    assert "Traceback" not in up.stderr
    assert len(up.stderr.strip().splitlines()) <= 4, up.stderr
    assert "LAUNCHER_SLACK_WEBHOOK: the Slack webhook URL must be https://" in up.stderr
    assert "secret-token-value" not in up.stderr + up.stdout
    assert not sim.run_dir.exists()


def test_check_names_where_a_valid_webhook_comes_from_without_showing_it(
    sim: SimSetup,
) -> None:
    """`check` with a well-formed webhook says where it is read from, never the value."""
    config = sim.write_toml(quick(sim))
    good = "https://hooks.slack.com/services/T000/B000/secret-token-value"

    result = run_cli("check", str(config), env={"LAUNCHER_SLACK_WEBHOOK": good})

    assert "slack: ok  webhook from $LAUNCHER_SLACK_WEBHOOK" in result.stdout, result.stdout
    assert "secret-token-value" not in result.stdout + result.stderr


@pytest.mark.parametrize("command", ["up", "status", "check"])
def test_a_config_without_servers_is_a_config_error(sim: SimSetup, command: str) -> None:
    """No [[servers]]: exit 2 and "no servers configured", printed as written (the brackets
    are text, not markup)."""
    data = quick(sim)
    data["servers"] = []
    config = sim.write_toml(data)

    result = run_cli(command, str(config))

    assert EXIT_USAGE == result.returncode, result.stderr
    assert "servers: no servers configured; add a [[servers]] table" in result.stderr


def test_up_exits_4_when_every_server_gave_up(sim: SimSetup) -> None:
    """`up` (no --until-ready) whose only server gives up has nothing left to supervise: it
    exits 4, which the systemd unit does not restart."""
    config = sim.write_toml(quick(sim, server={"extra_args": ["--no-such-flag"]}))

    up = run_cli("up", str(config), "--log-format", "json")

    assert EXIT_GAVE_UP == up.returncode, up.stderr
    assert "sim0 gave up: bad_argument in init" in up.stderr


def test_sigterm_exits_0_even_when_some_server_gave_up(sim: SimSetup) -> None:
    """One server gave up, the other is ready; SIGTERM (what `systemctl stop` sends) ends
    launcher with 0: a requested stop is success."""
    data = with_second_server(quick(sim), extra_args=["--no-such-flag"])
    config = sim.write_toml(data)
    proc = subprocess.Popen(
        cli_argv("up", str(config), "--log-format", "json"), env=cli_env(),
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, start_new_session=True,
    )
    seen: list[dict[str, Any]] = []
    try:
        assert proc.stdout is not None
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline and not (
            {("sim0", "server.ready"), ("sim1", "server.gave_up")}
            <= {(e.get("server"), e.get("event")) for e in seen}
        ):
            line = proc.stdout.readline()
            if not line:
                break
            seen.extend(json_lines(line))
        proc.send_signal(signal.SIGTERM)
        _, stderr = proc.communicate(timeout=30)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.communicate()

    assert {("sim0", "server.ready"), ("sim1", "server.gave_up")} <= {
        (e.get("server"), e.get("event")) for e in seen}
    assert EXIT_OK == proc.returncode, stderr
    assert "sim1 gave up" in stderr


def test_status_exits_0_only_when_every_server_runs_and_is_ready(sim: SimSetup) -> None:
    """status: 3 before anything ran, 0 with both servers ready, 3 once one is stopped."""
    config = sim.write_toml(with_second_server(quick(sim)))

    before = run_cli("status", str(config), "--json")
    assert EXIT_NOT_READY == before.returncode, before.stderr
    up = run_cli("up", str(config), "--until-ready", "--log-format", "json")
    assert EXIT_OK == up.returncode, up.stderr
    both = run_cli("status", str(config), "--json")
    assert EXIT_OK == both.returncode, both.stdout + both.stderr
    assert [True, True] == [r["ready"] for r in json.loads(both.stdout)]
    down = run_cli("down", str(config), "--server", "sim1")
    assert EXIT_OK == down.returncode, down.stderr

    one = run_cli("status", str(config), "--json")
    assert EXIT_NOT_READY == one.returncode
    assert {SERVER: True, "sim1": False} == {r["server"]: r["running"]
                                             for r in json.loads(one.stdout)}
    assert EXIT_OK == run_cli("status", str(config), "--server", SERVER).returncode


def test_the_unit_does_not_restart_on_usage_errors_or_when_every_server_gave_up() -> None:
    """RestartPreventExitStatus= lists exactly the codes a restart cannot fix (2, 4 and 5);
    unexpected errors (1) are restarted by Restart=on-failure."""
    settings: dict[str, str] = {}
    for line in UNIT.read_text().splitlines():
        key, sep, value = line.partition("=")
        if sep and not line.startswith("#"):
            settings[key.strip()] = value.strip()
    assert "on-failure" == settings["Restart"]
    prevented = {int(code) for code in settings["RestartPreventExitStatus"].split()}
    assert {EXIT_USAGE, EXIT_GAVE_UP, EXIT_WONT_FIT} == prevented
    assert EXIT_ERROR not in prevented
