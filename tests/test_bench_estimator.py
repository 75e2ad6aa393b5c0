"""scripts/bench_estimator.py (``bench_oom.py --estimator``): its reading of a simulated
start-up agrees with the log classifier's, and a small run gives every table row."""

from __future__ import annotations

import argparse
import importlib
import random
import sys
from pathlib import Path
from types import ModuleType

import pytest

from launcher.params import LaunchParams
from launcher.sim.memory import simulate
from launcher.sim.observe import observed

SCRIPTS = Path(__file__).resolve().parents[1] / "scripts"


@pytest.fixture(scope="module")
def bench() -> ModuleType:
    sys.path.insert(0, str(SCRIPTS))
    try:
        return importlib.import_module("bench_estimator")
    finally:
        sys.path.remove(str(SCRIPTS))


def test_observed_costs_read_a_start_up_as_the_classifier_does(bench: ModuleType) -> None:
    s = bench.draw(1, random.Random(3), 0, model="Qwen3-8B", gpu="NVIDIA H100 80GB HBM3",
                   version="0.5.23")
    params = LaunchParams(0.85, 128)
    trace = simulate(s.truth, params)
    assert trace.ok
    _, _, numbers = observed(s.truth, trace)
    costs = bench.observed_costs(trace)
    assert (numbers.weights_gib, numbers.pre_load_avail_gib, numbers.kv_tokens) == (
        costs.weights_gib, costs.pre_load_avail_gib, costs.kv_tokens)
    # 0.5.23 captures the prefill graphs, then the decode graphs; the pool is K + V
    assert {"target_prefill", "target_decode"} == set(costs.graph_mem_gib)
    assert costs.kv_bytes_per_token == pytest.approx(
        s.facts.kv_bytes_per_token(s.tp), rel=0.01)


def test_a_small_run_gives_every_contender_and_ledger_row(bench: ModuleType) -> None:
    args = argparse.Namespace(n=6, seed=2, max_attempts=8, ceiling=0.95, show=0, curve=3)
    lines = bench.bench(args)
    rows = [line.split(" | ")[0].lstrip("| ") for line in lines if line.startswith("| ")]
    assert {*bench.CONTENDERS, "0", "1", "2", "4", "8"} <= set(rows)
