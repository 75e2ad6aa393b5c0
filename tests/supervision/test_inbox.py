"""The supervisor's event inbox never drops a lifecycle event: a full inbox makes the poster
wait (back-pressure). Shown with an inbox of one event, on real sim servers."""

from __future__ import annotations

import pytest
from structlog.testing import capture_logs

from launcher.supervise.lifecycle import State
from tests.supervise import SimSetup, ready_or_done, supervise

pytestmark = pytest.mark.timeout(90)


async def test_a_burst_of_log_events_on_adoption_loses_none(sim: SimSetup) -> None:
    """Adopting a ready server replays its whole log at once: every phase and the ready line
    reach the machine through an inbox of one, and the server is ready again (the bug: the
    events that did not fit were dropped, `event.dropped`, and the ready line with them)."""
    config = sim.config(mem_fraction_static=0.8, cuda_graph_max_bs=8)
    first = await supervise(config, until=ready_or_done)
    assert first.stopped_by_test

    with capture_logs() as logs:
        second = await supervise(config, until=ready_or_done, options={"inbox_size": 1},
                                 timeout=30)

    rec = second.events
    assert State.READY == second.state, rec.summary()
    assert ["weights", "kv_cache", "cuda_graph", "warmup"] == [
        e["phase"] for e in rec.of("phase.entered")]
    assert [] == [e for e in logs if e["event"] == "event.dropped"]


async def test_a_failure_cleanup_and_relaunch_go_through_an_inbox_of_one(
    sim: SimSetup,
) -> None:
    """A capture OOM, its cleanup, the GPU wait and the relaunch to ready all pass through an
    inbox of one event."""
    config = sim.config(model="llama-70b-sim", tp=2, mem_fraction_static=0.99,
                        cuda_graph_max_bs=256)

    result = await supervise(config, until=ready_or_done, options={"inbox_size": 1})

    rec = result.events
    assert State.READY == result.state, rec.summary()
    assert [1, 2] == [s["attempt"] for s in rec.of("attempt.started")]
    assert ["oom_graph_capture"] == [f["outcome"] for f in rec.of("attempt.failed")]
