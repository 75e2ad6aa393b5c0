"""SGLang's LoRA memory pool: its shape from the server's flags and the adapters' configs, and
its bytes per GPU from the model's config. Pure: no I/O.

With LoRA on (``--enable-lora``, or any ``--lora-paths``), SGLang's model runner builds the
LoRA manager right after the weights load and before it sizes the KV pool (0.5.23
``model_executor/model_runner.py:715`` ``load_model``, ``:733`` ``maybe_init_lora_manager``,
the pool at ``:981-984``; 0.5.10 ``model_runner.py:507`` ``load_model``, ``:595-596``
``init_lora_manager``, ``:623`` ``init_memory_pool``). The manager allocates its memory pool
at once (``lora/lora_manager.py`` ``init_state`` -> ``init_memory_pool``; 0.5.23 l.699-741,
l.1016-1033), so the pool comes out of the memory the KV pool would get: the KV pool's rest
(free after weights - pre x (1 - mfs)) is smaller by it. Where ``--max-total-tokens`` caps
the KV pool, the LoRA pool lowers the free memory at ready instead.

The pool (``lora/mem_pool.py`` ``LoRAMemoryPool.init_buffers``: 0.5.23 l.598-749, 0.5.10
l.279-378), in the model's dtype, for each normalized target module and each of the model's
``num_hidden_layers`` layers:

- A ``(max_loras_per_batch, max_lora_rank x stacked, input_dim)`` and
  B ``(max_loras_per_batch, output_dim, max_lora_rank)`` (``get_lora_A_shape`` /
  ``get_lora_B_shape``: 0.5.23 l.424-573, 0.5.10 l.173-255); ``stacked`` is 3 for
  ``qkv_proj``, 2 for ``gate_up_proj`` and ``fused_qkv_a_proj_with_mqa``, else 1
  (``lora/utils.py`` ``get_stacked_multiply``, 0.5.23 l.330-348);
- the dims are ``get_hidden_dim``'s (``lora/utils.py`` ``get_default_hidden_dim``, 0.5.23
  l.172-274; 0.5.10 l.57-117): qkv ``hidden -> head_dim (heads + 2 kv_heads)``, o
  ``(v_)head_dim heads -> hidden``, gate_up ``hidden -> 2 intermediate``, down ``intermediate
  -> hidden``, MLA's ``fused_qkv_a_proj_with_mqa``, ``q_b_proj``, ``kv_b_proj`` from their
  ranks and heads;
- tp: row-parallel modules (``o_proj``, ``down_proj``, ``down_proj_moe``: ``lora/utils.py``
  ``ROW_PARALLELISM_LINEAR_LORA_NAMES``) split A's input by tp; the others split B's output by
  tp, except the replicated ``fused_qkv_a_proj_with_mqa`` (0.5.23); 0.5.23 keeps one whole KV
  head per rank in qkv's B when tp > kv heads (``mem_pool.py:492-525``);
- a MoE model (routed experts) gets 4-D buffers for ``gate_up_proj`` / ``down_proj``,
  ``(n, experts, ...)`` with ``moe_intermediate_size / tp``, and, when it has shared experts,
  the 3-D ones beside them (``init_buffers``' ``init_buffer``, 0.5.23 l.606-682);
- ``embed_tokens``: A ``(n, rank, vocab)``, B ``(n, hidden, rank)``; ``lm_head``: A ``(n,
  rank, hidden)``, B ``(n, vocab / tp, rank)``, once each, not per layer
  (``get_embedding_lora_A_shape`` / ``_B_shape``, 0.5.23 l.474-596).

The shape (``LoRAManager.init_lora_shapes``: 0.5.23 ``lora_manager.py:800-917``, 0.5.10
l.500-597): ``--max-lora-rank``, else the largest ``r`` of the adapters' ``adapter_config.json``;
``--lora-target-modules`` normalized (q/k/v_proj -> qkv_proj, gate/up_proj -> gate_up_proj:
``lora/utils.py`` ``get_normalized_target_modules``, 0.5.23 l.277-327), ``all`` resolved per
version (:data:`~launcher.sglang.versions.LORA_MODEL_AWARE_FROM`), else the union of the
adapters' ``target_modules`` (``"all-linear"`` resolved on the model); ``--max-loras-per-batch``
defaults to 8 (0.5.23 ``arg_groups/fields/lora.py:66-69``; 0.5.10 ``server_args.py:468``).

Not modelled (named in :attr:`LoraPool.notes`): expert parallelism, adapters with shared outer
MoE factors (SGLang reads them from the weights), shared experts fused into the MoE kernel,
``added_tokens.json`` (the extra-vocabulary buffers), modules of models that define their own
``get_hidden_dim`` (hybrid Mamba/GDN ``in_proj``, ...) and the LoRA backends' small batch-info
tensors.

Public API::

    flags:   parse_lora_flags(argv) -> LoraFlags | None                (raises NoEstimate)
    configs: adapter_shape(config, path) -> (rank, targets)            (raises NoEstimate)
    shape:   resolve_lora(flags, configs, model, version) -> LoraShape (raises NoEstimate)
    pool:    lora_pool(model, shape, tp, version) -> LoraPool; LoraPool.total_bytes, describe()
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from launcher.sglang.flags import full_flag
from launcher.sglang.modelfacts import GIB, ModelFacts, NoEstimate
from launcher.sglang.versions import LORA_MODEL_AWARE_FROM, at_least

__all__ = [
    "ALL",
    "DEFAULT_MAX_LORAS_PER_BATCH",
    "LoraAdapter",
    "LoraBuffer",
    "LoraFlags",
    "LoraPool",
    "LoraShape",
    "adapter_shape",
    "linear_modules",
    "lora_pool",
    "normalize_modules",
    "parse_lora_flags",
    "resolve_lora",
]

ALL = "all"
DEFAULT_MAX_LORAS_PER_BATCH = 8
EMBEDDINGS = ("embed_tokens", "lm_head")
MAX_RANK = 1 << 16  # a bound on a rank from a host's file (real ranks are <= 1024)

# lora/utils.py get_normalized_target_modules' params_mapping (0.5.23 l.298-320; 0.5.10's is
# a subset with the same values)
_NORMALIZE = {
    "q_proj": "qkv_proj", "k_proj": "qkv_proj", "v_proj": "qkv_proj",
    "gate_proj": "gate_up_proj", "up_proj": "gate_up_proj",
    "vocab_emb": "embed_tokens", "embeddings": "embed_tokens", "word_embeddings": "embed_tokens",
    "output": "lm_head", "unembed_tokens": "lm_head",
    "q_a_proj": "fused_qkv_a_proj_with_mqa", "kv_a_proj_with_mqa": "fused_qkv_a_proj_with_mqa",
}
# lora/utils.py get_stacked_multiply (0.5.23 l.339-347)
_STACKED = {"qkv_proj": 3, "gate_up_proj": 2, "fused_qkv_a_proj_with_mqa": 2}
# lora/utils.py ROW_PARALLELISM_LINEAR_LORA_NAMES (0.5.23 l.374-381)
_ROW = frozenset({"o_proj", "out_proj", "down_proj", "down_proj_moe"})
# 0.5.10's utils/common.py:3294 SUPPORTED_LORA_TARGET_MODULES, normalized: what its "all" is
_ALL_0510 = frozenset({"qkv_proj", "o_proj", "gate_up_proj", "down_proj", *EMBEDDINGS})


@dataclass(frozen=True)
class LoraAdapter:
    """One ``--lora-paths`` entry: ``name=path``, ``path`` or ``{"lora_name", "lora_path"}``."""

    name: str
    path: str


@dataclass(frozen=True)
class LoraFlags:
    """The LoRA flags of a server's command line (None fields: unset)."""

    adapters: tuple[LoraAdapter, ...] = ()
    max_loras_per_batch: int = DEFAULT_MAX_LORAS_PER_BATCH
    max_lora_rank: int | None = None
    target_modules: tuple[str, ...] | None = None  # as given: raw names, or ("all",)

    @property
    def needs_adapter_configs(self) -> bool:
        """The rank or the targets come from the adapters' ``adapter_config.json``."""
        return self.max_lora_rank is None or self.target_modules is None


