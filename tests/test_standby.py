"""The fenced standby (docs/ha.md): the lease timing rule, the fence, the host's token check,
and two real `launcher up` processes against a real PostgreSQL and the simulated GPU host.

The scenarios of docs/ha.md's fault table, each with real processes: SIGKILL of the active,
SIGSTOP of the active past the TTL, the active cut off from the engine (a TCP proxy the test
cuts: a network namespace would also cut the launcher off the simulated host, whose processes it
starts itself), the engine restarted, and a server killed during a takeover.
"""

from __future__ import annotations

import math
import signal
import subprocess
import time
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path

import anyio
import pytest

from launcher.errors import FencedOut, LeaseLost, lease_lost_in
from launcher.host import run as remote
from launcher.host.transport.fenced import FencedTransport
from launcher.host.transport.local import LocalTransport
from launcher.store.coordination import Coordinator, EngineUnavailable, LeaseView, Membership
from launcher.store.fence import Fence, LeaseTiming
from launcher.supervise.supervisor import ServerSupervisor, supervise_all
from tests import procs
from tests.faketime import FakeTime
from tests.pg import CutProxy, Postgres
from tests.simhost import free_port
from tests.standby import Up, coordinated_config, stamp
from tests.supervise import SERVER, Recorded, Recorder, SimSetup, run_cli

# --- the timing rule and the fence (pure) --------------------------------------------------


def test_deadline_is_ttl_minus_margin_after_the_renewal_started() -> None:
    """A renewal sent at t keeps the fence valid until t + ttl - margin, never longer."""
    timing = LeaseTiming(ttl=9.0, margin=2.0)
    assert 3.0 == timing.renew_every
    assert 107.0 == timing.deadline(100.0)


def test_a_try_never_outlasts_the_deadline() -> None:
    """One renewal try may take until the next is due, and never past the deadline."""
    timing = LeaseTiming(ttl=9.0, margin=2.0)
    assert 3.0 == timing.try_budget(100.0, 107.0)
    assert 1.5 == timing.try_budget(105.5, 107.0)
    assert 0.0 == timing.try_budget(108.0, 107.0)


def test_margin_must_leave_room_for_two_renewals() -> None:
    """A margin that leaves no room for a failed renewal before the deadline is refused."""
    with pytest.raises(ValueError, match="margin"):
        LeaseTiming(ttl=9.0, margin=6.5)
    assert 2.25 == LeaseTiming.for_ttl(9.0).margin


def test_fence_is_valid_until_its_deadline_then_refuses() -> None:
    """The fence checks the deadline on its own clock; revoke ends it at once."""
    time = FakeTime(0.0)
    fence = Fence(time)
    with pytest.raises(LeaseLost):
        fence.check("launch")  # never granted
    fence.grant(7, 5.0)
    fence.check("launch")
    time.now = 4.999
    assert fence.valid()
    time.now = 5.0
    with pytest.raises(LeaseLost, match="launch refused"):
        fence.check("launch")
    fence.extend(9.0)
    assert fence.valid()
    fence.extend(6.0)  # never moves back
    assert 9.0 == fence.deadline
    fence.revoke()
    assert not fence.valid()
    assert 7 == fence.token


class FakeEngine:
    """An Engine whose answers the test scripts; every call takes ``delay`` of fake time."""

    def __init__(self, time: FakeTime) -> None:
        self.time = time
        self.calls: list[tuple[str, float]] = []
        self.renew_answers: list[bool | Exception] = []
        self.acquire_answers: list[tuple[int | None, LeaseView] | Exception] = []
        self.delay = 0.01

    async def _answer(self, name: str, answers: list[object]) -> object:
        self.calls.append((name, self.time()))
        await self.time.sleep(self.delay)
        answer = answers.pop(0) if answers else EngineUnavailable("no more answers")
        if isinstance(answer, Exception):
            raise answer
        return answer

    async def try_acquire(self) -> tuple[int | None, LeaseView]:
        return await self._answer("acquire", self.acquire_answers)  # type: ignore[return-value]

    async def renew(self, token: int) -> bool:
        return await self._answer("renew", self.renew_answers)  # type: ignore[return-value]

    async def release(self, token: int) -> None:
        self.calls.append(("release", self.time()))

    async def membership(self) -> Membership:
        raise NotImplementedError

    def drop(self) -> None:
        self.calls.append(("drop", self.time()))


def _coordinator(time: FakeTime, engine: FakeEngine) -> Coordinator:
    return Coordinator(engine, LeaseTiming(ttl=9.0, margin=2.0), box="a", clock=time,
                       sleep=time.sleep)


