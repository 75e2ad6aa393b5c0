"""The state machine's dispatch, its ``Unknown`` state, and payloads the contract tests leave open.

Written from the mutation run (docs/testing.md, "Mutation testing"):
what an ``Unknown`` event (the host's attempts could not be listed) does in each state, which
events a terminal machine ignores, where the first attempt's params came from, start-up
times that do not begin at 0, and the rank a stall names. Pure: no I/O, times are passed in.
Whole actions and whole typed event payloads are asserted.
"""

from __future__ import annotations

import re
from collections.abc import Callable

import pytest

from launcher.errors import IllegalTransition
from launcher.memory.policy import Bounds
from launcher.params import LaunchParams
from launcher.sglang.outcome import Confidence, Diagnosis, Outcome
from launcher.sglang.phases import Phase
from launcher.supervise import events
from launcher.supervise.backoff import Jitter, RestartBackoff
from launcher.supervise.lifecycle import (
    Adopted,
    BackoffElapsed,
    CleanedUp,
    Emit,
    Exited,
    GpusFree,
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
    Stalled,
    Start,
    State,
    StopRequested,
    Unknown,
)

INITIAL = LaunchParams(0.70, 32)
LISTING = "cannot list its attempts on gpu1: ssh: connect timed out"


def machine(initial_reason: str = "") -> ServerMachine:
    return ServerMachine(
        initial=INITIAL,
        initial_reason=initial_reason,
        limits=Limits(bounds=Bounds(0.5, 0.95, 1, 6)),
        restart=RestartBackoff(10.0, 600.0, 1800.0, 3, 3600.0, jitter=Jitter.NONE),
    )


def unknown(m: ServerMachine, t: float = 0.0, reason: str = LISTING) -> None:
    m.handle(Unknown(reason), t)
    assert State.UNKNOWN is m.state


# --- Unknown -----------------------------------------------------------------------------


def test_unknown_before_the_start_is_reported_once_with_its_reason() -> None:
    """A fresh machine whose host cannot be listed enters UNKNOWN and says why; it launches
    nothing (a copy may already run there)."""
    m = machine()
    assert [Emit(events.ServerUnknown(reason=LISTING))] == m.handle(Unknown(LISTING), 3)
    assert (State.UNKNOWN, LISTING, 0, None, None) == (
        m.state, m.reason, m.attempt, m.params, m.started_at)


def test_repeated_unknown_is_silent_but_keeps_the_latest_reason() -> None:
    """Each failed listing retry sends Unknown again: no second server.unknown, and the
    reason (what status shows) is the latest listing error."""
    m = machine()
    unknown(m)
    assert [] == m.handle(Unknown("cannot list its attempts on gpu1: auth agent gone"), 9)
    assert (State.UNKNOWN, "cannot list its attempts on gpu1: auth agent gone") == (
        m.state, m.reason)


def test_start_after_unknown_begins_the_start_up_and_clears_the_reason() -> None:
    """Once a listing succeeds and shows nothing running, Start runs the first preflight; the
    deadline counts from then, not from the first failed listing."""
    m = machine()
    unknown(m, 1)
    assert [RunPreflight()] == m.handle(Start(), 40)
    assert (State.PREFLIGHT, "", 40, INITIAL) == (m.state, m.reason, m.started_at, m.params)


def test_adopting_after_unknown_follows_the_running_server() -> None:
    """A listing that succeeds and shows a running attempt adopts it from UNKNOWN."""
    m = machine()
    unknown(m, 1)
    actions = m.handle(Adopted(pid=7, attempt=2, params=INITIAL), 30)
    assert [Emit(events.ServerAdopted(pid=7, attempt=2, params=INITIAL, started_at=None))] == (
        actions)
    assert (State.INIT, "", 7, 30) == (m.state, m.reason, m.pid, m.started_at)


def test_stop_while_unknown_ends_stopped_leaving_nothing_running() -> None:
    m = machine()
    unknown(m)
    assert [Emit(events.ServerStopped(reason="stop requested", left_running=None))] == (
        m.handle(StopRequested(kill=True), 2))
    assert State.STOPPED is m.state


def test_host_refused_while_unknown_gives_up_with_its_reason() -> None:
    m = machine()
    unknown(m)
    reason = "cannot list its attempts on gpu1: host key changed"
    assert [Emit(events.ServerGaveUp(reason=reason, attempt=0, attempts=0, history=()))] == (
        m.handle(HostRefused(reason), 2))
    assert (State.GAVE_UP, reason) == (m.state, m.reason)


def _preflight(m: ServerMachine) -> None:
    m.handle(Start(), 0)


def _init(m: ServerMachine) -> None:
    _preflight(m)
    m.handle(PreflightPassed(), 0)
    m.handle(Launched(pid=100), 0)


def _ready(m: ServerMachine) -> None:
    _init(m)
    m.handle(ReadyLineSeen(), 1)
    m.handle(ProbeResult(ok=True), 2)


