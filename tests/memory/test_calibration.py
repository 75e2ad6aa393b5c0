"""Calibration (launcher.memory.calibration): observed costs correct the estimator's guesses.

The hidden truth here is the estimator's own formula with other coefficients (the graph memory
of this architecture on this GPU type x1.8, weights x1.03, 0.7 GiB more CUDA context):
observations are what a log would show under that truth, rounded like SGLang prints them.
"""

from __future__ import annotations

import random
from dataclasses import replace

import pytest

from launcher.memory.calibration import (
    ALL_PASSES,
    COLD_MARGIN,
    Correction,
    CostGuess,
    KeyedObservation,
    Match,
    ObservationKey,
    apply,
    calibrate,
    guess_of,
    learn_estimate,
    select,
)
from launcher.memory.estimate import Estimate, estimate
from launcher.sglang.modelfacts import GIB, GpuFacts, ModelFacts, ServerShape, WeightFacts
from launcher.sglang.observed import Observed

# config.json dimensions of Qwen3-8B and Qwen3-32B (huggingface.co/Qwen/Qwen3-8B, -32B)
QWEN3_8B = {"architectures": ["Qwen3ForCausalLM"], "model_type": "qwen3",
            "num_hidden_layers": 36, "hidden_size": 4096, "num_attention_heads": 32,
            "num_key_value_heads": 8, "head_dim": 128, "vocab_size": 151936,
            "torch_dtype": "bfloat16", "max_position_embeddings": 40960}
QWEN3_32B = {**QWEN3_8B, "num_hidden_layers": 64, "hidden_size": 5120,
             "num_attention_heads": 64}
H100 = [GpuFacts(0, 79.19), GpuFacts(1, 79.19)]
KEY = ObservationKey("Qwen3ForCausalLM", "NVIDIA H100 80GB HBM3", "0.5.23", "")
TRUE_GRAPHS, TRUE_WEIGHTS, TRUE_CONTEXT = 1.8, 1.03, 0.7


def est(config: dict[str, object], size: int, tp: int) -> Estimate:
    return estimate(ModelFacts.from_config(config), WeightFacts(size), H100[:tp],
                    ServerShape(tp=tp, sglang_version="0.5.23"))


def observe(e: Estimate, bs: int, rng: random.Random | None = None) -> Observed:
    """What a ready attempt's log shows under the hidden truth (noise: run to run)."""
    def noise() -> float:
        return 1.0 if rng is None else rng.uniform(0.97, 1.03)

    pre = e.pre_load_free_gib - TRUE_CONTEXT
    weights = e.weights_gib * TRUE_WEIGHTS * noise()
    graphs = e.graphs_gib(bs) * TRUE_GRAPHS * noise()
    tokens = 500_000
    return Observed(
        pre_load_avail_gib=round(pre, 2), weights_gib=round(weights, 2), kv_tokens=tokens,
        kv_pool_gib=round(tokens * e.kv_bytes_per_token / GIB, 2),
        graph_mem_gib={"target_prefill": round(graphs * 0.1, 2),
                       "target_decode": round(graphs * 0.9, 2)},
        graph_max_bs=bs, ready_avail_gib=5.0,
    )


def keyed(e: Estimate, bs: int, key: ObservationKey = KEY,
          rng: random.Random | None = None) -> KeyedObservation:
    return KeyedObservation(key, observe(e, bs, rng), guess_of(e, bs), "ready")


def test_a_second_model_of_the_family_starts_from_measured_costs() -> None:
    small, big = est(QWEN3_8B, 16_381_470_720, 1), est(QWEN3_32B, 65_524_246_528, 2)
    fixed, correction = learn_estimate([keyed(small, 256)], KEY, big)
    assert Match.EXACT is correction.match
    assert correction.margin < COLD_MARGIN
    assert fixed.weights_gib == pytest.approx(big.weights_gib * TRUE_WEIGHTS, rel=0.01)
    # at the measured bs, the measured ratio; below it never less than there (a fixed part
    # of graph memory does not shrink with the bs): an upper bound of the truth
    assert fixed.graphs_gib(256) == pytest.approx(big.graphs_gib(256) * TRUE_GRAPHS, rel=0.02)
    assert fixed.graphs_gib(128) == pytest.approx(fixed.graphs_gib(256))
    assert fixed.graphs_gib(128) > big.graphs_gib(128) * TRUE_GRAPHS
    assert fixed.pre_load_free_gib == pytest.approx(big.pre_load_free_gib - TRUE_CONTEXT,
                                                    abs=0.02)
    assert fixed.kv_bytes_per_token == pytest.approx(big.kv_bytes_per_token, rel=0.01)
    # The corrected estimate chooses a lower fraction: the graphs need more headroom.
    assert fixed.feasible_range(256) is not None and big.feasible_range(256) is not None
    assert fixed.feasible_range(256)[1] < big.feasible_range(256)[1]  # type: ignore[index]


