"""The simulator's hidden costs follow SGLang's formulas (figures worked by hand from SGLang's
source, as tests/memory/test_budget.py does), for the shipped sim models. Pure: no processes."""

from __future__ import annotations

import json

import pytest

from launcher.sglang.modelfacts import GIB, ModelFacts
from launcher.sim.memory import MemoryScenario
from launcher.sim.model import scenario_from_argv
from tests.simhost import model_dir


def scenario(name: str, tp: int, *extra: str, version: str = "0.5.23") -> MemoryScenario:
    argv = ["--model-path", str(model_dir(name)), "--tp", str(tp), *extra]
    return scenario_from_argv(version, argv, 94.97)[0]


@pytest.mark.parametrize("tp", [1, 2, 8])
def test_gqa_kv_cell_is_kv_heads_over_tp_heads_in_gib(tp: int) -> None:
    """pool_configurator._compute_cell_size: max(1, 8 // tp) heads x (128 + 128) x 80 layers x
    2 bytes per token on one rank; GiB are 2**30 bytes (no MiB/GB mix-up)."""
    s = scenario("llama-70b-sim", tp)
    assert s.kv_gib_per_1k_tokens * GIB / 1000 == pytest.approx(max(1, 8 // tp) * 256 * 80 * 2)


@pytest.mark.parametrize("tp", [1, 4, 8])
def test_mla_kv_cell_is_not_sharded_by_tp(tp: int) -> None:
    """calculate_mla_kv_cache_dim: (kv_lora_rank 512 + qk_rope_head_dim 64) x 43 layers x 2
    bytes on every rank, whatever tp."""
    s = scenario("deepseek-v4-flash-sim", tp)
    assert s.kv_gib_per_1k_tokens * GIB / 1000 == pytest.approx((512 + 64) * 43 * 2)


def test_mtp_draft_cell_is_the_targets_per_layer() -> None:
    """0.5.23 pool_configurator: the draft's cell = the target's x 1 MTP layer / 43 layers."""
    s = scenario("deepseek-v4-flash-sim", 4, "--speculative-algorithm", "EAGLE")
    assert s.spec is not None
    per_token = s.spec.draft_kv_gib_per_1k_tokens * GIB / 1000
    assert per_token == int((512 + 64) * 43 * 2 / 43)


def test_hybrid_state_per_slot_is_mamba2_state_shape() -> None:
    """Mamba2StateShape.create (Qwen3-Next GDN): conv_dim = 48 x 128 + 2 x 16 x 128 = 10240,
    conv (10240, 3) bf16, temporal (48, 128, 128) fp32, 48 linear layers: 153,944,064 bytes."""
    s = scenario("qwen3.6-27b-sim", 1)
    assert s.hybrid is not None
    assert s.hybrid.conv_gib_per_req * GIB == pytest.approx(10240 * 3 * 2 * 48)
    assert s.hybrid.ssm_gib_per_req * GIB == pytest.approx(48 * 128 * 128 * 4 * 48)
    assert s.hybrid.per_req_gib * GIB == pytest.approx(153_944_064)


def test_mla_projections_and_router_are_replicated_on_every_rank() -> None:
    """deepseek_v2.py: fused_qkv_a_proj_with_mqa (hidden x (q_lora + kv_lora + rope)) and the
    MoE gate are ReplicatedLinear; each rank holds them whole, 1/tp of the rest."""
    s = scenario("kimi-k2.5-sim", 8)
    rep = (61 * 7168 * (1536 + 512 + 64) * 2 + 60 * 7168 * 384 * 2) / GIB
    assert s.replicated_gib == pytest.approx(rep)
    assert s.weights_per_rank_gib == pytest.approx((s.weights_gib - rep) / 8 + rep)
    assert s.weights_per_rank_gib == pytest.approx(72.33, abs=0.01)  # the seeds' figure


# --- decode graphs and warmup per rank: SGLang's tensors (docs/memory.md, "Per rank") ------
# llama-70b-sim (hidden 8192, intermediate 28672, vocab 32000, bf16), per captured token:
# whole on every rank: input_ids, positions, out_cache_loc (3 x 8), mrope_positions (3 x 8),
# input_embeds (2 x 8192), next_token_logits_buffer (4 x 32000, fp32), the residual stream
# (4 x 2 x 8192): 209,968; split by tp: the MLP's gate_up + SiluAndMul (3 x 2 x 28672, larger
# than the attention's) and the lm_head output (2 x 32000): 236,032; at tp > 1 the
# all-gathered logits (2 x 32000). The pool is 4.57 x the tensors (the one real capture
# figure, 0.93 GB at bs 160 for Qwen2.5-7B at tp 1, context 32768: 4.57 x 1,061,936 x 160 +
# 160 x 32768 x 4 + 24 graphs x 8 MiB), plus the attention backend's int32 graph state per
# token of context (FlashInfer cuda_graph_kv_indices).
LLAMA_WHOLE, LLAMA_SPLIT, LLAMA_GATHERED = 209_968, 236_032, 64_000


@pytest.mark.parametrize("tp", [1, 2, 4, 8])
def test_decode_graph_pool_per_token_is_sglangs_tensors_whole_plus_split_over_tp(tp: int) -> None:
    s = scenario("llama-70b-sim", tp)
    tensors = LLAMA_WHOLE + LLAMA_SPLIT / tp + (LLAMA_GATHERED if tp > 1 else 0)
    assert s.graph_gib_per_bs * GIB == pytest.approx(4.57 * tensors + 4096 * 4)
    assert s.graph_overhead_gib == 8 / 1024  # SGLang's own 8 MiB per graph (memory_hook)
    if tp == 2:  # the tensors test_budget.py writes out for the estimator
        assert LLAMA_WHOLE + LLAMA_SPLIT / 2 + LLAMA_GATHERED == 391_984


def test_the_real_capture_figure_sets_the_pool_factor() -> None:
    """Qwen2.5-7B (hidden 3584, intermediate 18944, vocab 152064) at tp 1, bs 160 (24 graphs),
    context 32768: the pool factor 4.57 gives back the 0.93 GB that SGLang logged
    (tests/fixtures/real_logs/gh11949_warmup_403_proxy.log, ``mem usage=0.93 GB``)."""
    whole = 3 * 8 + 3 * 8 + 2 * 3584 + 4 * 152064 + 4 * 2 * 3584
    split = 3 * 2 * 18944 + 2 * 152064
    graph = 4.57 * (whole + split) * 160 + 160 * 32768 * 4 + 24 * 8 * (1 << 20)
    assert graph / GIB == pytest.approx(0.93, abs=0.005)


def test_graph_state_grows_with_the_context_length() -> None:
    short = scenario("llama-70b-sim", 2, "--context-length", "2048")
    long = scenario("llama-70b-sim", 2)
    assert (long.graph_gib_per_bs - short.graph_gib_per_bs) * GIB == pytest.approx(2048 * 4)


@pytest.mark.parametrize(("tp", "chunk"), [(1, 8192), (2, 8192), (2, 4096), (8, 2048)])
def test_warmup_is_a_chunk_of_prefill_tensors(tp: int, chunk: int) -> None:
    """A prefill chunk's tokens x (the residual stream, 4 x 2 x 8192, whole + one layer's MLP
    transients, 3 x 2 x 28672, over tp): logits only for each request's last token."""
    s = scenario("llama-70b-sim", tp, "--chunked-prefill-size", str(chunk))
    assert s.warmup_gib * GIB == pytest.approx(chunk * (65_536 + 172_032 / tp))


def test_tiny_model_tensors() -> None:
    """tiny-1b-sim (Llama-3.2-1B: hidden 2048, intermediate 8192, vocab 128256) at tp 1:
    whole 48 + 2 x 2048 + 4 x 128256 + 8 x 2048 = 533,552, split 6 x 8192 + 2 x 128256 =
    305,664; warmup 8 x 2048 + 6 x 8192 per token."""
    s = scenario("tiny-1b-sim", 1, "--chunked-prefill-size", "4096")
    assert s.graph_gib_per_bs * GIB == pytest.approx(4.57 * (533_552 + 305_664) + 131072 * 4)
    assert s.warmup_gib * GIB == pytest.approx(4096 * (16_384 + 49_152))


# --- the EAGLE (EAGLE-1) draft for llama-70b-sim: one decoder layer + fc, the target's head ----
# yuhuili/EAGLE-llama2-chat-70B / EAGLE-LLaMA3-Instruct-70B: 0.99B parameters (one Llama-70B
# layer without input_layernorm, 855,646,208, and fc: Linear(16384, 8192) with bias,
# 134,225,920), plus the embed_tokens and lm_head LlamaForCausalLMEagle allocates (2 x 32000 x
# 8192) until set_embed_and_head swaps in the target's; all x 2 bytes.
EAGLE_DRAFT_BYTES = (855_646_208 + 134_225_920 + 2 * 32000 * 8192) * 2
# Per captured token: the target formula's tensors for the same hidden and vocab, plus the
# torch.cat of embedding and target hidden state (2 x 2 x 8192, llama_eagle.py) and the fp32
# softmax over the vocab before topk (4 x 32000, 0.5.10 eagle_worker.py capture_for_decode).
EAGLE_WHOLE = LLAMA_WHOLE + 2 * 2 * 8192 + 4 * 32000


@pytest.mark.parametrize("version", ["0.5.10", "0.5.23"])
@pytest.mark.parametrize("tp", [1, 2, 8])
def test_eagle_draft_is_sglang_shaped_from_its_tensors(version: str, tp: int) -> None:
    """EAGLE with --speculative-draft-model-path (accepted by 0.5.10 and 0.5.23 for a Llama
    target): the draft's weights, its one-layer KV cell and its graph pool per captured token,
    4.57 x (whole + split / tp + gathered at tp > 1) + 4 bytes per token of the target's
    context, as the target's, of which the 4 bytes x context are the attention state that
    draft decode keeps per step; 8 MiB per graph."""
    s = scenario("llama-70b-sim", tp, "--speculative-algorithm", "EAGLE",
                 "--speculative-draft-model-path", str(model_dir("llama-70b-eagle-sim")),
                 "--speculative-num-steps", "3", "--speculative-eagle-topk", "4",
                 "--speculative-num-draft-tokens", "8", version=version)
    assert s.spec is not None and "EAGLE" == s.spec.algorithm
    assert s.spec.draft_weights_gib * GIB == pytest.approx(EAGLE_DRAFT_BYTES / tp)
    tensors = EAGLE_WHOLE + LLAMA_SPLIT / tp + (LLAMA_GATHERED if tp > 1 else 0)
    assert s.spec.draft_graph_gib_per_token * GIB == pytest.approx(4.57 * tensors + 4096 * 4)
    assert s.spec.draft_attn_state_gib_per_token * GIB == pytest.approx(4096 * 4)
    assert s.spec.draft_graph_overhead_gib == 8 / 1024
    # one layer of 8 KV heads of 128 (K and V), 2 bytes: max(1, 8 // tp) x 512 per token
    assert s.spec.draft_kv_gib_per_1k_tokens * GIB / 1000 == pytest.approx(max(1, 8 // tp) * 512)
    # the config's tensor figures are launcher.sglang.modelfacts's formula for the draft's config
    draft = ModelFacts.from_config(
        json.loads((model_dir("llama-70b-eagle-sim") / "config.json").read_text()))
    extra = EAGLE_WHOLE - LLAMA_WHOLE
    assert draft.graph_bytes_per_token(tp) + extra == tensors


# --- DeepSeek-V4-Flash's graphs: SGLang's 8 MiB per graph, the seed's totals ------------------


@pytest.mark.parametrize("version", ["0.5.10", "0.5.23"])
def test_deepseek_v4_graphs_cost_sglangs_8_mib_per_graph_and_keep_the_seeds_total(
    version: str,
) -> None:
    """The seeds' launch (tp 4, EAGLE 1/1/2, graph bs 32): 20 verify graphs (1..8, 10..32 by
    2) at 2 tokens per request. Every graph after the first costs SGLang's 8 MiB, on the target
    and on the NextN draft (0.5.23 deepseek_v4_backend keeps no context-sized buffer per
    graph: docs/memory.md, "The DeepSeek-V4 seed's verify graphs"). The totals are the seed's:
    verify 0.36849859375 x 64 + 20 x 0.0078125 = 23.58391 + 0.15625 = 23.74016 GiB (a split
    of 0.24594 GiB per token + 0.4 per graph gives the same total, 15.74016 + 8); the
    draft-extend pass's first step, the seed's "Tried to allocate 7.50 GiB",
    0.1170654296875 x 64 + 0.0078125 = 7.4921875 + 0.0078125 = 7.50 (0.116875 x 64 + 0.02
    gives it too)."""
    graph_flag = "--cuda-graph-max-bs-decode" if version == "0.5.23" else "--cuda-graph-max-bs"
    s = scenario("deepseek-v4-flash-sim", 4, "--speculative-algorithm", "EAGLE",
                 "--speculative-num-steps", "1", "--speculative-eagle-topk", "1",
                 "--speculative-num-draft-tokens", "2", graph_flag, "32", version=version)
    assert s.spec is not None
    passes = {p.name: p for p in s.graph_passes(32)}
    verify, extend = passes["target_verify"], passes["draft_extend"]
    assert [*range(1, 9), *range(10, 33, 2)] == verify.sizes == extend.sizes
    for p in (verify, extend):
        assert [8 / 1024] * 19 == [gib for _, gib in p.allocations[1:]], p.name
    assert verify.total_gib == pytest.approx(0.24594 * 64 + 20 * 0.4, abs=1e-9)
    assert verify.total_gib == pytest.approx(23.74016, abs=1e-9)
    assert extend.allocations[0] == (32, pytest.approx(7.50, abs=1e-9))


# --- against real start-ups (tests/fixtures/real_startups/) ---------------------------------

REAL_1B = "docs-llama32-1b-h100-tp1-mf0874-bs4-20250811"  # Llama-3.2-1B-Instruct, H100, FA3


def test_tiny_1b_starts_like_the_real_llama_3_2_1b_start_ups() -> None:
    """tiny-1b-sim is Llama-3.2-1B's geometry; on the sim's H100 at the real case's settings
    (SGLang 0.5.0rc0, read as 0.5.6: no prefill graphs; 0.874, graph bs 4) its start-up shows
    the real log's figures: CUDA context (total - free at load begin) 1.07 GiB, the attention
    backend's buffers (pool end - capture begin) 0.09 GiB (sim: FA3's 0.10, the fit half's
    median), the decode pass's ``mem usage`` 0.04 GiB, each within 0.01 (+ the log's rounding
    to hundredths)."""
    from launcher.memory.priors import DEFAULT_COEFFICIENTS
    from launcher.params import LaunchParams
    from launcher.sim.memory import simulate
    from launcher.sim.model import load_model, scenario_for
    from tests.real_startups import ROOT, load_case

    case = load_case(ROOT / REAL_1B)
    f = case.figures
    real_context = case.gpu_total_gib - f["load_weight_begin_avail_gb"]
    real_buffers = f["memory_pool_end_avail_gb"] - case.graph_passes[0].begin_avail_gb
    real_decode = case.graph_passes[0].mem_usage_gb
    model = load_model(str(model_dir("tiny-1b-sim")))
    assert ModelFacts.from_config(case.config) == ModelFacts.from_config(
        json.loads((model_dir("tiny-1b-sim") / "config.json").read_text()))
    s = scenario_for(model, case.gpu_total_gib, 1, 0.0, "0.5.6", gpu_name=case.gpu)
    trace = simulate(s, LaunchParams(0.874, 4))
    assert trace.ok
    decode = s.graph_passes(4, trace.max_running_requests)
    assert [p.name for p in decode] == ["target_decode"]
    assert s.context_gib == DEFAULT_COEFFICIENTS.context_gib == pytest.approx(real_context,
                                                                               abs=0.015)
    assert s.attention_buffers_gib == pytest.approx(real_buffers, abs=0.015)
    assert decode[0].total_gib == pytest.approx(real_decode, abs=0.015)