@dataclass(frozen=True)
class LoraShape:
    """The pool's shape as SGLang resolves it. ``target_modules`` None: unknown (the adapters'
    configs were not read): :func:`lora_pool` takes every linear module SGLang would allocate
    for the model, an upper bound. ``source``: where rank and targets came from, for the
    text."""

    max_loras_per_batch: int
    max_lora_rank: int
    target_modules: frozenset[str] | None
    source: str = "flags"


@dataclass(frozen=True)
class LoraBuffer:
    """One module's A and B buffers on one rank, allocated ``count`` times (once per layer)."""

    module: str
    a_shape: tuple[int, ...]
    b_shape: tuple[int, ...]
    count: int

    @property
    def elements(self) -> int:
        a = b = 1
        for d in self.a_shape:
            a *= d
        for d in self.b_shape:
            b *= d
        return (a + b) * self.count


@dataclass(frozen=True)
class LoraPool:
    """The LoRA memory pool on one GPU of the server."""

    shape: LoraShape
    buffers: tuple[LoraBuffer, ...]
    dtype_bytes: int
    upper_bound: bool = False  # targets unknown: every linear module counted
    notes: tuple[str, ...] = ()

    @property
    def total_bytes(self) -> int:
        return sum(b.elements for b in self.buffers) * self.dtype_bytes

    @property
    def gib(self) -> float:
        return self.total_bytes / GIB

    def describe(self) -> str:
        """``LoRA pool 2.50 GiB/GPU (2 adapters per batch x rank 256, qkv_proj, ...)``."""
        s = self.shape
        modules = ", ".join(sorted({b.module for b in self.buffers})) or "no modules"
        bound = ("; targets unknown: every linear module, an upper bound"
                 if self.upper_bound else "")
        text = (f"LoRA pool {self.gib:.2f} GiB/GPU ({s.max_loras_per_batch} adapters per batch "
                f"x rank {s.max_lora_rank}, {modules}; from {s.source}{bound})")
        return text + "".join(f"; {n}" for n in self.notes)