def test_the_error_falls_as_observations_of_the_family_accumulate() -> None:
    rng = random.Random(7)
    big = est(QWEN3_32B, 65_524_246_528, 2)
    truth = big.graphs_gib(256) * TRUE_GRAPHS
    errors = []
    for n in (1, 3, 9, 27):
        trials = []
        for _ in range(30):
            history = [keyed(est(QWEN3_8B, 16_381_470_720, 1), 256, rng=rng) for _ in range(n)]
            fixed, _ = learn_estimate(history, KEY, big)
            trials.append(abs(fixed.graphs_gib(256) - truth) / truth)
        errors.append(sum(trials) / len(trials))
    assert errors[0] > errors[-1]
    assert errors[-1] < 0.01
    assert abs(big.graphs_gib(256) - truth) / truth > 0.4  # cold: 1.8x off


def test_only_the_same_architecture_on_the_same_gpu_type_counts() -> None:
    small = est(QWEN3_8B, 16_381_470_720, 1)
    other_gpu = ObservationKey(KEY.architecture, "NVIDIA A100-SXM4-80GB", "0.5.23", "")
    other_arch = ObservationKey("LlamaForCausalLM", KEY.gpu_model, "0.5.23", "")
    other_version = ObservationKey(KEY.architecture, KEY.gpu_model, "0.5.10", "")
    history = [keyed(small, 256, other_gpu), keyed(small, 256, other_arch)]
    assert (Match.NONE, []) == select(history, KEY)
    match, rows = select([*history, keyed(small, 256, other_version)], KEY)
    assert (Match.FAMILY, 1) == (match, len(rows))
    match, rows = select([*history, keyed(small, 256, other_version), keyed(small, 256)], KEY)
    assert (Match.EXACT, 1) == (match, len(rows))
    # without a guess an observation cannot be compared; an unknown key matches nothing
    bare = KeyedObservation(KEY, observe(small, 256), None)
    assert Match.NONE is select([bare], KEY)[0]
    assert Match.NONE is select([keyed(small, 256)], ObservationKey())[0]


def test_no_observations_leave_the_estimate_as_it_is() -> None:
    big = est(QWEN3_32B, 65_524_246_528, 2)
    fixed, correction = learn_estimate([], KEY, big)
    assert fixed is big
    assert (Match.NONE, COLD_MARGIN) == (correction.match, correction.margin)


def test_graph_ratios_compare_like_settings_and_complete_captures_only() -> None:
    guess = CostGuess(weights_gib=10.0, kv_bytes_per_token=1.0,
                      graph_gib={ALL_PASSES: 2.0}, graph_bs=128)
    ready = Observed(graph_mem_gib={"target_decode": 3.0}, graph_max_bs=128,
                     ready_avail_gib=4.0)
    failed_mid_capture = Observed(graph_mem_gib={"target_decode": 0.5}, graph_max_bs=128)
    other_bs = Observed(graph_mem_gib={"target_decode": 9.0}, graph_max_bs=64,
                        ready_avail_gib=4.0)
    rows = [KeyedObservation(KEY, o, guess) for o in (ready, failed_mid_capture, other_bs)]
    assert calibrate(rows).graph == {ALL_PASSES: 1.5}


def test_an_oom_after_ready_raises_the_activations() -> None:
    guess = CostGuess(weights_gib=10.0, kv_bytes_per_token=1.0, activations_gib=1.0)
    oom = Observed(weights_gib=10.0, ready_avail_gib=3.0, tried_gib=1.5, free_gib=0.5)
    correction = calibrate([KeyedObservation(KEY, oom, guess, "oom_runtime")])
    # needed: 3.0 free at ready - 0.5 left + 1.5 asked = 4.0 GiB, four times the guess
    assert correction.activations == pytest.approx(4.0)
    e = est(QWEN3_8B, 16_381_470_720, 1)
    assert apply(e, correction).activations_gib() == pytest.approx(4.0 * e.activations_gib())


