#!/usr/bin/env python3
"""Detection-latency benchmark: how fast launcher notices a dead, stalled or OOMed server,
locally and over real SSH, next to the seeds' ``tail -1`` polling loop (docs/incidents.md;
figures in docs/benchmarks.md).

    .venv/bin/python scripts/bench/bench_detect.py [--trials 20] [--transport local|ssh|both]

Each trial runs a real :class:`launcher.supervise.supervisor.ServerSupervisor` against a simulated
SGLang server (tiny-1b-sim, sim time scale 0.003) and timestamps the supervisor's events in a hook:

- kill:  SIGKILL of the server mid-load (during CUDA-graph capture) -> ``process.died``;
         latency = event time - kill time.
- stop:  SIGSTOP of the server's whole process group mid-load -> ``stall.detected`` with a
         2 s stall budget; reported as event time - stop time - budget.
- oom:   mem_fraction_static 0.99 / cuda_graph_max_bs 256 OOMs in capture -> ``attempt.failed``;
         latency = event time - the server's exit time (watched with a pidfd).

The seeds' loop (``tail -1`` of the log every 25 s, 16 polls) is replayed exactly against each
trial's recorded log: the log only grows, so what ``tail -1`` returned at time t is the last line
of the log's first size(t) bytes, with size(t) from a 10 ms sampler that stamps each new size
with the file's mtime (exact from the last write on). Markdown tables go to stdout, progress to
stderr.

Resource handling: everything lives in a temporary directory; every server a trial launched is
SIGKILLed (its whole session, checked against its recorded start time) after the trial, and
again at exit whatever happened (also on SIGTERM / Ctrl-C), and the sshd is stopped.
"""

from __future__ import annotations

import argparse
import contextlib
import hashlib
import json
import logging
import math
import os
import platform
import pwd
import random
import re
import select
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
from collections import Counter
from collections.abc import AsyncGenerator, Iterator, Mapping, Sequence
from contextlib import AbstractAsyncContextManager
from dataclasses import asdict, dataclass, field
from pathlib import Path
from types import FrameType
from typing import Any

REPO = Path(__file__).resolve().parents[2]
if str(REPO) not in sys.path:  # run as a plain script: make launcher and tests importable
    sys.path.insert(0, str(REPO))

import anyio  # noqa: E402
import structlog  # noqa: E402

from launcher.config.load import config_from_dict  # noqa: E402
from launcher.config.schema import Config  # noqa: E402
from launcher.host import run as remote  # noqa: E402
from launcher.host.transport.base import CommandResult, Transport  # noqa: E402
from launcher.host.transport.local import LocalTransport  # noqa: E402
from launcher.host.transport.ssh import SSHTransport  # noqa: E402
from launcher.sglang.phases import Phase  # noqa: E402
from launcher.supervise.supervisor import ServerSupervisor  # noqa: E402
from tests.simhost import free_port, model_dir  # noqa: E402
from tests.sshd import Sshd  # noqa: E402
from tests.sshsim import Site, kill_leftovers, server_entry, ssh_config  # noqa: E402
from tests.supervise import Recorded, Recorder, SimSetup  # noqa: E402

SERVER = "sim0"
SIM_VERSION = "0.5.23"
TIME_SCALE = 0.003  # the sim's scale in every test helper: SGLang's ~150 s start-up in ~0.45 s
# Capture is slowed x15 (about 2 s, a log write every ~60 ms) so that "mid-load" is a window
# the faults can be injected in; every other phase runs at the plain time scale.
CAPTURE_SLOW = 15.0
INJECT_WINDOW_S = (0.2, 1.2)  # after the supervisor saw the capture phase begin
STALL_BUDGET_S = 2.0
OK_PARAMS = (0.8, 256)  # (mem_fraction_static, cuda_graph_max_bs): fits
OOM_PARAMS = (0.99, 256)  # OOMs at the first decode-graph capture
TRIAL_TIMEOUT_S = 60.0  # generous: preflight alone can take seconds under heavy load

# The seeds' loop (docs/incidents.md, incident 2): poll `tail -1` every 25 s, 16 times, grep -qiE.
SEEDS_POLL_S = 25.0
SEEDS_POLLS = 16
SEEDS_READY = re.compile(r"fired up|ready to roll", re.IGNORECASE)
SEEDS_ERROR = re.compile(r"Traceback|out of memory|Killed|assert|Error:", re.IGNORECASE)

# Targets (docs/benchmarks.md, "Detection latency").
DEATH_P95_SSH_TARGET_S = 1.5
STALL_OVER_BUDGET_TARGET_S = 2.0

FAULTS = ("kill", "stop", "oom")
TARGET_EVENT = {"kill": "process.died", "stop": "stall.detected", "oom": "attempt.failed"}
FAULT_TITLE = {
    "kill": "SIGKILL of the server mid-load -> process.died (event - kill)",
    "stop": "SIGSTOP of the process group mid-load -> stall.detected (event - stop - budget)",
    "oom": "capture OOM exit -> attempt.failed (event - server exit)",
}


def progress(message: str) -> None:
    print(message, file=sys.stderr, flush=True)


# --- measurements ------------------------------------------------------------------------


@dataclass
class SeedsVerdict:
    """What the seeds' loop would have concluded on one trial's log."""

    outcome: str  # "error" (its ERR branch), "ready" (READY: a dead server called up), "never"
    poll: int | None  # 1-based poll that decided, None for never
    latency_s: float | None  # decision time - fault time
    last_line: str  # tail -1 at the deciding poll (or at the 16th)


