"""The simulated server's model and scenario: ``config.json`` read into a ``ModelSpec``, the
speculative and hybrid flags resolved the way SGLang resolves them, and ``scenario_for`` /
``scenario_from_argv``, which turn flags and model into the ``MemoryScenario`` that
:func:`launcher.sim.memory.simulate` plays. Errors SGLang reports before any GPU work are
``ConfigFailure``.

The model's ``"sim"`` object::

    weights_gib           whole model (each TP rank holds (weights_gib - replicated) / tp +
                          replicated, replicated by launcher.sglang.modelfacts's rule)
    kv_gib_per_1k_tokens  optional, whole model / tp: only for a config.json without the keys
                          launcher.sglang.modelfacts.ModelFacts needs; otherwise SGLang's cell
                          size is computed from the HF keys (MLA is not sharded by tp)
    graph_gib_per_bs      per rank: activation pool of the largest decode graph, per bs
                          (per captured token); or, SGLang-shaped, from the tensor keys below
    graph_bytes_whole     optional, bytes per captured token every rank holds whole (the
                          runner's input buffers, the fp32 logits buffer, the residual stream)
    graph_bytes_split     optional, bytes per captured token at tp 1 that tp divides (one
                          layer's transients, the lm_head output)
    graph_bytes_gathered  optional, bytes per captured token a rank holds only at tp > 1 (the
                          all-gathered logits)
    graph_pool_factor     optional: the graph pool's bytes per tensor byte (the caching
                          allocator and the graphs' private pool, set from a real capture
                          figure). With the graph_bytes_* keys, graph_gib_per_bs is
                          ``factor x (whole + split / tp + gathered [tp > 1]) + context x 4``
                          bytes per captured token: the last term is the attention backend's
                          graph state (FlashInfer's ``cuda_graph_kv_indices``, FA3's page
                          table: int32, the top graph's tokens x the context length)
    graph_overhead_gib    per rank, per captured graph
    warmup_gib            per rank: activations of the warmup prefill; or, SGLang-shaped:
    warmup_bytes_whole    optional, bytes per prefill token every rank holds (the residual
                          stream)
    warmup_bytes_split    optional, bytes per prefill token at tp 1 that tp divides (one layer's
                          transients). With both, warmup_gib is a chunked-prefill chunk's
                          tokens x (whole + split / tp)
    min_kv_tokens         a smaller pool is "Not enough memory"
    shard_gib             checkpoint shard size (whole model)
    attention_buffers_gib optional, per rank: the attention backend's buffers after the KV pool
                          (default: the real start-ups' figure for the backend SGLang picks,
                          :func:`attention_buffers_gib`; a seed whose logs' capture figures
                          already hold them sets 0)
    context_gib           optional, per rank: CUDA context + NCCL before weights (default: the
                          real start-ups' figure, ``launcher.memory.priors``: 1.07 GiB at tp 1,
                          + 0.1 per extra rank)
    prefill_graph_gib     optional, per rank: 0.5.23's prefill graphs, the largest shape's pool
    prefill_graph_overhead_gib  optional, per rank, per captured prefill shape
    mla                   optional bool: MLA attention (one ``KV size`` in the KV line)
    draft                 optional object: the MTP/NextN draft inside the checkpoint, used when
                          --speculative-draft-model-path is unset or the model path itself:
                          arch, weights_gib (whole model), and per rank
                          graph_gib_per_bs (draft graphs' pool per captured token) and
                          graph_overhead_gib. A separate draft directory (EAGLE, EAGLE-3) is
                          an ordinary sim model; its graph_gib_per_bs counts per captured
                          token, or, SGLang-shaped, its graph_bytes_* keys as above (at the
                          target's context length).
    hybrid                optional object: a Mamba / linear-attention hybrid; per rank and per
                          state slot conv_gib_per_req and ssm_gib_per_req (only for a config.json
                          without the linear-attention keys; otherwise SGLang's
                          Mamba2StateShape formula gives them), ssm_dtype (default
                          float32; --mamba-ssm-dtype bfloat16/float16 halves ssm), extra_buffer
                          (bool, default true: supports the extra_buffer strategy)
"""