# --- the flags --------------------------------------------------------------------------------


def _values(argv: Sequence[str], i: int) -> tuple[list[str], int]:
    """An ``nargs="*"`` option's values after argv[i] (argparse stops at the next option)."""
    out: list[str] = []
    j = i + 1
    while j < len(argv) and not argv[j].startswith("-"):
        out.append(argv[j])
        j += 1
    return out, j


def _adapter(entry: str) -> LoraAdapter:
    """One ``--lora-paths`` value the way SGLang reads it (``LoRAPathAction``: a JSON object
    ``{...}``; ``check_lora_server_args``: ``name=path`` split at the first ``=``, else the path
    is its own name)."""
    entry = entry.strip()
    if entry.startswith("{") and entry.endswith("}"):
        try:
            obj = json.loads(entry)
        except ValueError:
            obj = None
        if (not isinstance(obj, dict) or not isinstance(obj.get("lora_name"), str)
                or not isinstance(obj.get("lora_path"), str)):
            raise NoEstimate(f"--lora-paths {entry[:80]!r} is not a JSON object with string "
                             "lora_name and lora_path (fix the entry)")
        return LoraAdapter(obj["lora_name"], obj["lora_path"])
    if "=" in entry:
        name, path = entry.split("=", 1)
        return LoraAdapter(name, path)
    return LoraAdapter(entry, entry)


def _int_flag(name: str, value: str) -> int:
    if not value.isdigit() or len(value) > 9:
        raise NoEstimate(f"{name} {value[:40]!r} is not a whole number (fix the flag)")
    return int(value)


# The LoRA flags parse_lora_flags reads; an abbreviation of exactly one of them stands for it.
_LORA_FLAGS = ("--lora-paths", "--lora-target-modules", "--max-loras-per-batch",
               "--max-lora-rank", "--enable-lora")


