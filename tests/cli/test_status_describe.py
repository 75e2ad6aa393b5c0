"""`launcher status`, `describe` and `logs` against simulated hosts: over the local transport,
and over real SSH (a real sshd on 127.0.0.1), through the real CLI (a subprocess)."""

from __future__ import annotations

import contextlib
import json
import signal
import socket
import subprocess
import time
from collections.abc import Iterator
from datetime import datetime
from pathlib import Path
from typing import Any

import anyio
import pytest

from launcher.cli import app, inspection
from launcher.host import run
from launcher.host.transport.local import LocalTransport
from tests.cli.test_cli import read_until, start_up
from tests.cli.test_live_view import capture_oom
from tests.simhost import free_port
from tests.sshd import Sshd
from tests.sshsim import FAST_POLICY, Site, kill_leftovers, server_entry
from tests.supervise import (
    REPO,
    SERVER,
    SimSetup,
    _toml,
    cli_argv,
    cli_env,
    json_lines,
    run_cli,
)

pytestmark = pytest.mark.timeout(120)


def quick(sim: SimSetup, **kwargs: Any) -> dict[str, Any]:
    return sim.data(mem_fraction_static=0.8, cuda_graph_max_bs=8, **kwargs)


def with_dead_host(sim: SimSetup, data: dict[str, Any]) -> dict[str, Any]:
    """``data`` plus server far0 on an SSH host where nothing listens (connection refused)."""
    data["hosts"].append({"name": "deadhost", "transport": "ssh", "address": "127.0.0.1",
                          "port": free_port(), "connect_timeout": "5s",
                          "use_ssh_config": False})
    far = dict(data["servers"][0], name="far0", host="deadhost",
               command=["python3", "-m", "sglang.launch_server"])
    data["servers"].append(far)
    return data


@contextlib.contextmanager
def spawn(*args: str) -> Iterator[subprocess.Popen[str]]:
    """``launcher *args`` running, its stdout a pipe; killed (if still running) and its pipes
    closed on the way out."""
    with subprocess.Popen(cli_argv(*args), cwd=REPO, env=cli_env(), stdout=subprocess.PIPE,
                          stderr=subprocess.DEVNULL, text=True) as proc:
        try:
            yield proc
        finally:
            proc.kill()


def table(stdout: str) -> list[list[str]]:
    """A status table's lines split into cells (cells hold no double space)."""
    return [[c.strip() for c in line.split("  ") if c.strip()]
            for line in stdout.splitlines() if line.strip()]


def test_status_after_a_relaunch_counts_restarts_and_labels_params(sim: SimSetup) -> None:
    """A server ready at attempt 2 after a capture OOM: one row with its state, endpoint,
    attempt 2, one restart, labelled params and an age; --json has ISO 8601 times."""
    config = sim.write_toml(capture_oom(sim))
    up = run_cli("up", str(config), "--until-ready", "--log-format", "json")
    assert 0 == up.returncode, up.stderr + up.stdout

    result = run_cli("status", str(config))

    assert 0 == result.returncode, result.stderr
    head, row = table(result.stdout)
    assert ["NAME", "HOST", "STATE", "ENDPOINT", "ATTEMPT", "RESTARTS", "PARAMS", "AGE"] == head
    assert [SERVER, "simhost", "ready", f"127.0.0.1:{sim.port}", "2", "1"] == row[:6], row
    assert row[6] == "mfs=0.95 bs=256" and row[7].endswith("s"), row

    [data] = json.loads(run_cli("status", str(config), "--json").stdout)
    assert ("ready", 2, 1, f"127.0.0.1:{sim.port}") == (
        data["state"], data["attempt"], data["restarts"], data["endpoint"])
    started = datetime.fromisoformat(data["started_at"])
    assert started.tzinfo is not None and data["started_at"].endswith("Z")
    run_cli("down", str(config))


