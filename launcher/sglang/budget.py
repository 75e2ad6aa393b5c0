"""The memory budget of one SGLang server, computed before launch. Pure: no I/O.

From facts launcher can read on a host before starting anything (the model's ``config.json``,
its weight bytes, the draft's config, the GPUs' totals and what other processes hold) and the
SGLang version's rules, it computes per GPU what a start-up allocates, and chooses the first
attempt's ``--mem-fraction-static`` / graph batch size with a stated margin.

Public API (stable; ``fleetlearn`` builds on it)::

    facts:     ModelFacts.from_config(config: Mapping) -> ModelFacts      (raises NoEstimate)
               weight_bytes_from_index(index: Mapping) -> int             (raises NoEstimate)
               weight_bytes_from_header(header: Mapping) -> int           (raises NoEstimate)
               GpuFacts(index, total_gib, other_used_gib)
    shape:     ServerShape(tp, sglang_version, kv_cache_dtype, ..., spec: SpecShape | None)
    learned:   Coefficients (the uncertain costs; defaults are the cold prior;
               ``fleetlearn`` replaces them per architecture/GPU/version/spec)
    estimate:  estimate(model, weights, gpus, shape, draft=None, draft_weights=None,
                        coeffs=DEFAULT_COEFFICIENTS) -> Estimate
               Estimate.at(mfs, bs) -> Budget          (per-GPU figures of one setting)
               Estimate.feasible_range(bs) -> (low, high) | None
    choice:    choose(estimate, configured: LaunchParams, margin=DEFAULT_MARGIN) -> Choice
    pictures:  Budget.gpus -> list[GpuBar]; GpuBar.as_dict() gives the ``memory`` JSON keys
               (total_gib, weights_gib, kv_gib, graphs_gib, activations_gib, other_gib, free_gib)
               observed_bar(numbers: Numbers, phase: str) -> Observed | None   (a failed log)
    shared:    mamba_slot_ratio(strategy, overlap), mamba_cache_slots(budget, per_req, D, ratio)
               (0.5.23's state-slot rules), ModelFacts.kv_bytes_per_token / replicated_bytes,
               HybridFacts.per_req_bytes, draft_kv_bytes_per_token(...): the simulator's
               hidden costs come from these same rules (launcher.sim.server.scenario_for)

Host side: ``launcher.host.facts.read_facts`` reads the facts over a Transport;
``launcher.plan.first_attempt.plan_first_attempt(..., coeffs=...)`` applies the ledger-first rule.

All sizes are GiB (SGLang's "GB" in its logs is GiB) unless a name says bytes; all per-rank
figures are for one GPU of the server. The formulas and where each comes from in SGLang's source
(``sglang/srt/...`` of 0.5.10 and 0.5.23; docs/memory.md has the table):

- pre-load free memory ``pre`` = min over the server's GPUs of (total - other processes) - the
  CUDA context/NCCL buffers (``Coefficients.context_gib``). SGLang measures it after
  distributed init and takes the minimum over ranks (0.5.10
  ``model_runner_kv_cache_mixin.profile_max_num_token``'s ``pre_model_load_memory``; 0.5.23
  ``KVCacheConfigurator._profile_available_bytes``).
- KV pool = free after weights - ``pre`` x (1 - mfs); the headroom left for graphs and
  activations is exactly ``pre`` x (1 - mfs) (same functions).
- KV bytes per token: MHA/GQA ``max(1, kv_heads // tp) x (head_dim + v_head_dim) x layers x
  dtype`` (``pool_configurator.DefaultPoolConfigurator._compute_cell_size``,
  ``model_config.get_num_kv_heads``); MLA ``(kv_lora_rank + qk_rope_head_dim) x layers x dtype``,
  not sharded by tp (``kv_cache_configurator.calculate_mla_kv_cache_dim``); hybrid models count
  only their full-attention layers. 0.5.23 adds the EAGLE draft's per-token bytes to the cell
  (``draft_kv = cell x draft_layers / layers``); up to 0.5.15 the draft's pool (same #tokens) is
  taken from the headroom after the target's graphs.
- hybrid state per request: ``(conv_dim/tp x (conv_kernel - 1) x conv_dtype + heads/tp x
  head_dim x state x ssm_dtype) x linear_layers`` with ``conv_dim = intermediate + 2 x groups x
  state`` (``configs/mamba_utils.Mamba2StateShape.create``, ``mamba_cache_per_req``); the state
  cache takes ``rest x r/(1+r)`` (``--mamba-full-memory-ratio`` r = 0.9) before the KV pool.
- weights per rank: ``(total - replicated)/tp + replicated``; replicated are MLA's low-rank
  ``q_a``/``kv_a`` projections (``ReplicatedLinear`` in ``models/deepseek_v2.py``), the MoE
  router, and K/V projections when ``kv_heads < tp``.
- graph batch sizes and the auto fraction: :mod:`launcher.sglang.autoargs`.
- MoE layers' transient memory per token, ``topk x (3 moe_intermediate/tp + hidden) x 2``
  bytes (the Triton runner's ``intermediate_cache1/2/3``,
  ``layers/moe/moe_runner/triton_utils/fused_moe.py``), in the warmup chunk and the top decode
  graph: :meth:`ModelFacts.moe_bytes_per_token`.
- up to 0.5.15 with a draft: the draft's pool (as many tokens as the target's) comes out of the
  headroom, so the highest fraction solves ``need + (pre x - w) r <= pre (1 - x)``.
- CUDA graphs (a fixed 0.5 GiB of attention-backend buffers, as SGLang's own ``reserved_mem``
  base, + the activation pool of the largest captured batch + a per-graph cost), prefill
  graphs (0.5.23: 8 MiB per shape, 1.5 GiB for MLA: ``memory_hook.reserve_for_graph_mb``) and
  warmup activations are not computable from the config; :class:`Coefficients` holds their
  prior, which the ledger's observations correct.
- the tensors behind the per-token graph and warmup costs, per rank (replicated + sharded / tp):
  :meth:`ModelFacts.graph_bytes_per_token`, :meth:`ModelFacts.prefill_bytes_per_token`;
  the default prior (:data:`DEFAULT_COEFFICIENTS`, also :data:`SOURCE_SHAPED_COEFFICIENTS`)
  prices them; :data:`HIDDEN_ONLY_COEFFICIENTS` is the earlier hidden-only prior, kept for the
  benchmark's comparison.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, replace
from typing import Any

from launcher.params import LaunchParams
from launcher.sglang.autoargs import (
    SPEC_DEFAULT_MAX_RUNNING_REQUESTS,
    auto_chunked_prefill_size,
    auto_cuda_graph_max_bs,
    auto_mem_fraction_static,
    capture_bs_list,
    captured_sizes,
    prefill_graph_tokens,
)
from launcher.sglang.outcome import Numbers
from launcher.sglang.versions import (
    AUTO_TABLE_2_FROM,
    DEFAULT_VERSION,
    ONE_STATIC_BUDGET_FROM,
    at_least,
)
from launcher.untrusted import finite_number

__all__ = [
    "DEFAULT_COEFFICIENTS",
    "DEFAULT_MARGIN",
    "DEFAULT_MIN_KV_TOKENS",
    "GIB",
    "HIDDEN_ONLY_COEFFICIENTS",
    "KV_SHARE",
    "SOURCE_SHAPED_COEFFICIENTS",
    "Budget",
    "Choice",
    "Coefficients",
    "Estimate",
    "GpuBar",
    "GpuFacts",
    "HybridFacts",
    "ModelFacts",
    "NoEstimate",
    "Observed",
    "ServerShape",
    "SpecShape",
    "WeightFacts",
    "choose",
    "draft_kv_bytes_per_token",
    "dtype_bytes",
    "estimate",
    "mamba_cache_slots",
    "mamba_slot_ratio",
    "observed_bar",
    "weight_bytes_from_header",
    "weight_bytes_from_index",
]

GIB = 1 << 30
MIB = 1 << 20

# Below this many KV tokens launcher calls a pool too small to serve (SGLang itself only refuses
# a pool <= 0; a pool smaller than one long request is useless in practice).
DEFAULT_MIN_KV_TOKENS = 4096
# The first attempt keeps this share of the estimated graph + activation memory spare.
DEFAULT_MARGIN = 0.15
# ... and at least this much (GiB), for small models whose estimate is tiny.
MIN_MARGIN_GIB = 0.25
# An unset graph bs is lowered until the KV pool gets at least this share of what weights leave.
KV_SHARE = 0.5

_DTYPE_BYTES = {
    "float32": 4, "fp32": 4, "float": 4,
    "bfloat16": 2, "bf16": 2, "float16": 2, "fp16": 2, "half": 2,
    "fp8_e4m3": 1, "fp8_e5m2": 1, "float8_e4m3fn": 1, "float8_e5m2": 1, "fp8": 1, "mxfp8": 1,
    "int8": 1, "fp4_e2m1": 1,
}


class NoEstimate(ValueError):
    """The facts do not allow an estimate; ``str()`` is "no estimate: <why>"."""

    def __init__(self, why: str) -> None:
        super().__init__(f"no estimate: {why}")
        self.why = why


def dtype_bytes(name: str | None, default: int = 2) -> int:
    """Bytes per element of a torch/HF dtype name ("bfloat16", "torch.float8_e4m3fn", "fp8")."""
    if not name:
        return default
    key = name.lower().removeprefix("torch.")
    return _DTYPE_BYTES.get(key, default)


# --- facts ------------------------------------------------------------------------------------


@dataclass(frozen=True)
class GpuFacts:
    """One GPU of the server as nvidia-smi shows it: its total and what others already hold."""

    index: int
    total_gib: float
    other_used_gib: float = 0.0
    name: str = ""


@dataclass(frozen=True)
class WeightFacts:
    """The checkpoint's weight bytes and where the figure came from
    (``index``: model.safetensors.index.json ``metadata.total_size``; ``headers``: the
    safetensors headers' tensor sizes; ``files``: the .safetensors file sizes)."""

    total_bytes: int
    source: str = "index"

    @property
    def total_gib(self) -> float:
        return self.total_bytes / GIB


@dataclass(frozen=True)
class HybridFacts:
    """The Mamba / linear-attention state of a hybrid model (whole model, before tp).

    ``conv_dim``: channels of the conv state (``intermediate + 2 x groups x state``);
    ``num_heads x head_dim x state_size``: the SSM (temporal) state per layer."""

    linear_layers: int
    conv_dim: int
    conv_kernel: int
    num_heads: int
    head_dim: int
    state_size: int
    n_groups: int
    intermediate: int
    ssm_dtype_bytes: int = 4  # float32 unless config.mamba_ssm_dtype says otherwise
    conv_dtype_bytes: int = 2  # bfloat16 (SGLANG_MAMBA_CONV_DTYPE)

    def per_req_bytes(self, tp: int) -> tuple[int, int]:
        """(conv, ssm) bytes of one request's state on one rank
        (``Mamba2StateShape.create`` + ``mamba_cache_per_req``)."""
        groups = self.n_groups
        if groups % tp:
            groups += tp - groups  # extra_groups_for_head_shards (as SGLang writes it)
        conv_dim = self.intermediate + 2 * groups * self.state_size
        conv = conv_dim // tp * (self.conv_kernel - 1) * self.conv_dtype_bytes
        ssm = self.num_heads // tp * self.head_dim * self.state_size * self.ssm_dtype_bytes
        return conv * self.linear_layers, ssm * self.linear_layers


CONFIG_MAX = 2**40  # bound of a config.json figure (layers, sizes, heads)
WEIGHT_BYTES_MAX = 2**50  # bound of a model's weight bytes (1 PiB; 1T params in BF16 is 2 TB)


def _int(cfg: Mapping[str, Any], *keys: str, default: int | None = None) -> int:
    """The first of ``keys`` that holds a non-negative number, as an int. NoEstimate when
    none does and there is no default, or when one is not finite or above CONFIG_MAX (JSON
    reads ``1e400`` as ``inf``, and no model dimension comes near 2**40)."""
    for k in keys:
        v = cfg.get(k)
        if isinstance(v, bool) or not isinstance(v, (int, float)) or v < 0:
            continue
        number = finite_number(v, limit=CONFIG_MAX)
        if number is None:
            raise NoEstimate(f"config.json's {k} = {str(v)[:40]} is not a finite number "
                             f"of at most 2**40: fix the model's config.json")
        return number
    if default is None:
        raise NoEstimate(f"config.json has no {keys[0]}")
    return default


@dataclass(frozen=True)
class ModelFacts:
    """What the estimate needs from a model's ``config.json`` (the text config of a VLM)."""

    arch: str
    model_type: str
    num_layers: int
    hidden_size: int
    vocab_size: int
    num_attention_heads: int
    num_kv_heads: int
    head_dim: int
    v_head_dim: int
    dtype_bytes: int = 2
    mla: bool = False
    kv_lora_rank: int = 0
    qk_rope_head_dim: int = 0
    q_lora_rank: int = 0
    qk_nope_head_dim: int = 0
    full_attention_layers: int | None = None  # hybrid: layers with a KV cache
    hybrid: HybridFacts | None = None
    num_experts: int = 0  # routed experts (0: dense)
    moe_layers: int = 0
    experts_per_token: int = 0  # num_experts_per_tok (topk of the router)
    moe_intermediate_size: int = 0  # one expert's intermediate size
    intermediate_size: int = 0  # the dense MLP's (config.json's; 4 x hidden without one)
    nextn_layers: int = 0  # MTP layers shipped in the checkpoint (NEXTN/EAGLE draft)
    max_position_embeddings: int = 4096
    quantization: str | None = None  # quantization_config.quant_method

    @property
    def kv_layers(self) -> int:
        return self.num_layers if self.full_attention_layers is None else self.full_attention_layers

    @classmethod
    def from_config(cls, config: Mapping[str, Any]) -> ModelFacts:
        """Parse an HF ``config.json``. Raises :class:`NoEstimate` naming the missing key."""
        if not isinstance(config, Mapping):
            raise NoEstimate("config.json is not a JSON object")
        archs = config.get("architectures") or []
        arch = str(archs[0]) if isinstance(archs, list) and archs else ""
        text = config.get("text_config")
        cfg: dict[str, Any] = dict(config)
        if isinstance(text, Mapping):
            cfg.update({k: v for k, v in text.items() if v is not None})
        layers = _int(cfg, "num_hidden_layers", "n_layer", "num_layers")
        hidden = _int(cfg, "hidden_size", "d_model", "n_embd")
        heads = _int(cfg, "num_attention_heads", "n_head", default=max(1, hidden // 128))
        kv_heads = _int(cfg, "num_key_value_heads", "num_kv_heads", default=heads)
        head_dim = _int(cfg, "head_dim", default=hidden // max(heads, 1))
        v_head_dim = _int(cfg, "v_head_dim", default=head_dim)
        kv_lora = _int(cfg, "kv_lora_rank", default=0)
        rope = _int(cfg, "qk_rope_head_dim", default=0)
        mla = kv_lora > 0
        dtype = cfg.get("torch_dtype") or cfg.get("dtype")
        quant = cfg.get("quantization_config")
        quant_method = None
        if isinstance(quant, Mapping):
            quant_method = str(quant.get("quant_method") or quant.get("quant_algo") or "") or None
        experts = _int(cfg, "n_routed_experts", "num_experts", "num_local_experts", default=0)
        first_dense = _int(cfg, "first_k_dense_replace", default=0)
        full_layers, hybrid = _hybrid_facts(cfg, layers)
        return cls(
            arch=arch,
            model_type=str(cfg.get("model_type", "")),
            num_layers=layers,
            hidden_size=hidden,
            vocab_size=_int(cfg, "vocab_size", default=32000),
            num_attention_heads=heads,
            num_kv_heads=max(1, kv_heads),
            head_dim=head_dim,
            v_head_dim=v_head_dim,
            dtype_bytes=dtype_bytes(str(dtype) if dtype else None),
            mla=mla,
            kv_lora_rank=kv_lora,
            qk_rope_head_dim=rope,
            q_lora_rank=_int(cfg, "q_lora_rank", default=0),
            qk_nope_head_dim=_int(cfg, "qk_nope_head_dim", default=0),
            full_attention_layers=full_layers,
            hybrid=hybrid,
            num_experts=experts,
            moe_layers=max(0, layers - first_dense) if experts else 0,
            experts_per_token=_int(cfg, "num_experts_per_tok", "moe_topk", "top_k",
                                   default=0) if experts else 0,
            moe_intermediate_size=_int(cfg, "moe_intermediate_size",
                                       default=0) if experts else 0,
            intermediate_size=_int(cfg, "intermediate_size", "ffn_hidden_size",
                                   default=4 * hidden),
            nextn_layers=_int(cfg, "num_nextn_predict_layers", "mtp_num_hidden_layers", default=0),
            max_position_embeddings=_int(cfg, "max_position_embeddings", default=4096),
            quantization=quant_method,
        )

    def kv_bytes_per_token(self, tp: int, kv_dtype_bytes: int | None = None) -> int:
        """One rank's KV bytes per token (``_compute_cell_size``): MLA is not sharded by tp."""
        b = self.dtype_bytes if kv_dtype_bytes is None else kv_dtype_bytes
        if self.mla:
            return (self.kv_lora_rank + self.qk_rope_head_dim) * self.kv_layers * b
        n = max(1, self.num_kv_heads // tp)
        return n * (self.head_dim + self.v_head_dim) * self.kv_layers * b

    def moe_bytes_per_token(self, tp: int) -> int:
        """One rank's transient bytes per token of a routed-MoE layer (0 for a dense model).

        SGLang's Triton MoE runner (``layers/moe/moe_runner/triton_utils/fused_moe.py``, the
        default for tp without expert parallelism) allocates per call, per token and routed
        expert, ``intermediate_cache1`` (``N = w1.shape[1]`` = 2 x moe_intermediate / tp, the
        fused gate/up projection), ``intermediate_cache2`` (N / 2, after the activation) and
        ``intermediate_cache3`` (hidden), in the activation dtype (bf16); all three live until
        the call returns. This scales with ``num_experts_per_tok x moe_intermediate_size``,
        not with ``hidden_size``, so a hidden-only activation prior misses it."""
        if not self.num_experts or not self.experts_per_token or not self.moe_intermediate_size:
            return 0
        n = 2 * self.moe_intermediate_size // max(1, tp)
        return self.experts_per_token * (n + n // 2 + self.hidden_size) * 2

    def layer_transient_bytes(self, tp: int) -> int:
        """One rank's bytes per token of one decoder layer's transient tensors (activation
        dtype): the larger of the attention block's (the ``QKVParallelLinear`` output, ``q +
        2 kv`` heads, and the attention output, ``q`` heads; ``heads // tp`` query and
        ``max(1, kv_heads // tp)`` KV heads of ``head_dim`` on a rank) and the dense MLP's
        (``MergedColumnParallelLinear`` gate_up, ``2 x intermediate / tp``, and ``SiluAndMul``'s
        output, ``intermediate / tp``: ``models/llama.py``, ``models/qwen2.py``,
        ``layers/linear.py``). The two are not live at once (the attention's are freed after
        ``o_proj``). A model whose every layer is routed MoE has no dense MLP here (its experts'
        caches are :meth:`moe_bytes_per_token`). All of it is sharded by tp but MLA's low-rank
        ``fused_qkv_a_proj_with_mqa`` output (``q_lora_rank + kv_lora_rank + rope``, replicated).
        MLA's attention is the absorbed path's (``deepseek_common/attention_forward_methods/
        forward_mla.py``), per head on a rank: the ``q_b_proj`` output (``qk_nope + rope``),
        the latent query (``q_nope_out``, ``kv_lora_rank``, and ``q_pe``, rope), the latent
        attention output (``kv_lora_rank``) and ``attn_bmm_output`` (``v_head_dim``); the
        prefill's MHA path is smaller."""
        a = self.dtype_bytes
        q = max(1, self.num_attention_heads // tp)
        kv = max(1, self.num_kv_heads // tp)
        if self.mla:
            rope, lora = self.qk_rope_head_dim, self.kv_lora_rank
            per_head = (self.qk_nope_head_dim + rope) + (lora + rope) + lora + self.v_head_dim
            attn = a * (q * per_head + self.q_lora_rank + lora + rope)
        else:
            attn = a * self.head_dim * (2 * q + 2 * kv)
        dense = self.intermediate_size if (not self.num_experts
                                           or self.moe_layers < self.num_layers) else 0
        mlp = 3 * a * (dense // tp)
        return max(attn, mlp)

    def graph_bytes_per_token(self, tp: int) -> int:
        """One rank's bytes per captured token of a decode graph (the top graph's tokens), as
        SGLang's source lays them out; the prior multiplies it
        (:attr:`Coefficients.graph_bytes_scale`).

        Replicated (whole on every rank): the runner's input buffers, allocated for the largest
        graph before capture (``DecodeInputBuffers.create``: 0.5.10 ``cuda_graph_runner.py``,
        0.5.23 ``input_buffers.py``): ``input_ids``, ``positions``, ``out_cache_loc`` (int64),
        ``mrope_positions`` (3 x int64), ``input_embeds`` (hidden) and
        ``next_token_logits_buffer`` (the whole vocab in fp32: the logits are gathered before
        they are copied in, ``logits_processor._copy_logits_to_buffer``); in the graph pool the
        residual stream (``residual``, the normed hidden states, the ``RowParallelLinear``
        output and its all-reduce: 4 x hidden); at tp > 1 the all-gathered logits (the whole
        vocab, activation dtype, ``tensor_model_parallel_all_gather``).
        Sharded (1/tp on a rank): one layer's transient tensors
        (:meth:`layer_transient_bytes`) and the ``lm_head`` output (``ParallelLMHead``:
        vocab / tp). An upper bound on the pool's peak: the allocator may reuse the layer's
        blocks for the logits."""
        a, h, v = self.dtype_bytes, self.hidden_size, self.vocab_size
        replicated = 3 * 8 + 3 * 8 + a * h + 4 * v + 4 * a * h + (a * v if tp > 1 else 0)
        sharded = self.layer_transient_bytes(tp) + a * math.ceil(v / tp)
        return replicated + sharded

    def prefill_bytes_per_token(self, tp: int) -> int:
        """One rank's bytes per token of a prefill (warmup) forward's activations: the residual
        stream (4 x hidden, replicated) and one layer's transient tensors (sharded,
        :meth:`layer_transient_bytes`). Logits are computed for each request's last token
        only, so they do not grow with the chunk."""
        return 4 * self.dtype_bytes * self.hidden_size + self.layer_transient_bytes(tp)

    def replicated_bytes(self, tp: int) -> int:
        """Bytes each rank holds whole rather than 1/tp of (bf16 figures)."""
        if tp <= 1:
            return 0
        out = 0
        if self.mla:
            # fused_qkv_a_proj_with_mqa: hidden -> q_lora_rank + kv_lora_rank + rope (replicated)
            out += self.num_layers * self.hidden_size * (
                self.q_lora_rank + self.kv_lora_rank + self.qk_rope_head_dim
            ) * 2
        elif self.num_kv_heads < tp:
            # each rank keeps one whole KV head instead of kv_heads/tp of them
            share = 1 - self.num_kv_heads / tp
            out += int(self.kv_layers * self.hidden_size * self.head_dim * 2 * 2 * share)
        if self.num_experts:
            out += self.moe_layers * self.hidden_size * self.num_experts * 2  # router gate
        return out


def _hybrid_facts(cfg: Mapping[str, Any], layers: int) -> tuple[int | None, HybridFacts | None]:
    """(full-attention layers, linear state) of a hybrid model, or (None, None)."""
    ssm_bytes = dtype_bytes(str(cfg.get("mamba_ssm_dtype") or "float32"), 4)
    types = cfg.get("layer_types")
    interval = cfg.get("full_attention_interval")
    if "linear_num_value_heads" in cfg:  # Qwen3-Next / Qwen3.5 Gated DeltaNet
        if isinstance(types, list) and types:
            full = sum(1 for t in types if t == "full_attention")
        elif isinstance(interval, int) and interval > 0:
            full = layers // interval  # layers i with (i + 1) % interval == 0
        else:
            raise NoEstimate(
                "hybrid config.json has neither layer_types nor full_attention_interval")
        v_heads = _int(cfg, "linear_num_value_heads")
        k_heads = _int(cfg, "linear_num_key_heads")
        v_dim = _int(cfg, "linear_value_head_dim")
        k_dim = _int(cfg, "linear_key_head_dim")
        kernel = _int(cfg, "linear_conv_kernel_dim", default=4)
        return full, HybridFacts(
            linear_layers=layers - full,
            conv_dim=v_heads * v_dim + 2 * k_heads * k_dim,
            conv_kernel=kernel,
            num_heads=v_heads,
            head_dim=v_dim,
            state_size=k_dim,
            n_groups=k_heads,
            intermediate=v_heads * v_dim,
            ssm_dtype_bytes=ssm_bytes,
        )
    pattern = cfg.get("hybrid_override_pattern")
    if isinstance(pattern, str) and "M" in pattern:  # Nemotron-H: M mamba, * attention, - MLP
        heads = _int(cfg, "mamba_num_heads")
        hd = _int(cfg, "mamba_head_dim")
        state = _int(cfg, "ssm_state_size")
        groups = _int(cfg, "n_groups", default=1)
        inter = heads * hd
        return pattern.count("*"), HybridFacts(
            linear_layers=pattern.count("M"),
            conv_dim=inter + 2 * groups * state,
            conv_kernel=_int(cfg, "conv_kernel", default=4),
            num_heads=heads,
            head_dim=hd,
            state_size=state,
            n_groups=groups,
            intermediate=inter,
            ssm_dtype_bytes=ssm_bytes,
        )
    return None, None


def weight_bytes_from_index(index: Mapping[str, Any]) -> int:
    """``model.safetensors.index.json``'s ``metadata.total_size`` (bytes)."""
    meta = index.get("metadata") if isinstance(index, Mapping) else None
    size = meta.get("total_size") if isinstance(meta, Mapping) else None
    if isinstance(size, bool) or not isinstance(size, (int, float)) or size <= 0:
        raise NoEstimate("model.safetensors.index.json has no positive metadata.total_size")
    number = finite_number(size, limit=WEIGHT_BYTES_MAX)
    if number is None:
        raise NoEstimate(f"model.safetensors.index.json's metadata.total_size = {str(size)[:40]}"
                         " is not a finite number of at most 2**50 bytes")
    return number


def weight_bytes_from_header(header: Mapping[str, Any]) -> int:
    """The tensor bytes a safetensors header describes (sum of ``data_offsets`` spans)."""
    total = 0
    for name, entry in header.items():
        if name == "__metadata__":
            continue
        offs = entry.get("data_offsets") if isinstance(entry, Mapping) else None
        if (not isinstance(offs, list) or len(offs) != 2
                or not all(isinstance(o, int) for o in offs) or offs[1] < offs[0]):
            raise NoEstimate(f"safetensors header entry {name[:80]!r} has no valid data_offsets")
        total += offs[1] - offs[0]
    return total


# --- the server's shape and the learned costs ------------------------------------------------


@dataclass(frozen=True)
class SpecShape:
    """Speculative decoding as SGLang resolves it (EAGLE, EAGLE3, STANDALONE; NEXTN = EAGLE)."""

    algorithm: str
    num_steps: int = 3
    topk: int = 1
    num_draft_tokens: int = 4


@dataclass(frozen=True)
class ServerShape:
    """What the server's flags fix that the budget depends on (launcher's params aside)."""

    tp: int = 1
    sglang_version: str = DEFAULT_VERSION
    kv_cache_dtype: str = "auto"  # --kv-cache-dtype; auto: the model's dtype
    context_len: int | None = None  # --context-length; None: the model's
    chunked_prefill_size: int | None = None  # None: SGLang's auto value for the GPU
    max_running_requests: int | None = None
    spec: SpecShape | None = None
    mamba_strategy: str = "auto"  # resolved like SGLang (0.5.23 auto: extra_buffer with overlap)
    overlap: bool = True  # False: --disable-overlap-schedule
    mamba_full_memory_ratio: float = 0.9
    disable_cuda_graph: bool = False
    min_kv_tokens: int = DEFAULT_MIN_KV_TOKENS


@dataclass(frozen=True)
class Coefficients:
    """The costs the config cannot give exactly: the cold prior, per rank.

    ``fleetlearn`` fits these per (architecture, GPU model, SGLang version, speculative
    settings) from the ledger's observed figures. The decode graphs' per-token term is
    ``graph_gib_per_token_hidden x hidden + graph_bytes_scale x``
    :meth:`ModelFacts.graph_bytes_per_token` (the tensors SGLang allocates per captured token
    on one rank: replicated + sharded / tp); the per-graph term is GiB per graph per unit of
    ``hidden_size x layers``, the draft's terms GiB per token per unit of hidden; the warmup per
    chunked-prefill token is ``warmup_gib_per_token_hidden x hidden + warmup_bytes_scale x``
    :meth:`ModelFacts.prefill_bytes_per_token`. The defaults are the source-shaped prior (the
    per-token terms from SGLang's tensors only); :data:`HIDDEN_ONLY_COEFFICIENTS` is the
    earlier hidden-only one (docs/memory.md)."""

    context_gib: float = 1.0  # CUDA context + NCCL buffers before weights, tp 1
    context_gib_per_extra_rank: float = 0.1
    # The hidden-only per-token term (GiB per captured token per unit of hidden, not divided by
    # tp; 0 in the default): HIDDEN_ONLY_COEFFICIENTS sets it to 4e-6, 2.5 times the one real
    # capture figure (0.93 GB at bs 160 for a 7B at tp 1).
    graph_gib_per_token_hidden: float = 0.0
    # The source-shaped per-token prior: this many times ``ModelFacts.graph_bytes_per_token``.
    # The one real capture figure (tests/fixtures/real_logs/gh11949_warmup_403_proxy.log) is
    # about 6 times the tensors (Qwen2.5-7B: 1.06 MB per token, 0.16 GiB at bs 160: per-graph
    # and allocator costs are not in them); 14 keeps the hidden-only prior's level for that
    # model (4e-6 x 3584 GiB = 15.4 MB per token); the shape across models and tp comes from
    # the source.
    graph_bytes_scale: float = 14.0
    graph_overhead_gib_per_layer_hidden: float = 1.6e-7
    # Fixed per capture, whatever the model: SGLang's own auto fraction reserves 512 MiB of
    # "constant meta data (e.g., from attention backend)" (server_args.py ``reserved_mem = 512``,
    # 0.5.10 and 0.5.23), allocated after the KV pool and before capture
    # (``init_memory_pool`` -> ``init_attention_backend`` in model_runner.py): FlashInfer's
    # workspace alone is 384 MiB, 512 MiB for Qwen2/Qwen3 (``SGLANG_FLASHINFER_WORKSPACE_SIZE``).
    graph_fixed_gib: float = 0.5
    draft_graph_gib_per_token_hidden: float = 1e-6
    draft_graph_overhead_gib: float = 0.01
    prefill_graph_gib_per_shape: float = 8 / 1024  # memory_hook: 8 MiB per prefill shape
    mla_prefill_graph_gib: float = 1.5  # memory_hook: 1.5 GiB for MLA prefill graphs
    # The hidden-only warmup term (0 in the default; HIDDEN_ONLY_COEFFICIENTS: 2.5e-8, 26.8
    # bytes per unit of hidden, any tp).
    warmup_gib_per_token_hidden: float = 0.0
    # The source-shaped warmup prior: the prefill tensors themselves
    # (``ModelFacts.prefill_bytes_per_token``). The hidden-only term is 0.5-1.6 times them at
    # tp 1 on bench_estimator's catalogue: about the same level, without tp's shape.
    warmup_bytes_scale: float = 1.0
    # Scale factors a calibration may set from observations (1.0: the prior as is).
    weights_scale: float = 1.0
    graphs_scale: float = 1.0
    activations_scale: float = 1.0

    def context(self, tp: int) -> float:
        return self.context_gib + self.context_gib_per_extra_rank * max(0, tp - 1)


DEFAULT_COEFFICIENTS = Coefficients()
# The default prior by its shape: the per-token graph and warmup costs as SGLang's tensors lay
# them out (replicated + sharded / tp).
SOURCE_SHAPED_COEFFICIENTS = DEFAULT_COEFFICIENTS
# The earlier default, per-token costs growing with hidden only and ignoring tp: kept for
# scripts/bench/bench_oom.py --estimator --prior hidden (docs/benchmarks.md compares the two).
HIDDEN_ONLY_COEFFICIENTS = Coefficients(
    graph_gib_per_token_hidden=4e-6, graph_bytes_scale=0.0,
    warmup_gib_per_token_hidden=2.5e-8, warmup_bytes_scale=0.0,
)


# --- rules the simulator shares ------------------------------------------------------------


def mamba_slot_ratio(strategy: str, overlap: bool, *, disable_radix_cache: bool = False) -> int:
    """0.5.23's state slots per request (``KVCacheConfigurator._calculate_mamba_ratio``): 1
    without the radix cache; else 3, plus 2 for ``extra_buffer`` with the overlap schedule and
    1 for it without overlap or for ``extra_buffer_lazy``. ``strategy`` is resolved (not
    ``auto``)."""
    if disable_radix_cache:
        return 1
    if not strategy.startswith("extra_buffer"):
        return 3
    return 3 + (1 if strategy == "extra_buffer_lazy" or not overlap else 2)


def mamba_cache_slots(budget: float, per_req: float, draft_tokens: int, ratio: int) -> int:
    """0.5.23's auto ``max_mamba_cache_size`` for a state budget (any unit, the same for both
    sizes): ``(budget - per_req) // per_req``, or with speculative decoding (``draft_tokens``
    D > 0) ``(budget - per_req (1+D)) // (per_req (1 + D/ratio))``
    (``KVCacheConfigurator._handle_max_mamba_cache``)."""
    d = draft_tokens
    if d > 0:
        return int((budget - per_req * (1 + d)) // (per_req * (1 + d / ratio)))
    return int((budget - per_req) // per_req)


# --- the estimate ----------------------------------------------------------------------------


@dataclass(frozen=True)
class GpuBar:
    """One GPU's memory at one setting, in GiB: what ``plan``/``diagnose`` draw and put under
    ``memory`` in their JSON. ``kv_gib`` includes the hybrid state and the draft's pool;
    ``activations_gib`` the warmup activations; ``context_gib`` (CUDA context, NCCL) is drawn
    with ``other``'s colour but kept apart. The parts sum to ``total_gib`` (free may be < 0:
    a deficit). ``line_gib``: the static budget, ``--mem-fraction-static`` x the free memory
    before loading, measured from the bar's left end (weights, then KV pool, end there)."""

    index: int
    total_gib: float
    weights_gib: float
    kv_gib: float
    graphs_gib: float
    activations_gib: float
    other_gib: float
    context_gib: float
    free_gib: float
    line_gib: float

    def as_dict(self) -> dict[str, float | int]:
        return {
            "gpu": self.index,
            "total_gib": round(self.total_gib, 2),
            "weights_gib": round(self.weights_gib, 2),
            "kv_gib": round(self.kv_gib, 2),
            "graphs_gib": round(self.graphs_gib, 2),
            "activations_gib": round(self.activations_gib, 2),
            "other_gib": round(self.other_gib, 2),
            "context_gib": round(self.context_gib, 2),
            "free_gib": round(self.free_gib, 2),
            "line_gib": round(self.line_gib, 2),
        }


@dataclass(frozen=True)
class Budget:
    """The estimate at one (mfs, bs): per-rank figures (GiB) and the per-GPU bars."""

    mem_fraction_static: float
    cuda_graph_max_bs: int
    pre_load_free_gib: float
    weights_gib: float  # target + draft, per rank
    kv_pool_gib: float  # target + draft pools, per rank (<= 0: SGLang's "Not enough memory")
    kv_tokens: int
    state_gib: float  # hybrid state cache, per rank
    graphs_gib: float
    activations_gib: float
    headroom_gib: float  # pre x (1 - mfs): what graphs and activations must fit in
    gpus: list[GpuBar]
    problem: str | None = None  # why this setting fails, None when it fits
    draft_in_headroom_gib: float = 0.0  # up to 0.5.15: the draft's weights and KV pool

    @property
    def fits(self) -> bool:
        return self.problem is None

    @property
    def spare_gib(self) -> float:
        """Headroom left after graphs, activations and (up to 0.5.15) the draft's weights and
        pool (< 0: the capture/warmup deficit)."""
        return (self.headroom_gib - self.graphs_gib - self.activations_gib
                - self.draft_in_headroom_gib)


@dataclass(frozen=True)
class Estimate:
    """Everything fixed before choosing (mfs, bs), per rank; :meth:`at` evaluates a setting."""

    model: ModelFacts
    shape: ServerShape
    gpus: list[GpuFacts]
    coeffs: Coefficients
    gpu_total_gib: float  # the smallest GPU's total (SGLang's gpu_mem for its auto values)
    context_gib: float
    pre_load_free_gib: float
    weights_gib: float  # target, per rank
    draft_weights_gib: float  # per rank (0 without speculative decoding)
    kv_bytes_per_token: int  # target, per rank
    draft_kv_bytes_per_token: int
    state_bytes_per_req: int  # hybrid conv + ssm, per rank (0: not hybrid)
    weights_source: str = "index"
    notes: tuple[str, ...] = ()

    @property
    def one_budget(self) -> bool:
        """0.5.23: the draft's weights and KV count inside the static budget."""
        return at_least(self.shape.sglang_version, ONE_STATIC_BUDGET_FROM)

    @property
    def min_kv_gib(self) -> float:
        return self.shape.min_kv_tokens * self.cell_bytes / GIB

    @property
    def cell_bytes(self) -> int:
        """Per-token bytes the static budget pays (0.5.23 adds the draft's to the cell)."""
        return self.kv_bytes_per_token + (self.draft_kv_bytes_per_token if self.one_budget else 0)

    def auto_bs(self) -> int:
        s = self.shape
        return auto_cuda_graph_max_bs(self.gpu_total_gib, s.tp, s.sglang_version)

    def auto_mfs(self, bs: int) -> float:
        s = self.shape
        return auto_mem_fraction_static(
            self.gpu_total_gib, s.tp, s.sglang_version, bs,
            speculative_algorithm=s.spec.algorithm if s.spec is not None else None,
            mla=self.model.mla,
        )

    def resolve(self, params: LaunchParams) -> tuple[float, int]:
        """The (mfs, bs) SGLang runs with for ``params`` (auto values for what is unset)."""
        bs = params.cuda_graph_max_bs or self.auto_bs()
        mfs = params.mem_fraction_static
        return (self.auto_mfs(bs) if mfs is None else mfs), bs

    def request_cap(self) -> int | None:
        s = self.shape
        if s.spec is not None:
            return s.max_running_requests or SPEC_DEFAULT_MAX_RUNNING_REQUESTS
        return s.max_running_requests

    def graphs_gib(self, bs: int) -> float:
        """CUDA-graph memory per rank for decode graph max ``bs`` (all capture passes)."""
        s, m, c = self.shape, self.model, self.coeffs
        if s.disable_cuda_graph:
            return 0.0
        spec = s.spec
        sizes = captured_sizes(bs, spec=spec is not None, cap=self.request_cap())
        top = sizes[-1]
        per_req = spec.num_draft_tokens if spec is not None else 1
        tokens = top * per_req
        per_token = (c.graph_gib_per_token_hidden * m.hidden_size
                     + c.graph_bytes_scale * m.graph_bytes_per_token(s.tp) / GIB)
        total = c.graph_fixed_gib + per_token * tokens
        total += tokens * m.moe_bytes_per_token(s.tp) / GIB  # fused_moe caches of the top graph
        total += c.graph_overhead_gib_per_layer_hidden * m.hidden_size * m.num_layers * len(sizes)
        if at_least(s.sglang_version, AUTO_TABLE_2_FROM):
            if m.mla:
                total += c.mla_prefill_graph_gib
            else:
                total += c.prefill_graph_gib_per_shape * len(self.prefill_shapes())
        if spec is not None:
            dh = m.hidden_size
            g = c.draft_graph_gib_per_token_hidden * dh
            per_graph = c.draft_graph_overhead_gib * len(sizes)
            if spec.num_steps > 1:
                # Draft decode: its steps run one after another on bs x topk tokens inside one
                # graph, whose pool reuses what each step frees, so it holds one step's
                # activations (eagle_worker.draft_forward, 0.5.10 l.652-700; 0.5.23
                # eagle_worker_v2.py l.808-850; scripts/bench/README.md "round draftstep").
                total += g * top * spec.topk + per_graph
            total += g * top * spec.num_draft_tokens + per_graph  # draft extend
            if at_least(s.sglang_version, ONE_STATIC_BUDGET_FROM):
                total += c.prefill_graph_gib_per_shape * len(self.prefill_shapes())
        return total * c.graphs_scale

    def prefill_shapes(self) -> list[int]:
        chunk = self.shape.chunked_prefill_size or auto_chunked_prefill_size(
            self.gpu_total_gib, self.shape.sglang_version)
        return prefill_graph_tokens(min(8192, chunk))

    def activations_gib(self) -> float:
        """Warmup/prefill activations per rank: grows with the chunk and the hidden size."""
        s, c = self.shape, self.coeffs
        chunk = s.chunked_prefill_size or auto_chunked_prefill_size(
            self.gpu_total_gib, s.sglang_version)
        tokens = max(chunk, 2048)
        per_token = (c.warmup_gib_per_token_hidden * self.model.hidden_size
                     + (c.warmup_bytes_scale * self.model.prefill_bytes_per_token(s.tp)
                        + self.model.moe_bytes_per_token(s.tp)) / GIB)
        return per_token * tokens * c.activations_scale

    def mamba_slots_per_req(self) -> int:
        """0.5.23's state slots per request (``_calculate_mamba_ratio``): 3, plus 2 for
        ``extra_buffer`` with the overlap schedule, 1 without it or with ``extra_buffer_lazy``;
        ``auto`` resolves to ``extra_buffer`` when overlap is on, else ``no_buffer``."""
        s = self.shape
        strategy = s.mamba_strategy
        if strategy == "auto":
            strategy = "extra_buffer" if s.overlap else "no_buffer"
        return mamba_slot_ratio(strategy, s.overlap)

    def _state_gib(self, rest: float) -> float:
        """The hybrid state cache carved out of ``rest`` (GiB) with the auto sizing: the budget
        is ``rest x r/(1+r)``. 0.5.23 ``KVCacheConfigurator._handle_max_mamba_cache``: slots
        ``K = (budget - per_req (1+D)) // (per_req (1 + D/ratio))`` with speculative decoding
        (else ``(budget - per_req) // per_req``), ``K + 1`` allocated, plus intermediate state
        ``per_req x (min(reqs, K // ratio) + 1) x D``. 0.5.10 ``handle_max_mamba_cache``: the
        intermediate ``per_req x max_running_requests x D`` comes off first, then ``K =
        budget // per_req``."""
        per_req = self.state_bytes_per_req / GIB
        if per_req <= 0 or rest <= 0:
            return 0.0
        r = self.shape.mamba_full_memory_ratio
        spec = self.shape.spec
        d = spec.num_draft_tokens if spec is not None else 0
        reqs = self.request_cap() or SPEC_DEFAULT_MAX_RUNNING_REQUESTS
        if not self.one_budget:
            inter = per_req * reqs * d if spec is not None else 0.0
            budget = (rest - inter) * r / (1 + r)
            slots = max(int(budget // per_req), 0)
            return min(inter + per_req * (slots + 1), rest)
        budget = rest * r / (1 + r)
        ratio = self.mamba_slots_per_req()
        slots = mamba_cache_slots(budget, per_req, d, ratio)
        inter = per_req * (min(reqs, max(slots, 0) // ratio) + 1) * d if spec is not None else 0.0
        return min(per_req * (max(slots, 0) + 1) + inter, rest)

    def at(self, mem_fraction_static: float, cuda_graph_max_bs: int) -> Budget:
        """The budget at (mfs, bs). ``problem`` names the first pass that would fail."""
        mfs, bs = mem_fraction_static, cuda_graph_max_bs
        pre = self.pre_load_free_gib
        weights = self.weights_gib + self.draft_weights_gib
        headroom = pre * (1 - mfs)
        graphs = self.graphs_gib(bs)
        act = self.activations_gib()
        problem: str | None = None
        # 0.5.23 measures the rest after the draft's weights; 0.5.10 after the target's only
        rest = pre - (weights if self.one_budget else self.weights_gib) - headroom
        state = self._state_gib(rest)
        kv_rest = rest - state
        cell = self.cell_bytes
        tokens = int(kv_rest * GIB // cell) if kv_rest > 0 and cell > 0 else 0
        kv = max(kv_rest, 0.0)
        if not self.one_budget and self.draft_kv_bytes_per_token:
            kv += tokens * self.draft_kv_bytes_per_token / GIB  # 0.5.10: from the headroom
        used_headroom = graphs + act
        draft_in_headroom = 0.0
        if not self.one_budget:
            draft_in_headroom = (self.draft_weights_gib
                                 + tokens * self.draft_kv_bytes_per_token / GIB)
            used_headroom += draft_in_headroom
        if pre <= 0 or weights > pre:
            problem = (f"weights: {weights:.2f} GiB per GPU exceed the {max(pre, 0):.2f} GiB "
                       "free before loading")
        elif kv_rest <= 0 or tokens < self.shape.min_kv_tokens:
            problem = (f"kv_cache: the KV pool would hold {tokens} tokens "
                       f"({max(kv_rest, 0):.2f} GiB), below the minimum "
                       f"{self.shape.min_kv_tokens}")
        elif used_headroom > headroom:
            problem = (f"cuda_graph: graphs and activations need {used_headroom:.2f} GiB, the "
                       f"headroom pre x (1 - mfs) is {headroom:.2f} GiB")
        bars = []
        for g in self.gpus:
            other = g.other_used_gib
            ctx = self.context_gib
            line = pre * mfs  # weights + KV pool (+ state) end here, from the bar's left
            free = g.total_gib - other - ctx - weights - kv - state - graphs - act
            bars.append(GpuBar(g.index, g.total_gib, weights, kv + state, graphs, act, other, ctx,
                               free, line))
        return Budget(mfs, bs, pre, weights, kv, tokens, state, graphs, act, headroom, bars,
                      problem, draft_in_headroom)

    def feasible_range(self, bs: int) -> tuple[float, float] | None:
        """(low, high): estimated fractions low < mfs <= high fit at graph bs ``bs``
        (no margin). None when none does."""
        pre = self.pre_load_free_gib
        if pre <= 0:
            return None
        need = self.graphs_gib(bs) + self.activations_gib()
        if not self.one_budget:
            need += self.draft_weights_gib
        high = _high_edge(self, need)
        low_w = (self.weights_gib + (self.draft_weights_gib if self.one_budget else 0.0))
        # the KV minimum, and the hybrid state in front of it: rest >= min_kv x (1 + r) roughly
        min_kv = self.min_kv_gib
        if self.state_bytes_per_req:
            r = self.shape.mamba_full_memory_ratio
            min_kv = max(min_kv * (1 + r), min_kv + 2 * self.state_bytes_per_req / GIB)
        low = (low_w + min_kv) / pre
        return (low, high) if high > low else None


def estimate(
    model: ModelFacts,
    weights: WeightFacts,
    gpus: Sequence[GpuFacts],
    shape: ServerShape,
    *,
    draft: ModelFacts | None = None,
    draft_weights: WeightFacts | None = None,
    coeffs: Coefficients = DEFAULT_COEFFICIENTS,
) -> Estimate:
    """The estimate for one server. ``gpus``: the server's GPUs (one per rank on this node).
    ``draft``/``draft_weights``: a separate draft checkpoint (EAGLE-3); without them, speculative
    decoding uses the checkpoint's own MTP layers (``model.nextn_layers``). Raises
    :class:`NoEstimate` when the facts do not allow one."""
    if not gpus:
        raise NoEstimate("no GPUs for the server")
    tp = max(1, shape.tp)
    if weights.total_bytes <= 0:
        raise NoEstimate("the checkpoint's weight size is unknown")
    notes: list[str] = []
    total = min(g.total_gib for g in gpus)
    ctx = coeffs.context(tp)
    pre = min(g.total_gib - g.other_used_gib for g in gpus) - ctx
    target_bytes = float(weights.total_bytes)
    draft_gib = 0.0
    draft_kv = 0
    kv_b = dtype_bytes(None if shape.kv_cache_dtype == "auto" else shape.kv_cache_dtype,
                       model.dtype_bytes)
    spec = shape.spec
    if spec is not None:
        if draft is not None:
            if draft_weights is None:
                raise NoEstimate("the draft model's weight size is unknown")
            draft_gib = draft_weights.total_bytes / GIB / tp
            draft_layers = draft.num_layers
        else:
            n = model.nextn_layers
            if n <= 0:
                raise NoEstimate(f"{model.arch or 'the model'} has no MTP layers and no draft "
                                 "model is given")
            share = target_bytes * n / (model.num_layers + n)
            target_bytes -= share
            # the MTP layer plus its own embedding and lm_head copies (bf16, vocab-sharded)
            draft_gib = (share + 2 * model.vocab_size * model.hidden_size * 2) / GIB / tp
            draft_layers = n
            notes.append(f"draft: the checkpoint's {n} MTP layer(s)")
        draft_kv = draft_kv_bytes_per_token(model, tp, kv_b, shape.sglang_version, draft,
                                            draft_layers)
    rep = model.replicated_bytes(tp)
    w = ((target_bytes - rep) / tp + rep) / GIB * coeffs.weights_scale
    state = 0
    if model.hybrid is not None:
        conv, ssm = model.hybrid.per_req_bytes(tp)
        state = conv + ssm
    return Estimate(
        model=model, shape=replace(shape, tp=tp), gpus=list(gpus), coeffs=coeffs,
        gpu_total_gib=total, context_gib=ctx, pre_load_free_gib=pre, weights_gib=w,
        draft_weights_gib=draft_gib * coeffs.weights_scale,
        kv_bytes_per_token=model.kv_bytes_per_token(tp, kv_b), draft_kv_bytes_per_token=draft_kv,
        state_bytes_per_req=state, weights_source=weights.source, notes=tuple(notes),
    )


def draft_kv_bytes_per_token(
    model: ModelFacts,
    tp: int,
    kv_dtype_bytes: int,
    sglang_version: str,
    draft: ModelFacts | None = None,
    draft_layers: int | None = None,
) -> int:
    """One rank's KV bytes per token of the speculative draft's pool. 0.5.23
    (``pool_configurator``) and the checkpoint's own MTP layers (``draft`` None): the target's
    cell x draft layers / target KV layers; 0.5.10 with a separate draft: the draft worker sizes
    its pool from its own config. ``draft_layers``: the draft's layers (default: ``draft``'s,
    or the checkpoint's MTP layers)."""
    if draft_layers is None:
        draft_layers = draft.num_layers if draft is not None else model.nextn_layers
    if at_least(sglang_version, ONE_STATIC_BUDGET_FROM) or draft is None:
        return int(model.kv_bytes_per_token(tp, kv_dtype_bytes) * draft_layers
                   / max(model.kv_layers, 1))
    return draft.kv_bytes_per_token(tp, kv_dtype_bytes)


# --- the first attempt -----------------------------------------------------------------------


@dataclass(frozen=True)
class Choice:
    """The first attempt's params from the estimate, and why.

    ``feasible`` False: no setting fits; ``reason`` gives the numbers and the fix, and
    ``params`` are the configured ones (launched only with ``--force``). ``budget``: the
    estimate at the chosen (or, when infeasible, the configured) setting."""

    params: LaunchParams
    feasible: bool
    reason: str
    margin: float
    budget: Budget
    changed: tuple[str, ...] = ()  # the fields the estimate set ("mem_fraction_static", ...)


def _fix(e: Estimate) -> str:
    tp = e.shape.tp
    need = e.weights_gib + e.draft_weights_gib
    return (f"more GPUs (tp {tp * 2} halves the {need:.1f} GiB of weights per GPU), a quantized "
            "checkpoint (fp8 halves bf16 weights), or a smaller model")


def _draft_pool_ratio(e: Estimate) -> float:
    """Up to 0.5.15 the draft's KV pool (same #tokens as the target's, its own cell) comes out
    of the headroom: its GiB per GiB of the target's pool (0 on 0.5.23 or without a draft)."""
    if e.one_budget or not e.draft_kv_bytes_per_token or not e.cell_bytes:
        return 0.0
    return e.draft_kv_bytes_per_token / e.cell_bytes


def _high_edge(e: Estimate, need: float) -> float:
    """The highest fraction x whose headroom ``pre (1 - x)`` holds ``need`` GiB plus, up to
    0.5.15, the draft's KV pool, which grows with the target's pool ``pre x - weights``:
    ``need + (pre x - w) r <= pre (1 - x)`` gives ``x <= (pre - need + w r) / (pre (1 + r))``
    (``r``: :func:`_draft_pool_ratio`; the hybrid state, which shrinks the pool, is ignored,
    which errs low)."""
    pre, r = e.pre_load_free_gib, _draft_pool_ratio(e)
    return (pre - need + e.weights_gib * r) / (pre * (1 + r))


def _mfs_for(e: Estimate, bs: int, margin: float) -> float:
    """The highest fraction that leaves the margin spare at graph bs ``bs`` (to 0.001)."""
    b0 = e.at(0.0, bs)
    fixed = b0.graphs_gib + b0.activations_gib
    if not e.one_budget:
        fixed += e.draft_weights_gib
    spare = max(margin * (b0.graphs_gib + b0.activations_gib), MIN_MARGIN_GIB)
    return math.floor(_high_edge(e, fixed + spare) * 1000) / 1000


def _best(e: Estimate, start_bs: int, margin: float) -> Budget | None:
    """The largest graph bs (down the capture list from ``start_bs``) whose KV pool gets at least
    half of what the weights leave (:data:`KV_SHARE`), at the highest fraction with the margin;
    failing that, the fitting setting with the largest KV pool; None when nothing fits."""
    fits: list[Budget] = []
    after_weights = e.pre_load_free_gib - e.weights_gib - e.draft_weights_gib
    for bs in reversed(capture_bs_list(start_bs)):
        if bs > start_bs:
            continue
        b = e.at(_mfs_for(e, bs, margin), bs)
        if not b.fits:
            continue
        if b.kv_pool_gib + b.state_gib >= KV_SHARE * after_weights:
            return b
        fits.append(b)
    return max(fits, key=lambda b: b.kv_pool_gib) if fits else None


def _summary(b: Budget, margin: float) -> str:
    return (f"weights {b.weights_gib:.2f} GiB/GPU, KV pool {b.kv_pool_gib:.2f} GiB "
            f"({b.kv_tokens} tokens), graphs {b.graphs_gib:.2f} + activations "
            f"{b.activations_gib:.2f} GiB"
            + (f" + the draft's weights and pool {b.draft_in_headroom_gib:.2f} GiB"
               if b.draft_in_headroom_gib else "")
            + f" in a {b.headroom_gib:.2f} GiB headroom "
            f"({b.spare_gib:.2f} GiB spare, margin {margin:.0%})")


def choose(
    e: Estimate,
    configured: LaunchParams,
    *,
    margin: float = DEFAULT_MARGIN,
    override: bool = False,
) -> Choice:
    """The first attempt's (mfs, bs) from the estimate.

    Fields the config set are kept unless ``override`` (``[policy] initial = "estimate"``);
    the estimate fills the others. The fraction is the highest that leaves
    ``max(margin x (graphs + activations), 0.25 GiB)`` spare in the headroom, rounded down to
    0.001. An unset graph bs starts at the configured (or SGLang's auto) value and goes down the
    capture list until the KV pool gets at least half of what the weights leave.

    ``feasible`` is False only when no setting at all fits (weights alone exceed the GPUs, or
    the KV pool would fall below the minimum at every graph bs): then ``params`` are the
    configured ones and ``reason`` gives the numbers and the fix. A kept setting the estimate
    expects to fail is launched anyway (the OOM policy takes over); ``reason`` says so.
    """
    keep_bs = configured.cuda_graph_max_bs is not None and not override
    keep_mfs = configured.mem_fraction_static is not None and not override
    start_bs = configured.cuda_graph_max_bs or e.auto_bs()
    pre = e.pre_load_free_gib
    w = e.weights_gib + e.draft_weights_gib
    conf_mfs, conf_bs = e.resolve(configured)
    if pre <= 0 or w >= pre:
        return Choice(configured, False,
                      f"weights alone need {w:.2f} GiB per GPU, {max(pre, 0):.2f} GiB is free "
                      f"before loading on the fullest GPU; fix: {_fix(e)}",
                      margin, e.at(conf_mfs, conf_bs))
    best = _best(e, start_bs if not keep_bs else conf_bs, margin)
    if best is None:
        lowest = 1
        min_kv = e.min_kv_gib + (0.0 if e.one_budget else
                                 e.shape.min_kv_tokens * e.draft_kv_bytes_per_token / GIB)
        need = w + min_kv + e.graphs_gib(lowest) + e.activations_gib()
        if need > pre:
            why = (f"no setting fits: weights {w:.2f} GiB + the minimum KV pool {min_kv:.2f} "
                   f"GiB ({e.shape.min_kv_tokens} tokens) + graphs at bs {lowest} "
                   f"{e.graphs_gib(lowest):.2f} GiB + activations {e.activations_gib():.2f} "
                   f"GiB = {need:.2f} GiB exceed the {pre:.2f} GiB free before loading")
        else:  # the sum fits, the margin or the KV minimum at the fraction it allows does not
            low_mfs = _mfs_for(e, lowest, margin)
            why = (f"no setting fits with the {margin:.0%} margin: at graph bs {lowest} and "
                   f"mem_fraction_static={low_mfs:.3f}, {e.at(low_mfs, lowest).problem}")
        return Choice(configured, False, f"{why}; fix: {_fix(e)}", margin,
                      e.at(conf_mfs, conf_bs))
    if keep_mfs and keep_bs:
        b = e.at(conf_mfs, conf_bs)
        verdict = "expected to fit" if b.fits else f"expected to fail: {b.problem}"
        return Choice(configured, True,
                      f"configured mem_fraction_static={conf_mfs:.3f} cuda_graph_max_bs={conf_bs} "
                      f"kept ({verdict}; the estimate would choose "
                      f"{best.mem_fraction_static:.3f}/{best.cuda_graph_max_bs}); "
                      + _summary(b, margin), margin, b)
    changed: tuple[str, ...]
    if keep_bs:
        mfs = _mfs_for(e, conf_bs, margin)
        b = e.at(mfs, conf_bs)
        if not b.fits:
            mfs, b = best.mem_fraction_static, e.at(best.mem_fraction_static, conf_bs)
        bs, changed = conf_bs, ("mem_fraction_static",)
    elif keep_mfs:
        fitting = [e.at(conf_mfs, x) for x in reversed(capture_bs_list(start_bs))
                   if x <= start_bs]
        b = next((x for x in fitting if x.fits), e.at(conf_mfs, start_bs))
        mfs, bs, changed = conf_mfs, b.cuda_graph_max_bs, ("cuda_graph_max_bs",)
    else:
        b, mfs, bs = best, best.mem_fraction_static, best.cuda_graph_max_bs
        changed = ("mem_fraction_static", "cuda_graph_max_bs")
    params = replace(configured, mem_fraction_static=mfs, cuda_graph_max_bs=bs)
    lowered = f" (lowered from {start_bs})" if bs < start_bs else ""
    verdict = "" if b.fits else f"; expected to fail: {b.problem}"
    reason = (f"estimate: mem_fraction_static={mfs:.3f} cuda_graph_max_bs={bs}{lowered}; "
              + _summary(b, margin) + verdict)
    return Choice(params, True, reason, margin, b, changed)


# --- a failed attempt, from its log ----------------------------------------------------------


@dataclass(frozen=True)
class Observed:
    """One GPU's memory as a failed attempt's log shows it: the bar ``diagnose`` draws,
    where it broke and by how much (``deficit_gib``: what was tried minus what was free)."""

    bar: GpuBar
    broke: str
    deficit_gib: float | None
    mem_fraction_static: float | None


def observed_bar(n: Numbers, phase: str) -> Observed | None:
    """The bar of the rank a log's figures describe, or None when the log shows too little
    (no ``Load weight begin. avail mem`` and no OOM capacity). Figures: total from the OOM's
    ``total capacity`` (else the pre-load free memory); weights from ``Load weight end ... mem
    usage`` (+ the draft's); KV pool (and hybrid state) = post-weights - ``Memory pool end``
    avail; graphs = ``Memory pool end`` - the last free figure seen in capture; the OOM's
    tried-but-not-free amount is the deficit."""
    pre = n.pre_load_avail_gib
    total = n.total_gib if n.total_gib is not None else pre
    if total is None:
        return None
    pre = total if pre is None else pre
    weights = (n.weights_gib or 0.0) + (n.draft_weights_gib or 0.0)
    post_w = n.post_weights_avail_gib
    if post_w is None and n.weights_gib is not None:
        post_w = pre - weights
    kv = 0.0
    if post_w is not None and n.pool_end_avail_gib is not None:
        kv = max(0.0, post_w - n.pool_end_avail_gib)
    graphs = 0.0
    last_free = n.graph_last_avail_gib if n.graph_last_avail_gib is not None else n.free_gib
    if n.pool_end_avail_gib is not None and phase == "cuda_graph" and last_free is not None:
        graphs = max(0.0, n.pool_end_avail_gib - last_free)
    deficit = None
    if n.tried_gib is not None and n.free_gib is not None:
        deficit = max(0.0, n.tried_gib - n.free_gib)
    acts = n.tried_gib if phase == "warmup" and n.tried_gib is not None else 0.0
    other = max(0.0, total - pre)
    free = total - other - weights - kv - graphs - acts
    mfs = n.mem_fraction_static
    line = pre * mfs if mfs is not None else 0.0
    where = phase + (f" ({n.graph_pass})" if n.graph_pass and phase == "cuda_graph" else "")
    bar = GpuBar(n.gpu or 0, total, weights, kv, graphs, acts, other, 0.0, free, line)
    return Observed(bar, where, deficit, mfs)
