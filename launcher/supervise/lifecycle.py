"""The pure start-up/keep-up state machine of one server.

The supervisor feeds it events (from the log, the process, the HTTP probe, the clock) and
executes the actions it returns. It does no I/O and reads no clock: ``now`` comes with every
event, so tests replay histories exactly.

    PREFLIGHT ─ok─▶ LAUNCHING ─launched─▶ INIT ▶ WEIGHTS ▶ KV_CACHE ▶ CUDA_GRAPH ▶ WARMUP
        │ busy                                  (log phases only move forward)       │ ready line
        ▼                                                                            ▼ + probe ok
    WAITING_FOR_GPUS ◀─cleaned─ CLEANING_UP ◀─died / stalled / fatal line──────── READY
        │ free: policy picks the next params                       ▲  (N failed probes, death)
        ├──▶ LAUNCHING (start-up failure, retryable)               │
        ├──▶ BACKING_OFF ──elapsed──▶ PREFLIGHT  (after ready)      │
        └──▶ GAVE_UP (fatal outcome, policy gave up, deadline, budget)
    any ─stop─▶ STOPPED
"""

from __future__ import annotations

import enum
from dataclasses import dataclass, field

from launcher.errors import IllegalTransition
from launcher.memory.estimate import Estimate
from launcher.memory.policy import AttemptRecord, Bounds, next_params
from launcher.params import LaunchParams
from launcher.sglang.outcome import Confidence, Diagnosis, Outcome
from launcher.sglang.phases import Phase
from launcher.supervise import events
from launcher.supervise.backoff import RestartBackoff


class State(enum.StrEnum):
    """Where one server's supervision is. Values are stable (status output, metrics)."""

    IDLE = "idle"  # not started yet
    UNKNOWN = "unknown"  # whether it runs cannot be told (its attempts could not be listed)
    PREFLIGHT = "preflight"  # checking GPUs, port, model path before an attempt
    LAUNCHING = "launching"  # the launch command is running on the host
    INIT = "init"  # process up, distributed init
    WEIGHTS = "weights"  # loading weights
    KV_CACHE = "kv_cache"  # allocating the KV pool
    CUDA_GRAPH = "cuda_graph"  # capturing CUDA graphs
    WARMUP = "warmup"  # HTTP up, warmup request / waiting for the ready line and probe
    READY = "ready"  # ready line seen and /health answered 200
    CLEANING_UP = "cleaning_up"  # killing what is left of a failed attempt
    WAITING_FOR_GPUS = "waiting_for_gpus"  # waiting until the GPUs are released
    BACKING_OFF = "backing_off"  # waiting before relaunching a server that had been ready
    GAVE_UP = "gave_up"  # terminal: a person must act (reason says what)
    STOPPED = "stopped"  # terminal: supervision ended on request

    @property
    def running(self) -> bool:
        return self in _RUNNING

    @property
    def terminal(self) -> bool:
        return self in (State.GAVE_UP, State.STOPPED)


_RUNNING = frozenset(
    {State.INIT, State.WEIGHTS, State.KV_CACHE, State.CUDA_GRAPH, State.WARMUP, State.READY}
)
_PHASE_STATE = {
    Phase.INIT: State.INIT,
    Phase.WEIGHTS: State.WEIGHTS,
    Phase.KV_CACHE: State.KV_CACHE,
    Phase.CUDA_GRAPH: State.CUDA_GRAPH,
    Phase.WARMUP: State.WARMUP,
}


# --- events -----------------------------------------------------------------------------


@dataclass(frozen=True)
class Start:
    """Begin supervising (first preflight)."""


@dataclass(frozen=True)
class Unknown:
    """The host's attempts of this server could not be listed: it may be running, so nothing
    may be launched (a second copy) until a listing succeeds."""

    reason: str


@dataclass(frozen=True)
class PreflightPassed:
    """GPUs, port, model path and version are fine."""


@dataclass(frozen=True)
class PreflightBlocked:
    """Preflight found a problem. Transient ones (GPUs busy) wait; others are fatal."""

    reason: str
    transient: bool


