"""Supervision of one server: the I/O around the pure state machine (launcher.supervise.lifecycle).

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
import random
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field, replace
from pathlib import Path

import anyio
import structlog
from anyio.abc import TaskGroup
from anyio.streams.memory import MemoryObjectReceiveStream, MemoryObjectSendStream
from tenacity import (
    AsyncRetrying,
    retry_if_exception,
    stop_after_attempt,
    wait_exponential_jitter,
)

from launcher.config.schema import Config, ServerConfig
from launcher.errors import (
    AuthenticationFailed,
    HostKeyError,
    HostUnreachable,
    LauncherError,
    StateError,
    describe_exception,
    format_traceback,
    is_transient,
    reraise_lease_lost,
)
from launcher.host import health, preflight
from launcher.host import run as remote
from launcher.host.follower import HostFollower, followers_for
from launcher.host.preflight import (
    PortHolder,
    Problem,
    ProblemKind,
    Target,
    port_holder,
    port_problem,
)
from launcher.host.shell import RunDirUnsafe
from launcher.host.transport.base import Transport
from launcher.memory.estimate import Estimate
from launcher.memory.policy import AttemptRecord
from launcher.params import LaunchParams
from launcher.plan.command import ServerCommand, server_command
from launcher.sglang.classify import classify, diagnose
from launcher.sglang.flags import params_from_argv
from launcher.sglang.logparse import LineSplitter, LogFollower, PhaseLine, ReadyLine
from launcher.sglang.outcome import Outcome
from launcher.sglang.phases import Phase
from launcher.store.lock import make_private_dir, write_private_file
from launcher.supervise import events
from launcher.supervise.backoff import Doubling, RestartBackoff, Sleeper, sleep_or
from launcher.supervise.lifecycle import (
    Action,
    Adopted,
    BackoffElapsed,
    CleanedUp,
    DeadlineExceeded,
    Emit,
    Exited,
    FatalLineSeen,
    GpusFree,
    GpuWaitTimedOut,
    HostRefused,
    Kill,
    Launch,
    Launched,
    LifecycleInput,
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
    Unknown,
    WaitForGpus,
)
from launcher.untrusted import Redactor, parse_stamp

# Awaited with (server, reason) before launcher stops a server's processes (a router's
# registrar deregisters it there); it must return within a bounded time.
BeforeStop = Callable[[str, str], Awaitable[None]]

# The follower's longest wait between tries while its host is unreachable (each try also
# reconnects with the transport's own bounded, jittered backoff).
_OUTAGE_RETRY_MAX_S = 10.0
_CMD_LIMIT = 64 * 1024  # bytes of an adopted attempt's cmd file read back (argv and settings)


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
    elapsed_s: float | None  # the server's own time: since its current attempt was launched
    pid: int | None
    reason: str = ""
    unreachable_s: float | None = None  # how long the host has been unreachable, if it is
    phase_s: float | None = None  # time in ``state`` (a start-up phase, a wait) so far
    stall_left_s: float | None = None  # the phase's silence budget left; None: none applies
    steps: tuple[int, int] | None = None  # the phase's progress bar: (done, total)
    graph_pass: str | None = None  # the capture pass under way (a GraphPass value)
    graph_bs: int | None = None  # the batch size the capture bar last showed
    last_failure: str = ""  # the last failed attempt in a few words (see failure_note)


_OUTCOME_WORDS = {
    Outcome.OOM_WEIGHTS: "OOM loading weights",
    Outcome.OOM_KV_CACHE: "OOM allocating the KV cache",
    Outcome.OOM_RUNTIME: "OOM at warmup",
    Outcome.KV_TOO_SMALL: "KV cache too small",
    Outcome.HYBRID_STATE_TOO_SMALL: "hybrid state cache too small",
    Outcome.PORT_IN_USE: "port in use",
    Outcome.BAD_ARGUMENT: "bad argument",
    Outcome.MODEL_NOT_FOUND: "model not found",
    Outcome.NCCL_ERROR: "NCCL error",
    Outcome.HANG: "hang",
    Outcome.KILLED: "killed",
    Outcome.CUDA_ERROR_OTHER: "CUDA error",
    Outcome.INCOMPLETE: "log ended early",
}


def failure_note(attempt: int, record: AttemptRecord, next_params: LaunchParams | None) -> str:
    """Attempt ``attempt``'s failure in a few words, and what the next attempt changed:
    ``#2 OOM in draft extend capture, bs 32 → 0.644`` (fraction), ``→ 0.82, bs 16``."""
    n = record.numbers
    if record.outcome is Outcome.OOM_GRAPH_CAPTURE:
        where = (n.graph_pass or "").replace("_", " ")
        text = f"OOM in {where} capture" if where else "OOM in graph capture"
        if n.graph_last_bs is not None:
            text += f", bs {n.graph_last_bs}"
    else:
        text = _OUTCOME_WORDS.get(record.outcome, record.outcome.value.replace("_", " "))
        if record.outcome in (Outcome.HANG, Outcome.KILLED):
            text += f" in {record.phase.value}"
    changes = []
    if next_params is not None:
        old, new = record.params, next_params
        if new.mem_fraction_static is not None and (
                new.mem_fraction_static != old.mem_fraction_static):
            changes.append(f"{new.mem_fraction_static:g}")
        if new.cuda_graph_max_bs is not None and new.cuda_graph_max_bs != old.cuda_graph_max_bs:
            changes.append(f"bs {new.cuda_graph_max_bs}")
    return f"#{attempt} {text}" + (f" → {', '.join(changes)}" if changes else "")


@dataclass
class RunningAttempt:
    handle: remote.RunHandle
    follower: LogFollower = field(default_factory=LogFollower)
    offset: int = 0
    last_advance: float = 0.0
    port_reported: bool = False
    started_wall: float = field(default_factory=time.time)
    tg: TaskGroup | None = None
    scope: anyio.CancelScope = field(default_factory=anyio.CancelScope)


