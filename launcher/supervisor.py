"""Supervision of one server: the I/O around the pure state machine (launcher.lifecycle).

Resource handling: every task of an attempt (log follower, stall watch, probes) lives in the
attempt's own task group and is cancelled with it; killing a server is shielded from
cancellation. Nothing here kills a server unless the machine says so or a stop with kill
was requested: cancelling ``run`` leaves the server running (detached on its host).

Error handling: transport outages while following are retried forever (reported as
``host.unreachable``); everything the server does wrong arrives as an event and goes
through the state machine; only bugs escape.

Unreachable is not unhealthy: a probe or follow that fails because the host cannot be reached
counts toward nothing. The server is marked unreachable (``host.unreachable`` events, the
snapshot's ``unreachable_s``) until a command reaches the host again (``host.reachable`` with
the time it was unreachable); following resumes at the byte offset it had reached. A stall is
only declared once the host confirms it: the log's own modification time, read on the host,
must be older than the budget, so silence caused by our side of the network (or our CPU)
never kills a server.
"""

from __future__ import annotations

import itertools
import math
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import anyio
import httpx
import structlog
from anyio.abc import TaskGroup
from anyio.streams.memory import MemoryObjectReceiveStream, MemoryObjectSendStream

from launcher import remote
from launcher.backoff import RestartBackoff
from launcher.classify import classify, diagnose
from launcher.command import ServerCommand, server_command
from launcher.config import Config, ServerConfig
from launcher.errors import HostUnreachable, LauncherError, PreflightError
from launcher.gpus import check_gpus
from launcher.lifecycle import (
    Action,
    Adopted,
    BackoffElapsed,
    CleanedUp,
    DeadlineExceeded,
    Emit,
    Event,
    Exited,
    FatalLineSeen,
    GpusFree,
    GpuWaitTimedOut,
    Kill,
    Launch,
    Launched,
    Limits,
    PhaseSeen,
    PreflightBlocked,
    PreflightPassed,
    ProbeResult,
    ReadyLineSeen,
    RunPreflight,
    ServerMachine,
    Sleep,
    Stalled,
    Start,
    StartProbing,
    State,
    StopRequested,
    WaitForGpus,
)
from launcher.logparse import LineSplitter, LogFollower, PhaseEntered, ReadyLine
from launcher.params import LaunchParams
from launcher.phases import Phase
from launcher.policy import Bounds
from launcher.transport.base import Transport

EventHook = Callable[[str, str, dict[str, Any]], None]

# The follower's longest wait between tries while its host is unreachable (each try also
# reconnects with the transport's own bounded, jittered backoff).
_OUTAGE_RETRY_MAX_S = 10.0


@dataclass
class Snapshot:
    """What a live view / status line shows for one server."""

    server: str
    host: str
    state: str
    phase: str | None
    progress: float | None
    attempt: int
    params: str
    elapsed_s: float
    pid: int | None
    reason: str = ""
    unreachable_s: float | None = None  # how long the host has been unreachable, if it is


@dataclass
class _Attempt:
    handle: remote.RunHandle
    follower: LogFollower = field(default_factory=LogFollower)
    offset: int = 0
    last_advance: float = 0.0
    port_reported: bool = False
    started_wall: float = field(default_factory=time.time)
    tg: TaskGroup | None = None
    scope: anyio.CancelScope = field(default_factory=anyio.CancelScope)