from __future__ import annotations

import json
import os
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from launcher.memory.priors import DEFAULT_COEFFICIENTS
from launcher.params import LaunchParams
from launcher.sglang.autoargs import (
    FLASHINFER_FAMILY,
    auto_chunked_prefill_size,
    default_attention_backend,
    flashinfer_workspace_bytes,
)
from launcher.sglang.lora import (
    LoraAdapter,
    LoraFlags,
    LoraShape,
    adapter_shape,
    lora_pool,
    resolve_lora,
)
from launcher.sglang.modelfacts import (
    GIB,
    ModelFacts,
    NoEstimate,
    draft_kv_bytes_per_token,
    dtype_bytes,
)
from launcher.sglang.versions import DRAFT_EXTEND_SWITCH_FROM, at_least
from launcher.sim import hub, logfmt
from launcher.sim.cmdline import Flags
from launcher.sim.logfmt import Dialect
from launcher.sim.memory import HybridScenario, MemoryScenario, SpecScenario

_SIM_KEYS = {
    "weights_gib",
    "kv_gib_per_1k_tokens",
    "graph_gib_per_bs",
    "graph_bytes_whole",
    "graph_bytes_split",
    "graph_bytes_gathered",
    "graph_pool_factor",
    "graph_overhead_gib",
    "warmup_gib",
    "warmup_bytes_whole",
    "warmup_bytes_split",
    "min_kv_tokens",
    "shard_gib",
    "context_gib",
    "attention_buffers_gib",
    "prefill_graph_gib",
    "prefill_graph_overhead_gib",
    "mla",
    "draft",
    "hybrid",
}
_DRAFT_KEYS = {
    "arch",
    "weights_gib",
    "kv_gib_per_1k_tokens",
    "graph_gib_per_bs",
    "graph_overhead_gib",
}
_HYBRID_KEYS = {"conv_gib_per_req", "ssm_gib_per_req", "ssm_dtype", "extra_buffer"}


class ConfigFailure(Exception):
    """A failure SGLang reports from the main process before any GPU work (exit 1)."""

    def __init__(self, text: str) -> None:
        super().__init__(text)
        self.text = text


@dataclass(frozen=True)
class ModelSpec:
    """What the simulator reads from a model directory's config.json."""

    path: str
    model_type: str
    arch: str
    max_position_embeddings: int
    torch_dtype: str
    sim: dict[str, float]
    mla: bool = False
    draft: dict[str, Any] | None = None
    hybrid: dict[str, Any] | None = None
    # The HF config as launcher.sglang.modelfacts reads it: SGLang's per-token KV bytes, Mamba state
    # per slot and replicated weights follow from it (None: too few keys, the sim's figures
    # are used as given).
    facts: ModelFacts | None = None


def _facts(data: dict[str, Any]) -> ModelFacts | None:
    try:
        return ModelFacts.from_config(data)
    except NoEstimate:
        return None


def model_directory(path: str, revision: str | None = None, *, adapter: bool = False) -> Path:
    """The directory SGLang reads for the model path ``path`` (a model, a draft or a LoRA
    adapter): ``path`` itself when it is a directory, else, for a Hugging Face Hub id, its
    snapshot at ``revision`` in the HF cache of the server's environment
    (:mod:`launcher.sim.hub`; the simulator has no network). Raises ConfigFailure with the
    traceback SGLang prints: transformers' "We couldn't connect to 'https://huggingface.co'"
    OSError for a Hub id that is not cached (an ``adapter``, which SGLang's ``LoRAConfig``
    fetches with ``snapshot_download``: huggingface_hub's LocalEntryNotFoundError),
    huggingface_hub's repo id error otherwise."""
    p = Path(path)
    if p.is_dir():
        return p
    if not path.startswith(("/", ".", "~")) and path.count("/") == 1 and not p.exists():
        found = hub.snapshot(path, revision)
        if found is None and adapter:
            raise ConfigFailure(logfmt.config_error(
                logfmt.SNAPSHOT_OFFLINE if hub.offline() else logfmt.SNAPSHOT_UNREACHABLE))
        if found is None:
            raise ConfigFailure(logfmt.hf_offline_error())
        return found
    raise ConfigFailure(logfmt.hf_repo_id_error(path))


