"""The fault matrix with real parts: real sshd (in a network namespace where the network is cut),
the simulated SGLang host, the real supervisor. docs/reliability.md records what each measured.

Budgets are small (stall budgets of seconds, keepalives of 1 s) so each fault plays out in
seconds; assertions are about behaviour (what was relaunched, which bytes were delivered), the
measured durations are printed for the record only.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import signal
import subprocess
import sys
import time
from collections.abc import AsyncIterator, Callable, Iterator, Mapping, Sequence
from pathlib import Path
from typing import Any

import anyio
import pytest

from launcher.sglang.logparse import LineSplitter
from launcher.sim import gpustate
from launcher.supervise import events as ev
from launcher.supervise.lifecycle import State
from launcher.supervise.supervisor import ServerSupervisor
from tests.netns import NetnsSshd
from tests.simhost import free_port
from tests.sshd import Sshd
from tests.sshsim import (
    EventRecorder,
    RecordingSSHTransport,
    Site,
    kill_leftovers,
    server_entry,
    ssh_config,
)
from tests.test_ssh_e2e import (
    LineRecordingSupervisor,
    alive,
    ssh_transports,
    supervising,
    supervisor,
    wait_until,
)

pytestmark = pytest.mark.ssh

# Events that mean a launch or a failure; a fault that must cost nothing shows only the first.
FAILURE_EVENTS = ("attempt.started", "attempt.failed", "stall.detected", "probe.failed",
                  "server.unhealthy", "process.died", "launch.failed")


@pytest.fixture
def ns_sshd(tmp_path_factory: pytest.TempPathFactory) -> Iterator[NetnsSshd]:
    """A stock sshd (default MaxSessions) in its own network namespace."""
    daemon = NetnsSshd(tmp_path_factory.mktemp("ns-sshd"))
    try:
        daemon.start()
        yield daemon
    finally:
        daemon.stop()


class FollowRecordingTransport(RecordingSSHTransport):
    """The real SSH transport; also records the byte offset every log follower starts from."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.follow_offsets: list[int] = []

    def stream(self, argv: Sequence[str], *, env: Mapping[str, str] | None = None
               ) -> AsyncIterator[bytes]:
        if "tail -c" in argv[2] and "--pid" in argv[2]:  # remote._FOLLOW: $2 is offset + 1
            self.follow_offsets.append(int(argv[5]) - 1)
        return super().stream(argv, env=env)


# -- the host's network cut for 3x the stall budget ------------------------------------------

STALL_BUDGET_S = 2.0
CUT_S = 3 * STALL_BUDGET_S


def _slow_capture(
    site: Site, tmp_path: Path
) -> tuple[LineRecordingSupervisor, FollowRecordingTransport, EventRecorder]:
    """A supervisor of server "llm" on ``site`` whose CUDA-graph capture is slowed 200x (one
    progress write every ~0.75 s), with a short capture stall budget and 1 s keepalives."""
    faults = site.sim.write_faults([{"kind": "slow", "phase": "cuda_graph", "factor": 200}])
    config = ssh_config(
        tmp_path,
        [site.host_entry(keepalive_interval="1s", connect_timeout="2s")],
        [server_entry("llm", site, port=free_port(), env={"SGLANG_SIM_FAULTS": str(faults)})],
        policy={"stall": {"cuda_graph": f"{STALL_BUDGET_S}s"}},
    )
    events = EventRecorder()
    transport = FollowRecordingTransport.from_host_config(config.host("gpu1"))
    assert isinstance(transport, FollowRecordingTransport)
    sup = LineRecordingSupervisor(config, config.server("llm"), transport,
                                  sglang_version="0.5.23", hooks=[events])
    return sup, transport, events


