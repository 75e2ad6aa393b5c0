"""The `launcher` command line as a real subprocess against simulated SGLang servers on the
local transport: up, status, down, diagnose, plan, signals and exit codes."""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import time
from datetime import datetime
from pathlib import Path
from typing import Any

import pytest

from launcher.store.lock import DOWN, StateLock
from tests.simhost import free_port, model_dir
from tests.supervise import (
    SERVER,
    SimSetup,
    cli_argv,
    cli_env,
    json_lines,
    run_cli,
)

pytestmark = pytest.mark.timeout(90)

SECRET = "hf_do_not_print_me_3141"
STABLE_EVENTS = {"attempt.started", "phase.entered", "server.ready", "server.stopped"}


def quick_server(sim: SimSetup, **kwargs: Any) -> dict[str, Any]:
    """A config (TOML-shaped) whose tiny server gets ready at once."""
    return sim.data(mem_fraction_static=0.8, cuda_graph_max_bs=8, **kwargs)


def events(stdout: str) -> list[dict[str, Any]]:
    return [e for e in json_lines(stdout) if "event" in e]


def test_up_until_ready_then_status_then_down(sim: SimSetup) -> None:
    """`up --until-ready --log-format json` exits 0 at ready with JSON event lines and leaves
    the server running; `status --json` shows it running, ready and healthy; `down` stops it
    and reports its GPUs free; the secret never shows in output, argv or the command file."""
    data = quick_server(sim, server={"secret_env": {"HF_TOKEN": "env:TEST_HF_TOKEN"}})
    config = sim.write_toml(data)
    env = {"TEST_HF_TOKEN": SECRET}

    up = run_cli("up", str(config), "--until-ready", "--log-format", "json", env=env)
    assert 0 == up.returncode, up.stderr + up.stdout
    evs = events(up.stdout)
    names = [e["event"] for e in evs]
    assert STABLE_EVENTS <= set(names), names
    assert names.index("attempt.started") < names.index("server.ready")
    ready = next(e for e in evs if e["event"] == "server.ready")
    assert (SERVER, 1) == (ready["server"], ready["attempts"])
    assert {"mem_fraction_static": 0.8, "cuda_graph_max_bs": 8} == ready["params"]
    assert "left running: sim0" in up.stderr
    assert SECRET not in up.stdout + up.stderr
    assert SECRET not in sim.cmd(1)
    assert not (sim.attempt_dir(1) / "env").exists()  # read by the server, then removed
    assert sim.alive(1)

    status = run_cli("status", str(config), "--json")
    assert 0 == status.returncode, status.stderr
    [row] = json.loads(status.stdout)
    assert {"server": SERVER, "running": True, "ready": True, "healthy": True,
            "attempt": 1, "pid": sim.pid(1), "phase": "ready"} == {
        k: row[k] for k in ("server", "running", "ready", "healthy", "attempt", "pid", "phase")}
    assert {"mem_fraction_static": 0.8, "cuda_graph_max_bs": 8} == row["params"]

    down = run_cli("down", str(config))
    assert 0 == down.returncode, down.stderr
    # The last line: `down` does not configure structlog, so remote's info events come first.
    assert f"sim0: stopped (pid {sim.pid(1)}, SIGTERM); GPUs [0] free" == (
        down.stdout.strip().splitlines()[-1])
    assert not sim.alive(1)
    # SGL_FORCE_SHUTDOWN: SGLang's SIGTERM handler kills its own tree at once.
    assert "137" == (sim.attempt_dir(1) / "exit_status").read_text().strip()

    after = run_cli("status", str(config), "--json")
    assert 3 == after.returncode  # not running: not "everything is up"
    [row] = json.loads(after.stdout)
    assert (False, None, 1) == (row["running"], row["pid"], row["attempt"])


def test_up_with_a_bad_value_exits_2_naming_the_field(sim: SimSetup) -> None:
    """A config value out of range: exit 2, the field named, nothing started."""
    data = quick_server(sim)
    data["servers"][0]["mem_fraction_static"] = 1.5
    config = sim.write_toml(data)

    up = run_cli("up", str(config), "--until-ready", "--log-format", "json")

    assert 2 == up.returncode
    assert "servers[0].mem_fraction_static: 1.5 is not < 1" in up.stderr
    assert not sim.run_dir.exists()
    assert [] == events(up.stdout)