def load_model(path: str, revision: str | None = None) -> ModelSpec:
    """Read ``config.json`` of the model path ``path`` (:func:`model_directory`, at
    ``revision`` for a Hub id) the way transformers' AutoConfig fails on it.

    Raises ConfigFailure with the traceback SGLang prints (HF's OSError for a missing path or
    an uncached Hub id, ValueError for a directory without a usable config)."""
    p = model_directory(path, revision)
    unrecognized = ConfigFailure(
        logfmt.config_error(
            f"ValueError: Unrecognized model in {path}. Should have a `model_type` key in its "
            "config.json."
        )
    )
    cfg = p / "config.json"
    if not cfg.is_file():
        raise unrecognized
    try:
        data = json.loads(cfg.read_text())
    except (OSError, ValueError):
        raise ConfigFailure(
            logfmt.config_error(
                f"OSError: It looks like the config file at '{cfg}' is not a valid JSON file."
            )
        ) from None
    if not isinstance(data, dict) or "model_type" not in data:
        raise unrecognized
    sim = data.get("sim")
    if not isinstance(sim, dict) or "weights_gib" not in sim:
        raise ConfigFailure(
            logfmt.config_error(
                f'ValueError: {cfg} has no "sim" object with weights_gib: the SGLang simulator '
                "cannot size this model."
            )
        )
    unknown = {k for k in sim if not k.startswith("_")} - _SIM_KEYS
    if unknown:
        raise ConfigFailure(
            logfmt.config_error(f"ValueError: {cfg}: unknown sim keys {sorted(unknown)}")
        )
    objects: dict[str, dict[str, Any] | None] = {}
    for key, allowed in (("draft", _DRAFT_KEYS), ("hybrid", _HYBRID_KEYS)):
        obj = sim.get(key)
        if obj is not None and (not isinstance(obj, dict) or set(obj) - allowed):
            raise ConfigFailure(
                logfmt.config_error(
                    f"ValueError: {cfg}: sim.{key} must be an object with keys {sorted(allowed)}"
                )
            )
        objects[key] = obj
    archs = data.get("architectures") or ["LlamaForCausalLM"]
    return ModelSpec(
        path=path,
        model_type=str(data["model_type"]),
        arch=str(archs[0]),
        max_position_embeddings=int(data.get("max_position_embeddings", 4096)),
        torch_dtype=str(data.get("torch_dtype", "bfloat16")),
        sim={
            k: float(v)
            for k, v in sim.items()
            if not k.startswith("_") and k not in ("draft", "hybrid", "mla")
        },
        mla=bool(sim.get("mla", False)),
        draft=objects["draft"],
        hybrid=objects["hybrid"],
        facts=_facts(data),
    )


SPEC_EAGLE_FAMILY = ("EAGLE", "EAGLE3", "STANDALONE")
# Draft defaults (steps, topk, draft tokens) of _auto_choose_speculative_params.
SPEC_AUTO = (3, 1, 4)
SPEC_AUTO_LLAMA = (5, 4, 8)


@dataclass(frozen=True)
class Speculative:
    """Speculative decoding as SGLang resolves its flags, with the draft model's sizes."""

    algorithm: str  # EAGLE, EAGLE3 or STANDALONE (NEXTN is EAGLE)
    steps: int
    topk: int
    draft_tokens: int
    max_running_requests: int
    draft_arch: str
    draft: dict[str, Any]  # weights_gib, kv_gib_per_1k_tokens (whole model), graph_* (per rank)
    warnings: tuple[str, ...]
    draft_facts: ModelFacts | None = None  # a separate draft checkpoint's config (EAGLE-3)