@pytest.mark.slow
@pytest.mark.timeout(300)  # two outages of seconds each, plus reconnects
async def test_network_cut_for_three_stall_budgets_relaunches_nothing_and_resumes_at_offset(
    ns_sshd: NetnsSshd, tmp_path: Path
) -> None:
    """The host's network is cut for 3x the stall budget twice: while CUDA graphs are being
    captured (the log keeps growing on the host) and while ready (with lines appended to the
    log during the cut). Neither cut stalls, fails a probe or relaunches; each is reported as
    host.unreachable and then host.reachable with the time unreachable; the follower resumes
    at the offset it had reached and delivers the log's lines exactly once."""
    site = Site.create(tmp_path, "gpu1", ns_sshd)
    # tiny-1b captures ~36 batch sizes: slowed 200x, one progress write every ~0.75 s.
    sup, transport, events = _slow_capture(site, tmp_path)
    outages: list[dict[str, Any]] = []

    async def cut(appended: bytes = b"") -> None:
        offset = sup.attempts[1].offset
        before = len(transport.follow_offsets)
        log_at_cut = len(site.log_bytes("llm", 1))
        ns_sshd.cut()
        try:
            await wait_until(lambda: len(events.named("host.unreachable")) > len(outages), 30,
                             events, "host.unreachable")
            append_at = len(site.log_bytes("llm", 1))
            if appended:
                with (site.attempt_dir("llm", 1) / "log").open("ab") as fh:
                    fh.write(appended)
            await anyio.sleep(CUT_S)
        finally:
            ns_sshd.heal()
        await wait_until(lambda: len(events.named("host.reachable")) > len(outages), 60,
                         events, "host.reachable")
        await wait_until(lambda: len(transport.follow_offsets) > before, 30, events,
                         "a new follower")
        outages.append({
            "offset_at_cut": offset, "log_at_cut": log_at_cut, "append_at": append_at,
            "resumed_at": transport.follow_offsets[before],
            "unreachable_s": events.named("host.reachable")[-1].data["unreachable_s"],
        })

    try:
        async with supervising(sup):
            await wait_until(lambda: sup.state is State.CUDA_GRAPH, 60, events, "cuda_graph")
            await wait_until(lambda: 1 in sup.attempts and sup.attempts[1].offset > 0, 10,
                             events, "a followed line")
            await cut()
            state_after_first = sup.state
            await wait_until(lambda: sup.state is State.READY, 90, events, "ready")
            await wait_until(lambda: len(events.named("probe.result")) >= 3, 20, events,
                             "probes")
            await cut(b"written during the cut 1\nwritten during the cut 2\n")
            await wait_until(
                lambda: sup.attempts[1].offset >= len(site.log_bytes("llm", 1)), 20, events,
                "catch-up")
            ready_probes_after = [e for e in events.named("probe.result") if e.data["ok"]]
            final = sup.state
            offset = sup.attempts[1].offset
        pid = site.server_pid("llm", 1)
        server_alive = alive(pid)
    finally:
        await transport.aclose()
        kill_leftovers([site.run_dir])
    for i, outage in enumerate(outages, 1):
        print(f"cut {i}: unreachable_s={outage['unreachable_s']} offset_at_cut="
              f"{outage['offset_at_cut']} resumed_at={outage['resumed_at']} "
              f"log_at_cut={outage['log_at_cut']}")
    log_bytes = site.log_bytes("llm", 1)
    assert 2 == len(outages)
    assert state_after_first in (State.CUDA_GRAPH, State.WARMUP)
    assert State.READY == final
    assert ["attempt.started"] == [n for n in events.names() if n in FAILURE_EVENTS]
    # The follower resumed where it was; the log had grown on the host meanwhile.
    # (bytes in flight when the link went down may still have arrived: never fewer).
    assert all(o["offset_at_cut"] <= o["resumed_at"] for o in outages)
    assert outages[1]["resumed_at"] <= outages[1]["append_at"]  # nothing written meanwhile lost
    assert all(o["unreachable_s"] > 0 for o in outages)
    assert server_alive and pid == sup.machine.pid
    assert ready_probes_after
    # The follower caught up with the whole log once ready (the catch-up wait above). The sim
    # may append the access-log line of the probe that found it ready just after that, once
    # nobody follows any more: only such lines may lie past the offset.
    after_offset = log_bytes[offset:].splitlines()
    assert all(b'"GET /health' in line for line in after_offset), after_offset
    assert LineSplitter().feed(log_bytes[:offset]) == sup.lines[1]
    assert b"written during the cut 2\n" in log_bytes


