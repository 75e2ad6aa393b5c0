"""Property tests of the OOM policy against the simulator's memory model (the ground truth).

Each example draws a GPU/model/graph/warmup scenario and a starting setting, then drives
simulate -> observed -> next_params (``run_policy``) until ready or give-up.
"""

from __future__ import annotations

import math
import os
import random

from hypothesis import example, given, settings
from hypothesis import strategies as st

from launcher.memory.policy import AttemptRecord, Bounds, next_params
from launcher.params import LaunchParams
from launcher.sglang.outcome import Outcome
from launcher.sglang.phases import GraphPass
from launcher.sim.memory import MemoryScenario, simulate
from launcher.sim.observe import run_policy
from tests.multipass import Pass, World
from tests.multipass import run_policy as run_multipass

# derandomize: CI runs the same 300 examples every time, plus the explicit examples. A narrow
# case random search once found (a 0.957-0.968 window at bs 4 on a 58 GiB GPU, docs/testing.md)
# is pinned with @example below. scripts/mutation reruns these tests for every mutant: it loads
# its hypothesis profile "mutation" and sets LAUNCHER_HYPOTHESIS_PROFILE=mutation, and then the
# example count comes from that profile (an explicit max_examples here would override it).
MUTATION = os.environ.get("LAUNCHER_HYPOTHESIS_PROFILE") == "mutation"
FAST = (
    settings(deadline=None, derandomize=True)
    if MUTATION
    else settings(max_examples=300, deadline=None, derandomize=True)
)
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
# Found by random search (docs/testing.md): the window at bs 4 is 0.957-0.968. A warmup OOM's
# graph total at bs 16 with the default later-step size put a = 0.058 GiB per bs (really 0.047,
# as the capture OOM's first step showed), so the estimate at bs 4 was 0.036 GiB short and
# 0.968 OOMed in warmup on rounding until the attempts ran out.
@example(
    MemoryScenario(
        gpu_total_gib=58.0, weights_gib=49.875, tp=1, context_gib=1.0,
        kv_gib_per_1k_tokens=0.3, min_kv_tokens=15581, graph_gib_per_bs=0.046875,
        graph_overhead_gib=0.046875, warmup_gib=1.5, sglang_version="0.5.6",
    ),
    LaunchParams(None, 335),
    Bounds(0.55, 0.97, 4, 6),
)
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


# --- multi-pass capture (SGLang's real order), speculative decoding -------------------------


def make_world(rng: random.Random) -> tuple[World, LaunchParams]:
    """A multi-pass world and a starting setting: target prefill (sometimes), target
    decode/verify, and with spec draft decode (steps > 1) and draft extend; each pass takes
    memory from what the one before left."""
    u = rng.uniform
    pre = u(40.0, 140.0)
    spec = rng.random() < 0.5
    version = rng.choice(["0.5.10", "0.5.23"])
    steps = rng.choice([1, 3]) if spec else 1
    draft_weights = u(0.3, 0.03 * pre) if spec else 0.0

    def graph(name: GraphPass, scale: float, before: float = 0.0) -> Pass:
        return Pass(name, fixed_gib=u(0.05, 0.03 * pre * scale),
                    per_bs_gib=u(0.0005, 0.002 * pre * scale), step_gib=u(0.005, 0.05 * scale),
                    before_gib=before)

    passes = []
    if rng.random() < 0.5:
        passes.append(graph(GraphPass.TARGET_PREFILL, 0.5))
    passes.append(graph(GraphPass.TARGET_VERIFY if spec else GraphPass.TARGET_DECODE, 1.0))
    if spec:
        # 0.5.10 loads the draft's weights and pool between the target and draft graphs.
        before = draft_weights * 1.3 if version == "0.5.10" else 0.0
        if steps > 1:
            passes.append(graph(GraphPass.DRAFT_DECODE, 0.3, before))
            before = 0.0
        passes.append(graph(GraphPass.DRAFT_EXTEND, 0.3, before))
    world = World(
        pre=pre, weights=u(0.15, 0.6) * pre, draft_weights=draft_weights, passes=tuple(passes),
        warmup=u(0.2, 0.03 * pre), spec=spec, steps=steps, draft_tokens=steps + 1,
        version=version, tp=rng.choice([1, 2, 4, 8]),
    )
    initial = LaunchParams(round(u(0.6, 0.93), 3), rng.choice([8, 16, 32, 48, 64, 128, 256]))
    return world, initial


multipass_cases = st.integers(0, 2**32 - 1).map(lambda seed: make_world(random.Random(seed)))


def _effective_bs(w: World, p: LaunchParams) -> int:
    assert p.cuda_graph_max_bs is not None
    return min(p.cuda_graph_max_bs, 48) if w.spec else p.cuda_graph_max_bs


@FAST
@given(multipass_cases)
def test_multipass_capture_converges_where_a_setting_fits(case: tuple[World, LaunchParams]) -> None:
    """Whenever the starting graph bs fits at some fraction with a useful KV pool, the loop is
    ready within 3 attempts after the first failure; the speculative shape never changes and
    the graph bs never rises."""
    w, initial = case
    run = run_multipass(w, initial)
    if w.feasible(_effective_bs(w, initial), Bounds(), cushion=0.05):
        assert run.ready, run.reason
        assert run.after_first_failure <= 3, [r.params.describe() for r in run.history]
    for rec in run.history:
        assert rec.params.max_running_requests is None  # the cap is not the first lever
        assert rec.params.env == ()  # draft extend stays on unless [policy] allows it
        assert (rec.params.cuda_graph_max_bs or 0) <= (initial.cuda_graph_max_bs or 0)


def test_multipass_mean_attempts_after_a_first_failure_is_at_most_two() -> None:
    """Over a fixed sample of feasible multi-pass worlds that fail first, the mean number of
    attempts after the first failure is <= 2.0 (the issue's target). Under scripts/mutation,
    which reruns it for every mutant: every fourth world (13 of the 67 that count; mean 1.08,
    1.25 over all)."""
    counts: list[int] = []
    for seed in range(0, 400, 4 if MUTATION else 1):
        w, initial = make_world(random.Random(seed))
        if w.run(initial).outcome is Outcome.READY:
            continue
        if not w.feasible(_effective_bs(w, initial), Bounds(), cushion=0.05):
            continue
        run = run_multipass(w, initial)
        assert run.ready, (seed, run.reason)
        counts.append(run.after_first_failure)
    assert len(counts) >= (12 if MUTATION else 50)
    assert sum(counts) / len(counts) <= 2.0, counts