class ServerSupervisor:
    """Brings one server up and keeps it there. Start with ``await tg.start(sup.run)``."""

    def __init__(
        self,
        config: Config,
        server: ServerConfig,
        transport: Transport,
        *,
        sglang_version: str,
        secret_env: dict[str, str] | None = None,
        hooks: list[EventHook] | None = None,
        clock: Callable[[], float] = time.monotonic,
        initial: LaunchParams | None = None,
        stop_on_exit: bool = False,
        tick: float = 0.1,
    ) -> None:
        self.config = config
        self.server = server
        self.transport = transport
        self.version = sglang_version
        self.secret_env = secret_env or {}
        self.hooks = hooks or []
        self.clock = clock
        self.stop_on_exit = stop_on_exit
        self.tick = tick
        self.policy = config.policy_for(server.name)
        self.host = config.host(server.host)
        self.log = structlog.get_logger("launcher").bind(server=server.name, host=server.host)
        first = initial or LaunchParams(server.mem_fraction_static, server.cuda_graph_max_bs)
        p = self.policy
        self.machine = ServerMachine(
            initial=first,
            limits=Limits(
                bounds=Bounds(
                    p.mem_fraction_floor, p.mem_fraction_ceiling, p.graph_bs_floor, p.max_attempts
                ),
                max_stalls=p.max_stalls,
                probe_failures=p.probe_failures,
                start_deadline=p.start_deadline,
                tp=server.tp,
                sglang_version=sglang_version,
            ),
            restart=RestartBackoff(
                p.restart_backoff_initial,
                p.restart_backoff_max,
                p.healthy_reset,
                p.restart_budget,
                p.restart_window,
            ),
        )
        # The inbox exists only while ``run`` runs (it closes both ends on the way out); events
        # posted before that wait in ``_early``.
        self._inbox_send: MemoryObjectSendStream[Event] | None = None
        self._early: list[Event] = []
        self._attempt: _Attempt | None = None
        self._launching = anyio.Lock()  # held while a launch runs
        self._tg: TaskGroup | None = None
        self._started = clock()
        self._unreachable_since: float | None = None
        self._outages = 0  # outages begun or ended so far: a probe spanning one never counts
        self._back: anyio.Event | None = None  # set when the current outage ends
        self.tail_path: Path | None = None  # local copy of the last failed attempt's log tail

    # -- public ----------------------------------------------------------------------

    @property
    def state(self) -> State:
        return self.machine.state

    def snapshot(self) -> Snapshot:
        m = self.machine
        att = self._attempt
        reason, unreachable_s = m.reason, None
        if self._unreachable_since is not None:
            unreachable_s = self.clock() - self._unreachable_since
            note = f"host unreachable for {unreachable_s:.0f}s"
            reason = f"{reason}; {note}" if reason else note
        return Snapshot(
            server=self.server.name,
            host=self.server.host,
            state=m.state.value,
            phase=m.phase.value if m.phase else None,
            progress=att.follower.progress if att and m.state.running else None,
            attempt=m.attempt,
            params=(m.params or m.initial).describe(),
            elapsed_s=self.clock() - self._started,
            pid=m.pid,
            reason=reason,
            unreachable_s=unreachable_s,
        )

    async def run(
        self,
        *,
        task_status: anyio.abc.TaskStatus[None] = anyio.TASK_STATUS_IGNORED,
        adopt: bool = True,
    ) -> State:
        """Supervise until the server gave up or a stop is requested; return the final state."""
        send, inbox = anyio.create_memory_object_stream[Event](1000)
        self._inbox_send = send
        for event in self._early:
            send.send_nowait(event)
        self._early.clear()
        with send, inbox:
            await self._loop(inbox, task_status, adopt)
        return self.machine.state

    async def _loop(
        self,
        inbox: MemoryObjectReceiveStream[Event],
        task_status: anyio.abc.TaskStatus[None],
        adopt: bool,
    ) -> None:
        async with anyio.create_task_group() as tg:
            self._tg = tg
            task_status.started()
            try:
                first: Event = Start()
                if adopt:
                    found = await self._find_running()
                    if found is not None:
                        first = found
                if not isinstance(first, Adopted):
                    # Attempt directories on the host are never reused: number on from the last.
                    base = await self._latest_attempt()
                    self.machine.attempt = self.machine.attempt_base = base
                await self._dispatch(first)
                tg.start_soon(self._deadline_watch)
                async for event in inbox:
                    await self._dispatch(event)
                    if self.machine.state.terminal:
                        break
            finally:
                with anyio.CancelScope(shield=True):
                    await self._shutdown()
                tg.cancel_scope.cancel()

    def request_stop(self, *, kill: bool) -> None:
        """Ask the loop to stop supervising (and stop the server when ``kill``)."""
        self._post(StopRequested(kill=kill))

    # -- the loop ----------------------------------------------------------------------

    def _post(self, event: Event) -> None:
        if self._inbox_send is None:  # not running yet
            self._early.append(event)
            return
        try:
            self._inbox_send.send_nowait(event)
        except (anyio.WouldBlock, anyio.ClosedResourceError, anyio.BrokenResourceError):
            self.log.warning("event.dropped", dropped=type(event).__name__)

    async def _dispatch(self, event: Event) -> None:
        actions = self.machine.handle(event, self.clock())
        for action in actions:
            await self._execute(action)

    async def _execute(self, action: Action) -> None:
        assert self._tg is not None
        if isinstance(action, Emit):
            self._emit(action.name, action.data)
            if action.name == "server.ready" and self._attempt is not None:
                self._ready_attempt_ended(self._attempt)
        elif isinstance(action, RunPreflight):
            self._tg.start_soon(self._preflight)
        elif isinstance(action, Launch):
            self._tg.start_soon(self._launch, action)
        elif isinstance(action, Kill):
            self._tg.start_soon(self._kill, action.reason)
        elif isinstance(action, WaitForGpus):
            self._tg.start_soon(self._wait_for_gpus)
        elif isinstance(action, StartProbing):
            att = self._attempt
            if att is not None and att.tg is not None:
                att.tg.start_soon(self._probe_loop, att)
        elif isinstance(action, Sleep):
            self._tg.start_soon(self._sleep_then, action.seconds, BackoffElapsed())

    def _emit(self, name: str, data: dict[str, Any]) -> None:
        self.log.info(name, **data)
        for hook in self.hooks:
            hook(self.server.name, name, data)

    def _host_unreachable(self, exc: Exception, retry_in_s: float | None = None) -> None:
        """Report that the host cannot be reached (every time), remembering since when."""
        now = self.clock()
        if self._unreachable_since is None:
            self._unreachable_since = now
            self._outages += 1
            self._back = anyio.Event()
        data: dict[str, Any] = {
            "error": str(exc), "unreachable_s": round(now - self._unreachable_since, 3),
        }
        if retry_in_s is not None:
            data["retry_in_s"] = retry_in_s
        self._emit("host.unreachable", data)

    def _host_reachable(self) -> None:
        """A command reached the host: end an outage, reporting how long it lasted."""
        since, self._unreachable_since = self._unreachable_since, None
        if since is not None:
            self._outages += 1
            if self._back is not None:
                self._back.set()
            self._emit("host.reachable", {"unreachable_s": round(self.clock() - since, 3)})

    # -- actions -----------------------------------------------------------------------

    def _command(self, attempt: int, params: LaunchParams) -> ServerCommand:
        return server_command(self.server, params, self.version, self.secret_env, attempt)

    @property
    def run_dir(self) -> str:
        return self.server.run_dir or self.host.run_dir

    async def _find_running(self) -> Adopted | None:
        try:
            handle = await remote.find_running(self.transport, self.run_dir, self.server.name,
                                               adopting=True)
        except LauncherError as exc:
            self._emit("adopt.failed", {"error": str(exc)})
            return None
        if handle is None:
            return None
        params = await self._params_of(handle)
        self._attempt = _Attempt(handle=handle, last_advance=self.clock())
        self._start_attempt_tasks(self._attempt)
        return Adopted(pid=handle.pid, attempt=handle.attempt, params=params)

    async def _latest_attempt(self) -> int:
        try:
            return await remote.latest_attempt(self.transport, self.run_dir, self.server.name)
        except LauncherError as exc:
            self._emit("attempt.numbering_failed", {"error": str(exc)})
            return 0

    async def _params_of(self, handle: remote.RunHandle) -> LaunchParams:
        """Recover the params of an adopted attempt from its command file."""
        try:
            res = await self.transport.run(["cat", f"{handle.dir}/cmd"], timeout=10)
            words = res.stdout.decode(errors="replace").split()
        except LauncherError:
            words = []
        mfs: float | None = None
        bs: int | None = None
        for flag, value in itertools.pairwise(words):
            value = value.strip("'\"")
            if flag == "--mem-fraction-static":
                mfs = float(value)
            elif flag.startswith("--cuda-graph-max-bs"):
                bs = int(value)
        return LaunchParams(mfs, bs)

    async def _preflight(self) -> None:
        problems, transient = await self._preflight_problems()
        if not problems:
            self._post(PreflightPassed())
        else:
            self._post(PreflightBlocked("; ".join(problems), transient=transient))

    async def _preflight_problems(self) -> tuple[list[str], bool]:
        """(problems, all transient). GPUs busy is transient; the rest is fatal."""
        s = self.server
        fatal: list[str] = []
        try:
            busy = await self._busy_gpus()
            if s.model_path.startswith("/") and not await remote.path_exists(
                self.transport, s.model_path
            ):
                fatal.append(f"model path {s.model_path} does not exist on {s.host}")
            if await remote.port_in_use(self.transport, s.port):
                fatal.append(f"port {s.port} is already in use on {s.host}")
        except HostUnreachable as exc:
            return [f"host unreachable: {exc}"], True
        except LauncherError as exc:
            return [str(exc)], False
        if fatal:
            return fatal + busy, False
        return busy, True

    async def _busy_gpus(self) -> list[str]:
        """Problems with the server's GPUs; a GPU that does not exist raises (fatal)."""
        problems = await check_gpus(self.transport, self.host.nvidia_smi, self.server.gpus)
        missing = [p for p in problems if "not present" in p]
        if missing:
            raise PreflightError("; ".join(missing),
                                 remedy=f"fix the gpus of server {self.server.name}")
        return problems

    async def _launch(self, action: Launch) -> None:
        cmd = self._command(action.attempt, action.params)
        spec = remote.AttemptSpec(
            server=self.server.name,
            attempt=action.attempt,
            run_dir=self.run_dir,
            argv=cmd.argv,
            env=cmd.env,
            secret_env=cmd.secret_env,
        )
        # A kill requested meanwhile (stop, deadline) waits for this lock, so it stops the
        # process launched here instead of missing it.
        async with self._launching:
            try:
                handle = await remote.launch(self.transport, spec)
            except LauncherError as exc:
                self._attempt = None  # nothing to follow or stop; the previous one is over
                self._emit("launch.failed", {"error": str(exc)})
                diag = classify([], None)
                diag.advice = str(exc)
                # A run directory that cannot be written fails every relaunch the same way.
                diag.retryable = not isinstance(exc, remote.RunDirUnwritable)
                self._post(Exited(status=None, diagnosis=diag))
                return
            self._attempt = _Attempt(handle=handle, last_advance=self.clock())
            self._post(Launched(pid=handle.pid))
            self._start_attempt_tasks(self._attempt)

    def _start_attempt_tasks(self, att: _Attempt) -> None:
        assert self._tg is not None
        self._tg.start_soon(self._attempt_tasks, att)

    async def _attempt_tasks(self, att: _Attempt) -> None:
        with att.scope:
            async with anyio.create_task_group() as tg:
                att.tg = tg
                tg.start_soon(self._follow, att)
                tg.start_soon(self._stall_watch, att)

    async def _follow(self, att: _Attempt) -> None:
        splitter = LineSplitter()
        delay = 0.5
        while True:
            if self._unreachable_since is not None:
                # Say when the host is back even if the log stays silent after the outage.
                try:
                    await remote.log_age(self.transport, att.handle)
                except HostUnreachable as exc:
                    self._host_unreachable(exc, delay)
                    await self._outage_wait(delay)
                    delay = min(delay * 2, _OUTAGE_RETRY_MAX_S)
                    continue
                except LauncherError:
                    pass  # the host answered; the follow below reports what is wrong
                self._host_reachable()
            try:
                async for item in remote.follow(self.transport, att.handle, att.offset):
                    if isinstance(item, remote.LogChunk):
                        att.offset = item.end_offset
                        att.last_advance = self.clock()
                        delay = 0.5  # following works again: the next outage starts small
                        self._host_reachable()
                        for line in splitter.feed(item.data):
                            self._on_line(att, line)
                    else:
                        for line in splitter.flush():
                            self._on_line(att, line)
                        att.follower.finish()
                        diag = diagnose(att.follower, item.status)
                        self._post(Exited(status=item.status, diagnosis=diag))
                        return
                return
            except HostUnreachable as exc:
                self._host_unreachable(exc, delay)
                await self._outage_wait(delay)
                delay = min(delay * 2, _OUTAGE_RETRY_MAX_S)
            except LauncherError as exc:
                # The host answers but reading the log failed (e.g. its file vanished). A dead
                # server is reported with what the log showed so far; a live one is followed
                # again (a log that stops advancing is a stall).
                status = await self._status_of(att)
                if status is not None and not status.alive:
                    for line in splitter.flush():
                        self._on_line(att, line)
                    att.follower.finish()
                    diag = diagnose(att.follower, status.exit_status)
                    self._post(Exited(status=status.exit_status, diagnosis=diag))
                    return
                self._emit("follow.failed", {"error": str(exc), "retry_in_s": delay})
                await anyio.sleep(delay)
                delay = min(delay * 2, 30.0)

    async def _outage_wait(self, delay: float) -> None:
        """Sleep ``delay`` before following again, less once another task (a probe, the stall
        check) has reached the host again."""
        back = self._back
        with anyio.move_on_after(delay):
            if back is not None:
                await back.wait()

    def _on_line(self, att: _Attempt, line: str) -> None:
        for ev in att.follower.feed_line(line):
            if isinstance(ev, PhaseEntered):
                self._post(PhaseSeen(ev.phase))
            elif isinstance(ev, ReadyLine):
                self._post(ReadyLineSeen())
        if att.follower.port_in_use is not None and not att.port_reported:
            att.port_reported = True
            self._post(FatalLineSeen(diagnose(att.follower, None)))

    async def _stall_watch(self, att: _Attempt) -> None:
        budgets = self.policy.stall
        while True:
            await anyio.sleep(self.tick)
            phase = self.machine.phase
            if phase is None or phase is Phase.READY:
                att.last_advance = self.clock()
                continue
            if self._unreachable_since is not None:
                continue  # silence is only counted while connected (and confirmed below)
            budget = budgets.for_phase(phase)
            silent = self.clock() - att.last_advance
            if silent > budget and not math.isinf(budget):
                # Confirm with the host: only the log's own age there says it is silent.
                age = await self._remote_silence(att)
                if age is None or self.machine.phase is not phase:
                    continue
                if age <= budget:
                    att.last_advance = self.clock() - age  # it wrote; our follower lags
                    continue
                self._post(Stalled(silent_s=age))
                return

    async def _remote_silence(self, att: _Attempt) -> float | None:
        """Seconds since the attempt's log changed, by the host's clock; None when the host
        is unreachable; what we saw locally when the host cannot tell (e.g. no log)."""
        try:
            age = await remote.log_age(self.transport, att.handle)
        except HostUnreachable as exc:
            self._host_unreachable(exc)
            return None
        except LauncherError:
            return self.clock() - att.last_advance
        self._host_reachable()
        return age

    async def _probe_loop(self, att: _Attempt) -> None:
        p = self.policy
        async with self.transport.forward_port(self.server.port) as local_port:
            url = f"http://127.0.0.1:{local_port}/health"
            async with httpx.AsyncClient(timeout=p.probe_timeout, trust_env=False) as client:
                while True:
                    started = self.clock()
                    outages = self._outages if self._unreachable_since is None else -1
                    try:
                        resp = await client.get(url)
                        ok, detail = resp.status_code == 200, f"HTTP {resp.status_code}"
                    except httpx.HTTPError as exc:
                        ok, detail = False, f"{type(exc).__name__}: {exc}"
                    latency = self.clock() - started
                    ready = self.machine.state is State.READY
                    # A server that crashed also fails its probes, often before the follower
                    # reports its exit; counting those would call the crash a hang and lose
                    # the log's diagnosis. Only a live server's failures count, and only when
                    # the host can be reached (an SSH outage is not the server's fault).
                    running = True if ok or not ready else await self._still_running(att)
                    if not ok and outages != self._outages:
                        running = None  # the host was unreachable during this probe
                    counts = running is True
                    if ok:
                        self._host_reachable()
                    elif running is False:
                        detail += " (the server has exited)"
                    elif running is None:
                        detail += " (host unreachable)"
                    for hook in self.hooks:
                        hook(
                            self.server.name,
                            "probe.result",
                            {"ok": ok, "latency_s": latency, "detail": detail},
                        )
                    if counts:
                        self._post(ProbeResult(ok=ok, detail=detail))
                    await anyio.sleep(p.probe_interval if ready else min(0.5, p.probe_interval))

    async def _status_of(self, att: _Attempt) -> remote.RunStatus | None:
        """A look at the attempt's process; None when the host cannot tell."""
        try:
            return await remote.probe(self.transport, att.handle)
        except LauncherError:
            return None

    async def _still_running(self, att: _Attempt) -> bool | None:
        """Whether the attempt's server process still lives: None when the host cannot be
        reached, True when it answers but cannot tell."""
        try:
            status = await remote.probe(self.transport, att.handle)
        except HostUnreachable as exc:
            self._host_unreachable(exc)
            return None
        except LauncherError:
            return True
        self._host_reachable()
        return status.alive

    async def _kill(self, reason: str) -> None:
        with anyio.CancelScope(shield=True):
            async with self._launching:  # a launch in flight: kill what it starts
                att = self._attempt
            if att is not None:
                att.scope.cancel()
        if att is not None:
            await self._stop_reaching_host(att, reason)
            with anyio.CancelScope(shield=True):
                # Read after the stop, so the tail has the server's last words; a tail that
                # cannot be read must not keep the server from being stopped (hence apart).
                tail = b""
                try:
                    tail = await remote.tail_log(self.transport, att.handle)
                except LauncherError as exc:
                    self._emit("attempt.tail_unreadable", {"error": str(exc)})
                self._attempt_ended(att, tail.decode("utf-8", errors="replace"))
        self._post(CleanedUp())

    async def _stop_reaching_host(self, att: _Attempt, reason: str) -> None:
        """Stop the attempt's processes; while the host is unreachable, wait and try again,
        so that no relaunch starts beside a server that could not be stopped.

        Each try is shielded from cancellation; the waits between tries are not, so shutting
        launcher down during an outage ends them (the server is left to the next launcher).
        """
        delay = 0.5
        while True:
            with anyio.CancelScope(shield=True):
                try:
                    report = await remote.stop(self.transport, att.handle, grace=5.0,
                                               kill_wait=5.0)
                except HostUnreachable as exc:
                    self._host_unreachable(exc, delay)
                except LauncherError as exc:
                    self._emit("process.stop_failed", {"reason": reason, "error": str(exc)})
                    return
                else:
                    self._host_reachable()
                    self._emit("process.stopped", {
                        "reason": reason, "signals": report.signals_sent,
                        "leftover_pids": report.leftover_pids,
                    })
                    return
            await self._outage_wait(delay)
            delay = min(delay * 2, _OUTAGE_RETRY_MAX_S)

    def _attempt_ended(self, att: _Attempt, tail: str) -> None:
        """Keep the tail locally and tell the hooks how the attempt ended."""
        diag = self.machine.pending
        self.tail_path = self._save_tail(att.handle.attempt, tail)
        data: dict[str, Any] = {
            "attempt": att.handle.attempt,
            "params": _params_dict(self.machine.params),
            "outcome": diag.outcome.value if diag else "stopped",
            "phase": diag.phase.value if diag else None,
            "numbers": diag.numbers.as_dict() if diag else {},
            "evidence": list(diag.evidence) if diag else [],
            "advice": diag.advice if diag else "",
            "started_at": att.started_wall, "ended_at": time.time(), "log_tail": tail,
            "tail_path": str(self.tail_path) if self.tail_path else None,
        }
        for hook in self.hooks:
            hook(self.server.name, "attempt.ended", data)

    def _ready_attempt_ended(self, att: _Attempt) -> None:
        data: dict[str, Any] = {
            "attempt": att.handle.attempt, "params": _params_dict(self.machine.params),
            "outcome": "ready", "phase": "ready", "numbers": att.follower.numbers.as_dict(),
            "evidence": [], "advice": "", "started_at": att.started_wall,
            "ended_at": time.time(), "log_tail": "", "tail_path": None,
        }
        for hook in self.hooks:
            hook(self.server.name, "attempt.ended", data)

    def _save_tail(self, attempt: int, tail: str) -> Path | None:
        try:
            folder = self.config.state_dir / "logs" / self.server.name
            folder.mkdir(parents=True, exist_ok=True)
            path = folder / f"attempt-{attempt}.log"
            path.write_text(tail, encoding="utf-8")
            return path
        except OSError as exc:
            self.log.warning("attempt.tail_not_saved", error=str(exc))
            return None

    async def _wait_for_gpus(self) -> None:
        deadline = self.clock() + self.policy.gpu_free_timeout
        problems: list[str] = []
        while self.clock() < deadline:
            try:
                problems = await self._busy_gpus()
            except LauncherError as exc:
                problems = [str(exc)]
            if not problems:
                self._post(GpusFree())
                return
            self._emit("gpu.waiting", {"problems": problems})
            await anyio.sleep(1.0)
        self._post(GpuWaitTimedOut(holder="; ".join(problems)))

    async def _sleep_then(self, seconds: float, event: Event) -> None:
        await anyio.sleep(seconds)
        self._post(event)

    async def _deadline_watch(self) -> None:
        """Post DeadlineExceeded once per start-up sequence that outlasts the deadline.

        It keeps watching afterwards: a restart after ready is a new sequence with its own
        deadline. Failures while serving are not start-ups (``was_ready``).
        """
        fired_for: float | None = None
        while True:
            await anyio.sleep(1.0)
            m = self.machine
            if (
                m.started_at is None
                or m.started_at == fired_for
                or m.was_ready
                or m.state in (State.READY, State.BACKING_OFF)
                or m.state.terminal
                or self._unreachable_since is not None  # decided once the host answers again
            ):
                continue
            if self.clock() - m.started_at > self.policy.start_deadline:
                fired_for = m.started_at
                self._post(DeadlineExceeded())

    async def _shutdown(self) -> None:
        att = self._attempt
        if att is not None:
            att.scope.cancel()


