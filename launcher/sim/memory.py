"""Pure GPU memory model of SGLang's start-up: the physics of the simulator.

It follows SGLang's own arithmetic (docs/sglang.md, "Memory"):

- ``pre`` = free memory on the busiest GPU after CUDA/NCCL init, before weights
  ("Load weight begin. avail mem=pre"). SGLang takes the minimum over ranks.
- Weights load shard by shard; each rank holds ``(weights - replicated) / tp + replicated``.
  Not fitting is an OOM during weight load, which no mem-fraction can fix.
- KV pool = free after weights - pre x (1 - mem_fraction_static). A pool <= 0 is SGLang's
  "Not enough memory. Please try to increase --mem-fraction-static"; so is a pool below the
  scenario's minimum token count.
- What is left after the pool is exactly ``pre x (1 - mfs)``: the attention backend's buffers
  (``attention_buffers_gib``, allocated by ``init_attention_backend`` before capture, also
  without graphs; the real start-ups' figures, FA3 0.10 GiB, FlashInfer 0.57 GiB), CUDA graphs
  and warmup activations must fit in it. Graphs are captured largest batch size first: the
  first capture allocates the activation pool for ``max_bs``, every captured graph adds a small
  overhead.
- Warmup needs ``warmup_gib`` of transient activations after capture.

A setting (mfs, bs) is therefore feasible iff ``low < mfs <= high(bs)`` where
``low = (w + min_kv)/pre`` and ``high(bs) = 1 - (graph(bs) + warmup)/pre``.

CUDA graphs are captured in passes (:class:`GraphPass`), each taking memory from what the
previous one left; SGLang logs a ``Capture ... begin ... avail mem=X`` line per pass:

- 0.5.23: target prefill (shapes by token count), then target decode, or target verify with
  speculative decoding, then draft prefill (the breakable prefill backend, CUDA's default), draft
  decode (only when ``--speculative-num-steps`` > 1), then draft extend (skipped with
  ``SGLANG_DISABLE_DRAFT_EXTEND_CUDA_GRAPH=1``). The draft's weights load
  right after the target's and the draft KV pool shares the static budget
  (``model_executor/pool_configurator.py``: the draft's per-token bytes join the cell size).
- up to 0.5.15: the whole target (weights, KV pool, decode/verify graph), then the whole draft
  (weights, a KV pool with the same #tokens, taken from the headroom, then its graphs).

Speculative decoding (:class:`SpecScenario`) caps the captured batch sizes at
``max_running_requests`` (48 unless set). Verify and draft-extend graphs scale with
``max_bs x num_draft_tokens``. Draft decode runs its ``steps - 1`` forwards one after another on
``max_bs x topk`` tokens inside one graph, so its activation pool is one step's; only the
attention backend's graph state is per step (:meth:`MemoryScenario.draft_passes`).
Hybrid models (:class:`HybridScenario`) carve the Mamba state cache out of the KV budget
first (0.5.10 ``model_runner_kv_cache_mixin.handle_max_mamba_cache``; 0.5.23
``KVCacheConfigurator._handle_max_mamba_cache`` and ``resolve_max_num_reqs``).
Everything here is pure and deterministic; the simulator prints these numbers and the
benchmarks/property tests use the same functions as ground truth.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field, replace

from launcher.params import LaunchParams
from launcher.sglang.autoargs import (
    SPEC_DEFAULT_MAX_RUNNING_REQUESTS,
    auto_chunked_prefill_size,
    auto_cuda_graph_max_bs,
    auto_mem_fraction_static,
    captured_sizes,
    prefill_graph_tokens,
)
from launcher.sglang.modelfacts import mamba_cache_slots, mamba_slot_ratio
from launcher.sglang.outcome import Outcome
from launcher.sglang.phases import Phase
from launcher.sglang.versions import (
    DEFAULT_VERSION,
    DRAFT_EXTEND_FULL_WIDTH_FROM,
    DRAFT_KV_INDICES_TOPK_FROM,
    ONE_STATIC_BUDGET_FROM,
    at_least,
)


@dataclass(frozen=True)
class SpecScenario:
    """Speculative decoding (EAGLE family), resolved as SGLang resolves the flags. Per rank."""

    algorithm: str  # EAGLE, EAGLE3 or STANDALONE (NEXTN resolves to EAGLE)
    num_steps: int
    topk: int
    num_draft_tokens: int
    max_running_requests: int = SPEC_DEFAULT_MAX_RUNNING_REQUESTS
    draft_weights_gib: float = 0.5
    draft_kv_gib_per_1k_tokens: float = 0.0
    draft_graph_gib_per_token: float = 0.002  # activation pool per captured token, draft graphs
    draft_graph_overhead_gib: float = 0.005  # per captured draft graph
    # The part of ``draft_graph_gib_per_token`` that is the attention backend's graph state
    # (4 B per context position, ``launcher.sim.model.ATTN_GRAPH_STATE_BYTES``): set for
    # tensor-derived drafts, 0 for fitted figures (which hold one step's state in the per-token
    # figure). Draft decode keeps it per step.
    draft_attn_state_gib_per_token: float = 0.0
    draft_extend_graph: bool = True  # False: SGLANG_DISABLE_DRAFT_EXTEND_CUDA_GRAPH=1 (0.5.23)


@dataclass(frozen=True)
class HybridScenario:
    """The Mamba / linear-attention state cache of a hybrid model. Per rank, GiB per slot."""

    conv_gib_per_req: float
    ssm_gib_per_req: float
    strategy: str = "no_buffer"  # resolved: no_buffer, extra_buffer, extra_buffer_lazy
    overlap: bool = False  # overlap schedule on (0.5.23 adds tracking slots with extra_buffer)
    max_mamba_cache_size: int | None = None
    mamba_full_memory_ratio: float = 0.9
    disable_radix_cache: bool = False

    @property
    def per_req_gib(self) -> float:
        return self.conv_gib_per_req + self.ssm_gib_per_req

    def ratio(self) -> int:
        """0.5.23's state slots per request (``sglang.modelfacts.mamba_slot_ratio``)."""
        return mamba_slot_ratio(self.strategy, self.overlap,
                                disable_radix_cache=self.disable_radix_cache)