@dataclass(frozen=True)
class Launched:
    """The server process started (detached)."""

    pid: int


@dataclass(frozen=True)
class Adopted:
    """A running server from an earlier launcher was found and is followed instead."""

    pid: int
    attempt: int
    params: LaunchParams
    started_wall: float | None = None  # when the attempt was launched (epoch s), if known


@dataclass(frozen=True)
class PhaseSeen:
    """The log entered a start-up phase."""

    phase: Phase


@dataclass(frozen=True)
class ReadyLineSeen:
    """The log printed SGLang's ready line."""


@dataclass(frozen=True)
class FatalLineSeen:
    """The log shows a fatal error while the process still lives (e.g. port in use)."""

    diagnosis: Diagnosis


@dataclass(frozen=True)
class Exited:
    """The server process ended; ``diagnosis`` classifies its log tail and exit status."""

    status: int | None
    diagnosis: Diagnosis


@dataclass(frozen=True)
class Stalled:
    """The log has not advanced for the current phase's budget while the process lives.
    ``where`` names the rank that stalled when the server spans several nodes."""

    silent_s: float
    where: str = ""


@dataclass(frozen=True)
class ProbeResult:
    """One HTTP /health probe."""

    ok: bool
    detail: str = ""


@dataclass(frozen=True)
class CleanedUp:
    """What was left of the attempt has been killed."""


@dataclass(frozen=True)
class GpusFree:
    """The server's GPUs are free again."""


@dataclass(frozen=True)
class GpuWaitTimedOut:
    """The GPUs stayed held for the whole wait; ``holder`` names who holds them."""

    holder: str


@dataclass(frozen=True)
class BackoffElapsed:
    """The restart backoff is over."""


@dataclass(frozen=True)
class DeadlineExceeded:
    """The total start-up deadline passed."""


@dataclass(frozen=True)
class HostRefused:
    """The host cannot be used: its key changed (or is unknown) or it rejected our
    credentials. Nothing more may be sent to it, so supervision of this server ends at once
    (the server is left as it is)."""

    reason: str


@dataclass(frozen=True)
class StopRequested:
    """Stop supervising; ``kill`` also stops the server."""

    kill: bool


LifecycleInput = (
    Start
    | Unknown
    | PreflightPassed
    | PreflightBlocked
    | Launched
    | Adopted
    | PhaseSeen
    | ReadyLineSeen
    | FatalLineSeen
    | Exited
    | Stalled
    | ProbeResult
    | CleanedUp
    | GpusFree
    | GpuWaitTimedOut
    | BackoffElapsed
    | DeadlineExceeded
    | HostRefused
    | StopRequested
)


# --- actions ----------------------------------------------------------------------------


@dataclass(frozen=True)
class RunPreflight:
    pass


@dataclass(frozen=True)
class Launch:
    attempt: int
    params: LaunchParams


@dataclass(frozen=True)
class Kill:
    reason: str


@dataclass(frozen=True)
class WaitForGpus:
    pass


@dataclass(frozen=True)
class StartProbing:
    pass


@dataclass(frozen=True)
class Sleep:
    seconds: float


@dataclass(frozen=True)
class Emit:
    """A structured event for the log, the hooks (ledger, Slack, metrics) and the router."""

    event: events.Event


Action = RunPreflight | Launch | Kill | WaitForGpus | StartProbing | Sleep | Emit


class AfterCleanup(enum.Enum):
    """CLEANING_UP's sub-states: what follows once the attempt's processes are gone."""

    RETRY = "retry"  # wait for the GPUs, then the policy (start-up) or the restart backoff
    GIVE_UP = "give_up"  # a failure that must not be retried, or the deadline: give up
    STOP = "stop"  # a requested stop: end STOPPED (it wins over GIVE_UP)


@dataclass
class Limits:
    """The parts of the policy the machine enforces itself."""

    bounds: Bounds
    max_stalls: int = 2
    probe_failures: int = 3
    start_deadline: float = 1800.0
    tp: int | None = None  # helps the policy resolve auto params the log did not show
    sglang_version: str | None = None
    # The first attempt's memory estimate: its graph figure sizes the graph bs of the relaunch
    # after a pool too small (``next_params(..., estimate=)``).
    estimate: Estimate | None = None