class ServerSupervisor:
    """Brings one server up and keeps it there. Start with ``await tg.start(sup.run)``.

    Extension points: the supervisor drives the pure state machine (``lifecycle``) and does
    the I/O of one *unit*, by default one process on one host. A unit of another shape (a
    multi-node server's group of ranks: ``launcher.supervise.ranks``) overrides these public
    methods, and only these; each docstring states its contract:

    - ``survey`` lists the unit's attempts; ``adopt`` takes over a running one;
      ``clear_leftovers`` stops what must not stay beside a fresh start;
    - ``preflight_checks`` and ``gpu_problems`` return the unit's typed preflight problems
      (``launcher.host.preflight``);
    - ``launch`` starts an attempt; ``follow_attempt`` follows it (logs, stalls) until it
      ends or is cancelled;
    - ``stop_attempt`` stops it; ``attempt_tail`` reads the end of its log(s) afterwards;
    - ``host_unreachable`` / ``host_reachable`` keep the outage bookkeeping of a ``node``.

    An override may use the protected helpers ``_post`` (an input to the state machine),
    ``_emit`` (an event), ``_attempt`` (the running attempt), ``_launching`` (held while a
    launch runs), ``_start_attempt_tasks``, ``_attempt_ended``, ``_params_of``,
    ``_launched_at``, ``_transient_retrying``, ``_preflight_target`` and ``_port_taken``.
    """

    def __init__(
        self,
        config: Config,
        server: ServerConfig,
        transport: Transport,
        *,
        sglang_version: str,
        secret_env: dict[str, str] | None = None,
        hooks: list[events.Hook] | None = None,
        clock: Callable[[], float] = time.monotonic,
        sleep: Sleeper = anyio.sleep,
        rng: random.Random | None = None,
        initial: LaunchParams | None = None,
        initial_reason: str = "",
        stop_on_exit: bool = False,
        tick: float = 0.1,
        listing_tries: int = 6,
        listing_recheck_s: float = 30.0,
        preflight_tries: int = 6,
        inbox_size: int = 1000,
        before_stop: BeforeStop | None = None,
        host_follower: HostFollower | None = None,
        estimate: Estimate | None = None,
    ) -> None:
        self.config = config
        self.before_stop = before_stop
        self.server = server
        self.transport = transport
        self.version = sglang_version
        self.secret_env = secret_env or {}
        # Every sink (event log, hooks: ledger, Slack, metrics; saved tails; the live view)
        # gets text from the server with these values masked: a server may print its token.
        self.redact = Redactor(list(self.secret_env.values()))
        self.hooks = hooks or []
        self.clock = clock
        # Every wait (backoff, retries, polls, the watches' timers) is this sleep, so a fake
        # clock and sleep pair makes the schedule exact in tests; I/O timeouts stay real.
        self.sleep = sleep
        self.stop_on_exit = stop_on_exit
        self.tick = tick
        self.listing_tries = listing_tries
        self.listing_recheck_s = listing_recheck_s
        self.preflight_tries = preflight_tries
        self.inbox_size = inbox_size
        self.policy = config.policy_for(server.name)
        self.host = config.host(server.host)
        self.log = structlog.get_logger("launcher").bind(server=server.name, host=server.host)
        first = initial or server.launch_params()
        p = self.policy
        self.machine = ServerMachine(
            initial=first,
            initial_reason=initial_reason,
            limits=Limits(
                bounds=p.bounds(),
                max_stalls=p.max_stalls,
                probe_failures=p.probe_failures,
                start_deadline=p.start_deadline,
                tp=server.tp,
                sglang_version=sglang_version,
                estimate=estimate,
            ),
            restart=RestartBackoff(
                p.restart_backoff_initial,
                p.restart_backoff_max,
                p.healthy_reset,
                p.restart_budget,
                p.restart_window,
                rng,  # the restart delay's jitter (None: a private Random)
            ),
        )
        # The inbox exists only while ``run`` runs (it closes both ends on the way out); events
        # posted before that wait in ``_early``.
        self._inbox_send: MemoryObjectSendStream[LifecycleInput] | None = None
        self._early: list[LifecycleInput] = []
        self._stop_asked: anyio.Event | None = None  # set by request_stop while ``run`` runs
        self._attempt: RunningAttempt | None = None
        self._launching = anyio.Lock()  # held while a launch runs
        self._tg: TaskGroup | None = None
        self._state_since: float | None = None  # when the machine entered its current state
        self._unreachable_since: float | None = None
        self._port_wait_since: float | None = None  # when this preflight found the port taken
        self._outages = 0  # outages begun or ended so far: a probe spanning one never counts
        self._back: anyio.Event | None = None  # set when the current outage ends
        self.tail_path: Path | None = None  # local copy of the last failed attempt's log tail
        # Follows the log through the host's one agent (supervise_all sets it); None: one
        # remote.follow stream per attempt.
        self.host_follower = host_follower
        # Set (and replaced) whenever the state, phase, start-up or reachability changes: the
        # watches sleep on it instead of polling. ``on_change`` is told too (supervise_all).
        self._wake = anyio.Event()
        self._seen: tuple[object, ...] = ()
        self.on_change: Callable[[], None] | None = None

    # -- public ----------------------------------------------------------------------

    @property
    def state(self) -> State:
        return self.machine.state

    def snapshot(self) -> Snapshot:
        m = self.machine
        att = self._attempt
        now = self.clock()
        reason, unreachable_s = m.reason, None
        if self._unreachable_since is not None:
            unreachable_s = self.clock() - self._unreachable_since
            note = f"host unreachable for {unreachable_s:.0f}s"
            reason = f"{reason}; {note}" if reason else note
        live = att is not None and m.state.running
        numbers = att.follower.numbers if att is not None else None
        graphs = numbers is not None and live and m.phase is Phase.CUDA_GRAPH
        stall_left = None
        if att is not None and live and m.phase is not None and m.phase is not Phase.READY:
            budget = self.policy.stall.for_phase(m.phase)
            if math.isfinite(budget):
                stall_left = max(0.0, budget - (now - att.last_advance))
        return Snapshot(
            server=self.server.name,
            host=self.server.host,
            state=m.state.value,
            phase=m.phase.value if m.phase else None,
            progress=att.follower.progress if live and att else None,
            attempt=m.attempt,
            params=(m.params or m.initial).describe(),
            elapsed_s=max(0.0, time.time() - att.started_wall) if live and att else None,
            pid=m.pid,
            reason=self.redact.text(reason),
            unreachable_s=unreachable_s,
            phase_s=None if self._state_since is None else now - self._state_since,
            stall_left_s=stall_left,
            steps=att.follower.steps if live and att else None,
            graph_pass=numbers.graph_pass if graphs and numbers else None,
            graph_bs=numbers.graph_last_bs if graphs and numbers else None,
            last_failure=self.redact.text(self._failure_note()),
        )

    def _failure_note(self) -> str:
        m = self.machine
        for record, attempt in zip(reversed(m.history), reversed(m.history_attempts),
                                   strict=True):
            if record.outcome is not Outcome.READY:
                nxt = m.params if m.state.running and m.params != record.params else None
                return failure_note(attempt, record, nxt)
        return ""

    async def run(
        self,
        *,
        task_status: anyio.abc.TaskStatus[None] = anyio.TASK_STATUS_IGNORED,
        adopt: bool = True,
    ) -> State:
        """Supervise until the server gave up or a stop is requested; return the final state."""
        send, inbox = anyio.create_memory_object_stream[LifecycleInput](self.inbox_size)
        self._inbox_send = send
        self._stop_asked = anyio.Event()
        early, self._early = self._early, []
        if any(isinstance(event, StopRequested) for event in early):
            self._stop_asked.set()
        with send, inbox:
            await self._loop(inbox, task_status, adopt, early)
        return self.machine.state

    async def _loop(
        self,
        inbox: MemoryObjectReceiveStream[LifecycleInput],
        task_status: anyio.abc.TaskStatus[None],
        adopt: bool,
        early: list[LifecycleInput],
    ) -> None:
        async with anyio.create_task_group() as tg:
            self._tg = tg
            task_status.started()
            tg.start_soon(self._post_in_order, early)
            try:
                first = await self._first_event(adopt)
                if first is not None:  # else a stop came first; it waits in the inbox
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
        """Ask the loop to stop supervising (and stop the server when ``kill``). Never lost:
        with a full inbox the request waits for its turn in a task of its own."""
        event = StopRequested(kill=kill)
        if self._stop_asked is not None:
            self._stop_asked.set()
        if self._inbox_send is None or self._tg is None:  # not running yet
            self._early.append(event)
            return
        try:
            self._inbox_send.send_nowait(event)
        except anyio.WouldBlock:
            self._tg.start_soon(self._post, event)
        except (anyio.ClosedResourceError, anyio.BrokenResourceError):
            pass  # supervision is over already

    # -- the loop ----------------------------------------------------------------------

    async def _post(self, event: LifecycleInput) -> None:
        """Hand ``event`` to the loop. A full inbox makes the caller wait (back-pressure)
        instead of dropping the event: a lost CleanedUp or GpusFree would strand the server.
        Only once the loop has ended are events discarded (nothing is left to act on them)."""
        if self._inbox_send is None:  # not running yet
            self._early.append(event)
            return
        try:
            await self._inbox_send.send(event)
        except (anyio.ClosedResourceError, anyio.BrokenResourceError):
            self.log.debug("event.after_end", event_type=type(event).__name__)

    async def _post_in_order(self, events: list[LifecycleInput]) -> None:
        for event in events:
            await self._post(event)

    async def _dispatch(self, event: LifecycleInput) -> None:
        state = self.machine.state
        actions = self.machine.handle(event, self.clock())
        if self.machine.state is not state:
            self._state_since = self.clock()
        for action in actions:
            await self._execute(action)
        m = self.machine
        seen = (m.state, m.phase, m.started_at, m.was_ready)
        if seen != self._seen:
            self._seen = seen
            self._changed()

    def _changed(self) -> None:
        """Wake the watches (and supervise_all): something they decide on has changed."""
        self._wake.set()
        self._wake = anyio.Event()
        if self.on_change is not None:
            self.on_change()

    async def _execute(self, action: Action) -> None:
        assert self._tg is not None
        if isinstance(action, Emit):
            event = action.event
            if isinstance(event, events.ServerReady) and self._attempt is not None:
                # What SGLang resolved for params left to it (Slack shows numbers, not "auto").
                event = replace(event, resolved=self._attempt.follower.resolved_params)
            self._emit(event)
            if isinstance(event, events.ServerReady) and self._attempt is not None:
                self._ready_attempt_ended(self._attempt)
            elif isinstance(event, events.ServerGaveUp) and self._attempt is not None:
                await self._mark_gave_up(self._attempt.handle, self.machine.reason)
        elif isinstance(action, RunPreflight):
            self._tg.start_soon(self._preflight)
        elif isinstance(action, Launch):
            self._tg.start_soon(self.launch, action)
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

    def _emit(self, event: events.Event) -> None:
        """Log ``event`` (its ``to_dict``: the log boundary) and hand it to every hook,
        its secrets masked."""
        event = self.redact(event)
        # The level table: launcher.hooks.logging.
        self.log.log(event.level, event.name, **event.to_dict())
        self._to_hooks(event)

    def _to_hooks(self, event: events.Event) -> None:
        """Hand ``event`` to the hooks only (not logged: too frequent, or too big)."""
        for hook in self.hooks:
            hook(self.server.name, event)

    def host_unreachable(self, exc: Exception, retry_in_s: float | None = None,
                         node: str | None = None) -> None:
        """Extension point: report that the host (``node``; one host here, so it is the
        server's) cannot be reached (every time), remembering since when."""
        now = self.clock()
        if self._unreachable_since is None:
            self._unreachable_since = now
            self._outages += 1
            self._back = anyio.Event()
            self._changed()
        self._emit(events.HostLost(
            error=str(exc), unreachable_s=round(now - self._unreachable_since, 3),
            retry_in_s=retry_in_s,
        ))

    def host_reachable(self, node: str | None = None) -> None:
        """Extension point: a command reached the host (``node``; one host here): end an
        outage, reporting how long it lasted."""
        since, self._unreachable_since = self._unreachable_since, None
        if since is not None:
            self._outages += 1
            if self._back is not None:
                self._back.set()
            self._changed()
            self._emit(events.HostReachable(unreachable_s=round(self.clock() - since, 3)))

    # -- actions -----------------------------------------------------------------------

    def _command(self, attempt: int, params: LaunchParams) -> ServerCommand:
        return server_command(self.server, params, self.version, self.secret_env, attempt)

    @property
    def run_dir(self) -> str:
        return self.config.run_dir_of(self.server)

    async def _first_event(self, adopt: bool) -> LifecycleInput | None:
        """Adopted (a running attempt was found) or Start, decided on a listing of the host's
        attempts that succeeded: launching on a failed listing could start a second copy
        beside a running server and leave that one unsupervised.

        Transient listing errors are retried (bounded, jittered). When the listing still
        fails the server is "unknown" (``server.unknown``), nothing is launched, and the
        listing is tried again (after 1 s, doubling up to ``listing_recheck_s``) until it
        succeeds. A host whose key or login is refused, or whose run directory is unsafe
        (RunDirUnsafe), gives the server up (HostRefused).
        None when a stop was requested before it was decided.
        """
        decided: list[LifecycleInput] = []
        stop_asked = self._stop_asked
        assert stop_asked is not None  # made by ``run``
        async with anyio.create_task_group() as tg:

            async def decide() -> None:
                decided.append(await self._decide_first(adopt))
                tg.cancel_scope.cancel()

            async def stop_wins() -> None:
                await stop_asked.wait()
                tg.cancel_scope.cancel()

            tg.start_soon(decide)
            tg.start_soon(stop_wins)
        return decided[0] if decided else None

    async def _decide_first(self, adopt: bool) -> LifecycleInput:
        waits = Doubling(min(1.0, self.listing_recheck_s), self.listing_recheck_s)
        while True:
            try:
                found = await self.survey()
            except (HostKeyError, AuthenticationFailed, RunDirUnsafe) as exc:
                # Not "unknown": this host must not (or cannot) be asked again; nothing in a
                # run directory another user could swap may be adopted, signalled or written.
                return HostRefused(f"cannot list its attempts on {self.server.host}: {exc}")
            except LauncherError as exc:
                await self._dispatch(Unknown(f"cannot list its attempts on {self.server.host}: "
                                             f"{exc}"))
                wait = waits.next()
                self._emit(events.ListingFailed(error=str(exc), retry_in_s=wait))
                await self.sleep(wait)
                continue
            if adopt and found.running is not None:
                return await self.adopt(found.running)
            # Attempt directories on the host are never reused: number on from the last.
            self.machine.attempt = self.machine.attempt_base = found.latest
            await self.clear_leftovers()
            return Start()

    async def clear_leftovers(self) -> None:
        """Extension point: after ``survey``, before a fresh start (nothing adopted), stop
        what of the unit still runs that must not stay beside the new attempt. One process
        has nothing to clear: a running one was adopted."""

    def _transient_retrying(
        self, tries: int, event: type[events.ListingRetry | events.PreflightRetry],
    ) -> AsyncRetrying:
        """Up to ``tries`` tries of a host operation, retrying only ``is_transient`` errors
        (bounded, exponential with jitter), each retry logged as ``event``; the last error is
        re-raised."""
        return AsyncRetrying(
            retry=retry_if_exception(is_transient),
            stop=stop_after_attempt(tries),
            wait=wait_exponential_jitter(multiplier=0.2, max=5.0, jitter=0.5),
            before_sleep=lambda rs: self._emit(event(
                try_=rs.attempt_number,
                error=str(rs.outcome.exception()) if rs.outcome else "",
            )),
            sleep=self.sleep,
            reraise=True,
        )

    async def survey(self) -> remote.Survey:
        """Extension point: the unit's running attempt (if any) and latest attempt number,
        retrying what ``is_transient`` (``listing_tries``); raises what the listing raised."""
        async for attempt in self._transient_retrying(self.listing_tries, events.ListingRetry):
            with attempt:
                return await remote.survey(self.transport, self.run_dir, self.server.name,
                                           adopting=True)
        raise AssertionError("unreachable")  # pragma: no cover (reraise=True)

    async def adopt(self, handle: remote.RunHandle) -> Adopted:
        """Extension point: take over the running attempt ``survey`` found (``_attempt``,
        its tasks started) and say so to the state machine."""
        params = await self._params_of(handle)
        launched = await self._launched_at(handle)
        self._attempt = RunningAttempt(handle=handle, last_advance=self.clock())
        if launched is not None:
            self._attempt.started_wall = launched
        self._start_attempt_tasks(self._attempt)
        return Adopted(pid=handle.pid, attempt=handle.attempt, params=params,
                       started_wall=launched)

    async def _launched_at(self, handle: remote.RunHandle) -> float | None:
        """When an adopted attempt was launched (its run directory's ``started_at``, read
        through ``remote.attempt_files``: bounded, and only from a run directory that passes
        its check)."""
        try:
            files = await remote.attempt_files(self.transport, handle)
        except LauncherError:
            return None
        # a forged or corrupt one (no zone, year 1, garbage) is unknown, not a crash
        stamp = parse_stamp(files.get("started_at", "")[:256])
        return None if stamp is None else stamp.timestamp()

    async def _params_of(self, handle: remote.RunHandle) -> LaunchParams:
        """Recover the params of an adopted attempt from its command file: the server's argv,
        led by the ``PARAMS_ENV`` settings a relaunch made (``NAME=value`` words; the env file
        itself is removed once the server has read it, and it holds secrets besides). A value
        that cannot be what launcher wrote (a forged or corrupt file) is reported as
        ``attempt.corrupt`` and the params are taken as unknown."""
        try:
            files = await remote.attempt_files(self.transport, handle, limit=_CMD_LIMIT)
            words = files.get("cmd", "").split()
        except LauncherError:
            words = []
        for flag, raw in itertools.pairwise(words):
            value = raw.strip("'\"")
            try:
                if flag == "--mem-fraction-static" and not 0.0 < float(value) < 1.0:
                    raise ValueError(value)
                if flag.startswith("--cuda-graph-max-bs") and int(value) < 1:
                    raise ValueError(value)
            except ValueError:
                self._emit(events.AttemptCorrupt(attempt=handle.attempt, file="cmd",
                                                 value=f"{flag} {value}"[:80]))
                return LaunchParams()
        leading = itertools.takewhile(lambda w: "=" in w and not w.startswith("-"), words)
        return params_from_argv(words, [f"export {w}" for w in leading])

    async def _preflight(self) -> None:
        self._port_wait_since = None  # each preflight's wait for a taken port is bounded anew
        problems = await self._preflight_problems()
        if not problems:
            await self._post(PreflightPassed())
        else:
            await self._post(PreflightBlocked("; ".join(map(str, problems)),
                                              transient=all(p.transient for p in problems)))

    async def _preflight_problems(self) -> list[Problem]:
        """``preflight.check``'s problems. A host that cannot be asked right now
        (``is_transient``: unreachable, a command timeout, a refused session) is a transient
        ``HOST_UNAVAILABLE`` problem after the checks were retried ``preflight_tries`` times;
        any other failure of a check is a fatal ``CHECK_FAILED``."""
        retrying = self._transient_retrying(self.preflight_tries, events.PreflightRetry)
        try:
            async for attempt in retrying:
                with attempt:
                    return await self.preflight_checks()
        except LauncherError as exc:
            if is_transient(exc):
                return [Problem(ProblemKind.HOST_UNAVAILABLE, f"host cannot be asked now: {exc}")]
            return [Problem(ProblemKind.CHECK_FAILED, str(exc))]
        raise AssertionError("unreachable")  # pragma: no cover (reraise=True)

    def _preflight_target(self, host: str) -> Target:
        """What this server needs of ``host``: its GPUs, its model path, its port."""
        s = self.server
        return Target(host, self.config.host(host).nvidia_smi, s.name, s.gpus, s.model_path,
                      s.port)

    async def preflight_checks(self) -> list[Problem]:
        """Extension point: every preflight problem of the unit, fatal ones first
        (``preflight.check``, waiting for a taken port through ``_port_taken``). A check
        that cannot be made raises; ``_preflight_problems`` retries what is transient."""
        s = self.server
        target = self._preflight_target(s.host)
        problems = await preflight.check(self.transport, target, port_check=self._port_taken)
        if self._port_wait_since is None or any(p.kind is ProblemKind.PORT_TAKEN
                                                for p in problems):
            return problems
        # Waited for the port: the GPUs' answer is old. Ask them again.
        gpus = await self.gpu_problems()
        if any(p.kind is ProblemKind.GPU_MISSING for p in gpus):
            return gpus
        return [p for p in problems if p.kind is not ProblemKind.GPU_BUSY] + gpus

    async def gpu_problems(self) -> list[Problem]:
        """Extension point: the unit's GPU problems alone (``preflight.check``); a missing
        GPU is one ``GPU_MISSING`` problem. Also what the wait for free GPUs asks."""
        target = replace(self._preflight_target(self.server.host), model_path=None, port=None)
        return await preflight.check(self.transport, target)

    async def _port_taken(self, transport: Transport, host: str, port: int) -> Problem | None:
        """None once ``port`` is free on ``host``, else the (fatal) problem naming its holder
        (a ``preflight.PortCheck``).

        SGLang's port is not reserved while the server is down: another user of the host can
        bind it during a restart. So a taken port is waited for like busy GPUs, polling once a
        second up to ``gpu_free_timeout`` from when this preflight first found it taken (one
        bound for every node and retry), with a ``port.waiting`` event naming the holder
        whenever it changes. Only a holder that runs as launcher's own user, before the server
        was ever ready in this run, is a problem at once: that is a mistake in this setup (two
        servers on one port, a server started by hand) that waiting would only hide.
        """
        told: PortHolder | None = None
        while True:
            holder = await port_holder(transport, port)
            if holder is None:
                return None
            problem = port_problem(host, port, holder)
            if holder.ours and self.machine.ready_at is None:
                return problem
            now = self.clock()
            if self._port_wait_since is None:
                self._port_wait_since = now
            waited = now - self._port_wait_since
            if waited >= self.policy.gpu_free_timeout:
                return replace(problem, message=f"{problem.message} for {waited:.0f} s "
                                                "(gpu_free_timeout)")
            if holder != told:
                told = holder
                self._emit(events.PortWaiting(
                    host=host, port=port, holder=holder.describe(),
                    wait_s=self.policy.gpu_free_timeout, uid=holder.uid, pid=holder.pid,
                ))
            await self.sleep(1.0)

    async def launch(self, action: Launch) -> None:
        """Extension point: start attempt ``action.attempt`` with ``action.params`` under
        ``_launching``; post ``Launched`` and start its tasks, or post why it failed
        (``Exited`` with a diagnosis, or ``HostRefused``)."""
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
            except HostKeyError as exc:
                self._attempt = None
                await self._post(HostRefused(str(exc)))
                return
            except LauncherError as exc:
                self._attempt = None  # nothing to follow or stop; the previous one is over
                self._emit(events.LaunchFailed(error=str(exc)))
                diag = classify([], None)
                diag.advice = str(exc)
                # A run directory that cannot be written, or is unsafe, fails every relaunch alike.
                diag.retryable = not isinstance(exc, (remote.RunDirUnwritable, RunDirUnsafe))
                await self._post(Exited(status=None, diagnosis=diag))
                return
            self._attempt = RunningAttempt(handle=handle, last_advance=self.clock())
            await self._post(Launched(pid=handle.pid))
            self._start_attempt_tasks(self._attempt)

    def _start_attempt_tasks(self, att: RunningAttempt) -> None:
        assert self._tg is not None
        self._tg.start_soon(self.follow_attempt, att)

    async def follow_attempt(self, att: RunningAttempt) -> None:
        """Extension point: follow the attempt (its log, its silence) inside ``att.scope``,
        posting what it shows, until it ends or the scope is cancelled."""
        with att.scope:
            async with anyio.create_task_group() as tg:
                att.tg = tg
                tg.start_soon(self._follow, att)
                tg.start_soon(self._stall_watch, att)

    async def _follow(self, att: RunningAttempt) -> None:
        splitter = LineSplitter()
        waits = Doubling(0.5, _OUTAGE_RETRY_MAX_S)
        hf = self.host_follower
        while True:
            if self._unreachable_since is not None and hf is None:
                # Say when the host is back even if the log stays silent after the outage
                # (the host follower says so itself, once its agent takes the server on).
                try:
                    await remote.log_age(self.transport, att.handle)
                except HostUnreachable as exc:
                    wait = waits.next()
                    self.host_unreachable(exc, wait)
                    await self._outage_wait(wait)
                    continue
                except LauncherError:
                    pass  # the host answered; the follow below reports what is wrong
                self.host_reachable()
            try:
                source = (hf.follow(att.handle, att.offset, on_attached=self.host_reachable)
                          if hf is not None
                          else remote.follow(self.transport, att.handle, att.offset))
                async for item in source:
                    if isinstance(item, remote.LogChunk):
                        att.offset = item.end_offset
                        att.last_advance = self.clock()
                        waits.reset()  # following works again: the next outage starts small
                        self.host_reachable()
                        for line in splitter.feed(item.data):
                            await self._on_line(att, line)
                    else:
                        for line in splitter.flush():
                            await self._on_line(att, line)
                        att.follower.finish()
                        diag = diagnose(att.follower, item.status, sglang_version=self.version)
                        await self._post(Exited(status=item.status, diagnosis=diag))
                        return
                return
            except HostKeyError as exc:
                await self._post(HostRefused(str(exc)))
                return
            except HostUnreachable as exc:
                wait = waits.next()
                self.host_unreachable(exc, wait)
                await self._outage_wait(wait)
            except LauncherError as exc:
                # The host answers but reading the log failed (e.g. its file vanished). A dead
                # server is reported with what the log showed so far; a live one is followed
                # again (a log that stops advancing is a stall).
                status = await self._status_of(att)
                if status is not None and not status.alive:
                    for line in splitter.flush():
                        await self._on_line(att, line)
                    att.follower.finish()
                    diag = diagnose(att.follower, status.exit_status, sglang_version=self.version)
                    await self._post(Exited(status=status.exit_status, diagnosis=diag))
                    return
                wait = waits.next()
                self._emit(events.FollowFailed(error=str(exc), retry_in_s=wait))
                await self.sleep(wait)

    async def _outage_wait(self, delay: float) -> None:
        """Sleep ``delay`` before following again, less once another task (a probe, the stall
        check) has reached the host again."""
        await sleep_or(self.sleep, delay, self._back)

    async def _on_line(self, att: RunningAttempt, line: str) -> None:
        # Masked whole before the follower keeps (and cuts) it: a secret cut in two at the
        # kept length would be masked in neither piece.
        for ev in att.follower.feed_line(self.redact.text(line)):
            if isinstance(ev, PhaseLine):
                await self._post(PhaseSeen(ev.phase))
            elif isinstance(ev, ReadyLine):
                await self._post(ReadyLineSeen())
        if att.follower.port_in_use is not None and not att.port_reported:
            att.port_reported = True
            await self._post(
                FatalLineSeen(diagnose(att.follower, None, sglang_version=self.version))
            )

    async def _stall_watch(self, att: RunningAttempt) -> None:
        """Post Stalled once the log has been silent past its phase's budget (confirmed by
        the log's age on the host). Event-driven: it sleeps until the budget can run out at
        the earliest (progress meanwhile re-arms it: the silence is measured again on
        waking) or until the phase or the host's reachability changes; no budget (before
        the first phase, when ready, unreachable, an infinite budget) means no timer."""
        budgets = self.policy.stall
        while True:
            wake = self._wake
            phase = self.machine.phase
            if phase is None or phase is Phase.READY:
                att.last_advance = self.clock()
                await wake.wait()
                continue
            budget = budgets.for_phase(phase)
            if self._unreachable_since is not None or math.isinf(budget):
                await wake.wait()  # silence is only counted while connected (and confirmed)
                continue
            silent = self.clock() - att.last_advance
            if silent <= budget:
                await sleep_or(self.sleep, budget - silent + self.tick, wake)
                continue
            # Confirm with the host: only the log's own age there says it is silent.
            age = await self._remote_silence(att)
            if age is None or self.machine.phase is not phase:
                continue
            if age <= budget:
                att.last_advance = self.clock() - age  # it wrote; our follower lags
                continue
            await self._post(Stalled(silent_s=age))
            return

    async def _remote_silence(self, att: RunningAttempt) -> float | None:
        """Seconds since the attempt's log changed, by the host's clock; None when the host
        is unreachable; what we saw locally when the host cannot tell (e.g. no log)."""
        try:
            age = await remote.log_age(self.transport, att.handle)
        except HostUnreachable as exc:
            self.host_unreachable(exc)
            return None
        except LauncherError:
            return self.clock() - att.last_advance
        self.host_reachable()
        return age

    async def _probe_loop(self, att: RunningAttempt) -> None:
        refused: BaseException | None = None
        try:
            await self._probe_forever(att)
        except* HostKeyError as group:  # raised inside the port forward's task group
            refused = group.exceptions[0]
            while isinstance(refused, BaseExceptionGroup):
                refused = refused.exceptions[0]
        if refused is not None:
            await self._post(HostRefused(str(refused)))

    async def _probe_forever(self, att: RunningAttempt) -> None:
        p = self.policy
        connect = health.prober_for(self.transport, self.server.port,
                                    self.server.probe_address)
        while True:
            started = self.clock()
            outages = self._outages if self._unreachable_since is None else -1
            ok, detail = await self._probe_once(connect, p.probe_timeout)
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
                self.host_reachable()
            elif running is False:
                detail += " (the server has exited)"
            elif running is None:
                detail += " (host unreachable)"
            self._to_hooks(events.Probed(ok=ok, latency_s=latency, detail=detail))
            if counts:
                await self._post(ProbeResult(ok=ok, detail=detail))
            delay = p.probe_interval if ready else min(0.5, p.probe_interval)
            if ready and self.host_follower is not None:
                # The host's tick (never later): its servers' probes go to its agent together.
                delay = self.host_follower.probe_delay(delay)
            await self.sleep(delay)

    async def _probe_once(self, connect: health.Connect, deadline_s: float,
                          ) -> tuple[bool, str]:
        """One /health probe: made by the host's agent when there is one (no channel or
        socket per probe), else one plain GET through the transport."""
        hf = self.host_follower
        if hf is not None:
            try:
                answer = await hf.probe(self.server.port, deadline_s,
                                        self.server.probe_address)
            except HostKeyError:
                raise
            except HostUnreachable as exc:
                return False, f"{type(exc).__name__}: {exc}"
            except LauncherError as exc:
                # The agent's channel ended (the agent died, e.g. on a forged attempt file):
                # not this server's failure. Ask the server the plain way this once; the
                # next probe starts a new agent (docs/security.md, finding L3).
                self.log.info("probe.agent_lost", error=str(exc)[:200])
                answer = None
            if answer is not None:
                return answer
        return await health.probe_health(connect, deadline_s)

    async def _status_of(self, att: RunningAttempt) -> remote.RunStatus | None:
        """A look at the attempt's process; None when the host cannot tell. HostKeyError
        propagates: that host must not be asked anything."""
        try:
            return await remote.probe(self.transport, att.handle)
        except HostKeyError:
            raise
        except LauncherError:
            return None

    async def _still_running(self, att: RunningAttempt) -> bool | None:
        """Whether the attempt's server process still lives: None when the host cannot be
        reached, True when it answers but cannot tell."""
        try:
            status = await remote.probe(self.transport, att.handle)
        except HostUnreachable as exc:
            self.host_unreachable(exc)
            return None
        except LauncherError:
            return True
        self.host_reachable()
        return status.alive

    async def _kill(self, reason: str) -> None:
        with anyio.CancelScope(shield=True):
            async with self._launching:  # a launch in flight: kill what it starts
                att = self._attempt
            if att is not None:
                att.scope.cancel()
        if att is not None:
            if self.before_stop is not None:
                with anyio.CancelScope(shield=True):
                    await self.before_stop(self.server.name, reason)
            await self.stop_attempt(att, reason)
            with anyio.CancelScope(shield=True):
                # Read after the stop, so the tail has the server's last words; a tail that
                # cannot be read must not keep the server from being stopped (hence apart).
                self._attempt_ended(att, await self.attempt_tail(att))
        await self._post(CleanedUp())

    async def attempt_tail(self, att: RunningAttempt) -> str:
        """Extension point: the end of the attempt's log, read after it was stopped (``""``
        and ``attempt.tail_unreadable`` when it cannot be read). Called shielded."""
        tail = b""
        try:
            tail = await remote.tail_log(self.transport, att.handle)
        except LauncherError as exc:
            self._emit(events.AttemptTailUnreadable(error=str(exc)))
        return tail.decode("utf-8", errors="replace")

    async def stop_attempt(self, att: RunningAttempt, reason: str) -> None:
        """Extension point: stop the attempt's processes; while the host is unreachable, wait
        and try again, so that no relaunch starts beside a server that could not be stopped.

        Each try is shielded from cancellation; the waits between tries are not, so shutting
        launcher down during an outage ends them (the server is left to the next launcher).
        """
        waits = Doubling(0.5, _OUTAGE_RETRY_MAX_S)
        while True:
            with anyio.CancelScope(shield=True):
                try:
                    report = await remote.stop(self.transport, att.handle, grace=5.0,
                                               kill_wait=5.0)
                except HostUnreachable as exc:
                    self.host_unreachable(exc, waits.current)
                except LauncherError as exc:
                    self._emit(events.ProcessStopFailed(reason=reason, error=str(exc)))
                    return
                else:
                    self.host_reachable()
                    self._emit(events.ProcessStopped(
                        reason=reason, signals=tuple(report.signals_sent),
                        leftover_pids=tuple(report.leftover_pids),
                    ))
                    return
            await self._outage_wait(waits.next())

    async def internal_error(self, exc: Exception) -> None:
        """Supervision raised ``exc``, which nothing expected (a bug, or input no parser
        bounds): log it with its traceback as ``server.internal_error`` (an ERROR), hand it
        to the hooks (Slack, metrics: the server shows as given up), give the server up
        (state, reason, the attempt's ``gave_up`` file for `status`: best effort, bounded).
        The server itself keeps running, unsupervised. Never raises (cancellation aside)."""
        error = describe_exception(exc)
        reason = f"launcher internal error: {error}"
        self.machine.abandon(reason)
        self._state_since = self.clock()
        att = self._attempt
        try:
            self._emit(events.ServerInternalError(
                error=error, traceback=format_traceback(exc),
                attempt=att.handle.attempt if att is not None else None))
        except Exception:  # logging and the hooks must not take the others down either
            self.log.exception("server.internal_error_unreported")
        if att is not None:
            await self._mark_gave_up(att.handle, reason)
        if self.on_change is not None:
            self.on_change()

    async def _mark_gave_up(self, handle: remote.RunHandle, reason: str) -> None:
        """Leave the give-up on the host (see remote.mark_gave_up); best effort, bounded: a
        host that cannot be reached now only loses `status`'s "gave up" wording."""
        with anyio.move_on_after(30.0, shield=True):
            try:
                await remote.mark_gave_up(self.transport, handle, self.redact.text(reason))
            except LauncherError as exc:
                self.log.warning("gave_up.unrecorded", error=str(exc))

    def _attempt_ended(self, att: RunningAttempt, tail: str) -> None:
        """Keep the tail locally and tell the hooks how the attempt ended."""
        diag = self.machine.pending
        self.tail_path = self._save_tail(att.handle.attempt, tail)
        self._to_hooks(self.redact(events.AttemptEnded(
            attempt=att.handle.attempt,
            params=self.machine.params,
            outcome=diag.outcome.value if diag else "stopped",
            phase=diag.phase.value if diag else None,
            numbers=diag.numbers.as_dict() if diag else {},
            evidence=tuple(diag.evidence) if diag else (),
            advice=diag.advice if diag else "",
            started_at=att.started_wall, ended_at=time.time(), log_tail=tail,
            tail_path=str(self.tail_path) if self.tail_path else None,
        )))

    def _ready_attempt_ended(self, att: RunningAttempt) -> None:
        self._to_hooks(events.AttemptEnded(
            attempt=att.handle.attempt, params=self.machine.params,
            outcome="ready", phase="ready", numbers=att.follower.numbers.as_dict(),
            evidence=(), advice="", started_at=att.started_wall,
            ended_at=time.time(), log_tail="", tail_path=None,
        ))

    def _save_tail(self, attempt: int, tail: str) -> Path | None:
        """Save the attempt's log tail as ``state_dir/logs/<server>/attempt-N.log``: each
        directory on the way checked to be ours alone, the file replaced by a rename, never
        written through a symlink (docs/security.md, finding M8). None (and a
        warning) when it cannot be saved."""
        try:
            folder = self.config.state_dir
            for name in ("logs", self.server.name):
                folder = folder / name
                make_private_dir(folder)
            path = folder / f"attempt-{attempt}.log"
            write_private_file(path, self.redact.text(tail).encode("utf-8"))
            return path
        except (OSError, StateError) as exc:
            self.log.warning("attempt.tail_not_saved", error=str(exc))
            return None

    async def _wait_for_gpus(self) -> None:
        deadline = self.clock() + self.policy.gpu_free_timeout
        problems: list[str] = []
        while self.clock() < deadline:
            try:
                problems = [str(p) for p in await self.gpu_problems()]
            except HostKeyError as exc:
                await self._post(HostRefused(str(exc)))
                return
            except LauncherError as exc:
                problems = [str(exc)]
            if not problems:
                await self._post(GpusFree())
                return
            self._emit(events.GpuWaiting(problems=tuple(problems)))
            await self.sleep(1.0)
        await self._post(GpuWaitTimedOut(holder="; ".join(problems)))

    async def _sleep_then(self, seconds: float, event: LifecycleInput) -> None:
        await self.sleep(seconds)
        await self._post(event)

    async def _deadline_watch(self) -> None:
        """Post DeadlineExceeded once per start-up sequence that outlasts the deadline.

        It keeps watching afterwards: a restart after ready is a new sequence with its own
        deadline. Failures while serving are not start-ups (``was_ready``). The deadline is
        a cancel scope around waiting for a change, re-made whenever the state changes.
        """
        fired_for: float | None = None
        while True:
            wake = self._wake
            m = self.machine
            if (
                m.started_at is None
                or m.started_at == fired_for
                or m.was_ready
                or m.state in (State.READY, State.BACKING_OFF)
                or m.state.terminal
                or self._unreachable_since is not None  # decided once the host answers again
            ):
                await wake.wait()
                continue
            left = m.started_at + self.policy.start_deadline - self.clock()
            if left >= 0:
                await sleep_or(self.sleep, left + 0.001, wake)
                continue
            fired_for = m.started_at
            await self._post(DeadlineExceeded())

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
    changed = anyio.Event()

    def on_change() -> None:
        changed.set()

    followers = followers_for([s.transport for s in supervisors])
    async with anyio.create_task_group() as outer:
        for follower in followers.values():
            await outer.start(follower.run)
        for sup in supervisors:
            if sup.host_follower is None:
                sup.host_follower = followers.get(id(sup.transport))
            sup.on_change = on_change
        async with anyio.create_task_group() as tg:

            async def one(sup: ServerSupervisor) -> None:
                try:
                    results[sup.server.name] = await sup.run()
                except Exception as exc:  # never cancellation (BaseException): that one ends
                    reraise_lease_lost(exc)  # the lease is lost: no failure, end it all
                    # One server's supervision failed (a bug): give that one up and keep
                    # the others (docs/security.md, finding H1).
                    await sup.internal_error(exc)
                    results[sup.server.name] = sup.state
                on_change()

            async def ticks(tick: Callable[[], Awaitable[None]]) -> None:
                while True:  # the live view's refresh, not a check of the servers
                    await anyio.sleep(0.2)
                    await tick()

            for sup in supervisors:
                tg.start_soon(one, sup)
            if on_tick is not None:
                tg.start_soon(ticks, on_tick)
            stop_asked = False
            while True:
                changed = anyio.Event()
                states = [s.state for s in supervisors]
                if all(st.terminal for st in states):
                    break
                if until_ready and not stop_asked and all(
                    st in (State.READY, State.GAVE_UP) or st.terminal for st in states
                ):
                    stop_asked = True
                    for s in supervisors:
                        s.request_stop(kill=False)
                await changed.wait()
            tg.cancel_scope.cancel()
        outer.cancel_scope.cancel()
    for sup in supervisors:
        results.setdefault(sup.server.name, sup.state)
    return results

