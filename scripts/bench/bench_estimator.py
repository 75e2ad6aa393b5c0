#!/usr/bin/env python3
"""The estimator as a contender (docs/benchmarks.md): ``scripts/bench/bench_oom.py --estimator``.

Usage::

    .venv/bin/python scripts/bench/bench_oom.py --estimator [--n 300] [--seed 1] [--max-attempts 8]

No processes, no GPU. Each scenario is a real model's ``config.json`` dimensions and checkpoint
size on a real GPU type, with *hidden true costs* that only the simulator's memory model
(``launcher.sim.memory``, the arithmetic the simulated SGLang server runs) knows. Contenders,
on the same scenarios; after a failed first attempt every one of them continues with today's
policy (``launcher.memory.policy.next_params``), as ``launcher up`` does:

- ``configured``: today: the configured params (auto, p=0.5, or explicit values as in
  bench_oom's plain scenarios), then the policy's backoff.
- ``seeds-0.10``: the same start, then the seeds' rule (OOM: fraction - 0.10 and half the graph
  bs; kv_too_small: + 0.10).
- ``estimate-cold``: the first attempt from ``launcher.memory.estimate`` (``estimate`` on the
  model's config, checkpoint size and the GPUs as nvidia-smi shows them; ``choose`` with the
  params unset, its default margin), with an empty ledger.
- ``estimate-warm``: the same, after the ledger recorded one earlier run of another server of
  the same architecture on the same GPU type (another model of the family when the catalogue
  has one, else the same model at another tp / other processes), every attempt of it as
  ``LedgerRecorder`` files it (``launcher.sglang.observed`` figures, the uncorrected guess);
  ``launcher.memory.calibration.learn_estimate`` corrects the estimate and gives the margin.

Hidden true costs (per GiB figures per GPU; the "family" draws are shared by every model of one
architecture on one GPU type, the rest are drawn per scenario). Derived from SGLang's formulas
(sglang/srt 0.5.10 / 0.5.23) and from the figures of real logs (tests/fixtures/real_logs,
tests/data/logs):

- CUDA context + NCCL before the weights: family U(0.4, 1.2) + (tp > 1) U(0.1, 0.6)
  + per scenario U(-0.05, 0.05); the estimator's prior is 1.0 + 0.1 x (tp - 1).
- Weights per rank: the estimator's sharding formula x a family factor U(0.98, 1.05) (buffers,
  padding, allocator rounding) x per scenario U(0.995, 1.005).
- KV bytes per token: SGLang's cell size, exact (``_compute_cell_size``).
- Decode graph activation pool per captured token on a rank: hidden x c x (r + (1 - r) / tp)
  + vocab x 4 (the fp32 logits buffer) + vocab / tp x 2 (the lm_head output) + at tp > 1
  vocab x 2 (the gathered logits) bytes; c family U(16, 64) (x U(1.5, 4) for MoE: expert
  workspaces), r (the replicated share: residual stream, input buffers; the rest is attention
  heads and MLP intermediate, sharded) family U(0.1, 0.4): SGLang's tensors shard most of a
  layer's transients by tp but not the residual stream or the logits
  (``ModelFacts.graph_bytes_per_token`` names them). Per captured graph U(2, 12) MiB; and a
  family constant of U(0.1, 2) GiB, as 0.5.23's prefill-graph pool, or on 0.5.10 spread over
  the decode graphs (per graph: the constant over the 36 graphs of a bs-256 capture, so it
  grows with the graphs captured). MLA on 0.5.23 adds U(0.75, 3) GiB of prefill graphs (SGLang
  reserves 1.5 GiB: "MLA backend overhead is much higher than expected with fa3",
  ``memory_hook.reserve_for_graph_mb``).
  MoE and MLA models draw the constant from the dense models' range: all-to-all buffers exist
  only with DeepEP (``reserve_for_deepep_a2a_mb``: 2 GiB, + 1 GiB for breakable prefill
  graphs), which no scenario here uses (tp only), SGLang's own graph reserve has no MoE term
  otherwise, and the seeds' DeepSeek-V4 verify graphs are a speculative pass of one attention
  backend on SM120 (no scenario here is speculative; docs/memory.md).
- Warmup activations: chunked-prefill tokens x (hidden x family U(8, 30) x (r_w + (1 - r_w) /
  tp) bytes, r_w family U(0.15, 0.5), + for MoE the
  fused_moe caches, ``ModelFacts.moe_bytes_per_token``, x family U(1.0, 1.5): block padding
  and allocator rounding).
- Other processes: nothing (p=0.6) or U(0.5, 15%) of the GPU, seen by nvidia-smi exactly.

Scenarios: one of 17 models (dense GQA, MoE, MLA MoE), one of six GPU types, the smallest tp
whose weights leave a quarter of the GPU (one step more with p=0.3), SGLang 0.5.10 or 0.5.23;
a scenario is kept when its weights fit at all. Only *feasible* scenarios count (some graph bs
and fraction in [0.30, 0.95] starts, as bench_oom's ``best_fraction`` decides).

Metrics (feasible scenarios): first-attempt ready rate; mean attempts to ready (runs that got
there); runs that never got ready; KV headroom left on the table (bench_oom's: the best
fraction at the final graph bs minus the fraction that came up, for every ready run). The
ledger table: the estimate's error as the ledger fills with 0, 1, 2, 4, 8 earlier runs of the
architecture on the GPU type (mean |estimated - true| of graphs + activations, relative, and
of the feasible fraction's upper edge at the chosen bs).

Where the generator may flatter the estimator (read the figures with this in mind):

- The true weights use the estimator's own sharding formula (times a factor), and the true KV
  cell is exactly the estimator's; a real checkpoint can hold tensors the formula shards
  wrongly, and quantized KV caches or unusual attention variants are not drawn.
- The family draws make siblings err alike by construction: learning from one model of the
  family works exactly as far as that assumption holds on real fleets.
- Memory is deterministic (no fragmentation, no rank that differs), and the observations are
  the simulator's exact figures rounded like the log, never lost lines.
- Speculative decoding and hybrid (Mamba) models are not drawn here; calibration handles them
  (draft and state factors) but this bench does not measure it.
- The MoE activation term of the truth is the estimator's own formula (fused_moe's caches,
  ``ModelFacts.moe_bytes_per_token``) times a factor >= 1; a runner other than Triton's
  (DeepGEMM, FlashInfer/CUTLASS, Marlin for quantized experts) or expert parallelism with
  DeepEP (2-3 GiB of all-to-all buffers) is not drawn.
- The cold prior's fixed 0.5 GiB of graph memory (``Coefficients.graph_fixed_gib``) is not
  taken from the drawn constant above, nor the constant from it: the prior's is SGLang's
  ``reserved_mem`` base (512 MiB, ``server_args.py``), the draw's range comes from the real
  logs and the seeds. They share one assumption only, that part of the graph-phase memory does
  not scale with the model; a fleet where it does would make the prior's fixed part useless.
"""