@dataclass
class Trial:
    """One fault injection and what the supervisor and the seeds' loop made of it."""

    transport: str
    fault: str
    index: int
    ok: bool = False
    error: str = ""
    attempt: int | None = None
    inject_phase: str | None = None
    inject_after_phase_s: float | None = None
    latency_s: float | None = None  # the fault's headline number (see FAULT_TITLE)
    event_after_fault_s: float | None = None
    exit_after_fault_s: float | None = None  # kill: when the server actually was gone
    exit_source: str = ""  # oom: "pidfd" or "log mtime"
    after_last_write_oom_s: float | None = None  # oom: event - last log write (upper bound)
    # the first log follower: each chunk's arrival - the time the log first held its last
    # byte (a lower bound on how late the supervisor saw it)
    first_chunk_lag_s: float | None = None
    delivery_lags: list[float] = field(default_factory=list)
    wall_s: float = 0.0  # the whole trial, set-up and the supervisor's clean-up included
    cleanup_errors: list[str] = field(default_factory=list)  # process.stop_failed errors
    silent_s: float | None = None  # stop: what the supervisor reported
    after_last_write_s: float | None = None  # stop: event - last log write - budget
    event_phase: str | None = None
    outcome: str | None = None
    seeds: SeedsVerdict | None = None
    load1: float = 0.0
    # kill/oom: how the death was noticed (remote follower ended) and confirmed (calls after)
    follower_end_s: float | None = None  # follower's end - fault (kill) or exit (oom)
    confirm_s: float | None = None  # event - follower's end
    confirm_calls: list[str] = field(default_factory=list)  # "name duration" in order


class ExitWatcher:
    """Records the monotonic time a (non-child) process exits, with a pidfd and a thread."""

    def __init__(self) -> None:
        self.exit_at: float | None = None
        self.error = ""
        self._stop = threading.Event()

    def start(self, pid: int) -> None:
        try:
            fd = os.pidfd_open(pid)
        except OSError as exc:  # already gone (or no pidfd): the caller falls back to mtime
            self.error = f"pidfd_open({pid}): {exc}"
            return
        threading.Thread(target=self._wait, args=(fd,), daemon=True).start()

    def _wait(self, fd: int) -> None:
        try:
            poller = select.poll()
            poller.register(fd, select.POLLIN)
            while not self._stop.is_set():
                if poller.poll(100):
                    self.exit_at = time.monotonic()
                    return
        finally:
            os.close(fd)

    def close(self) -> None:
        self._stop.set()


@dataclass
class LogTimeline:
    """Sizes of one growing log over time: polled every ``period`` seconds, each new size
    stamped with the file's mtime (the kernel's time of the write that made it, so a late
    poll does not make the write look late)."""

    path: Path
    samples: list[tuple[float, int]] = field(default_factory=list)

    async def sample(self, period: float = 0.01) -> None:
        last = -1
        while True:
            with contextlib.suppress(OSError):
                st = self.path.stat()
                if st.st_size != last:
                    self.samples.append((mono_of_wall(st.st_mtime_ns), st.st_size))
                    last = st.st_size
            await anyio.sleep(period)

    def written_by(self, size: int) -> float | None:
        """When the log first held ``size`` bytes (the write time of the first sample that
        shows them: a lower bound on how late a reader that got them then is)."""
        return next((at for at, s in self.samples if s >= size), None)

    def size_at(self, t: float, final_size: int, final_write: float) -> int:
        """The log's size at monotonic time ``t``: exact from the last write on."""
        if t >= final_write:
            return final_size
        size = 0
        for at, s in self.samples:
            if at > t:
                break
            size = s
        return size


def mono_of_wall(wall_ns: int) -> float:
    """A CLOCK_REALTIME timestamp (a file's mtime) on the monotonic clock."""
    return wall_ns / 1e9 - (time.time() - time.monotonic())


def tail_1(data: bytes) -> str:
    """What ``tail -1`` prints for a file holding ``data`` (the last \\n-line, \\r kept)."""
    text = data.decode("utf-8", errors="replace")
    if text.endswith("\n"):
        text = text[:-1]
    return text.rsplit("\n", 1)[-1]


def seeds_replay(
    data: bytes, timeline: LogTimeline, final_write: float, start: float, fault_at: float,
) -> SeedsVerdict:
    """Replay the seeds' loop, started at ``start``, against the recorded log ``data``."""
    line = ""
    for poll in range(1, SEEDS_POLLS + 1):
        t = start + poll * SEEDS_POLL_S
        line = tail_1(data[: timeline.size_at(t, len(data), final_write)])
        if SEEDS_READY.search(line):
            return SeedsVerdict("ready", poll, t - fault_at, line)
        if SEEDS_ERROR.search(line):
            return SeedsVerdict("error", poll, t - fault_at, line)
    return SeedsVerdict("never", None, None, line)


# --- a transport that times its calls ---------------------------------------------------


def _script_names() -> dict[str, str]:
    """launcher.host.run's shell scripts (its ``_UPPER`` string constants) by text, to name
    the calls a trace shows; whatever version of remote.py is loaded."""
    return {
        value: name.strip("_").lower()
        for name, value in vars(remote).items()
        if name.startswith("_") and name.strip("_").isupper() and isinstance(value, str)
        and "\n" in value
    }


SCRIPT_NAMES = _script_names()


def describe(argv: Sequence[str]) -> str:
    if len(argv) >= 3 and argv[0] == "sh" and argv[1] == "-c":
        return SCRIPT_NAMES.get(argv[2], "sh")
    return Path(argv[0]).name if argv else "?"


@dataclass
class Call:
    """One transport call: what, when it started, when it returned (or its stream ended)."""

    kind: str
    what: str
    start: float
    end: float | None = None
    chunks: list[tuple[float, int]] = field(default_factory=list)  # stream: (arrival, bytes so far)


