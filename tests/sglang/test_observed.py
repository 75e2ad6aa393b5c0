"""The observed cost figures ``LogFollower`` reads for the ledger (launcher.sglang.observed).

Lines are verbatim from the real logs in tests/fixtures/real_logs (each names its thread) or
built from SGLang's own f-strings (the source path and line are named; 0.5.10 and 0.5.23 as
unpacked by scripts/sglang-contract-env.sh). Expected values are what the lines state.
"""

from __future__ import annotations

import pytest

from launcher.sglang.logparse import LogFollower
from launcher.sglang.observed import GIB, Observed, speculative_key


def follow(lines: list[str]) -> LogFollower:
    follower = LogFollower()
    for line in lines:
        follower.feed_line(line)
    follower.finish()
    return follower


# https://github.com/sgl-project/sglang/issues/6753 (gh6753_pd_prefill_h200_ready_..., H200)
GH6753 = [
    "[2025-05-29 23:22:58] Load weight end. type=LlamaForCausalLM, dtype=torch.bfloat16, "
    "avail mem=124.23 GB, mem usage=14.98 GB.",
    "[2025-05-29 23:22:58] KV Cache is allocated. #tokens: 871371, K size: 53.18 GB, "
    "V size: 53.18 GB",
]
# https://github.com/sgl-project/sglang/issues/11949 (gh11949_warmup_403_proxy.log)
GH11949 = [
    "[2025-10-22 10:27:26] Capture cuda graph end. Time elapsed: 3.21 s. mem usage=0.93 GB. "
    "avail mem=52.97 GB.",
    "[2025-10-22 10:27:27] max_total_num_tokens=154231, chunked_prefill_size=8192, "
    "max_prefill_tokens=16384, max_running_requests=2409, context_len=32768, "
    "available_gpu_mem=52.97 GB",
]
# https://github.com/sgl-project/sglang/issues/6001 (gh6001_rocm_mi308_..., MLA, tp8)
GH6001 = [
    "[2025-05-04 01:05:35 TP0] Load weight end. type=DeepseekV3ForCausalLM, "
    "dtype=torch.bfloat16, avail mem=103.67 GB, mem usage=81.66 GB.",
    "[2025-05-04 01:05:36 TP0] KV Cache is allocated. #tokens: 720206, KV size: 47.13 GB",
    "[2025-05-04 01:05:36 TP1] KV Cache is allocated. #tokens: 720206, KV size: 47.13 GB",
]


def test_weights_and_kv_pool_from_a_real_h200_log() -> None:
    n = follow(GH6753).numbers
    assert (14.98, 124.23) == (n.weights_gib, n.post_weights_avail_gib)
    assert (871371, 106.36) == (n.kv_tokens, n.kv_pool_gib)
    obs = Observed.from_numbers(n)
    assert obs.kv_bytes_per_token == pytest.approx(106.36 * GIB / 871371)
    # Llama-3-8B: 32 layers x 8 KV heads x 128 x 2 (K, V) x 2 bytes = 131072 B/token; the log
    # rounds the pool to 0.01 GiB.
    assert obs.kv_bytes_per_token == pytest.approx(131072, rel=1e-3)


def test_mla_pool_is_one_kv_size_and_each_rank_counts_once() -> None:
    n = follow(GH6001).numbers
    assert (81.66, 47.13, None) == (n.weights_gib, n.kv_pool_gib, n.draft_kv_pool_gib)


def test_capture_end_and_ready_summary_from_a_real_log() -> None:
    n = follow(GH11949).numbers
    assert {"target_decode": 0.93} == n.graph_mem_gib
    assert 52.97 == n.ready_avail_gib


# 0.5.23 sglang/srt/model_executor/model_runner.py:1373 (Load weight end),
# mem_cache/memory_pool.py:2088 (KV Cache ... dtype:), model_runner_components/
# cuda_graph_setup.py:696 and :789 (Capture {name} CUDA graph end), managers/scheduler.py:1269.
V0523_SPEC = [
    "[2026-06-17 19:51:02] server_args={'model_path': '/m', 'speculative_algorithm': 'EAGLE', "
    "'speculative_num_steps': 1, 'speculative_eagle_topk': 1, "
    "'speculative_num_draft_tokens': 2, 'cuda_graph_max_bs': 32}",
    "[2026-06-17 19:52:31 TP0] Load weight end. elapsed=72.10 s, type=DeepseekV4ForCausalLM, "
    "quant=fp8, fmt=e4m3, avail mem=55.83 GB, mem usage=37.57 GB.",
    "[2026-06-17 19:52:41 TP0] Load weight end. elapsed=8.82 s, "
    "type=DeepseekV4ForCausalLMNextN, quant=fp8, fmt=e4m3, avail mem=54.34 GB, "
    "mem usage=1.49 GB.",
    "[2026-06-17 19:52:42 TP0] KV Cache is allocated. dtype: torch.bfloat16, #tokens: 1444864, "
    "KV size: 24.32 GB",
    "[2026-06-17 19:52:42 TP1] KV Cache is allocated. dtype: torch.bfloat16, #tokens: 1444864, "
    "KV size: 24.32 GB",
    "[2026-06-17 19:52:42 TP0] KV Cache is allocated. dtype: torch.bfloat16, #tokens: 1444864, "
    "KV size: 2.00 GB",
    "[2026-06-17 19:52:43 TP0] Capture target prefill CUDA graph begin. backend=breakable, "
    "num_tokens=[64, 128, 256, 512, 1024, 2048, 4096], avail mem=28.00 GB",
    "[2026-06-17 19:52:52 TP0] Capture target prefill CUDA graph end. elapsed=9.20 s, "
    "mem usage=1.10 GB, avail mem=26.90 GB.",
    "[2026-06-17 19:52:52 TP0] Capture target verify CUDA graph begin. backend=full, "
    "num_tokens_per_req=2, avail mem=26.88 GB",
    "[2026-06-17 19:52:52 TP1] Capture target verify CUDA graph begin. backend=full, "
    "num_tokens_per_req=2, avail mem=26.88 GB",
    "[2026-06-17 19:53:34 TP1] Capture target verify CUDA graph end. bs=[1, 2, 4, 8, 16, 32], "
    "elapsed=41.30 s, mem usage=17.70 GB, avail mem=9.18 GB.",
    "[2026-06-17 19:53:34 TP0] Capture target verify CUDA graph end. bs=[1, 2, 4, 8, 16, 32], "
    "elapsed=41.30 s, mem usage=17.60 GB, avail mem=9.28 GB.",
]