from __future__ import annotations

import argparse
import math
import random
import statistics
import time
from collections.abc import Sequence
from dataclasses import dataclass, replace
from typing import Any

from bench_oom import Case as OomCase
from bench_oom import best_fraction, pick_tp, policy_decide, step_rule, with_params

from launcher.memory.calibration import (
    Correction,
    KeyedObservation,
    ObservationKey,
    guess_of,
    learn_estimate,
)
from launcher.memory.estimate import Estimate, choose, estimate
from launcher.memory.policy import AttemptRecord, Bounds
from launcher.memory.priors import DEFAULT_COEFFICIENTS, HIDDEN_ONLY_COEFFICIENTS, Coefficients
from launcher.params import LaunchParams
from launcher.sglang.autoargs import (
    FLASHINFER_FAMILY,
    auto_chunked_prefill_size,
    captured_sizes,
    default_attention_backend,
    flashinfer_workspace_bytes,
)
from launcher.sglang.modelfacts import (
    GIB,
    GpuFacts,
    ModelFacts,
    NoEstimate,
    ServerShape,
    WeightFacts,
)
from launcher.sglang.observed import Observed
from launcher.sglang.outcome import Outcome
from launcher.sim.memory import MemoryScenario, StartupTrace, simulate
from launcher.sim.observe import observed

# Targets (docs/benchmarks.md, "The estimator as a contender").
TARGET_COLD = 0.90
TARGET_WARM = 0.98
TARGET_ATTEMPTS = 1.3
TARGET_HEADROOM = 0.05

# (name, config.json fields, checkpoint bytes: model.safetensors.index.json total_size).
# Dimensions from each model's config.json on huggingface.co.
_LLAMA = {"architectures": ["LlamaForCausalLM"], "model_type": "llama", "head_dim": 128,
          "vocab_size": 128256, "torch_dtype": "bfloat16", "num_key_value_heads": 8}
_QWEN3 = {"architectures": ["Qwen3ForCausalLM"], "model_type": "qwen3", "head_dim": 128,
          "vocab_size": 151936, "torch_dtype": "bfloat16", "num_key_value_heads": 8}
_QWEN2 = {"architectures": ["Qwen2ForCausalLM"], "model_type": "qwen2",
          "vocab_size": 152064, "torch_dtype": "bfloat16"}
_MISTRAL = {"architectures": ["MistralForCausalLM"], "model_type": "mistral", "head_dim": 128,
            "torch_dtype": "bfloat16", "num_key_value_heads": 8}