@dataclass(frozen=True)
class GraphPass:
    """One CUDA-graph capture pass: its name, the sizes it captures (ascending; token counts
    for prefill) and (size, GiB) per capture step in capture order (largest first)."""

    # target_prefill, target_decode, target_verify, draft_prefill, draft_decode, draft_extend
    name: str
    sizes: list[int]
    tokens_per_req: int
    allocations: list[tuple[int, float]]

    @property
    def draft(self) -> bool:
        return self.name.startswith("draft")

    @property
    def total_gib(self) -> float:
        return sum(a for _, a in self.allocations)


def _pass(name: str, sizes: list[int], per_req: int, first: float, over: float) -> GraphPass:
    steps = list(reversed(sizes))
    allocs = [(b, (first if i == 0 else 0.0) + over) for i, b in enumerate(steps)]
    return GraphPass(name, sizes, per_req, allocs)


@dataclass(frozen=True)
class MemoryScenario:
    """One server on one kind of GPU. All sizes GiB; per-rank unless said otherwise."""

    gpu_total_gib: float  # capacity of each GPU
    weights_gib: float  # the whole model; a TP rank holds (weights - replicated)/tp + replicated
    tp: int = 1
    other_used_gib: float = 0.0  # held by other processes on the busiest GPU of the server
    context_gib: float = 1.0  # CUDA context + NCCL buffers before weight load
    kv_gib_per_1k_tokens: float = 0.1
    min_kv_tokens: int = 0  # below this many tokens SGLang refuses ("pool too small")
    graph_gib_per_bs: float = 0.02  # activations of the largest decode graph, per unit of bs
    graph_overhead_gib: float = 0.01  # per captured graph
    warmup_gib: float = 0.5  # transient activations of the warmup prefill
    shard_gib: float = 4.6  # checkpoint shard size (whole model)
    sglang_version: str = DEFAULT_VERSION
    # 0.5.23's prefill graphs: the activation pool of the largest shape, plus a per-shape cost
    prefill_graph_gib: float = 0.0
    prefill_graph_overhead_gib: float = 0.0
    chunked_prefill_size: int | None = None  # None: SGLang's auto value for the GPU
    spec: SpecScenario | None = None
    hybrid: HybridScenario | None = None
    max_running_requests: int | None = None  # --max-running-requests (spec: its resolved cap)
    context_len: int = 4096
    capture_graphs: bool = True  # False: --disable-cuda-graph
    # The attention backend's buffers, allocated after the KV pool and before capture (also
    # with graphs disabled): the real start-ups' figures, ``launcher.memory.priors``
    # (FA3 0.10 GiB, FlashInfer 0.57 GiB); 0 for a scenario drawn without a backend.
    attention_buffers_gib: float = 0.0
    mla: bool = False  # MLA attention (0.5.23's auto fraction reserves 1.5 GiB of prefill graphs)
    # weights every rank holds whole (MLA's q_a/kv_a projections, the MoE router, K/V heads when
    # kv_heads < tp): ``launcher.sglang.modelfacts.ModelFacts.replicated_bytes``
    replicated_gib: float = 0.0
    # The LoRA adapters' pool (``launcher.sglang.lora``), allocated right after the target's
    # weights and before the KV pool is sized (0.5.23 ``model_runner.py:715-733``, 0.5.10
    # ``model_runner.py:507-623``): it comes out of the KV pool's rest.
    lora_gib: float = 0.0

    @property
    def pre_load_free_gib(self) -> float:
        return self.gpu_total_gib - self.other_used_gib - self.context_gib

    @property
    def weights_per_rank_gib(self) -> float:
        if self.tp <= 1:
            return self.weights_gib
        return (self.weights_gib - self.replicated_gib) / self.tp + self.replicated_gib

    def resolve(self, params: LaunchParams) -> tuple[float, int]:
        """The (mem_fraction_static, cuda_graph_max_bs) SGLang would run with."""
        bs = params.cuda_graph_max_bs
        if bs is None:
            bs = auto_cuda_graph_max_bs(self.gpu_total_gib, self.tp, self.sglang_version)
        mfs = params.mem_fraction_static
        if mfs is None:
            mfs = auto_mem_fraction_static(
                self.gpu_total_gib,
                self.tp,
                self.sglang_version,
                bs,
                speculative_algorithm=self.spec.algorithm if self.spec is not None else None,
                mla=self.mla,
            )
        return mfs, bs

    @property
    def new_order(self) -> bool:
        """0.5.23's start-up order: draft weights right after the target's, one static budget."""
        return at_least(self.sglang_version, ONE_STATIC_BUDGET_FROM)

    @property
    def request_cap(self) -> int | None:
        """The request pool size that clamps the captured batch sizes."""
        if self.spec is not None:
            return self.spec.max_running_requests
        return self.max_running_requests

    def prefill_tokens(self) -> list[int]:
        chunk = self.chunked_prefill_size or auto_chunked_prefill_size(
            self.gpu_total_gib, self.sglang_version
        )
        return prefill_graph_tokens(min(8192, chunk))

    def graph_allocations(self, max_bs: int) -> list[tuple[int, float]]:
        """(bs, GiB allocated) per capture step of the target decode (or verify) graph, in
        capture order (largest bs first)."""
        return self.decode_pass(max_bs).allocations

    def decode_pass(self, max_bs: int, cap: int | None = None) -> GraphPass:
        """The target's decode graph, or its verify graph under speculative decoding: the
        activation pool grows with ``max captured bs x tokens per request``."""
        spec = self.spec
        sizes = captured_sizes(max_bs, spec=spec is not None, cap=cap or self.request_cap)
        per_req = spec.num_draft_tokens if spec is not None else 1
        name = "target_verify" if spec is not None else "target_decode"
        first = self.graph_gib_per_bs * sizes[-1] * per_req
        return _pass(name, sizes, per_req, first, self.graph_overhead_gib)

    def target_passes(self, max_bs: int, cap: int | None = None) -> list[GraphPass]:
        """The target's capture passes in order (0.5.23 captures prefill graphs first)."""
        if not self.capture_graphs:
            return []
        passes = []
        if self.new_order:
            tokens = self.prefill_tokens()
            if tokens:
                passes.append(
                    _pass(
                        "target_prefill",
                        tokens,
                        1,
                        self.prefill_graph_gib,
                        self.prefill_graph_overhead_gib,
                    )
                )
        passes.append(self.decode_pass(max_bs, cap))
        return passes

    def draft_passes(self, max_bs: int, cap: int | None = None) -> list[GraphPass]:
        """The draft's capture passes: 0.5.23's draft prefill (prefill shapes, per-shape cost
        only), draft decode (steps > 1), then draft extend (``bs x num_draft_tokens`` from
        0.5.23, ``bs x (steps + 1)`` on 0.5.10: ``DRAFT_EXTEND_FULL_WIDTH_FROM``).

        Draft decode: one graph holds all steps, but ``draft_forward`` (0.5.10
        ``eagle_worker.py:622-700``, loop l.652; 0.5.23 ``eagle_worker_v2.py:742-923``, loop
        l.808) runs the ``steps - 1`` forwards one after another on ``bs x topk`` tokens (the
        runner's ``num_tokens_per_bs = topk``; 0.5.23 logs ``num_tokens_per_req={topk}``) and
        keeps only small per-step lists, so the graph pool (which reuses blocks freed during
        capture) peaks at one step's activations: ``bs x topk`` tokens (0.5.23's per-step
        ``draft_probs_list`` exists only with rejection sampling, off by default). The attention
        backend's graph state is allocated per step before capture
        (``draft_attn_backend.init_cuda_graph_state`` in the runner's ``__init__``, inside the
        pass's begin/end lines): FlashInfer's ``(steps, max_bs x topk x context)`` int32 on
        0.5.23, ``(steps, max_bs x context)`` on 0.5.10 (``DRAFT_KV_INDICES_TOPK_FROM``).
        Fitted drafts (no attention term) are charged one step at ``bs x topk``. The runner's
        int64 input buffers (``out_cache_loc`` of ``max_bs x topk x steps``, positions, ids),
        allocated in its ``__init__`` outside the graph pool, are a few KiB and not modelled;
        every captured graph adds ``draft_graph_overhead_gib``."""
        spec = self.spec
        if spec is None or not self.capture_graphs:
            return []
        sizes = captured_sizes(max_bs, spec=True, cap=cap or self.request_cap)
        top = sizes[-1]
        passes = []
        if self.new_order:
            # eagle_worker_v2.init_cuda_graphs: the draft's prefill graph (breakable backend,
            # the CUDA default) comes first, with the target's shapes.
            tokens = self.prefill_tokens()
            if tokens:
                passes.append(
                    _pass("draft_prefill", tokens, 1, 0.0, self.prefill_graph_overhead_gib)
                )
        g, over = spec.draft_graph_gib_per_token, spec.draft_graph_overhead_gib
        if spec.num_steps > 1:
            attn = spec.draft_attn_state_gib_per_token
            state_width = (spec.topk if at_least(self.sglang_version, DRAFT_KV_INDICES_TOPK_FROM)
                           else 1)
            one_step = (g - attn) * top * spec.topk
            first = one_step + attn * top * state_width * spec.num_steps
            passes.append(_pass("draft_decode", sizes, spec.topk, first, over))
        if spec.draft_extend_graph:
            width = (spec.num_draft_tokens
                     if at_least(self.sglang_version, DRAFT_EXTEND_FULL_WIDTH_FROM)
                     else spec.num_steps + 1)
            first = g * top * width
            passes.append(_pass("draft_extend", sizes, width, first, over))
        return passes

    def graph_passes(self, max_bs: int, cap: int | None = None) -> list[GraphPass]:
        """Every capture pass in SGLang's order; ``cap``: the resolved request pool size when
        it is below ``request_cap`` (0.5.23 hybrid models, capped by the state cache)."""
        return [*self.target_passes(max_bs, cap), *self.draft_passes(max_bs, cap)]

    def graph_total_gib(self, max_bs: int) -> float:
        return sum(p.total_gib for p in self.graph_passes(max_bs))

    def min_kv_gib(self) -> float:
        return self.min_kv_tokens / 1000 * self.kv_gib_per_1k_tokens

    def feasible_range(self, max_bs: int) -> tuple[float, float] | None:
        """(low, high): feasible fractions are low < mfs <= high. None when weights don't fit
        or no fraction works. Closed form for a plain model; found with :func:`simulate`
        (to 1e-5) for speculative decoding and hybrid models."""
        pre = self.pre_load_free_gib
        w = self.weights_per_rank_gib
        if pre <= 0 or self.weights_fail():
            return None
        if self.spec is not None or self.hybrid is not None:
            return self._feasible_by_search(max_bs)
        low = (w + self.lora_gib + self.min_kv_gib()) / pre
        high = 1 - (self.attention_buffers_gib + self.graph_total_gib(max_bs)
                    + self.warmup_gib) / pre
        return (low, high) if high > low else None

    def _feasible_by_search(self, max_bs: int) -> tuple[float, float] | None:
        """The feasible interval by simulation: a grid of 0.005 (0.001 if that finds none),
        then bisection of both edges."""
        ok: list[float] = []
        step = 0.005
        for step in (0.005, 0.001):
            grid = [i * step for i in range(1, round(1 / step))]
            ok = [m for m in grid if simulate(self, _params(m, max_bs)).ok]
            if ok:
                break
        if not ok:
            return None
        lo_ok, hi_ok = ok[0], ok[-1]

        def edge(good: float, bad: float) -> float:
            for _ in range(40):
                mid = (good + bad) / 2
                if simulate(self, _params(mid, max_bs)).ok:
                    good = mid
                else:
                    bad = mid
            return good

        low = edge(lo_ok, max(lo_ok - step, 0.0)) - 1e-9
        high = edge(hi_ok, min(hi_ok + step, 1.0))
        return (max(low, 0.0), high) if high > low else None

    def weights_fail(self) -> bool:
        return self.shard_allocations()[-1][1] < 0

    def shard_allocations(self) -> list[tuple[float, float]]:
        """(GiB allocated, GiB free after) per shard for one rank."""
        n = max(1, math.ceil(self.weights_gib / self.shard_gib))
        per = self.weights_per_rank_gib / n
        free = self.pre_load_free_gib
        out = []
        for _ in range(n):
            free -= per
            out.append((per, free))
        return out


