"""What SGLang does with a model's memory, as facts of its config and flags. Pure: no I/O.

The model-facts half of the memory budget: from the model's ``config.json``, its weight bytes,
the draft's config and the server's flags, what SGLang allocates per token and per request and
how it lays out the tensors behind the uncertain costs. The estimate built on these facts (the
priors, the per-GPU budget, the first attempt's choice) is :mod:`launcher.memory.estimate`.

Public API::

    facts:     ModelFacts.from_config(config: Mapping) -> ModelFacts      (raises NoEstimate)
               weight_bytes_from_index(index: Mapping) -> int             (raises NoEstimate)
               weight_bytes_from_header(header: Mapping) -> int           (raises NoEstimate)
               GpuFacts(index, total_gib, other_used_gib), WeightFacts(total_bytes, source)
    shape:     ServerShape(tp, sglang_version, kv_cache_dtype, ..., spec: SpecShape | None)
    shared:    mamba_slot_ratio(strategy, overlap), mamba_cache_slots(budget, per_req, D, ratio)
               (0.5.23's state-slot rules), ModelFacts.kv_bytes_per_token / replicated_bytes,
               HybridFacts.per_req_bytes, draft_kv_bytes_per_token(...): the estimate and the
               simulator's hidden costs come from these same rules

All sizes are GiB (SGLang's "GB" in its logs is GiB) unless a name says bytes; all per-rank
figures are for one GPU of the server. Where each rule comes from in SGLang's source
(``sglang/srt/...`` of 0.5.10 and 0.5.23; docs/memory.md has the table):

- KV bytes per token: MHA/GQA ``max(1, kv_heads // tp) x (head_dim + v_head_dim) x layers x
  dtype`` (``pool_configurator.DefaultPoolConfigurator._compute_cell_size``,
  ``model_config.get_num_kv_heads``); MLA ``(kv_lora_rank + qk_rope_head_dim) x layers x dtype``,
  not sharded by tp (``kv_cache_configurator.calculate_mla_kv_cache_dim``); hybrid models count
  only their full-attention layers. 0.5.23 adds the EAGLE draft's per-token bytes to the cell
  (``draft_kv = cell x draft_layers / layers``).
- hybrid state per request: ``(conv_dim/tp x (conv_kernel - 1) x conv_dtype + heads/tp x
  head_dim x state x ssm_dtype) x linear_layers`` with ``conv_dim = intermediate + 2 x groups x
  state`` (``configs/mamba_utils.Mamba2StateShape.create``, ``mamba_cache_per_req``).
- weights per rank: ``(total - replicated)/tp + replicated``; replicated are MLA's low-rank
  ``q_a``/``kv_a`` projections (``ReplicatedLinear`` in ``models/deepseek_v2.py``), the MoE
  router, and K/V projections when ``kv_heads < tp``.
- MoE layers' transient memory per token, ``topk x (3 moe_intermediate/tp + hidden) x 2``
  bytes (the Triton runner's ``intermediate_cache1/2/3``,
  ``layers/moe/moe_runner/triton_utils/fused_moe.py``): :meth:`ModelFacts.moe_bytes_per_token`.
- the tensors behind the per-token graph and warmup costs, per rank (replicated + sharded / tp):
  :meth:`ModelFacts.graph_bytes_per_token`, :meth:`ModelFacts.prefill_bytes_per_token`.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from launcher.sglang.versions import DEFAULT_VERSION, ONE_STATIC_BUDGET_FROM, at_least
from launcher.untrusted import finite_number

__all__ = [
    "DEFAULT_MIN_KV_TOKENS",
    "GIB",
    "MIB",
    "GpuFacts",
    "HybridFacts",
    "ModelFacts",
    "NoEstimate",
    "ServerShape",
    "SpecShape",
    "WeightFacts",
    "draft_kv_bytes_per_token",
    "dtype_bytes",
    "mamba_cache_slots",
    "mamba_slot_ratio",
    "weight_bytes_from_header",
    "weight_bytes_from_index",
]

GIB = 1 << 30
MIB = 1 << 20

# Below this many KV tokens launcher calls a pool too small to serve (SGLang itself only refuses
# a pool <= 0; a pool smaller than one long request is useless in practice).
DEFAULT_MIN_KV_TOKENS = 4096

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
    # what the LoRA pool's shapes read besides (launcher.sglang.lora): the shared experts of a
    # MoE model, config.json's first_k_dense_replace (None: absent) and moe_layer_freq, and
    # whether lm_head is the embedding (then SGLang's model has no separate ParallelLMHead)
    n_shared_experts: int = 0
    shared_expert_intermediate_size: int = 0
    first_k_dense_replace: int | None = None
    moe_layer_freq: int = 1
    tie_word_embeddings: bool = False

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
        first_k = _int(cfg, "first_k_dense_replace", default=-1)  # -1: absent
        first_dense = max(first_k, 0)
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
            n_shared_experts=_int(cfg, "n_shared_experts", default=0),
            shared_expert_intermediate_size=_int(cfg, "shared_expert_intermediate_size",
                                                 default=0),
            first_k_dense_replace=(None if first_k < 0 else first_k),
            moe_layer_freq=max(1, _int(cfg, "moe_layer_freq", default=1)),
            tie_word_embeddings=cfg.get("tie_word_embeddings") is True,
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


# --- the server's shape ---------------------------------------------------------------------


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
    attention_backend: str | None = None  # --attention-backend; None: SGLang's default




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