_QWEN3_MOE = {"architectures": ["Qwen3MoeForCausalLM"], "model_type": "qwen3_moe",
              "head_dim": 128, "vocab_size": 151936, "torch_dtype": "bfloat16",
              "num_key_value_heads": 4, "num_experts": 128, "num_experts_per_tok": 8}
MODELS: tuple[tuple[str, dict[str, Any], int], ...] = (
    ("Llama-3.2-3B", {**_LLAMA, "num_hidden_layers": 28, "hidden_size": 3072,
                      "num_attention_heads": 24}, 6_425_499_648),
    ("Llama-3.1-8B", {**_LLAMA, "num_hidden_layers": 32, "hidden_size": 4096,
                      "num_attention_heads": 32}, 16_060_522_496),
    ("Llama-3.1-70B", {**_LLAMA, "num_hidden_layers": 80, "hidden_size": 8192,
                       "num_attention_heads": 64}, 141_107_412_992),
    ("Qwen3-4B", {**_QWEN3, "num_hidden_layers": 36, "hidden_size": 2560,
                  "num_attention_heads": 32}, 8_044_936_192),
    ("Qwen3-8B", {**_QWEN3, "num_hidden_layers": 36, "hidden_size": 4096,
                  "num_attention_heads": 32}, 16_381_470_720),
    ("Qwen3-14B", {**_QWEN3, "num_hidden_layers": 40, "hidden_size": 5120,
                   "num_attention_heads": 40}, 29_536_614_400),
    ("Qwen3-32B", {**_QWEN3, "num_hidden_layers": 64, "hidden_size": 5120,
                   "num_attention_heads": 64}, 65_524_246_528),
    ("Qwen2.5-7B", {**_QWEN2, "num_hidden_layers": 28, "hidden_size": 3584,
                    "num_attention_heads": 28, "num_key_value_heads": 4}, 15_231_233_024),
    ("Qwen2.5-32B", {**_QWEN2, "num_hidden_layers": 64, "hidden_size": 5120,
                     "num_attention_heads": 40, "num_key_value_heads": 8}, 65_527_752_704),
    ("Qwen2.5-72B", {**_QWEN2, "num_hidden_layers": 80, "hidden_size": 8192,
                     "num_attention_heads": 64, "num_key_value_heads": 8}, 145_412_407_296),
    ("Mistral-7B-v0.3", {**_MISTRAL, "num_hidden_layers": 32, "hidden_size": 4096,
                         "num_attention_heads": 32, "vocab_size": 32768}, 14_496_047_104),
    ("Mistral-Small-24B", {**_MISTRAL, "num_hidden_layers": 40, "hidden_size": 5120,
                           "num_attention_heads": 32, "vocab_size": 131072}, 47_144_806_400),
    ("Qwen3-30B-A3B", {**_QWEN3_MOE, "num_hidden_layers": 48, "hidden_size": 2048,
                       "num_attention_heads": 32, "moe_intermediate_size": 768},
     61_064_245_248),
    ("Qwen3-235B-A22B", {**_QWEN3_MOE, "num_hidden_layers": 94, "hidden_size": 4096,
                         "num_attention_heads": 64, "moe_intermediate_size": 1536},
     470_187_269_120),
    ("DeepSeek-V2-Lite", {"architectures": ["DeepseekV2ForCausalLM"],
                          "model_type": "deepseek_v2", "num_hidden_layers": 27,
                          "hidden_size": 2048, "num_attention_heads": 16, "kv_lora_rank": 512,
                          "qk_rope_head_dim": 64, "qk_nope_head_dim": 128, "v_head_dim": 128,
                          "q_lora_rank": None, "n_routed_experts": 64,
                          "num_experts_per_tok": 6, "moe_intermediate_size": 1408,
                          "first_k_dense_replace": 1, "vocab_size": 102400,
                          "torch_dtype": "bfloat16"}, 31_412_357_120),
    ("DeepSeek-V3", {"architectures": ["DeepseekV3ForCausalLM"], "model_type": "deepseek_v3",
                     "num_hidden_layers": 61, "hidden_size": 7168, "num_attention_heads": 128,
                     "kv_lora_rank": 512, "qk_rope_head_dim": 64, "qk_nope_head_dim": 128,
                     "v_head_dim": 128, "q_lora_rank": 1536, "n_routed_experts": 256,
                     "num_experts_per_tok": 8, "moe_intermediate_size": 2048,
                     "first_k_dense_replace": 3, "vocab_size": 129280,
                     "torch_dtype": "bfloat16", "num_nextn_predict_layers": 1,
                     "quantization_config": {"quant_method": "fp8"}}, 688_586_727_753),
    ("Llama-3.2-1B", {**_LLAMA, "num_hidden_layers": 16, "hidden_size": 2048,
                      "num_attention_heads": 32, "head_dim": 64}, 2_471_645_608),
)
# config.json's ``intermediate_size`` (the dense MLP's; huggingface.co, as above)
_INTERMEDIATE = {
    "Llama-3.2-3B": 8192, "Llama-3.1-8B": 14336, "Llama-3.1-70B": 28672, "Qwen3-4B": 9728,
    "Qwen3-8B": 12288, "Qwen3-14B": 17408, "Qwen3-32B": 25600, "Qwen2.5-7B": 18944,
    "Qwen2.5-32B": 27648, "Qwen2.5-72B": 29568, "Mistral-7B-v0.3": 14336,
    "Mistral-Small-24B": 32768, "Qwen3-30B-A3B": 6144, "Qwen3-235B-A22B": 12288,
    "DeepSeek-V2-Lite": 10944, "DeepSeek-V3": 18432, "Llama-3.2-1B": 8192,
}
MODELS = tuple((name, {**config, "intermediate_size": _INTERMEDIATE[name]}, size)
               for name, config, size in MODELS)