def test_up_with_a_bad_override_exits_2_naming_the_variable(sim: SimSetup) -> None:
    """An environment override out of range, addressed by the server's name: exit 2, the field
    and the variable named, nothing started."""
    config = sim.write_toml(quick_server(sim))
    var = f"LAUNCHER_SERVERS__{SERVER.upper()}__MEM_FRACTION_STATIC"
    up = run_cli("up", str(config), "--until-ready", "--log-format", "json", env={var: "1.3"})
    assert 2 == up.returncode, up.stderr
    assert f"servers[0].mem_fraction_static: '1.3' is not < 1 (from {var})" in up.stderr
    assert not sim.run_dir.exists()
    assert [] == events(up.stdout)


def test_up_reads_systemd_credentials(sim: SimSetup, tmp_path: Path) -> None:
    """With $CREDENTIALS_DIRECTORY (systemd LoadCredential=), a credential named like an
    override overrides the file and `cred:NAME` in secret_env reads the credential NAME; the
    secret reaches the server's environment and nothing else."""
    creds = tmp_path / "credentials"
    creds.mkdir()
    (creds / "hf-token").write_text(SECRET + "\n", encoding="utf-8")
    (creds / f"LAUNCHER_SERVERS__{SERVER.upper()}__CUDA_GRAPH_MAX_BS").write_text("4\n")
    config = sim.write_toml(quick_server(sim, server={"secret_env": {"HF_TOKEN": "cred:hf-token"}}))
    up = run_cli("up", str(config), "--until-ready", "--log-format", "json",
                 env={"CREDENTIALS_DIRECTORY": str(creds)})
    assert 0 == up.returncode, up.stderr + up.stdout
    ready = next(e for e in events(up.stdout) if e["event"] == "server.ready")
    assert {"mem_fraction_static": 0.8, "cuda_graph_max_bs": 4} == ready["params"]
    assert SECRET not in up.stdout + up.stderr + sim.cmd(1)
    # The server has it in its environment; the env file that carried it is gone.
    environ = Path(f"/proc/{sim.pid(1)}/environ").read_bytes().split(b"\0")
    assert f"HF_TOKEN={SECRET}".encode() in environ
    assert not (sim.attempt_dir(1) / "env").exists()
    assert 0 == run_cli("down", str(config)).returncode


def test_up_until_ready_with_a_fatal_server_exits_4(sim: SimSetup) -> None:
    """A server SGLang rejects: `up --until-ready` gives up after one attempt and exits 4
    (gave up), saying why."""
    config = sim.write_toml(quick_server(sim, server={"extra_args": ["--no-such-flag"]}))

    up = run_cli("up", str(config), "--until-ready", "--log-format", "json")

    assert 4 == up.returncode, up.stderr
    assert "sim0 gave up: bad_argument in init" in up.stderr
    assert "unrecognized arguments: --no-such-flag" in up.stderr
    names = [e["event"] for e in events(up.stdout)]
    assert 1 == names.count("attempt.started")
    assert "server.gave_up" in names
    assert [1] == sim.attempts()


def read_until(proc: subprocess.Popen[str], needle: str, timeout: float = 30.0) -> list[str]:
    """Lines of ``proc``'s stdout up to and including the first one containing ``needle``."""
    assert proc.stdout is not None
    lines: list[str] = []
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        line = proc.stdout.readline()
        if not line:
            break
        lines.append(line)
        if needle in line:
            return lines
    raise AssertionError(f"no {needle!r} in launcher's output:\n{''.join(lines)}")


def start_up(config: Path, *extra: str) -> subprocess.Popen[str]:
    return subprocess.Popen(
        cli_argv("up", str(config), "--log-format", "json", *extra),
        env=cli_env(), stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
        start_new_session=True,
    )


def test_sigterm_to_up_leaves_the_server_running_and_says_so(sim: SimSetup) -> None:
    """SIGTERM to a supervising `launcher up`: it exits 0, the server keeps running and
    launcher says it left it running."""
    config = sim.write_toml(quick_server(sim))
    proc = start_up(config)
    try:
        read_until(proc, '"server.ready"')
        proc.send_signal(signal.SIGTERM)
        stdout, stderr = proc.communicate(timeout=20)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.communicate()

    assert 0 == proc.returncode, stderr
    assert "left running: sim0" in stderr
    stopped = [e for e in events(stdout) if e["event"] == "server.stopped"]
    assert [sim.pid(1)] == [e["left_running"] for e in stopped]
    assert sim.alive(1)