def test_a_fixed_part_of_graph_memory_is_fitted_from_observations_far_apart() -> None:
    """Truth: 1.5 GiB that does not grow (workspaces, a prefill-graph pool) plus half the
    prior's proportional figure. Observations of two models at two graph bs separate them."""
    def seen(e: Estimate, bs: int) -> KeyedObservation:
        total = 1.5 + 0.5 * e.graphs_gib(bs)
        obs = Observed(graph_mem_gib={"target_decode": round(total, 2)}, graph_max_bs=bs,
                       ready_avail_gib=5.0)
        return KeyedObservation(KEY, obs, guess_of(e, bs), "ready")

    small, big = est(QWEN3_8B, 16_381_470_720, 1), est(QWEN3_32B, 65_524_246_528, 2)
    history = [seen(small, 64), seen(small, 256), seen(big, 256)]
    correction = calibrate(history)
    assert correction.graph_fitted
    assert correction.graph_fixed_gib == pytest.approx(1.5, abs=0.05)
    assert correction.graph[ALL_PASSES] == pytest.approx(0.5, abs=0.01)
    qwen3_14b = {**QWEN3_8B, "num_hidden_layers": 40, "hidden_size": 5120,
                 "num_attention_heads": 40}
    new = est(qwen3_14b, 29_536_614_400, 1)
    fixed, _ = learn_estimate(history, KEY, new)
    truth = 1.5 + 0.5 * new.graphs_gib(512)
    assert fixed.graphs_gib(512) == pytest.approx(truth, rel=0.03)
    # below the measured figures the fit is not trusted alone (it extrapolates in the prior's
    # terms): the median measurement bounds it, an upper bound of the truth
    assert 1.5 + 0.5 * new.graphs_gib(64) < fixed.graphs_gib(64) == pytest.approx(
        correction.graph_measured_gib)


def test_above_the_measured_bs_only_the_growing_part_of_the_measurement_grows() -> None:
    """A fit with a fixed part of 1.0 GiB and a small proportional factor, measured at 3.0 GiB
    at bs 64: at bs 256 the answer is the fixed part plus the rest of the measurement grown
    as the prior grows from 64 to 256 (the fit alone, 1.0 + 0.01 x prior, is below it); at
    the measured bs the measurement."""
    e = est(QWEN3_8B, 16_381_470_720, 1)
    c = Correction(graph={ALL_PASSES: 0.01}, graph_default=0.01, graph_bs=64,
                   graph_measured_gib=3.0, graph_fitted=True, graph_fixed_gib=1.0,
                   observations=3, match=Match.EXACT)
    fixed = apply(e, c)
    grown = e.graphs_gib(256) / e.graphs_gib(64)
    assert grown > 1.5
    assert fixed.graphs_gib(256) == pytest.approx(1.0 + 2.0 * grown)
    assert fixed.graphs_gib(64) == pytest.approx(3.0)


def test_the_attention_backends_buffers_count_with_the_graphs() -> None:
    """The estimate's graph figure includes the attention backend's buffers, which a log shows
    only as the drop from ``Memory pool end`` to the first ``Capture ... begin`` (no pass's
    ``mem usage`` counts them). The real start-up docs-llama31-8b-h100-tp1-mf0874-bs4-20250812:
    pool end 60.72, capture begin 60.62 (FA3: 0.10 GiB), decode pass 0.07 GiB; against a guess
    of 0.17 GiB the ratio is (0.10 + 0.07) / 0.17 = 1.0, not 0.07 / 0.17 = 0.41."""
    o = Observed.from_numbers({"pool_end_avail_gib": 60.72, "graph_first_begin_avail_gib": 60.62,
                               "graph_mem_gib": {"decode": 0.07}, "cuda_graph_max_bs": 4,
                               "ready_avail_gib": 60.55})
    assert o.attention_buffers_gib == pytest.approx(0.10)
    guess = CostGuess(weights_gib=15.11, kv_bytes_per_token=131072.0,
                      graph_gib={ALL_PASSES: 0.17}, graph_bs=4)
    assert calibrate([KeyedObservation(KEY, o, guess)]).graph[ALL_PASSES] == pytest.approx(1.0)


