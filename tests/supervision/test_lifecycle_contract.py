"""The state machine's contract, event by event: exact actions and exact event payloads.

Written from the mutation run (docs/testing.md, "Mutation testing"): every test states one
behaviour a person relies on, and asserts whole action lists, whole ``Emit`` payloads (as the
log shows them: ``Emitted``) and typed actions, so that a changed event name, key or value
fails. Pure: no I/O, times are
passed in, the restart backoff has no jitter.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any

import pytest

from launcher.errors import IllegalTransition
from launcher.memory.policy import AttemptRecord, Bounds, next_params
from launcher.params import LaunchParams
from launcher.sglang.outcome import Diagnosis, Numbers, Outcome
from launcher.sglang.phases import Phase
from launcher.supervise.backoff import Jitter, RestartBackoff
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
    WaitForGpus,
)


@dataclass(frozen=True, eq=False)
class Emitted:
    """An expected ``Emit``, written as its log line shows it: the event's dotted name and its
    ``to_dict()`` payload. Equal to an ``Emit`` whose event has that name and payload."""

    name: str
    data: dict[str, Any]

    def __eq__(self, other: object) -> bool:
        if isinstance(other, Emit):
            return (other.event.name, other.event.to_dict()) == (self.name, self.data)
        if isinstance(other, Emitted):
            return (other.name, other.data) == (self.name, self.data)
        return NotImplemented

    def __hash__(self) -> int:
        return hash(self.name)


INITIAL = LaunchParams(0.70, 32)
P0 = {"mem_fraction_static": 0.70, "cuda_graph_max_bs": 32}
BOUNDS = Bounds(0.5, 0.95, 1, 6)
DELAY = 12.3456  # the restart backoff's first delay (no jitter): reported as 12.35


def machine(
    *,
    initial: LaunchParams = INITIAL,
    start_deadline: float = 1800.0,
    max_stalls: int = 2,
    probe_failures: int = 3,
    budget: int = 3,
    healthy_reset: float = 1800.0,
    bounds: Bounds = BOUNDS,
    tp: int | None = None,
    sglang_version: str | None = None,
) -> ServerMachine:
    return ServerMachine(
        initial=initial,
        limits=Limits(bounds=bounds, max_stalls=max_stalls, probe_failures=probe_failures,
                      start_deadline=start_deadline, tp=tp, sglang_version=sglang_version),
        restart=RestartBackoff(DELAY, 600.0, healthy_reset, budget, 3600.0,
                               jitter=Jitter.NONE),
    )


def restart_scheduled(delay_s: float, *, attempt: int, left: int, budget: int = 3) -> Emitted:
    """restart.scheduled as the machine of ``machine(budget=budget)`` emits it: the failed
    attempt, and the restarts its budget still allows in the window after this one."""
    return Emitted("restart.scheduled", {"delay_s": delay_s, "params": P0, "attempt": attempt,
                                      "restarts_left": left, "restart_budget": budget,
                                      "restart_window_s": 3600.0})


def launched(m: ServerMachine, t: float = 0.0, pid: int = 100) -> None:
    """Start, pass preflight and launch: the machine ends in INIT."""
    m.handle(Start(), t)
    m.handle(PreflightPassed(), t)
    m.handle(Launched(pid=pid), t)
    assert State.INIT is m.state


def serving(m: ServerMachine, t: float = 0.0, pid: int = 100) -> float:
    """Drive a fresh machine to READY; return the time it got there."""
    launched(m, t, pid)
    m.handle(ReadyLineSeen(), t + 1)
    m.handle(ProbeResult(ok=True), t + 2)
    assert State.READY is m.state
    return t + 2


def ready_again(m: ServerMachine, t: float, pid: int = 200) -> float:
    """From PREFLIGHT (a restart's), launch and reach READY; return the time."""
    m.handle(PreflightPassed(), t)
    m.handle(Launched(pid=pid), t)
    m.handle(ReadyLineSeen(), t + 1)
    m.handle(ProbeResult(ok=True), t + 2)
    assert State.READY is m.state
    return t + 2


def crashed() -> Diagnosis:
    return Diagnosis(outcome=Outcome.KILLED, phase=Phase.READY, retryable=True)


def capture_oom(params: LaunchParams = INITIAL) -> Diagnosis:
    return Diagnosis(
        outcome=Outcome.OOM_GRAPH_CAPTURE, phase=Phase.CUDA_GRAPH, retryable=True,
        numbers=Numbers(tried_gib=7.5, free_gib=2.3, total_gib=94.97, pre_load_avail_gib=85.0,
                        mem_fraction_static=params.mem_fraction_static,
                        cuda_graph_max_bs=params.cuda_graph_max_bs,
                        graph_begin_avail_gib=2.4, graph_steps_done=0, graph_steps_total=10),
        evidence=["line 1", "line 2", "line 3", "torch.OutOfMemoryError: CUDA out of memory."],
        advice="lower cuda_graph_max_bs",
    )


def fail_capture(m: ServerMachine, t: float) -> None:
    """The running attempt OOMs in graph capture and is cleaned up: WAITING_FOR_GPUS."""
    assert m.params is not None
    m.handle(PhaseSeen(Phase.CUDA_GRAPH), t)
    m.handle(Exited(status=1, diagnosis=capture_oom(m.params)), t)
    assert [WaitForGpus()] == m.handle(CleanedUp(), t)


def restart(m: ServerMachine, t: float) -> float:
    """A serving machine crashes, is cleaned up and restarts: ends in PREFLIGHT."""
    m.handle(Exited(status=137, diagnosis=crashed()), t)
    m.handle(CleanedUp(), t + 1)
    m.handle(GpusFree(), t + 2)
    assert State.BACKING_OFF is m.state
    assert [RunPreflight()] == m.handle(BackoffElapsed(), t + 20)
    return t + 20


def restart_from_backoff(m: ServerMachine, t: float) -> float:
    """BACKING_OFF -> PREFLIGHT at ``t``; return ``t``."""
    assert [RunPreflight()] == m.handle(BackoffElapsed(), t)
    return t


def gave_up(
    reason: str, attempt: int, attempts: int, history: list[dict[str, object]]
) -> list[Action]:
    """server.gave_up: ``attempt`` is the host's attempt number, ``attempts`` this run's count."""
    return [Emitted("server.gave_up", {
        "reason": reason, "attempt": attempt, "attempts": attempts, "history": history,
    })]


def names(actions: list[Action]) -> list[str]:
    """Event names and action types, in order."""
    return [a.event.name if isinstance(a, Emit) else type(a).__name__ for a in actions]


def rec(params: dict[str, object], outcome: str, phase: str, attempt: int) -> dict[str, object]:
    """A history entry of an event: the failed attempt, numbered as on the host."""
    return {"params": params, "outcome": outcome, "phase": phase, "attempt": attempt}


# --- the start-up path, payload by payload ---------------------------------------------


def test_start_up_to_ready_emits_exact_events() -> None:
    """Each step of a clean start-up returns exactly its actions, with exact payloads, and the
    machine records pid, times and the params that reached ready."""
    m = machine()
    assert (None, None) == (m.phase, m.params)
    assert [RunPreflight()] == m.handle(Start(), 0.0)
    assert (State.PREFLIGHT, 0.0, INITIAL) == (m.state, m.started_at, m.params)
    assert [
        Emitted("attempt.started", {"attempt": 1, "params": P0}),
        Launch(1, INITIAL),
    ] == m.handle(PreflightPassed(), 1.5)
    assert (State.LAUNCHING, 1.5, 1) == (m.state, m.attempt_started_at, m.attempt)
    assert [Emitted("phase.entered", {"phase": "init", "attempt": 1})] == m.handle(
        Launched(pid=4321), 2.0)
    assert (State.INIT, Phase.INIT, 4321) == (m.state, m.phase, m.pid)
    for t, phase in [(3.0, Phase.WEIGHTS), (4.0, Phase.KV_CACHE), (5.0, Phase.CUDA_GRAPH),
                     (6.0, Phase.WARMUP)]:
        assert [Emitted("phase.entered", {"phase": phase.value, "attempt": 1})] == m.handle(
            PhaseSeen(phase), t)
        assert (phase.value, phase) == (m.state.value, m.phase)
    assert [StartProbing()] == m.handle(ReadyLineSeen(), 7.0)
    assert [] == m.handle(ProbeResult(ok=False, detail="HTTP 503"), 8.0)
    assert State.WARMUP is m.state
    assert [
        Emitted("server.ready", {"attempt": 1, "attempts": 1, "seconds": 10.26,
                              "attempt_seconds": 8.76, "adopted": False, "params": P0,
                              "history": []})
    ] == m.handle(ProbeResult(ok=True), 10.256)
    assert (State.READY, Phase.READY, 10.256, INITIAL, True) == (
        m.state, m.phase, m.ready_at, m.last_good, m.was_ready)


def test_ready_line_before_warmup_enters_warmup_then_probes() -> None:
    """The ready line (as a line or as the READY phase) seen before the warmup phase moves
    to WARMUP, says so, and starts probing."""
    for event in (ReadyLineSeen(), PhaseSeen(Phase.READY)):
        m = machine()
        launched(m)
        m.handle(PhaseSeen(Phase.CUDA_GRAPH), 1)
        assert [Emitted("phase.entered", {"phase": "warmup", "attempt": 1}),
                StartProbing()] == m.handle(event, 2)
        assert State.WARMUP is m.state


def test_a_probe_before_the_ready_line_is_not_ready() -> None:
    """/health may answer 200 before SGLang prints its ready line: not ready yet."""
    m = machine()
    launched(m)
    m.handle(PhaseSeen(Phase.WARMUP), 1)
    assert [] == m.handle(ProbeResult(ok=True), 2)
    assert State.WARMUP is m.state


def test_repeated_ready_line_does_not_move_a_ready_server() -> None:
    """Once READY, the ready line again (as a line or a phase) and late phase lines change
    nothing: no second probe loop, no step back to warmup."""
    m = machine()
    serving(m)
    for event in (ReadyLineSeen(), PhaseSeen(Phase.READY), PhaseSeen(Phase.WARMUP),
                  PhaseSeen(Phase.INIT)):
        assert [] == m.handle(event, 10)
        assert State.READY is m.state


def test_log_lines_of_a_dead_attempt_are_ignored() -> None:
    """After the attempt died (cleaning up, waiting for GPUs), its late log lines, its ready
    line, a stall or a fatal line do nothing."""
    m = machine()
    launched(m)
    m.handle(Exited(status=1, diagnosis=capture_oom()), 1)
    fatal = Diagnosis(outcome=Outcome.PORT_IN_USE, phase=Phase.INIT)
    late: list[LifecycleInput] = [PhaseSeen(Phase.WEIGHTS), ReadyLineSeen(), Stalled(silent_s=99.0),
                         FatalLineSeen(fatal), ProbeResult(ok=True), Exited(1, crashed())]
    for event in late:
        assert [] == m.handle(event, 2)
        assert State.CLEANING_UP is m.state
    m.handle(CleanedUp(), 3)
    for event in late:
        assert [] == m.handle(event, 4)
        assert State.WAITING_FOR_GPUS is m.state
    assert 1 == len(m.history)


def test_late_phase_of_another_rank_does_not_move_back() -> None:
    """Phases only move forward: an earlier or the same phase again changes nothing."""
    m = machine()
    launched(m)
    m.handle(PhaseSeen(Phase.KV_CACHE), 1)
    assert [] == m.handle(PhaseSeen(Phase.KV_CACHE), 2)
    assert [] == m.handle(PhaseSeen(Phase.WEIGHTS), 3)
    assert State.KV_CACHE is m.state


# --- failures during start-up -----------------------------------------------------------


def test_capture_oom_payloads_and_policy_relaunch() -> None:
    """A death is reported (process.died, attempt.failed with the last three evidence lines),
    killed with the outcome as reason, and after cleanup and free GPUs the policy's decision
    is announced and launched as the next attempt."""
    m = machine()
    launched(m, pid=55)
    m.handle(PhaseSeen(Phase.CUDA_GRAPH), 1)
    diag = capture_oom()
    assert [
        Emitted("process.died", {"exit_status": 1, "phase": "cuda_graph", "attempt": 1}),
        Emitted("attempt.failed", {
            "attempt": 1, "outcome": "oom_graph_capture", "confidence": "decisive",
            "phase": "cuda_graph",
            "numbers": diag.numbers.as_dict(), "retryable": True, "after_ready": False,
            "evidence": ["line 2", "line 3", "torch.OutOfMemoryError: CUDA out of memory."],
            "advice": "lower cuda_graph_max_bs",
        }),
        Kill("oom_graph_capture"),
    ] == m.handle(Exited(status=1, diagnosis=diag), 2)
    assert (State.CLEANING_UP, None, diag) == (m.state, m.phase, m.pending)
    assert [WaitForGpus()] == m.handle(CleanedUp(), 3)
    assert (State.WAITING_FOR_GPUS, None) == (m.state, m.pid)
    history = [AttemptRecord(INITIAL, Outcome.OOM_GRAPH_CAPTURE, Phase.CUDA_GRAPH,
                             diag.numbers)]
    assert history == m.history
    decision = next_params(INITIAL, BOUNDS, history)
    assert decision.params is not None and decision.params != INITIAL
    new = {"mem_fraction_static": decision.params.mem_fraction_static,
           "cuda_graph_max_bs": decision.params.cuda_graph_max_bs}
    assert [
        Emitted("policy.decided", {"params": new, "reason": decision.reason}),
        Emitted("attempt.started", {"attempt": 2, "params": new}),
        Launch(2, decision.params),
    ] == m.handle(GpusFree(), 4)
    assert (State.LAUNCHING, 4, None) == (m.state, m.attempt_started_at, m.pending)


def test_death_while_launching_is_reported_in_the_launching_state() -> None:
    """A process that dies before any log phase is reported in 'launching'; a fatal verdict
    gives up after cleanup with the outcome, phase, advice and quoted log line."""
    m = machine()
    m.handle(Start(), 0)
    m.handle(PreflightPassed(), 0)
    diag = Diagnosis(outcome=Outcome.OTHER, phase=Phase.INIT, advice="read the log",
                     evidence=["  Segmentation fault  \n"])
    assert [
        Emitted("process.died", {"exit_status": -11, "phase": "launching", "attempt": 1}),
        Emitted("attempt.failed", {
            "attempt": 1, "outcome": "other", "confidence": "decisive", "phase": "init",
            "numbers": {},
            "retryable": False, "after_ready": False, "evidence": ["  Segmentation fault  \n"],
            "advice": "read the log",
        }),
        Kill("other"),
    ] == m.handle(Exited(status=-11, diagnosis=diag), 1)
    reason = "other in init: read the log (log: Segmentation fault)"
    assert gave_up(reason, 1, 1, [rec(P0, "other", "init", 1)]) == m.handle(CleanedUp(), 2)
    assert (State.GAVE_UP, reason) == (m.state, m.reason)


def test_fatal_line_kills_with_the_outcome_as_reason() -> None:
    """A fatal line while the process lives kills it (reason: the outcome) and gives up
    after cleanup; the reason without evidence has no quoted line."""
    m = machine()
    launched(m)
    diag = Diagnosis(outcome=Outcome.PORT_IN_USE, phase=Phase.WARMUP, advice="port taken")
    actions = m.handle(FatalLineSeen(diag), 1)
    assert (["attempt.failed", "Kill"], Kill("port_in_use")) == (names(actions), actions[-1])
    assert gave_up("port_in_use in warmup: port taken", 1, 1,
                   [rec(P0, "port_in_use", "warmup", 1)]) == m.handle(CleanedUp(), 2)


@pytest.mark.parametrize(
    ("length", "quoted"),
    [(240, "x" * 240), (241, "x" * 237 + "..."), (300, "x" * 237 + "...")],
)
def test_quoted_log_line_is_cut_at_240_characters(length: int, quoted: str) -> None:
    """The decisive line in a give-up reason is kept whole up to 240 characters, longer
    ones are cut to 240 ending in '...'."""
    m = machine()
    launched(m)
    diag = Diagnosis(outcome=Outcome.BAD_ARGUMENT, phase=Phase.INIT, advice="fix",
                     evidence=["first", "x" * length])
    m.handle(Exited(status=2, diagnosis=diag), 1)
    m.handle(CleanedUp(), 2)
    assert f"bad_argument in init: fix (log: {quoted})" == m.reason


def test_stall_payloads_and_kill() -> None:
    """A stall during start-up is reported with its phase and silence (2 decimals), recorded
    as a retryable hang in that phase, and killed with reason 'stall'."""
    m = machine()
    launched(m)
    m.handle(PhaseSeen(Phase.KV_CACHE), 1)
    assert [
        Emitted("stall.detected", {"phase": "kv_cache", "silent_s": 20.46, "attempt": 1}),
        Emitted("attempt.failed", {
            "attempt": 1, "outcome": "hang", "confidence": "decisive", "phase": "kv_cache",
            "numbers": {},
            "retryable": True, "after_ready": False, "evidence": [],
            "advice": "no log progress for 20s in kv_cache",
        }),
        Kill("stall"),
    ] == m.handle(Stalled(silent_s=20.456), 2)
    assert (1, State.CLEANING_UP) == (m.stalls, m.state)


def test_too_many_stalls_give_up_with_exact_reason() -> None:
    """One stall more than max_stalls gives up; the reason counts them and names the phase."""
    m = machine(max_stalls=0)
    launched(m)
    m.handle(PhaseSeen(Phase.WEIGHTS), 1)
    m.handle(Stalled(silent_s=5.0), 2)
    assert gave_up("stalled 1 times (last in weights)", 1, 1,
                   [rec(P0, "hang", "weights", 1)]) == m.handle(CleanedUp(), 3)


def test_a_stall_while_ready_is_ignored() -> None:
    """A quiet log is normal for a serving server: Stalled while READY changes nothing
    (health is the probes' job)."""
    m = machine()
    serving(m)
    assert [] == m.handle(Stalled(silent_s=600.0), 700)
    assert (State.READY, 0, []) == (m.state, m.stalls, m.history)


# --- the start-up deadline -------------------------------------------------------------


def test_retryable_failure_after_the_deadline_gives_up() -> None:
    """A retryable failure whose GPUs free up after the start-up deadline gives up with the
    deadline as reason instead of relaunching."""
    m = machine(start_deadline=90.0)
    launched(m)
    fail_capture(m, 50)
    assert gave_up("start-up deadline of 90s passed", 1, 1,
                   [rec(P0, "oom_graph_capture", "cuda_graph", 1)]) == m.handle(GpusFree(), 90.5)
    assert (State.GAVE_UP, "start-up deadline of 90s passed") == (m.state, m.reason)


def test_failure_exactly_at_the_deadline_still_relaunches() -> None:
    """The deadline has passed only after start_deadline seconds, not at them."""
    m = machine(start_deadline=90.0)
    launched(m, t=10.0)
    fail_capture(m, 50)
    assert ["policy.decided", "attempt.started", "Launch"] == names(m.handle(GpusFree(), 100.0))
    assert State.LAUNCHING is m.state


@pytest.mark.parametrize("blocked", [False, True])
def test_deadline_during_preflight_gives_up_without_a_kill(blocked: bool) -> None:
    """Nothing runs during preflight (or its GPU wait): the deadline gives up at once."""
    m = machine(start_deadline=60.0)
    m.handle(Start(), 0)
    if blocked:
        m.handle(PreflightBlocked("GPU 0 busy", transient=True), 1)
    assert gave_up("start-up deadline of 60s passed", 0, 0, []) == m.handle(
        DeadlineExceeded(), 61)
    assert State.GAVE_UP is m.state


def test_deadline_while_launching_kills_then_gives_up() -> None:
    """The deadline during a launch kills what the launch starts, then gives up."""
    m = machine(start_deadline=60.0)
    m.handle(Start(), 0)
    m.handle(PreflightPassed(), 1)
    assert [Kill("deadline")] == m.handle(DeadlineExceeded(), 61)
    assert State.CLEANING_UP is m.state
    assert [] == m.handle(Launched(pid=9), 62)
    assert (9, State.CLEANING_UP) == (m.pid, m.state)
    assert gave_up("start-up deadline of 60s passed", 1, 1, []) == m.handle(CleanedUp(), 63)


def test_deadline_while_cleaning_up_a_start_up_failure_gives_up() -> None:
    """A start-up failure being cleaned up when the deadline passes gives up (the kill in
    progress completes; its CleanedUp comes late and is ignored)."""
    m = machine(start_deadline=60.0)
    launched(m)
    m.handle(Exited(status=1, diagnosis=capture_oom()), 59)
    assert gave_up("start-up deadline of 60s passed", 1, 1,
                   [rec(P0, "oom_graph_capture", "cuda_graph", 1)]) == m.handle(
        DeadlineExceeded(), 61)
    assert [] == m.handle(CleanedUp(), 62)
    assert State.GAVE_UP is m.state


def test_deadline_is_ignored_while_ready_or_backing_off() -> None:
    """A server that reached ready is no longer starting up."""
    m = machine(start_deadline=60.0)
    t = serving(m)
    assert [] == m.handle(DeadlineExceeded(), t + 100)
    m.handle(Exited(status=137, diagnosis=crashed()), t + 200)
    m.handle(CleanedUp(), t + 201)
    m.handle(GpusFree(), t + 202)
    assert [] == m.handle(DeadlineExceeded(), t + 203)
    assert State.BACKING_OFF is m.state


# --- stopping ------------------------------------------------------------------------------


@pytest.mark.parametrize("kill", [False, True])
def test_a_stop_during_cleanup_never_relaunches(kill: bool) -> None:
    """A stop that arrives while a failed attempt is being cleaned up waits for the cleanup
    and ends STOPPED: no GPU wait, no relaunch, not even for a retryable failure."""
    m = machine()
    launched(m)
    m.handle(Exited(status=1, diagnosis=capture_oom()), 1)
    assert [] == m.handle(StopRequested(kill=kill), 2)
    assert State.CLEANING_UP is m.state
    assert [Emitted("server.stopped", {"reason": "stop requested", "left_running": None})] == (
        m.handle(CleanedUp(), 3))
    assert (State.STOPPED, "stop requested", None) == (m.state, m.reason, m.pid)
    assert [] == m.handle(GpusFree(), 4)
    assert 1 == m.attempt


def test_a_stop_during_cleanup_of_a_fatal_failure_ends_stopped() -> None:
    """A requested stop wins over a pending give-up: the end state is STOPPED."""
    m = machine()
    launched(m)
    m.handle(Exited(status=2, diagnosis=Diagnosis(Outcome.BAD_ARGUMENT, Phase.INIT)), 1)
    m.handle(StopRequested(kill=False), 2)
    assert ["server.stopped"] == [a.event.name for a in m.handle(CleanedUp(), 3)
                                  if isinstance(a, Emit)]
    assert State.STOPPED is m.state


def test_the_deadline_does_not_turn_a_stop_into_a_give_up() -> None:
    """A stop with kill is being carried out when the start-up deadline passes: the machine
    still ends STOPPED (reason: stop requested), it does not give up."""
    m = machine(start_deadline=60.0)
    launched(m)
    assert [Kill("stop")] == m.handle(StopRequested(kill=True), 30)
    assert [] == m.handle(DeadlineExceeded(), 61)
    assert [Emitted("server.stopped", {"reason": "stop requested", "left_running": None})] == (
        m.handle(CleanedUp(), 62))
    assert (State.STOPPED, "stop requested") == (m.state, m.reason)


def test_stop_without_kill_while_starting_leaves_the_process_running() -> None:
    """A stop without kill during start-up ends at once and names the live pid."""
    m = machine()
    launched(m, pid=321)
    m.handle(PhaseSeen(Phase.WEIGHTS), 1)
    assert [Emitted("server.stopped", {"reason": "stop requested", "left_running": 321})] == (
        m.handle(StopRequested(kill=False), 2))
    assert State.STOPPED is m.state


def test_stop_without_kill_before_the_launch_reports_no_pid() -> None:
    """While the launch runs there is no pid yet to leave running."""
    m = machine()
    m.handle(Start(), 0)
    m.handle(PreflightPassed(), 0)
    assert [Emitted("server.stopped", {"reason": "stop requested", "left_running": None})] == (
        m.handle(StopRequested(kill=False), 1))


@pytest.mark.parametrize("kill", [False, True])
def test_a_stop_while_backing_off_never_relaunches(kill: bool) -> None:
    """Between a crash and its restart nothing runs: a stop ends at once, and the backoff
    that elapses later is ignored."""
    m = machine()
    t = serving(m)
    m.handle(Exited(status=137, diagnosis=crashed()), t + 10)
    m.handle(CleanedUp(), t + 11)
    m.handle(GpusFree(), t + 12)
    assert [Emitted("server.stopped", {"reason": "stop requested", "left_running": None})] == (
        m.handle(StopRequested(kill=kill), t + 13))
    assert [] == m.handle(BackoffElapsed(), t + 30)
    assert State.STOPPED is m.state


# --- terminal states ---------------------------------------------------------------------


def _late_events() -> list[LifecycleInput]:
    return [
        PreflightPassed(), PreflightBlocked("x", transient=True), Launched(pid=1),
        PhaseSeen(Phase.WEIGHTS), ReadyLineSeen(), FatalLineSeen(crashed()),
        Exited(status=0, diagnosis=crashed()), Stalled(silent_s=1.0), ProbeResult(ok=False),
        ProbeResult(ok=True), CleanedUp(), GpusFree(), GpuWaitTimedOut(holder="x"),
        BackoffElapsed(), DeadlineExceeded(), Adopted(pid=1, attempt=1, params=INITIAL),
    ]


def test_terminal_states_ignore_late_events() -> None:
    """After GAVE_UP or STOPPED every late event (a probe in flight, a follower exiting, a
    cleanup report) is ignored: no action, no error, no change."""
    gave = machine()
    gave.handle(Start(), 0)
    gave.handle(PreflightBlocked("model path missing", transient=False), 1)
    stopped = machine()
    launched(stopped)
    stopped.handle(StopRequested(kill=False), 1)
    for m, state in ((gave, State.GAVE_UP), (stopped, State.STOPPED)):
        reason = m.reason
        for event in _late_events():
            assert [] == m.handle(event, 5)
            assert (state, reason) == (m.state, m.reason)


def test_start_after_giving_up_begins_a_new_start_up() -> None:
    """Start is the one event a terminal machine takes: a new preflight and deadline; the
    next attempt does not inherit the old fatal verdict."""
    m = machine(start_deadline=60.0)
    launched(m)
    m.handle(Exited(status=2, diagnosis=Diagnosis(Outcome.BAD_ARGUMENT, Phase.INIT)), 1)
    m.handle(CleanedUp(), 2)
    assert State.GAVE_UP is m.state
    assert [RunPreflight()] == m.handle(Start(), 100)
    assert (State.PREFLIGHT, 100) == (m.state, m.started_at)
    m.handle(PreflightPassed(), 101)
    m.handle(Launched(pid=2), 102)
    fail_capture(m, 103)
    assert ["policy.decided", "attempt.started", "Launch"] == names(m.handle(GpusFree(), 104))


# --- preflight and GPU waits ---------------------------------------------------------------


def test_transient_preflight_block_waits_and_says_why() -> None:
    m = machine()
    m.handle(Start(), 0)
    assert [Emitted("gpu.waiting", {"reason": "GPU 0 busy"}), WaitForGpus()] == m.handle(
        PreflightBlocked("GPU 0 busy", transient=True), 1)
    assert State.WAITING_FOR_GPUS is m.state


def test_fatal_preflight_block_gives_up_with_exact_reason() -> None:
    m = machine()
    m.handle(Start(), 0)
    assert gave_up("preflight: model path missing", 0, 0, []) == m.handle(
        PreflightBlocked("model path missing", transient=False), 1)


def test_gpu_wait_timeout_gives_up_with_exact_reason() -> None:
    m = machine()
    m.handle(Start(), 0)
    m.handle(PreflightBlocked("GPU 0 busy", transient=True), 1)
    assert gave_up("GPUs still in use after waiting: pid 4242 (30000 MiB)", 0, 0, []) == (
        m.handle(
            GpuWaitTimedOut(holder="pid 4242 (30000 MiB)"), 100))


# --- illegal events ----------------------------------------------------------------------


@pytest.mark.parametrize(
    ("setup", "event", "message"),
    [
        ("idle", PreflightPassed(), "PreflightPassed in state idle"),
        ("idle", PreflightBlocked("x", transient=True), "PreflightBlocked in state idle"),
        ("idle", Launched(pid=1), "Launched in state idle"),
        ("idle", GpusFree(), "GpusFree in state idle"),
        ("idle", GpuWaitTimedOut(holder="x"), "GpuWaitTimedOut in state idle"),
        ("idle", BackoffElapsed(), "BackoffElapsed in state idle"),
        ("init", Start(), "Start in state init"),
        ("init", Adopted(pid=1, attempt=1, params=INITIAL), "Adopted in state init"),
        ("init", CleanedUp(), "CleanedUp in state init"),
    ],
)
def test_impossible_events_raise_naming_event_and_state(
    setup: str, event: LifecycleInput, message: str
) -> None:
    m = machine()
    if setup == "init":
        launched(m)
    with pytest.raises(IllegalTransition, match=f"^{re.escape(message)}$"):
        m.handle(event, 1)


# --- adoption ------------------------------------------------------------------------------


def test_adopted_server_payload_and_attempt_count() -> None:
    """Adopting reports pid, attempt, params and when the attempt was launched; the adopted
    attempt counts as this run's first and the deadline counts from the adoption. Its ready
    carries the host's attempt number, is flagged adopted and untimed (this machine did not
    bring it up, so how long it took is not known here)."""
    m = machine()
    m.handle(Start(), 0)
    assert [Emitted("server.adopted", {
        "pid": 7, "attempt": 3, "params": {"mem_fraction_static": 0.6, "cuda_graph_max_bs": 16},
        "started_at": 1764590400.0,
    })] == m.handle(Adopted(pid=7, attempt=3, params=LaunchParams(0.6, 16),
                            started_wall=1764590400.0), 5)
    assert (State.INIT, 7, 3, 2, 5, 5) == (
        m.state, m.pid, m.attempt, m.attempt_base, m.started_at, m.attempt_started_at)
    m.handle(ReadyLineSeen(), 6)
    ready = m.handle(ProbeResult(ok=True), 9.5)
    assert [Emitted("server.ready", {
        "attempt": 3, "attempts": 1, "seconds": None, "attempt_seconds": None, "adopted": True,
        "params": {"mem_fraction_static": 0.6, "cuda_graph_max_bs": 16}, "history": [],
    })] == ready


def test_attempts_count_only_this_run() -> None:
    """With attempts already on the host, events count this run's attempts only."""
    m = machine()
    m.attempt = m.attempt_base = 5
    m.handle(Start(), 0)
    m.handle(PreflightPassed(), 0)
    m.handle(Launched(pid=1), 1)
    m.handle(Exited(status=2, diagnosis=Diagnosis(Outcome.BAD_ARGUMENT, Phase.INIT)), 2)
    assert gave_up("bad_argument in init: ", 6, 1, [rec(P0, "bad_argument", "init", 6)]) == (
        m.handle(CleanedUp(), 3))
    assert 6 == m.attempt


# --- serving: probes, crashes, restarts ------------------------------------------------


def test_probe_failures_payloads_and_unhealthy_kill() -> None:
    """Failed probes while serving are counted in a row; at probe_failures the server is
    unhealthy: a retryable hang after ready, killed with reason 'unhealthy'."""
    m = machine(probe_failures=3)
    t = serving(m)
    assert [Emitted("probe.failed", {"consecutive": 1, "detail": "HTTP 503"})] == m.handle(
        ProbeResult(ok=False, detail="HTTP 503"), t + 1)
    assert [Emitted("probe.failed", {"consecutive": 2, "detail": "timed out"})] == m.handle(
        ProbeResult(ok=False, detail="timed out"), t + 2)
    assert [
        Emitted("server.unhealthy", {"consecutive_failures": 3, "detail": "refused"}),
        Emitted("attempt.failed", {
            "attempt": 1, "outcome": "hang", "confidence": "decisive", "phase": "ready",
            "numbers": {},
            "retryable": True, "after_ready": True, "evidence": [],
            "advice": "3 failed /health probes in a row",
        }),
        Kill("unhealthy"),
    ] == m.handle(ProbeResult(ok=False, detail="refused"), t + 3)


def test_crash_while_serving_restarts_with_exact_payloads() -> None:
    """A crash after ready: process.died in 'ready', cleanup, then a restart with the last
    good params after the backoff delay (2 decimals in the event, exact in Sleep)."""
    m = machine()
    t = serving(m)
    actions = m.handle(Exited(status=137, diagnosis=crashed()), t + 10)
    assert Emitted("process.died", {"exit_status": 137, "phase": "ready", "attempt": 1}) == (
        actions[0])
    assert [WaitForGpus()] == m.handle(CleanedUp(), t + 11)
    assert [
        restart_scheduled(12.35, attempt=1, left=2),
        Sleep(DELAY),
    ] == m.handle(GpusFree(), t + 12)
    assert State.BACKING_OFF is m.state
    assert [RunPreflight()] == m.handle(BackoffElapsed(), t + 30)
    assert (State.PREFLIGHT, t + 30, False) == (m.state, m.started_at, m.was_ready)
    assert [Emitted("attempt.started", {"attempt": 2, "params": P0}), Launch(2, INITIAL)] == (
        m.handle(PreflightPassed(), t + 31))


def test_non_retryable_failure_while_serving_restarts() -> None:
    """A server that served with its params and then dies of a verdict that would be fatal at
    start-up (e.g. a CUDA error) is restarted with those params under the restart budget, not
    given up on: a person is needed only when it keeps failing."""
    m = machine(budget=1)
    t = serving(m)
    diag = Diagnosis(outcome=Outcome.CUDA_ERROR_OTHER, phase=Phase.READY, retryable=False,
                     advice="an illegal memory access")
    failed = m.handle(Exited(status=1, diagnosis=diag), t + 10)
    assert Emitted("attempt.failed", {
        "attempt": 1, "outcome": "cuda_error_other", "confidence": "decisive",
        "phase": "ready", "numbers": {},
        "retryable": False, "after_ready": True, "evidence": [],
        "advice": "an illegal memory access",
    }) == failed[1]
    assert [WaitForGpus()] == m.handle(CleanedUp(), t + 11)
    assert [restart_scheduled(12.35, attempt=1, left=0, budget=1), Sleep(DELAY)] == (
        m.handle(GpusFree(), t + 12))
    t = ready_again(m, restart_from_backoff(m, t + 30))
    m.handle(Exited(status=1, diagnosis=diag), t + 10)
    m.handle(CleanedUp(), t + 11)
    assert gave_up("restart budget exhausted after ready", 2, 2, [
        rec(P0, "cuda_error_other", "ready", 1), rec(P0, "cuda_error_other", "ready", 2),
    ]) == m.handle(GpusFree(), t + 12)


def test_probe_count_starts_again_with_each_attempt() -> None:
    """Failed probes of an earlier attempt do not count against the restarted one."""
    m = machine(probe_failures=2)
    t = serving(m)
    m.handle(ProbeResult(ok=False), t + 1)
    m.handle(ProbeResult(ok=False), t + 2)  # unhealthy: killed
    m.handle(CleanedUp(), t + 3)
    m.handle(GpusFree(), t + 4)
    t = ready_again(m, restart_from_backoff(m, t + 20))
    assert [Emitted("probe.failed", {"consecutive": 1, "detail": ""})] == m.handle(
        ProbeResult(ok=False), t + 1)


def test_a_good_probe_resets_the_failure_count() -> None:
    m = machine(probe_failures=2)
    t = serving(m)
    m.handle(ProbeResult(ok=False), t + 1)
    assert [] == m.handle(ProbeResult(ok=True), t + 2)
    assert [Emitted("probe.failed", {"consecutive": 1, "detail": ""})] == m.handle(
        ProbeResult(ok=False), t + 3)


def test_stalls_are_counted_per_start_up_sequence() -> None:
    """Stalls before an earlier ready do not count against a restart's start-up."""
    m = machine(max_stalls=1)
    m.handle(Start(), 0)
    m.handle(PreflightPassed(), 0)
    m.handle(Launched(pid=1), 1)
    m.handle(Stalled(silent_s=10.0), 2)
    m.handle(CleanedUp(), 3)
    m.handle(GpusFree(), 4)  # attempt 2
    m.handle(Launched(pid=2), 5)
    m.handle(ReadyLineSeen(), 6)
    m.handle(ProbeResult(ok=True), 7)
    t = restart(m, 100)
    m.handle(PreflightPassed(), t)
    m.handle(Launched(pid=3), t + 1)
    m.handle(Stalled(silent_s=10.0), t + 2)
    assert 1 == m.stalls
    assert [WaitForGpus()] == m.handle(CleanedUp(), t + 3)
    assert ["policy.decided", "attempt.started", "Launch"] == names(m.handle(GpusFree(), t + 4))


def test_a_long_healthy_run_resets_the_restart_delay() -> None:
    """A server healthy for healthy_reset seconds after ready restarts after the initial
    delay again, even without probes in between (ready counts as healthy)."""
    m = machine(healthy_reset=100.0)
    t = serving(m)
    t = restart(m, t + 10)  # first restart: the initial delay
    t = ready_again(m, t)
    m.handle(Exited(status=137, diagnosis=crashed()), t + 500)
    m.handle(CleanedUp(), t + 501)
    assert [restart_scheduled(12.35, attempt=2, left=1), Sleep(DELAY)] == (
        m.handle(GpusFree(), t + 502))


def test_a_short_run_doubles_the_restart_delay() -> None:
    """A crash soon after a restart waits twice as long (the backoff streak goes on)."""
    m = machine(healthy_reset=100.0)
    t = serving(m)
    t = restart(m, t + 10)
    t = ready_again(m, t)
    m.handle(Exited(status=137, diagnosis=crashed()), t + 5)
    m.handle(CleanedUp(), t + 6)
    assert [restart_scheduled(24.69, attempt=2, left=1), Sleep(2 * DELAY)] == (
        m.handle(GpusFree(), t + 7))


def test_deadline_during_a_restarts_preflight_gives_up() -> None:
    """A restart is a new start-up: a deadline during its preflight gives up."""
    m = machine(start_deadline=60.0)
    t = restart(m, serving(m) + 10)
    assert gave_up("start-up deadline of 60s passed", 1, 1,
                   [rec(P0, "killed", "ready", 1)]) == (
        m.handle(DeadlineExceeded(), t + 61))


def test_start_up_failure_after_a_restart_is_bounded_by_the_restarts_deadline() -> None:
    """A restart's start-up failure goes back through the deadline, counted from the restart
    (not from the first start, nor ignored because the server was once ready)."""
    m = machine(start_deadline=60.0)
    t = restart(m, serving(m) + 1000)
    m.handle(PreflightPassed(), t)
    m.handle(Launched(pid=2), t + 1)
    fail_capture(m, t + 30)
    assert gave_up("start-up deadline of 60s passed", 2, 2, [
        rec(P0, "killed", "ready", 1), rec(P0, "oom_graph_capture", "cuda_graph", 2),
    ]) == m.handle(GpusFree(), t + 61)


def test_start_up_failure_after_a_restart_goes_back_through_the_policy() -> None:
    """Within the restart's deadline, its start-up failure is decided by the policy (lower
    params after a capture OOM), as any start-up failure."""
    m = machine(start_deadline=600.0)
    t = restart(m, serving(m) + 1000)
    m.handle(PreflightPassed(), t)
    m.handle(Launched(pid=2), t + 1)
    fail_capture(m, t + 30)
    actions = m.handle(GpusFree(), t + 40)
    assert ["policy.decided", "attempt.started", "Launch"] == names(actions)
    launch = actions[-1]
    assert isinstance(launch, Launch) and 3 == launch.attempt
    assert launch.params.mem_fraction_static is not None
    assert launch.params.mem_fraction_static < 0.70


def test_max_attempts_count_from_the_last_ready_attempt() -> None:
    """The policy's max_attempts bounds the attempts since the server was last ready: a
    restart of a server that needed several attempts at first gets a fresh allowance."""
    m = machine(bounds=Bounds(0.5, 0.95, 1, 2))
    launched(m)
    fail_capture(m, 1)
    m.handle(GpusFree(), 2)  # attempt 2 (the policy's second and last)
    m.handle(Launched(pid=2), 3)
    m.handle(ReadyLineSeen(), 4)
    m.handle(ProbeResult(ok=True), 5)
    t = restart(m, 100)
    m.handle(PreflightPassed(), t)  # attempt 3: the restart, first since ready
    m.handle(Launched(pid=3), t)
    fail_capture(m, t + 1)
    actions = m.handle(GpusFree(), t + 2)  # attempt 4: second since ready
    assert isinstance(actions[-1], Launch) and 4 == actions[-1].attempt
    m.handle(Launched(pid=4), t + 3)
    fail_capture(m, t + 4)
    actions = m.handle(GpusFree(), t + 5)  # two attempts since ready failed: give up
    assert State.GAVE_UP is m.state
    assert "max_attempts" in m.reason


def test_policy_gets_the_configured_tp_and_sglang_version() -> None:
    """With auto params the policy needs tp and the SGLang version to know what SGLang
    chose; the machine passes both from its limits."""
    auto = LaunchParams(None, None)
    m = machine(initial=auto, tp=4, sglang_version="0.5.10")
    launched(m)
    m.handle(PhaseSeen(Phase.CUDA_GRAPH), 1)
    diag = capture_oom(auto)
    m.handle(Exited(status=1, diagnosis=diag), 2)
    m.handle(CleanedUp(), 3)
    expected = next_params(auto, BOUNDS, m.history, tp=4, sglang_version="0.5.10")
    others = {next_params(auto, BOUNDS, m.history, tp=tp, sglang_version=v).params
              for tp, v in ((None, "0.5.10"), (4, None), (None, None))}
    assert expected.params is not None and expected.params not in others
    actions = m.handle(GpusFree(), 4)
    assert Launch(2, expected.params) == actions[-1]
    assert Emitted("policy.decided", {
        "params": {"mem_fraction_static": expected.params.mem_fraction_static,
                   "cuda_graph_max_bs": expected.params.cuda_graph_max_bs},
        "reason": expected.reason,
    }) == actions[0]


def test_gave_up_and_ready_events_carry_the_history() -> None:
    """server.ready lists the failed attempts before it, in order, params as launched."""
    m = machine()
    launched(m)
    fail_capture(m, 1)
    launch = m.handle(GpusFree(), 2)[-1]
    assert isinstance(launch, Launch)
    m.handle(Launched(pid=2), 3)
    m.handle(ReadyLineSeen(), 4)
    ready = m.handle(ProbeResult(ok=True), 5)
    second = {"mem_fraction_static": launch.params.mem_fraction_static,
              "cuda_graph_max_bs": launch.params.cuda_graph_max_bs}
    assert [Emitted("server.ready", {
        "attempt": 2, "attempts": 2, "seconds": 5, "attempt_seconds": 3, "adopted": False,
        "params": second, "history": [rec(P0, "oom_graph_capture", "cuda_graph", 1)],
    })] == ready
    assert launch.params == m.last_good