def test_0_5_23_speculative_draft_pool_and_passes() -> None:
    n = follow(V0523_SPEC).numbers
    assert (37.57, 1.49) == (n.weights_gib, n.draft_weights_gib)
    assert (24.32, 2.0, 1444864) == (n.kv_pool_gib, n.draft_kv_pool_gib, n.draft_kv_tokens)
    # each pass its own figure; the largest over ranks (the budget must hold on every GPU)
    assert {"target_prefill": 1.10, "target_verify": 17.70} == n.graph_mem_gib
    assert 32 == n.graph_captured_max_bs
    assert "EAGLE steps=1 topk=1 draft=2" == speculative_key(n)
    obs = Observed.from_numbers(n)
    assert obs.graph_gib_per_bs("target_verify") == pytest.approx(17.70 / 32)


def test_0_5_23_labelled_pools_add_up_for_the_target() -> None:
    # mem_cache/swa_memory_pool.py:81/92: allocation_label "Full" and "SWA" (one target pool)
    n = follow([
        "[2026-06-01 10:00:00] Full KV Cache is allocated. dtype: torch.bfloat16, "
        "#tokens: 100000, K size: 1.50 GB, V size: 1.50 GB",
        "[2026-06-01 10:00:00] SWA KV Cache is allocated. dtype: torch.bfloat16, "
        "#tokens: 400000, K size: 0.50 GB, V size: 0.50 GB",
    ]).numbers
    assert (4.0, None) == (n.kv_pool_gib, n.draft_kv_pool_gib)


def test_0_5_10_piecewise_and_bs_list_lines() -> None:
    # 0.5.10 model_runner.py:2574 and cuda_graph_runner's "Capture cuda graph bs [...]"; the
    # bs list line is verbatim from https://github.com/sgl-project/sglang/pull/11716 (cut).
    n = follow([
        "[2025-10-16 09:06:22 TP0] Capture cuda graph begin. This can take up to several "
        "minutes. avail mem=11.82 GB",
        "[2025-10-16 09:06:22 TP0] Capture cuda graph bs [1, 2, 4, 8, 12, 16, 24, 32]",
        "[2025-10-16 09:06:30 TP0] Capture cuda graph end. Time elapsed: 8.00 s. "
        "mem usage=0.70 GB. avail mem=11.12 GB.",
        "[2025-10-16 09:06:31 TP0] Capture piecewise CUDA graph begin. avail mem=11.10 GB",
        "[2025-10-16 09:06:40 TP0] Capture piecewise CUDA graph end. Time elapsed: 9.00 s. "
        "mem usage=0.40 GB. avail mem=10.70 GB.",
    ]).numbers
    assert {"target_decode": 0.70, "target_prefill": 0.40} == n.graph_mem_gib
    assert 32 == n.graph_captured_max_bs


def test_mamba_cache_line_per_slot() -> None:
    # 0.5.10 mem_cache/memory_pool.py:321 (no speculative intermediate caches)
    n = follow([
        "[2026-07-02 10:14:40] Mamba Cache is allocated. max_mamba_cache_size: 48, "
        "conv_state size: 0.20GB, ssm_state size: 6.50GB ",
    ]).numbers
    obs = Observed.from_numbers(n)
    assert (48, 6.7) == (obs.mamba_slots, obs.mamba_state_gib)
    assert obs.mamba_gib_per_slot == pytest.approx(6.7 / 48)


def test_observed_round_trips_through_its_dict_and_the_stored_numbers() -> None:
    n = follow(V0523_SPEC + GH11949).numbers
    obs = Observed.from_numbers(n.as_dict())
    assert obs == Observed.from_numbers(n)
    assert obs == Observed.from_dict(obs.as_dict())
    assert not obs.empty
    assert Observed().empty