# (nvidia-smi name, memory.total in GiB as torch sees it)
GPUS = (
    ("NVIDIA A100-SXM4-40GB", 39.39),
    ("NVIDIA A100-SXM4-80GB", 79.15),
    ("NVIDIA H100 80GB HBM3", 79.19),
    ("NVIDIA H200", 139.81),
    ("NVIDIA L40S", 44.39),
    ("NVIDIA B200", 178.36),
)
VERSIONS = ("0.5.10", "0.5.23")
# --prior: the cold prior the estimator starts from (priors.Coefficients)
PRIORS: dict[str, Coefficients] = {"hidden": HIDDEN_ONLY_COEFFICIENTS,
                                   "source": DEFAULT_COEFFICIENTS}
_prior = ["source"]  # set once by main_estimator
# --truth: the hidden costs' generator (drawn: the ranges below; real: around the real
# start-ups' figures, ``_truth_real``)
_truth_kind = ["drawn"]  # set once by main_estimator
EXPLICIT_BS = (8, 16, 32, 48, 64, 96, 128, 160, 256, 384, 512)


@dataclass(frozen=True)
class Family:
    """The hidden costs every model of one architecture shares on one GPU type."""

    context_gib: float
    context_tp_gib: float
    weights_factor: float
    graph_bytes_per_hidden: float
    graph_fixed_gib: float
    warmup_bytes_per_hidden: float
    moe_factor: float = 1.0  # the fused_moe caches x this (block padding, allocator rounding)
    mla_prefill_gib: float = 0.0  # 0.5.23 MLA prefill graphs (SGLang reserves 1.5 GiB)
    # the shares of the graph / warmup bytes per hidden that every rank holds whole (residual
    # stream, input buffers); the rest is sharded by tp (attention heads, MLP intermediate)
    graph_replicated_share: float = 1.0
    warmup_replicated_share: float = 1.0


def family_of(seed: int, arch: str, gpu: str, moe: bool, mla: bool = False) -> Family:
    rng = random.Random(f"{seed}|{arch}|{gpu}")
    c = rng.uniform(16, 64) * (rng.uniform(1.5, 4.0) if moe else 1.0)
    fixed = rng.uniform(0.1, 2.0)
    fam = Family(rng.uniform(0.4, 1.2), rng.uniform(0.1, 0.6), rng.uniform(0.98, 1.05), c,
                 fixed, rng.uniform(8, 30))
    fam = replace(fam, moe_factor=rng.uniform(1.0, 1.5) if moe else 1.0,
                  mla_prefill_gib=rng.uniform(0.75, 3.0) if mla else 0.0)
    # drawn last, so that every earlier draw (and every tp-1 truth) is what it was before
    return replace(fam, graph_replicated_share=rng.uniform(0.1, 0.4),
                   warmup_replicated_share=rng.uniform(0.15, 0.5))


def _tp_shaped(share: float, tp: int) -> float:
    """The factor a per-hidden cost takes on one rank: its replicated share whole, the rest
    divided by tp."""
    return share + (1.0 - share) / tp


@dataclass(frozen=True)
class Scenario:
    """A server (model, GPU type, tp, version, other processes) and its hidden truth."""

    index: int
    model: str
    facts: ModelFacts
    weight_bytes: int
    gpu: str
    gpu_total_gib: float
    other_gib: float
    tp: int
    version: str
    truth: MemoryScenario
    configured: LaunchParams

    @property
    def key(self) -> ObservationKey:
        return ObservationKey(self.facts.arch, self.gpu, self.version, "")

    def estimate(self) -> Estimate:
        gpus = [GpuFacts(i, self.gpu_total_gib, self.other_gib, self.gpu) for i in range(self.tp)]
        return estimate(self.facts, WeightFacts(self.weight_bytes), gpus,
                        ServerShape(tp=self.tp, sglang_version=self.version),
                        coeffs=PRIORS[_prior[0]])


