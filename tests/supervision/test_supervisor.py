"""Supervision from launch to ready and after, with real simulated SGLang servers on the local
transport: real processes, real logs, real ports, small time scale and budgets."""

from __future__ import annotations

import os
import random
import shlex
import signal
import socket
import time
from collections.abc import AsyncGenerator, Callable, Mapping, Sequence
from datetime import datetime
from pathlib import Path

import anyio
import pytest

from launcher.errors import HostUnreachable
from launcher.host import run
from launcher.host.transport.local import LocalTransport
from launcher.supervise.backoff import RestartBackoff
from launcher.supervise.lifecycle import State
from launcher.supervise.supervisor import ServerSupervisor
from tests.faketime import RecordedSleep
from tests.supervise import (
    Recorded,
    Recorder,
    SimSetup,
    group_alive,
    ready_or_done,
    supervise,
)

pytestmark = pytest.mark.timeout(60)

# After-ready faults fire this long after the server's ready line: long enough for the
# supervisor to have probed it ready (a crash before that is a start-up failure), even on a
# loaded machine. Tests that need a death while serving but not a particular crash use
# kill_when_ready instead, which cannot race.
AFTER_READY_S = 2.0


def kill_when_ready(sim: SimSetup) -> Callable[[Recorded], None]:
    """A Recorder callback that SIGKILLs attempt 1's server once the supervisor reports it
    ready: a death while serving, whatever the machine's load."""

    def kill(e: Recorded) -> None:
        if e.name == "server.ready" and e.data["attempts"] == 1:
            os.kill(sim.pid(1), signal.SIGKILL)

    return kill


def flag_value(cmd: str, flag: str) -> str:
    """The value after ``flag`` in a shell-quoted command line."""
    words = shlex.split(cmd)
    assert flag in words, f"{flag} not in {cmd}"
    return words[words.index(flag) + 1]


# --- memory failures and the policy ------------------------------------------------------


async def test_capture_oom_then_ready_with_the_policys_params(sim: SimSetup) -> None:
    """The demo's capture OOM: one failed attempt with its numbers, the policy's params
    launched (in the 0.5.23 flag dialect) and ready on attempt 2."""
    config = sim.config(
        model="llama-70b-sim", tp=2, mem_fraction_static=0.99, cuda_graph_max_bs=256
    )
    result = await supervise(config, until=ready_or_done)
    rec = result.events

    assert State.READY == result.supervisor.state, result.events.summary()
    started = rec.of("attempt.started")
    assert [1, 2] == [s["attempt"] for s in started]
    assert {"mem_fraction_static": 0.99, "cuda_graph_max_bs": 256} == started[0]["params"]
    [failed] = rec.of("attempt.failed")
    assert "oom_graph_capture" == failed["outcome"]
    assert "cuda_graph" == failed["phase"]
    assert failed["retryable"] is True and failed["after_ready"] is False
    numbers = failed["numbers"]
    assert 79.19 == numbers["total_gib"]
    assert numbers["tried_gib"] > numbers["free_gib"]
    assert 0.99 == numbers["mem_fraction_static"] and 256 == numbers["cuda_graph_max_bs"]
    assert any("Capture cuda graph failed" in line for line in failed["evidence"])
    [decided] = rec.of("policy.decided")
    assert started[1]["params"] == decided["params"]
    assert decided["params"]["mem_fraction_static"] < 0.99
    [ready] = rec.of("server.ready")
    assert (2, 2, False) == (ready["attempt"], ready["attempts"], ready["adopted"])
    assert decided["params"] == ready["params"]
    assert [{"params": started[0]["params"], "outcome": "oom_graph_capture",
             "phase": "cuda_graph", "attempt": 1}] == ready["history"]

    cmd = sim.cmd(2)
    mfs = decided["params"]["mem_fraction_static"]
    assert mfs == float(flag_value(cmd, "--mem-fraction-static"))
    bs = decided["params"]["cuda_graph_max_bs"]
    assert str(bs) == flag_value(cmd, "--cuda-graph-max-bs-decode")
    assert "--cuda-graph-max-bs" not in shlex.split(cmd)  # ambiguous in 0.5.23
    assert [1, 2] == sim.attempts()
    assert sim.alive(2)