def _l40s_row() -> KeyedObservation:
    """Llama-3.1-8B on an L40S, SGLang 0.5.23, graph bs 32 (scripts/bench/bench_estimator.py's
    real truth, seed 3): the guess is 1.198 GiB, of which the FlashInfer buffers 0.57 and the
    prefill passes 0.39 (50 shapes x 8 MiB); the log shows buffers 0.53, prefill 0.39 and
    decode 0.33 GiB."""
    guess = CostGuess(weights_gib=14.96, kv_bytes_per_token=131072.0,
                      graph_gib={ALL_PASSES: 1.198}, graph_bs=32,
                      attention_buffers_gib=0.57, prefill_graphs_gib=0.39)
    seen = Observed(graph_mem_gib={"target_prefill": 0.39, "target_decode": 0.33},
                    attention_buffers_gib=0.53, graph_max_bs=32, ready_avail_gib=6.0)
    return KeyedObservation(KEY, seen, guess, "ready")


def test_the_parts_that_do_not_grow_are_corrected_apart_from_the_decode_passes() -> None:
    """Worked by hand: the decode passes took 0.33 GiB against 1.198 - 0.57 - 0.39 = 0.238
    guessed, x1.387; the buffers 0.53 / 0.57 = x0.930; the prefill passes x1.0. One ratio of
    the totals, (0.53 + 0.39 + 0.33) / 1.198 = x1.043, would scale a bs-160 graph of 3.74
    GiB guessed (0.57 + 0.39 + 2.78 growing) to 3.90 GiB; the parts give 0.53 + 0.39 +
    1.387 x 2.78 = 4.77 GiB (the truth's: 4.81)."""
    c = calibrate([_l40s_row()])
    assert c.graph[ALL_PASSES] == pytest.approx(0.33 / 0.238)
    assert c.buffers == pytest.approx(0.53 / 0.57)
    assert c.prefill_graphs == pytest.approx(1.0)
    assert c.graph_measured_gib == pytest.approx(0.33)
    assert 0.53 + 0.39 + c.graph[ALL_PASSES] * 2.78 == pytest.approx(4.77, abs=0.01)
    # a row recorded before guesses told the parts apart compares the totals, as before
    old = replace(_l40s_row(), guess=replace(_l40s_row().guess, attention_buffers_gib=0.0,
                                             prefill_graphs_gib=0.0))
    assert calibrate([old]).graph[ALL_PASSES] == pytest.approx(1.25 / 1.198)
    assert calibrate([old]).buffers is None


def test_a_measured_small_bs_predicts_a_large_one() -> None:
    """Truth: the attention backend's buffers (FlashInfer's with Qwen3's wider workspace, 0.57
    + 0.125 GiB: the GPUs here have no name, so no FA3) and the prefill
    passes as the prior has them, the decode passes twice the prior's. Observed at graph bs
    8, where the fixed parts are most of the figure; the estimate at bs 256 must double the
    decode passes, not the total's diluted ratio."""
    e = est(QWEN3_8B, 16_381_470_720, 1)
    g8 = guess_of(e, 8)
    assert g8.attention_buffers_gib == pytest.approx(0.695)
    assert g8.prefill_graphs_gib > 0

    def truth(bs: int) -> float:
        g = guess_of(e, bs)
        fixed = g.attention_buffers_gib + g.prefill_graphs_gib
        return fixed + 2.0 * (g.graph_gib[ALL_PASSES] - fixed)

    decode = truth(8) - g8.attention_buffers_gib - g8.prefill_graphs_gib
    seen = Observed(graph_mem_gib={"target_prefill": round(g8.prefill_graphs_gib, 2),
                                   "target_decode": round(decode, 2)},
                    attention_buffers_gib=0.7, graph_max_bs=8, ready_avail_gib=5.0)
    fixed, _ = learn_estimate([KeyedObservation(KEY, seen, g8, "ready")], KEY, e)
    assert fixed.graphs_gib(256) == pytest.approx(truth(256), rel=0.03)
    assert fixed.graphs_gib(8) == pytest.approx(truth(8), abs=0.02)


def test_prefill_passes_the_guess_had_no_share_for_stay_in_the_growing_part() -> None:
    """A log shows prefill passes (0.39) where the guess had none (say a version gate): they
    count with the decode passes, 0.39 + 0.33 over the 1.198 - 0.57 = 0.628 guessed growing,
    rather than vanish from the corrected figure."""
    row = _l40s_row()
    row = replace(row, guess=replace(row.guess, prefill_graphs_gib=0.0))
    c = calibrate([row])
    assert c.graph[ALL_PASSES] == pytest.approx((0.39 + 0.33) / 0.628)
    assert c.graph_measured_gib == pytest.approx(0.72)