async def test_stop_with_kill_during_a_network_cut_waits_for_the_host_then_stops(
    ns_sshd: NetnsSshd, tmp_path: Path
) -> None:
    """A stop with kill requested while the host's network is cut neither gives up nor
    reports the server stopped: it waits for the host, then stops the server for real."""
    site = Site.create(tmp_path, "gpu1", ns_sshd)
    config = ssh_config(tmp_path, [site.host_entry(keepalive_interval="1s", connect_timeout="2s")],
                        [server_entry("llm", site, port=free_port())])
    events = EventRecorder()
    # Connection retries give up within a second, so the stop's own tries fail during the cut.
    fast = {"gpu1": {"retry_attempts": 2, "retry_max_seconds": 1.0}}
    try:
        async with ssh_transports(config, **fast) as transports:
            sup = supervisor(config, "llm", transports, events)
            async with supervising(sup):
                await wait_until(lambda: sup.state is State.READY, 60, events, "ready")
                pid = site.server_pid("llm", 1)
                ns_sshd.cut()
                try:
                    await wait_until(lambda: bool(events.named("host.unreachable")), 30, events,
                                     "host.unreachable")
                    sup.request_stop(kill=True)
                    asked = len(events.named("host.unreachable"))
                    await wait_until(lambda: len(events.named("host.unreachable")) > asked + 2
                                     or sup.state is State.STOPPED, 60, events,
                                     "failed stop tries")
                    during = (sup.state, alive(pid), events.named("process.stop_failed"))
                finally:
                    ns_sshd.heal()
                await wait_until(lambda: sup.state is State.STOPPED, 90, events, "stopped")
                after = alive(pid)
    finally:
        kill_leftovers([site.run_dir])
    stopped = [e.data for e in events.named("process.stopped")]
    print(f"stop during a cut: state while cut {during[0]}, then {stopped}")
    assert (State.CLEANING_UP, True, []) == during
    assert not after
    assert [("stop", ["SIGTERM"], [])] == [
        (d["reason"], d["signals"][:1], d["leftover_pids"]) for d in stopped]


# -- sshd killed mid-load, then restarted ---------------------------------------------------


@pytest.fixture
def stock_sshd(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Sshd]:
    """A real sshd on 127.0.0.1 with OpenSSH's default MaxSessions."""
    daemon = Sshd(tmp_path_factory.mktemp("stock-sshd"), max_sessions=None)
    daemon.start()
    yield daemon
    daemon.stop()


@pytest.mark.slow
@pytest.mark.timeout(300)  # a 6 s sshd outage during a slowed capture, plus reconnects
async def test_sshd_killed_mid_load_then_restarted_relaunches_nothing_and_loses_no_line(
    stock_sshd: Sshd, tmp_path: Path
) -> None:
    """sshd (listener and every connection) is killed while CUDA graphs are captured and
    started again 3x the stall budget later: the server keeps its pid and attempt, nothing
    stalls or relaunches, and the follower delivered every log line exactly once."""
    site = Site.create(tmp_path, "gpu1", stock_sshd)
    sup, transport, events = _slow_capture(site, tmp_path)
    try:
        async with supervising(sup):
            await wait_until(lambda: sup.state is State.CUDA_GRAPH, 60, events, "cuda_graph")
            await wait_until(lambda: 1 in sup.attempts and sup.attempts[1].offset > 0, 10,
                             events, "a followed line")
            pid = site.server_pid("llm", 1)
            await anyio.to_thread.run_sync(stock_sshd.stop)
            await anyio.sleep(CUT_S)
            state_while_down = sup.state
            await anyio.to_thread.run_sync(stock_sshd.start)
            await wait_until(lambda: sup.state is State.READY, 90, events, "ready")
            await wait_until(
                lambda: sup.attempts[1].offset >= len(site.log_bytes("llm", 1)), 20, events,
                "catch-up")
            offset = sup.attempts[1].offset
        server_alive = alive(pid)
    finally:
        await transport.aclose()
        kill_leftovers([site.run_dir])
    reachable = events.named("host.reachable")
    print(f"sshd down {CUT_S}s: unreachable_s="
          f"{[e.data['unreachable_s'] for e in reachable]}")
    log_bytes = site.log_bytes("llm", 1)
    assert state_while_down is State.CUDA_GRAPH
    assert ["attempt.started"] == [n for n in events.names() if n in FAILURE_EVENTS]
    assert events.named("host.unreachable") and reachable
    assert server_alive and pid == sup.machine.pid
    # The follower caught up with the whole log once ready (the catch-up wait above). The sim
    # may append the access-log line of the probe that found it ready just after that, once
    # nobody follows any more: only such lines may lie past the offset.
    after_offset = log_bytes[offset:].splitlines()
    assert all(b'"GET /health' in line for line in after_offset), after_offset
    assert LineSplitter().feed(log_bytes[:offset]) == sup.lines[1]