def test_status_wide_is_not_cut_when_piped(sim: SimSetup) -> None:
    """-o wide on a pipe with COLUMNS=40: every column whole (the run dir's full path)."""
    config = sim.write_toml(quick(sim))
    up = run_cli("up", str(config), "--until-ready", "--log-format", "json")
    assert 0 == up.returncode, up.stderr

    result = run_cli("status", str(config), "-o", "wide", env={"COLUMNS": "40"})

    assert 0 == result.returncode, result.stderr
    head, row = table(result.stdout)
    assert head[-5:] == ["PID", "PHASE", "HEALTH", "MODEL", "RUN DIR"], head
    assert row[-5:] == [str(sim.pid(1)), "ready", "ok", "tiny-1b-sim",
                        str(sim.attempt_dir(1))], row
    assert "…" not in result.stdout
    run_cli("down", str(config))


def test_status_shows_gave_up_and_stopped(sim: SimSetup) -> None:
    """A server launcher gave up on reads "gave up" (the reason under the table), not
    "exited"; one stopped by `down` reads "stopped" (not the "exited (137)" of its shutdown):
    the ledger closes its row as stopped, describe says when, and its age stays how long it
    ran. Both exit 3."""
    config = sim.write_toml(capture_oom(sim, max_attempts=1))
    up = run_cli("up", str(config), "--until-ready", "--log-format", "json")
    assert 4 == up.returncode, up.stderr

    result = run_cli("status", str(config))

    assert 3 == result.returncode
    assert "gave up" == table(result.stdout)[1][2]
    assert f"{SERVER} gave up at attempt 1: gave up after 1 attempts" in result.stderr
    assert "[policy] max_attempts" in result.stderr

    other = sim.write_toml(quick(sim), name="other.toml")
    (sim.run_dir / SERVER / "1" / "gave_up").unlink()  # the next `up` starts attempt 2
    assert 0 == run_cli("up", str(other), "--until-ready", "--log-format", "json").returncode
    assert 0 == run_cli("down", str(other)).returncode
    assert 137 == int((sim.attempt_dir(2) / "exit_status").read_text())  # SGLang's own exit
    stopped = run_cli("status", str(other))
    assert 3 == stopped.returncode
    # RESTARTS: attempt 1 failed; the stop of attempt 2 is not a failure
    assert ["stopped", "127.0.0.1:" + str(sim.port), "2", "1"] == table(stopped.stdout)[1][2:6]
    [data] = json.loads(run_cli("status", str(other), "--json").stdout)
    assert ("stopped", 2) == (data["state"], data["attempt"])
    assert data["ended_at"].endswith("Z") and data["ended_at"] >= data["started_at"]
    ran = data["age_s"]
    history = run_cli("history", str(other), SERVER, "--json")
    assert "stopped" == json.loads(history.stdout)[0]["outcome"], history.stdout

    time.sleep(1.5)
    described = run_cli("describe", str(other), SERVER)
    text = described.stdout
    fields = {line.split(":", 1)[0]: line.split(":", 1)[1].strip()
              for line in text.splitlines() if not line.startswith(" ") and ": " in line}
    assert ("stopped", "ready (when stopped)", data["ended_at"]) == (
        fields["State"], fields["Phase"], fields["Stopped"]), text
    assert "Age" not in fields and fields["Ran for"], text
    assert "attempt 2 stopped" in text
    [again] = json.loads(run_cli("status", str(other), "--json").stdout)
    assert ran == again["age_s"]  # frozen: not growing as if it still ran


