"""``scripts/bench/bench_frontier.py``'s patching: each patched prior reaches the policy, and the
shipped policy is back after every point (the figures themselves are in docs/benchmarks.md).

Pure: multipass scenarios of ``bench_oom``'s generator through simulate -> observed ->
``next_params``; no I/O.
"""

from __future__ import annotations

import random
from types import ModuleType
from typing import Any

import pytest

import launcher.memory.policy as policy
from launcher.memory.policy import AttemptRecord, Bounds
from launcher.sglang.outcome import Outcome
from launcher.sim.memory import simulate
from launcher.sim.observe import observed
from tests.scripts import import_script

BOUNDS = Bounds(0.5, 0.95, 1, 8)


@pytest.fixture(scope="module")
def frontier() -> ModuleType:
    return import_script("bench_frontier")


def failures(frontier: ModuleType, outcome: Outcome) -> list[tuple[Any, list[AttemptRecord]]]:
    """The multipass cases (seed 1, the first 200) whose first attempt ends in ``outcome``."""
    rng = random.Random("1-multipass")
    found = []
    for i in range(200):
        case = frontier.draw_family_case(rng, i, "multipass")
        trace = simulate(case.scenario, case.initial)
        got, phase, numbers = observed(case.scenario, trace)
        if got is outcome:
            found.append((case, [AttemptRecord(case.initial, got, phase, numbers)]))
    assert found, f"no multipass case starts with {outcome}"
    return found


def next_fraction(frontier: ModuleType, case: Any, history: list[AttemptRecord]) -> float:
    params = frontier.oracle_decision(case, BOUNDS, history).params
    assert params is not None and params.mem_fraction_static is not None
    return float(params.mem_fraction_static)


def test_a_point_patches_the_policy_and_restores_the_shipped_objects(
    frontier: ModuleType,
) -> None:
    shipped = (policy.default_warmup_gib, policy.LATER_PASS_SHARE, policy.KV_CUSHION,
               policy.DEFAULT_STEP_GIB, policy._later_passes, policy._pass_fit)
    point = frontier.Point("t", warmup_scale=4.0, draft_share=1.0, cushion=0.1, step_gib=0.05,
                           oracle_later=True)
    with pytest.raises(RuntimeError), frontier.patched(point):
        assert policy.KV_CUSHION == 0.1
        assert policy.DEFAULT_STEP_GIB == 0.05
        assert policy.LATER_PASS_SHARE["draft_after_target"] == 1.0
        assert policy.default_warmup_gib(100.0) == pytest.approx(4 * shipped[0](100.0))
        assert policy._later_passes is not shipped[4]
        raise RuntimeError("a point that fails half-way")
    after = (policy.default_warmup_gib, policy.LATER_PASS_SHARE, policy.KV_CUSHION,
             policy.DEFAULT_STEP_GIB, policy._later_passes, policy._pass_fit)
    assert all(a is b for a, b in zip(after, shipped, strict=True))
    assert shipped[1] == {"same_model": 1.0, "draft_after_target": 0.25}  # never mutated
    assert frontier.is_shipped()


def test_the_cushion_moves_the_step_after_kv_too_small(frontier: ModuleType) -> None:
    case, history = failures(frontier, Outcome.KV_TOO_SMALL)[0]
    shipped = next_fraction(frontier, case, history)
    with frontier.patched(frontier.Point("c", cushion=0.10)):
        wider = next_fraction(frontier, case, history)
    # SGLang's minimum (or weights / pre) + the cushion: 0.08 more of pre, to the thousandth.
    assert wider - shipped == pytest.approx(0.08, abs=0.0015)


def test_the_warmup_prior_moves_the_step_after_a_capture_oom(frontier: ModuleType) -> None:
    """Without the warmup guess the fraction rises by the guess over pre, with the true need
    by the difference, wherever the OOM's own deficit does not cap the step."""
    checked = 0
    for case, history in failures(frontier, Outcome.OOM_GRAPH_CAPTURE):
        n = history[0].numbers
        assert n.pre_load_avail_gib and n.tried_gib is not None and n.free_gib is not None
        assert n.mem_fraction_static is not None
        pre = n.pre_load_avail_gib
        cap = n.mem_fraction_static - (n.tried_gib - n.free_gib) / pre
        shipped = next_fraction(frontier, case, history)
        guess = policy.default_warmup_gib(pre)
        true = case.scenario.warmup_gib
        if shipped + max(guess, guess - true) / pre > cap - 0.002:
            continue  # the deficit caps the step: no prior shows there
        with frontier.patched(frontier.Point("w", warmup_scale=0.0)):
            none = next_fraction(frontier, case, history)
        with frontier.patched(frontier.Point("o", oracle_warmup=True)):
            oracle = next_fraction(frontier, case, history)
        assert none - shipped == pytest.approx(guess / pre, abs=0.0015)
        assert oracle - shipped == pytest.approx((guess - true) / pre, abs=0.0015)
        checked += 1
    assert checked >= 3


def test_a_copy_bound_elsewhere_is_reported(frontier: ModuleType) -> None:
    assert frontier.check_patch_points() == []
    copy = ModuleType("elsewhere")
    copy.default_warmup_gib = policy.default_warmup_gib  # type: ignore[attr-defined]
    problems = frontier.check_patch_points([copy])
    assert problems == ["elsewhere holds its own binding of policy.default_warmup_gib"]


@pytest.mark.parametrize("point", ["shipped", "cushion-0", "oracle-all+cushion-0"])
def test_a_pool_too_small_with_no_window_at_the_starting_bs_costs_a_second_relaunch(
    frontier: ModuleType, point: str
) -> None:
    """The floor the sweep reports: after kv_too_small the policy keeps the graph bs whatever
    its priors, so where no fraction starts at that bs the first relaunch fails too."""
    fam = frontier.load("multipass", 1, 120, BOUNDS)
    blind = frontier.blind_runs(fam.truths)
    assert len(blind) >= 3
    chosen = next(p for p in frontier.POINTS if p.name == point)
    strategy = frontier.ORACLE_POLICY if chosen.oracle else frontier.POLICY
    with frontier.patched(chosen):
        for i in blind:
            case = fam.cases[i]
            r = frontier.run(case, BOUNDS, strategy)
            first, second = r.history[0], r.history[1]
            assert first.outcome in frontier.TOO_SMALL
            assert case.scenario.resolve(second.params)[1] == case.scenario.resolve(
                first.params)[1]
            assert second.outcome is not Outcome.READY
            assert r.end == "ready" and len(r.history) >= 3