def resolve_speculative(flags: Flags, model: ModelSpec, d: Dialect) -> Speculative | None:
    """``_handle_speculative_decoding``: NEXTN becomes EAGLE, max_running_requests 48 unless set,
    auto (steps, topk, draft tokens), and draft tokens = steps + 1 when topk is 1. The draft
    comes from --speculative-draft-model-path, or from the checkpoint (the model's sim.draft)
    when that is unset or the model path itself. Raises ConfigFailure for a missing draft."""
    algo = (flags.speculative_algorithm or "").upper()
    if algo == "NEXTN":
        algo = "EAGLE"
    if algo not in SPEC_EAGLE_FAMILY:
        return None
    warnings: list[str] = []
    mrr = flags.max_running_requests
    if mrr is None:
        mrr = 48
        warnings.append(logfmt.MAX_RUNNING_RESET)
    if not d.since(0, 5, 23):
        if os.environ.get("SGLANG_ENABLE_SPEC_V2", "").lower() in ("1", "true"):
            warnings.append(logfmt.SPEC_V2_ON)
            if flags.speculative_eagle_topk is not None and flags.speculative_eagle_topk > 1:
                raise ConfigFailure(
                    logfmt.server_args_error(
                        d,
                        "ValueError: Spec v2 currently only supports topk = 1 for speculative "
                        "decoding.",
                        func="_handle_speculative_decoding",
                        line=3008,
                        code="raise ValueError(",
                        via=(820, "self._handle_speculative_decoding()"),
                    )
                )
        else:
            warnings.append(logfmt.OVERLAP_DISABLED_SPEC_V1)
    steps, topk, tokens = (
        flags.speculative_num_steps,
        flags.speculative_eagle_topk,
        flags.speculative_num_draft_tokens,
    )
    if steps is None:
        auto = (
            SPEC_AUTO_LLAMA if model.arch in ("LlamaForCausalLM", "Grok1ForCausalLM") else SPEC_AUTO
        )
        steps, topk, tokens = auto
    topk = 1 if topk is None else topk
    tokens = steps + 1 if tokens is None else tokens
    if topk == 1 and tokens != steps + 1:
        warnings.append(logfmt.DRAFT_TOKENS_ADJUSTED)
        tokens = steps + 1
    path = flags.speculative_draft_model_path
    if path is None or Path(path) == Path(model.path):
        if model.draft is None:
            raise ConfigFailure(
                logfmt.config_error(
                    f"ValueError: {model.arch} has no draft head in its checkpoint: set "
                    "--speculative-draft-model-path for speculative decoding."
                )
            )
        draft = dict(model.draft)
        arch = str(draft.pop("arch", model.arch + "NextN"))
    else:
        draft_model = load_model(path, flags.speculative_draft_model_revision)
        arch = draft_model.arch
        draft = dict(draft_model.sim)
        return Speculative(
            algo, steps, topk, tokens, mrr, arch, draft, tuple(warnings), draft_model.facts
        )
    return Speculative(algo, steps, topk, tokens, mrr, arch, draft, tuple(warnings))


@dataclass(frozen=True)
class Hybrid:
    """A hybrid model's Mamba settings as SGLang resolves them."""

    strategy: str  # no_buffer, extra_buffer, extra_buffer_lazy
    overlap: bool


def resolve_hybrid(
    flags: Flags, model: ModelSpec, d: Dialect, spec: Speculative | None
) -> Hybrid | None:
    """The Mamba radix-cache strategy, and the errors SGLang's server args raise for it in the
    main process (ConfigFailure, exit 1): 0.5.10 ``_handle_mamba_radix_cache``, 0.5.23
    ``_mamba_radix_cache_resolution`` and ``validate_mamba_no_buffer``."""
    h = model.hybrid
    if h is None:
        return None
    supports_extra = bool(h.get("extra_buffer", True))
    strategy = flags.mamba_strategy
    if not d.since(0, 5, 23):
        strategy = "no_buffer" if strategy == "auto" else strategy
        if flags.disable_radix_cache:
            if strategy == "extra_buffer":
                raise ConfigFailure(
                    _args_error(
                        d,
                        "ValueError: mamba extra_buffer is not compatible with "
                        "--disable-radix-cache Overlap scheduling is already supported with "
                        "no_buffer + disable_radix_cache. Please use --mamba-scheduler-strategy "
                        "no_buffer instead.",
                        line=2167,
                    )
                )
            return Hybrid(strategy, overlap=False)
        if strategy == "no_buffer" and spec is not None:
            raise ConfigFailure(_args_error(d, logfmt.spec_no_buffer_error(model.arch), line=2206))
        return Hybrid(strategy, overlap=spec is None and strategy == "extra_buffer")
    overlap = not flags.disable_overlap_schedule
    if flags.disable_radix_cache:
        return Hybrid(strategy if strategy != "auto" else "no_buffer", overlap)
    if strategy == "auto":
        if overlap and supports_extra:
            strategy = "extra_buffer"
        else:
            strategy, overlap = "no_buffer", False
    if strategy == "no_buffer" and overlap:
        raise ConfigFailure(mamba_hook_error(logfmt.NO_BUFFER_OVERLAP))
    return Hybrid(strategy, overlap)