async def test_standby_polls_just_after_the_holders_expiry_then_takes_the_lease() -> None:
    """A standby wakes right after the expiry the engine reported, at most every ttl/3."""
    time = FakeTime(0.0)
    engine = FakeEngine(time)
    engine.acquire_answers = [
        (None, LeaseView("b", "h-b", 4, 8.0)),  # held for 8 s more: poll again in 3 s
        (None, LeaseView("b", "h-b", 4, 1.0)),  # 1 s more: poll again just after it
        (5, LeaseView("b", "h-b", 4, -0.04)),
    ]
    coord = _coordinator(time, engine)
    seen: list[str | None] = []
    acquired = await coord.wait_active(lambda v: seen.append(v.box), lambda _: None)
    assert [0.0, 3.01, 4.07] == [round(t, 2) for _, t in engine.calls]
    assert 5 == acquired.token and "b" == acquired.previous_box
    assert ["b"] == seen  # announced once per holder
    assert 4.07 + 7.0 == pytest.approx(coord.fence.deadline)  # sent + ttl - margin


async def test_active_renews_every_third_of_the_ttl() -> None:
    """Each success moves the deadline to its start + ttl - margin."""
    time = FakeTime(0.0)
    engine = FakeEngine(time)
    engine.acquire_answers = [(1, LeaseView(None, None, None, None))]
    engine.renew_answers = [True, True, False]
    coord = _coordinator(time, engine)
    await coord.wait_active(lambda _: None, lambda _: None)
    with pytest.raises(LeaseLost, match="another holder"):
        await coord.keep()
    renewals = [round(t, 2) for name, t in engine.calls if name == "renew"]
    assert [3.0, 6.0, 9.0] == renewals
    assert not coord.fence.valid()


async def test_active_stops_at_its_deadline_when_the_engine_is_unreachable() -> None:
    """Failed renewals are retried every second; at the deadline the fence is revoked and
    LeaseLost raised, before the engine's expiry (ttl after the last renewal was sent)."""
    time = FakeTime(0.0)
    engine = FakeEngine(time)
    engine.acquire_answers = [(1, LeaseView(None, None, None, None))]
    engine.renew_answers = [EngineUnavailable("refused")] * 10
    coord = _coordinator(time, engine)
    await coord.wait_active(lambda _: None, lambda _: None)
    with pytest.raises(LeaseLost, match="before the deadline"):
        await coord.keep()
    renewals = [round(t, 2) for name, t in engine.calls if name == "renew"]
    assert [3.0, 4.0, 5.0, 6.0] == renewals
    assert 7.0 == pytest.approx(time.now)  # the deadline: 0 + ttl - margin
    assert not coord.fence.valid()


# --- the host refuses a lower token (real shell) ---------------------------------------------


def _spec(tmp_path: Path, attempt: int) -> remote.AttemptSpec:
    return remote.AttemptSpec(server="srv", attempt=attempt, run_dir=str(tmp_path / "run"),
                              argv=["sleep", "30"], env={})


def _fenced(token: int) -> FencedTransport:
    fence = Fence()
    fence.grant(token, math.inf)
    return FencedTransport(LocalTransport("local"), fence)


async def test_host_refuses_a_launch_with_a_lower_token(tmp_path: Path) -> None:
    """Once token 6 launched there, a launch with token 5 is refused and nothing starts."""
    handle = await remote.launch(_fenced(6), _spec(tmp_path, 1))
    try:
        with pytest.raises(FencedOut, match="newer lease"):
            await remote.launch(_fenced(5), _spec(tmp_path, 2))
        assert not (tmp_path / "run" / "srv" / "2").exists()  # nothing half-made
        assert ["6"] == sorted(p.name for p in (tmp_path / "run" / "srv" / "fence").iterdir())
        with pytest.raises(FencedOut):
            await remote.stop(_fenced(5), handle, grace=1.0)
        assert procs.recorded_pid(Path(handle.dir)) is not None  # not signalled
        await remote.survey(_fenced(7), str(tmp_path / "run"), "srv", adopting=True)
        with pytest.raises(FencedOut):
            await remote.stop(_fenced(6), handle, grace=1.0)
    finally:
        await remote.stop(_fenced(7), handle, grace=1.0)


async def test_a_lost_fence_refuses_every_host_action_before_it_is_sent(
        tmp_path: Path) -> None:
    """Behind a revoked fence, launch, stop and listing raise LeaseLost and nothing reaches
    the host: no attempt directory, the running server is not signalled."""
    transport = _fenced(3)
    handle = await remote.launch(transport, _spec(tmp_path, 1))
    try:
        assert isinstance(transport.fence, Fence)
        transport.fence.revoke()
        with pytest.raises(LeaseLost, match="refused"):
            await remote.launch(transport, _spec(tmp_path, 2))
        with pytest.raises(LeaseLost):
            await remote.stop(transport, handle, grace=1.0)
        with pytest.raises(LeaseLost):
            await remote.survey(transport, str(tmp_path / "run"), "srv", adopting=True)
        with pytest.raises(LeaseLost):
            async for _ in remote.follow(transport, handle):
                pass
        assert [1] == [int(p.name) for p in (tmp_path / "run" / "srv").iterdir()
                       if p.name.isdigit()]
        assert procs.recorded_pid(Path(handle.dir)) is not None
    finally:
        await remote.stop(_fenced(3), handle, grace=1.0)