def _truth(seed: int, facts: ModelFacts, weight_bytes: int, gpu: str, total: float,
           other: float, tp: int, version: str, rng: random.Random) -> MemoryScenario:
    fam = family_of(seed, facts.arch, gpu, facts.num_experts > 0, facts.mla)
    context = fam.context_gib + (fam.context_tp_gib if tp > 1 else 0.0) + rng.uniform(-0.05, 0.05)
    rep = facts.replicated_bytes(tp)
    per_rank = ((weight_bytes - rep) / tp + rep) / GIB
    per_rank *= fam.weights_factor * rng.uniform(0.995, 1.005)
    v = facts.vocab_size
    logits = v * 4 + math.ceil(v / tp) * 2 + (v * 2 if tp > 1 else 0)
    per_token = (facts.hidden_size * fam.graph_bytes_per_hidden
                 * _tp_shaped(fam.graph_replicated_share, tp) + logits) / GIB
    chunk = auto_chunked_prefill_size(total, version)
    warmup = chunk * (facts.hidden_size * fam.warmup_bytes_per_hidden
                      * _tp_shaped(fam.warmup_replicated_share, tp)
                      + facts.moe_bytes_per_token(tp) * fam.moe_factor) / GIB
    new_order = version == "0.5.23"
    n_graphs = len(captured_sizes(256))  # 0.5.10: the fixed part spread over bs-256's graphs
    per_graph = rng.uniform(2, 12) / 1024
    return MemoryScenario(
        gpu_total_gib=total,
        weights_gib=per_rank * tp,
        tp=tp,
        other_used_gib=other,
        context_gib=context,
        kv_gib_per_1k_tokens=facts.kv_bytes_per_token(tp) * 1000 / GIB,
        min_kv_tokens=0,
        graph_gib_per_bs=per_token,
        graph_overhead_gib=per_graph + (0.0 if new_order else fam.graph_fixed_gib / n_graphs),
        warmup_gib=warmup,
        sglang_version=version,
        prefill_graph_gib=fam.graph_fixed_gib + fam.mla_prefill_gib if new_order else 0.0,
        prefill_graph_overhead_gib=8 / 1024 if new_order else 0.0,
        mla=facts.mla,
    )


def _truth_real(seed: int, facts: ModelFacts, weight_bytes: int, gpu: str, total: float,
                other: float, tp: int, version: str, rng: random.Random) -> MemoryScenario:
    """The hidden costs drawn around the real start-ups' figures (``--truth real``;
    tests/fixtures/real_startups through scripts/bench/bench_real.py, docs/memory.md):

    - CUDA context at tp 1: family U(0.84, 1.6) GiB (the cases show 0.84-1.60), + U(0.1, 0.6)
      at tp > 1 (no case), + U(-0.05, 0.05) per scenario.
    - the attention backend's buffers after the pool, for the backend SGLang picks on this GPU
      (``default_attention_backend``): FA3 family U(0.09, 0.10), FlashInfer / trtllm_mha
      U(0.53, 0.58) (+ 0.125 of wider workspace for Qwen2/Qwen3), others U(0.1, 0.6) (no case).
    - decode graphs: the refitted prior's terms (3.05 x the tensors per captured token, 1.49e-7
      x hidden x layers per graph, the fused_moe caches x U(1.0, 1.5)), times a family factor
      U(0.6, 2.0): the range of log / estimate over the real cases' decode passes (0.62 for the
      one bs-512 capture, up to 2.0 for bs-4 ones). The truth has the prior's shape, only its
      level is drawn: this flatters the estimator where the real shape differs.
    - 0.5.23 prefill graphs: 8 MiB per shape, + U(0.75, 3) GiB for MLA (no case).
    - weights and warmup as ``_truth`` (no real warmup figure: no log prints it).
    """
    drawn = _truth(seed, facts, weight_bytes, gpu, total, other, tp, version, rng)
    fam = random.Random(f"{seed}|real|{facts.arch}|{gpu}")
    # Every family draw is taken at any tp, so that the servers of one family share them (a
    # draw taken only at tp > 1 shifted the later ones: a tp-1 server and a tp-2 one of the
    # same architecture on the same GPU type drew another graph level, another fused_moe
    # factor and other buffers, as if of two families, and one's ledger rows misled the
    # other's estimate). The tp > 1 servers keep the draws they had.
    context = fam.uniform(0.84, 1.6)
    context_tp = fam.uniform(0.1, 0.6)
    if tp > 1:
        context += context_tp
    scale = fam.uniform(0.6, 2.0)
    moe = fam.uniform(1.0, 1.5)
    backend = default_attention_backend(gpu, version, mla=facts.mla, arch=facts.arch)
    if backend == "fa3":
        buffers = fam.uniform(0.09, 0.10)
    elif backend in FLASHINFER_FAMILY:
        buffers = fam.uniform(0.53, 0.58) + (flashinfer_workspace_bytes(facts.arch)
                                              - flashinfer_workspace_bytes("")) / GIB
    else:
        buffers = fam.uniform(0.1, 0.6)
    prior = DEFAULT_COEFFICIENTS
    per_token = scale * prior.graph_bytes_scale * facts.graph_bytes_per_token(tp) / GIB
    per_graph = scale * prior.graph_overhead_gib_per_layer_hidden * facts.hidden_size \
        * facts.num_layers
    new_order = version == "0.5.23"
    mla_prefill = fam.uniform(0.75, 3.0) if facts.mla else 0.0
    return replace(
        drawn,
        context_gib=context + rng.uniform(-0.05, 0.05),
        attention_buffers_gib=buffers,
        graph_gib_per_bs=per_token + facts.moe_bytes_per_token(tp) * moe / GIB,
        graph_overhead_gib=per_graph,
        prefill_graph_gib=mla_prefill if new_order else 0.0,
        prefill_graph_overhead_gib=8 / 1024 if new_order else 0.0,
    )