def test_unreachable_host_error_goes_under_the_table(sim: SimSetup) -> None:
    """A host that refuses connections: its row says "unreachable" with no error inside the
    table; the error is under it (stderr); the reachable server's row is complete; exit 3.
    `check` says it in one line after a single connection attempt."""
    config = sim.write_toml(with_dead_host(sim, quick(sim)))

    result = run_cli("status", str(config))

    assert 3 == result.returncode
    rows = table(result.stdout)
    assert ["far0", "deadhost", "unreachable"] == rows[2][:3], rows
    assert "Connect" not in result.stdout and "refused" not in result.stdout.lower()
    assert result.stderr.startswith("far0 on deadhost: unreachable: cannot reach host"), (
        result.stderr)
    assert ["sim0", "simhost", "not started"] == rows[1][:3]

    check = run_cli("check", str(config))
    assert 1 == check.returncode
    far = [line for line in check.stderr.splitlines() if "far0" in line or "deadhost" in line]
    assert 1 == len(far) and far[0].startswith("far0 on deadhost: unreachable: "), check.stderr
    assert "ssh.connect_retry" not in check.stderr + check.stdout


def test_an_unreachable_hosts_row_keeps_what_the_ledger_knows(sim: SimSetup) -> None:
    """The host cannot be asked, but the ledger knows its server's newest attempt: the row
    shows that attempt, its params, the restarts before it and its age (the server may still
    run there), beside "unreachable"."""
    from launcher.params import LaunchParams
    from launcher.store.ledger import Ledger, ledger_path

    config = sim.write_toml(with_dead_host(sim, quick(sim)))
    now = time.time()
    with Ledger(ledger_path(sim.state_dir)) as ledger:
        ledger.attempt_started("far0", "fp", 2, LaunchParams(0.9, 128), now - 300)
        ledger.attempt_finished("far0", 2, outcome="oom_graph_capture", phase="cuda_graph",
                                numbers={}, evidence=[], log_tail="", ended_at=now - 200)
        ledger.attempt_started("far0", "fp", 3, LaunchParams(0.85, 64), now - 120)

    result = run_cli("status", str(config), "--json")

    assert 3 == result.returncode, result.stderr
    far = next(r for r in json.loads(result.stdout) if r["server"] == "far0")
    assert ("unreachable", 3, 1) == (far["state"], far["attempt"], far["restarts"]), far
    assert {"mem_fraction_static": 0.85, "cuda_graph_max_bs": 64} == far["params"]
    assert 119 <= far["age_s"] < 200, far
    assert far["error"].startswith("cannot reach host deadhost"), far


def test_describe_shows_attempts_evidence_and_memory(sim: SimSetup) -> None:
    """After a capture OOM and a relaunch to ready: the config, command line, run directory,
    both attempts with the failed one's evidence, the events, the memory figures and the time
    to ready; --json the same with ISO 8601 times."""
    config = sim.write_toml(capture_oom(sim))
    up = run_cli("up", str(config), "--until-ready", "--log-format", "json")
    assert 0 == up.returncode, up.stderr

    result = run_cli("describe", str(config), SERVER)

    assert 0 == result.returncode, result.stderr
    text = result.stdout
    fields = {line.split(":", 1)[0]: line.split(":", 1)[1].strip()
              for line in text.splitlines() if not line.startswith(" ") and ": " in line}
    assert (str(config), "ready", "2", "1", str(sim.attempt_dir(2))) == (
        fields["Config"], fields["State"], fields["Attempt"], fields["Restarts"],
        fields["Run dir"])
    assert fields["Command"] == sim.cmd(2).strip()
    assert "--mem-fraction-static 0.95 " in fields["Command"]
    assert "Evidence (attempt 1, oom_graph_capture):" in text
    assert "Capture cuda graph failed: CUDA out of memory" in text
    assert "attempt 1 ended: oom_graph_capture in cuda_graph" in text
    assert "weights                    64.2 GiB" in text
    data = json.loads(run_cli("describe", str(config), SERVER, "--json").stdout)
    # One time to ready, rounded the same everywhere: describe's field, its attempts table
    # and events, and `history`.
    took = f"{round(data['seconds_to_ready'])}s"
    assert took == fields["Ready after"], (took, text)
    assert f"attempt 2 ready in {took}" in text
    row = next(line for line in text.splitlines() if line.startswith("  2 "))
    assert row.split()[-1] == took, row
    history = run_cli("history", str(config), SERVER).stdout.splitlines()
    assert history[1].split()[-1] == took, history

    assert [2, 1] == [a["attempt"] for a in data["attempts"]]
    assert data["attempts"][1]["started_at"].endswith("Z")
    assert data["memory"]["weights_gib"] == 64.2
    assert data["seconds_to_ready"] is not None
    run_cli("down", str(config))