async def test_kv_too_small_raises_the_fraction(sim: SimSetup) -> None:
    """A fraction that leaves no KV pool fails as kv_too_small; the next attempt runs with a
    higher fraction and gets ready."""
    config = sim.config(mem_fraction_static=0.03, cuda_graph_max_bs=8)
    result = await supervise(config, until=ready_or_done)
    rec = result.events

    assert State.READY == result.supervisor.state, result.events.summary()
    [failed] = rec.of("attempt.failed")
    assert "kv_too_small" == failed["outcome"]
    assert "kv_cache" == failed["phase"]
    [decided] = rec.of("policy.decided")
    assert decided["params"]["mem_fraction_static"] > 0.03
    second = rec.of("attempt.started")[1]["params"]
    assert decided["params"] == second
    assert second["mem_fraction_static"] == float(
        flag_value(sim.cmd(2), "--mem-fraction-static")
    )
    assert 2 == rec.of("server.ready")[0]["attempts"]


async def test_weights_oom_gives_up_after_one_attempt(tmp_path: Path) -> None:
    """Weights that do not fit the GPU end supervision after exactly one attempt, with a
    reason that says what would help (more GPUs / tp, or quantization)."""
    sim = SimSetup.create(tmp_path, gpu_total_gib=2.5)
    try:
        result = await supervise(sim.config())
    finally:
        sim.cleanup()
    rec = result.events

    assert State.GAVE_UP == result.state, result.events.summary()
    assert 1 == len(rec.of("attempt.started"))
    assert ["oom_weights"] == [f["outcome"] for f in rec.of("attempt.failed")]
    [gave_up] = rec.of("server.gave_up")
    assert 1 == gave_up["attempts"]
    reason = gave_up["reason"]
    assert "GPUs" in reason and "tp" in reason and "quantiz" in reason, reason
    assert not rec.has("policy.decided")
    assert [1] == sim.attempts()


# --- death and hangs ---------------------------------------------------------------------


async def test_sigkill_mid_load_is_reported_classified_and_relaunched(sim: SimSetup) -> None:
    """A server SIGKILLed while loading weights is reported as process.died, classified as
    killed, and launched again with the same params (the detection time is printed, not
    asserted: the benchmarks measure it)."""
    kill_at: list[float] = []

    def kill_in_weights(e: Recorded) -> None:
        if e.name == "phase.entered" and e.data == {"phase": "weights", "attempt": 1}:
            kill_at.append(time.monotonic())
            os.kill(sim.pid(1), signal.SIGKILL)

    rec = Recorder(on=[kill_in_weights])
    config = sim.config(
        mem_fraction_static=0.8, cuda_graph_max_bs=8,
        faults=[{"kind": "slow", "phase": "weights", "factor": 100, "attempts": [1]}],
    )
    result = await supervise(config, until=ready_or_done, recorder=rec)

    died = rec.first("process.died")
    delay = died.t - kill_at[0]
    print(f"process.died {delay:.3f} s after SIGKILL")
    assert {"exit_status": 137, "phase": "weights", "attempt": 1} == died.data
    assert ["killed"] == [f["outcome"] for f in rec.of("attempt.failed")]
    started = rec.of("attempt.started")
    assert started[0]["params"] == started[1]["params"]
    assert State.READY == result.supervisor.state, result.events.summary()