async def supervise_all(
    supervisors: list[ServerSupervisor],
    *,
    until_ready: bool = False,
    on_tick: Callable[[], Awaitable[None]] | None = None,
) -> dict[str, State]:
    """Run every supervisor concurrently; one server's failure never stops another.

    With ``until_ready`` return as soon as every server is ready or gave up (servers keep
    running on their hosts).
    """
    results: dict[str, State] = {}
    async with anyio.create_task_group() as tg:

        async def one(sup: ServerSupervisor) -> None:
            results[sup.server.name] = await sup.run()

        for sup in supervisors:
            tg.start_soon(one, sup)
        while True:
            await anyio.sleep(0.2)
            if on_tick is not None:
                await on_tick()
            states = [s.state for s in supervisors]
            if all(st.terminal for st in states):
                break
            if until_ready and all(
                st in (State.READY, State.GAVE_UP) or st.terminal for st in states
            ):
                for s in supervisors:
                    s.request_stop(kill=False)
    for sup in supervisors:
        results.setdefault(sup.server.name, sup.state)
    return results


def _params_dict(p: LaunchParams | None) -> dict[str, Any]:
    if p is None:
        return {}
    return {"mem_fraction_static": p.mem_fraction_static, "cuda_graph_max_bs": p.cuda_graph_max_bs}
