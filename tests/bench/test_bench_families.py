"""The OOM benchmark's scenario families (``scripts/bench/bench_oom.py --families``), checked in CI.

The full figures (200 scenarios per family, three seeds) are in docs/benchmarks.md; this runs
the first scenarios of each family, seed 1, through the same loop (simulate -> observed ->
``next_params``) and holds the one target that is met: every scenario for which some fraction
and graph bs within the bounds start is brought up. It also checks that an attempt's params
reach the scenario the way the simulated server applies them.
"""

from __future__ import annotations

import random
from dataclasses import replace
from types import ModuleType

import pytest

from launcher.memory.policy import Bounds
from launcher.params import DISABLE_DRAFT_EXTEND_ENV, LaunchParams
from launcher.sglang.outcome import Outcome
from tests.scripts import import_script

N = 25


@pytest.fixture(scope="module")
def bench() -> ModuleType:
    return import_script("bench_oom")


@pytest.mark.parametrize("family", ["multipass", "eagle", "eagle3", "mtp", "hybrid"])
def test_the_policy_brings_up_every_feasible_scenario_of_a_family(
    bench: ModuleType, family: str
) -> None:
    """The shipped bounds (fraction in [0.50, 0.95], 8 attempts): each feasible scenario ends
    ready; a scenario whose first attempt failed on memory was steered (the policy moved)."""
    bounds = Bounds(0.5, 0.95, 1, 8)
    rng = random.Random(f"1-{family}")
    cases = [bench.draw_family_case(rng, i, family) for i in range(N)]
    feasible = steered = 0
    for case in cases:
        truth = bench.truth(case, bounds)
        if not truth.feasible:
            continue
        feasible += 1
        run = bench.run(case, bounds, bench.STRATEGIES[0])
        assert "ready" == run.end, (family, case.index, [r.outcome for r in run.history])
        if truth.first in bench.FIXABLE:
            steered += 1
            assert len(run.history) >= 2
    assert feasible >= N // 2 and steered >= 1, (feasible, steered)


def test_an_attempts_params_reach_the_scenario_as_the_server_applies_them(
    bench: ModuleType,
) -> None:
    """--max-running-requests caps a speculative scenario's requests; on 0.5.23
    SGLANG_DISABLE_DRAFT_EXTEND_CUDA_GRAPH=1 drops the draft-extend pass (0.5.10 has no such
    switch); a hybrid's state-cache knobs reach its state cache."""
    rng = random.Random("1-mtp")
    case = next(
        c for c in (bench.draw_family_case(rng, i, "mtp") for i in range(50))
        if c.scenario.sglang_version == "0.5.23"
    )
    off = LaunchParams(0.6, 32, max_running_requests=16, env=((DISABLE_DRAFT_EXTEND_ENV, "1"),))
    s = bench.with_params(case.scenario, off)
    assert s.spec is not None and 16 == s.spec.max_running_requests
    assert "draft_extend" not in [p.name for p in s.graph_passes(32)]
    old = bench.with_params(replace(case.scenario, sglang_version="0.5.10"), off)
    assert "draft_extend" in [p.name for p in old.graph_passes(32)]
    rng = random.Random("1-hybrid")
    hybrid = bench.draw_family_case(rng, 0, "hybrid")
    knobs = LaunchParams(0.6, 32, max_mamba_cache_size=40, mamba_full_memory_ratio=0.5)
    h = bench.with_params(hybrid.scenario, knobs).hybrid
    assert h is not None and (40, 0.5) == (h.max_mamba_cache_size, h.mamba_full_memory_ratio)
    assert Outcome.HYBRID_STATE_TOO_SMALL in bench.FIXABLE