async def test_sigstop_is_a_stall_detected_within_its_budget(sim: SimSetup) -> None:
    """A server frozen by SIGSTOP while loading is reported as stalled once its phase's
    budget of silence has passed (the event says how long), killed and launched again."""
    budget = 1.5
    stop_at: list[float] = []
    stalled_pgid: list[int] = []

    def freeze_then_thaw(e: Recorded) -> None:
        if e.name == "phase.entered" and e.data == {"phase": "weights", "attempt": 1}:
            stop_at.append(time.monotonic())
            stalled_pgid.append(sim.pid(1))
            os.killpg(sim.pid(1), signal.SIGSTOP)
        elif e.name == "stall.detected":
            # A frozen process ignores SIGTERM: thaw it so the supervisor's stop works.
            os.killpg(stalled_pgid[0], signal.SIGCONT)

    rec = Recorder(on=[freeze_then_thaw])
    config = sim.config(
        model="llama-70b-sim", tp=2, mem_fraction_static=0.849, cuda_graph_max_bs=256,
        faults=[{"kind": "slow", "phase": "weights", "factor": 20}],
        stall={"weights": f"{budget}s"},
    )
    result = await supervise(
        config, until=lambda r: {"phase": "init", "attempt": 2} in r.of("phase.entered"),
        recorder=rec,
    )

    stall = rec.first("stall.detected")
    print(f"stall.detected {stall.t - stop_at[0]:.3f} s after SIGSTOP (budget {budget} s)")
    assert "weights" == stall.data["phase"] and stall.data["silent_s"] >= budget
    [failed] = rec.of("attempt.failed")
    assert ("hang", "weights") == (failed["outcome"], failed["phase"])
    [stopped] = rec.of("process.stopped")
    assert ("stall", ["SIGTERM"]) == (stopped["reason"], stopped["signals"])
    assert result.stopped_by_test
    started = rec.of("attempt.started")
    assert started[0]["params"] == started[1]["params"]


# --- fatal at once -----------------------------------------------------------------------


async def test_unknown_flag_is_fatal_after_one_attempt(sim: SimSetup) -> None:
    """An extra argument SGLang rejects is bad_argument: one attempt, then give up."""
    config = sim.config(server={"extra_args": ["--no-such-flag"]})
    result = await supervise(config)
    rec = result.events

    assert State.GAVE_UP == result.state, result.events.summary()
    assert 1 == len(rec.of("attempt.started"))
    [failed] = rec.of("attempt.failed")
    assert "bad_argument" == failed["outcome"] and failed["retryable"] is False
    assert any("--no-such-flag" in line for line in failed["evidence"])
    reason = rec.of("server.gave_up")[0]["reason"]
    assert reason.startswith("bad_argument in init: ")
    assert reason.endswith("(log: sglang serve: error: unrecognized arguments: --no-such-flag)")
    assert [1] == sim.attempts()


async def test_missing_model_repo_is_fatal_after_one_attempt(sim: SimSetup) -> None:
    """A model that is neither a directory nor in the HF cache: one attempt, then give up."""
    config = sim.config(server={"model_path": "no-such-org/no-such-model"})
    result = await supervise(config)
    rec = result.events

    assert State.GAVE_UP == result.state, result.events.summary()
    assert 1 == len(rec.of("attempt.started"))
    assert ["model_not_found"] == [f["outcome"] for f in rec.of("attempt.failed")], rec.summary()
    reason = rec.of("server.gave_up")[0]["reason"]
    assert reason.startswith("model_not_found in init: ")
    assert "couldn't find them in the cached files" in reason


async def test_missing_model_directory_is_refused_by_preflight(sim: SimSetup) -> None:
    """An absolute model path that does not exist is refused before any launch."""
    config = sim.config(server={"model_path": str(sim.root / "nowhere")})
    result = await supervise(config)

    assert State.GAVE_UP == result.state, result.events.summary()
    assert not result.events.has("attempt.started")
    reason = result.events.of("server.gave_up")[0]["reason"]
    assert f"model path {sim.root / 'nowhere'} does not exist" in reason
    assert [] == sim.attempts()


def listen_on(port: int) -> socket.socket:
    sock = socket.socket()
    sock.bind(("127.0.0.1", port))
    sock.listen()
    return sock


async def test_port_taken_before_start_is_refused_by_preflight(sim: SimSetup) -> None:
    """A port held by launcher's own user before the server was ever ready is a setup mistake:
    a fatal preflight problem at once that names the port and its holder; nothing runs.
    (Another user's holder, or any after ready, is waited for: test_hardening_ports.py.)"""
    with listen_on(sim.port):
        result = await supervise(sim.config())
    rec = result.events

    assert State.GAVE_UP == result.state, result.events.summary()
    assert not rec.has("attempt.started") and not rec.has("port.waiting")
    reason = rec.of("server.gave_up")[0]["reason"]
    assert reason.startswith(f"preflight: port {sim.port} is already in use on simhost ("), reason
    assert f"uid {os.getuid()}" in reason and f"pid {os.getpid()}" in reason, reason
    assert [] == sim.attempts()