# -- the remote run directory's filesystem full ----------------------------------------------


@pytest.fixture
def full_tmpfs(tmp_path: Path) -> Iterator[Path]:
    """A 64 KiB tmpfs, filled up to the last byte (needs root: mount)."""
    mount_point = tmp_path / "tiny"
    mount_point.mkdir()
    subprocess.run(["mount", "-t", "tmpfs", "-o", "size=64k", "tmpfs", str(mount_point)],
                   check=True, capture_output=True)
    try:
        filler = subprocess.run(["sh", "-c", f"cat /dev/zero > {mount_point}/filler"],
                                capture_output=True, text=True)
        assert "No space left on device" in filler.stderr
        yield mount_point
    finally:
        subprocess.run(["umount", "-l", str(mount_point)], check=False, capture_output=True)


async def test_full_run_dir_filesystem_gives_up_at_once_naming_host_and_path(
    stock_sshd: Sshd, full_tmpfs: Path, tmp_path: Path
) -> None:
    """With the run directory's filesystem full, the launch fails with an error that names
    the host and the path it could not write, and the server gives up after that one launch:
    no relaunch loop."""
    site = Site.create(tmp_path, "gpu1", stock_sshd)
    config = ssh_config(tmp_path, [site.host_entry(run_dir=str(full_tmpfs / "runs"))],
                        [server_entry("llm", site, port=free_port())])
    events = EventRecorder()
    async with ssh_transports(config) as transports:
        sup = supervisor(config, "llm", transports, events)
        with anyio.fail_after(60):
            final = await sup.run()
    failed = events.named("launch.failed")
    gave_up = events.named("server.gave_up")
    print(f"gave up: {sup.machine.reason!r}")
    assert State.GAVE_UP == final
    assert 1 == len(failed) == len(gave_up) == len(events.named("attempt.started"))
    assert f"cannot write {full_tmpfs}/runs/llm/1/env on gpu1" in failed[0].data["error"]
    assert "No space left on device" in failed[0].data["error"]
    assert f"{full_tmpfs}/runs/llm/1/env on gpu1" in sup.machine.reason


# -- launcher SIGKILLed at each step of a launch ---------------------------------------------


def gated_setsid(bin_dir: Path) -> None:
    """Put a setsid in ``bin_dir`` that holds a launch at a step while a gate file exists.

    ``<attempt dir>.hold-wrapper``: before the wrapper is spawned (nothing runs yet);
    ``<attempt dir>.hold-shim``: after the wrapper, before the server's shim writes its pid.
    Reaching a gate touches ``<gate>.reached``. Then it execs the real setsid.
    """
    real = shutil.which("setsid")
    assert real is not None
    bin_dir.mkdir(parents=True, exist_ok=True)
    script = bin_dir / "setsid"
    script.write_text(
        "#!/bin/sh\n"
        'case $3 in *_launcher_dir*) gate=$5.hold-shim ;; *) gate=$5.hold-wrapper ;; esac\n'
        'if [ -e "$gate" ]; then : > "$gate.reached"; fi\n'
        'while [ -e "$gate" ]; do sleep 0.05; done\n'
        f'exec {real} "$@"\n'
    )
    script.chmod(0o755)


def sim_servers(site: Site) -> list[int]:
    """Pids of the live sim servers of ``site`` (process-group leaders, zombies excluded)."""
    found = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            cmd = (entry / "cmdline").read_bytes()
            env = (entry / "environ").read_bytes()
            stat = (entry / "stat").read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue
        if (b"launcher.sim.server" in cmd and stat[0] != "Z" and int(stat[2]) == int(entry.name)
                and f"SGLANG_SIM_HOST={site.sim.path}".encode() in env.split(b"\0")):
            found.append(int(entry.name))
    return found