class TimedTransport:
    """Delegates to a real transport and records when each call starts and ends.

    Only timestamps are added, so what is measured is the real transport's behaviour."""

    def __init__(self, inner: Transport) -> None:
        self.inner = inner
        self.calls: list[Call] = []

    @property
    def host_name(self) -> str:
        return self.inner.host_name

    async def run(
        self,
        argv: Sequence[str],
        *,
        stdin: bytes | None = None,
        env: Mapping[str, str] | None = None,
        timeout: float | None = 30.0,
        check: bool = False,
    ) -> CommandResult:
        call = Call("run", describe(argv), time.monotonic())
        self.calls.append(call)
        try:
            return await self.inner.run(argv, stdin=stdin, env=env, timeout=timeout, check=check)
        finally:
            call.end = time.monotonic()

    async def stream(
        self, argv: Sequence[str], *, env: Mapping[str, str] | None = None,
    ) -> AsyncGenerator[bytes, None]:
        call = Call("stream", describe(argv), time.monotonic())
        self.calls.append(call)
        inner = self.inner.stream(argv, env=env)
        received = 0
        try:
            async for chunk in inner:
                received += len(chunk)
                call.chunks.append((time.monotonic(), received))
                yield chunk
            call.end = time.monotonic()  # the command ended by itself
        finally:
            aclose = getattr(inner, "aclose", None)
            if aclose is not None:
                with anyio.CancelScope(shield=True):
                    await aclose()

    def forward_port(self, remote_port: int) -> AbstractAsyncContextManager[int]:
        return self.inner.forward_port(remote_port)

    async def aclose(self) -> None:
        await self.inner.aclose()

    def path_after(self, fault_at: float, event_at: float) -> tuple[float, list[Call]] | None:
        """The log follower's end after ``fault_at`` and the calls that ran from then to the
        event: how the death was noticed and confirmed."""
        ends = [c.end for c in self.calls  # the only streams are log followers
                if c.kind == "stream" and c.end is not None and fault_at <= c.end <= event_at]
        if not ends:
            return None
        tail_end = min(ends)
        between = [c for c in self.calls
                   if c.kind == "run" and tail_end <= c.start <= event_at and c.end is not None]
        return tail_end, between


# --- the two sites -----------------------------------------------------------------------


def fault_profile(path: Path, fault: str) -> dict[str, str]:
    """The server env for ``fault``: a slow capture for the mid-load faults, nothing for OOM."""
    if fault == "oom":
        return {}
    path.write_text(json.dumps([{"kind": "slow", "phase": "cuda_graph", "factor": CAPTURE_SLOW}]))
    return {"SGLANG_SIM_FAULTS": str(path)}


POLICY: dict[str, Any] = {
    "probe_interval": "300ms",
    "gpu_free_timeout": "15s",
    "start_deadline": "90s",
    "restart_backoff_initial": "200ms",
    "restart_backoff_max": "1s",
    "max_attempts": 4,
    # init covers the interpreter's start before the first line; the rest get the small budget.
    "stall": {
        "init": "10s",
        "weights": f"{STALL_BUDGET_S}s",
        "kv_cache": f"{STALL_BUDGET_S}s",
        "cuda_graph": f"{STALL_BUDGET_S}s",
        "warmup": f"{STALL_BUDGET_S}s",
    },
}


class Bench:
    """One transport's sim host, config factory, transport and run dir."""

    name: str
    run_dir: Path
    transport: TimedTransport

    def config(self, fault: str) -> Config:
        raise NotImplementedError

    async def aclose(self) -> None:
        await self.transport.aclose()


class LocalBench(Bench):
    def __init__(self, root: Path) -> None:
        self.name = "local"
        self.sim = SimSetup.create(root, gpu_count=1, time_scale=TIME_SCALE)
        self.run_dir = self.sim.run_dir
        self.root = root
        cfg = self.config("oom")
        host = cfg.servers[0].host
        self.transport = TimedTransport(LocalTransport(host, env=cfg.host(host).env))

    def config(self, fault: str) -> Config:
        mfs, bs = OOM_PARAMS if fault == "oom" else OK_PARAMS
        data = self.sim.data(
            model="tiny-1b-sim",
            policy={k: v for k, v in POLICY.items() if k != "stall"},
            stall=POLICY["stall"],
            # A port picked per trial: one picked once can be taken by anyone meanwhile.
            server={"env": fault_profile(self.root / f"faults-{fault}.json", fault),
                    "port": free_port()},
            mem_fraction_static=mfs,
            cuda_graph_max_bs=bs,
        )
        return config_from_dict(data, environ={})


class SshBench(Bench):
    def __init__(self, root: Path) -> None:
        self.name = "ssh"
        self.root = root
        self.sshd = Sshd(root / "sshd")
        self.sshd.start()
        try:
            self.site = Site.create(root, "gpu1", self.sshd, gpu_count=1, time_scale=TIME_SCALE)
            self.run_dir = self.site.run_dir
            self.transport = TimedTransport(
                SSHTransport.from_host_config(self.config("oom").host("gpu1")))
        except BaseException:
            self.sshd.stop()
            raise

    def config(self, fault: str) -> Config:
        env = fault_profile(self.root / f"faults-{fault}.json", fault)
        mfs, bs = OOM_PARAMS if fault == "oom" else OK_PARAMS
        entry = server_entry(
            SERVER, self.site, model_path=str(model_dir("tiny-1b-sim")), port=free_port(),
            env=env, mem_fraction_static=mfs, cuda_graph_max_bs=bs,
        )
        return ssh_config(self.root, [self.site.host_entry()], [entry], policy=POLICY)

    async def aclose(self) -> None:
        await super().aclose()
        self.sshd.stop()


# --- one trial ---------------------------------------------------------------------------