async def test_port_taken_during_load_is_fatal_with_the_servers_message(sim: SimSetup) -> None:
    """A port taken after preflight: the server's own bind error ends it as port_in_use,
    after one attempt, with the port in the reason's evidence."""
    taken: list[socket.socket] = []

    def take_port(e: Recorded) -> None:
        if e.name == "phase.entered" and e.data["phase"] == "init" and not taken:
            taken.append(listen_on(sim.port))

    rec = Recorder(on=[take_port])
    try:
        result = await supervise(sim.config(), recorder=rec)
    finally:
        for sock in taken:
            sock.close()

    assert State.GAVE_UP == result.state, result.events.summary()
    assert 1 == len(rec.of("attempt.started"))
    [failed] = rec.of("attempt.failed")
    assert "port_in_use" == failed["outcome"]
    assert any(f"{sim.port}" in line and "address already in use" in line
               for line in failed["evidence"])
    reason = rec.of("server.gave_up")[0]["reason"]
    assert reason.startswith("port_in_use in warmup: a port is taken"), reason
    assert f"{sim.port}): address already in use)" in reason
    assert not sim.alive(1)


# --- GPUs held by someone else -------------------------------------------------------------


async def test_gpu_held_at_start_waits_then_proceeds(sim: SimSetup) -> None:
    """GPU memory held by a foreign process: gpu.waiting until it is released, then launch
    and ready."""
    holder = sim.hold_gpu(0, 20.0)

    async def release_later() -> None:
        await rec.wait_for("gpu.waiting", count=2)
        holder.kill()
        holder.wait()

    rec = Recorder()
    async with anyio.create_task_group() as tg:
        tg.start_soon(release_later)
        result = await supervise(sim.config(), until=ready_or_done, recorder=rec)
    names = rec.names()

    assert State.READY == result.supervisor.state, result.events.summary()
    waits = rec.of("gpu.waiting")
    assert f"GPU 0: 20480 MiB of 81091 MiB in use (limit 1024 MiB); held by pid {holder.pid}" in (
        waits[0]["reason"])
    assert any(f"pid {holder.pid}" in p for p in waits[1]["problems"])
    assert names.index("gpu.waiting") < names.index("attempt.started")
    assert 1 == len(rec.of("attempt.started"))


async def test_gpu_held_after_a_failure_waits_then_relaunches(sim: SimSetup) -> None:
    """Memory still held after a failed attempt (an orphan) delays the next attempt until it
    is released; the policy's params are then launched."""
    holders = []

    def orphan_on_failure(e: Recorded) -> None:
        if e.name == "attempt.failed" and not holders:
            holders.append(sim.hold_gpu(1, 10.0))

    async def release_later() -> None:
        await rec.wait_for("gpu.waiting", count=2)
        holders[0].kill()
        holders[0].wait()

    rec = Recorder(on=[orphan_on_failure])
    # The release comes after two GPU checks; each check runs nvidia-smi, which a loaded
    # machine may take seconds to answer: the wait's bound must not be what is tested here.
    config = sim.config(
        model="llama-70b-sim", tp=2, mem_fraction_static=0.99, cuda_graph_max_bs=256,
        policy={"gpu_free_timeout": "60s"},
    )
    async with anyio.create_task_group() as tg:
        tg.start_soon(release_later)
        result = await supervise(config, until=ready_or_done, recorder=rec)
    names = rec.names()

    assert State.READY == result.supervisor.state, result.events.summary()
    assert any(f"pid {holders[0].pid}" in p for p in rec.of("gpu.waiting")[0]["problems"])
    assert names.index("attempt.failed") < names.index("gpu.waiting")
    assert names.index("gpu.waiting") < names.index("policy.decided")
    assert 2 == rec.of("server.ready")[0]["attempts"]