def test_time_to_ready_is_rounded_like_the_events() -> None:
    """describe and history round a time to ready as the events' "ready in 8s" does (a plain
    duration would cut 7.59 s to 7s), in the two units of every other duration."""
    assert ("8s", "7s", "1m05s", "") == (
        app.to_ready(7.59), app.to_ready(7.4), app.to_ready(64.6), app.to_ready(None))


def write_log(path: Path, lines: list[str]) -> str:
    text = "".join(lines)
    path.write_text(text)
    return text


LOG = [
    "bare preamble line\n",
    "[2026-12-01 10:00:00] server_args=...\n",
    "[2026-12-01 10:00:05 TP0] Load weight begin. avail mem=78.19 GB\n",
    "Loading safetensors checkpoint shards:  50% Completed | 1/2\r",
    "Loading safetensors checkpoint shards: 100% Completed | 2/2\n",
    "[2026-12-01 10:01:00 TP0] Capture cuda graph begin.\n",
    "Traceback (most recent call last):\n",
    "  File \"x.py\", line 1\n",
    "[2026-12-01 10:02:00] Received sigquit\n",
]


@pytest.mark.parametrize(("cutoff", "first"), [
    ("2026-12-01 09:00:00", 1),  # before everything: from the first stamped line
    ("2026-12-01 10:00:05", 2),
    ("2026-12-01 10:00:30", 5),  # the bars and traceback go with the line before them
    ("2026-12-01 10:01:30", 8),
    ("2026-12-01 11:00:00", 9),  # after everything: nothing
])
def test_since_offset_reads_backwards_across_chunks(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, cutoff: str, first: int
) -> None:
    """`logs --since`'s start offset with 7-byte chunks (stamps straddle chunk borders): the
    log from it starts at the first line stamped at or after the cut-off."""
    text = write_log(tmp_path / "log", LOG)
    handle = run.RunHandle("s", 1, str(tmp_path), 0)
    monkeypatch.setattr(run, "READ_CHUNK", 7)

    async def offset() -> int:
        t = LocalTransport("local")
        try:
            return await inspection.since_offset(t, handle, datetime.fromisoformat(cutoff))
        finally:
            await t.aclose()

    assert "".join(LOG[first:]) == text[anyio.run(offset):]


def test_since_cutoff_takes_durations_and_local_times() -> None:
    now = datetime(2026, 12, 1, 10, 0, 0)
    assert datetime(2026, 12, 1, 9, 50) == inspection.since_cutoff("10m", now)
    assert datetime(2026, 12, 1, 8, 0) == inspection.since_cutoff("2h", now)
    assert datetime(2026, 12, 1, 9, 59, 30) == inspection.since_cutoff("30s", now)
    assert datetime(2026, 11, 30, 9, 0) == inspection.since_cutoff("2026-11-30T09:00", now)
    for bad in ("5x", "yesterday", "2026-11-30T09:00+02:00"):
        with pytest.raises(ValueError):
            inspection.since_cutoff(bad, now)