def _first(rec: Recorder, name: str, **match: Any) -> Recorded | None:
    for e in rec.events:
        if e.name == name and all(e.data.get(k) == v for k, v in match.items()):
            return e
    return None


async def _wait_event(
    rec: Recorder, name: str, *, other: str | None = None, timeout: float = TRIAL_TIMEOUT_S,
    **match: Any,
) -> Recorded:
    """The first ``name`` event (or ``other`` event) whose data has ``match``, waiting up to
    ``timeout`` for it. The time that counts is the one the hook recorded, not this wake-up."""
    names = {name} if other is None else {name, other}
    arrived = anyio.Event()

    def hit(event: Recorded) -> bool:
        return event.name in names and all(event.data.get(k) == v for k, v in match.items())

    def check(event: Recorded) -> None:
        if hit(event):
            arrived.set()

    rec.on.append(check)
    try:
        with anyio.fail_after(timeout):
            if not any(hit(e) for e in rec.events):
                await arrived.wait()
    finally:
        rec.on.remove(check)
    return next(e for e in rec.events if hit(e))


class Invalid(Exception):
    """The trial did not measure what it is for (reported with the reason, not counted)."""


async def run_trial(bench: Bench, fault: str, index: int, rng: random.Random) -> Trial:
    trial = Trial(bench.name, fault, index, load1=os.getloadavg()[0])
    began = time.monotonic()
    bench.transport.calls.clear()
    config = bench.config(fault)
    server = config.servers[0]
    rec = Recorder()
    sup = ServerSupervisor(
        config, server, bench.transport, sglang_version=SIM_VERSION, hooks=[rec],
    )
    watcher = ExitWatcher()
    target = TARGET_EVENT[fault]

    def on_event(event: Recorded) -> None:
        # Runs inside the supervisor's hook: only quick, non-blocking calls.
        if event.name == "phase.entered" and event.data.get("phase") == "init":
            pid = sup.machine.pid
            if pid is not None:
                watcher.start(pid)
        elif event.name == "attempt.failed":
            sup.request_stop(kill=True)  # no relaunch: one attempt per trial

    rec.on.append(on_event)
    timeline: LogTimeline | None = None
    pid: int | None = None
    fault_at: float | None = None
    try:
        with anyio.move_on_after(TRIAL_TIMEOUT_S) as scope:
            async with anyio.create_task_group() as tg:

                async def supervise() -> None:
                    await sup.run(adopt=False)
                    tg.cancel_scope.cancel()

                tg.start_soon(supervise)
                started = await _wait_event(rec, "attempt.started")
                trial.attempt = int(started.data["attempt"])
                timeline = LogTimeline(bench.run_dir / SERVER / str(trial.attempt) / "log")
                tg.start_soon(timeline.sample)
                if fault in ("kill", "stop"):
                    graph = await _wait_event(rec, "phase.entered", phase="cuda_graph")
                    await anyio.sleep(rng.uniform(*INJECT_WINDOW_S))
                    pid = sup.machine.pid
                    phase = sup.machine.phase
                    trial.inject_phase = phase.value if phase else sup.machine.state.value
                    early = _first(rec, "attempt.failed")
                    if early is not None:
                        raise Invalid(f"failed before the injection: {early.data.get('outcome')}"
                                      f" in {early.data.get('phase')} (CPU starvation)")
                    if phase is not Phase.CUDA_GRAPH or pid is None:
                        raise Invalid(f"capture over before the injection ({trial.inject_phase})")
                    if fault == "kill":
                        os.kill(pid, signal.SIGKILL)
                    else:
                        os.killpg(pid, signal.SIGSTOP)
                    fault_at = time.monotonic()
                    trial.inject_after_phase_s = fault_at - graph.t
                # The first failure report, whatever it is: a different one is not ours.
                event = await _wait_event(rec, target, other="attempt.failed")
                failed = _first(rec, "attempt.failed")
                trial.outcome = failed.data.get("outcome") if failed else None
                trial.event_phase = event.data.get("phase")
                if event.name != target or (fault == "oom" and not str(
                        trial.outcome).startswith("oom")):
                    raise Invalid(f"reported {trial.outcome} in {trial.event_phase} first")
                if fault == "stop":
                    assert pid is not None and fault_at is not None
                    # The group is frozen: its log's mtime is the last write. Kill it now so the
                    # supervisor's clean-up need not wait out SIGTERM's grace on stopped processes.
                    last_write = mono_of_wall(timeline.path.stat().st_mtime_ns)
                    with contextlib.suppress(ProcessLookupError):
                        os.killpg(pid, signal.SIGKILL)
                    trial.silent_s = float(event.data["silent_s"])
                    trial.after_last_write_s = event.t - last_write - STALL_BUDGET_S
                    trial.latency_s = event.t - fault_at - STALL_BUDGET_S
                elif fault == "kill":
                    assert fault_at is not None
                    trial.latency_s = event.t - fault_at
                    if watcher.exit_at is not None:
                        trial.exit_after_fault_s = watcher.exit_at - fault_at
                else:
                    # The server's last act before exiting is its last log line: the event's
                    # distance from that write bounds the latency from above.
                    last_write = mono_of_wall(timeline.path.stat().st_mtime_ns)
                    trial.after_last_write_oom_s = event.t - last_write
                    if watcher.exit_at is not None:
                        fault_at, trial.exit_source = watcher.exit_at, "pidfd"
                    else:
                        fault_at, trial.exit_source = last_write, "log mtime"
                    trial.latency_s = event.t - fault_at
                trial.event_after_fault_s = event.t - fault_at
                if fault in ("kill", "oom"):
                    path = bench.transport.path_after(fault_at, event.t)
                    if path is not None:
                        follower_end, calls = path
                        trial.follower_end_s = follower_end - fault_at
                        trial.confirm_s = event.t - follower_end
                        trial.confirm_calls = [
                            f"{c.what} {(c.end or c.start) - c.start:.3f}" for c in calls
                        ]
                trial.ok = True
                # Let the supervisor finish its clean-up and stop (the trial is measured).
                with contextlib.suppress(TimeoutError):
                    await _wait_event(rec, "server.stopped", timeout=20)
                tg.cancel_scope.cancel()
        if scope.cancelled_caught and not trial.ok:
            trial.error = f"timed out after {TRIAL_TIMEOUT_S:.0f}s; events: {rec.names()}"
        elif not trial.ok:
            trial.error = (f"supervision ended early in state {sup.state.value} "
                           f"({sup.machine.reason}); events: {rec.names()}")
    except Invalid as exc:
        trial.error = f"invalid: {exc}"
    except Exception as exc:  # a failed trial is reported, never fatal to the run
        trial.error = f"{describe_error(exc)}; events: {rec.names()}"
    finally:
        watcher.close()
        trial.cleanup_errors = [str(e.data.get("error", ""))[:90] + " ..."
                                for e in rec.events if e.name == "process.stop_failed"]
        await anyio.to_thread.run_sync(kill_leftovers, [bench.run_dir])
    if timeline is not None:
        delivery(trial, bench.transport, timeline)
    if trial.ok and timeline is not None and fault_at is not None:
        data = timeline.path.read_bytes()
        final_write = mono_of_wall(timeline.path.stat().st_mtime_ns)
        start = _first(rec, "attempt.started")
        assert start is not None
        trial.seeds = seeds_replay(data, timeline, final_write, start.t, fault_at)
    trial.wall_s = time.monotonic() - began
    return trial