async def test_orphans_that_ignore_sigterm_are_waited_out_before_the_relaunch(
    sim: SimSetup,
) -> None:
    """Schedulers that outlive their crashed server (orphan_hold, SIGTERM ignored) keep the
    GPUs: the relaunch comes only once they are gone (checked when the relaunch is reported,
    not by timing it), and nothing is left over."""
    config = sim.config(
        mem_fraction_static=0.8, cuda_graph_max_bs=8,
        faults=[{"kind": "orphan_hold", "orphan_hold_s": 1.0, "attempts": [1]}],
    )
    orphans_at_relaunch: list[bool] = []

    def look_at_the_orphans(e: Recorded) -> None:
        if e.name == "attempt.started" and e.data["attempt"] == 2:
            orphans_at_relaunch.append(group_alive(sim.pid(1)))

    rec = Recorder(on=[kill_when_ready(sim), look_at_the_orphans])
    result = await supervise(config, until=lambda r: r.has("server.ready", 2), recorder=rec)

    [stopped] = rec.of("process.stopped")
    assert (["SIGTERM"], []) == (stopped["signals"], stopped["leftover_pids"])
    names = rec.names()
    assert names.index("process.died") < names.index("process.stopped")
    assert names.index("process.stopped") < names.index("attempt.started", 1)
    assert [False] == orphans_at_relaunch
    assert not group_alive(sim.pid(1))
    assert State.READY == result.supervisor.state, result.events.summary()


class FollowDrops(LocalTransport):
    """The sim host, except that the first ``drops`` log followers fail at once, as a
    connection lost before it carried anything would."""

    def __init__(self, name: str, env: Mapping[str, str], drops: int) -> None:
        super().__init__(name, env=env)
        self.drops = drops

    def stream(self, argv: Sequence[str], *, env: Mapping[str, str] | None = None,
               ) -> AsyncGenerator[bytes, None]:
        if self.drops > 0 and run._FOLLOW in argv:
            self.drops -= 1
            return self._lost()
        return super().stream(argv, env=env)

    async def _lost(self) -> AsyncGenerator[bytes, None]:
        raise HostUnreachable("connection lost", host=self.host_name)
        yield b""  # pragma: no cover (makes this an async generator)


async def test_a_follower_that_keeps_losing_the_host_waits_doubling_times(
    sim: SimSetup,
) -> None:
    """Three followers in a row lose the host before reading anything: each outage is
    reported with the wait before the next try, 0.5 s, 1 s, 2 s, the supervisor sleeps
    exactly those, and the fourth follower brings the server up in its first attempt."""
    config = sim.config(mem_fraction_static=0.8, cuda_graph_max_bs=8)
    transport = FollowDrops("simhost", sim.host_env, drops=3)
    sleeps = RecordedSleep()
    result = await supervise(config, until=ready_or_done, transport=transport,
                             options={"sleep": sleeps})
    rec = result.events

    assert State.READY == result.supervisor.state, rec.summary()
    waits = [u["retry_in_s"] for u in rec.of("host.unreachable")]
    assert [0.5, 1.0, 2.0] == waits
    taken = iter(sleeps.sleeps)
    assert all(wait in taken for wait in waits)  # slept, in this order
    assert 3 == len(rec.of("host.reachable"))
    assert 1 == rec.of("server.ready")[0]["attempts"]
    assert not rec.has("attempt.failed")


# --- after ready -----------------------------------------------------------------------------