def parse_lora_flags(argv: Sequence[str]) -> LoraFlags | None:
    """The LoRA flags of ``argv`` (a server's extra arguments), None when LoRA is off (neither
    ``--enable-lora`` nor any ``--lora-paths``). ``--opt value`` and ``--opt=value`` both,
    and abbreviations (``--lora-path``); an option given twice keeps its last value, as
    argparse does. NoEstimate names a flag whose
    value SGLang would not take."""
    enable = False
    adapters: list[LoraAdapter] = []
    per_batch = DEFAULT_MAX_LORAS_PER_BATCH
    rank: int | None = None
    targets: tuple[str, ...] | None = None
    i = 0
    while i < len(argv):
        name, eq, inline = argv[i].partition("=")
        name = full_flag(name, _LORA_FLAGS)
        if name in ("--lora-paths", "--lora-target-modules"):
            if eq:
                values, nxt = [inline], i + 1
            else:
                values, nxt = _values(argv, i)
            if name == "--lora-paths":
                adapters = [_adapter(v) for v in values]
            else:
                if not values:  # SGLang takes [] as "no module": every adapter is refused
                    raise NoEstimate("--lora-target-modules has no module: SGLang would refuse "
                                     "every adapter (name the modules, or drop the flag)")
                targets = tuple(values)
            i = nxt
            continue
        if name in ("--max-loras-per-batch", "--max-lora-rank"):
            if eq:
                value = inline
            elif i + 1 < len(argv):
                value = argv[i + 1]
                i += 1
            else:
                raise NoEstimate(f"{name} has no value (fix the flag)")
            number = _int_flag(name, value)
            if name == "--max-lora-rank" and number == 0:
                raise NoEstimate("--max-lora-rank 0: SGLang asserts a rank above 0 (fix the flag)")
            if name == "--max-lora-rank":
                rank = number
            else:
                per_batch = number
        elif name == "--enable-lora" and not eq:
            enable = True
        i += 1
    if not enable and not adapters:
        return None
    if per_batch <= 0:
        raise NoEstimate("--max-loras-per-batch must be positive (SGLang asserts it)")
    if targets is not None and ALL in targets and len(targets) > 1:
        raise NoEstimate("--lora-target-modules all must be the only module given "
                         "(SGLang asserts it)")
    if not adapters and (rank is None or targets is None):
        raise NoEstimate("--enable-lora without --lora-paths needs both --max-lora-rank and "
                         "--lora-target-modules (SGLang asserts it)")
    return LoraFlags(tuple(adapters), per_batch, rank, targets)


# --- the shape --------------------------------------------------------------------------------


def normalize_modules(names: Iterable[str]) -> frozenset[str]:
    """SGLang's normalized LoRA weight names of ``names`` (the last dotted part, then
    q/k/v_proj -> qkv_proj, gate/up_proj -> gate_up_proj, ...)."""
    out = set()
    for name in names:
        base = name.split(".")[-1]
        out.add(_NORMALIZE.get(base, base))
    return frozenset(out)


def linear_modules(model: ModelFacts) -> frozenset[str]:
    """The normalized linear modules of the model's decoder layers that SGLang's LoRA pool
    handles (``auto_detect_lora_target_modules`` on the model, embeddings aside): attention
    (``qkv_proj`` and ``o_proj``; MLA's ``fused_qkv_a_proj_with_mqa``, ``q_b_proj`` with a
    q rank, ``kv_b_proj`` and ``o_proj``) and the MLP's ``gate_up_proj`` and ``down_proj``."""
    if model.mla:
        attn = {"fused_qkv_a_proj_with_mqa", "kv_b_proj", "o_proj"}
        attn.add("q_b_proj" if model.q_lora_rank else "qkv_proj")
    else:
        attn = {"qkv_proj", "o_proj"}
    return frozenset(attn | {"gate_up_proj", "down_proj"})


def _detected(model: ModelFacts) -> frozenset[str]:
    """``auto_detect_lora_target_modules``: the linear modules, ``embed_tokens`` and, unless
    the model ties it to the embedding, ``lm_head`` (0.5.23 ``lora/utils.py:436-486``)."""
    extra = {"embed_tokens"} | (set() if model.tie_word_embeddings else {"lm_head"})
    return linear_modules(model) | extra


def adapter_shape(config: Mapping[str, Any], path: str) -> tuple[int, frozenset[str] | str]:
    """(``r``, normalized ``target_modules``, or ``"all"`` for PEFT's ``"all-linear"`` /
    ``"all"``) of one ``adapter_config.json`` (``lora/lora_config.py`` ``LoRAConfig``).
    NoEstimate names the file and the fix when SGLang could not read it either."""
    where = f"{path}/adapter_config.json"
    fix = "set --max-lora-rank and --lora-target-modules, or fix the adapter"
    if not isinstance(config, Mapping):
        raise NoEstimate(f"{where} is not a JSON object ({fix})")
    r = config.get("r")
    if isinstance(r, bool) or not isinstance(r, int) or not 0 < r <= MAX_RANK:
        raise NoEstimate(f"{where} has no rank r from 1 to {MAX_RANK} ({fix})")
    targets = config.get("target_modules")
    if isinstance(targets, str):
        if targets in ("all-linear", ALL):
            return r, ALL
        raise NoEstimate(f"{where}'s target_modules {targets[:60]!r} is a pattern SGLang does "
                         f"not take (lora_manager.py:845-850); {fix}")
    if (not isinstance(targets, list) or not targets
            or not all(isinstance(t, str) for t in targets)):
        raise NoEstimate(f"{where} has no list of target_modules ({fix})")
    return r, normalize_modules(targets)