def _lora_adapter(entry: Any) -> LoraAdapter:
    """One parsed ``--lora-paths`` entry as ``check_lora_server_args`` reads it (0.5.23
    ``arg_groups/lora_hook.py:75-110``): a ``{"lora_name", "lora_path"}`` object, ``name=path``
    split at the first ``=``, or a path that is its own name."""
    if isinstance(entry, dict):
        return LoraAdapter(str(entry["lora_name"]), str(entry["lora_path"]))
    name, eq, path = str(entry).partition("=")
    return LoraAdapter(name, path) if eq else LoraAdapter(name, name)


def resolve_lora_shape(flags: Flags, model: ModelSpec, d: Dialect) -> LoraShape | None:
    """The LoRA pool's shape (None: LoRA off), as SGLang's ``LoRAManager`` resolves it
    (``launcher.sglang.lora.resolve_lora``), reading every adapter's ``adapter_config.json``
    like ``LoRAConfig`` does (``lora/lora_config.py``). A missing adapter directory or config,
    or one SGLang cannot use, is a ConfigFailure (exit 1) with the error SGLang raises."""
    adapters = [_lora_adapter(e) for e in flags.lora_paths or []]
    if flags.enable_lora is False or not (flags.enable_lora or adapters):
        return None
    targets = flags.lora_target_modules or None
    if not adapters and (flags.max_lora_rank is None or targets is None):
        raise ConfigFailure(logfmt.config_error(
            "AssertionError: When no initial --lora-paths is provided, you need to specify both "
            "--max-lora-rank and --lora-target-modules for LoRA initialization."))
    if model.facts is None:
        raise ConfigFailure(logfmt.config_error(
            f"ValueError: {model.path}/config.json lacks the HF keys the simulated LoRA pool "
            "needs"))
    configs = []
    for a in adapters:
        # LoRAConfig reads a Hub id's adapter_config.json through hf_hub_download (main)
        path = model_directory(a.path, adapter=True) / "adapter_config.json"
        try:
            configs.append(adapter_shape(json.loads(path.read_text()), a.path))
        except OSError:
            raise ConfigFailure(logfmt.config_error(
                f"FileNotFoundError: [Errno 2] No such file or directory: '{path}'")) from None
        except (ValueError, NoEstimate) as exc:
            raise ConfigFailure(logfmt.config_error(f"ValueError: {exc}")) from None
    lf = LoraFlags(tuple(adapters), flags.max_loras_per_batch, flags.max_lora_rank,
                   tuple(targets) if targets else None)
    try:
        return resolve_lora(lf, configs, model.facts, d.version)
    except NoEstimate as exc:
        raise ConfigFailure(logfmt.config_error(f"ValueError: {exc.why}")) from None


def _args_error(d: Dialect, final: str, *, line: int) -> str:
    return logfmt.server_args_error(
        d,
        final,
        func="_handle_mamba_radix_cache",
        line=line,
        code="raise ValueError(",
        via=(787, "self._handle_model_specific_adjustments()"),
    )


