"""After a pool too small, the relaunch checks SGLang's stated minimum plus the cushion against the
estimate's graph figure for the model, and lowers the graph bs in the same relaunch when the
graphs will not fit. Pure: a real case's config and figures, no processes.

The numbers are worked by hand from the real start-up ``ext-thesis-llama31-8b-24gb-tp1``
(tests/fixtures/real_startups/): Llama-3.1-8B-Instruct (its config.json: hidden 4096, 32 layers,
vocab 128256, intermediate 14336) on a 24 GB card (23.99 GiB), 15.02 GiB of weights
(``Load weight end ... mem usage``), 22.39 GiB free before loading. Here another process holds
5.3 GiB of that card, so ``pre`` = 17.09 GiB, and the first attempt ran at 0.85 with SGLang's
auto graph bs (48 on 0.5.23 for a 24 GB card): the pool, 0.85 x 17.09 - 15.02 < 0, is "Not
enough memory", SGLang's stated minimum viable fraction 15.02 / 17.09 = 0.8789.

The relaunch's fraction, as before: the minimum + ``kv_cushion`` 0.02 = 0.8989, and the weights
+ 0.02 x pre = (15.02 + 0.3418) / 17.09 = 0.898899: 0.899 (to the thousandth, up). It leaves a
headroom of (1 - 0.899) x 17.09 = 1.72609 GiB.

The estimate's graphs at bs b (SGLang picks FlashInfer on a consumer card: 0.57 GiB fixed; 0.5.23
prefill graphs: 50 shapes up to the chunk of 4096, 8 MiB each, 0.390625 GiB; per captured token
3.05 x 896,560 bytes; per captured graph 1.49e-7 x 4096 x 32 = 0.0195297 GiB), warmup 1.0 x
118,784 bytes x 4096 tokens = 0.453125 GiB, margin 0.1 GiB:

- bs 48 (10 graphs): 0.57 + 0.390625 + 0.122242 + 0.195297 = 1.278164; need 1.831289 > 1.72609
- bs 32 (8 graphs):  0.57 + 0.390625 + 0.081495 + 0.156238 = 1.198358; need 1.751483 > 1.72609
- bs 24 (7 graphs):  0.57 + 0.390625 + 0.061121 + 0.136708 = 1.158454; need 1.711579 <= 1.72609

so the relaunch is 0.899 at graph bs 24, where the policy without the estimate keeps bs 48 (and
would fail in capture or warmup).
"""

from __future__ import annotations

import pytest

from launcher.memory.estimate import Estimate, estimate
from launcher.memory.policy import AttemptRecord, Bounds, next_params
from launcher.params import LaunchParams
from launcher.sglang.modelfacts import GIB, GpuFacts, ModelFacts, ServerShape, WeightFacts
from launcher.sglang.outcome import Numbers, Outcome
from launcher.sglang.phases import Phase
from tests.real_startups import ROOT, load_case

CASE = "ext-thesis-llama31-8b-24gb-tp1"
PRE = 22.39 - 5.3  # the case's free memory before loading, less another process's 5.3 GiB


def case_estimate() -> Estimate:
    case = load_case(ROOT / CASE)
    assert case.figures["weight_mem_usage_gb"] == 15.02 and case.gpu_total_gib == 23.99
    model = ModelFacts.from_config(case.config)
    return estimate(model, WeightFacts(int(15.02 * GIB)),
                    [GpuFacts(0, case.gpu_total_gib, 0.0, "NVIDIA GeForce RTX 4090")],
                    ServerShape(tp=1, sglang_version="0.5.23"))


def too_small(pre: float = PRE, minimum: float = 0.8789, mfs: float = 0.85) -> AttemptRecord:
    return AttemptRecord(
        LaunchParams(mfs, None), Outcome.KV_TOO_SMALL, Phase.KV_CACHE,
        Numbers(pre_load_avail_gib=round(pre, 2), post_weights_avail_gib=round(pre - 15.02, 2),
                min_mem_fraction=minimum, mem_fraction_static=mfs, cuda_graph_max_bs=48,
                total_gib=23.99))


def test_the_hand_figures_are_the_estimates() -> None:
    e = case_estimate()
    assert (e.attention_backend, e.auto_bs(), len(e.prefill_shapes())) == ("flashinfer", 48, 50)
    assert e.activations_gib() == pytest.approx(0.453125)
    for bs, graphs in ((48, 1.278164), (32, 1.198358), (24, 1.158454), (16, 1.118550)):
        assert e.graphs_gib(bs) == pytest.approx(graphs, abs=2e-6)


def test_after_kv_too_small_the_graph_bs_falls_where_the_estimate_says_graphs_do_not_fit() -> None:
    record = too_small()
    decision = next_params(record.params, Bounds(), [record], tp=1, sglang_version="0.5.23",
                           estimate=case_estimate())
    assert decision.params == LaunchParams(0.899, 24)
    assert "graph bs 48→24" in decision.reason and "1.73 GiB headroom" in decision.reason
    # without the estimate the graph bs is kept, as before
    blind = next_params(record.params, Bounds(), [record], tp=1, sglang_version="0.5.23")
    assert blind.params == LaunchParams(0.899, 48)


def test_where_the_graphs_fit_the_graph_bs_is_kept() -> None:
    """The case as it ran (no other process: pre 22.39), a first attempt at 0.65 (pool 0.65 x
    22.39 - 15.02 < 0), minimum 15.02 / 22.39 = 0.6708: 0.691 leaves 6.92 GiB, far above the
    1.83 GiB bs 48 needs."""
    record = too_small(22.39, 0.6708, 0.65)
    decision = next_params(record.params, Bounds(), [record], tp=1, sglang_version="0.5.23",
                           estimate=case_estimate())
    assert decision.params == LaunchParams(0.691, 48)


def test_a_hybrid_state_cache_error_gets_the_same_check() -> None:
    """A hybrid state-cache error without figures raises the fraction by 0.05 (0.85 -> 0.90):
    headroom 0.10 x 17.09 = 1.709 GiB; bs 24 needs 1.711579 (no), bs 16 (6 graphs: 0.57 +
    0.390625 + 0.040747 + 0.117178 = 1.118550) needs 1.671675: bs 16."""
    record = AttemptRecord(
        LaunchParams(0.85, None), Outcome.HYBRID_STATE_TOO_SMALL, Phase.KV_CACHE,
        Numbers(pre_load_avail_gib=round(PRE, 2), mem_fraction_static=0.85, cuda_graph_max_bs=48,
                total_gib=23.99))
    decision = next_params(record.params, Bounds(), [record], tp=1, sglang_version="0.5.23",
                           estimate=case_estimate())
    assert decision.params == LaunchParams(0.9, 16)
    assert "graph bs 48→16" in decision.reason
