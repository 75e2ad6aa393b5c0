"""scripts/bench/bench_estimator.py (``bench_oom.py --estimator``): its reading of a simulated
start-up agrees with the log classifier's, and a small run gives every table row."""

from __future__ import annotations

import argparse
import random
from types import ModuleType
from typing import Any

import pytest

from launcher.params import LaunchParams
from launcher.sglang.budget import GIB, ModelFacts
from launcher.sim.memory import simulate
from launcher.sim.observe import observed
from tests.scripts import import_script


@pytest.fixture(scope="module")
def bench() -> ModuleType:
    return import_script("bench_estimator")


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


def test_the_hidden_graph_and_warmup_costs_shard_like_sglangs_tensors(bench: ModuleType) -> None:
    """The truth's per-token graph cost on a rank is hidden x c x (r + (1 - r) / tp) plus the
    logits: the fp32 buffer (4 x vocab) and the lm_head output (2 x vocab / tp), whole, and at
    tp > 1 the gathered logits (2 x vocab); the warmup's hidden part shards the same way. From
    tp 2 to tp 4 only the sharded parts halve."""
    facts = next(ModelFacts.from_config(c) for n, c, _ in bench.MODELS if n == "Llama-3.1-70B")
    gpu, total = "NVIDIA H200", 139.81
    fam = bench.family_of(1, facts.arch, gpu, False)
    h, v, c, r = 8192, 128256, fam.graph_bytes_per_hidden, fam.graph_replicated_share

    def truth(tp: int) -> Any:
        return bench._truth(1, facts, 141_107_412_992, gpu, total, 0.0, tp, "0.5.23",
                            random.Random(0))

    assert truth(1).graph_gib_per_bs * GIB == pytest.approx(h * c + 4 * v + 2 * v)
    assert truth(2).graph_gib_per_bs * GIB == pytest.approx(
        h * c * (r + (1 - r) / 2) + 4 * v + v + 2 * v)
    sharded_tp4 = h * c * (1 - r) / 4 + v / 2
    assert (truth(2).graph_gib_per_bs - truth(4).graph_gib_per_bs) * GIB == pytest.approx(
        sharded_tp4)
    w, rw = fam.warmup_bytes_per_hidden, fam.warmup_replicated_share
    assert truth(2).warmup_gib / truth(4).warmup_gib == pytest.approx(
        (rw + (1 - rw) / 2) / (rw + (1 - rw) / 4))
    assert 0.1 <= r <= 0.4 and 16 <= c <= 64 and 8 <= w <= 30