async def test_a_router_request_over_a_long_lived_client_checks_the_fence() -> None:
    """A worker registration goes over a client opened while the fence was valid: each
    request checks the fence again, so none is sent once it is revoked."""
    import httpx

    from launcher.host import health
    from tests.simhost import free_port

    transport = _fenced(4)
    async with health.client_for(transport, free_port(), "127.0.0.1", 5.0) as (client, url):
        with pytest.raises(httpx.ConnectError):  # valid: the request is sent (nobody listens)
            await client.post(url.removesuffix("/health") + "/workers")
        transport.fence.revoke()
        with pytest.raises(LeaseLost, match="POST /workers"):
            await client.post(url.removesuffix("/health") + "/workers")


# --- a lost lease inside a supervisor: no failure, no retry, no give-up ------------------------

# What a supervisor reports when it takes something for a failure of the server or its host.
FAILURE_EVENTS = {"launch.failed", "attempt.failed", "server.gave_up", "server.internal_error",
                  "server.unhealthy", "restart.scheduled", "probe.failed", "follow.failed",
                  "process.stop_failed", "listing.failed", "server.unknown"}


async def _supervise_fenced(sim: SimSetup, fence: Fence,
                            on: Callable[[Recorded], None]) -> tuple[Recorder, BaseException]:
    """supervise_all (as the daemon runs it) over the sim's server behind ``fence``, with
    ``on`` called on each event; returns the events and what supervise_all raised."""
    config = sim.config()
    server = config.servers[0]
    transport = FencedTransport(LocalTransport(server.host, env=config.host(server.host).env),
                                fence)
    rec = Recorder(on=[on])
    sup = ServerSupervisor(config, server, transport, sglang_version="0.5.23", hooks=[rec])
    try:
        with anyio.fail_after(45):
            await supervise_all([sup])
    except BaseException as exc:  # a task group's group, or the LeaseLost itself
        return rec, exc
    raise AssertionError(f"supervision ended without LeaseLost: {rec.summary()}")


async def test_a_fence_revoked_before_the_launch_is_no_failed_attempt(sim: SimSetup) -> None:
    """The fence is revoked between the attempt's start and its launch command: the launch is
    refused before anything is sent, and the LeaseLost reaches supervise_all's caller, not
    taken for a failed launch (no launch.failed, attempt.failed, back-off or give-up)."""
    fence = Fence()
    fence.grant(1, math.inf)

    def revoke_at_start(e: Recorded) -> None:
        if e.name == "attempt.started":
            fence.revoke()

    rec, raised = await _supervise_fenced(sim, fence, revoke_at_start)
    assert lease_lost_in(raised) is not None, raised
    assert [] == [e.name for e in rec.events if e.name in FAILURE_EVENTS]
    assert [] == sim.attempts()  # nothing reached the host


async def test_a_fence_past_its_deadline_at_a_death_is_no_failed_relaunch(
        sim: SimSetup) -> None:
    """The server dies once ready, and the fence's deadline passes (its own fake clock) as
    the death is reported: the relaunch is refused before it is sent and supervision ends
    with LeaseLost. The death is the one failed attempt; the refused relaunch is neither a
    failed launch nor a second failed attempt, and nothing gives up."""
    time = FakeTime(0.0)
    fence = Fence(time)
    fence.grant(1, 10.0)

    def kill_then_lapse(e: Recorded) -> None:
        if e.name == "server.ready":
            procs.signal_group(sim.pid(1), signal.SIGKILL)
        if e.name == "process.died":
            time.now = 10.0

    rec, raised = await _supervise_fenced(sim, fence, kill_then_lapse)
    assert lease_lost_in(raised) is not None, raised
    assert [1] == [e.data["attempt"] for e in rec.events if e.name == "attempt.failed"]
    assert [] == [e.name for e in rec.events
                  if e.name in FAILURE_EVENTS - {"attempt.failed", "restart.scheduled"}]
    assert [1] == sim.attempts()  # the relaunch never reached the host


def test_shim_refuses_a_claim_with_a_lower_token(tmp_path: Path) -> None:
    """The launch shim, run by sh as on a host, exits 122 before its claim when the server's
    fence directory holds a higher token: the server never runs, the env file is removed."""
    server_dir = tmp_path / "srv"
    attempt = server_dir / "3"
    attempt.mkdir(parents=True)
    (server_dir / "fence").mkdir()
    (server_dir / "fence" / "9").touch()
    (attempt / "env").write_text("export X=1\n")
    marker = tmp_path / "ran"
    result = subprocess.run(["sh", "-c", remote._SHIM, "sh", str(attempt), "8", "",
                             "touch", str(marker)], capture_output=True, timeout=30)
    assert remote.SHIM_FENCED_STATUS == result.returncode
    assert (attempt / "fenced").exists()
    assert not (attempt / "claim").exists() and not (attempt / "env").exists()
    assert not marker.exists()
    (attempt / "env").write_text("export X=1\n")
    ok = subprocess.run(["sh", "-c", remote._SHIM, "sh", str(attempt), "9", "",
                         "touch", str(marker)], capture_output=True, timeout=30)
    assert 0 == ok.returncode and marker.exists()  # the same token may act


