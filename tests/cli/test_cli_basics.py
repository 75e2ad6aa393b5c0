"""First contact with the `launcher` command line, through the real CLI (a subprocess):
`--version`, the help text (exit codes, metavars), `LAUNCHER_CONFIG`, `history`'s
positional config, and `logs --tail/--attempt`."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import anyio
import pytest

import launcher
from launcher.cli.logs import _tail_offset
from launcher.host import run
from launcher.host.transport.local import LocalTransport
from tests.supervise import SERVER, SimSetup, run_cli

pytestmark = pytest.mark.timeout(90)


@pytest.fixture
def sim(tmp_path: Path) -> Iterator[SimSetup]:
    setup = SimSetup.create(tmp_path)
    try:
        yield setup
    finally:
        setup.cleanup()


def quick(sim: SimSetup) -> dict[str, Any]:
    return sim.data(mem_fraction_static=0.8, cuda_graph_max_bs=8)


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
    ("up", "up [OPTIONS] [CONFIG]"),
    ("logs", "logs [OPTIONS] [CONFIG] SERVER"),
    ("describe", "describe [OPTIONS] [CONFIG] SERVER"),
    ("status", "status [OPTIONS] [CONFIG]"),
    ("history", "history [OPTIONS] [CONFIG] [SERVER]"),
    ("diagnose", "diagnose [OPTIONS] LOGFILE"),
])
def test_help_metavars_are_conventional(command: str, usage: str) -> None:
    """Arguments read CONFIG / [SERVER] (CONFIG in brackets: LAUNCHER_CONFIG may stand in
    for it), never typer's ``{config_path}``; flags carry no
    ``<bool>`` type; the top level's usage still names the subcommand."""
    result = run_cli(command, "--help")

    assert result.returncode == 0, result.stderr
    assert f"Usage: python -m launcher.cli.main {usage} " in result.stdout, result.stdout
    assert "{" not in result.stdout and "<bool>" not in result.stdout, result.stdout
    top = run_cli("--help").stdout
    assert "[OPTIONS] COMMAND [ARGS]..." in top and "<bool>" not in top, top


def test_launcher_config_is_the_default_config(sim: SimSetup, tmp_path: Path) -> None:
    """LAUNCHER_CONFIG stands in for CONFIG, like KUBECONFIG; a CONFIG on the command line
    wins over it."""
    config = sim.write_toml(quick(sim))
    other = tmp_path / "elsewhere"
    other.mkdir()
    data = quick(sim)
    data["servers"][0]["name"] = "other"
    other_config = sim.write_toml(data, name="elsewhere/other.toml")

    from_env = run_cli("plan", "--json", env={"LAUNCHER_CONFIG": str(config)})
    given = run_cli("plan", str(other_config), "--json", env={"LAUNCHER_CONFIG": str(config)})

    assert from_env.returncode == 0, from_env.stderr
    assert [SERVER] == [r["server"] for r in json.loads(from_env.stdout)]
    assert given.returncode == 0, given.stderr
    assert ["other"] == [r["server"] for r in json.loads(given.stdout)]


def test_logs_server_alone_reads_the_config_from_launcher_config(sim: SimSetup) -> None:
    """`logs SERVER` with LAUNCHER_CONFIG set asks that config's host about SERVER (it has
    no attempt yet: a usage error naming it and its host)."""
    config = sim.write_toml(quick(sim))

    result = run_cli("logs", SERVER, env={"LAUNCHER_CONFIG": str(config)})

    assert result.returncode == 2, result.stderr
    assert f"{SERVER} has no attempt on" in result.stderr, result.stderr


@pytest.mark.parametrize("command", ["up", "plan", "status", "down", "check", "logs"])
def test_no_config_anywhere_is_a_usage_error_naming_both_ways(command: str) -> None:
    result = run_cli(command)

    assert result.returncode == 2, result.stderr
    assert "no config given" in result.stderr, result.stderr
    assert "pass CONFIG" in result.stderr and "set LAUNCHER_CONFIG=" in result.stderr
    assert "Traceback" not in result.stderr


def test_logs_with_one_argument_and_no_launcher_config_asks_for_the_server() -> None:
    result = run_cli("logs", "launcher.toml")

    assert result.returncode == 2, result.stderr
    assert "`launcher logs launcher.toml`: SERVER missing" in result.stderr, result.stderr
    assert "LAUNCHER_CONFIG is not set" in result.stderr, result.stderr


@pytest.mark.parametrize("command", ["status", "history"])
def test_a_launcher_config_naming_no_file_says_it_came_from_there(
    command: str, tmp_path: Path
) -> None:
    """A LAUNCHER_CONFIG left pointing at a moved config: the error names the variable (a
    plain "no such file" would not say where the path came from), exit 2."""
    gone = tmp_path / "moved.toml"
    result = run_cli(command, env={"LAUNCHER_CONFIG": str(gone)})

    assert result.returncode == 2, result.stderr
    assert f"LAUNCHER_CONFIG={gone}: no such file" in result.stderr, result.stderr
    assert "Traceback" not in result.stderr