def test_up_killed_mid_load_and_started_again_adopts_the_server(sim: SimSetup) -> None:
    """`launcher up` SIGKILLed while its server loads: the next `up --until-ready` adopts the
    server, follows it to ready and launches nothing new."""
    config = sim.write_toml(
        quick_server(sim, faults=[{"kind": "slow", "phase": "weights", "factor": 6}])
    )
    proc = start_up(config)
    try:
        read_until(proc, '"phase": "weights"')
        os.killpg(proc.pid, signal.SIGKILL)
        proc.communicate(timeout=10)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.communicate()
    assert sim.alive(1)

    again = run_cli("up", str(config), "--until-ready", "--log-format", "json")

    assert 0 == again.returncode, again.stderr
    names = [e["event"] for e in events(again.stdout)]
    assert "server.adopted" in names and "server.ready" in names
    assert "attempt.started" not in names
    assert [1] == sim.attempts()
    assert sim.alive(1)


def test_diagnose_prints_the_failure_of_a_sim_log_as_json(sim: SimSetup) -> None:
    """`diagnose --json` on a sim capture-OOM log: outcome, phase, numbers, evidence,
    retryable and advice with the next params."""
    code, output = sim.host.run(
        "--model-path", str(model_dir("llama-70b-sim")), "--tp-size", "2",
        "--mem-fraction-static", "0.99", "--cuda-graph-max-bs-decode", "256",
        "--port", str(free_port()),
    )
    assert -signal.SIGKILL == code
    log = sim.root / "attempt.log"
    log.write_text(output)

    result = run_cli("diagnose", str(log), "--json", "--exit-status", "137")

    assert 1 == result.returncode, result.stderr
    data = json.loads(result.stdout)
    assert ("oom_graph_capture", "cuda_graph", True, 137) == (
        data["outcome"], data["phase"], data["retryable"], data["exit_status"])
    numbers = data["numbers"]
    assert (79.19, 0.99, 256) == (
        numbers["total_gib"], numbers["mem_fraction_static"], numbers["cuda_graph_max_bs"])
    assert any("Capture cuda graph failed" in line for line in data["evidence"])
    assert data["next_params"]["mem_fraction_static"] < 0.99
    assert re.search(r"\w\. Next attempt: mem_fraction_static=", data["advice"]), data["advice"]

    piped = subprocess.run(cli_argv("diagnose", "-", "--json", "--exit-status", "137"),
                           input=output, env=cli_env(), capture_output=True, text=True,
                           timeout=60)
    assert 1 == piped.returncode, piped.stderr
    assert data == json.loads(piped.stdout)


def test_diagnose_of_an_empty_or_binary_log(tmp_path: Path) -> None:
    """An empty log says so, with no guess (exit 1, as for a problem found); a file of random
    bytes is refused as not a text log (exit 2); a log with a few bytes that are not UTF-8
    shows them as \\xNN, so nothing raw reaches the terminal."""
    empty = tmp_path / "empty.log"
    empty.write_bytes(b"\n \n")
    binary = tmp_path / "binary.log"
    binary.write_bytes(bytes(range(256)) * 16)
    mixed = tmp_path / "mixed.log"
    mixed.write_bytes(b"[2026-12-01 17:02:03] Load weight begin\n"
                      b"RuntimeError: CUDA error: out of memory \xff\xfe\x1b[2J\n")

    nothing = run_cli("diagnose", str(empty))
    refused = run_cli("diagnose", str(binary))
    shown = run_cli("diagnose", str(mixed))

    assert 1 == nothing.returncode
    assert f"{empty}: the log is empty: nothing to diagnose" in nothing.stderr
    assert "" == nothing.stdout
    assert 2 == refused.returncode
    assert refused.stderr.startswith(f"UsageError: {binary}: not a text log"), refused.stderr
    assert "" == refused.stdout
    assert "\\xff\\xfe\\x1b[2J" in shown.stdout, shown.stdout
    assert "\ufffd" not in shown.stdout and "\x1b" not in shown.stdout


def test_plan_json_masks_secrets(sim: SimSetup) -> None:
    """`plan --json` shows the exact command line and env with secret values masked."""
    data = quick_server(sim, server={"secret_env": {"HF_TOKEN": "env:TEST_HF_TOKEN"},
                                     "env": {"OMP_NUM_THREADS": "4"}})
    config = sim.write_toml(data)

    result = run_cli("plan", str(config), "--json", env={"TEST_HF_TOKEN": SECRET})

    assert 0 == result.returncode, result.stderr
    assert SECRET not in result.stdout + result.stderr
    [row] = json.loads(result.stdout)
    assert "***" == row["env"]["HF_TOKEN"]
    assert "4" == row["env"]["OMP_NUM_THREADS"]
    assert "--mem-fraction-static" in row["argv"]
    assert "--cuda-graph-max-bs-decode" in row["argv"]
    assert f"{sim.run_dir}/sim0/<attempt>" == row["run_dir"]
    assert not sim.run_dir.exists()