@dataclass
class ServerMachine:
    """State of one server's supervision. Feed events with :meth:`handle`."""

    initial: LaunchParams
    limits: Limits
    restart: RestartBackoff
    initial_reason: str = ""  # why the first attempt runs ``initial`` (estimate, ledger, config)
    state: State = State.IDLE
    attempt: int = 0  # the host's attempt number (run directories are numbered on from it)
    attempt_base: int = 0  # attempts already on the host before this supervision started
    params: LaunchParams | None = None  # params of the current / last attempt
    last_good: LaunchParams | None = None  # params that reached ready
    history: list[AttemptRecord] = field(default_factory=list)
    history_attempts: list[int] = field(default_factory=list)  # attempt number per record
    adopted: bool = False  # the current attempt was adopted, not launched by this machine
    reason: str = ""  # why it gave up / stopped
    pid: int | None = None
    ready_line: bool = False
    was_ready: bool = False  # the current attempt reached READY
    probe_failures: int = 0
    stalls: int = 0
    started_at: float | None = None  # of the current start-up sequence (deadline)
    attempt_started_at: float | None = None
    ready_at: float | None = None
    # What the policy decides from: ``history`` plus a READY record for each attempt that had
    # reached ready before it failed, so max_attempts counts from the last ready attempt.
    _policy_history: list[AttemptRecord] = field(default_factory=list)
    _pending: Diagnosis | None = None  # failure being cleaned up
    _after_cleanup: AfterCleanup = AfterCleanup.RETRY
    _give_up_reason: str = ""  # with AfterCleanup.GIVE_UP

    # -- public -----------------------------------------------------------------------

    def abandon(self, reason: str) -> None:
        """Supervision failed outside the machine (an exception nothing expected, a bug): it
        is over, given up with ``reason``, whatever the state. No actions: the supervisor's
        loop has ended already."""
        self.state = State.GAVE_UP
        self.reason = reason

    def handle(self, event: LifecycleInput, now: float) -> list[Action]:
        """Apply ``event`` at time ``now``; return what the supervisor must do next."""
        if isinstance(event, StopRequested):
            return self._stop(event)
        if self.state.terminal and not isinstance(event, Start):
            return []  # late events after the end (a probe in flight, a follower exiting)
        # A match, not getattr dispatch: mypy then checks that every event of the Event union
        # has its handler (a missing case leaves a path without a return, a mypy error, so no
        # unreachable ``case _`` is needed). Each handler takes only what it reads (the event,
        # ``now``): an argument a handler ignores would be a value no test can pin.
        match event:
            case Unknown():
                return self._on_Unknown(event)
            case Start():
                return self._on_Start(event, now)
            case PreflightPassed():
                return self._on_PreflightPassed(event, now)
            case PreflightBlocked():
                return self._on_PreflightBlocked(event)
            case Launched():
                return self._on_Launched(event)
            case Adopted():
                return self._on_Adopted(event, now)
            case PhaseSeen():
                return self._on_PhaseSeen(event)
            case ReadyLineSeen():
                return self._on_ReadyLineSeen()
            case FatalLineSeen():
                return self._on_FatalLineSeen(event)
            case Exited():
                return self._on_Exited(event)
            case Stalled():
                return self._on_Stalled(event)
            case ProbeResult():
                return self._on_ProbeResult(event, now)
            case CleanedUp():
                return self._on_CleanedUp(event)
            case GpusFree():
                return self._on_GpusFree(event, now)
            case GpuWaitTimedOut():
                return self._on_GpuWaitTimedOut(event)
            case BackoffElapsed():
                return self._on_BackoffElapsed(event, now)
            case DeadlineExceeded():
                return self._on_DeadlineExceeded()
            case HostRefused():
                return self._on_HostRefused(event)

    @property
    def pending(self) -> Diagnosis | None:
        """The failure being cleaned up, if any."""
        return self._pending

    @property
    def phase(self) -> Phase | None:
        for ph, st in _PHASE_STATE.items():
            if st is self.state:
                return ph
        return Phase.READY if self.state is State.READY else None

    # -- handlers ---------------------------------------------------------------------

    def _illegal(self, event: LifecycleInput) -> IllegalTransition:
        return IllegalTransition(f"{type(event).__name__} in state {self.state.value}")

    def _on_Unknown(self, event: Unknown) -> list[Action]:
        if self.state not in (State.IDLE, State.UNKNOWN):
            raise self._illegal(event)
        first = self.state is State.IDLE
        self.state = State.UNKNOWN
        self.reason = event.reason
        return [Emit(events.ServerUnknown(reason=event.reason))] if first else []

    def _on_Start(self, event: Start, now: float) -> list[Action]:
        if self.state not in (State.IDLE, State.UNKNOWN, State.STOPPED, State.GAVE_UP):
            raise self._illegal(event)
        self.state = State.PREFLIGHT
        self.started_at = now
        self.reason = ""
        self.params = self.params or self.initial
        return [RunPreflight()]

    def _on_PreflightPassed(self, event: PreflightPassed, now: float) -> list[Action]:
        if self.state is not State.PREFLIGHT:
            raise self._illegal(event)
        return self._launch(now)

    def _on_PreflightBlocked(self, event: PreflightBlocked) -> list[Action]:
        if self.state is not State.PREFLIGHT:
            raise self._illegal(event)
        if event.transient:
            self.state = State.WAITING_FOR_GPUS
            return [Emit(events.GpuWaiting(reason=event.reason)), WaitForGpus()]
        return self._give_up(f"preflight: {event.reason}")

    def _on_Launched(self, event: Launched) -> list[Action]:
        if self.state is State.CLEANING_UP:
            # A stop with kill (or the deadline) came while the launch ran: the kill in
            # progress waits for the launch to finish and stops this very process.
            self.pid = event.pid
            return []
        if self.state is not State.LAUNCHING:
            raise self._illegal(event)
        self.pid = event.pid
        self.state = State.INIT
        return [Emit(events.PhaseEntered(phase=Phase.INIT, attempt=self.attempt))]

    def _on_Adopted(self, event: Adopted, now: float) -> list[Action]:
        if self.state not in (State.IDLE, State.UNKNOWN, State.PREFLIGHT):
            raise self._illegal(event)
        self.reason = ""
        self.pid = event.pid
        self.attempt = event.attempt
        self.attempt_base = event.attempt - 1  # the adopted attempt counts as this run's first
        self.params = event.params
        self.started_at = self.attempt_started_at = now
        self.state = State.INIT
        self._reset_attempt()
        self.adopted = True
        return [
            Emit(events.ServerAdopted(pid=event.pid, attempt=event.attempt, params=event.params,
                                      started_at=event.started_wall))
        ]

    def _on_PhaseSeen(self, event: PhaseSeen) -> list[Action]:
        if event.phase is Phase.READY:
            return self._on_ReadyLineSeen()
        target = _PHASE_STATE[event.phase]
        if not self.state.running or self.state is State.READY:
            return []  # phases only matter during start-up
        if list(_PHASE_STATE.values()).index(target) <= list(_PHASE_STATE.values()).index(
            self.state
        ):
            return []  # phases only move forward (another rank's late line)
        self.state = target
        return [Emit(events.PhaseEntered(phase=event.phase, attempt=self.attempt))]

    def _on_ReadyLineSeen(self) -> list[Action]:
        if not self.state.running or self.state is State.READY or self.ready_line:
            return []  # the ready line arrives as a phase and as a line: probe once
        self.ready_line = True
        actions: list[Action] = []
        if self.state is not State.WARMUP:
            self.state = State.WARMUP
            actions.append(Emit(events.PhaseEntered(phase=Phase.WARMUP, attempt=self.attempt)))
        return [*actions, StartProbing()]

    def _on_FatalLineSeen(self, event: FatalLineSeen) -> list[Action]:
        if not self.state.running:
            return []
        return self._fail(event.diagnosis)  # killed with the outcome as reason

    def _on_Exited(self, event: Exited) -> list[Action]:
        if self.state is State.CLEANING_UP:
            return []  # we killed it; the cleanup reports back separately
        if not self.state.running and self.state is not State.LAUNCHING:
            return []
        died = [
            Emit(events.ProcessDied(exit_status=event.status, phase=_ph(self),
                                    attempt=self.attempt))
        ]
        return died + self._fail(event.diagnosis)

    def _on_Stalled(self, event: Stalled) -> list[Action]:
        if not self.state.running or self.state is State.READY:
            return []
        self.stalls += 1
        phase = self.phase or Phase.INIT
        diag = Diagnosis(
            outcome=Outcome.HANG,
            phase=phase,
            retryable=True,
            advice=f"no log progress for {event.silent_s:.0f}s in {phase.value}"
            + (f" on {event.where}" if event.where else ""),
        )
        emit = Emit(events.StallDetected(phase=phase, silent_s=round(event.silent_s, 2),
                                         attempt=self.attempt))
        return [emit, *self._fail(diag, kill_reason="stall")]

    def _on_ProbeResult(self, event: ProbeResult, now: float) -> list[Action]:
        if self.state is State.WARMUP and self.ready_line:
            if not event.ok:
                return []  # keep probing: warm-up probes may fail until the server is Up
            return self._ready(now)
        if self.state is not State.READY:
            return []
        if event.ok:
            self.probe_failures = 0
            self.restart.on_healthy(now)
            return []
        self.probe_failures += 1
        if self.probe_failures < self.limits.probe_failures:
            return [
                Emit(events.ProbeFailed(consecutive=self.probe_failures, detail=event.detail))
            ]
        diag = Diagnosis(
            outcome=Outcome.HANG,
            phase=Phase.READY,
            retryable=True,
            advice=f"{self.probe_failures} failed /health probes in a row",
        )
        emit = Emit(events.ServerUnhealthy(consecutive_failures=self.probe_failures,
                                           detail=event.detail))
        return [emit, *self._fail(diag, kill_reason="unhealthy")]

    def _on_CleanedUp(self, event: CleanedUp) -> list[Action]:
        if self.state is not State.CLEANING_UP:
            raise self._illegal(event)
        self.pid = None  # the attempt's processes are gone
        match self._after_cleanup:
            case AfterCleanup.STOP:
                self.state = State.STOPPED
                return [Emit(events.ServerStopped(reason=self.reason, left_running=None))]
            case AfterCleanup.GIVE_UP:
                return self._give_up(self._give_up_reason)
            case AfterCleanup.RETRY:
                self.state = State.WAITING_FOR_GPUS
                return [WaitForGpus()]

    def _on_GpusFree(self, event: GpusFree, now: float) -> list[Action]:
        if self.state is not State.WAITING_FOR_GPUS:
            raise self._illegal(event)
        if self._pending is None:  # waited in a preflight (not after a failure): check again
            self.state = State.PREFLIGHT
            return [RunPreflight()]
        return self._after_failure(now)

    def _on_GpuWaitTimedOut(self, event: GpuWaitTimedOut) -> list[Action]:
        if self.state is not State.WAITING_FOR_GPUS:
            raise self._illegal(event)
        return self._give_up(f"GPUs still in use after waiting: {event.holder}")

    def _on_BackoffElapsed(self, event: BackoffElapsed, now: float) -> list[Action]:
        if self.state is not State.BACKING_OFF:
            raise self._illegal(event)
        self.state = State.PREFLIGHT
        self.started_at = now  # a new start-up sequence: the deadline counts from here
        self.was_ready = False
        return [RunPreflight()]

    def _on_DeadlineExceeded(self) -> list[Action]:
        if self.state in (State.READY, State.BACKING_OFF):  # (``handle`` drops it once terminal)
            return []
        if self.was_ready:
            return []  # cleaning up after a failure while serving: not a start-up
        if self._after_cleanup is AfterCleanup.STOP:
            return []  # a requested stop is being carried out: it ends STOPPED, not GAVE_UP
        reason = f"start-up deadline of {self.limits.start_deadline:.0f}s passed"
        if self.state.running or self.state is State.LAUNCHING:
            self._clean_up_then_give_up(reason)
            self.state = State.CLEANING_UP
            return [Kill("deadline")]
        return self._give_up(reason)

    def _on_HostRefused(self, event: HostRefused) -> list[Action]:
        # No Kill: killing needs commands on a host we no longer trust.
        return self._give_up(event.reason)

    # -- helpers ----------------------------------------------------------------------

    def _reset_attempt(self) -> None:
        self.ready_line = False
        self.was_ready = False
        self.probe_failures = 0
        self._pending = None
        if self._after_cleanup is AfterCleanup.GIVE_UP:
            # ``_give_up_reason`` is read only under GIVE_UP, which sets it: left as it is.
            self._after_cleanup = AfterCleanup.RETRY

    def _launch(self, now: float) -> list[Action]:
        assert self.params is not None
        self.attempt += 1
        self.state = State.LAUNCHING
        self.attempt_started_at = now
        self.adopted = False
        self._reset_attempt()
        # The first attempt says where its params came from.
        first = not self.history and self.initial_reason and self.params == self.initial
        started = events.AttemptStarted(attempt=self.attempt, params=self.params,
                                        why=self.initial_reason if first else None)
        return [Emit(started), Launch(self.attempt, self.params)]

    def _ready(self, now: float) -> list[Action]:
        self.state = State.READY
        self.was_ready = True
        self.ready_at = now
        self.last_good = self.params
        self.restart.on_healthy(now)
        # ``attempt`` is the host's attempt number, the one every view uses (run directory,
        # ledger row, status, Slack); ``attempts`` only counts this supervision's attempts.
        # An adopted attempt that turns out ready was not brought up by us: how long it took
        # is not known here (``seconds`` None), and it is no fresh "ready".
        assert self.params is not None
        elapsed = now - (self.started_at if self.started_at is not None else now)
        attempt_elapsed = now - (
            self.attempt_started_at if self.attempt_started_at is not None else now)
        return [
            Emit(events.ServerReady(
                attempt=self.attempt,
                attempts=self.attempt - self.attempt_base,
                seconds=None if self.adopted else round(elapsed, 2),
                attempt_seconds=None if self.adopted else round(attempt_elapsed, 2),
                adopted=self.adopted,
                params=self.params,
                history=self._history(),
            ))
        ]

    def _fail(self, diag: Diagnosis, *, kill_reason: str = "") -> list[Action]:
        """Record the attempt's failure and start cleaning up: kill it with ``kill_reason``, or
        with the outcome's name when none is given."""
        assert self.params is not None
        outcome, retryable = diag.outcome, diag.retryable
        if outcome is Outcome.OOM_WEIGHTS and diag.confidence is Confidence.WEAK:
            # Only hints say the weights did not fit (no phase line, no telling frame): treat it
            # as an OOM of unknown kind, retried lower within bounds, never a final give-up.
            outcome, retryable = Outcome.OOM_RUNTIME, True
        # Events, the ledger and Slack keep the classifier's verdict; only the policy sees
        # the weak weights OOM as one of unknown kind (one story for the operator).
        self.history.append(AttemptRecord(self.params, diag.outcome, diag.phase, diag.numbers))
        self.history_attempts.append(self.attempt)
        self._policy_history.append(AttemptRecord(self.params, outcome, diag.phase, diag.numbers))
        self._pending = diag
        after_ready = self.was_ready
        self.state = State.CLEANING_UP
        fail = Emit(events.AttemptFailed(
            attempt=self.attempt,
            outcome=diag.outcome,
            confidence=diag.confidence,
            phase=diag.phase,
            numbers=diag.numbers.as_dict(),
            retryable=diag.retryable,
            after_ready=after_ready,
            evidence=tuple(diag.evidence[-3:]),
            advice=diag.advice,
        ))
        if (
            diag.outcome is Outcome.HANG
            and not after_ready
            and self.stalls > self.limits.max_stalls
        ):
            self._clean_up_then_give_up(
                f"stalled {self.stalls} times (last in {diag.phase.value})")
        elif not retryable and not after_ready:
            self._clean_up_then_give_up(
                f"{diag.outcome.value} in {diag.phase.value}: {diag.advice}{_quoted(diag)}")
        return [fail, Kill(kill_reason or diag.outcome.value)]

    def _after_failure(self, now: float) -> list[Action]:
        diag = self._pending
        assert diag is not None
        assert self.params is not None
        self._pending = None  # handled: a later GPU wait is a preflight's, not this failure's
        if self.was_ready:  # relaunch with the last good params under restart backoff
            delay = self.restart.on_failure(now)
            if delay is None:
                return self._give_up("restart budget exhausted after ready")
            self.params = self.last_good or self.params
            self._policy_history.append(
                AttemptRecord(self.params, Outcome.READY, Phase.READY, diag.numbers)
            )
            self.state = State.BACKING_OFF
            self.stalls = 0
            # The budget left after this restart: what the person on call reads first.
            left = max(0, self.restart.budget - self.restart.restarts_in_window(now))
            return [
                Emit(events.RestartScheduled(
                    delay_s=round(delay, 2), params=self.params,
                    attempt=self.attempt, restarts_left=left,
                    restart_budget=self.restart.budget,
                    restart_window_s=self.restart.window,
                )),
                Sleep(delay),
            ]
        if self.started_at is not None and now - self.started_at > self.limits.start_deadline:
            return self._give_up(f"start-up deadline of {self.limits.start_deadline:.0f}s passed")
        decision = next_params(self.initial, self.limits.bounds, self._policy_history,
                               tp=self.limits.tp, sglang_version=self.limits.sglang_version,
                               estimate=self.limits.estimate)
        if decision.params is None:
            return self._give_up(decision.reason)
        self.params = decision.params
        return [
            Emit(events.PolicyDecided(params=decision.params, reason=decision.reason)),
            *self._launch(now),
        ]

    def _give_up(self, reason: str) -> list[Action]:
        self.state = State.GAVE_UP
        self.reason = reason
        return [
            Emit(events.ServerGaveUp(
                reason=reason,
                attempt=self.attempt,
                attempts=self.attempt - self.attempt_base,
                history=self._history(),
            ))
        ]

    def _clean_up_then_give_up(self, reason: str) -> None:
        """Give up with ``reason`` once cleaned up, unless a stop was asked for already."""
        if self._after_cleanup is not AfterCleanup.STOP:
            self._after_cleanup = AfterCleanup.GIVE_UP
            self._give_up_reason = reason

    def _history(self) -> tuple[events.HistoryEntry, ...]:
        return tuple(events.HistoryEntry(params=r.params, outcome=r.outcome, phase=r.phase,
                                         attempt=n)
                     for r, n in zip(self.history, self.history_attempts, strict=True))

    def _stop(self, event: StopRequested) -> list[Action]:
        self.reason = "stop requested"
        if event.kill and (self.state.running or self.state is State.LAUNCHING):
            self._after_cleanup = AfterCleanup.STOP
            self.state = State.CLEANING_UP
            return [Kill("stop")]
        if self.state is State.CLEANING_UP:
            self._after_cleanup = AfterCleanup.STOP
            return []
        # Only a server that runs now is left running (not the dead one of a failed attempt).
        alive = self.state.running or self.state is State.LAUNCHING
        left = self.pid if alive and not event.kill else None
        self.state = State.STOPPED
        return [Emit(events.ServerStopped(reason=self.reason, left_running=left))]


def _quoted(diag: Diagnosis, limit: int = 240) -> str:
    """The decisive log line, for a reason a person reads without opening the log."""
    if not diag.evidence:
        return ""
    line = diag.evidence[-1].strip()
    if len(line) > limit:
        line = line[: limit - 3] + "..."
    return f" (log: {line})"


def _ph(m: ServerMachine) -> str:
    phase = m.phase
    return phase.value if phase else m.state.value