def draw(seed: int, rng: random.Random, index: int, *, model: str | None = None,
         gpu: str | None = None, version: str | None = None) -> Scenario | None:
    """A scenario (None when the model's weights cannot fit this GPU type at tp 8)."""
    name, config, size = next(m for m in MODELS if m[0] == model) if model else rng.choice(MODELS)
    gpu_name, total = next(g for g in GPUS if g[0] == gpu) if gpu else rng.choice(GPUS)
    facts = ModelFacts.from_config(config)
    tp = pick_tp(rng, size / GIB, total)
    if tp is None:
        return None
    other = 0.0 if rng.random() < 0.6 else rng.uniform(0.5, 0.15 * total)
    ver = version or rng.choice(VERSIONS)
    make = _truth_real if _truth_kind[0] == "real" else _truth
    truth = make(seed, facts, size, gpu_name, total, other, tp, ver, rng)
    mfs = None if rng.random() < 0.5 else round(rng.uniform(0.55, 0.95), 2)
    bs = None if rng.random() < 0.5 else rng.choice(EXPLICIT_BS)
    return Scenario(index, name, facts, size, gpu_name, total, other, tp, ver, truth,
                    LaunchParams(mfs, bs))


def sibling(seed: int, rng: random.Random, s: Scenario) -> Scenario:
    """An earlier server of the same architecture on the same GPU type (another model of the
    family when there is one that fits, else this one again at another tp / load)."""
    names = [m[0] for m in MODELS if m[1]["architectures"][0] == s.facts.arch]
    others = [n for n in names if n != s.model]
    rng.shuffle(others)
    for name in [*others, s.model]:
        sib = draw(seed, rng, -1, model=name, gpu=s.gpu, version=s.version)
        if sib is not None:
            return sib
    raise AssertionError("the scenario's own model fits")


# --- runs ------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Attempt:
    params: LaunchParams
    outcome: Outcome
    trace: StartupTrace


def observed_costs(trace: StartupTrace) -> Observed:
    """What ``LogFollower`` reads from the log of ``trace`` (launcher.sglang.observed), as the
    simulated server prints it (GiB to 2 decimals)."""
    def r(x: float | None) -> float | None:
        return None if x is None else round(x, 2)

    pre, post = trace.pre_load_free_gib, trace.post_weights_free_gib
    fail = trace.failure
    warmup_oom = fail is not None and trace.graph_end_free_gib is not None
    return Observed(
        weights_gib=r(pre - post) if post is not None else None,
        pre_load_avail_gib=r(pre),
        post_weights_avail_gib=r(post),
        kv_tokens=trace.kv_tokens if trace.kv_pool_gib and trace.kv_pool_gib > 0 else None,
        kv_pool_gib=r(trace.kv_pool_gib) if trace.kv_pool_gib and trace.kv_pool_gib > 0 else None,
        graph_mem_gib={p.name: round(p.mem_gib, 2) for p in trace.passes
                       if p.mem_gib is not None},
        attention_buffers_gib=(r(trace.pool_end_free_gib - trace.passes[0].begin_free_gib)
                               if trace.passes and trace.pool_end_free_gib is not None
                               else None),
        graph_max_bs=trace.cuda_graph_max_bs,
        ready_avail_gib=r(trace.graph_end_free_gib),
        mem_fraction_static=round(trace.mem_fraction_static, 3),
        tried_gib=r(fail.tried_gib) if warmup_oom and fail is not None else None,
        free_gib=r(fail.free_gib) if warmup_oom and fail is not None else None,
    )