# --- real launchers, a real PostgreSQL -------------------------------------------------------


@pytest.fixture(scope="module")
def postgres() -> Iterator[Postgres]:
    """A real PostgreSQL server (Debian's package) for this module's tests."""
    pg = Postgres()
    pg.start()
    try:
        yield pg
    finally:
        pg.cleanup()


@pytest.fixture
def lease() -> str:
    """A lease name of this test's own: the tests share one database."""
    return "t" + uuid.uuid4().hex[:12]


@pytest.fixture
def ups() -> Iterator[list[Up]]:
    """The launchers a test started; stopped at teardown (before the sim's cleanup)."""
    started: list[Up] = []
    yield started
    for up in started:
        up.stop()


def _launched(up: Up) -> list[int]:
    return [e["attempt"] for e in up.events("remote.launched")]


def _host_actions(up: Up) -> list[dict[str, object]]:
    """What ``up`` did on the host: launches and signals."""
    return [e for e in up.lines() if e.get("event") in ("remote.launched", "remote.signal_sent")]


def _active_and_standby(sim: SimSetup, postgres: Postgres, lease: str, ups: list[Up],
                        *, active_dsn: str | None = None) -> tuple[Up, Up]:
    a = Up(sim, "box-a", active_dsn or postgres.dsn, lease)
    ups.append(a)
    a.wait("lease.acquired")
    a.wait("server.ready")
    b = Up(sim, "box-b", postgres.dsn, lease)
    ups.append(b)
    assert "box-a" == b.wait("lease.standby")["active_box"]
    return a, b


@pytest.mark.slow
@pytest.mark.timeout(240)
def test_sigkill_of_the_active_standby_adopts_without_relaunching(
        sim: SimSetup, postgres: Postgres, lease: str, ups: list[Up]) -> None:
    """The standby takes the lease after the TTL and adopts the running server: one attempt
    in the run dir, launched once, by the first active; status names the new active box."""
    a, b = _active_and_standby(sim, postgres, lease, ups)
    a.signal(signal.SIGKILL)
    assert -signal.SIGKILL == a.exit_code()
    acquired = b.wait("lease.acquired")
    assert "box-a" == acquired["previous_box"] and 2 == acquired["token"]
    assert 1 == b.wait("server.adopted")["attempt"]
    assert [1] == sim.attempts() and sim.alive(1)
    assert [1] == _launched(a) and [] == _launched(b)
    assert any(e.get("kind") == "takeover" for e in b.events("notify.message"))
    status = run_cli("status", str(sim.root / "box-b.toml"), env={"PG_DSN": postgres.dsn})
    assert "active box-b" in status.stdout, status.stdout + status.stderr


@pytest.mark.slow
@pytest.mark.timeout(240)
def test_sigstop_past_the_ttl_the_old_active_does_nothing_and_exits(
        sim: SimSetup, postgres: Postgres, lease: str, ups: list[Up]) -> None:
    """The active is stopped past its TTL; the standby takes over; the server dies while the
    old active is stopped. Continued, the old active sees its lease lost, launches and kills
    nothing, and exits 6; the new active relaunched the server, once."""
    a, b = _active_and_standby(sim, postgres, lease, ups)
    before = len(_host_actions(a))
    a.signal(signal.SIGSTOP)
    b.wait("lease.acquired")
    b.wait("server.adopted")
    procs.signal_group(sim.pid(1), signal.SIGKILL)  # a death the old active would act on
    b.wait_for(lambda e: e.get("event") == "server.ready" and e.get("attempt") == 2)
    assert [2] == _launched(b)
    a.signal(signal.SIGCONT)
    assert 6 == a.exit_code()
    assert 1 == len(a.events("lease.lost"))
    assert before == len(_host_actions(a))  # nothing on the host after the stop
    assert [1, 2] == sim.attempts() and sim.alive(2)


@pytest.mark.slow
@pytest.mark.timeout(240)
def test_active_cut_off_from_the_engine_stops_before_the_standby_starts(
        sim: SimSetup, postgres: Postgres, lease: str, ups: list[Up]) -> None:
    """The active's connection to PostgreSQL goes into a black hole while it still reaches
    the host: it declares its lease lost (and exits 6) before the standby takes it, and its
    last action on the host comes before that."""
    proxy = CutProxy(postgres.port)
    try:
        a, b = _active_and_standby(sim, postgres, lease, ups,
                                   active_dsn=Postgres.dsn_at(proxy.port))
        proxy.cut()
        lost = a.wait("lease.lost")
        acquired = b.wait("lease.acquired")
        assert 6 == a.exit_code()
        assert stamp(lost) < stamp(acquired)
        assert all(stamp(e) < stamp(lost) for e in _host_actions(a))
        assert 1 == b.wait("server.adopted")["attempt"]
        assert [1] == sim.attempts()
    finally:
        proxy.close()