@pytest.mark.parametrize("step", ["before_spawn", "after_spawn_before_pid", "after_pid"])
async def test_launcher_killed_at_a_launch_step_restarts_with_exactly_one_copy(
    stock_sshd: Sshd, tmp_path: Path, step: str
) -> None:
    """launcher dies (its supervisor cancelled mid-launch and its SSH connections closed: what
    the host sees of a SIGKILL) at a step of the launch; a new launcher adopts or relaunches,
    and once the held launch is let go, exactly one copy runs, the supervised one."""
    site = Site.create(tmp_path, "gpu1", stock_sshd)
    gated_setsid(tmp_path / "gate-bin")
    env = {"SGLANG_SIM_HOST": str(site.sim.path),
           "PATH": f"{tmp_path / 'gate-bin'}:{os.environ['PATH']}"}
    config = ssh_config(tmp_path, [site.host_entry(env=env)],
                        [server_entry("llm", site, port=free_port())])
    first = site.attempt_dir("llm", 1)
    first.parent.mkdir(parents=True)
    gate = {"before_spawn": Path(f"{first}.hold-wrapper"),
            "after_spawn_before_pid": Path(f"{first}.hold-shim")}.get(step)
    reached: Callable[[], bool] = lambda: (first / "pid").exists()  # noqa: E731
    if gate is not None:
        gate.touch()
        reached = Path(f"{gate}.reached").exists
    events = EventRecorder()
    try:
        # The launcher that dies.
        async with ssh_transports(config) as transports:
            sup = supervisor(config, "llm", transports, events)
            async with anyio.create_task_group() as tg:
                await tg.start(sup.run)
                await wait_until(reached, 60, events, f"the launch at {step}")
                tg.cancel_scope.cancel()
        # The launcher that restarts.
        async with ssh_transports(config) as transports:
            sup = supervisor(config, "llm", transports, events)
            async with supervising(sup):
                await wait_until(lambda: sup.state is State.READY, 60, events, "ready")
                if gate is not None:
                    gate.unlink()  # the held launch goes on now
                    await wait_until((first / "exit_status").exists, 30, events,
                                     "the held launch to end")
                await anyio.sleep(1.0)  # room for a second copy to show itself
                copies = sim_servers(site)
                supervised = sup.machine.pid
                attempt = sup.machine.attempt
    finally:
        kill_leftovers([site.run_dir])
    print(f"{step}: copies={copies} supervised={supervised} attempt={attempt} "
          f"adopted={bool(events.named('server.adopted'))}")
    assert [supervised] == copies
    if step == "after_pid":
        assert events.named("server.adopted")
        assert site.server_pid("llm", 1) == supervised
        assert not site.attempt_dir("llm", 2).exists()
    else:
        assert site.server_pid("llm", 2) == supervised
        assert "125" == (first / "exit_status").read_text().strip()  # its shim lost the claim
        assert not (first / "pid").exists()


# -- the operator box CPU-starved ------------------------------------------------------------


def _pin_process(cpus: set[int]) -> None:
    for task in Path("/proc/self/task").iterdir():
        with contextlib.suppress(OSError):
            os.sched_setaffinity(int(task.name), cpus)


@pytest.fixture
def starved_core() -> Iterator[int]:
    """This process pinned to one core that two busy loops share with it (2x its cores)."""
    core = min(os.sched_getaffinity(0))
    saved = os.sched_getaffinity(0)
    hogs = [subprocess.Popen(["taskset", "-c", str(core), "sh", "-c", "while :; do :; done"])
            for _ in range(2)]
    _pin_process({core})
    try:
        yield core
    finally:
        _pin_process(saved)
        for hog in hogs:
            hog.kill()
            hog.wait()