def mamba_hook_error(final: str) -> str:
    """The traceback 0.5.23 prints when its arg_groups/mamba_hook.py refuses a hybrid model's
    flags, ending in the message ``final`` (the AssertionError line)."""
    hooks = f"{logfmt.SGLANG_DIR}/srt/arg_groups"
    return (
        logfmt.traceback_text(
            [
                (
                    f"{logfmt.SGLANG_DIR}/launch_server.py",
                    24,
                    "<module>",
                    "server_args = prepare_server_args(sys.argv[1:])",
                ),
                (f"{hooks}/pipeline.py", 212, "run_post_processing", "hook(view)"),
                (
                    f"{hooks}/model_hook.py",
                    1076,
                    "_validate_mamba_strategy",
                    "validate_mamba_no_buffer(view, hf_config.architectures[0])",
                ),
                (
                    f"{hooks}/mamba_hook.py",
                    158,
                    "validate_mamba_no_buffer",
                    "assert view.disable_overlap_schedule, (",
                ),
            ],
            final,
        )
        + "\n"
    )


def kv_gib_per_1k(
    model: ModelSpec, tp: int, version: str, flags: Flags | None, spec: Speculative | None
) -> tuple[float, float]:
    """(target, draft) KV GiB per 1000 tokens on one rank, by SGLang's cell size
    (``launcher.sglang.modelfacts``: MHA/GQA ``max(1, kv_heads // tp)`` heads, MLA not sharded by
    tp, the draft's cell from the target's). Without usable config keys: the model's
    ``sim.kv_gib_per_1k_tokens`` (whole model) / tp."""
    s = model.sim
    facts = model.facts
    dr = spec.draft if spec is not None else {}
    if facts is None:
        return (
            s.get("kv_gib_per_1k_tokens", 0.1) / tp,
            float(dr.get("kv_gib_per_1k_tokens", 0.0)) / tp,
        )
    kv_flag = flags.kv_cache_dtype if flags is not None else "auto"
    kv_b = dtype_bytes(None if kv_flag == "auto" else kv_flag, facts.dtype_bytes)
    target = facts.kv_bytes_per_token(tp, kv_b) * 1000 / GIB
    if spec is None:
        return target, 0.0
    if spec.draft_facts is None and facts.nextn_layers <= 0:
        return target, float(dr.get("kv_gib_per_1k_tokens", 0.0)) / tp
    draft = draft_kv_bytes_per_token(facts, tp, kv_b, version, spec.draft_facts)
    return target, draft * 1000 / GIB


# The attention backend's CUDA-graph state per captured token and context position: int32
# (FlashInfer ``init_cuda_graph_state``: ``cuda_graph_kv_indices`` of ``max_num_tokens x
# max_context_len``; FA3: ``page_table`` of ``max_bs x max_num_pages`` at page size 1).
ATTN_GRAPH_STATE_BYTES = 4


def graph_gib_per_token(sim: dict[str, float], tp: int, context_len: int) -> float | None:
    """Per rank, GiB per captured token of the decode graphs' pool, SGLang-shaped, from the
    model's ``graph_bytes_*`` truths (None without them): ``graph_pool_factor x (whole + split
    / tp + gathered at tp > 1)`` plus the attention backend's graph state."""
    if "graph_bytes_whole" not in sim:
        return None
    tensors = (sim["graph_bytes_whole"] + sim.get("graph_bytes_split", 0.0) / tp
               + (sim.get("graph_bytes_gathered", 0.0) if tp > 1 else 0.0))
    per_token = sim.get("graph_pool_factor", 1.0) * tensors + ATTN_GRAPH_STATE_BYTES * context_len
    return per_token / GIB


def warmup_gib_for(sim: dict[str, float], tp: int, chunk: int) -> float | None:
    """Per rank, the warmup prefill's activations, SGLang-shaped, from the model's
    ``warmup_bytes_*`` truths (None without them): a chunk's tokens x (whole + split / tp)."""
    if "warmup_bytes_whole" not in sim:
        return None
    return chunk * (sim["warmup_bytes_whole"] + sim.get("warmup_bytes_split", 0.0) / tp) / GIB