@dataclass(frozen=True)
class Failure:
    """Where and how the arithmetic says SGLang fails."""

    outcome: Outcome
    phase: Phase
    tried_gib: float | None = None
    free_gib: float | None = None
    min_mem_fraction: float | None = None  # the fraction SGLang would need (kv_too_small)
    step: int | None = None  # index of the failing shard or capture step (within its pass)
    graph_pass: str | None = None  # the capture pass that failed (GraphPass.name)
    draft: bool = False  # the failure is in the draft model's weights or KV pool (0.5.10 order)
    # SGLang's own error instead of the generic one: "hybrid_state_memory" (0.5.23 "Not enough
    # GPU memory for hybrid ... state cache"), "hybrid_too_small" ("... too small to serve any
    # requests"); their figures are in ``detail``.
    kind: str | None = None
    detail: dict[str, float] = field(default_factory=dict)


@dataclass(frozen=True)
class PassTrace:
    """One capture pass as it ran: free memory at its begin line, per step, at its end."""

    name: str
    sizes: list[int]
    tokens_per_req: int
    begin_free_gib: float
    steps: list[tuple[int, float]] = field(default_factory=list)  # (size, free before)
    end_free_gib: float | None = None  # None: the pass failed

    @property
    def mem_gib(self) -> float | None:
        return None if self.end_free_gib is None else self.begin_free_gib - self.end_free_gib

    @property
    def draft(self) -> bool:
        return self.name.startswith("draft")