async def test_cpu_starved_operator_side_sees_no_false_death_or_stall(
    stock_sshd: Sshd, starved_core: int, tmp_path: Path
) -> None:
    """The launcher's side (this process, pinned to one core) shares its core with two busy
    loops (a hog at 2x its cores) from launch until well after ready, with stall budgets of
    2 s: the server comes up in one attempt and no stall, probe failure or death is reported."""
    site = Site.create(tmp_path, "gpu1", stock_sshd)
    config = ssh_config(
        tmp_path, [site.host_entry()], [server_entry("llm", site, port=free_port())],
        policy={"stall": {p: f"{STALL_BUDGET_S}s"
                          for p in ("init", "weights", "kv_cache", "cuda_graph", "warmup")}},
    )
    events = EventRecorder()
    lags: list[float] = []

    async def measure_lag() -> None:
        while True:
            before = anyio.current_time()
            await anyio.sleep(0.1)
            lags.append(anyio.current_time() - before - 0.1)

    try:
        async with ssh_transports(config) as transports:
            sup = supervisor(config, "llm", transports, events)
            async with anyio.create_task_group() as tg:
                tg.start_soon(measure_lag)
                async with supervising(sup):
                    await wait_until(lambda: sup.state is State.READY, 90, events, "ready")
                    ready_at = len(events.named("probe.result"))
                    await wait_until(lambda: len(events.named("probe.result")) >= ready_at + 10,
                                     60, events, "10 probes while starved")
                    final = sup.state
                tg.cancel_scope.cancel()
    finally:
        kill_leftovers([site.run_dir])
    latencies = [e.data["latency_s"] for e in events.named("probe.result")]
    print(f"starved core {starved_core}: loop lag max={max(lags):.3f}s "
          f"p50={sorted(lags)[len(lags) // 2]:.3f}s probe latency max={max(latencies):.3f}s "
          f"probes={len(latencies)}")
    assert State.READY == final
    assert ["attempt.started"] == [n for n in events.names() if n in FAILURE_EVENTS]
    assert all(e.data["ok"] for e in events.named("probe.result")[ready_at:])


# -- an orphan holding GPU memory after a crash ----------------------------------------------


def start_orphan(site: Site, gpu: int, gib: float) -> subprocess.Popen[bytes]:
    """A process outside any server's session registered in the sim host as holding ``gib``
    on ``gpu``: a scheduler that escaped its server's process group and is stuck in the
    driver. Its memory is free once it is gone."""
    proc = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(300)"],
                            stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,
                            stderr=subprocess.DEVNULL, start_new_session=True)
    host = gpustate.SimGpuHost.load(site.sim.path, {})
    deadline = time.monotonic() + 5
    while (holder := gpustate.holder_of(proc, gpu, "sglang::scheduler_TP0")).start < 0:
        assert time.monotonic() < deadline, "the orphan did not start"
        time.sleep(0.01)
    gpustate.Registration(host, proc.pid, [holder]).update({gpu: gib})
    return proc


async def test_orphan_holding_gpu_memory_after_a_crash_is_waited_for_then_reported_by_pid(
    stock_sshd: Sshd, tmp_path: Path
) -> None:
    """A ready server is SIGKILLed and an orphan of it keeps 40 GiB of its GPU: the relaunch
    waits for the GPU (gpu.waiting names the orphan's pid) and, the GPU still held after
    gpu_free_timeout, gives up naming the pid; nothing is launched onto the held GPU."""
    site = Site.create(tmp_path, "gpu1", stock_sshd)
    config = ssh_config(tmp_path, [site.host_entry()],
                        [server_entry("llm", site, port=free_port())],
                        policy={"gpu_free_timeout": "3s"})
    orphans: list[subprocess.Popen[bytes]] = []

    def orphan_on_failure(server: str, event: ev.Event) -> None:
        if isinstance(event, ev.AttemptFailed) and not orphans:
            orphans.append(start_orphan(site, 0, 40.0))

    events = EventRecorder()
    try:
        async with ssh_transports(config) as transports:
            sup = ServerSupervisor(config, config.server("llm"), transports["gpu1"],
                                   sglang_version="0.5.23", hooks=[events, orphan_on_failure])
            async with supervising(sup):
                await wait_until(lambda: sup.state is State.READY, 60, events, "ready")
                os.kill(site.server_pid("llm", 1), signal.SIGKILL)
                await wait_until(lambda: sup.state is State.GAVE_UP, 60, events, "gave up")
            reason = sup.machine.reason
    finally:
        kill_leftovers([site.run_dir])
        for proc in orphans:
            proc.kill()
            proc.wait()
    pid = orphans[0].pid
    waiting = [e for e in events.named("gpu.waiting") if "problems" in e.data]
    print(f"orphan pid={pid} gpu.waiting={len(waiting)} reason={reason!r}")
    assert waiting and all(any(f"pid {pid}" in p for p in e.data["problems"]) for e in waiting)
    assert "GPUs still in use after waiting" in reason and f"pid {pid}" in reason
    assert 1 == len(events.named("attempt.started"))  # nothing launched onto the held GPU