def delivery(trial: Trial, transport: TimedTransport, timeline: LogTimeline) -> None:
    """Fill in how promptly the first follower (from offset 0) delivered the log."""
    streams = [c for c in transport.calls if c.kind == "stream" and c.chunks]
    if not streams:
        return
    with contextlib.suppress(OSError):
        size = timeline.path.stat().st_size
        for arrival, upto in streams[0].chunks:
            written = timeline.written_by(upto)
            if upto <= size and written is not None:  # past the size: the stream's trailer
                trial.delivery_lags.append(arrival - written)
    if trial.delivery_lags:
        trial.first_chunk_lag_s = trial.delivery_lags[0]
        if not trial.ok and trial.error.startswith("invalid: capture over"):
            trial.error += f"; worst log delivery lag {max(trial.delivery_lags):.2f} s"


def describe_error(exc: BaseException) -> str:
    """``Type: message``, looking inside exception groups."""
    if isinstance(exc, BaseExceptionGroup):
        return "; ".join(describe_error(e) for e in exc.exceptions)
    if isinstance(exc, TimeoutError):
        return "TimeoutError: an awaited event did not come in time"
    return f"{type(exc).__name__}: {exc}"


def reap(work: Path) -> None:
    """SIGKILL what this run started that may outlive it: every server recorded under the
    run dirs (their sessions), and any process whose command line names the work directory
    (a launch script that an interrupted SSH channel left running on the "host")."""
    kill_leftovers(sorted(work.glob("*/run")) + sorted(work.glob("*/*/runs")))
    me = os.getpid()
    needle = str(work).encode()
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit() or int(entry.name) == me:
            continue
        with contextlib.suppress(OSError):
            if needle in (entry / "cmdline").read_bytes():
                os.kill(int(entry.name), signal.SIGKILL)


# --- statistics and tables ---------------------------------------------------------------


def percentile(values: list[float], q: float) -> float:
    """Linear interpolation between closest ranks (numpy's default)."""
    ordered = sorted(values)
    pos = (len(ordered) - 1) * q
    lo, hi = math.floor(pos), math.ceil(pos)
    return ordered[lo] + (ordered[hi] - ordered[lo]) * (pos - lo)


def stats(values: list[float]) -> tuple[float, float, float, float] | None:
    if not values:
        return None
    return min(values), percentile(values, 0.5), percentile(values, 0.95), max(values)


def fmt(x: float | None) -> str:
    return "-" if x is None else f"{x:.3f}"


def table(headers: list[str], rows: list[list[str]]) -> str:
    widths = [max(len(h), *(len(r[i]) for r in rows)) for i, h in enumerate(headers)]
    line = "| " + " | ".join(h.ljust(w) for h, w in zip(headers, widths, strict=True)) + " |"
    rule = "|" + "|".join("-" * (w + 2) for w in widths) + "|"
    body = [
        "| " + " | ".join(c.ljust(w) for c, w in zip(r, widths, strict=True)) + " |"
        for r in rows
    ]
    return "\n".join([line, rule, *body])


def groups(trials: list[Trial]) -> Iterator[tuple[str, str, list[Trial]]]:
    for fault in FAULTS:
        for transport in ("local", "ssh"):
            chosen = [t for t in trials if t.fault == fault and t.transport == transport]
            if chosen:
                yield fault, transport, chosen


