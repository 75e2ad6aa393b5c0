"""No server lost, none duplicated: a restarted supervisor launches only on a listing of the
host's attempts that succeeded and found nothing running.

Real sim servers on the local transport; the listing's failures are injected by a fake
transport (a LocalTransport that fails the listing command while told to), never by mocking
the supervisor.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import pytest

from launcher.errors import CommandTimedOut, HostUnreachable, LauncherError
from launcher.host import run as remote
from launcher.host.transport.base import CommandResult
from launcher.host.transport.local import LocalTransport
from launcher.supervise.lifecycle import State
from tests.faketime import FakeTime
from tests.supervise import Recorded, Recorder, SimSetup, ready_or_done, supervise

pytestmark = pytest.mark.timeout(90)


class FlakyListing(LocalTransport):
    """The sim host, except that listing a server's attempts fails with the next error of
    ``failures`` (one per listing) while any are left, or with ``forever`` while it is set."""

    def __init__(self, name: str, env: Mapping[str, str], failures: Sequence[LauncherError],
                 forever: LauncherError | None = None) -> None:
        super().__init__(name, env=env)
        self.failures = list(failures)
        self.forever = forever
        self.listings = 0

    async def run(self, argv: Sequence[str], **kwargs: Any) -> CommandResult:
        if list(argv[:3]) == ["sh", "-c", remote._LIST]:
            self.listings += 1
            if self.failures:
                raise self.failures.pop(0)
            if self.forever is not None:
                raise self.forever
        return await super().run(argv, **kwargs)


def flaky(sim: SimSetup, failures: Sequence[LauncherError] = (),
          forever: LauncherError | None = None) -> FlakyListing:
    return FlakyListing("simhost", sim.host_env, failures, forever)


async def test_a_failed_listing_is_retried_and_the_running_server_adopted(
    sim: SimSetup,
) -> None:
    """Listing fails twice (lost connection, command timeout), then works: the running server
    is adopted; nothing is launched (the bug: the first failure made the supervisor launch
    fresh, preflight found the port taken, and the running server was left unsupervised)."""
    config = sim.config(mem_fraction_static=0.8, cuda_graph_max_bs=8)
    first = await supervise(config, until=ready_or_done)
    assert first.stopped_by_test and sim.alive(1)

    transport = flaky(sim, [HostUnreachable("connection lost", host="simhost"),
                            CommandTimedOut("listing timed out after 30 s", host="simhost")])
    second = await supervise(config, until=ready_or_done, transport=transport)

    rec = second.events
    assert State.READY == second.state, rec.summary()
    assert 3 == transport.listings
    assert [1, 2] == [r["try"] for r in rec.of("listing.retry")]
    assert [1] == [a["attempt"] for a in rec.of("server.adopted")]
    assert not rec.has("attempt.started") and not rec.has("server.gave_up")
    assert [1] == sim.attempts()
    assert sim.alive(1)


async def test_a_listing_that_never_works_leaves_the_server_unknown_not_absent(
    sim: SimSetup,
) -> None:
    """While no listing succeeds the server is "unknown": nothing is launched, however long
    it lasts; once a listing succeeds, the running server is adopted."""
    config = sim.config(mem_fraction_static=0.8, cuda_graph_max_bs=8)
    first = await supervise(config, until=ready_or_done)
    assert first.stopped_by_test and sim.alive(1)
    transport = flaky(sim, forever=HostUnreachable("connection refused", host="simhost"))
    rec = Recorder()

    def heal_after_three_rounds(event: Any) -> None:
        if event.name == "listing.failed" and len(rec.of("listing.failed")) == 3:
            assert State.UNKNOWN == supervisor[0].state
            assert [1] == sim.attempts()  # nothing launched meanwhile
            transport.forever = None

    supervisor: list[Any] = []
    rec.on.append(heal_after_three_rounds)
    second = await supervise(config, until=ready_or_done, transport=transport, recorder=rec,
                             on_start=supervisor.append,
                             options={"listing_tries": 2, "listing_recheck_s": 0.05})

    assert State.READY == second.state, rec.summary()
    [unknown] = rec.of("server.unknown")
    assert "cannot list its attempts on simhost: connection refused" in unknown["reason"]
    assert 3 == len(rec.of("listing.failed"))
    assert 3 * 2 + 1 == transport.listings  # 2 tries per round, then the one that worked
    assert [1] == [a["attempt"] for a in rec.of("server.adopted")]
    assert not rec.has("attempt.started")
    assert [1] == sim.attempts()


async def test_a_stop_while_unknown_ends_supervision_without_launching(sim: SimSetup) -> None:
    """A stop request while the listing keeps failing ends supervision at once (stopped),
    and nothing was launched."""
    config = sim.config(mem_fraction_static=0.8, cuda_graph_max_bs=8)
    transport = flaky(sim, forever=HostUnreachable("connection refused", host="simhost"))
    result = await supervise(
        config, transport=transport, stop_when=lambda rec: rec.has("server.unknown"),
        options={"listing_tries": 1, "listing_recheck_s": 30.0}, timeout=20,
    )
    assert State.STOPPED == result.state, result.events.summary()
    assert [] == sim.attempts()
    assert not result.events.has("attempt.started")


async def test_a_failing_listing_is_rechecked_after_doubling_waits_up_to_its_cap(
    sim: SimSetup,
) -> None:
    """While the listing fails the recheck waits 1 s, 2 s, 4 s, then listing_recheck_s (8 s)
    each time: exactly those sleeps, each announced as listing.failed's retry_in_s. On a fake
    clock and sleep: 23 s of waiting takes no time."""
    config = sim.config(mem_fraction_static=0.8, cuda_graph_max_bs=8)
    transport = flaky(sim, forever=HostUnreachable("connection refused", host="simhost"))
    time = FakeTime()
    supervisor: list[Any] = []

    def stop_after_five(e: Recorded) -> None:
        if e.name == "listing.failed" and len(rec.of("listing.failed")) == 5:
            supervisor[0].request_stop(kill=False)

    rec = Recorder(on=[stop_after_five])
    result = await supervise(
        config, transport=transport, recorder=rec, on_start=supervisor.append, clock=time,
        options={"listing_tries": 1, "listing_recheck_s": 8.0, "sleep": time.sleep},
    )

    assert State.STOPPED == result.state, rec.summary()
    announced = [f["retry_in_s"] for f in rec.of("listing.failed")]
    assert [1.0, 2.0, 4.0, 8.0, 8.0] == announced == time.sleeps
    assert 1000.0 + 23.0 == time()
    assert [] == sim.attempts()