def test_history_warm_start_and_state_lock(sim: SimSetup) -> None:
    """`history --json` lists the ledger's attempts; the next `up` warm-starts from the last good
    params (`--fresh` does not); a second launcher on the same state dir is refused."""
    config = sim.write_toml(quick_server(sim))
    first = run_cli("up", str(config), "--until-ready", "--log-format", "json")
    assert 0 == first.returncode, first.stderr + first.stdout
    hist = run_cli("history", "--config", str(config), "--json")
    assert 0 == hist.returncode, hist.stderr
    [row] = json.loads(hist.stdout)
    assert (SERVER, 1, "ready") == (row["server"], row["attempt"], row["outcome"])
    assert {"mem_fraction_static": 0.8, "cuda_graph_max_bs": 8} == row["params"]
    for key in ("started_at", "ended_at"):  # ISO 8601 in UTC, like the event log's times
        assert row[key].endswith("Z") and datetime.fromisoformat(row[key]).tzinfo, row[key]

    with start_up(config) as holder:
        try:
            read_until(holder, '"server.adopted"')
            second = run_cli("up", str(config), "--until-ready", "--log-format", "json")
        finally:
            holder.send_signal(signal.SIGTERM)
            holder.wait(timeout=30)
    assert 1 == second.returncode
    assert "another `launcher up` is running on this state directory" in second.stderr

    run_cli("down", str(config))
    warm = run_cli("up", str(config), "--until-ready", "--log-format", "json")
    initial = next(e for e in events(warm.stdout) if e["event"] == "params.initial")
    assert initial["reason"].startswith("warm start from last good params")
    run_cli("down", str(config))
    fresh = run_cli("up", str(config), "--until-ready", "--log-format", "json", "--fresh")
    initial = next(e for e in events(fresh.stdout) if e["event"] == "params.initial")
    assert initial["reason"].startswith(
        "fresh start requested: configured params; configured mem_fraction_static=0.800 "
        "cuda_graph_max_bs=8 kept (expected to fit"), initial["reason"]


REAL_LOGS = Path(__file__).resolve().parents[1] / "fixtures" / "real_logs"


def test_diagnose_does_not_invent_launch_params_a_log_does_not_show() -> None:
    """A pasted KV-pool OOM (docker compose prefixes, no server_args line): the verdict is
    decisive, but the next params are not computed from assumed defaults; the JSON says
    which params are unknown."""
    log = REAL_LOGS / "gh12496_docker_prefix_kv_pool_oom.log"
    result = run_cli("diagnose", str(log), "--json")
    assert 1 == result.returncode, result.stderr
    data = json.loads(result.stdout)
    assert ("oom_kv_cache", "decisive", None) == (
        data["outcome"], data["confidence"], data["next_params"])
    assert {"mem_fraction_static": "unknown", "cuda_graph_max_bs": "unknown"} == (
        data["params_source"])
    assert "--params" in data["advice"]


def test_diagnose_takes_missing_launch_params_from_the_command_line() -> None:
    log = REAL_LOGS / "gh12496_docker_prefix_kv_pool_oom.log"
    result = run_cli(
        "diagnose", str(log), "--json", "--params", "mem_fraction_static=0.85,cuda-graph-max-bs=32"
    )
    data = json.loads(result.stdout)
    assert {"mem_fraction_static": "--params", "cuda_graph_max_bs": "--params"} == (
        data["params_source"])
    nxt = data["next_params"]
    assert nxt["mem_fraction_static"] < 0.85 and nxt["cuda_graph_max_bs"] <= 32


def test_diagnose_refuses_unreadable_params_naming_them() -> None:
    log = REAL_LOGS / "gh12496_docker_prefix_kv_pool_oom.log"
    result = run_cli("diagnose", str(log), "--params", "mem_fraction=0.8")
    assert 2 == result.returncode
    assert "--params" in result.stderr and "mem_fraction=0.8" in result.stderr
LOGS = Path(__file__).parents[1] / "data" / "logs"


