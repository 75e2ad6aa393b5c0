"""Property tests of the OOM policy against the simulator's memory model (the ground truth).

Each example draws a GPU/model/graph/warmup scenario and a starting setting, then drives
simulate -> observed -> next_params (``run_policy``) until ready or give-up.
"""

from __future__ import annotations

import math

from hypothesis import given, settings
from hypothesis import strategies as st

from launcher.outcome import Outcome
from launcher.params import LaunchParams
from launcher.policy import AttemptRecord, Bounds, next_params
from launcher.sim.memory import MemoryScenario, simulate
from launcher.sim.observe import run_policy

FAST = settings(max_examples=300, deadline=None)
FAILED_MEMORY = frozenset(
    {
        Outcome.OOM_GRAPH_CAPTURE,
        Outcome.OOM_RUNTIME,
        Outcome.OOM_KV_CACHE,
        Outcome.KV_TOO_SMALL,
        Outcome.OOM_WEIGHTS,
    }
)


@st.composite
def scenarios(draw: st.DrawFn) -> MemoryScenario:
    """GPUs of 24-141 GiB, tp 1-8, weights up to a bit over what fits, random graph costs."""
    gpu = draw(st.floats(24.0, 141.0))
    tp = draw(st.integers(1, 8))
    other = draw(st.one_of(st.just(0.0), st.floats(0.0, 0.3 * gpu)))
    context = draw(st.floats(0.5, 3.0))
    pre = gpu - other - context
    weights_share = draw(st.floats(0.02, 1.05))  # per-rank weights / pre; > 1 cannot load
    return MemoryScenario(
        gpu_total_gib=gpu,
        weights_gib=weights_share * pre * tp,
        tp=tp,
        other_used_gib=other,
        context_gib=context,
        kv_gib_per_1k_tokens=draw(st.floats(0.01, 0.3)),
        min_kv_tokens=draw(st.one_of(st.just(0), st.integers(0, 16384))),
        graph_gib_per_bs=draw(st.floats(0.001, 0.08)),
        graph_overhead_gib=draw(st.floats(0.001, 0.05)),
        warmup_gib=draw(st.floats(0.1, 3.0)),
        sglang_version=draw(st.sampled_from(["0.5.6", "0.5.23"])),
    )


initials = st.builds(
    LaunchParams,
    st.one_of(st.none(), st.floats(0.4, 0.97).map(lambda m: round(m, 3))),
    st.one_of(st.none(), st.integers(1, 512)),
)
bounds_choices = st.sampled_from(
    [Bounds(), Bounds(0.4, 0.9, 1, 6), Bounds(0.55, 0.97, 4, 6), Bounds(0.5, 0.95, 16, 6)]
)


def feasible_at_floor(s: MemoryScenario, bounds: Bounds) -> bool:
    """Whether some fraction on the 0.001 grid within bounds is ready at the bs floor.

    Graph memory grows with max bs, so the floor (which the policy can always reach) is where
    a feasible setting exists if one exists at any bs the policy may choose. A fraction at the
    exact KV edge (a pool of 0 GiB that float noise lets through) does not count.
    """
    window = s.feasible_range(bounds.graph_bs_floor)
    if window is None:
        return False
    ceiling = math.floor(bounds.mem_fraction_ceiling * 1000 + 1e-9)
    top = min(ceiling, math.floor(window[1] * 1000) + 1)  # +1: float rounding of the window
    bottom = math.ceil(bounds.mem_fraction_floor * 1000 - 1e-9)
    # The best fraction is the highest: if it is too small for the KV pool, all are.
    for milli in range(top, max(bottom, top - 4) - 1, -1):
        if milli / 1000 <= window[0] + 1e-9:
            return False
        trace = simulate(s, LaunchParams(milli / 1000, bounds.graph_bs_floor))
        if trace.ok:
            return True
        if trace.failure is not None and trace.failure.outcome is Outcome.KV_TOO_SMALL:
            return False
    return False


def _resolved(s: MemoryScenario, rec: AttemptRecord) -> tuple[float, int]:
    return s.resolve(rec.params)


@FAST
@given(scenarios(), initials, bounds_choices)
def test_gives_up_only_when_no_feasible_setting_exists(
    s: MemoryScenario, initial: LaunchParams, bounds: Bounds
) -> None:
    """The loop ends ready whenever a feasible setting exists within the bounds."""
    history = run_policy(s, initial, bounds)
    ready = history[-1].outcome is Outcome.READY
    assert ready or not feasible_at_floor(s, bounds)


@FAST
@given(scenarios(), initials, bounds_choices)
def test_never_repeats_or_dominates_a_failed_setting(
    s: MemoryScenario, initial: LaunchParams, bounds: Bounds
) -> None:
    """No attempt runs a setting known to fail from an earlier attempt, or one dominated by it."""
    history = run_policy(s, initial, bounds)
    for i, rec in enumerate(history):
        mfs, bs = _resolved(s, rec)
        for earlier in history[:i]:
            m0, b0 = _resolved(s, earlier)
            if earlier.outcome is Outcome.KV_TOO_SMALL:
                assert mfs > m0
            elif earlier.outcome in (Outcome.OOM_GRAPH_CAPTURE, Outcome.OOM_RUNTIME):
                assert not (mfs >= m0 and bs >= b0)
            if earlier.outcome in FAILED_MEMORY:
                assert (mfs, bs) != (m0, b0)


@FAST
@given(scenarios(), initials, bounds_choices)
def test_proposals_are_explicit_bounded_and_finite(
    s: MemoryScenario, initial: LaunchParams, bounds: Bounds
) -> None:
    """Every proposal is explicit, within floor/ceiling and the bs floor; attempts <= max."""
    history = run_policy(s, initial, bounds)
    assert len(history) <= bounds.max_attempts
    for rec in history[1:]:
        mfs, bs = rec.params.mem_fraction_static, rec.params.cuda_graph_max_bs
        assert mfs is not None and bs is not None
        assert bounds.mem_fraction_floor <= mfs <= bounds.mem_fraction_ceiling
        assert round(mfs, 3) == mfs
        assert bs >= bounds.graph_bs_floor
    if history[-1].outcome is not Outcome.READY:
        decision = next_params(initial, bounds, history, tp=s.tp, sglang_version=s.sglang_version)
        assert decision.params is None
        assert decision.reason


@FAST
@given(scenarios(), initials)
def test_weights_that_cannot_load_give_up_after_one_attempt(
    s: MemoryScenario, initial: LaunchParams
) -> None:
    """A weight-load OOM ends the loop at once, naming more GPUs or quantisation."""
    history = run_policy(s, initial, Bounds())
    if s.weights_fail():
        assert [Outcome.OOM_WEIGHTS] == [r.outcome for r in history]
        decision = next_params(initial, Bounds(), history)
        assert decision.params is None
        assert "more GPUs" in decision.reason
    else:
        assert Outcome.OOM_WEIGHTS not in [r.outcome for r in history]