def report(trials: list[Trial], header: dict[str, Any]) -> str:
    out: list[str] = ["# Detection latency", ""]
    out += [f"- {k}: {v}" for k, v in header.items()]
    out += ["", "## launcher (seconds)", ""]
    rows = []
    for fault, transport, chosen in groups(trials):
        lat = [t.latency_s for t in chosen if t.ok and t.latency_s is not None]
        s = stats(lat)
        rows.append([
            fault, transport, f"{len(lat)}/{len(chosen)}",
            *(fmt(v) for v in (s or (None, None, None, None))),
        ])
    out.append(table(["fault", "transport", "n ok", "min", "p50", "p95", "max"], rows))
    out += ["", "Measured as:"]
    out += [f"- {f}: {FAULT_TITLE[f]}" for f in FAULTS]

    out += ["", "## details (seconds)", ""]
    rows = []
    for fault, transport, chosen in groups(trials):
        ok = [t for t in chosen if t.ok]
        if fault == "kill":
            gone = stats([t.exit_after_fault_s for t in ok if t.exit_after_fault_s is not None])
            rows.append([fault, transport, "server gone after kill (pidfd), p50/max",
                         f"{fmt(gone[1])} / {fmt(gone[3])}" if gone else "-"])
        if fault == "stop":
            lw = stats([t.after_last_write_s for t in ok if t.after_last_write_s is not None])
            rows.append([fault, transport, "event - last log write - budget, p50/p95/max",
                         f"{fmt(lw[1])} / {fmt(lw[2])} / {fmt(lw[3])}" if lw else "-"])
            sil = stats([t.silent_s for t in ok if t.silent_s is not None])
            rows.append([fault, transport, "silent_s reported, min/max",
                         f"{fmt(sil[0])} / {fmt(sil[3])}" if sil else "-"])
        if fault == "oom":
            lw = stats([t.after_last_write_oom_s for t in ok
                        if t.after_last_write_oom_s is not None])
            rows.append([fault, transport, "event - last log write (upper bound), p50/p95/max",
                         f"{fmt(lw[1])} / {fmt(lw[2])} / {fmt(lw[3])}" if lw else "-"])
            src = Counter(t.exit_source for t in ok)
            rows.append([fault, transport, "exit time source",
                         ", ".join(f"{k} x{v}" for k, v in sorted(src.items()))])
        if fault in ("kill", "stop"):
            inj = stats([t.inject_after_phase_s for t in ok if t.inject_after_phase_s is not None])
            phases = Counter(t.inject_phase for t in ok)
            rows.append([fault, transport, "injected s after capture seen, min/max; phase",
                         (f"{fmt(inj[0])} / {fmt(inj[3])}; " if inj else "- ; ")
                         + ", ".join(f"{k} x{v}" for k, v in phases.items())])
        if fault in ("kill", "oom"):
            rows += path_rows(fault, transport, ok)
        wall = stats([t.wall_s for t in chosen])
        rows.append([fault, transport, "trial wall time (set-up + clean-up), p50/max",
                     f"{wall[1]:.1f} / {wall[3]:.1f}" if wall else "-"])
        errors = Counter(e for t in chosen for e in t.cleanup_errors)
        for error, n in errors.items():
            rows.append([fault, transport, f"clean-up error process.stop_failed (x{n})", error])
        outcomes = Counter(f"{t.event_phase}/{t.outcome}" for t in ok)
        rows.append([fault, transport, "event phase/outcome",
                     ", ".join(f"{k} x{v}" for k, v in outcomes.items())])
        failed = Counter(t.error[:160] for t in chosen if not t.ok)
        for error, n in failed.items():
            rows.append([fault, transport, f"trials without a measurement (x{n})", error])
    out.append(table(["fault", "transport", "what", "value"], rows))

    out += ["", "## log delivery by the follower (seconds, all trials of a transport)", ""]
    rows = []
    for transport in ("local", "ssh"):
        chosen = [t for t in trials if t.transport == transport]
        if not chosen:
            continue
        first = stats([t.first_chunk_lag_s for t in chosen if t.first_chunk_lag_s is not None])
        lags = [x for t in chosen for x in t.delivery_lags]
        lag = stats(lags)
        worst = stats([max(t.delivery_lags) for t in chosen if t.delivery_lags])
        rows.append([transport, "first chunk (the backlog at start) lag, p50/p95/max",
                     f"{fmt(first[1])} / {fmt(first[2])} / {fmt(first[3])}" if first else "-"])
        rows.append([transport, f"chunk arrival - write, p50/p95/max over {len(lags)} chunks",
                     f"{fmt(lag[1])} / {fmt(lag[2])} / {fmt(lag[3])}" if lag else "-"])
        rows.append([transport, "worst chunk per trial, p50/p95/max",
                     f"{fmt(worst[1])} / {fmt(worst[2])} / {fmt(worst[3])}" if worst else "-"])
    out.append(table(["transport", "what", "value"], rows))

    out += ["", "## baseline: the seeds' loop (tail -1 every 25 s, 16 polls, replayed)", ""]
    rows = []
    for fault, transport, chosen in groups(trials):
        verdicts = [t.seeds for t in chosen if t.seeds is not None]
        counts = Counter(v.outcome for v in verdicts)
        noticed = [v.latency_s for v in verdicts if v.outcome == "error" and v.latency_s]
        s = stats(noticed)
        lines = Counter(_shorten(v.last_line) for v in verdicts)
        rows.append([
            fault, transport, str(len(verdicts)), str(counts.get("error", 0)),
            str(counts.get("ready", 0)), str(counts.get("never", 0)),
            f"{fmt(s[1])} / {fmt(s[3])}" if s else "never (gave up at 400 s)",
            "; ".join(f"{line!r} x{n}" for line, n in lines.most_common(1)),
        ])
    out.append(table(
        ["fault", "transport", "n", "ERR", "READY", "never", "noticed p50/max s",
         "most common tail -1 at the last poll"],
        rows,
    ))

    out += ["", "## targets", ""]
    out += targets(trials)
    return "\n".join(out)