def test_history_takes_the_config_as_an_argument(sim: SimSetup) -> None:
    """`history CONFIG [SERVER]` like every other command (a server the config does not name is
    the usage error the others give, exit 2); the older `history SERVER -c CONFIG` still
    works, and `history SERVER` reads the config from LAUNCHER_CONFIG."""
    config = sim.write_toml(quick(sim))
    up = run_cli("up", str(config), "--until-ready", "--log-format", "json")
    assert up.returncode == 0, up.stderr + up.stdout

    def attempts(*args: str, env: dict[str, str] | None = None) -> list[tuple[str, int]]:
        result = run_cli("history", *args, "--json", env=env)
        assert result.returncode == 0, (args, result.stderr)
        return [(r["server"], r["attempt"]) for r in json.loads(result.stdout)]

    assert [(SERVER, 1)] == attempts(str(config))
    assert [(SERVER, 1)] == attempts(str(config), SERVER)
    nosuch = run_cli("history", str(config), "nosuch")
    assert 2 == nosuch.returncode, nosuch.stdout + nosuch.stderr
    assert f"servers: no server named 'nosuch'; known: {SERVER}" in nosuch.stderr
    assert "" == nosuch.stdout
    assert [(SERVER, 1)] == attempts(SERVER, "-c", str(config))
    assert [(SERVER, 1)] == attempts(SERVER, env={"LAUNCHER_CONFIG": str(config)})
    assert [(SERVER, 1)] == attempts(env={"LAUNCHER_CONFIG": str(config)})

    both = run_cli("history", str(config), SERVER, "-c", str(config))
    assert both.returncode == 2 and "CONFIG given twice" in both.stderr, both.stderr
    run_cli("down", str(config))


def test_status_wide_and_json_together_is_a_usage_error(sim: SimSetup) -> None:
    """`status -o wide --json` asks for two formats: exit 2 naming both, before any host is
    asked; `-o json --json` asks for one."""
    config = sim.write_toml(quick(sim))

    both = run_cli("status", str(config), "-o", "wide", "--json")
    same = run_cli("status", str(config), "-o", "json", "--json")

    assert 2 == both.returncode, both.stdout + both.stderr
    assert both.stderr.startswith("UsageError: --output wide and --json"), both.stderr
    assert "" == both.stdout
    assert 3 == same.returncode, same.stderr  # not started
    assert "not started" == json.loads(same.stdout)[0]["state"]


def test_logs_tail_and_attempt_read_a_failed_attempts_log(sim: SimSetup) -> None:
    """`logs --attempt N` prints attempt N's log byte for byte (here the attempt that died in
    the weights phase), `--tail N` its last N lines; an attempt that does not exist is a usage
    error naming the newest."""
    data = sim.data(mem_fraction_static=0.8, cuda_graph_max_bs=8,
                    faults=[{"kind": "die_silently", "phase": "weights", "attempts": [1]}])
    config = sim.write_toml(data)
    up = run_cli("up", str(config), "--until-ready", "--log-format", "json")
    assert up.returncode == 0, up.stderr + up.stdout
    failed = (sim.run_dir / SERVER / "1" / "log").read_text()
    current = (sim.run_dir / SERVER / "2" / "log").read_text()
    assert failed != current and failed.strip()

    def logs(*args: str) -> str:
        result = run_cli("logs", str(config), SERVER, *args)
        assert result.returncode == 0, (args, result.stderr)
        return result.stdout

    assert failed == logs("--attempt", "1")
    assert current == logs()
    assert current == logs("--attempt", "2")
    assert "".join(current.splitlines(keepends=True)[-3:]) == logs("--tail", "3")
    assert "".join(failed.splitlines(keepends=True)[-2:]) == logs("--attempt", "1", "--tail", "2")
    assert "" == logs("--tail", "0")
    assert current == logs("--tail", "100000")

    missing = run_cli("logs", str(config), SERVER, "--attempt", "9")
    assert missing.returncode == 2, missing.stderr
    assert f"{SERVER} has no attempt 9" in missing.stderr
    assert "newest attempt is 2" in missing.stderr
    run_cli("down", str(config))


@pytest.mark.parametrize("text", ["a\nbb\n\nccc\ndddd\n", "a\nbb\n\nccc\ndddd", "", "\n\n"])
def test_tail_offset_reads_backwards_across_chunks(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, text: str
) -> None:
    """`logs --tail N`'s start offset, with chunks of 3 bytes so that lines and newlines
    straddle chunk boundaries: the log from it is exactly the last N lines."""
    (tmp_path / "log").write_text(text)
    handle = run.RunHandle("s", 1, str(tmp_path), 0)
    monkeypatch.setattr(run, "READ_CHUNK", 3)

    async def offsets() -> list[int]:
        t = LocalTransport("local")
        try:
            return [await _tail_offset(t, handle, n) for n in range(7)]
        finally:
            await t.aclose()

    for n, offset in enumerate(anyio.run(offsets)):
        lines = text.splitlines(keepends=True)
        assert "".join(lines[max(0, len(lines) - n):] if n else []) == text[offset:], n


@pytest.mark.parametrize("command", ["up", "down", "status", "check", "plan"])
def test_a_server_option_naming_nothing_is_headed_with_the_config_file(
    sim: SimSetup, command: str
) -> None:
    """`--server nosuch`: exit 2, one config error headed with the config file (as the
    config's other errors are, not "config:"), the known names listed, nothing started."""
    config = sim.write_toml(quick(sim))
    result = run_cli(command, str(config), "--server", "nosuch")
    assert 2 == result.returncode, result.stdout + result.stderr
    assert result.stderr.startswith(
        f"ConfigError: {config}: 1 problem(s):\n  servers: no server named 'nosuch'; "
        f"known: {SERVER}"), result.stderr
    assert [] == sim.attempts()
