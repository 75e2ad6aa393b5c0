"""The pure start-up state machine, driven by replayed event histories (no I/O)."""

from __future__ import annotations

import pytest

from launcher.errors import IllegalTransition
from launcher.memory.policy import Bounds
from launcher.params import LaunchParams
from launcher.sglang.outcome import Confidence, Diagnosis, Numbers, Outcome
from launcher.sglang.phases import Phase
from launcher.supervise.backoff import RestartBackoff
from launcher.supervise.lifecycle import (
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


def machine(**limits: object) -> ServerMachine:
    lim = Limits(bounds=Bounds(0.5, 0.95, 1, 6), **limits)  # type: ignore[arg-type]
    return ServerMachine(
        initial=LaunchParams(0.70, 32),
        limits=lim,
        restart=RestartBackoff(initial=10, maximum=600, healthy_reset=1800, budget=3,
                               window=3600),
    )


def names(actions: list[object]) -> list[str]:
    return [a.event.name if isinstance(a, Emit) else type(a).__name__ for a in actions]


def emitted(actions: list[object], name: str) -> dict[str, object]:
    for a in actions:
        if isinstance(a, Emit) and a.event.name == name:
            return a.event.to_dict()
    raise AssertionError(f"{name} not in {names(actions)}")


def capture_oom() -> Diagnosis:
    return Diagnosis(
        outcome=Outcome.OOM_GRAPH_CAPTURE, phase=Phase.CUDA_GRAPH, retryable=True,
        numbers=Numbers(tried_gib=7.5, free_gib=2.3, total_gib=94.97, pre_load_avail_gib=85.0,
                        mem_fraction_static=0.70, cuda_graph_max_bs=32,
                        graph_begin_avail_gib=2.4, graph_steps_done=0, graph_steps_total=10),
    )


def to_ready(m: ServerMachine, t: float = 0.0) -> float:
    """Drive ``m`` from launch to READY; return the time reached."""
    m.handle(PreflightPassed(), t)
    m.handle(Launched(pid=100), t + 1)
    for i, ph in enumerate([Phase.WEIGHTS, Phase.KV_CACHE, Phase.CUDA_GRAPH, Phase.WARMUP]):
        m.handle(PhaseSeen(ph), t + 2 + i)
    assert [StartProbing()] == m.handle(ReadyLineSeen(), t + 7)
    m.handle(ProbeResult(ok=True), t + 8)
    return t + 8


def test_start_runs_preflight_then_launches_first_attempt() -> None:
    """Start asks for a preflight; passing it launches attempt 1 with the initial params."""
    m = machine()
    assert [RunPreflight()] == m.handle(Start(), 0)
    actions = m.handle(PreflightPassed(), 1)
    assert Launch(1, LaunchParams(0.70, 32)) in actions
    assert State.LAUNCHING == m.state
    assert 1 == emitted(actions, "attempt.started")["attempt"]


def test_phases_only_move_forward() -> None:
    """A late line of an earlier phase (another rank) does not move the state back."""
    m = machine()
    m.handle(Start(), 0)
    m.handle(PreflightPassed(), 0)
    m.handle(Launched(pid=1), 0)
    m.handle(PhaseSeen(Phase.CUDA_GRAPH), 1)
    assert [] == m.handle(PhaseSeen(Phase.WEIGHTS), 2)
    assert State.CUDA_GRAPH == m.state


def test_ready_needs_ready_line_and_probe() -> None:
    """The ready line alone is not ready: a 200 from /health is needed too."""
    m = machine()
    m.handle(Start(), 0)
    m.handle(PreflightPassed(), 0)
    m.handle(Launched(pid=1), 0)
    m.handle(ReadyLineSeen(), 5)
    assert State.WARMUP == m.state
    assert [] == m.handle(ProbeResult(ok=False, detail="HTTP 503"), 6)
    actions = m.handle(ProbeResult(ok=True), 7)
    assert State.READY == m.state
    assert {"attempt": 1, "attempts": 1, "seconds": 7.0, "attempt_seconds": 7.0,
            "adopted": False} == {
        k: emitted(actions, "server.ready")[k]
        for k in ("attempt", "attempts", "seconds", "attempt_seconds", "adopted")}


def test_ready_and_failures_carry_the_hosts_attempt_number() -> None:
    """With 3 attempts already on the host, the next ones are #4 (capture OOM) and #5 (ready):
    server.ready says attempt 5 and numbers the failure #4; attempts counts this run's two."""
    m = machine()
    m.attempt = m.attempt_base = 3
    m.handle(Start(), 0)
    m.handle(PreflightPassed(), 0)
    m.handle(Launched(pid=1), 1)
    m.handle(PhaseSeen(Phase.CUDA_GRAPH), 2)
    m.handle(Exited(status=137, diagnosis=capture_oom()), 3)
    m.handle(CleanedUp(), 4)
    m.handle(GpusFree(), 5)
    ready = emitted(m.handle(Launched(pid=2), 6) + m.handle(ReadyLineSeen(), 9)
                    + m.handle(ProbeResult(ok=True), 10), "server.ready")
    assert (5, 2, 10.0, 5.0) == (ready["attempt"], ready["attempts"], ready["seconds"],
                                 ready["attempt_seconds"])
    assert [4] == [h["attempt"] for h in ready["history"]]  # type: ignore[attr-defined]


def test_an_adopted_attempt_turning_ready_is_flagged_and_not_timed() -> None:
    """Adopting attempt 6 and seeing it ready: server.adopted and server.ready name attempt 6;
    the ready is flagged adopted and carries no time to ready (it was not measured)."""
    m = machine()
    actions = m.handle(Adopted(pid=9, attempt=6, params=LaunchParams(0.8, 8),
                               started_wall=123.0), 100)
    assert {"pid": 9, "attempt": 6, "started_at": 123.0} == {
        k: emitted(actions, "server.adopted")[k] for k in ("pid", "attempt", "started_at")}
    m.handle(ReadyLineSeen(), 100.02)
    ready = emitted(m.handle(ProbeResult(ok=True), 100.04), "server.ready")
    assert (6, True, None, None) == (ready["attempt"], ready["adopted"], ready["seconds"],
                                     ready["attempt_seconds"])


def test_capture_oom_relaunches_with_policy_params() -> None:
    """A capture OOM is cleaned up, GPUs are awaited, and attempt 2 gets lower params."""
    m = machine()
    m.handle(Start(), 0)
    m.handle(PreflightPassed(), 0)
    m.handle(Launched(pid=1), 1)
    m.handle(PhaseSeen(Phase.CUDA_GRAPH), 2)
    actions = m.handle(Exited(status=137, diagnosis=capture_oom()), 3)
    assert ["process.died", "attempt.failed", "Kill"] == names(actions)
    assert [WaitForGpus()] == m.handle(CleanedUp(), 4)
    actions = m.handle(GpusFree(), 5)
    launch = next(a for a in actions if isinstance(a, Launch))
    assert 2 == launch.attempt
    p = launch.params
    assert p.mem_fraction_static is not None and p.cuda_graph_max_bs is not None
    assert LaunchParams(0.70, 32) != p
    assert p.mem_fraction_static <= 0.70 and p.cuda_graph_max_bs <= 32


def test_non_retryable_failure_gives_up_after_one_attempt() -> None:
    """A bad argument is fatal: after cleanup the machine gives up, no second launch."""
    m = machine()
    m.handle(Start(), 0)
    m.handle(PreflightPassed(), 0)
    m.handle(Launched(pid=1), 1)
    diag = Diagnosis(outcome=Outcome.BAD_ARGUMENT, phase=Phase.INIT, advice="fix the flag")
    m.handle(Exited(status=2, diagnosis=diag), 2)
    actions = m.handle(CleanedUp(), 3)
    assert State.GAVE_UP == m.state
    assert "bad_argument" in str(emitted(actions, "server.gave_up")["reason"])
    assert 1 == m.attempt


def test_port_in_use_line_is_fatal_while_alive() -> None:
    """"address already in use" kills the attempt even before the process exits."""
    m = machine()
    m.handle(Start(), 0)
    m.handle(PreflightPassed(), 0)
    m.handle(Launched(pid=1), 1)
    diag = Diagnosis(outcome=Outcome.PORT_IN_USE, phase=Phase.WARMUP, advice="port taken")
    actions = m.handle(FatalLineSeen(diag), 2)
    assert Kill("port_in_use") in actions
    m.handle(CleanedUp(), 3)
    assert State.GAVE_UP == m.state


def test_stalls_are_bounded() -> None:
    """Each stall kills and retries; one more than max_stalls gives up."""
    m = machine(max_stalls=1)
    m.handle(Start(), 0)
    m.handle(PreflightPassed(), 0)
    for attempt in (1, 2):
        m.handle(Launched(pid=attempt), attempt * 10)
        actions = m.handle(Stalled(silent_s=20.0), attempt * 10 + 5)
        assert {"phase": "init", "silent_s": 20.0, "attempt": attempt} == emitted(
            actions, "stall.detected")
        m.handle(CleanedUp(), attempt * 10 + 6)
        if attempt == 1:
            m.handle(GpusFree(), attempt * 10 + 7)
            assert State.LAUNCHING == m.state
    assert State.GAVE_UP == m.state
    assert "stalled 2 times" in m.reason


def test_crash_after_ready_relaunches_with_last_good_params_after_backoff() -> None:
    """Death after ready backs off, then relaunches with the params that reached ready."""
    m = machine()
    m.handle(Start(), 0)
    t = to_ready(m)
    diag = Diagnosis(outcome=Outcome.KILLED, phase=Phase.READY, retryable=True)
    m.handle(Exited(status=137, diagnosis=diag), t + 100)
    m.handle(CleanedUp(), t + 101)
    actions = m.handle(GpusFree(), t + 102)
    sleep = next(a for a in actions if isinstance(a, Sleep))
    assert 0 < sleep.seconds <= 10
    assert State.BACKING_OFF == m.state
    assert [RunPreflight()] == m.handle(BackoffElapsed(), t + 120)
    actions = m.handle(PreflightPassed(), t + 121)
    assert Launch(2, LaunchParams(0.70, 32)) in actions


def test_unhealthy_after_consecutive_probe_failures() -> None:
    """N failed probes in a row after ready mark the server unhealthy and kill it."""
    m = machine(probe_failures=3)
    m.handle(Start(), 0)
    t = to_ready(m)
    assert ["probe.failed"] == names(m.handle(ProbeResult(ok=False), t + 1))
    m.handle(ProbeResult(ok=True), t + 2)  # a success resets the count
    m.handle(ProbeResult(ok=False), t + 3)
    m.handle(ProbeResult(ok=False), t + 4)
    actions = m.handle(ProbeResult(ok=False), t + 5)
    assert ["server.unhealthy", "attempt.failed", "Kill"] == names(actions)


def test_transient_preflight_waits_for_gpus_then_retries_preflight() -> None:
    """Busy GPUs at the first preflight wait, then preflight runs again."""
    m = machine()
    m.handle(Start(), 0)
    actions = m.handle(PreflightBlocked("GPU 0 busy", transient=True), 1)
    assert ["gpu.waiting", "WaitForGpus"] == names(actions)
    assert [RunPreflight()] == m.handle(GpusFree(), 5)


def test_gpu_wait_timeout_gives_up_naming_holder() -> None:
    """GPUs that stay held make the machine give up with the holder in the reason."""
    m = machine()
    m.handle(Start(), 0)
    m.handle(PreflightBlocked("GPU 0 busy", transient=True), 1)
    m.handle(GpuWaitTimedOut(holder="pid 4242 (30000 MiB)"), 100)
    assert State.GAVE_UP == m.state
    assert "pid 4242" in m.reason


def test_deadline_kills_running_attempt_and_gives_up() -> None:
    """Past the start deadline a running attempt is killed and the server gives up."""
    m = machine(start_deadline=60.0)
    m.handle(Start(), 0)
    m.handle(PreflightPassed(), 0)
    m.handle(Launched(pid=1), 1)
    assert [Kill("deadline")] == m.handle(DeadlineExceeded(), 61)
    m.handle(CleanedUp(), 62)
    assert State.GAVE_UP == m.state


def test_stop_without_kill_leaves_server_running() -> None:
    """A stop without kill ends supervision at once and reports the server left running."""
    m = machine()
    m.handle(Start(), 0)
    to_ready(m)
    actions = m.handle(StopRequested(kill=False), 50)
    assert State.STOPPED == m.state
    assert 100 == emitted(actions, "server.stopped")["left_running"]


def test_stop_with_kill_stops_server_first() -> None:
    """A stop with kill kills the server, then ends in STOPPED (not GAVE_UP)."""
    m = machine()
    m.handle(Start(), 0)
    to_ready(m)
    assert [Kill("stop")] == m.handle(StopRequested(kill=True), 50)
    m.handle(CleanedUp(), 51)
    assert State.STOPPED == m.state


def test_adopted_server_is_followed_not_relaunched() -> None:
    """Adopting a running server enters INIT with its attempt and params, launching nothing."""
    m = machine()
    actions = m.handle(Adopted(pid=7, attempt=3, params=LaunchParams(0.6, 16)), 0)
    assert ["server.adopted"] == names(actions)
    assert (State.INIT, 3, LaunchParams(0.6, 16)) == (m.state, m.attempt, m.params)
    m.handle(ReadyLineSeen(), 1)
    m.handle(ProbeResult(ok=True), 2)
    assert State.READY == m.state


def test_illegal_transition_names_state() -> None:
    """An impossible event raises IllegalTransition naming the state."""
    m = machine()
    with pytest.raises(IllegalTransition, match="CleanedUp in state idle"):
        m.handle(CleanedUp(), 0)


def test_fatal_reason_quotes_the_decisive_log_line() -> None:
    """A fatal failure's give-up reason ends with the log line that decided it."""
    m = machine()
    m.handle(Start(), 0)
    m.handle(PreflightPassed(), 0)
    m.handle(Launched(pid=1), 1)
    diag = Diagnosis(outcome=Outcome.BAD_ARGUMENT, phase=Phase.INIT, advice="fix the flag",
                     evidence=["sglang serve: error: unrecognized arguments: --bogus"])
    m.handle(Exited(status=2, diagnosis=diag), 2)
    m.handle(CleanedUp(), 3)
    assert (
        "bad_argument in init: fix the flag (log: sglang serve: error: unrecognized "
        "arguments: --bogus)" == m.reason
    )


def test_gpu_wait_at_first_preflight_with_earlier_attempts_preflights_again() -> None:
    """With attempts already on the host (numbering starts past 0), busy GPUs at the first
    preflight still lead back to preflight, then to the next attempt number."""
    m = machine()
    m.attempt = m.attempt_base = 3
    m.handle(Start(), 0)
    m.handle(PreflightBlocked("GPU 0 busy", transient=True), 1)
    assert [RunPreflight()] == m.handle(GpusFree(), 5)
    actions = m.handle(PreflightPassed(), 6)
    assert Launch(4, LaunchParams(0.70, 32)) in actions
    assert 1 == emitted(actions, "attempt.started")["attempt"] - m.attempt_base


def test_deadline_does_not_apply_to_cleanup_after_a_crash_while_serving() -> None:
    """A server ready for longer than the start deadline that crashes is cleaned up and
    restarted, not given up on; the restart has a deadline of its own."""
    m = machine(start_deadline=60.0)
    m.handle(Start(), 0)
    t = to_ready(m)
    diag = Diagnosis(outcome=Outcome.KILLED, phase=Phase.READY, retryable=True)
    m.handle(Exited(status=137, diagnosis=diag), t + 5000)
    assert [] == m.handle(DeadlineExceeded(), t + 5001)
    m.handle(CleanedUp(), t + 5002)
    assert [] == m.handle(DeadlineExceeded(), t + 5003)
    assert "restart.scheduled" in names(m.handle(GpusFree(), t + 5004))
    m.handle(BackoffElapsed(), t + 5020)
    m.handle(PreflightPassed(), t + 5021)
    m.handle(Launched(pid=2), t + 5022)
    assert [Kill("deadline")] == m.handle(DeadlineExceeded(), t + 5090)


def test_busy_gpus_at_a_restarts_preflight_do_not_count_a_second_restart() -> None:
    """After a crash while serving, GPUs busy at the restart's preflight lead back to
    preflight, not to another restart."""
    m = machine()
    m.handle(Start(), 0)
    t = to_ready(m)
    diag = Diagnosis(outcome=Outcome.KILLED, phase=Phase.READY, retryable=True)
    m.handle(Exited(status=137, diagnosis=diag), t + 10)
    m.handle(CleanedUp(), t + 11)
    assert "restart.scheduled" in names(m.handle(GpusFree(), t + 12))
    m.handle(BackoffElapsed(), t + 30)
    m.handle(PreflightBlocked("GPU 0 busy", transient=True), t + 31)
    assert [RunPreflight()] == m.handle(GpusFree(), t + 35)
    assert Launch(2, LaunchParams(0.70, 32)) in m.handle(PreflightPassed(), t + 36)
    assert 1 == m.restart.restarts_in_window(t + 36)


def test_launched_after_a_stop_with_kill_is_left_to_the_kill() -> None:
    """A stop with kill while the launch runs: the launch's Launched is absorbed (the kill
    in progress stops that process) and the machine ends stopped."""
    m = machine()
    m.handle(Start(), 0)
    m.handle(PreflightPassed(), 1)
    assert [Kill("stop")] == m.handle(StopRequested(kill=True), 2)
    assert [] == m.handle(Launched(pid=77), 3)
    assert 77 == m.pid
    assert ["server.stopped"] == names(m.handle(CleanedUp(), 4))
    assert State.STOPPED == m.state


def test_stop_reports_left_running_only_for_a_live_server() -> None:
    """server.stopped always has left_running: the live server's pid when it was left
    running, None after a kill or when the last attempt had already died."""
    m = machine()
    m.handle(Start(), 0)
    m.handle(PreflightPassed(), 0)
    m.handle(Launched(pid=5), 1)
    m.handle(Exited(status=137, diagnosis=capture_oom()), 2)
    m.handle(CleanedUp(), 3)
    assert State.WAITING_FOR_GPUS == m.state
    actions = m.handle(StopRequested(kill=False), 4)
    assert {"reason": "stop requested", "left_running": None} == emitted(
        actions, "server.stopped")

    killed = machine()
    killed.handle(Start(), 0)
    to_ready(killed)
    killed.handle(StopRequested(kill=True), 50)
    actions = killed.handle(CleanedUp(), 51)
    assert {"reason": "stop requested", "left_running": None} == emitted(
        actions, "server.stopped")
    assert killed.pid is None


def test_ready_line_seen_twice_starts_one_probe_loop() -> None:
    """The ready line arrives both as a phase and as a line; probing starts only once."""
    m = machine()
    m.handle(Start(), 0)
    m.handle(PreflightPassed(), 0)
    m.handle(Launched(pid=1), 0)
    first = m.handle(PhaseSeen(Phase.READY), 5)
    second = m.handle(ReadyLineSeen(), 5)
    assert 1 == sum(isinstance(a, StartProbing) for a in first + second)


def _weights_oom(confidence: Confidence) -> Diagnosis:
    return Diagnosis(
        outcome=Outcome.OOM_WEIGHTS, phase=Phase.INIT, retryable=False, confidence=confidence,
        numbers=Numbers(tried_gib=2.0, free_gib=1.27, total_gib=95.08),
    )


def _after_failure(m: ServerMachine, diag: Diagnosis) -> list[object]:
    m.handle(Start(), 0)
    m.handle(PreflightPassed(), 0)
    m.handle(Launched(pid=1), 1)
    m.handle(Exited(status=1, diagnosis=diag), 2)
    actions = m.handle(CleanedUp(), 3)
    return actions + (m.handle(GpusFree(), 4) if WaitForGpus() in actions else [])


def test_a_weak_weights_oom_is_retried_lower_not_given_up() -> None:
    """An OOM whose phase only hints suggest (a pasted excerpt, no phase line, no frame) may
    well be a serving OOM: the machine lowers mem-fraction instead of giving up for good."""
    m = machine()
    actions = _after_failure(m, _weights_oom(Confidence.WEAK))
    assert State.GAVE_UP != m.state
    launch = next(a for a in actions if isinstance(a, Launch))
    assert launch.attempt == 2
    assert launch.params.mem_fraction_static is not None
    assert launch.params.mem_fraction_static < 0.70


def test_a_decisive_weights_oom_still_gives_up() -> None:
    m = machine()
    actions = _after_failure(m, _weights_oom(Confidence.DECISIVE))
    assert State.GAVE_UP == m.state
    assert "weight" in str(emitted(actions, "server.gave_up")["reason"])
def test_a_refused_host_gives_up_at_once_without_a_kill() -> None:
    """HostRefused (host key changed, credentials rejected) ends supervision from start-up
    or from ready alike, with its reason, and asks for no Kill: the host gets no command."""
    m = machine()
    actions = m.handle(HostRefused("host key of gpu1 changed: it was A, it is now B"), 0)
    assert (State.GAVE_UP, ["server.gave_up"]) == (m.state, names(actions))
    ready = machine()
    ready.handle(Start(), 0)
    to_ready(ready)
    actions = ready.handle(HostRefused("host key of gpu1 changed: it was A, it is now B"), 9)
    assert ["server.gave_up"] == names(actions)
    assert "it was A, it is now B" == emitted(actions, "server.gave_up")["reason"][-21:]