@dataclass(frozen=True)
class MambaAlloc:
    """The Mamba state cache SGLang allocates (``Mamba Cache is allocated. ...``). GiB."""

    max_mamba_cache_size: int
    conv_gib: float
    ssm_gib: float
    intermediate_ssm_gib: float | None = None  # only with speculative decoding
    intermediate_conv_gib: float | None = None

    @property
    def total_gib(self) -> float:
        return (
            self.conv_gib
            + self.ssm_gib
            + (self.intermediate_ssm_gib or 0.0)
            + (self.intermediate_conv_gib or 0.0)
        )


@dataclass(frozen=True)
class StartupTrace:
    """The memory figures of one simulated start-up, as SGLang would log them."""

    mem_fraction_static: float
    cuda_graph_max_bs: int
    pre_load_free_gib: float
    shards: list[tuple[float, float]] = field(default_factory=list)
    post_weights_free_gib: float | None = None  # after the target's weights
    draft_begin_free_gib: float | None = None  # the draft's "Load weight begin. avail mem"
    draft_post_weights_free_gib: float | None = None  # the draft's "Load weight end. avail mem"
    mamba: MambaAlloc | None = None
    kv_pool_gib: float | None = None  # the target's KV pool
    kv_tokens: int | None = None
    draft_kv_pool_gib: float | None = None  # the draft's pool (same #tokens)
    pool_end_free_gib: float | None = None  # the target's "Memory pool end"
    draft_pool_end_free_gib: float | None = None  # the draft's "Memory pool end"
    passes: list[PassTrace] = field(default_factory=list)
    graph_end_free_gib: float | None = None  # after the last capture pass
    max_running_requests: int | None = None  # resolved (hybrid models: capped by the state)
    mamba_capped: bool = False  # 0.5.23 warns "max_running_requests is capped to N by ..."
    failure: Failure | None = None

    @property
    def ok(self) -> bool:
        return self.failure is None

    @property
    def graph_steps(self) -> list[tuple[int, float]]:
        """(bs, free before) per step of the last capture pass begun."""
        return self.passes[-1].steps if self.passes else []

    @property
    def graph_mem_gib(self) -> float | None:
        """Memory all finished capture passes took (None before any capture ends)."""
        done = [p.mem_gib for p in self.passes if p.mem_gib is not None]
        if self.graph_end_free_gib is None:
            return None
        return sum(done)

    def pass_named(self, name: str) -> PassTrace | None:
        return next((p for p in self.passes if p.name == name), None)