def test_logs_since_and_follow(sim: SimSetup) -> None:
    """`logs --since` prints the lines stamped since then (all of a fresh log for 1h, none
    for a time after its last line); `logs -f` prints the log and keeps following until
    interrupted (exit 0)."""
    config = sim.write_toml(quick(sim))
    assert 0 == run_cli("up", str(config), "--until-ready", "--log-format", "json").returncode

    hour = run_cli("logs", str(config), SERVER, "--since", "1h")

    assert 0 == hour.returncode, hour.stderr
    lines = sim.log(1).splitlines(keepends=True)
    first_stamped = next(i for i, line in enumerate(lines) if line.startswith("[20"))
    assert "".join(lines[first_stamped:]) == hour.stdout
    future = run_cli("logs", str(config), SERVER, "--since", "2999-01-01 00:00:00")
    assert (0, "") == (future.returncode, future.stdout)
    bad = run_cli("logs", str(config), SERVER, "--since", "soon")
    assert 2 == bad.returncode and "--since 'soon'" in bad.stderr

    with spawn("logs", str(config), SERVER, "-f") as follow:
        assert follow.stdout is not None
        deadline = time.monotonic() + 30
        seen = ""
        while "fired up and ready to roll" not in seen and time.monotonic() < deadline:
            seen += follow.stdout.readline()
        assert "fired up and ready to roll" in seen
        follow.send_signal(signal.SIGINT)
        assert 0 == follow.wait(30)
    run_cli("down", str(config))


def test_status_watch_prints_each_change(sim: SimSetup) -> None:
    """`status --watch` on a pipe prints the table, then again only when it changed (here:
    the server was stopped); Ctrl-C ends it with the last look's exit code (3)."""
    config = sim.write_toml(quick(sim))
    assert 0 == run_cli("up", str(config), "--until-ready", "--log-format", "json").returncode
    with spawn("status", str(config), "--watch", "--interval", "0.3") as watch:
        assert watch.stdout is not None
        lines = [watch.stdout.readline() for _ in range(3)]  # header, row, blank
        assert " ready " in lines[1], lines
        assert 0 == run_cli("down", str(config)).returncode
        lines = []
        while not lines or " stopped " not in lines[-1]:
            lines.append(watch.stdout.readline())
            assert lines[-1], lines  # not EOF
        time.sleep(1.0)  # some more looks, all alike
        # Each change is one table (header, row, blank): a stopping server may pass through
        # "unhealthy" and "exited (137)" (down records the stop once it is done) on its way
        # to "stopped", and nothing else is printed.
        assert lines[-2].startswith("NAME ") and len(lines) <= 3 * 3 - 1, lines
        watch.send_signal(signal.SIGINT)
        assert 3 == watch.wait(30)
        assert "" == watch.stdout.read().strip()  # nothing printed for the looks alike


@pytest.fixture
def site(tmp_path: Path, sshd_host: Sshd) -> Iterator[Site]:
    made = Site.create(tmp_path, "gpu1", sshd_host)
    yield made
    kill_leftovers([made.run_dir])


@pytest.mark.ssh
@pytest.mark.timeout(240)  # eight CLI runs, each connecting over SSH afresh
def test_status_describe_logs_over_ssh(tmp_path: Path, site: Site) -> None:
    """Over a real sshd: up to ready, then status (endpoint on the host's address), describe
    (command line and run directory on the host) and logs --since/--tail; then down."""
    port = free_port()
    data = {"state_dir": str(tmp_path / "state"), "policy": FAST_POLICY,
            "hosts": [site.host_entry()],
            "servers": [server_entry("llm", site, port=port, mem_fraction_static=0.8,
                                     cuda_graph_max_bs=8)]}
    config = tmp_path / "launcher.toml"
    config.write_text(_toml(data))
    up = run_cli("up", str(config), "--until-ready", "--log-format", "json")
    assert 0 == up.returncode, up.stderr + up.stdout[-2000:]

    status = run_cli("status", str(config))
    assert 0 == status.returncode, status.stderr
    assert ["llm", "gpu1", "ready", f"127.0.0.1:{port}", "1", "0"] == table(status.stdout)[1][:6]

    described = json.loads(run_cli("describe", str(config), "llm", "--json").stdout)
    attempt_dir = site.attempt_dir("llm", 1)
    assert str(attempt_dir) == described["status"]["run_dir"]
    assert (attempt_dir / "cmd").read_text().strip() == described["command"]

    log = site.log_bytes("llm", 1).decode()
    tail = run_cli("logs", str(config), "llm", "--tail", "2")
    assert "".join(log.splitlines(keepends=True)[-2:]) == tail.stdout
    since = run_cli("logs", str(config), "llm", "--since", "1h")
    assert "fired up and ready to roll" in since.stdout
    after = site.log_bytes("llm", 1).decode()  # /health lines may have come since
    after = after.replace("\r\n", "\n").replace("\r", "\n")  # run_cli reads text mode
    assert after.endswith(since.stdout) and since.stdout.startswith("[20")
    assert not after.startswith("[20")  # the unstamped start (a warning) is left out
    assert 0 == run_cli("down", str(config)).returncode