def resolve_lora(flags: LoraFlags, configs: Sequence[tuple[int, frozenset[str] | str]] | None,
                 model: ModelFacts, version: str) -> LoraShape:
    """The pool's shape as ``init_lora_shapes`` resolves it from the flags and the adapters'
    (rank, targets) (:func:`adapter_shape`). ``configs`` None: not read; then an unset
    ``--lora-target-modules`` leaves the targets unknown (an upper bound) and an unset
    ``--max-lora-rank`` is a NoEstimate."""
    if flags.target_modules is None:
        targets: set[str] | None = None
    elif ALL in flags.target_modules:
        targets = set(_detected(model) | set(EMBEDDINGS)
                      if at_least(version, LORA_MODEL_AWARE_FROM) else _ALL_0510)
    else:
        targets = set(normalize_modules(flags.target_modules))
    if configs is None:
        if flags.max_lora_rank is None:
            raise NoEstimate("the LoRA adapters' rank is unknown: set --max-lora-rank (and "
                             "--lora-target-modules) or let launcher read the adapters")
        return LoraShape(flags.max_loras_per_batch, flags.max_lora_rank,
                         None if targets is None else frozenset(targets), "flags")
    if flags.target_modules is None:
        targets = set()
        for _, t in configs:
            targets |= _detected(model) if t == ALL else set(t)
    else:
        assert targets is not None
        for _, t in configs:
            if t != ALL and not set(t) <= targets:
                raise NoEstimate(
                    f"an adapter targets {sorted(set(t) - targets)} beyond "
                    f"--lora-target-modules {sorted(targets)}: SGLang refuses to start "
                    "(lora_manager.py:864-874); add them to --lora-target-modules")
    rank = flags.max_lora_rank
    if rank is None:
        rank = max((r for r, _ in configs), default=0)
    source = ("flags" if not flags.needs_adapter_configs
              else "the adapters' adapter_config.json" if flags.max_lora_rank is None
              and flags.target_modules is None
              else "flags and the adapters' adapter_config.json")
    return LoraShape(flags.max_loras_per_batch, rank, frozenset(targets), source)


# --- the pool --------------------------------------------------------------------------------


def _shared_inter(model: ModelFacts, layer: int, version: str) -> int:
    """The intermediate size of ``gate_up_proj`` / ``down_proj`` at ``layer``. 0.5.10: the
    config's ``intermediate_size``. 0.5.23 reads the width of the layer's own dense linear of
    that name (``lora/mem_pool.py:284-314`` ``_dense_local_dim``), which on a MoE layer is the
    shared expert's: ``shared_expert_intermediate_size`` (Qwen2-MoE's ``shared_expert``), or
    ``moe_intermediate x n_shared_experts`` with ``first_k_dense_replace`` (DeepSeek's
    ``shared_experts``, as ``lora/utils.py:201-220`` also has it)."""
    inter = model.intermediate_size
    if not at_least(version, LORA_MODEL_AWARE_FROM) or not model.moe_intermediate_size:
        return inter
    first_k = model.first_k_dense_replace
    if (first_k is not None and layer < first_k) or layer % model.moe_layer_freq != 0:
        return inter  # a dense layer: its own MLP
    if model.shared_expert_intermediate_size:
        return model.shared_expert_intermediate_size
    if first_k is not None and model.n_shared_experts:
        return model.moe_intermediate_size * model.n_shared_experts
    return inter


def _dims(model: ModelFacts, module: str, layer: int, version: str) -> tuple[int, int] | None:
    """(input, output) of a module (``get_default_hidden_dim``), None without a rule here."""
    m = model
    h = m.hidden_size
    if module == "qkv_proj":
        return h, m.head_dim * (m.num_attention_heads + 2 * m.num_kv_heads)
    if module == "o_proj":
        return (m.v_head_dim or m.head_dim) * m.num_attention_heads, h
    if module in ("gate_up_proj", "down_proj"):
        inter = _shared_inter(m, layer, version)
        return (h, 2 * inter) if module == "gate_up_proj" else (inter, h)
    if module in ("gate_up_proj_moe", "down_proj_moe"):
        inter = m.moe_intermediate_size or m.intermediate_size
        return (h, 2 * inter) if module == "gate_up_proj_moe" else (inter, h)
    if not at_least(version, LORA_MODEL_AWARE_FROM):
        return None  # 0.5.10's get_hidden_dim raises for MLA's modules (utils.py:114-117)
    if module == "fused_qkv_a_proj_with_mqa" and m.mla:
        return h, m.q_lora_rank + m.kv_lora_rank + m.qk_rope_head_dim
    if module == "q_b_proj" and m.mla and m.q_lora_rank:
        return m.q_lora_rank, m.num_attention_heads * (m.qk_nope_head_dim + m.qk_rope_head_dim)
    if module == "kv_b_proj" and m.mla:
        return m.kv_lora_rank, m.num_attention_heads * (m.qk_nope_head_dim + m.v_head_dim)
    return None