def _params(mfs: float, bs: int) -> LaunchParams:
    return LaunchParams(mfs, bs)


GIB = 1 << 30


def _mamba_sizing(
    s: MemoryScenario, rest: float
) -> tuple[MambaAlloc | None, float, Failure | None]:
    """Carve the Mamba state cache out of ``rest`` (GiB); returns (allocation, the rest left
    for the KV pool, a failure)."""
    h = s.hybrid
    assert h is not None
    per_req = h.per_req_gib
    spec = s.spec
    mrr = s.request_cap
    if not s.new_order:
        # 0.5.10 model_runner_kv_cache_mixin.handle_max_mamba_cache
        inter_reqs = 0
        if spec is not None:
            inter_reqs = mrr or SPEC_DEFAULT_MAX_RUNNING_REQUESTS
            rest -= per_req * inter_reqs * spec.num_draft_tokens
        if h.max_mamba_cache_size is not None:
            k = h.max_mamba_cache_size
        elif h.disable_radix_cache and mrr is not None:
            k = mrr
        else:
            budget = rest * h.mamba_full_memory_ratio / (1 + h.mamba_full_memory_ratio)
            k = int(budget * GIB // (per_req * GIB)) if budget > 0 else 0
        if k <= 0:
            return None, rest, Failure(Outcome.KV_TOO_SMALL, Phase.KV_CACHE)
        alloc = MambaAlloc(
            k,
            h.conv_gib_per_req * (k + 1),
            h.ssm_gib_per_req * (k + 1),
            *(
                (
                    h.ssm_gib_per_req * inter_reqs * spec.num_draft_tokens,
                    h.conv_gib_per_req * inter_reqs * spec.num_draft_tokens,
                )
                if spec is not None
                else (None, None)
            ),
        )
        return alloc, rest - per_req * k, None
    # 0.5.23 KVCacheConfigurator._handle_max_mamba_cache
    ratio = h.ratio()
    d = spec.num_draft_tokens if spec is not None else 0
    reqs = max(1, mrr) if mrr is not None else None
    capped = 0
    if h.max_mamba_cache_size is not None:
        k = h.max_mamba_cache_size
        if spec is not None:
            capped = min(reqs or SPEC_DEFAULT_MAX_RUNNING_REQUESTS, k // ratio)
            rest -= per_req * (capped + 1) * d
    elif h.disable_radix_cache and mrr is not None:
        k = max(1, mrr)
        if spec is not None:
            capped = k
            rest -= per_req * (k + 1) * d
    else:
        budget = rest * h.mamba_full_memory_ratio / (1 + h.mamba_full_memory_ratio)
        k = mamba_cache_slots(budget, per_req, d, ratio)
        if spec is not None:
            capped = min(reqs or SPEC_DEFAULT_MAX_RUNNING_REQUESTS, k // ratio)
            rest -= per_req * (capped + 1) * d
    if k <= 0:
        detail = {"max_mamba_cache_size": float(k), "total_rest_gib": rest, "per_req_gib": per_req}
        fail = Failure(
            Outcome.KV_TOO_SMALL, Phase.KV_CACHE, kind="hybrid_state_memory", detail=detail
        )
        return None, rest, fail
    inter: tuple[float | None, float | None] = (None, None)
    if spec is not None:
        inter = (
            h.ssm_gib_per_req * (capped + 1) * d,
            h.conv_gib_per_req * (capped + 1) * d,
        )
    alloc = MambaAlloc(k, h.conv_gib_per_req * (k + 1), h.ssm_gib_per_req * (k + 1), *inter)
    return alloc, rest - per_req * (k + 1), None


def _max_num_reqs(
    s: MemoryScenario, tokens: int, mamba: MambaAlloc | None
) -> tuple[int, bool, Failure | None]:
    """0.5.23 ``resolve_max_num_reqs``: the running-request limit, capped by the state cache."""
    estimated = max(min(int(tokens / s.context_len * 512), 4096), 2048)
    mrr = s.request_cap
    reqs = min(max(1, mrr), tokens // 2) if mrr is not None else min(estimated, tokens // 2)
    if mamba is None or s.hybrid is None:
        return reqs, False, None
    ratio = s.hybrid.ratio()
    capped = mamba.max_mamba_cache_size // ratio < reqs
    reqs = min(reqs, mamba.max_mamba_cache_size // ratio)
    if reqs <= 0:
        detail = {
            "max_mamba_cache_size": float(mamba.max_mamba_cache_size),
            "mamba_ratio": float(ratio),
            "max_num_reqs": float(reqs),
        }
        return (
            reqs,
            capped,
            Failure(Outcome.KV_TOO_SMALL, Phase.KV_CACHE, kind="hybrid_too_small", detail=detail),
        )
    return reqs, capped, None


def _capture(
    passes: list[GraphPass], free: float, done: list[PassTrace]
) -> tuple[float, Failure | None]:
    """Run capture passes from ``free``; appends their traces to ``done``."""
    for gp in passes:
        steps: list[tuple[int, float]] = []
        begin = free
        for i, (b, alloc) in enumerate(gp.allocations):
            steps.append((b, free))
            if alloc > free:
                done.append(PassTrace(gp.name, gp.sizes, gp.tokens_per_req, begin, steps))
                fail = Failure(
                    Outcome.OOM_GRAPH_CAPTURE,
                    Phase.CUDA_GRAPH,
                    alloc,
                    free,
                    step=i,
                    graph_pass=gp.name,
                )
                return free, fail
            free -= alloc
        done.append(PassTrace(gp.name, gp.sizes, gp.tokens_per_req, begin, steps, free))
    return free, None


def simulate(s: MemoryScenario, params: LaunchParams) -> StartupTrace:
    """Run SGLang's start-up arithmetic for ``params``; stop at the first failure."""
    mfs, bs = s.resolve(params)
    pre = s.pre_load_free_gib
    t: dict[str, object] = {
        "mem_fraction_static": mfs,
        "cuda_graph_max_bs": bs,
        "pre_load_free_gib": pre,
    }

    fail: Failure | None = None

    def trace(failure: Failure | None = None) -> StartupTrace:
        return StartupTrace(**t, failure=failure)  # type: ignore[arg-type]

    if pre <= 0:
        return trace(Failure(Outcome.OOM_WEIGHTS, Phase.INIT, s.context_gib, s.context_gib + pre))

    shards: list[tuple[float, float]] = []
    t["shards"] = shards
    free = pre
    for i, (alloc, after) in enumerate(s.shard_allocations()):
        if alloc > free:
            return trace(Failure(Outcome.OOM_WEIGHTS, Phase.WEIGHTS, alloc, free, step=i))
        shards.append((alloc, after))
        free = after
    t["post_weights_free_gib"] = free
    if s.lora_gib:
        # the LoRA manager's buffers (torch.zeros in LoRAMemoryPool.init_buffers)
        if s.lora_gib > free:
            return trace(Failure(Outcome.OOM_KV_CACHE, Phase.KV_CACHE, s.lora_gib, free,
                                 kind="lora_pool"))
        free -= s.lora_gib
    spec = s.spec
    if spec is not None and s.new_order:
        t["draft_begin_free_gib"] = free
        if spec.draft_weights_gib > free:
            fail = Failure(
                Outcome.OOM_WEIGHTS, Phase.WEIGHTS, spec.draft_weights_gib, free, draft=True
            )
            return trace(fail)
        free -= spec.draft_weights_gib
        t["draft_post_weights_free_gib"] = free

    post_w = free
    rest = post_w - pre * (1 - mfs)
    mamba: MambaAlloc | None = None
    # 0.5.23 sizes the state cache before it checks the rest (kv_cache_configurator.py:3039-3044:
    # ``_handle_max_mamba_cache(rest_memory)``, then ``if rest_memory <= 0``), so an auto-sized
    # cache with no rest fails with "Not enough GPU memory for hybrid ..." (K <= 0), not with
    # "Loaded weights leave no GPU memory"; 0.5.10 reaches its "Not enough memory" either way.
    if s.hybrid is not None and (rest > 0 or s.new_order):
        mamba, rest, fail = _mamba_sizing(s, rest)
        if fail is not None:
            if fail.kind is None:
                t["kv_pool_gib"], t["kv_tokens"] = 0.0, 0
                need = 1 - (post_w - s.min_kv_gib()) / pre
                fail = replace(fail, min_mem_fraction=need)
            return trace(fail)
        t["mamba"] = mamba
    per_1k = s.kv_gib_per_1k_tokens
    draft_per_1k = spec.draft_kv_gib_per_1k_tokens if spec is not None else 0.0
    cell = per_1k + (draft_per_1k if s.new_order else 0.0)
    tokens = int(rest / cell * 1000) if rest > 0 else 0
    kv = rest * per_1k / cell  # the target's share of the pool (all of it without a draft)
    t["kv_pool_gib"], t["kv_tokens"] = kv, tokens
    if rest <= 0 or tokens < s.min_kv_tokens:
        need = 1 - (post_w - s.min_kv_gib()) / pre
        return trace(Failure(Outcome.KV_TOO_SMALL, Phase.KV_CACHE, min_mem_fraction=need))
    reqs: int | None = None
    if s.new_order and (s.hybrid is not None or s.request_cap is not None):
        reqs, t["mamba_capped"], fail = _max_num_reqs(s, tokens, mamba)
        if fail is not None:
            return trace(fail)
    elif s.request_cap is not None:
        reqs = s.request_cap
    t["max_running_requests"] = reqs
    free = post_w - (mamba.total_gib if mamba is not None else 0.0) - kv
    if spec is not None and s.new_order:
        draft_kv = rest - kv
        t["draft_kv_pool_gib"] = draft_kv
        free -= draft_kv
        t["pool_end_free_gib"] = free + draft_kv
        t["draft_pool_end_free_gib"] = free
    else:
        t["pool_end_free_gib"] = free

    passes: list[PassTrace] = []
    t["passes"] = passes
    buffers = s.attention_buffers_gib
    if buffers > free:
        # init_attention_backend runs after the pool: read as a failed first capture step
        # (without graphs, as the warmup's OOM)
        first = s.graph_passes(bs, reqs)[:1]
        if not first:
            return trace(Failure(Outcome.OOM_RUNTIME, Phase.WARMUP, buffers, free,
                                 kind="attention_buffers"))
        gp = first[0]
        passes.append(PassTrace(gp.name, gp.sizes, gp.tokens_per_req, free,
                                [(gp.allocations[0][0], free)]))
        return trace(Failure(Outcome.OOM_GRAPH_CAPTURE, Phase.CUDA_GRAPH, buffers, free, step=0,
                             graph_pass=gp.name, kind="attention_buffers"))
    free -= buffers
    if spec is not None and s.new_order:
        free, fail = _capture(s.graph_passes(bs, reqs), free, passes)
        if fail is not None:
            return trace(fail)
    else:
        free, fail = _capture(s.target_passes(bs, reqs), free, passes)
        if fail is not None:
            return trace(fail)
        if spec is not None:
            t["draft_begin_free_gib"] = free
            if spec.draft_weights_gib > free:
                fail = Failure(
                    Outcome.OOM_WEIGHTS, Phase.WEIGHTS, spec.draft_weights_gib, free, draft=True
                )
                return trace(fail)
            free -= spec.draft_weights_gib
            t["draft_post_weights_free_gib"] = free
            draft_kv = tokens / 1000 * draft_per_1k
            if draft_kv > free:
                fail = Failure(Outcome.OOM_KV_CACHE, Phase.KV_CACHE, draft_kv, free, draft=True)
                return trace(fail)
            free -= draft_kv
            t["draft_kv_pool_gib"] = draft_kv
            t["draft_pool_end_free_gib"] = free
            free, fail = _capture(s.draft_passes(bs, reqs), free, passes)
            if fail is not None:
                return trace(fail)
    t["graph_end_free_gib"] = free
    if s.warmup_gib > free:
        return trace(Failure(Outcome.OOM_RUNTIME, Phase.WARMUP, s.warmup_gib, free))
    return trace()