@pytest.mark.slow
@pytest.mark.timeout(240)
def test_engine_restart_does_not_flap_the_leadership(
        sim: SimSetup, postgres: Postgres, lease: str, ups: list[Up]) -> None:
    """PostgreSQL restarted (fast) under both launchers: the active keeps its lease (its
    renewals fail for a moment, then reconnect) and the standby stays a standby."""
    a, b = _active_and_standby(sim, postgres, lease, ups)
    postgres.restart()
    # Long enough for the active's deadline and the standby's polls to pass twice.
    anyio.run(anyio.sleep, 12.0)
    acquired = a.events("lease.acquired") + b.events("lease.acquired")
    assert 1 + len(a.events("lease.lost")) >= len(acquired) >= 1
    assert len(acquired) <= 2  # at most one change of leader
    if len(acquired) == 1:
        assert a.proc.poll() is None and [] == a.events("lease.lost")
    assert [1] == sim.attempts()


@pytest.mark.slow
@pytest.mark.timeout(240)
def test_server_killed_during_takeover_is_relaunched_once(
        sim: SimSetup, postgres: Postgres, lease: str, ups: list[Up]) -> None:
    """The active is killed, then the server, before the standby takes over: the new
    active finds it dead and relaunches it once (attempt 2); nobody launches a third."""
    a, b = _active_and_standby(sim, postgres, lease, ups)
    a.signal(signal.SIGKILL)
    a.exit_code()
    procs.signal_group(sim.pid(1), signal.SIGKILL)
    b.wait("lease.acquired")
    b.wait("server.ready")
    anyio.run(anyio.sleep, 2.0)  # time for a second launch, if there were one
    assert [2] == _launched(b)
    assert [1, 2] == sim.attempts() and sim.alive(2)


@pytest.mark.slow
@pytest.mark.timeout(240)
def test_every_box_serves_launcher_leader_and_exactly_one_reads_1(
        sim: SimSetup, postgres: Postgres, lease: str, ups: list[Up]) -> None:
    """Both boxes serve /metrics, the standby too: the active reads 1, the standby 0. After
    a SIGKILL of the active, the standby reads 1 once it holds the lease."""
    a = Up(sim, "box-a", postgres.dsn, lease, metrics_port=free_port())
    ups.append(a)
    a.wait("lease.acquired")
    a.wait("server.ready")
    b = Up(sim, "box-b", postgres.dsn, lease, metrics_port=free_port())
    ups.append(b)
    b.wait("lease.standby")
    b.wait("metrics.listening")
    assert (1.0, 0.0) == (a.leader(lease), b.leader(lease))
    a.signal(signal.SIGKILL)
    a.exit_code()
    assert a.leader(lease) is None  # nothing answers on the killed box
    b.wait("lease.acquired")
    assert 1.0 == b.leader(lease)


# --- the ledger's shared parts ------------------------------------------------------------


def test_a_ledger_takes_the_shared_rows_newer_last_good_and_every_notify_state(
        tmp_path: Path) -> None:
    """What the active box's ledger shares, merged into another box's: a newer last good
    replaces an older one (never the reverse), the notifier's memory is taken, a row that
    cannot be read is skipped."""
    from launcher.params import LaunchParams
    from launcher.store.ledger import Ledger, NotifyState, SharedRow

    with Ledger(tmp_path / "a.sqlite3") as a, Ledger(tmp_path / "b.sqlite3") as b:
        a.server_ready("llama", "fp-new", LaunchParams(0.81, 128), 30.0, 2, at=2000.0)
        a.server_ready("llama", "fp-old", LaunchParams(0.70, 64), 30.0, 1, at=1000.0)
        a.save_notify_state(NotifyState("llama", "gave_up", last_sent=1500.0,
                                        firing_since=1400.0, announced=True,
                                        payload={"text": "llama gave up"}))
        b.server_ready("llama", "fp-new", LaunchParams(0.90, 256), 30.0, 1, at=1500.0)
        b.server_ready("llama", "fp-old", LaunchParams(0.60, 32), 30.0, 1, at=1800.0)
        rows = a.shared_rows()
        assert {("last_good", "fp-new"), ("last_good", "fp-old"),
                ("notify_state", "llama/gave_up")} == {(r.kind, r.key) for r in rows}
        assert 2 == b.merge_shared([*rows, SharedRow("last_good", "fp-bad", "{not json")])
        assert LaunchParams(0.81, 128) == b.last_good("fp-new")  # a's is newer
        assert LaunchParams(0.60, 32) == b.last_good("fp-old")  # b's own is newer
        assert a.notify_states() == b.notify_states()
        assert {r.body for r in rows if r.kind == "notify_state"} == {
            r.body for r in b.shared_rows() if r.kind == "notify_state"}


