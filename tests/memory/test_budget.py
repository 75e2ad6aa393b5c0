"""The memory estimator (launcher/sglang/budget.py) against figures computed by hand from
SGLang's formulas. Each test names the SGLang function the figure comes from (paths under
``sglang/srt/`` of 0.5.23 unless said otherwise). Pure: no I/O but reading the shipped sim
model configs, which are real-format config.json files."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from launcher.params import LaunchParams
from launcher.sglang.autoargs import auto_cuda_graph_max_bs, prefill_graph_tokens
from launcher.sglang.budget import (
    DEFAULT_COEFFICIENTS,
    GIB,
    HIDDEN_ONLY_COEFFICIENTS,
    MIN_MARGIN_GIB,
    SOURCE_SHAPED_COEFFICIENTS,
    Coefficients,
    GpuFacts,
    ModelFacts,
    NoEstimate,
    ServerShape,
    SpecShape,
    WeightFacts,
    choose,
    estimate,
    observed_bar,
    weight_bytes_from_header,
    weight_bytes_from_index,
)
from launcher.sglang.outcome import Numbers

MODELS = Path(__file__).resolve().parents[2] / "configs" / "sim" / "models"


def config(name: str) -> dict[str, Any]:
    data: dict[str, Any] = json.loads((MODELS / name / "config.json").read_text())
    return data


def facts(name: str) -> ModelFacts:
    return ModelFacts.from_config(config(name))


def weights(name: str) -> WeightFacts:
    index = json.loads((MODELS / name / "model.safetensors.index.json").read_text())
    return WeightFacts(weight_bytes_from_index(index))


def h100s(n: int, other: float = 0.0) -> list[GpuFacts]:
    return [GpuFacts(i, 79.19, other) for i in range(n)]


# --- KV bytes per token: pool_configurator.DefaultPoolConfigurator._compute_cell_size --------


def test_gqa_kv_bytes_per_token_shard_kv_heads_by_tp() -> None:
    """Llama-2-70B: 8 KV heads; get_num_kv_heads = max(1, 8 // tp); cell = heads x (head_dim +
    v_head_dim) x layers x 2 bytes (bf16)."""
    m = facts("llama-70b-sim")
    assert 4 * (128 + 128) * 80 * 2 == m.kv_bytes_per_token(2) == 163840
    assert 8 * 256 * 80 * 2 == m.kv_bytes_per_token(1)
    assert 1 * 256 * 80 * 2 == m.kv_bytes_per_token(16)  # fewer heads than ranks: one each
    assert 4 * 256 * 80 * 1 == m.kv_bytes_per_token(2, kv_dtype_bytes=1)  # --kv-cache-dtype fp8


def test_mla_kv_bytes_per_token_are_not_sharded_by_tp() -> None:
    """Kimi-K2 (DeepSeek-V3 MLA): kv_cache_configurator.calculate_mla_kv_cache_dim =
    kv_lora_rank + qk_rope_head_dim, x layers x 2 bytes, the same on every rank."""
    m = facts("kimi-k2.5-sim")
    assert m.mla
    assert (512 + 64) * 61 * 2 == m.kv_bytes_per_token(1) == m.kv_bytes_per_token(8) == 70272


def test_hybrid_counts_only_full_attention_layers_for_kv() -> None:
    """Qwen3.5-style hybrid: full_attention_interval 4 over 64 layers = 16 KV layers
    (DefaultPoolConfigurator: mambaish.full_attention_layer_ids)."""
    m = facts("qwen3.6-27b-sim")
    assert m.kv_layers == 16
    assert 4 * (256 + 256) * 16 * 2 == m.kv_bytes_per_token(1) == 65536


def test_hybrid_state_per_request_follows_mamba2_state_shape() -> None:
    """configs/mamba_utils.Mamba2StateShape.create + mamba_cache_per_req for Gated DeltaNet
    (configs/qwen3_next.mamba2_cache_params): conv_dim = v_heads x v_dim + 2 x k_heads x k_dim,
    conv state (conv_dim/tp, kernel - 1) bf16, SSM state (v_heads/tp, v_dim, k_dim) fp32, per
    linear layer (48 of 64)."""
    m = facts("qwen3.6-27b-sim")
    assert m.hybrid is not None
    conv_dim = 48 * 128 + 2 * 16 * 128
    assert (conv_dim * 3 * 2 * 48, 48 * 128 * 128 * 4 * 48) == m.hybrid.per_req_bytes(1)
    assert (conv_dim // 2 * 3 * 2 * 48, 24 * 128 * 128 * 4 * 48) == m.hybrid.per_req_bytes(2)


def test_groups_not_divisible_by_tp_are_extended_like_sglang() -> None:
    """extra_groups_for_head_shards: n_groups % tp != 0 adds tp - n_groups groups."""
    cfg = {
        "architectures": ["NemotronHForCausalLM"], "num_hidden_layers": 4, "hidden_size": 1024,
        "num_attention_heads": 8, "num_key_value_heads": 8, "hybrid_override_pattern": "M*M-",
        "mamba_num_heads": 8, "mamba_head_dim": 64, "ssm_state_size": 128, "n_groups": 1,
        "conv_kernel": 4,
    }
    m = ModelFacts.from_config(cfg)
    assert m.hybrid is not None and m.kv_layers == 1 and m.hybrid.linear_layers == 2
    conv_dim = 8 * 64 + 2 * 2 * 128  # n_groups 1 -> 2 at tp 2
    assert (conv_dim // 2 * 3 * 2 * 2, 4 * 64 * 128 * 4 * 2) == m.hybrid.per_req_bytes(2)


# --- weights per rank ---------------------------------------------------------------------


def test_dense_weights_split_evenly_over_tp() -> None:
    e = estimate(facts("llama-70b-sim"), weights("llama-70b-sim"), h100s(2), ServerShape(tp=2))
    assert e.weights_gib == pytest.approx(128.4 / 2, abs=1e-6)


def test_mla_low_rank_projections_and_router_are_replicated() -> None:
    """DeepseekV2AttentionMLA's fused_qkv_a_proj_with_mqa and the MoE gate are replicated:
    each rank holds (total - rep)/tp + rep."""
    m = facts("kimi-k2.5-sim")
    rep = 61 * 7168 * (1536 + 512 + 64) * 2 + 60 * 7168 * 384 * 2
    assert rep == m.replicated_bytes(8)
    w = weights("kimi-k2.5-sim")
    e = estimate(m, w, [GpuFacts(i, 94.97) for i in range(8)], ServerShape(tp=8))
    assert e.weights_gib == pytest.approx(((w.total_bytes - rep) / 8 + rep) / GIB)


def test_mtp_draft_comes_out_of_the_checkpoint_with_its_own_embedding_and_head() -> None:
    """NEXTN on DeepSeek: the index's total_size includes the MTP layer; the target gets
    layers/(layers + n) of it; the draft the rest plus its own embed_tokens and lm_head
    (freed only after KV sizing, PR #35996)."""
    m = facts("deepseek-v4-flash-sim")
    w = weights("deepseek-v4-flash-sim")
    shape = ServerShape(tp=4, spec=SpecShape("EAGLE", 1, 1, 2))
    e = estimate(m, w, [GpuFacts(i, 94.97) for i in range(4)], shape)
    target = w.total_bytes * 43 / 44
    rep = m.replicated_bytes(4)
    assert e.weights_gib == pytest.approx(((target - rep) / 4 + rep) / GIB)
    embed_head = 2 * 129280 * 4096 * 2
    assert e.draft_weights_gib == pytest.approx((w.total_bytes / 44 + embed_head) / GIB / 4)
    # the sim's checkpoint index agrees with its simulated target weights
    sim_target = config("deepseek-v4-flash-sim")["sim"]["weights_gib"]
    assert target / GIB == pytest.approx(sim_target, abs=1e-6)
    # ... and holds the seeds' 44.34 GiB per rank once the replicated MLA/router weights count
    assert e.weights_gib == pytest.approx(44.34, abs=0.01)


def test_eagle3_draft_cell_joins_the_target_cell_on_0523_only() -> None:
    """0.5.23 pool_configurator: draft_kv = int(cell x draft_layers / layers), added to the
    cell; up to 0.5.15 the draft sizes its own pool from its own config."""
    draft = facts("kimi-k2.5-eagle3-sim")
    shape = ServerShape(tp=8, spec=SpecShape("EAGLE3", 3, 1, 4))
    gpus = [GpuFacts(i, 94.97) for i in range(8)]
    new = estimate(facts("kimi-k2.5-sim"), weights("kimi-k2.5-sim"), gpus, shape, draft=draft,
                   draft_weights=weights("kimi-k2.5-eagle3-sim"))
    assert new.draft_kv_bytes_per_token == 70272 // 61
    assert new.cell_bytes == 70272 + 70272 // 61
    assert new.draft_weights_gib == pytest.approx(2.8 / 8, abs=1e-6)
    old = estimate(facts("kimi-k2.5-sim"), weights("kimi-k2.5-sim"), gpus,
                   ServerShape(tp=8, sglang_version="0.5.10", spec=shape.spec), draft=draft,
                   draft_weights=weights("kimi-k2.5-eagle3-sim"))
    assert old.draft_kv_bytes_per_token == 1 * 256 * 1 * 2  # 8 heads // 8 x (128+128) x 1 layer
    assert old.cell_bytes == 70272


# --- the start-up arithmetic: profile_max_num_token / _profile_available_bytes ---------------


def test_kv_pool_is_free_after_weights_minus_pre_times_one_minus_fraction() -> None:
    e = estimate(facts("llama-70b-sim"), weights("llama-70b-sim"), h100s(2), ServerShape(tp=2))
    b = e.at(0.9, 64)
    pre = 79.19 - e.context_gib
    assert b.pre_load_free_gib == pytest.approx(pre)
    assert b.headroom_gib == pytest.approx(pre * 0.1)
    assert b.kv_pool_gib == pytest.approx(pre - 64.2 - pre * 0.1, abs=1e-6)
    assert b.kv_tokens == int(b.kv_pool_gib * GIB // 163840)
    for g in b.gpus:  # the parts add up to the GPU
        parts = (g.weights_gib + g.kv_gib + g.graphs_gib + g.activations_gib + g.other_gib
                 + g.context_gib + g.free_gib)
        assert parts == pytest.approx(79.19)


def test_other_processes_lower_every_rank_by_the_fullest_gpu() -> None:
    """SGLang takes the minimum free memory over ranks (get_available_gpu_memory distributed)."""
    gpus = [GpuFacts(0, 79.19, 0.0), GpuFacts(1, 79.19, 3.0)]
    e = estimate(facts("llama-70b-sim"), weights("llama-70b-sim"), gpus, ServerShape(tp=2))
    assert e.pre_load_free_gib == pytest.approx(79.19 - 3.0 - e.context_gib)
    b = e.at(0.9, 64)
    assert [g.other_gib for g in b.gpus] == [0.0, 3.0]
    assert b.gpus[0].free_gib - b.gpus[1].free_gib == pytest.approx(3.0)


def test_prefill_graph_reserve_is_memory_hooks_8_mib_per_shape_or_1_5_gib_for_mla() -> None:
    """0.5.23 memory_hook.reserve_for_graph_mb; 0.5.10 has no prefill graphs."""
    m = facts("llama-70b-sim")
    w = weights("llama-70b-sim")
    new = estimate(m, w, h100s(2), ServerShape(tp=2, sglang_version="0.5.23")).graphs_gib(64)
    old = estimate(m, w, h100s(2), ServerShape(tp=2, sglang_version="0.5.10")).graphs_gib(64)
    assert new - old == pytest.approx(8 / 1024 * len(prefill_graph_tokens(8192)))
    k = facts("kimi-k2.5-sim")
    kw = weights("kimi-k2.5-sim")
    gpus = [GpuFacts(i, 94.97) for i in range(8)]
    new = estimate(k, kw, gpus, ServerShape(tp=8, sglang_version="0.5.23")).graphs_gib(64)
    old = estimate(k, kw, gpus, ServerShape(tp=8, sglang_version="0.5.10")).graphs_gib(64)
    assert new - old == pytest.approx(1.5)


# llama-70b-sim (config.json: hidden 8192, intermediate 28672, 64 heads, 8 KV heads, head_dim
# 8192 / 64 = 128, vocab 32000, bf16), one rank's bytes per captured decode token, written out
# from SGLang's tensors (ModelFacts.graph_bytes_per_token's docstring names them):
#   replicated = input_ids, positions, out_cache_loc, mrope_positions (3 x 8 + 3 x 8)
#                + input_embeds (2 x 8192) + next_token_logits_buffer (4 x 32000, fp32)
#                + the residual stream (4 x 2 x 8192) + at tp > 1 the gathered logits (2 x 32000)
#   sharded    = max(attention: 2 x 128 x (2 x 64/tp + 2 x max(1, 8/tp)),
#                    MLP: 3 x 2 x 28672/tp) + the lm_head's output 2 x 32000/tp
LLAMA70_REPLICATED_TP1 = 48 + 2 * 8192 + 4 * 32000 + 4 * 2 * 8192  # 209968
LLAMA70_GRAPH_BYTES_TP1 = LLAMA70_REPLICATED_TP1 + max(
    2 * 128 * (2 * 64 + 2 * 8), 3 * 2 * 28672) + 2 * 32000  # 446000
LLAMA70_GRAPH_BYTES_TP2 = LLAMA70_REPLICATED_TP1 + 2 * 32000 + max(
    2 * 128 * (2 * 32 + 2 * 4), 3 * 2 * 14336) + 2 * 16000  # 391984


def test_graph_bytes_per_token_are_replicated_plus_sharded_over_tp() -> None:
    """Only the sharded tensors shrink with tp: heads / tp, MLP intermediate / tp, vocab / tp
    for the lm_head; the input buffers, the fp32 logits buffer, the residual stream and (tp >
    1) the gathered logits stay whole on every rank."""
    m = facts("llama-70b-sim")
    assert LLAMA70_GRAPH_BYTES_TP1 == 446_000 and LLAMA70_GRAPH_BYTES_TP2 == 391_984
    assert m.graph_bytes_per_token(1) == 446_000
    assert m.graph_bytes_per_token(2) == 391_984
    # tp 4: the replicated part as at tp 2; sharded max(2x128x(32+4), 6x7168) + 2x8000
    assert m.graph_bytes_per_token(4) == 273_968 + 43_008 + 16_000
    # tp 16: 8 KV heads over 16 ranks leave one whole head on each (max(1, 8 // 16))
    assert m.graph_bytes_per_token(16) == 273_968 + max(2 * 128 * (8 + 2), 6 * 1792) + 4_000
    # what tp 2 -> 4 saves is exactly half of the sharded part
    sharded_tp2 = 86_016 + 32_000
    assert m.graph_bytes_per_token(2) - m.graph_bytes_per_token(4) == sharded_tp2 // 2


def test_prefill_bytes_per_token_shard_the_layer_not_the_residual() -> None:
    """Warmup activations per chunk token: 4 x hidden of residual stream (replicated) + one
    layer's transients / tp; with a fixed chunk, the source-shaped estimate (the default) is
    chunk x that, the hidden-only prior's chunk x 2.5e-8 GiB x hidden at any tp."""
    m, w = facts("llama-70b-sim"), weights("llama-70b-sim")
    assert m.prefill_bytes_per_token(1) == 4 * 2 * 8192 + 3 * 2 * 28672  # 237568
    assert m.prefill_bytes_per_token(2) == 4 * 2 * 8192 + 3 * 2 * 14336  # 151552
    assert m.prefill_bytes_per_token(8) == 4 * 2 * 8192 + max(2 * 128 * (16 + 2), 6 * 3584)
    shape = ServerShape(tp=2, chunked_prefill_size=4096)
    src = estimate(m, w, h100s(2), shape, coeffs=SOURCE_SHAPED_COEFFICIENTS)
    assert src.activations_gib() == pytest.approx(4096 * 151_552 / GIB)
    assert estimate(m, w, h100s(2), shape).activations_gib() == pytest.approx(
        4096 * 151_552 / GIB)
    hidden = estimate(m, w, h100s(2), shape, coeffs=HIDDEN_ONLY_COEFFICIENTS)
    assert hidden.activations_gib() == pytest.approx(4096 * 2.5e-8 * 8192)


def test_the_source_shaped_graph_prior_is_14_times_the_tensors_and_shrinks_with_tp() -> None:
    """llama-70b-sim, 0.5.10, bs 8 (captures [1, 2, 4, 8]): 0.5 + 14 x bytes x 8 / GiB +
    1.6e-7 x 8192 x 80 x 4; from tp 2 to tp 4 the per-token term loses only half of the
    sharded bytes (86016 + 32000) / 2, while the hidden-only prior does not move."""
    m, w = facts("llama-70b-sim"), weights("llama-70b-sim")

    def graphs(tp: int, coeffs: Coefficients) -> float:
        gpus = h100s(tp)
        return estimate(m, w, gpus, ServerShape(tp=tp, sglang_version="0.5.10"),
                        coeffs=coeffs).graphs_gib(8)

    src = SOURCE_SHAPED_COEFFICIENTS
    assert graphs(2, src) == pytest.approx(0.5 + 14 * 391_984 * 8 / GIB + 0.4194304)
    assert graphs(2, src) - graphs(4, src) == pytest.approx(14 * 59_008 * 8 / GIB)
    assert graphs(2, DEFAULT_COEFFICIENTS) == pytest.approx(graphs(2, src))
    hidden = HIDDEN_ONLY_COEFFICIENTS
    assert graphs(2, hidden) == pytest.approx(0.5 + 4e-6 * 8192 * 8 + 0.4194304)
    assert graphs(2, hidden) == pytest.approx(graphs(4, hidden))


def test_mla_layer_transients_follow_the_absorbed_path() -> None:
    """kimi-k2.5-sim (64 heads, q_lora 1536, kv_lora 512, rope 64, nope 128, v 128, first
    layer dense with intermediate 18432) at tp 8: 8 heads per rank, each (128 + 64) + (512 +
    64) + 512 + 128 = 1408 wide, plus the replicated low-rank outputs 1536 + 512 + 64; the
    dense MLP is 3 x 18432 / 8 wide; bf16."""
    k = facts("kimi-k2.5-sim")
    attn = 2 * (8 * 1408 + 1536 + 512 + 64)  # 26752
    mlp = 3 * 2 * (18432 // 8)  # 13824
    assert k.layer_transient_bytes(8) == max(attn, mlp) == 26_752


def test_graph_memory_grows_with_draft_tokens_and_is_capped_by_running_requests() -> None:
    """Verify graphs capture bs x num_draft_tokens tokens; with speculative decoding the
    captured bs stop at max_running_requests (48 unless set)."""
    m, w = facts("llama-70b-sim"), weights("llama-70b-sim")
    c = Coefficients(graph_overhead_gib_per_layer_hidden=0.0, draft_graph_gib_per_token_hidden=0.0,
                     draft_graph_overhead_gib=0.0, prefill_graph_gib_per_shape=0.0,
                     graph_fixed_gib=0.0)
    plain = estimate(m, w, h100s(2), ServerShape(tp=2), coeffs=c)
    spec = estimate(m, w, h100s(2), ServerShape(tp=2, spec=SpecShape("EAGLE", 3, 1, 4)),
                    draft=facts("llama-70b-sim"), draft_weights=WeightFacts(GIB), coeffs=c)
    per_token = 14 * 391_984 / GIB  # the source-shaped prior at tp 2 (hand-computed above)
    assert plain.graphs_gib(256) == pytest.approx(per_token * 256)
    assert spec.graphs_gib(256) == pytest.approx(per_token * 48 * 4)


def test_draft_decode_graphs_hold_one_steps_activations_whatever_the_steps() -> None:
    """SGLang runs the draft-decode steps one after another on bs x topk tokens inside one
    graph (eagle_worker.draft_forward), so its pool holds one step's activations: more steps
    add nothing, a wider topk adds per token. Hand-computed with only the draft's per-token
    term on (g = 1e-6 GiB per token per unit of hidden, 8192 wide, no per-graph cost), bs 48
    (the spec cap), 4 draft tokens:
    - steps 2 and steps 5, topk 1: draft decode 48 x 1 x g + draft extend 48 x 4 x g, equal;
    - topk 2 (steps 3, 4 draft tokens): draft decode 48 x 2 x g, one 48 x g more than topk 1.
    """
    m, w = facts("llama-70b-sim"), weights("llama-70b-sim")
    g = 1e-6 * 8192
    c = Coefficients(graph_gib_per_token_hidden=0.0, graph_bytes_scale=0.0,
                     graph_overhead_gib_per_layer_hidden=0.0, draft_graph_gib_per_token_hidden=1e-6,
                     draft_graph_overhead_gib=0.0, prefill_graph_gib_per_shape=0.0,
                     graph_fixed_gib=0.0)

    def graphs(spec: SpecShape) -> float:
        e = estimate(m, w, h100s(2), ServerShape(tp=2, sglang_version="0.5.10", spec=spec),
                     draft=facts("llama-70b-sim"), draft_weights=WeightFacts(GIB), coeffs=c)
        return e.graphs_gib(256)

    two, five = graphs(SpecShape("EAGLE", 2, 1, 4)), graphs(SpecShape("EAGLE", 5, 1, 4))
    assert two == pytest.approx(48 * g + 48 * 4 * g)
    assert five == pytest.approx(two)
    wide = graphs(SpecShape("EAGLE", 3, 2, 4))
    assert wide == pytest.approx(two + 48 * g)


def test_graph_memory_has_sglangs_fixed_half_gib_once_per_capture() -> None:
    """The cold prior counts SGLang's 512 MiB ``reserved_mem`` base (attention-backend buffers
    allocated after the KV pool) once, whatever the bs. Hand-computed: llama-70b-sim (hidden
    8192, 80 layers, 391,984 tensor bytes per captured token at tp 2), tp 2, 0.5.10, bs 8
    captures [1, 2, 4, 8]: 0.5 + 14 x 391,984 x 8 / GiB + 1.6e-7 x 8192 x 80 x 4."""
    m, w = facts("llama-70b-sim"), weights("llama-70b-sim")
    e = estimate(m, w, h100s(2), ServerShape(tp=2, sglang_version="0.5.10"))
    assert e.graphs_gib(8) == pytest.approx(0.5 + 14 * 391_984 * 8 / GIB + 0.4194304)
    without = estimate(m, w, h100s(2), ServerShape(tp=2, sglang_version="0.5.10"),
                       coeffs=Coefficients(graph_fixed_gib=0.0))
    for bs in (1, 8, 64, 256):
        assert e.graphs_gib(bs) - without.graphs_gib(bs) == pytest.approx(0.5)
    off = estimate(m, w, h100s(2), ServerShape(tp=2, disable_cuda_graph=True))
    assert off.graphs_gib(64) == 0.0


def test_moe_layers_add_fused_moe_caches_per_routed_token() -> None:
    """A routed-MoE layer's Triton runner holds, per token and routed expert,
    ``intermediate_cache1`` (N = 2 x moe_intermediate / tp), ``intermediate_cache2`` (N / 2)
    and ``intermediate_cache3`` (hidden), bf16 (layers/moe/moe_runner/triton_utils/fused_moe.py).
    Hand-computed for Qwen3-30B-A3B (hidden 2048, 8 of 128 experts, moe_intermediate 768):
    tp 1: 8 x (1536 + 768 + 2048) x 2 = 69,632 bytes; tp 2: 8 x (768 + 384 + 2048) x 2 =
    51,200. The warmup activations (chunk 8192) and the top decode graph (bs 8) grow by the
    same bytes per token; a dense model of the same hidden size gets nothing."""
    moe_cfg = {"architectures": ["Qwen3MoeForCausalLM"], "num_hidden_layers": 48,
               "hidden_size": 2048, "num_attention_heads": 32, "num_key_value_heads": 4,
               "head_dim": 128, "vocab_size": 151936, "num_experts": 128,
               "num_experts_per_tok": 8, "moe_intermediate_size": 768}
    moe = ModelFacts.from_config(moe_cfg)
    dense = ModelFacts.from_config({k: v for k, v in moe_cfg.items() if k not in (
        "num_experts", "num_experts_per_tok", "moe_intermediate_size")})
    assert moe.moe_bytes_per_token(1) == 69_632
    assert moe.moe_bytes_per_token(2) == 51_200
    assert dense.moe_bytes_per_token(1) == 0
    shape = ServerShape(tp=1, sglang_version="0.5.10", chunked_prefill_size=8192)
    w = WeightFacts(61_064_245_248)
    # the hidden-only prior prices both models' other tensors alike, so the difference is the
    # MoE term alone (the default's prefill tensors also differ: no dense MLP in the MoE model)
    e_moe = estimate(moe, w, h100s(1), shape, coeffs=HIDDEN_ONLY_COEFFICIENTS)
    e_dense = estimate(dense, w, h100s(1), shape, coeffs=HIDDEN_ONLY_COEFFICIENTS)
    assert e_moe.activations_gib() - e_dense.activations_gib() == pytest.approx(
        8192 * 69_632 / GIB)
    assert e_moe.graphs_gib(8) - e_dense.graphs_gib(8) == pytest.approx(8 * 69_632 / GIB)
    # the default: one layer's transients are the attention's, 2 x 128 x (2 x 32 + 2 x 4) =
    # 18,432 bytes, against the dense MLP's 3 x 2 x 8192 (intermediate 4 x hidden) = 49,152
    src_moe, src_dense = estimate(moe, w, h100s(1), shape), estimate(dense, w, h100s(1), shape)
    assert src_moe.activations_gib() - src_dense.activations_gib() == pytest.approx(
        8192 * (69_632 + 18_432 - 49_152) / GIB)


def test_0510_draft_pool_in_the_headroom_grows_with_the_fraction() -> None:
    """Up to 0.5.15 the draft's KV pool has as many tokens as the target's and comes out of the
    headroom, so it grows with the fraction. The DeepSeek-V4 seed on 0.5.10 (tp 4, EAGLE
    1/1/2): the choice must count that pool at the tokens it chooses, not at the 4096-token
    minimum (which said "no setting fits" while its own sum was under the free memory)."""
    m, w = facts("deepseek-v4-flash-sim"), weights("deepseek-v4-flash-sim")
    gpus = [GpuFacts(i, 94.97) for i in range(4)]
    shape = ServerShape(tp=4, sglang_version="0.5.10", spec=SpecShape("EAGLE", 1, 1, 2),
                        max_running_requests=48, chunked_prefill_size=4096)
    e = estimate(m, w, gpus, shape)
    c = choose(e, LaunchParams())
    assert c.feasible, c.reason
    b = c.budget
    assert b.fits
    draft_pool = b.kv_tokens * e.draft_kv_bytes_per_token / GIB
    assert b.draft_in_headroom_gib == pytest.approx(e.draft_weights_gib + draft_pool)
    assert b.spare_gib == pytest.approx(b.headroom_gib - b.graphs_gib - b.activations_gib
                                        - e.draft_weights_gib - draft_pool)
    assert b.spare_gib >= max(0.15 * (b.graphs_gib + b.activations_gib), MIN_MARGIN_GIB) - 0.01
    # one step (0.001) above the range's high edge the pool no longer fits the headroom
    rng = e.feasible_range(b.cuda_graph_max_bs)
    assert rng is not None
    assert e.at(rng[1] - 0.001, b.cuda_graph_max_bs).fits
    assert not e.at(rng[1] + 0.001, b.cuda_graph_max_bs).fits


def test_no_setting_fits_names_the_binding_problem_not_a_sum_that_fits() -> None:
    """When the weights, minimum pool, graphs and activations add up to less than the free
    memory but the margin leaves no fraction, the message says so instead of claiming the sum
    exceeds the free memory."""
    m, w = facts("llama-70b-sim"), weights("llama-70b-sim")
    e = estimate(m, w, h100s(2), ServerShape(tp=2))
    c = choose(e, LaunchParams(), margin=40.0)
    assert not c.feasible
    assert "with the 4000% margin" in c.reason and "exceed the" not in c.reason


def test_auto_values_are_sglangs() -> None:
    """Unset params resolve to autoargs' values (server_args / memory_hook): H100 tp1 on
    0.5.23 is 0.830 (docs/sglang.md's table)."""
    e = estimate(facts("tiny-1b-sim"), weights("tiny-1b-sim"), h100s(1), ServerShape(tp=1))
    assert e.auto_bs() == auto_cuda_graph_max_bs(79.19, 1, "0.5.23") == 256
    gpus = [GpuFacts(0, 81559 / 1024)]
    e = estimate(facts("tiny-1b-sim"), weights("tiny-1b-sim"), gpus, ServerShape(tp=1))
    assert e.resolve(LaunchParams()) == (0.830, 256)


# --- the first attempt ---------------------------------------------------------------------


def test_choice_keeps_the_stated_margin_and_is_the_highest_fraction_that_does() -> None:
    e = estimate(facts("llama-70b-sim"), weights("llama-70b-sim"), h100s(2), ServerShape(tp=2))
    c = choose(e, LaunchParams(), margin=0.15)
    assert c.feasible and c.changed == ("mem_fraction_static", "cuda_graph_max_bs")
    b = c.budget
    need = b.graphs_gib + b.activations_gib
    assert b.spare_gib >= max(0.15 * need, MIN_MARGIN_GIB) - 1e-9
    higher = e.at(b.mem_fraction_static + 0.001, b.cuda_graph_max_bs)
    assert higher.spare_gib < max(0.15 * need, MIN_MARGIN_GIB)
    assert c.params.mem_fraction_static == b.mem_fraction_static
    assert "margin 15%" in c.reason and "KV pool" in c.reason
    # the KV pool gets at least half of what the weights leave (the graph bs was lowered)
    assert b.kv_pool_gib >= 0.5 * (e.pre_load_free_gib - e.weights_gib)
    assert b.cuda_graph_max_bs < 256 and "lowered from 256" in c.reason


def test_configured_fields_are_kept_unless_the_policy_says_estimate() -> None:
    """The demo's configured 0.99 / 256 leaves 0.78 GiB of headroom for about 7 GiB of
    estimated graphs and activations: kept, and said to fail; 0.88 / 256 is said to fit."""
    e = estimate(facts("llama-70b-sim"), weights("llama-70b-sim"), h100s(2), ServerShape(tp=2))
    kept = choose(e, LaunchParams(0.99, 256))
    assert kept.params == LaunchParams(0.99, 256) and kept.feasible
    assert "expected to fail: cuda_graph" in kept.reason
    assert "kept (expected to fit" in choose(e, LaunchParams(0.88, 256)).reason
    only_bs = choose(e, LaunchParams(None, 32))
    assert only_bs.params.cuda_graph_max_bs == 32 and only_bs.changed == ("mem_fraction_static",)
    assert only_bs.budget.fits
    override = choose(e, LaunchParams(0.99, 256), override=True)
    assert override.params != LaunchParams(0.99, 256) and override.budget.fits


def test_weights_that_cannot_fit_are_refused_with_the_fix() -> None:
    e = estimate(facts("llama-70b-sim"), weights("llama-70b-sim"), h100s(1), ServerShape(tp=1))
    c = choose(e, LaunchParams())
    assert not c.feasible and c.params == LaunchParams()
    assert "weights alone need 128.40 GiB per GPU" in c.reason
    assert "more GPUs (tp 2" in c.reason and "quantized" in c.reason


def test_a_kv_pool_below_the_minimum_at_every_graph_bs_is_refused() -> None:
    """Weights fit 2 x 67 GiB, but graphs at bs 1 + activations + 4096 KV tokens do not."""
    gpus = [GpuFacts(i, 67.0) for i in range(2)]
    e = estimate(facts("llama-70b-sim"), weights("llama-70b-sim"), gpus, ServerShape(tp=2))
    assert e.weights_gib < e.pre_load_free_gib
    c = choose(e, LaunchParams())
    assert not c.feasible
    assert "no setting fits" in c.reason and "minimum KV pool" in c.reason
    assert e.feasible_range(1) is None


# --- facts parsing -------------------------------------------------------------------------


def test_config_errors_name_the_missing_key() -> None:
    with pytest.raises(NoEstimate, match=r"no estimate: config\.json has no num_hidden_layers"):
        ModelFacts.from_config({"hidden_size": 4096})
    with pytest.raises(NoEstimate, match="not a JSON object"):
        ModelFacts.from_config([])  # type: ignore[arg-type]


def test_weight_bytes_from_index_and_headers() -> None:
    assert weight_bytes_from_index({"metadata": {"total_size": 123}}) == 123
    with pytest.raises(NoEstimate, match=r"metadata\.total_size"):
        weight_bytes_from_index({"weight_map": {}})
    header = {"__metadata__": {"format": "pt"},
              "a": {"dtype": "BF16", "shape": [2, 3], "data_offsets": [0, 12]},
              "b": {"dtype": "F32", "shape": [4], "data_offsets": [12, 28]}}
    assert weight_bytes_from_header(header) == 28
    with pytest.raises(NoEstimate, match="data_offsets"):
        weight_bytes_from_header({"a": {"dtype": "BF16"}})


def test_every_sim_model_index_agrees_with_its_simulated_weights() -> None:
    """total_size = sim.weights_gib (+ the MTP layer's share where the checkpoint ships one)."""
    for d in sorted(MODELS.iterdir()):
        cfg = config(d.name)
        m = ModelFacts.from_config(cfg)
        total = weights(d.name).total_bytes / GIB
        layers, n = m.num_layers, m.nextn_layers
        assert total * layers / (layers + n) == pytest.approx(cfg["sim"]["weights_gib"]), d.name


# --- a failed attempt's picture ----------------------------------------------------------------


def test_observed_bar_splits_the_log_figures_and_states_the_deficit() -> None:
    n = Numbers(tried_gib=2.0, free_gib=0.5, total_gib=80.0, gpu=1, pre_load_avail_gib=79.0,
                post_weights_avail_gib=15.0, weights_gib=64.0, pool_end_avail_gib=9.0,
                graph_pass="target_decode", graph_last_avail_gib=0.5, mem_fraction_static=0.88)
    o = observed_bar(n, "cuda_graph")
    assert o is not None
    b = o.bar
    assert (b.index, b.weights_gib, b.kv_gib, b.graphs_gib, b.other_gib) == (1, 64.0, 6.0, 8.5,
                                                                             1.0)
    assert b.free_gib == pytest.approx(0.5)
    assert o.deficit_gib == pytest.approx(1.5)
    assert o.broke == "cuda_graph (target_decode)"
    assert b.line_gib == pytest.approx(79.0 * 0.88)
    assert observed_bar(Numbers(), "cuda_graph") is None


def test_hybrid_state_cache_follows_0523_slot_sizing_with_speculative_decoding() -> None:
    """KVCacheConfigurator._handle_max_mamba_cache (0.5.23): budget = rest x 0.9/1.9; with
    EAGLE (D = 4 draft tokens) K = (budget - s(1+D)) // (s(1 + D/ratio)), ratio 5 (extra_buffer
    with the overlap schedule: 3 + 2), K + 1 slots plus s x (min(48, K // 5) + 1) x D of
    intermediate state; the KV pool gets the rest."""
    m = facts("qwen3.6-27b-sim")
    shape = ServerShape(tp=1, spec=SpecShape("EAGLE", 3, 1, 4))
    e = estimate(m, weights("qwen3.6-27b-sim"), [GpuFacts(0, 94.97)], shape)
    assert e.mamba_slots_per_req() == 5
    s = sum(m.hybrid.per_req_bytes(1)) / GIB if m.hybrid else 0.0
    b = e.at(0.9, 48)
    pre = e.pre_load_free_gib
    rest = pre - e.weights_gib - e.draft_weights_gib - pre * 0.1
    budget = rest * 0.9 / 1.9
    k = int((budget - s * 5) // (s * (1 + 4 / 5)))
    state = s * (k + 1) + s * (min(48, k // 5) + 1) * 4
    assert b.state_gib == pytest.approx(state)
    assert b.kv_pool_gib == pytest.approx(rest - state)
    no_overlap = estimate(m, weights("qwen3.6-27b-sim"), [GpuFacts(0, 94.97)],
                          ServerShape(tp=1, overlap=False))
    assert no_overlap.mamba_slots_per_req() == 3  # auto without overlap: no_buffer
