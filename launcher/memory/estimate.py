"""The memory budget of one SGLang server, estimated before launch. Pure: no I/O.

From the facts :mod:`launcher.sglang.modelfacts` reads (the model's config, its weight bytes,
the draft's, the GPUs' totals and what other processes hold), the SGLang version's rules and
the priors for what no config gives (:mod:`launcher.memory.priors`), it computes per GPU what a
start-up allocates, and chooses the first attempt's ``--mem-fraction-static`` / graph batch size
with a stated margin.

Public API (stable; ``fleetlearn`` builds on it)::

    estimate:  estimate(model, weights, gpus, shape, draft=None, draft_weights=None,
                        coeffs=DEFAULT_COEFFICIENTS) -> Estimate
               Estimate.at(mfs, bs) -> Budget          (per-GPU figures of one setting)
               Estimate.graphs_gib(bs), Estimate.activations_gib()
               Estimate.feasible_range(bs) -> (low, high) | None
    choice:    choose(estimate, configured: LaunchParams, margin=DEFAULT_MARGIN) -> Choice
    pictures:  Budget.gpus -> list[GpuBar]; GpuBar.as_dict() gives the ``memory`` JSON keys
               (total_gib, weights_gib, kv_gib, graphs_gib, activations_gib, other_gib, free_gib)
               observed_bar(numbers: Numbers, phase: str) -> Observed | None   (a failed log)

Host side: ``launcher.host.facts.read_facts`` reads the facts over a Transport;
``launcher.plan.first_attempt.plan_first_attempt(..., coeffs=...)`` applies the ledger-first rule.

All sizes are GiB (SGLang's "GB" in its logs is GiB); all per-rank figures are for one GPU of
the server. The formulas and where each comes from in SGLang's source (``sglang/srt/...`` of
0.5.10 and 0.5.23; docs/memory.md has the table):

- pre-load free memory ``pre`` = min over the server's GPUs of (total - other processes) - the
  CUDA context/NCCL buffers (``Coefficients.context_gib``). SGLang measures it after
  distributed init and takes the minimum over ranks (0.5.10
  ``model_runner_kv_cache_mixin.profile_max_num_token``'s ``pre_model_load_memory``; 0.5.23
  ``KVCacheConfigurator._profile_available_bytes``).
- KV pool = free after weights - ``pre`` x (1 - mfs); the headroom left for graphs and
  activations is exactly ``pre`` x (1 - mfs) (same functions). Per-token and per-request
  bytes: :mod:`launcher.sglang.modelfacts`; up to 0.5.15 the draft's pool (same #tokens) is
  taken from the headroom after the target's graphs, so the highest fraction solves
  ``need + (pre x - w) r <= pre (1 - x)``.
- hybrid state: the state cache takes ``rest x r/(1+r)`` (``--mamba-full-memory-ratio``
  r = 0.9) before the KV pool.
- LoRA: the adapters' memory pool is allocated after the weights and before the KV pool is
  sized, so it comes off the KV pool's rest (0.5.23 ``model_executor/model_runner.py:715-733``,
  0.5.10 ``model_runner.py:507-623``); its bytes per GPU: :mod:`launcher.sglang.lora`.
- graph batch sizes and the auto fraction: :mod:`launcher.sglang.autoargs`.
- CUDA graphs (a fixed part for the attention backend's buffers, by backend, + the activation
  pool of the largest captured batch + a per-graph cost), prefill graphs (0.5.23: 8 MiB per
  shape, 1.5 GiB for MLA: ``memory_hook.reserve_for_graph_mb``) and warmup activations are not
  computable from the config; :class:`~launcher.memory.priors.Coefficients` holds their prior
  (fitted to real start-ups, docs/memory.md), which the ledger's observations correct.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, replace

from launcher.memory.priors import DEFAULT_COEFFICIENTS, Coefficients
from launcher.params import LaunchParams
from launcher.sglang.autoargs import (
    FLASHINFER_FAMILY,
    SPEC_DEFAULT_MAX_RUNNING_REQUESTS,
    auto_chunked_prefill_size,
    auto_cuda_graph_max_bs,
    auto_mem_fraction_static,
    capture_bs_list,
    captured_sizes,
    default_attention_backend,
    flashinfer_workspace_bytes,
    prefill_graph_tokens,
)
from launcher.sglang.lora import LoraPool, LoraShape, lora_pool
from launcher.sglang.modelfacts import (
    GIB,
    GpuFacts,
    ModelFacts,
    NoEstimate,
    ServerShape,
    WeightFacts,
    draft_kv_bytes_per_token,
    dtype_bytes,
    mamba_cache_slots,
    mamba_slot_ratio,
)
from launcher.sglang.outcome import Numbers
from launcher.sglang.versions import (
    AUTO_TABLE_2_FROM,
    DRAFT_EXTEND_FULL_WIDTH_FROM,
    ONE_STATIC_BUDGET_FROM,
    at_least,
)

__all__ = [
    "DEFAULT_MARGIN",
    "KV_SHARE",
    "MIN_MARGIN_GIB",
    "Budget",
    "Choice",
    "Estimate",
    "GpuBar",
    "Observed",
    "choose",
    "estimate",
    "observed_bar",
]

# The first attempt keeps this share of the estimated graph + activation memory spare. The
# graph prior is fitted to real start-ups (docs/memory.md), so it errs both ways; the real
# decode passes run 0.6-2.0 times its figure. 0.5 is the smallest of {0.15, 0.3, 0.5, 0.75, 1}
# that starts >= 90% of bench_oom.py --estimator's scenarios cold on both truths (drawn and
# real; docs/benchmarks.md). It was 0.15 while the graph prior was ~4x too high.
DEFAULT_MARGIN = 0.5
# ... and at least this much (GiB), for small models whose estimate is tiny.
MIN_MARGIN_GIB = 0.25
# An unset graph bs is lowered until the KV pool gets at least this share of what weights leave.
KV_SHARE = 0.5


# --- the estimate ----------------------------------------------------------------------------


@dataclass(frozen=True)
class GpuBar:
    """One GPU's memory at one setting, in GiB: what ``plan``/``diagnose`` draw and put under
    ``memory`` in their JSON. ``kv_gib`` includes the hybrid state and the draft's pool;
    ``lora_gib`` is the LoRA adapters' pool (0 without LoRA); ``activations_gib`` the warmup
    activations; ``context_gib`` (CUDA context, NCCL) is drawn
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
    lora_gib: float = 0.0

    def as_dict(self) -> dict[str, float | int]:
        return {
            "gpu": self.index,
            "total_gib": round(self.total_gib, 2),
            "weights_gib": round(self.weights_gib, 2),
            "kv_gib": round(self.kv_gib, 2),
            "lora_gib": round(self.lora_gib, 2),
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
    lora_gib: float = 0.0  # the LoRA adapters' pool, per rank, taken before the KV pool

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
    lora: LoraPool | None = None  # the LoRA adapters' pool (None: LoRA off)

    @property
    def lora_gib(self) -> float:
        """The LoRA pool per rank (GiB), allocated before the KV pool is sized."""
        return self.lora.gib if self.lora is not None else 0.0

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

    @property
    def attention_backend(self) -> str:
        """``--attention-backend``, else the one SGLang picks for this model, GPU and version
        (:func:`launcher.sglang.autoargs.default_attention_backend`)."""
        s = self.shape
        if s.attention_backend:
            return s.attention_backend
        name = self.gpus[0].name if self.gpus else ""
        return default_attention_backend(
            name, s.sglang_version, mla=self.model.mla, arch=self.model.arch,
            spec_topk=s.spec.topk if s.spec is not None else None)

    def graph_fixed_gib(self) -> float:
        """The attention backend's buffers, allocated after the KV pool whether graphs are
        captured or not (:meth:`Coefficients.graph_fixed`; FlashInfer's wider workspace for the
        architectures that get one, :func:`launcher.sglang.autoargs.flashinfer_workspace_bytes`).
        """
        backend = self.attention_backend
        fixed = self.coeffs.graph_fixed(backend)
        if backend in FLASHINFER_FAMILY:
            fixed += (flashinfer_workspace_bytes(self.model.arch)
                      - flashinfer_workspace_bytes("")) / GIB
        return fixed

    def graphs_gib(self, bs: int) -> float:
        """CUDA-graph memory per rank for decode graph max ``bs`` (all capture passes, and the
        attention backend's buffers; with graphs disabled the buffers alone)."""
        s, m, c = self.shape, self.model, self.coeffs
        if s.disable_cuda_graph:
            return self.graph_fixed_gib() * c.graphs_scale
        spec = s.spec
        sizes = captured_sizes(bs, spec=spec is not None, cap=self.request_cap())
        top = sizes[-1]
        per_req = spec.num_draft_tokens if spec is not None else 1
        tokens = top * per_req
        per_token = (c.graph_gib_per_token_hidden * m.hidden_size
                     + c.graph_bytes_scale * m.graph_bytes_per_token(s.tp) / GIB)
        total = self.graph_fixed_gib() + per_token * tokens
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
                # eagle_worker_v2.py l.808-850; docs/memory.md, "The formulas": draft graphs).
                total += g * top * spec.topk + per_graph
            # Draft extend: the whole tree per request from 0.5.23, steps + 1 before
            # (DRAFT_EXTEND_FULL_WIDTH_FROM).
            width = (spec.num_draft_tokens if at_least(s.sglang_version,
                                                        DRAFT_EXTEND_FULL_WIDTH_FROM)
                     else spec.num_steps + 1)
            total += g * top * width + per_graph
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
        # 0.5.23 measures the rest after the draft's weights; 0.5.10 after the target's only.
        # The LoRA pool is allocated before the rest is measured: it comes off the KV pool.
        lora = self.lora_gib
        rest = pre - (weights if self.one_budget else self.weights_gib) - headroom - lora
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
        elif lora and weights + lora > pre:
            problem = (f"lora: weights {weights:.2f} + the LoRA pool {lora:.2f} GiB per GPU "
                       f"exceed the {pre:.2f} GiB free before loading")
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
            free = g.total_gib - other - ctx - weights - lora - kv - state - graphs - act
            bars.append(GpuBar(g.index, g.total_gib, weights, kv + state, graphs, act, other, ctx,
                               free, line, lora))
        return Budget(mfs, bs, pre, weights, kv, tokens, state, graphs, act, headroom, bars,
                      problem, draft_in_headroom, lora)

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
        low_w = (self.weights_gib + (self.draft_weights_gib if self.one_budget else 0.0)
                 + self.lora_gib)
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
    lora: LoraShape | None = None,
) -> Estimate:
    """The estimate for one server. ``gpus``: the server's GPUs (one per rank on this node).
    ``draft``/``draft_weights``: a separate draft checkpoint (EAGLE-3); without them, speculative
    decoding uses the checkpoint's own MTP layers (``model.nextn_layers``). ``lora``: the LoRA
    pool's shape (:func:`launcher.sglang.lora.resolve_lora`), None without LoRA. Raises
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
    pool = None
    if lora is not None:
        pool = lora_pool(model, lora, tp, shape.sglang_version)
        notes.append(pool.describe())
    return Estimate(
        model=model, shape=replace(shape, tp=tp), gpus=list(gpus), coeffs=coeffs,
        gpu_total_gib=total, context_gib=ctx, pre_load_free_gib=pre, weights_gib=w,
        draft_weights_gib=draft_gib * coeffs.weights_scale,
        kv_bytes_per_token=model.kv_bytes_per_token(tp, kv_b), draft_kv_bytes_per_token=draft_kv,
        state_bytes_per_req=state, weights_source=weights.source, notes=tuple(notes),
        lora=pool,
    )


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
    need = e.weights_gib + e.draft_weights_gib + e.lora_gib
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
    after_weights = e.pre_load_free_gib - e.weights_gib - e.draft_weights_gib - e.lora_gib
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
    return (f"weights {b.weights_gib:.2f} GiB/GPU, "
            + (f"LoRA pool {b.lora_gib:.2f} GiB (before the KV pool), " if b.lora_gib else "")
            + f"KV pool {b.kv_pool_gib:.2f} GiB "
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
    w = e.weights_gib + e.draft_weights_gib + e.lora_gib  # the LoRA pool is static like them
    conf_mfs, conf_bs = e.resolve(configured)
    what = "weights" + (" and the LoRA pool" if e.lora_gib else "")
    if pre <= 0 or w >= pre:
        return Choice(configured, False,
                      f"{what} alone need {w:.2f} GiB per GPU, {max(pre, 0):.2f} GiB is free "
                      f"before loading on the fullest GPU; fix: {_fix(e)}",
                      margin, e.at(conf_mfs, conf_bs))
    best = _best(e, start_bs if not keep_bs else conf_bs, margin)
    if best is None:
        lowest = 1
        min_kv = e.min_kv_gib + (0.0 if e.one_budget else
                                 e.shape.min_kv_tokens * e.draft_kv_bytes_per_token / GIB)
        need = w + min_kv + e.graphs_gib(lowest) + e.activations_gib()
        if need > pre:
            why = (f"no setting fits: {what} {w:.2f} GiB + the minimum KV pool {min_kv:.2f} "
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