def test_describe_of_a_server_whose_host_is_unreachable(sim: SimSetup) -> None:
    """describe still shows the config side; the state is "unreachable" with the error;
    exit 1 (the host could not be asked)."""
    config = sim.write_toml(with_dead_host(sim, quick(sim)))

    result = run_cli("describe", str(config), "far0")

    assert 1 == result.returncode, result.stderr
    assert "State:         unreachable" in result.stdout
    assert "Error:         cannot reach host deadhost" in result.stdout
    assert "Endpoint:      127.0.0.1:" in result.stdout


def test_status_of_a_ready_server_failing_health_is_unhealthy(sim: SimSetup) -> None:
    """A server that printed its ready line but now answers /health with 503 (the sim's
    hang_after_ready): "unhealthy", exit 3."""
    config = sim.write_toml(quick(sim, faults=[{"kind": "hang_after_ready", "after_s": 1}]))
    assert 0 == run_cli("up", str(config), "--until-ready", "--log-format", "json").returncode
    deadline = time.monotonic() + 30  # the fault fires 1 s (wall clock) after ready
    while True:
        result = run_cli("status", str(config), "--json")
        [row] = json.loads(result.stdout)
        if row["state"] != "ready" or time.monotonic() > deadline:
            break

    assert 3 == result.returncode, result.stderr
    assert ("unhealthy", True, True, False) == (
        row["state"], row["running"], row["ready"], row["healthy"])
    run_cli("down", str(config))


def test_up_closes_an_attempt_that_ended_unsupervised(sim: SimSetup) -> None:
    """`up` stopped while attempt 1 loads leaves it running and its ledger row open; the
    attempt then fails alone (a capture OOM). The next `up` closes that row with the verdict
    on its log (not "running" forever), so `history` says what happened and RESTARTS counts
    it."""
    data = capture_oom(sim)
    slow = [{"kind": "slow", "phase": "weights", "factor": 4}]
    data["servers"][0]["env"]["SGLANG_SIM_FAULTS"] = str(sim.host.write_faults(slow))
    config = sim.write_toml(data)
    proc = start_up(config)
    try:
        read_until(proc, '"phase": "weights"')
        proc.send_signal(signal.SIGINT)
        _, stderr = proc.communicate(timeout=20)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.communicate()
    assert 0 == proc.returncode and "left running: sim0" in stderr, stderr
    deadline = time.monotonic() + 60
    while not (sim.attempt_dir(1) / "exit_status").exists():  # it dies on its own
        assert time.monotonic() < deadline, sim.log(1)[-2000:]
        time.sleep(0.2)
    [open_row] = json.loads(run_cli("history", str(config), SERVER, "--json").stdout)
    assert (1, None) == (open_row["attempt"], open_row["outcome"])

    again = run_cli("up", str(config), "--until-ready", "--log-format", "json")

    assert 0 == again.returncode, again.stderr
    closed = [e for e in json_lines(again.stdout) if e.get("event") == "ledger.attempt_closed"]
    assert [(1, "oom_graph_capture")] == [(e["attempt"], e["outcome"]) for e in closed]
    rows = {r["attempt"]: r for r in json.loads(
        run_cli("history", str(config), SERVER, "--json").stdout)}
    assert ("oom_graph_capture", "cuda_graph") == (rows[1]["outcome"], rows[1]["phase"])
    assert rows[1]["ended_at"] is not None
    assert "ready" == rows[max(rows)]["outcome"]
    [status] = json.loads(run_cli("status", str(config), "--json").stdout)
    # every attempt before the newest failed: attempt 1 (unsupervised) and 2
    assert (max(rows), max(rows) - 1) == (status["attempt"], status["restarts"])
    run_cli("down", str(config))


