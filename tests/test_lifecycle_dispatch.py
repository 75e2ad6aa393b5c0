"""The state machine's dispatch and its ``Unknown`` state, event by event.

Written from the mutation run of issue 18 (docs/testing.md, "State machine, this round"):
what an ``Unknown`` event (the host's attempts could not be listed) does in each state, and
which events a terminal machine ignores. Pure: no I/O, times are passed in. Whole actions and
whole event payloads are asserted.
"""

from __future__ import annotations

import re
from collections.abc import Callable

import pytest

from launcher import events
from launcher.backoff import Jitter, RestartBackoff
from launcher.errors import IllegalTransition
from launcher.lifecycle import (
    Adopted,
    CleanedUp,
    Emit,
    Event,
    Exited,
    HostRefused,
    Launched,
    Limits,
    PreflightBlocked,
    PreflightPassed,
    ProbeResult,
    ReadyLineSeen,
    RunPreflight,
    ServerMachine,
    Start,
    State,
    StopRequested,
    Unknown,
)
from launcher.params import LaunchParams
from launcher.policy import Bounds
from launcher.sglang.outcome import Diagnosis, Outcome
from launcher.sglang.phases import Phase

INITIAL = LaunchParams(0.70, 32)
LISTING = "cannot list its attempts on gpu1: ssh: connect timed out"


def machine() -> ServerMachine:
    return ServerMachine(
        initial=INITIAL,
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
def test_terminal_machine_ignores_late_unknown_and_host_refusal(late: Event, kill: bool) -> None:
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