def path_rows(fault: str, transport: str, ok: list[Trial]) -> list[list[str]]:
    """Where a death's detection time goes: the remote follower noticing, then the calls
    that confirm it (probe, exit status, the log's last bytes) before the event."""
    since = "kill" if fault == "kill" else "exit"
    rows = []
    end = stats([t.follower_end_s for t in ok if t.follower_end_s is not None])
    rows.append([fault, transport, f"log follower (stream) ended after {since}, p50/p95/max",
                 f"{fmt(end[1])} / {fmt(end[2])} / {fmt(end[3])}" if end else "-"])
    conf = stats([t.confirm_s for t in ok if t.confirm_s is not None])
    rows.append([fault, transport, "follower end -> event, p50/p95/max",
                 f"{fmt(conf[1])} / {fmt(conf[2])} / {fmt(conf[3])}" if conf else "-"])
    seqs = Counter(" > ".join(c.split()[0] for c in t.confirm_calls) for t in ok)
    durations: dict[str, list[float]] = {}
    for t in ok:
        for c in t.confirm_calls:
            name, secs = c.split()
            durations.setdefault(name, []).append(float(secs))
    if seqs:
        seq, n = seqs.most_common(1)[0]
        rows.append([fault, transport, "calls in between (most common sequence)",
                     f"{seq or '(none)'} x{n}/{len(ok)}"])
    if durations:
        rows.append([fault, transport, "their durations, p50/max",
                     ", ".join(f"{k} {percentile(v, 0.5):.3f}/{max(v):.3f}"
                               for k, v in durations.items())])
    return rows


def _shorten(line: str, width: int = 70) -> str:
    """The last \\r-frame of a line (what a terminal shows), pids masked, cut to ``width``."""
    shown = line.rsplit("\r", 1)[-1]
    shown = re.sub(r"pid=\d+", "pid=N", re.sub(r"parent_pid=\d+", "parent_pid=N", shown))
    shown = re.sub(r"^\[[0-9-]+ [0-9:.]+\] ", "", shown)  # the timestamp
    return shown if len(shown) <= width else shown[: width - 3] + "..."


def targets(trials: list[Trial]) -> list[str]:
    lines = []
    for transport in ("ssh", "local"):
        death = [t.latency_s for t in trials
                 if t.fault == "kill" and t.transport == transport and t.ok and t.latency_s]
        if death:
            p95 = percentile(death, 0.95)
            verdict = "MET" if p95 <= DEATH_P95_SSH_TARGET_S else "MISSED"
            scope = "target" if transport == "ssh" else "for reference"
            lines.append(f"- death p95 over {transport} {p95:.3f} s <= "
                         f"{DEATH_P95_SSH_TARGET_S} s ({scope}): {verdict}")
    for transport in ("ssh", "local"):
        stall = [t.latency_s for t in trials
                 if t.fault == "stop" and t.transport == transport and t.ok
                 and t.latency_s is not None]
        if stall:
            worst, p95 = max(stall), percentile(stall, 0.95)
            verdict = "MET" if worst <= STALL_OVER_BUDGET_TARGET_S else "MISSED"
            lines.append(
                f"- stall over {transport}: detection <= budget + {STALL_OVER_BUDGET_TARGET_S} s "
                f"on every trial (max over budget {worst:.3f} s, p95 {p95:.3f} s): {verdict}")
    missing = [t for t in trials if not t.ok]
    if missing:
        lines.append(f"- {len(missing)} trial(s) produced no measurement (see details): MISSED")
    return lines


# --- main --------------------------------------------------------------------------------


def configure_logging(path: Path) -> Any:
    """launcher's structlog events go to a JSON-lines file, not the tables."""
    handle = path.open("a")
    structlog.configure(
        processors=[
            structlog.processors.add_log_level,
            structlog.processors.TimeStamper(fmt="iso"),
            structlog.processors.JSONRenderer(),
        ],
        logger_factory=structlog.WriteLoggerFactory(file=handle),
        cache_logger_on_first_use=False,
    )
    logging.getLogger("asyncssh").setLevel(logging.WARNING)
    return handle


def code_version() -> str:
    """The commit and the uncommitted launcher files measured (the tree changes under us)."""
    def git(*args: str) -> str:
        result = subprocess.run(["git", "-C", str(REPO), *args], capture_output=True,
                                text=True, timeout=30, check=False)
        return result.stdout.rstrip("\n")  # keep porcelain's leading status columns

    dirty = [line[3:] for line in git("status", "--porcelain", "launcher").splitlines()]
    digest = hashlib.sha1()
    for path in sorted(REPO.glob("launcher/**/*.py")):
        digest.update(path.read_bytes())
    return (f"HEAD {git('rev-parse', '--short', 'HEAD').strip()}"
            + (f" + uncommitted {', '.join(dirty)}" if dirty else "")
            + f" (sha1 of launcher/**/*.py {digest.hexdigest()[:12]})")


def shell_start(n: int = 3) -> str:
    """p50 seconds of the login shell running ``true`` as sshd starts it (bash then reads
    ~/.bashrc because SSH_CLIENT is set) and plainly: every SSH command pays the first."""
    shell = pwd.getpwuid(os.getuid()).pw_shell or "/bin/sh"
    found = []
    for extra in ({"SSH_CLIENT": "127.0.0.1 40000 22"}, {}):
        env = {k: v for k, v in os.environ.items() if k not in ("SSH_CLIENT", "SSH2_CLIENT")}
        env.update(SHLVL="0", **extra)
        times = []
        for _ in range(n):
            t0 = time.monotonic()
            subprocess.run([shell, "-c", "true"], env=env, stdin=subprocess.DEVNULL,
                           capture_output=True, timeout=60, check=False)
            times.append(time.monotonic() - t0)
        found.append(percentile(times, 0.5))
    return f"{shell} -c true: {found[0]:.3f} as sshd runs it (rc files), {found[1]:.3f} plain"


async def round_trip(bench: Bench, n: int = 5) -> str:
    """p50/max seconds of ``true`` run through the transport: the cost of one remote call."""
    times = []
    for _ in range(n):
        t0 = time.monotonic()
        await bench.transport.run(["true"], timeout=30)
        times.append(time.monotonic() - t0)
    return f"{percentile(times, 0.5):.3f}/{max(times):.3f}"