def first_params(s: Scenario, contender: str,
                 ledger: Sequence[KeyedObservation]) -> tuple[LaunchParams, Correction | None]:
    if contender in ("configured", "seeds-0.10"):
        return s.configured, None
    e = s.estimate()
    correction = None
    margin = None
    if contender == "estimate-warm":
        e, correction = learn_estimate(ledger, s.key, e)
        margin = correction.margin
    choice = choose(e, LaunchParams()) if margin is None else choose(e, LaunchParams(),
                                                                      margin=margin)
    return choice.params, correction


def run(s: Scenario, contender: str, bounds: Bounds,
        ledger: Sequence[KeyedObservation] = ()) -> list[Attempt]:
    """The contender's attempts until ready, it stops, or the cap."""
    params: LaunchParams | None = first_params(s, contender, ledger)[0]
    case = OomCase(s.index, s.truth, s.configured if contender in (
        "configured", "seeds-0.10") else params or s.configured)
    decide = step_rule(0.10, halve_bs=True) if contender == "seeds-0.10" else policy_decide
    history: list[AttemptRecord] = []
    attempts: list[Attempt] = []
    while params is not None:
        scenario = with_params(s.truth, params)
        trace = simulate(scenario, params)
        outcome, phase, numbers = observed(scenario, trace)
        history.append(AttemptRecord(params, outcome, phase, numbers))
        attempts.append(Attempt(params, outcome, trace))
        if outcome is Outcome.READY or len(history) >= bounds.max_attempts:
            break
        params = decide(case, bounds, history)
    return attempts


def record(s: Scenario, attempts: Sequence[Attempt]) -> list[KeyedObservation]:
    """The ledger rows of a run, as LedgerRecorder files them: the log's figures and the
    *uncorrected* estimate's guess at each attempt's graph bs."""
    e = s.estimate()
    rows = []
    for a in attempts:
        _, bs = s.truth.resolve(a.params)
        rows.append(KeyedObservation(s.key, observed_costs(a.trace), guess_of(e, bs),
                                     a.outcome.value))
    return rows


def history_of(seed: int, rng: random.Random, s: Scenario, n: int,
               bounds: Bounds) -> list[KeyedObservation]:
    """The ledger after ``n`` earlier runs (cold estimator, then the policy) of siblings."""
    ledger: list[KeyedObservation] = []
    for _ in range(n):
        sib = sibling(seed, rng, s)
        ledger += record(sib, run(sib, "estimate-warm" if ledger else "estimate-cold",
                                  bounds, ledger))
    return ledger


# --- truth and scores ------------------------------------------------------------------------


def feasible(s: Scenario, bounds: Bounds) -> bool:
    if s.truth.weights_fail():
        return False
    return best_fraction(s.truth, 1, bounds) is not None


@dataclass(frozen=True)
class Score:
    first_ready: bool
    ready: bool
    attempts: int
    headroom: float | None


def score(s: Scenario, attempts: Sequence[Attempt], bounds: Bounds) -> Score:
    last = attempts[-1]
    ready = last.outcome is Outcome.READY
    headroom = None
    if ready:
        mfs, bs = s.truth.resolve(last.params)
        best = best_fraction(with_params(s.truth, last.params), bs, bounds)
        headroom = max(0.0, (best / 1000 if best is not None else mfs) - mfs)
    return Score(attempts[0].outcome is Outcome.READY, ready, len(attempts), headroom)


def _fmt(values: Sequence[float], digits: int = 3) -> str:
    if not values:
        return "-"
    ordered = sorted(values)
    p95 = ordered[max(0, math.ceil(0.95 * len(ordered)) - 1)]
    return f"{statistics.fmean(values):.{digits}f} / {p95:.{digits}f}"


def _pct(part: int, whole: int) -> str:
    return "-" if whole == 0 else f"{100 * part / whole:.1f}% ({part}/{whole})"


CONTENDERS = ("configured", "seeds-0.10", "estimate-cold", "estimate-warm")