def test_a_new_active_box_calibrates_from_the_observations_the_old_one_shared(
        tmp_path: Path) -> None:
    """The observations a ledger shares reach another box's calibration (``observations``
    reads them beside its own), keyed by the ledger that made them: merging twice, or a
    ledger's own rows coming back, changes nothing; a later copy replaces the earlier; the
    receiving box passes them on under the same key; a row of the wrong shape is skipped; a
    start-up two boxes observed counts once."""
    import json

    from launcher.memory.calibration import ObservationKey
    from launcher.params import LaunchParams
    from launcher.sglang.observed import Observed
    from launcher.store.ledger import Ledger, SharedRow

    key = ObservationKey("Qwen3ForCausalLM", "NVIDIA H200", "0.5.23", "")
    seen = Observed(weights_gib=30.73, kv_tokens=1106880, kv_pool_gib=76.06,
                    graph_mem_gib={"target_decode": 0.66}, graph_max_bs=256)
    params = LaunchParams(0.812, 256)
    with Ledger(tmp_path / "a.sqlite3") as a, Ledger(tmp_path / "b.sqlite3") as b, \
            Ledger(tmp_path / "c.sqlite3") as c:
        a.attempt_started("qwen", "fp", 1, params, 5.0)
        a.record_observation("qwen", 1, key, seen, outcome="ready", params=params,
                             model="/m/Qwen3-32B", tp=2, at=10.0)
        b.attempt_started("llama", "fp2", 1, params, 6.0)
        b.record_observation("llama", 1, key, seen, outcome="ready", params=params, at=11.0)
        shared = [r for r in a.shared_rows() if r.kind == "observation"]
        assert [f"{a.origin()}/{a.observations()[0].attempt_id}"] == [r.key for r in shared]
        bad = SharedRow("observation", "ffff/9", json.dumps(
            {**json.loads(shared[0].body), "tp": "two"}))
        assert 1 == b.merge_shared([*shared, bad, SharedRow("observation", "no-slash", "{}")])
        assert 0 == b.merge_shared(shared)
        assert 0 == a.merge_shared(shared)  # its own: already there
        got = {(r.origin, r.server, r.tp) for r in b.observations(
            architecture=key.architecture, gpu_model=key.gpu_model)}
        assert {(a.origin(), "qwen", 2), ("", "llama", 1)} == got
        [theirs] = [r for r in b.observations() if r.origin]
        assert (seen, params, "/m/Qwen3-32B", 10.0) == (
            theirs.observed, theirs.params, theirs.model, theirs.recorded_at)
        # a's attempt ended again (an OOM while serving): the new copy replaces the old one
        later = Observed(weights_gib=30.73, tried_gib=4.0, free_gib=1.0)
        a.record_observation("qwen", 1, key, later, outcome="oom_runtime", params=params,
                             at=20.0)
        assert 1 == b.merge_shared([r for r in a.shared_rows() if r.kind == "observation"])
        [theirs] = [r for r in b.observations() if r.origin]
        assert (later, "oom_runtime") == (theirs.observed, theirs.outcome)
        # b passes both on; c gets a's under a's key, once, and b's own
        passed = [r for r in b.shared_rows() if r.kind == "observation"]
        assert {f"{a.origin()}/1", f"{b.origin()}/1"} == {r.key for r in passed}
        assert 2 == c.merge_shared(passed)
        assert {a.origin(), b.origin()} == {r.origin for r in c.observations()}
        assert 3 == len({a.origin(), b.origin(), c.origin()})
        # b adopts qwen's attempt 1 and records what it saw of that start-up: one start-up,
        # one figure, b's own (on b, and on c once b shares it)
        b.attempt_adopted("qwen", "fp", 1, params, 5.0)
        b.record_observation("qwen", 1, key, seen, outcome="ready", params=params, at=30.0)
        assert [("", 30.0)] == [(r.origin, r.recorded_at) for r in b.observations()
                                if r.server == "qwen"]
        assert 1 == c.merge_shared([r for r in b.shared_rows() if r.kind == "observation"])
        assert [(b.origin(), 30.0)] == [(r.origin, r.recorded_at) for r in c.observations()
                                        if r.server == "qwen"]


async def test_the_database_keeps_the_observations_written_last(
        postgres: Postgres, lease: str) -> None:
    """Observations do not accumulate without bound in the database: a write drops all but
    the ``observations_kept`` written last before it (never one it writes), only under the
    current token, and never a row of another kind."""
    from launcher.store.coordination import PgEngine
    from launcher.store.ledger import SharedRow

    engine = PgEngine(postgres.dsn, lease=lease, holder="h1", box="box-a", ttl=30.0,
                      observations_kept=2)
    try:
        token, _ = await engine.try_acquire()
        assert token is not None
        good = SharedRow("last_good", "fp", '{"x": 1}')
        assert await engine.store_shared(token, [good, *(
            SharedRow("observation", f"o/{i}", "{}") for i in (1, 2, 3))])
        assert await engine.store_shared(token, [SharedRow("observation", "o/4", "{}")])
        assert await engine.store_shared(token, [SharedRow("observation", "o/5", "{}")])
        # each write drops what lies beyond the 2 written last before it
        assert {"fp", "o/3", "o/4", "o/5"} == {r.key for r in await engine.load_shared()}
        # an old token neither writes nor drops
        assert not await engine.store_shared(token - 1, [SharedRow("observation", "o/6", "{}")])
        assert {"fp", "o/3", "o/4", "o/5"} == {r.key for r in await engine.load_shared()}
    finally:
        engine.drop()