async def test_crash_after_ready_relaunches_with_the_last_good_params(sim: SimSetup) -> None:
    """A crash while serving: restart.scheduled with the params that were ready, relaunched
    after exactly the delay the restart backoff chose, and ready again on attempt 2."""
    config = sim.config(
        mem_fraction_static=0.8, cuda_graph_max_bs=8,
        faults=[{"kind": "crash_after_ready", "after_s": AFTER_READY_S, "attempts": [1]}],
    )
    p = config.policy_for(config.servers[0].name)
    sleeps = RecordedSleep()
    result = await supervise(config, until=lambda r: r.has("server.ready", 2),
                             options={"sleep": sleeps, "rng": random.Random(11)})
    rec = result.events
    # The same backoff with the same seed: the delay it chose for the first failure.
    expected = RestartBackoff(p.restart_backoff_initial, p.restart_backoff_max, p.healthy_reset,
                              p.restart_budget, p.restart_window,
                              random.Random(11)).on_failure(0.0)
    assert expected is not None
    good = {"mem_fraction_static": 0.8, "cuda_graph_max_bs": 8}

    [failed] = rec.of("attempt.failed")
    assert ("cuda_error_other", True) == (failed["outcome"], failed["after_ready"])
    assert any("illegal memory access" in line for line in failed["evidence"])
    assert "ready" == rec.of("process.died")[0]["phase"]
    [restart] = rec.of("restart.scheduled")
    assert good == restart["params"]
    assert round(expected, 2) == restart["delay_s"]
    assert expected in sleeps.sleeps  # the relaunch waited exactly that (the injected sleep)
    assert not rec.has("policy.decided")
    assert [good, good] == [s["params"] for s in rec.of("attempt.started")]
    assert [1, 2] == [r["attempts"] for r in rec.of("server.ready")]
    names = rec.names()
    assert names.index("restart.scheduled") < names.index("attempt.started", 1)
    assert State.READY == result.supervisor.state, result.events.summary()
    assert sim.alive(2)


async def test_death_after_its_log_vanished_is_still_reported_and_relaunched(
    sim: SimSetup,
) -> None:
    """A ready server whose log file was deleted and which then dies is reported dead
    (from its exit status) and relaunched; supervision neither crashes nor hangs."""

    def delete_log(e: Recorded) -> None:
        if e.name == "server.ready" and e.data["attempts"] == 1:
            (sim.attempt_dir(1) / "log").unlink()

    rec = Recorder(on=[delete_log, kill_when_ready(sim)])
    config = sim.config(mem_fraction_static=0.8, cuda_graph_max_bs=8)
    result = await supervise(config, until=lambda r: r.has("server.ready", 2), recorder=rec)

    assert [{"exit_status": 137, "phase": "ready", "attempt": 1}] == rec.of("process.died")
    assert rec.of("attempt.failed")[0]["after_ready"] is True
    assert 1 == len(rec.of("restart.scheduled"))
    assert rec.has("attempt.tail_unreadable")
    assert [] == rec.of("process.stopped")[0]["leftover_pids"]
    assert State.READY == result.supervisor.state, result.events.summary()


async def test_unhealthy_after_ready_is_killed_and_relaunched(sim: SimSetup) -> None:
    """/health failing after ready: server.unhealthy after probe_failures failures in a row,
    the server stopped and relaunched with the same params."""
    config = sim.config(
        mem_fraction_static=0.8, cuda_graph_max_bs=8,
        faults=[{"kind": "hang_after_ready", "after_s": AFTER_READY_S, "attempts": [1]}],
        policy={"probe_failures": 3},
    )
    result = await supervise(config, until=lambda r: r.has("server.ready", 2))
    rec = result.events

    [unhealthy] = rec.of("server.unhealthy")
    assert 3 == unhealthy["consecutive_failures"]
    assert "503" in unhealthy["detail"]
    assert [1, 2] == [p["consecutive"] for p in rec.of("probe.failed")]
    probes = [e.data["ok"] for e in rec.events if e.name == "probe.result"]
    assert [False, False, False] == probes[probes.index(False):][:3]
    [failed] = rec.of("attempt.failed")
    assert ("hang", "ready", True) == (failed["outcome"], failed["phase"], failed["after_ready"])
    assert "unhealthy" == rec.of("process.stopped")[0]["reason"]
    assert rec.has("restart.scheduled")
    assert 2 == len(rec.of("attempt.started"))
    assert not sim.alive(1)
    assert State.READY == result.supervisor.state, result.events.summary()


# --- launcher restarts ---------------------------------------------------------------------