def test_a_give_up_in_preflight_reads_gave_up_before_launching(sim: SimSetup) -> None:
    """`up` refused in preflight (its port held by launcher's own user) launches nothing:
    status still reads "gave up" (not the previous attempt's "stopped"), the reason under the
    table says it gave up before launching, and the Slack text names no earlier attempt as
    its last. Once an attempt runs again the give-up is old news."""
    config = sim.write_toml(quick(sim))
    assert 0 == run_cli("up", str(config), "--until-ready", "--log-format", "json").returncode
    assert 0 == run_cli("down", str(config)).returncode
    with socket.socket() as holder:
        holder.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)  # the server's TIME_WAIT
        holder.bind(("127.0.0.1", sim.port))
        holder.listen()
        up = run_cli("up", str(config), "--until-ready", "--log-format", "json")
        assert 4 == up.returncode, up.stderr
        result = run_cli("status", str(config))
    assert [1] == sim.attempts()

    assert 3 == result.returncode
    assert ["gave up", f"127.0.0.1:{sim.port}", "1"] == table(result.stdout)[1][2:5]
    assert result.stderr.startswith(
        f"{SERVER} gave up before launching: preflight: port {sim.port} is already in use"), (
        result.stderr)
    [data] = json.loads(run_cli("status", str(config), "--json").stdout)
    assert ("gave up", True) == (data["state"], data["gave_up_before_launch"])
    assert "before launching" in up.stdout + up.stderr
    assert "attempt(s) (last #1)" not in up.stdout + up.stderr

    assert 0 == run_cli("up", str(config), "--until-ready", "--log-format", "json").returncode
    [again] = json.loads(run_cli("status", str(config), "--json").stdout)
    assert ("ready", 2, None) == (again["state"], again["attempt"], again["gave_up"])
    run_cli("down", str(config))


def test_logs_and_down_on_an_unreachable_host(sim: SimSetup) -> None:
    """A host that refuses connections: `logs --since` with a malformed WHEN is a usage error
    (exit 2) found before the host is contacted, in either form; `logs` makes one connection
    attempt, as `status` does (exit 1); `down` keeps its retries; neither prints a raw
    event line (ssh.connect_retry) to the terminal."""
    config = sim.write_toml(with_dead_host(sim, quick(sim)))

    for when in ("yesterday", "10x", "2026-13-01 17:02:03", "99999999999d"):
        bad = run_cli("logs", str(config), "far0", "--since", when)
        assert 2 == bad.returncode, bad.stderr
        assert bad.stderr.startswith(f"UsageError: --since {when!r}: "), bad.stderr
        assert "cannot reach" not in bad.stderr
    logs = run_cli("logs", str(config), "far0", "-n", "2")
    assert 1 == logs.returncode
    assert logs.stderr.startswith("HostUnreachable: cannot reach host deadhost"), logs.stderr
    assert "ssh.connect_retry" not in logs.stderr

    down = run_cli("down", str(config), "--server", "far0")

    assert 1 == down.returncode
    assert down.stderr.startswith("far0: HostUnreachable: cannot reach host deadhost"), (
        down.stderr)
    assert "ssh.connect_retry" not in down.stderr + down.stdout