async def test_shared_rows_are_written_only_under_the_current_token(
        postgres: Postgres, lease: str) -> None:
    """store_shared writes while its token holds the lease, and nothing with an older one;
    load_shared reads back exactly what was written."""
    from launcher.store.coordination import PgEngine
    from launcher.store.ledger import SharedRow

    engine = PgEngine(postgres.dsn, lease=lease, holder="h1", box="box-a", ttl=30.0)
    try:
        token, _ = await engine.try_acquire()
        assert token is not None
        row = SharedRow("last_good", "fp", '{"x": 1}')
        assert await engine.store_shared(token, [row])
        assert not await engine.store_shared(token - 1, [SharedRow("last_good", "fp", "{}")])
        assert not await engine.store_shared(token + 1, [SharedRow("last_good", "fp2", "{}")])
        assert [row] == await engine.load_shared()
    finally:
        engine.drop()


def _shared_keys(postgres: Postgres, lease: str, kind: str, awaited: str) -> set[str]:
    """The keys of ``kind`` in the lease's shared rows, read with a client of the test's own
    once ``awaited`` is among them (or after 30 s)."""
    from launcher.store.coordination import PgEngine

    async def keys() -> set[str]:
        engine = PgEngine(postgres.dsn, lease=lease, holder="probe", box="probe", ttl=30.0)
        try:
            with anyio.move_on_after(30):
                while True:
                    found = {r.key for r in await engine.load_shared() if r.kind == kind}
                    if awaited in found:
                        break
                    await anyio.sleep(0.1)
            return found
        finally:
            engine.drop()

    return anyio.run(keys)


@pytest.mark.slow
@pytest.mark.timeout(240)
def test_the_new_active_box_starts_from_the_old_ones_last_good_params(
        sim: SimSetup, postgres: Postgres, lease: str, ups: list[Up]) -> None:
    """The active box's last good params and observed figures reach the database; after a
    SIGKILL of it, the new active box (which never ran the server) takes them into its
    ledger, plans its first attempt as a warm start from them and has the figures to
    calibrate from."""
    from launcher.store.ledger import Ledger, ledger_path

    a, b = _active_and_standby(sim, postgres, lease, ups)
    with Ledger(ledger_path(sim.root / "state-box-a")) as ledger:
        for _ in range(600):  # the recorder files the ready attempt's figures
            if ledger.observations():
                break
            time.sleep(0.05)
        [observed] = ledger.observations()
        origin = ledger.origin()
    key = f"{origin}/{observed.attempt_id}"
    assert key in _shared_keys(postgres, lease, "observation", key)
    a.signal(signal.SIGKILL)
    a.exit_code()
    b.wait("lease.acquired")
    assert 2 <= b.wait("ledger.shared_loaded")["taken"]
    initial = b.wait("params.initial")
    assert str(initial["reason"]).startswith("warm start from last good params"), initial
    assert 1 == b.wait("server.adopted")["attempt"]
    # the old box's figures now calibrate the new one's estimates
    with Ledger(ledger_path(sim.root / "state-box-b")) as ledger:
        assert [(origin, observed.observed)] == [
            (r.origin, r.observed) for r in ledger.observations() if r.origin]


@pytest.mark.slow
@pytest.mark.timeout(240)
def test_a_stopped_active_box_says_a_standby_takes_over_not_to_stop_the_servers(
        sim: SimSetup, postgres: Postgres, lease: str, ups: list[Up]) -> None:
    """SIGTERM of the active box: its exit line says it released the lease and that a
    standby takes the server over; it does not tell the operator to `launcher down` what the
    standby is about to supervise."""
    a, b = _active_and_standby(sim, postgres, lease, ups)
    a.signal(signal.SIGTERM)
    assert 0 == a.exit_code()
    assert 1 == b.wait("server.adopted")["attempt"]
    text = a.log_path.read_text(errors="replace")
    assert (f"launcher exited and released the lease; left running: {SERVER} (a standby box "
            "takes them over; only if none stands by, stop them with `launcher down`)"
            in text), a.tail()
    assert "(stop them with `launcher down`)" not in text


# --- visibility and config -----------------------------------------------------------------


def test_leader_gauge_follows_the_lease_events() -> None:
    """launcher_leader{lease} starts at 0 on a coordinated launcher, is 0 while standing by
    or after a loss, 1 once the lease is held."""
    from launcher.hooks.metrics import Metrics
    from launcher.supervise import events

    metrics = Metrics(lease="fleet-a", leader=False)

    def leader() -> float | None:
        return metrics.registry.get_sample_value("launcher_leader", {"lease": "fleet-a"})

    assert 0.0 == leader()
    metrics("", events.LeaseStandby(box="b", active_box="a", remaining_s=3.0))
    assert 0.0 == leader()
    metrics("", events.LeaseAcquired(box="b", token=2, previous_box="a", waited_s=4.0))
    assert 1.0 == leader()
    metrics("", events.LeaseEnded(box="b", token=2, reason="lease lost"))
    assert 0.0 == leader()