async def test_new_supervisor_adopts_a_ready_server(sim: SimSetup) -> None:
    """A launcher that goes away leaves its ready server running; the next one adopts it
    (no new attempt) and reports it ready."""
    config = sim.config(mem_fraction_static=0.8, cuda_graph_max_bs=8)
    first = await supervise(config, until=ready_or_done)
    assert first.stopped_by_test
    pid = sim.pid(1)
    assert sim.alive(1)

    second = await supervise(config, until=ready_or_done)
    rec = second.events

    [adopted] = rec.of("server.adopted")
    launched = datetime.fromisoformat((sim.attempt_dir(1) / "started_at").read_text().strip())
    assert {"pid": pid, "attempt": 1, "started_at": launched.timestamp(),
            "params": {"mem_fraction_static": 0.8, "cuda_graph_max_bs": 8}} == adopted
    assert not rec.has("attempt.started")
    ready = rec.of("server.ready")[0]
    assert (1, True, None) == (ready["attempt"], ready["adopted"], ready["seconds"])
    assert [1] == sim.attempts()
    assert sim.alive(1)


async def test_new_supervisor_adopts_mid_load_and_follows_to_ready(sim: SimSetup) -> None:
    """A launcher killed while its server loads: the next one adopts the loading server and
    follows it to ready without launching a second one."""
    config = sim.config(
        mem_fraction_static=0.8, cuda_graph_max_bs=8,
        faults=[{"kind": "slow", "phase": "weights", "factor": 6}],
    )
    first = await supervise(
        config, until=lambda r: {"phase": "weights", "attempt": 1} in r.of("phase.entered")
    )
    assert first.stopped_by_test and sim.alive(1)

    second = await supervise(config, until=ready_or_done)
    rec = second.events

    assert 1 == rec.of("server.adopted")[0]["attempt"]
    assert not rec.has("attempt.started")
    assert 1 == rec.of("server.ready")[0]["attempts"]
    assert [1] == sim.attempts()
    assert "The server is fired up and ready to roll!" in sim.log(1)


# --- waits, deadlines and stops around restarts --------------------------------------------


async def test_gpu_wait_at_start_with_earlier_attempts_on_the_host(sim: SimSetup) -> None:
    """A run dir that already holds attempts (an earlier launcher's) and a GPU held at start:
    the supervisor waits, then launches the next attempt number."""
    config = sim.config(mem_fraction_static=0.8, cuda_graph_max_bs=8)
    earlier = await supervise(config, stop_when=ready_or_done)
    assert State.STOPPED == earlier.state and not sim.alive(1)
    holder = sim.hold_gpu(0, 20.0)

    async def release_later() -> None:
        await rec.wait_for("gpu.waiting", count=2)
        holder.kill()
        holder.wait()

    rec = Recorder()
    async with anyio.create_task_group() as tg:
        tg.start_soon(release_later)
        result = await supervise(config, until=ready_or_done, recorder=rec)

    assert State.READY == result.supervisor.state, result.events.summary()
    assert [2] == [s["attempt"] for s in rec.of("attempt.started")]
    assert 1 == rec.of("server.ready")[0]["attempts"]
    assert [1, 2] == sim.attempts()


async def test_death_long_after_the_start_deadline_still_restarts(sim: SimSetup) -> None:
    """A server that served for an hour (clock skewed forward) and then dies, with its GPU
    held for a while after the death, is restarted: the start-up deadline is not applied to
    the cleanup after a failure while serving."""
    skew = [0.0]

    def clock() -> float:
        return time.monotonic() + skew[0]

    holders = []

    def serve_an_hour_then_hold(e: Recorded) -> None:
        if e.name == "server.ready" and not skew[0]:
            skew[0] = 3600.0
            os.kill(sim.pid(1), signal.SIGKILL)
        elif e.name == "attempt.failed" and not holders:
            holders.append(sim.hold_gpu(0, 10.0))

    async def release_later() -> None:
        await rec.wait_for("gpu.waiting", count=2)
        holders[0].kill()
        holders[0].wait()

    rec = Recorder(on=[serve_an_hour_then_hold])
    config = sim.config(
        mem_fraction_static=0.8, cuda_graph_max_bs=8, policy={"start_deadline": "60s"}
    )
    async with anyio.create_task_group() as tg:
        tg.start_soon(release_later)
        result = await supervise(
            config, until=lambda r: r.has("server.ready", 2), recorder=rec, clock=clock
        )

    assert not rec.has("server.gave_up"), rec.of("server.gave_up")
    assert 1 == len(rec.of("restart.scheduled"))
    assert State.READY == result.supervisor.state, result.events.summary()