def _ceil_div(a: int, b: int) -> int:
    return -(-a // b)


def _shapes(model: ModelFacts, module: str, layer: int, n: int, r: int, tp: int,
            version: str) -> tuple[tuple[int, ...], tuple[int, ...]] | None:
    """A's and B's shape of one module at one layer on one rank (``get_lora_A_shape`` /
    ``get_lora_B_shape``), None without a rule here."""
    dims = _dims(model, module, layer, version)
    if dims is None:
        return None
    din, dout = dims
    replicated = module == "fused_qkv_a_proj_with_mqa" and at_least(version,
                                                                     LORA_MODEL_AWARE_FROM)
    if tp > 1 and not replicated:
        if module in _ROW:
            din = _ceil_div(din, tp)
        elif (module == "qkv_proj" and model.num_kv_heads < tp
              and at_least(version, LORA_MODEL_AWARE_FROM)):
            # _column_parallel_lora_b_per_rank_dim: one whole K and V head per rank
            kv = 2 * model.num_kv_heads * model.head_dim
            dout = _ceil_div(dout - kv, tp) + 2 * model.head_dim
        else:
            dout = _ceil_div(dout, tp)
    c = _STACKED.get(module.removesuffix("_moe"), 1)
    if module.endswith("_moe"):
        e = model.num_experts
        return (n, e, r * c, din), (n, e, dout, r)
    return (n, r * c, din), (n, dout, r)


def lora_pool(model: ModelFacts, shape: LoraShape, tp: int, version: str) -> LoraPool:
    """The pool's buffers and bytes on one GPU of a tp-``tp`` server (the module docstring has
    the rule). Unknown targets count every linear module (:func:`linear_modules`), an upper
    bound that leaves the embeddings out; a target module without a shape rule here is left out
    and named in ``notes``."""
    tp = max(1, tp)
    n, r = shape.max_loras_per_batch, shape.max_lora_rank
    upper = shape.target_modules is None
    targets = linear_modules(model) if shape.target_modules is None else shape.target_modules
    moe = model.num_experts > 1
    shared = model.n_shared_experts > 0 or model.shared_expert_intermediate_size > 0
    notes: list[str] = []
    layer_modules: list[str] = []
    for module in sorted(targets - set(EMBEDDINGS)):
        if module in ("gate_up_proj", "down_proj") and moe:
            layer_modules += ([module] if shared else []) + [f"{module}_moe"]
        else:
            layer_modules.append(module)
    buffers: list[LoraBuffer] = []
    missing: list[str] = []
    for module in layer_modules:
        counts: dict[tuple[tuple[int, ...], tuple[int, ...]], int] = {}
        for layer in range(model.num_layers):
            ab = _shapes(model, module, layer, n, r, tp, version)
            if ab is None:
                missing.append(module)
                break
            counts[ab] = counts.get(ab, 0) + 1
        else:
            buffers += [LoraBuffer(module, a, b, k) for (a, b), k in counts.items()]
    for module in EMBEDDINGS:
        if module not in targets:
            continue
        if module == "embed_tokens":
            buffers.append(LoraBuffer(module, (n, r, model.vocab_size),
                                      (n, model.hidden_size, r), 1))
        else:
            buffers.append(LoraBuffer(module, (n, r, model.hidden_size),
                                      (n, _ceil_div(model.vocab_size, tp), r), 1))
    if missing:
        notes.append(f"not counted (no shape rule for this model in launcher): "
                     f"{', '.join(sorted(set(missing)))}")
    if moe and targets & {"gate_up_proj", "down_proj"}:
        notes.append("MoE: per-expert factors assumed (shared outer factors, expert "
                     "parallelism and fused shared experts not modelled)")
    if model.hybrid is not None:
        notes.append("hybrid model: the linear-attention layers' own LoRA modules are not "
                     "modelled")
    return LoraPool(shape, tuple(buffers), model.dtype_bytes, upper, tuple(notes))