async def run_all(
    args: argparse.Namespace,
    benches: list[Bench],
    trials: list[Trial],
    round_trips: dict[str, list[str]],
) -> bool:
    """Interleave transports and faults (trial i of every kind before trial i+1), so that
    background load hits every kind alike. False when the time budget cut the run short."""
    rng = random.Random(args.seed)
    for bench in benches:
        round_trips[bench.name] = [await round_trip(bench) + " before"]
    start = time.monotonic()
    faults = [f for f in FAULTS if f in args.faults]
    for i in range(args.trials):
        for fault in faults:
            for bench in benches:
                if time.monotonic() - start > args.max_seconds:
                    return False
                t0 = time.monotonic()
                trial = await run_trial(bench, fault, i, rng)
                trials.append(trial)
                summary = (f"{trial.latency_s:.3f}s" if trial.ok and trial.latency_s is not None
                           else f"FAILED {trial.error[:200]}")
                seeds = trial.seeds.outcome if trial.seeds else "-"
                progress(f"[{time.monotonic() - start:6.1f}s] {bench.name:5} {fault:4} #{i:<2} "
                         f"{summary} (seeds: {seeds}, load {trial.load1:.2f}, "
                         f"trial {time.monotonic() - t0:.1f}s"
                         + (f", stop_failed x{len(trial.cleanup_errors)}"
                            if trial.cleanup_errors else "") + ")")
    for bench in benches:
        round_trips[bench.name].append(await round_trip(bench) + " after")
    return True


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--trials", type=int, default=20)
    parser.add_argument("--transport", choices=["local", "ssh", "both"], default="both")
    parser.add_argument("--faults", default=",".join(FAULTS),
                        help="comma-separated subset of kill,stop,oom")
    parser.add_argument("--seed", type=int, default=6, help="seed of the injection times")
    parser.add_argument("--max-seconds", type=float, default=1200.0,
                        help="start no trial after this many seconds (the run stays bounded)")
    parser.add_argument("--json", type=Path, help="also write every trial as JSON here")
    parser.add_argument("--keep", action="store_true", help="keep the work directory")
    args = parser.parse_args(argv)
    args.faults = [f.strip() for f in args.faults.split(",") if f.strip()]
    if unknown := set(args.faults) - set(FAULTS):
        parser.error(f"unknown fault(s): {sorted(unknown)}")

    work = Path(tempfile.mkdtemp(prefix="bench-detect-"))
    log_handle = configure_logging(work / "launcher.jsonl")
    benches: list[Bench] = []
    trials: list[Trial] = []
    round_trips: dict[str, list[str]] = {}

    def on_term(signum: int, frame: FrameType | None) -> None:
        raise KeyboardInterrupt  # unwinds into the clean-up below

    signal.signal(signal.SIGTERM, on_term)
    load_before = os.getloadavg()
    code = code_version()
    shell_before = shell_start()
    started = time.monotonic()
    complete = False
    try:
        if args.transport in ("local", "both"):
            benches.append(LocalBench(work / "local"))
        if args.transport in ("ssh", "both"):
            benches.append(SshBench(work / "ssh"))

        async def go() -> bool:
            try:
                return await run_all(args, benches, trials, round_trips)
            finally:
                with anyio.CancelScope(shield=True):
                    for bench in benches:
                        await bench.aclose()

        complete = anyio.run(go)
    except KeyboardInterrupt:
        progress("interrupted: cleaning up")
    finally:
        for bench in benches:
            if isinstance(bench, SshBench):
                bench.sshd.stop()
        reap(work)
        log_handle.close()
        time.sleep(0.5)  # anything a cut SSH channel left running has started by now
        reap(work)
        if not args.keep:
            shutil.rmtree(work, ignore_errors=True)
    elapsed = time.monotonic() - started
    header = {
        "command": "scripts/bench/bench_detect.py "
        + " ".join(sys.argv[1:] if argv is None else argv),
        "date (UTC)": time.strftime("%Y-%m-%d %H:%M:%S", time.gmtime()),
        "launcher code": code,
        "machine": f"{platform.machine()}, nproc={os.cpu_count()}, "
                   f"python {platform.python_version()}",
        "load average before (1/5/15 min)": "/".join(f"{x:.2f}" for x in load_before),
        "load average after": "/".join(f"{x:.2f}" for x in os.getloadavg()),
        "1-min load at trial starts, min/max": (
            f"{min(t.load1 for t in trials):.2f}/{max(t.load1 for t in trials):.2f}"
            if trials else "-"),
        "sim": f"tiny-1b-sim, time_scale {TIME_SCALE}, capture slowed x{CAPTURE_SLOW:g} "
               f"for kill/stop, injection {INJECT_WINDOW_S[0]}-{INJECT_WINDOW_S[1]} s after "
               f"the capture phase is seen; stall budget {STALL_BUDGET_S:g} s",
        "one `true` through the transport, p50/max s": "; ".join(
            f"{k} {', '.join(v)}" for k, v in round_trips.items()) or "-",
        "login shell start, p50 s": f"before: {shell_before}; after: {shell_start()}",
        "trials per fault and transport": args.trials,
        "wall time": f"{elapsed:.0f} s" + ("" if complete else " (cut short)"),
    }
    print(report(trials, header))
    if args.json:
        args.json.write_text(json.dumps(
            {"header": header, "trials": [asdict(t) for t in trials]}, indent=1))
    if args.keep:
        progress(f"work directory kept: {work}")
    return 0 if complete and trials and all(t.ok for t in trials) else 1


if __name__ == "__main__":
    sys.exit(main())