def _cleaning_up(m: ServerMachine) -> None:
    _init(m)
    m.handle(Exited(status=1, diagnosis=Diagnosis(Outcome.KILLED, Phase.INIT, retryable=True)), 1)


def _waiting(m: ServerMachine) -> None:
    _preflight(m)
    m.handle(PreflightBlocked("GPU 0 in use", transient=True), 1)


@pytest.mark.parametrize(
    ("setup", "state"),
    [
        (_preflight, State.PREFLIGHT),
        (_init, State.INIT),
        (_ready, State.READY),
        (_cleaning_up, State.CLEANING_UP),
        (_waiting, State.WAITING_FOR_GPUS),
    ],
)
def test_unknown_once_supervising_is_a_bug_named_by_event_and_state(
    setup: Callable[[ServerMachine], None], state: State
) -> None:
    """Unknown comes only from the first listing: anywhere after the start it is a
    supervisor bug, raised with the event and the state, and the machine is left as it was."""
    m = machine()
    setup(m)
    assert state is m.state
    with pytest.raises(IllegalTransition,
                       match=f"^{re.escape(f'Unknown in state {state.value}')}$"):
        m.handle(Unknown(LISTING), 5)
    assert (state, "") == (m.state, m.reason)


@pytest.mark.parametrize("late", [Unknown(LISTING), HostRefused("host key changed")],
                         ids=["unknown", "host_refused"])
@pytest.mark.parametrize("kill", [True, False])
def test_terminal_machine_ignores_late_unknown_and_host_refusal(
    late: LifecycleInput, kill: bool
) -> None:
    """After the end, a late listing failure or host refusal changes nothing: no action, the
    state and the reason stay."""
    m = machine()
    _init(m)
    m.handle(StopRequested(kill=kill), 1)
    if kill:
        m.handle(CleanedUp(), 2)
    assert (State.STOPPED, "stop requested") == (m.state, m.reason)
    assert [] == m.handle(late, 3)
    assert (State.STOPPED, "stop requested") == (m.state, m.reason)


# --- payloads ----------------------------------------------------------------------------

ESTIMATE = "estimate: weights 61.2 GiB of 80 GiB per GPU"


def test_only_the_first_attempt_says_where_its_params_came_from() -> None:
    """The first attempt's attempt.started carries ``initial_reason``; a relaunch with the same
    params after a failure (here a restart after ready) does not repeat it."""
    m = machine(initial_reason=ESTIMATE)
    m.handle(Start(), 0)
    assert [Emit(events.AttemptStarted(attempt=1, params=INITIAL, why=ESTIMATE)),
            Launch(1, INITIAL)] == m.handle(PreflightPassed(), 1)
    m.handle(Launched(pid=100), 1)
    m.handle(ReadyLineSeen(), 2)
    m.handle(ProbeResult(ok=True), 3)
    m.handle(Exited(status=137, diagnosis=Diagnosis(Outcome.KILLED, Phase.READY,
                                                    retryable=True)), 50)
    m.handle(CleanedUp(), 51)
    m.handle(GpusFree(), 52)
    m.handle(BackoffElapsed(), 70)
    assert [Emit(events.AttemptStarted(attempt=2, params=INITIAL, why=None)),
            Launch(2, INITIAL)] == m.handle(PreflightPassed(), 71)


def test_ready_times_count_from_the_start_and_from_the_attempt() -> None:
    """server.ready's ``seconds`` run from Start, ``attempt_seconds`` from the launch, on a
    clock that does not begin at 0 (rounded to 2 decimals)."""
    m = machine()
    m.handle(Start(), 1000.0)
    m.handle(PreflightPassed(), 1010.25)
    m.handle(Launched(pid=100), 1011.0)
    m.handle(ReadyLineSeen(), 1040.0)
    assert [Emit(events.ServerReady(
        attempt=1, attempts=1, seconds=50.5, attempt_seconds=40.25, adopted=False,
        params=INITIAL, history=(),
    ))] == m.handle(ProbeResult(ok=True), 1050.5)


def test_a_stall_on_one_node_says_which() -> None:
    """A multi-node stall names the rank that went silent in the failure's advice."""
    m = machine()
    _init(m)
    m.handle(PhaseSeen(Phase.WEIGHTS), 1)
    assert [
        Emit(events.StallDetected(phase=Phase.WEIGHTS, silent_s=300.46, attempt=1)),
        Emit(events.AttemptFailed(
            attempt=1, outcome=Outcome.HANG, confidence=Confidence.DECISIVE,
            phase=Phase.WEIGHTS, numbers={}, retryable=True, after_ready=False, evidence=(),
            advice="no log progress for 300s in weights on node 1 (TP8-15)",
        )),
        Kill("stall"),
    ] == m.handle(Stalled(silent_s=300.456, where="node 1 (TP8-15)"), 301)