def scenario_for(
    model: ModelSpec,
    gpu_total_gib: float,
    tp: int,
    other_used_gib: float,
    version: str,
    *,
    flags: Flags | None = None,
    spec: Speculative | None = None,
    hybrid: Hybrid | None = None,
    gpu_name: str = "",
    lora: LoraShape | None = None,
) -> MemoryScenario:
    """The memory scenario of one server of ``model`` at ``tp`` on GPUs of ``gpu_total_gib``
    (with ``flags``:
    its chunk size, context length, request cap, graphs on/off, speculative decoding and
    Mamba settings). ``gpu_name`` (nvidia-smi's) picks the attention backend as SGLang does,
    whose buffers take the real start-ups' figures (:func:`attention_buffers_gib`). ``lora``:
    the LoRA pool's shape (:func:`resolve_lora_shape`), its bytes per rank from
    ``launcher.sglang.lora.lora_pool``."""
    s = model.sim
    base = MemoryScenario(gpu_total_gib=gpu_total_gib, weights_gib=s["weights_gib"])
    kv_target, kv_draft = kv_gib_per_1k(model, tp, version, flags, spec)
    context_len = (
        (flags.context_length if flags is not None else None) or model.max_position_embeddings
    )
    spec_s: SpecScenario | None = None
    if spec is not None:
        dr = spec.draft
        # A separate draft with the graph_bytes_* keys is SGLang-shaped like a target: its pool
        # per captured token from its tensors at this tp, plus the draft attention backends'
        # graph state at the target's context length (the draft runs with the target's).
        draft_graph = graph_gib_per_token(
            {k: float(v) for k, v in dr.items() if isinstance(v, int | float)}, tp, context_len
        )
        spec_s = SpecScenario(
            algorithm=spec.algorithm,
            num_steps=spec.steps,
            topk=spec.topk,
            num_draft_tokens=spec.draft_tokens,
            max_running_requests=spec.max_running_requests,
            draft_weights_gib=float(dr.get("weights_gib", 0.0)) / tp,
            draft_kv_gib_per_1k_tokens=kv_draft,
            draft_graph_gib_per_token=(
                draft_graph if draft_graph is not None else float(dr.get("graph_gib_per_bs", 0.002))
            ),
            draft_graph_overhead_gib=float(dr.get("graph_overhead_gib", 0.005)),
            # Its attention-state share, which draft decode holds once per step.
            draft_attn_state_gib_per_token=(
                ATTN_GRAPH_STATE_BYTES * context_len / GIB if draft_graph is not None else 0.0
            ),
            draft_extend_graph=not (
                at_least(version, DRAFT_EXTEND_SWITCH_FROM)
                and os.environ.get("SGLANG_DISABLE_DRAFT_EXTEND_CUDA_GRAPH", "").lower()
                in ("1", "true")
            ),
        )
    hybrid_s: HybridScenario | None = None
    if hybrid is not None and model.hybrid is not None and flags is not None:
        h = model.hybrid
        conv = float(h.get("conv_gib_per_req", 0.0))
        ssm = float(h.get("ssm_gib_per_req", 0.0))
        model_ssm_dtype = str(h.get("ssm_dtype", "float32"))
        if model.facts is not None and model.facts.hybrid is not None:
            # Mamba2StateShape.create + mamba_cache_per_req (launcher.sglang.modelfacts)
            conv_b, ssm_b = model.facts.hybrid.per_req_bytes(tp)
            conv, ssm = conv_b / GIB, ssm_b / GIB
            model_ssm_dtype = "float32" if model.facts.hybrid.ssm_dtype_bytes == 4 else "bfloat16"
        if flags.mamba_ssm_dtype in ("bfloat16", "float16") and model_ssm_dtype == "float32":
            ssm /= 2
        hybrid_s = HybridScenario(
            conv_gib_per_req=conv,
            ssm_gib_per_req=ssm,
            strategy=hybrid.strategy,
            overlap=hybrid.overlap,
            max_mamba_cache_size=flags.max_mamba_cache_size,
            mamba_full_memory_ratio=flags.mamba_full_memory_ratio or 0.9,
            disable_radix_cache=flags.disable_radix_cache,
        )
    chunk = flags.chunked_prefill_size if flags is not None else None
    graph_per_bs = graph_gib_per_token(s, tp, context_len)
    warmup = warmup_gib_for(
        s, tp, chunk if chunk and chunk > 0 else auto_chunked_prefill_size(gpu_total_gib, version)
    )
    return MemoryScenario(
        gpu_total_gib=gpu_total_gib,
        weights_gib=s["weights_gib"],
        tp=tp,
        other_used_gib=other_used_gib,
        # unless the model's seed says otherwise, the real start-ups' figure (the prior's)
        context_gib=s.get("context_gib", DEFAULT_COEFFICIENTS.context(tp)),
        kv_gib_per_1k_tokens=kv_target,
        min_kv_tokens=int(s.get("min_kv_tokens", base.min_kv_tokens)),
        graph_gib_per_bs=(
            graph_per_bs
            if graph_per_bs is not None
            else s.get("graph_gib_per_bs", base.graph_gib_per_bs)
        ),
        graph_overhead_gib=s.get("graph_overhead_gib", base.graph_overhead_gib),
        warmup_gib=warmup if warmup is not None else s.get("warmup_gib", base.warmup_gib),
        shard_gib=s.get("shard_gib", base.shard_gib),
        sglang_version=version,
        prefill_graph_gib=s.get("prefill_graph_gib", 0.0),
        prefill_graph_overhead_gib=s.get("prefill_graph_overhead_gib", 0.0),
        chunked_prefill_size=flags.chunked_prefill_size if flags is not None else None,
        spec=spec_s,
        hybrid=hybrid_s,
        max_running_requests=(
            spec.max_running_requests
            if spec is not None
            else (flags.max_running_requests if flags is not None else None)
        ),
        context_len=context_len,
        capture_graphs=not (flags is not None and flags.disable_cuda_graph),
        attention_buffers_gib=float(s["attention_buffers_gib"]) if "attention_buffers_gib" in s
        else attention_buffers_gib(
            model, version, gpu_name, flags.attention_backend if flags is not None else None,
            spec.topk if spec is not None else None),
        mla=model.mla,
        replicated_gib=model.facts.replicated_bytes(tp) / GIB if model.facts is not None else 0.0,
        lora_gib=(lora_pool(model.facts, lora, tp, version).gib
                  if lora is not None and model.facts is not None else 0.0),
    )