@pytest.mark.parametrize(
    ("version", "flags"),
    [("0.5.10", ["--mamba-scheduler-strategy", "extra_buffer"]),
     ("0.5.23", ["--mamba-radix-cache-strategy", "extra_buffer"])],
)
def test_diagnose_gives_a_prescribed_fix_in_the_versions_dialect(
    version: str, flags: list[str]
) -> None:
    """`diagnose --sglang-version` on 0.5.10's spec + no_buffer error: the fix as TOML, with
    the env var only where that version reads it; the text output prints it verbatim."""
    log = LOGS / "v0510_bad_argument_mamba_spec.log"
    data = json.loads(
        run_cli("diagnose", str(log), "--json", "--sglang-version", version).stdout
    )
    fix = data["prescribed_fix"]
    assert flags == fix["flags"]
    assert ("SGLANG_ENABLE_SPEC_V2" in fix["env"]) == (version == "0.5.10")
    text = run_cli("diagnose", str(log), "--sglang-version", version).stdout
    assert "[[servers]]\nmamba_strategy = \"extra_buffer\"" in text


def test_diagnose_advises_the_seed_oom_from_the_failing_pass() -> None:
    """The seeds' MTP OOM in draft extend: the next fraction is below 0.70 by more than the
    deficit (5.2 GiB over 93.4), bs 32 kept."""
    log = LOGS / "v0523_oom_draft_extend_mtp_seed_tp4.log"
    data = json.loads(run_cli("diagnose", str(log), "--json", "--exit-status", "137").stdout)
    nxt = data["next_params"]
    assert nxt["mem_fraction_static"] <= 0.70 - 5.2 / 93.4 and 32 == nxt["cuda_graph_max_bs"]
    assert "draft_extend" == data["numbers"]["graph_pass"]


def test_down_refuses_while_up_supervises_and_force_stops_anyway(sim: SimSetup) -> None:
    """`down` while a `launcher up` holds the state lock: exit 1, nothing stopped, one error
    naming that `up`'s pid and both fixes; `down --force` stops the server anyway."""
    config = sim.write_toml(quick_server(sim))
    with start_up(config) as holder:
        try:
            read_until(holder, '"server.ready"')
            refused = run_cli("down", str(config))
            assert sim.alive(1)
            forced = run_cli("down", str(config), "--force")
        finally:
            holder.send_signal(signal.SIGTERM)
            holder.wait(timeout=30)

    assert 1 == refused.returncode, refused.stdout + refused.stderr
    assert f"another `launcher up` (pid {holder.pid}) supervises" in refused.stderr
    assert "stop that `launcher up` first" in refused.stderr
    assert "launcher down --force" in refused.stderr
    assert "stopped" not in refused.stdout
    assert 0 == forced.returncode, forced.stdout + forced.stderr
    assert f"{SERVER}: stopped (pid {sim.pid(1)}" in forced.stdout


def test_up_while_down_runs_names_the_down(sim: SimSetup) -> None:
    """`down` holds the state lock while it stops servers: an `up` started meanwhile is
    refused, and its error says a `launcher down` holds the directory, not another `up`."""
    config = sim.write_toml(quick_server(sim))
    with StateLock(sim.state_dir, DOWN):
        up = run_cli("up", str(config), "--until-ready", "--log-format", "json")

    assert [] == sim.attempts()
    assert 1 == up.returncode, up.stdout + up.stderr
    assert f"another `launcher down` is running on this state directory (pid {os.getpid()})" in (
        up.stderr)
    assert "wait for it to finish" in up.stderr


@pytest.mark.parametrize("command", ["plan", "check", "up"])
def test_an_unreadable_secret_is_the_same_config_error_everywhere(
    sim: SimSetup, command: str
) -> None:
    """A secret_env reference that cannot be read: `check` and `up` exit 2 with one config
    error headed with the config file and naming the server by its index, as the config's
    other errors are; nothing is launched. `plan`, the dry run (often run where the secrets
    are not), shows the launch with the secret named <unreadable>, never as set, and warns
    with the same error."""
    data = quick_server(sim, server={"secret_env": {"HF_TOKEN": "env:NO_SUCH_VAR_XYZ"}})
    config = sim.write_toml(data)

    result = run_cli(command, str(config))

    problem = (f"ConfigError: {config}: 1 problem(s):\n  servers[0].secret_env.HF_TOKEN: "
               "environment variable NO_SUCH_VAR_XYZ is not set on this machine")
    if command == "plan":
        assert 0 == result.returncode, result.stdout + result.stderr
        assert result.stderr.startswith(f"warning: `up` would refuse this here: {problem}"), (
            result.stderr)
        assert "HF_TOKEN=<unreadable>" in result.stdout and "***" not in result.stdout
    else:
        assert 2 == result.returncode, result.stdout + result.stderr
        assert result.stderr.startswith(problem), result.stderr
        assert "***" not in result.stdout
    assert [] == sim.attempts()