def bench(args: argparse.Namespace) -> list[str]:
    bounds = Bounds(0.30, args.ceiling, 1, args.max_attempts)
    rng = random.Random(f"{args.seed}-estimator")
    scenarios: list[Scenario] = []
    while len(scenarios) < args.n:
        s = draw(args.seed, rng, len(scenarios))
        if s is not None:
            scenarios.append(s)
    kept = [s for s in scenarios if feasible(s, bounds)]
    scores: dict[str, list[Score]] = {c: [] for c in CONTENDERS}
    misses: list[str] = []
    for s in kept:
        warm = history_of(args.seed, random.Random(f"{args.seed}-warm-{s.index}"), s, 1, bounds)
        for contender in CONTENDERS:
            attempts = run(s, contender, bounds, warm if contender == "estimate-warm" else ())
            sc = score(s, attempts, bounds)
            scores[contender].append(sc)
            if contender.startswith("estimate") and not sc.first_ready and len(misses) < args.show:
                misses.append(f"{contender}: {s.model} on {s.gpu} tp{s.tp} SGLang {s.version}: "
                              f"{attempts[0].params.describe()} -> {attempts[0].outcome.value}")
    lines = [
        f"Estimator benchmark: {len(scenarios)} scenarios, {len(kept)} feasible "
        f"(fraction in [{bounds.mem_fraction_floor:.2f}, {bounds.mem_fraction_ceiling:.2f}]), "
        f"seed {args.seed}, max_attempts {bounds.max_attempts}, prior {_prior[0]}, "
        f"truth {_truth_kind[0]}",
        "",
        "| contender | first attempt ready | mean attempts to ready | never ready | "
        "KV headroom left mean / p95 |",
        "|---|---|---|---|---|",
    ]
    for contender in CONTENDERS:
        sc = scores[contender]
        ready = [x for x in sc if x.ready]
        lines.append(
            f"| {contender} | {_pct(sum(x.first_ready for x in sc), len(sc))} | "
            f"{statistics.fmean(x.attempts for x in ready):.2f} | "
            f"{_pct(len(sc) - len(ready), len(sc))} | "
            f"{_fmt([x.headroom for x in ready if x.headroom is not None])} |"
            if ready else f"| {contender} | - | - | - | - |"
        )
    lines += ["", *learning_curve(args, kept, bounds)]
    lines += ["", "targets: first attempt ready >= 90% cold, >= 98% warm; mean attempts <= 1.3; "
              "headroom mean <= 0.05"]
    if misses:
        lines += ["", "first attempts of the estimator that failed:", *misses]
    return lines


def learning_curve(args: argparse.Namespace, kept: Sequence[Scenario],
                   bounds: Bounds) -> list[str]:
    """The estimate's error as the ledger fills (the first ``--curve`` feasible scenarios)."""
    lines = [
        "| earlier runs of the family in the ledger | graphs + activations error mean / p95 | "
        "fraction edge error mean / p95 | first attempt ready |",
        "|---|---|---|---|",
    ]
    sample = list(kept[: args.curve])
    for n in (0, 1, 2, 4, 8):
        need_err: list[float] = []
        edge_err: list[float] = []
        first_ready = 0
        for s in sample:
            ledger = history_of(args.seed, random.Random(f"{args.seed}-curve-{s.index}"), s, n,
                                bounds)
            e, correction = learn_estimate(ledger, s.key, s.estimate())
            choice = choose(e, LaunchParams(), margin=correction.margin)
            _, bs = s.truth.resolve(choice.params)
            t = s.truth
            true_need = t.attention_buffers_gib + t.graph_total_gib(bs) + t.warmup_gib
            need_err.append(abs(e.graphs_gib(bs) + e.activations_gib() - true_need) / true_need)
            est_range, true_range = e.feasible_range(bs), t.feasible_range(bs)
            if est_range is not None and true_range is not None:
                edge_err.append(abs(est_range[1] - true_range[1]))
            trace = simulate(with_params(t, choice.params), choice.params)
            first_ready += trace.ok
        lines.append(f"| {n} | {_fmt(need_err)} | {_fmt(edge_err, 4)} | "
                     f"{_pct(first_ready, len(sample))} |")
    return lines


def main_estimator(args: argparse.Namespace) -> int:
    began = time.perf_counter()
    _prior[0] = args.prior
    _truth_kind[0] = args.truth
    try:
        print("\n".join(bench(args)))
    except NoEstimate as exc:  # a catalogue entry the estimator cannot read: a bench bug
        print(f"bench_estimator: {exc}")
        return 1
    print(f"\n({time.perf_counter() - began:.1f} s)")
    return 0


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """The flags ``bench_oom.py --estimator`` takes besides its own --n/--seed/..."""
    parser.add_argument("--curve", type=int, default=100,
                        help="with --estimator: scenarios in the learning-curve table (100)")
    parser.add_argument("--prior", choices=sorted(PRIORS), default="source",
                        help="with --estimator: the cold prior (source: the default, "
                        "priors.DEFAULT_COEFFICIENTS; hidden: the earlier hidden-only "
                        "priors.HIDDEN_ONLY_COEFFICIENTS)")
    parser.add_argument("--truth", choices=("drawn", "real"), default="drawn",
                        help="with --estimator: the hidden costs (drawn: the ranges of the module "
                        "docstring; real: around the real start-ups' figures, _truth_real)")


if __name__ == "__main__":
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0] if __doc__ else None)
    p.add_argument("--n", type=int, default=300)
    p.add_argument("--seed", type=int, default=1)
    p.add_argument("--max-attempts", type=int, default=8)
    p.add_argument("--ceiling", type=float, default=0.95)
    p.add_argument("--show", type=int, default=0)
    add_arguments(p)
    raise SystemExit(main_estimator(p.parse_args()))