def attention_buffers_gib(
    model: ModelSpec, version: str, gpu_name: str, backend: str | None, spec_topk: int | None
) -> float:
    """The attention backend's buffers on one rank: ``--attention-backend`` or SGLang's default
    for the model, GPU and version (``launcher.sglang.autoargs.default_attention_backend``),
    sized by the figures the real start-ups gave (``launcher.memory.priors``: FA3 0.10 GiB,
    FlashInfer 0.57 GiB, the 128 MiB wider FlashInfer workspace of Qwen2/Qwen3), so the
    simulator's capture begins where a real one does."""
    chosen = backend or default_attention_backend(gpu_name, version, mla=model.mla,
                                                  arch=model.arch, spec_topk=spec_topk)
    gib = DEFAULT_COEFFICIENTS.graph_fixed(chosen)
    if chosen in FLASHINFER_FAMILY:
        gib += (flashinfer_workspace_bytes(model.arch) - flashinfer_workspace_bytes("")) / GIB
    return gib


def scenario_from_argv(
    version: str, argv: Sequence[str], gpu_total_gib: float, other_used_gib: float = 0.0
) -> tuple[MemoryScenario, LaunchParams]:
    """The scenario and the (unresolved) params a sim server started with ``argv`` (SGLang
    flags) under ``SGLANG_SIM_VERSION=version`` runs; for tests and benchmarks. Raises
    ConfigFailure as the server would (exit 1); argparse errors exit 2."""
    d = Dialect(version)
    flags = Flags.parse(d, argv)
    model = load_model(flags.model_path, flags.revision)
    spec = resolve_speculative(flags, model, d) if flags.speculative_algorithm else None
    hybrid = resolve_hybrid(flags, model, d, spec)
    scenario = scenario_for(
        model,
        gpu_total_gib,
        flags.tp,
        other_used_gib,
        version,
        flags=flags,
        spec=spec,
        hybrid=hybrid,
        lora=resolve_lora_shape(flags, model, d),
    )
    return scenario, LaunchParams(flags.mem_fraction_static, flags.graph_bs)