async def test_gpu_busy_at_a_restarts_preflight_waits_without_a_second_restart(
    sim: SimSetup,
) -> None:
    """GPU memory held when a restart after a death while serving begins: the restart's
    preflight waits for it, then launches once; the restart is counted once."""
    holders = []

    def hold_at_restart(e: Recorded) -> None:
        if e.name == "restart.scheduled" and not holders:
            holders.append(sim.hold_gpu(0, 10.0))

    async def release_later() -> None:
        await rec.wait_for("gpu.waiting", count=2)
        holders[0].kill()
        holders[0].wait()

    rec = Recorder(on=[kill_when_ready(sim), hold_at_restart])
    # The hold is released after the second check, which a loaded machine can push past the
    # tests' usual 10 s GPU wait; the wait's end is not what this test is about.
    config = sim.config(mem_fraction_static=0.8, cuda_graph_max_bs=8,
                        policy={"gpu_free_timeout": "60s"})
    async with anyio.create_task_group() as tg:
        tg.start_soon(release_later)
        result = await supervise(config, until=lambda r: r.has("server.ready", 2), recorder=rec)

    assert 1 == len(rec.of("restart.scheduled"))
    assert "reason" in rec.of("gpu.waiting")[0]  # the preflight's wait
    assert [1, 2] == [s["attempt"] for s in rec.of("attempt.started")]
    assert State.READY == result.supervisor.state, result.events.summary()


async def test_stop_with_kill_during_the_launch_stops_the_launched_server(
    sim: SimSetup,
) -> None:
    """A stop with kill requested while the launch command runs: supervision ends stopped
    and the server that the launch started is stopped too, not left behind."""
    box: list[ServerSupervisor] = []

    def stop_at_launch(e: Recorded) -> None:
        if e.name == "attempt.started":
            box[0].request_stop(kill=True)

    rec = Recorder(on=[stop_at_launch])
    result = await supervise(
        sim.config(mem_fraction_static=0.8, cuda_graph_max_bs=8), recorder=rec,
        on_start=box.append,
    )

    assert State.STOPPED == result.state, result.events.summary()
    assert rec.has("server.stopped")
    assert [1] == sim.attempts()
    assert not group_alive(sim.pid(1))  # stop returns once the group is gone
    assert ["SIGTERM"] == rec.of("process.stopped")[0]["signals"]


async def test_start_up_past_its_deadline_is_stopped_and_given_up(sim: SimSetup) -> None:
    """A start-up still loading when start_deadline passes (the clock skewed past it once
    the weights load) is stopped and given up on, with the deadline in the reason."""
    skew = [0.0]

    def skew_past_the_deadline(e: Recorded) -> None:
        if e.name == "phase.entered" and e.data["phase"] == "weights":
            skew[0] = 120.0

    config = sim.config(
        mem_fraction_static=0.8, cuda_graph_max_bs=8,
        faults=[{"kind": "hang", "phase": "weights"}],
        policy={"start_deadline": "60s"},
        stall={"weights": "1h"},  # the skew must not look like a stall
    )
    result = await supervise(
        config, recorder=Recorder(on=[skew_past_the_deadline]),
        clock=lambda: time.monotonic() + skew[0],
    )
    rec = result.events

    assert State.GAVE_UP == result.state, result.events.summary()
    assert "start-up deadline of 60s passed" == rec.of("server.gave_up")[0]["reason"]
    assert "deadline" == rec.of("process.stopped")[0]["reason"]
    assert 1 == len(rec.of("attempt.started"))
    assert not group_alive(sim.pid(1))