def test_takeover_message_names_both_boxes() -> None:
    """The Slack message of a takeover says which box is active now and which was."""
    from launcher.hooks.messages import Kind, takeover_message
    from launcher.supervise import events

    message = takeover_message(events.LeaseAcquired(box="ops-2", token=7, previous_box="ops-1",
                                                    waited_s=9.5))
    assert Kind.TAKEOVER is message.kind
    assert "ops-2 took over from ops-1" in message.text and "token 7" in message.text


def test_coordination_config_refuses_a_literal_dsn_and_a_short_ttl() -> None:
    """A DSN written in the file (it may hold a password) and a TTL under 3 s are config
    errors naming the field."""
    from launcher.config.load import config_from_dict
    from launcher.errors import ConfigError

    with pytest.raises(ConfigError) as caught:
        config_from_dict({"coordination": {"dsn": "postgresql://u:secret@db/x", "ttl": "1s"}},
                         environ={})
    text = "\n".join(caught.value.problems)
    assert "coordination.dsn" in text and "u:secret@db" not in text  # never echoed
    assert "coordination.ttl" in text
    config = config_from_dict({"coordination": {"dsn": "env:PG"}}, environ={})
    assert config.coordination is not None and 9.0 == config.coordination.ttl
    with pytest.raises(ConfigError, match=r"coordination\.dsn: environment variable PG"):
        config.coordination.resolve_dsn({})


def _without_asyncpg(tmp_path: Path) -> str:
    """A PYTHONPATH entry whose ``asyncpg`` package fails to import, as on a box where the
    ``ha`` extra was never installed."""
    stub = tmp_path / "noapg" / "asyncpg"
    stub.mkdir(parents=True)
    (stub / "__init__.py").write_text(
        "raise ModuleNotFoundError(\"No module named 'asyncpg'\", name='asyncpg')\n")
    return str(stub.parent)


@pytest.mark.parametrize("command", ["up", "check"])
def test_coordination_without_the_postgresql_client_is_a_config_error(
        sim: SimSetup, tmp_path: Path, command: str) -> None:
    """`[coordination]` on a box without asyncpg: `up` and `check` exit 2 (the unit does not
    restart it) with one error naming the fix, no traceback, nothing started."""
    config = coordinated_config(sim, "box-a", "lease-a")
    args = ["--log-format", "json"] if command == "up" else []

    result = run_cli(command, str(config), *args,
                     env={"PG_DSN": "postgresql://launcher@127.0.0.1:1/postgres",
                          "PYTHONPATH": _without_asyncpg(tmp_path)})

    assert 2 == result.returncode, result.stdout + result.stderr
    assert "Traceback" not in result.stderr
    assert f"{config}: 1 problem(s)" in result.stderr
    assert "needs the PostgreSQL client asyncpg" in result.stderr
    assert "pip install 'launcher[ha]'" in result.stderr
    assert len(result.stderr.strip().splitlines()) <= 4, result.stderr
    assert not sim.run_dir.exists() and "lease.joining" not in result.stdout


@pytest.mark.parametrize("command", ["up", "check", "status"])
def test_an_unset_dsn_variable_is_a_config_error_headed_with_the_config_file(
        sim: SimSetup, command: str) -> None:
    """`dsn = "env:VAR"` with VAR unset: exit 2 before anything starts, the error headed with
    the config file as other config errors are (not "secret_env")."""
    data = sim.data()
    data["coordination"] = {"dsn": "env:PG_DSN_NOT_SET_HERE", "box": "box-a"}
    config = sim.write_toml(data)
    args = ["--log-format", "json"] if command == "up" else []

    result = run_cli(command, str(config), *args)

    assert 2 == result.returncode, result.stdout + result.stderr
    assert f"ConfigError: {config}: 1 problem(s):" in result.stderr
    assert ("coordination.dsn: environment variable PG_DSN_NOT_SET_HERE is not set"
            in result.stderr)
    assert "secret_env" not in result.stderr and "Traceback" not in result.stderr
    assert not sim.run_dir.exists() and "lease.joining" not in result.stdout


def test_check_connects_to_the_coordination_database_once(
        sim: SimSetup, postgres: Postgres, lease: str) -> None:
    """`check` of a `[coordination]` box reports the database like a host: ok with its
    version, exit 0; unreachable with the reason, exit 1, after one bounded try."""
    config = coordinated_config(sim, "box-a", lease)

    ok = run_cli("check", str(config), env={"PG_DSN": postgres.dsn})
    dead = free_port()
    started = time.monotonic()
    down = run_cli("check", str(config), env={"PG_DSN": Postgres.dsn_at(dead)})
    took = time.monotonic() - started

    assert 0 == ok.returncode, ok.stdout + ok.stderr
    assert f"coordination (lease {lease}, box box-a): ok  PostgreSQL " in ok.stdout
    assert 1 == down.returncode, down.stdout + down.stderr
    assert f"coordination (lease {lease}, box box-a): unreachable: " in down.stderr
    assert str(dead) in down.stderr  # the reason: where it was refused
    assert took < 30, took
    assert "sim0 on " in down.stdout  # the hosts are still checked
