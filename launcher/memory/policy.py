"""Which ``--mem-fraction-static`` / CUDA-graph max batch size to try after a failed start-up.

Pure: a function of (initial params, bounds, the attempts so far). The supervisor does the I/O.

The arithmetic is SGLang's own (docs/sglang.md, "Memory"). The fraction ``mfs``
multiplies ``pre``, the free memory before weight load (``Load weight begin. avail mem``).
The KV pool gets ``mfs x pre - weights``, and exactly ``(1 - mfs) x pre`` is left after it for
CUDA graphs and warmup activations. So a setting fits iff

    weights + kv_min  <  mfs x pre                   else kv_too_small ("Not enough memory")
    graphs(bs) + warmup  <=  (1 - mfs) x pre         else an OOM in capture or at warmup

Graphs are captured largest batch size first: the first step allocates about ``a x max_bs``
(activations), each later step a small ``c``. From a capture OOM's numbers the policy reads
``a`` and ``c`` (``c`` is what a later step tried; ``a x bs`` is what the steps before it
consumed, less their ``c``), and from a warmup OOM the whole graph memory and the warmup need.
It then proposes the highest fraction estimated to fit at the largest batch size whose
estimate still leaves a useful KV pool (``Priors.kv_cushion``)::

    need(bs) = gone + a x bs + c x steps(bs) + warmup + margin     fraction = 1 - need(bs) / pre

``gone`` is headroom a real log shows missing when capture began (0 in the simulator); with
no capture figures it makes this the plain deficit rule, ``mfs - (tried - free + ...) / pre``.
Unknowns take the priors (``priors=``, :class:`~launcher.memory.priors.Priors`: ``step_gib``,
``warmup_gib``, each with its source); a wrong
guess costs one more attempt, whose log then has the exact figure.

KV too small: SGLang's stated minimum (or (weights + counted draft weights) / pre) plus
``Priors.kv_cushion`` (times ``1 + --mamba-full-memory-ratio`` for a hybrid, whose state cache takes
``r / (1 + r)`` of the pool first), never SGLang's auto value (only without any figure is the
auto value a floor);
once a pool > 0 was too small, the most the brackets allow (an OOM there brings the graph
figures). A graph estimate below a fraction known to leave too small a pool is wrong: then the
KV figures' fraction is taken, bisected between the brackets where they cap it (never a
0.001 walk). Without figures at all, fixed steps of ``STEP_FRACTION`` (SGLang's own advice),
halving the graph bs where the fraction would cross its floor.

Multi-pass capture (a log that names its passes, ``Numbers.graph_pass``): SGLang captures target
prefill, target decode/verify, then the draft's decode and extend graphs, each from what the
pass before left. A capture OOM then says that everything since the *first* pass began is needed
again (``start - free``, ``start`` capped at ``(1 - mfs) x pre``), plus what was ``tried``, the
failing pass's remaining steps and an estimate of the passes still to come
(``Priors.draft_after_target_share`` of the failing pass's size; after a prefill pass, scaled
by the tokens the decode graph runs against the prefill shape's; draft extend after draft
decode by SGLang's capture widths, ``_pass_width``). Each pass's own size comes from its begin line
(``Numbers.graph_begins``, ``_PassFit``): prefill passes stay fixed, a decode-like pass's first
step scales with the effective bs, each further captured size costs a step. On 0.5.10 the
draft's weights and KV pool load between the target's and the draft's graphs, out of the same
headroom; the pool (its own ``KV Cache is allocated`` line) has the target's token count, so it
grows with the fraction and is solved for, not counted as graph memory. At an unchanged graph bs
the fraction falls by at least the OOM's own deficit (``tried - free``). Under speculative
decoding the graph bs is searched below the running-request cap (48 unless set), the speculative
shape is never touched, and the levers go fraction, then graph bs, then (0.5.23, ``[policy]
allow_disable_draft_extend_graph``) ``SGLANG_DISABLE_DRAFT_EXTEND_CUDA_GRAPH=1``. Hybrid
state-cache errors (0.5.23): a configured ``max_mamba_cache_size`` doubled, else the fraction
raised until the state cache holds ``MIN_RUNNING_REQUESTS`` requests (SGLang's sizing never
reads ``max_running_requests`` there, whatever its message suggests first). A fix SGLang's
error names is applied once with ``[policy] apply_prescribed_fixes``
(``launcher.sglang.prescribe``). A relaunch keeps every knob it does not change.

Facts are kept as brackets, in thousandths: a fraction too small at any bs bounds all lower
fractions out; an OOM at (mfs, bs) bounds out every (>= mfs, >= bs). A proposal is always
strictly inside the brackets, so a setting known to fail (or dominated by one) is never tried
again. The policy gives up on a weight-load OOM, on a non-memory fatal outcome, when the
brackets are empty even at the graph-bs floor, and at ``max_attempts``.
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Sequence
from dataclasses import dataclass, field, replace

from launcher.errors import PolicyError
from launcher.memory.estimate import Estimate
from launcher.memory.priors import DEFAULT_PRIORS, Priors
from launcher.params import DISABLE_DRAFT_EXTEND_ENV, LaunchParams
from launcher.sglang.autoargs import (
    SPEC_DEFAULT_MAX_RUNNING_REQUESTS,
    auto_cuda_graph_max_bs,
    auto_mem_fraction_static,
    capture_bs_list,
    captured_sizes,
)
from launcher.sglang.modelfacts import mamba_slot_ratio
from launcher.sglang.outcome import Numbers, Outcome
from launcher.sglang.phases import GraphPass, Phase
from launcher.sglang.prescribe import prescription
from launcher.sglang.versions import (
    DEFAULT_VERSION,
    DRAFT_EXTEND_FULL_WIDTH_FROM,
    DRAFT_EXTEND_SWITCH_FROM,
    MAMBA_RADIX_SPELLING_FROM,
    ONE_STATIC_BUDGET_FROM,
    at_least,
)

# SGLang's own fallbacks when it cannot read the GPU size (0.5.6 mfs 0.88; max_bs 160): the
# values assumed for an auto param when neither the log nor the GPU size tells us better.
ASSUMED_MEM_FRACTION = 0.88
ASSUMED_GRAPH_BS = 160
# Assumed when the caller does not say (the newest auto table, the smallest server).
ASSUMED_TP = 1
ASSUMED_VERSION = DEFAULT_VERSION

STEP_FRACTION = 0.05  # fraction step when a failure came without numbers (SGLang: 0.05-0.1)
ROUNDING_GIB = 0.005  # SGLang prints GiB to 2 decimals: each figure is within half a hundredth
KV_GROWTH = 4.0  # a pool found too small is multiplied by this for the next estimate

_MILLI = 1000

# Speculative decoding (EAGLE family) sets max_running_requests to 48 unless given, and the
# decode/verify/draft graphs are captured only for bs <= that (base_cuda_graph_runner.py:65).
SPEC_RUNNING_REQUESTS = SPEC_DEFAULT_MAX_RUNNING_REQUESTS
# SGLang's auto speculative shape when unset: (steps, topk, draft tokens) = (3, 1, 4).
SPEC_AUTO_STEPS = 3
# 0.5.23 counts the draft model's weights in the static budget (kv_cache_configurator.py:3057).
DRAFT_IN_BUDGET_FROM = ONE_STATIC_BUDGET_FROM
# Capture passes whose size does not depend on the decode graph bs: the prefill graphs are
# captured per token count (cuda_graph_setup.py, 0.5.23), not per request.
PREFILL_PASSES = frozenset({GraphPass.TARGET_PREFILL, GraphPass.DRAFT_PREFILL})
# Hybrid state-cache errors: the fraction is raised until the state cache holds this many
# requests' slots.
MIN_RUNNING_REQUESTS = 8
# SGLang's default --mamba-full-memory-ratio (server_args, 0.5.10 and 0.5.23).
MAMBA_FULL_MEMORY_RATIO = 0.9


def margin_gib(pre: float) -> float:
    """Safety margin added to an estimated need: 0.1 GiB, or 0.25% of ``pre`` when larger."""
    return max(0.1, 0.0025 * pre)


@dataclass(frozen=True)
class Bounds:
    """Limits of the search: fractions in [floor, ceiling], graph bs >= floor, attempts."""

    mem_fraction_floor: float = 0.5
    mem_fraction_ceiling: float = 0.95
    graph_bs_floor: int = 1
    max_attempts: int = 6
    # [policy] apply_prescribed_fixes: apply a fix SGLang's own error names, once.
    apply_prescribed_fixes: bool = False
    # [policy] allow_disable_draft_extend_graph: under speculative decoding on >= 0.5.23, set
    # SGLANG_DISABLE_DRAFT_EXTEND_CUDA_GRAPH=1 when the fraction and the graph bs cannot help.
    allow_disable_draft_extend_graph: bool = False


@dataclass(frozen=True)
class AttemptRecord:
    """One finished attempt: params as launched (``None`` = auto), how it ended, its numbers."""

    params: LaunchParams
    outcome: Outcome
    phase: Phase
    numbers: Numbers


@dataclass(frozen=True)
class Decision:
    """What to launch next (``params``), or give up (``params is None``) and why (``reason``)."""

    params: LaunchParams | None
    reason: str

    @property
    def give_up(self) -> bool:
        return self.params is None


_FATAL_REASONS = {
    Outcome.BAD_ARGUMENT: "a command-line or config argument is invalid; fix it (see the log)"
    " and relaunch, retrying unchanged cannot help",
    Outcome.MODEL_NOT_FOUND: "the model path or repo id was not found; fix model_path or make the"
    " model available on the host (offline HF cache?)",
    Outcome.PORT_IN_USE: "the port is already in use; stop what holds it (a leftover server?)"
    " or configure another port",
    Outcome.CUDA_ERROR_OTHER: "a CUDA error that is not out-of-memory (driver, kernel image,"
    " illegal access); check the GPU and the SGLang/torch build",
    Outcome.OTHER: "failed with an error launcher does not know; read the log's last traceback",
}
_TRANSIENT = frozenset({Outcome.HANG, Outcome.KILLED, Outcome.NCCL_ERROR, Outcome.INCOMPLETE})
_LOWER = frozenset({Outcome.OOM_GRAPH_CAPTURE, Outcome.OOM_KV_CACHE, Outcome.OOM_RUNTIME})
_MORE_HARDWARE = "needs more GPUs (higher tp) or a quantized model"


def _down(fraction: float) -> int:
    """Largest thousandth <= fraction."""
    return math.floor(fraction * _MILLI + 1e-6)


def _up(fraction: float) -> int:
    """Smallest thousandth >= fraction."""
    return math.ceil(fraction * _MILLI - 1e-6)


def _f(milli: int) -> float:
    return round(milli / _MILLI, 3)


@dataclass(frozen=True)
class _Context:
    """What SGLang's auto rules need: the GPU size (if known), tp, version; and whether the
    server runs speculative decoding, with the running-request cap that caps its graph bs."""

    total: float | None
    tp: int
    version: str
    spec: bool = False
    cap: int | None = None  # graphs are captured only up to this bs (None: no known cap)
    draft_extend_off: bool = False  # SGLANG_DISABLE_DRAFT_EXTEND_CUDA_GRAPH=1 in the last params
    priors: Priors = DEFAULT_PRIORS  # the guesses for what no log shows yet


@dataclass
class _Facts:
    """What the history says, in the units the search uses (GiB, thousandths of a fraction)."""

    ctx: _Context
    pre: float | None = None
    weights: float | None = None  # per rank
    lo: int = 0  # smallest fraction not known to leave too small a KV pool
    ooms: list[tuple[int, int]] = field(default_factory=list)  # (highest allowed, from bs)
    stated_min: float | None = None
    small_pool: float = 0.0  # largest KV pool (GiB) known to be too small
    a: float | None = None  # GiB per unit of max bs in the first capture step
    c: float | None = None  # GiB per later capture step, when a log showed one
    graph_at: dict[int, float] = field(default_factory=dict)  # exact graph GiB per max bs
    warmup: float | None = None
    hidden: float = 0.0  # GiB of (1 - mfs) x pre already gone when capture began (latest seen)
    draft_weights: float = 0.0  # per rank, when the version counts them in the static budget
    # Multi-pass logs: one fit per capture/warmup OOM, the most informed first (``_PassFit``).
    fits: list[_PassFit] = field(default_factory=list)
    # 0.5.10: the draft's KV pool, allocated after the target's graphs from the headroom, in
    # GiB per GiB of the target's pool (it has the target's token count), and the GiB of the
    # static budget that is not pool (weights), so that pool(m) = m x pre - pool_base.
    draft_kv_ratio: float = 0.0
    pool_base: float = 0.0
    mamba_ratio: float = 0.0  # a hybrid's --mamba-full-memory-ratio (0: not a hybrid)

    def hi(self, bs: int, ceiling: int) -> int:
        """Highest fraction (thousandths) not known to OOM at ``bs``."""
        return min([ceiling, *(h for h, b in self.ooms if b <= bs)])

    def has_model(self) -> bool:
        return self.pre is not None and (
            self.a is not None or bool(self.graph_at) or bool(self.fits)
        )

    def need(self, bs: int) -> float:
        """Estimated GiB needed after the KV pool at graph max ``bs`` (margin included)."""
        assert self.pre is not None
        warmup = self.warmup if self.warmup is not None else self.ctx.priors.warmup_gib(self.pre)
        return self.hidden + self.graphs(bs) + warmup + margin_gib(self.pre)

    def graphs(self, bs: int, *, without_extend: bool = False) -> float:
        """Estimated GiB all capture passes take at graph max ``bs`` (an effective bs).

        Multi-pass logs: the most informed fit (``fits[0]``) with its guesses for passes not
        yet seen, at least what any other fit saw (``_PassFit.at``).
        """
        if self.fits:
            first, *others = self.fits
            return max([
                first.at(bs, without_extend=without_extend),
                *(f.at(bs, without_extend=without_extend, seen_only=True) for f in others),
            ])
        known = dict(self.graph_at)
        if bs in known:
            return known[bs]
        step = self.c if self.c is not None else self.ctx.priors.step_gib
        return (self.a or 0.0) * bs + step * len(capture_bs_list(bs))

    def estimate(self, bs: int, *, optimistic: bool = False, without_extend: bool = False) -> int:
        """Highest fraction (thousandths) estimated to fit graphs and warmup at ``bs``.

        ``optimistic`` drops the safety margin and the warmup guess (keeps a seen warmup);
        ``without_extend`` leaves the draft-extend graph out.
        """
        assert self.pre is not None
        need = self.need(bs)
        if without_extend:
            need -= self.graphs(bs) - self.graphs(bs, without_extend=True)
        if optimistic:
            need -= margin_gib(self.pre)
            if self.warmup is None:
                need -= self.ctx.priors.warmup_gib(self.pre)
        # 0.5.10's draft pool comes out of the same headroom and grows with the fraction:
        # (1 - m) x pre >= need + k x (m x pre - base)  <=>  m <= (pre - need + k x base) /
        # (pre x (1 + k)).
        k = self.draft_kv_ratio
        return _down((self.pre - need + k * self.pool_base) / (self.pre * (1 + k)))

    def soft_lo(self) -> int:
        """Smallest fraction estimated to leave a useful KV pool (>= the hard bound).

        A hybrid model's state cache takes ``r / (1 + r)`` of the pool budget first
        (``--mamba-full-memory-ratio`` r, 0.9 unless set: 0.5.10
        ``handle_max_mamba_cache``, 0.5.23 ``_handle_max_mamba_cache``), so its cushion is
        ``1 + r`` times the plain one.
        """
        cushion = self.ctx.priors.kv_cushion * (1 + self.mamba_ratio)
        lo = self.lo
        if self.stated_min is not None:
            lo = max(lo, _up(self.stated_min + cushion))
        if self.pre is not None and self.weights is not None:
            pool = max(cushion * self.pre, KV_GROWTH * self.small_pool)
            lo = max(lo, _up((self.weights + self.draft_weights + pool) / self.pre))
        return lo

    def knows_kv(self) -> bool:
        """Whether the KV lower bound comes from figures rather than a guess."""
        return (self.pre is not None and self.weights is not None) or self.stated_min is not None

    def auto_target(self, bs: int) -> int | None:
        """The fraction that keeps what SGLang's auto rule keeps after the pool (thousandths)."""
        if self.pre is None:
            return None
        gpu = self.ctx.total or self.pre
        keep = gpu * (1 - auto_mem_fraction_static(gpu, self.ctx.tp, self.ctx.version, bs))
        return _down(1 - keep / self.pre)


def resolve_params(
    params: LaunchParams,
    numbers: Numbers,
    *,
    gpu_total_gib: float | None = None,
    tp: int | None = None,
    sglang_version: str | None = None,
) -> tuple[float, int]:
    """The (mem_fraction_static, cuda_graph_max_bs) an attempt ran with.

    Explicit params win; then the server_args dump in ``numbers``; then what the log implies
    (the first capture step is max bs; ``1 - pool_end/pre`` is the fraction); then SGLang's
    auto rules for the GPU size (``numbers.total_gib`` or ``gpu_total_gib``); then SGLang's own
    fallbacks for an unknown GPU (``ASSUMED_MEM_FRACTION``, ``ASSUMED_GRAPH_BS``).
    """
    total = numbers.total_gib if numbers.total_gib is not None else gpu_total_gib
    ctx = _Context(total, tp or ASSUMED_TP, sglang_version or ASSUMED_VERSION)
    return _resolve(params, numbers, ctx)


def _resolve(params: LaunchParams, n: Numbers, ctx: _Context) -> tuple[float, int]:
    bs = params.cuda_graph_max_bs
    if bs is None:
        bs = n.cuda_graph_max_bs
    if bs is None and n.graph_steps_done == 0 and n.graph_last_bs is not None:
        bs = n.graph_last_bs
    if bs is None:
        bs = (
            auto_cuda_graph_max_bs(ctx.total, ctx.tp, ctx.version)
            if ctx.total is not None
            else ASSUMED_GRAPH_BS
        )
    mfs = params.mem_fraction_static
    if mfs is None:
        mfs = n.mem_fraction_static
    if mfs is None and n.pre_load_avail_gib and n.pool_end_avail_gib is not None:
        mfs = round(1 - n.pool_end_avail_gib / n.pre_load_avail_gib, 3)
    if mfs is None:
        mfs = (
            auto_mem_fraction_static(ctx.total, ctx.tp, ctx.version, bs)
            if ctx.total is not None
            else ASSUMED_MEM_FRACTION
        )
    return mfs, bs


def _learn(history: Sequence[AttemptRecord], ctx: _Context, bounds: Bounds) -> _Facts:
    facts = _Facts(ctx, lo=_up(bounds.mem_fraction_floor))
    for rec in history:
        n = rec.numbers
        if n.pre_load_avail_gib is not None and n.pre_load_avail_gib > 0:
            facts.pre = n.pre_load_avail_gib
            if n.post_weights_avail_gib is not None:
                facts.weights = n.pre_load_avail_gib - n.post_weights_avail_gib
            elif n.weights_gib is not None:
                facts.weights = n.weights_gib
        if n.draft_weights_gib and at_least(ctx.version, DRAFT_IN_BUDGET_FROM):
            facts.draft_weights = n.draft_weights_gib
        if _shows_hybrid(rec, ctx.version):
            facts.mamba_ratio = rec.params.mamba_full_memory_ratio or MAMBA_FULL_MEMORY_RATIO
    a_values: list[float] = []
    fits: list[tuple[tuple[bool, int, int], _PassFit]] = []
    for rec in history:
        mfs, raw_bs = _resolve(rec.params, rec.numbers, ctx)
        n = rec.numbers
        bs = _cap_of(rec.params, n, ctx.spec, raw_bs)
        pre = n.pre_load_avail_gib
        extend_off = rec.params.env_value(DISABLE_DRAFT_EXTEND_ENV) == "1"
        if rec.outcome is Outcome.KV_TOO_SMALL:
            facts.lo = max(facts.lo, _down(mfs) + 1)
            if n.min_mem_fraction is not None:
                facts.stated_min = max(facts.stated_min or 0.0, n.min_mem_fraction)
                facts.lo = max(facts.lo, _down(n.min_mem_fraction) + 1)
            if pre and n.post_weights_avail_gib is not None:
                pool = mfs * pre - (pre - n.post_weights_avail_gib)
                facts.small_pool = max(facts.small_pool, pool)
        elif rec.outcome in _LOWER and extend_off >= ctx.draft_extend_off:
            # A KV-pool OOM comes before any graph: it rules out the fraction at every bs. (An
            # OOM with the draft-extend graph on says nothing about settings with it off.)
            from_bs = 0 if rec.outcome is Outcome.OOM_KV_CACHE else bs
            facts.ooms.append((_up(mfs) - 1, from_bs))
        if rec.outcome in (Outcome.OOM_GRAPH_CAPTURE, Outcome.OOM_RUNTIME):
            hidden = _hidden(n, mfs)
            if hidden is not None:
                facts.hidden = hidden
        if rec.outcome is Outcome.OOM_RUNTIME and n.tried_gib is not None:
            facts.warmup = max(facts.warmup or 0.0, n.tried_gib + ROUNDING_GIB)
        fitted = None
        if n.graph_pass is not None and rec.outcome in (
            Outcome.OOM_GRAPH_CAPTURE, Outcome.OOM_RUNTIME
        ):
            fitted = _pass_fit(n, rec.outcome, mfs, bs, ctx, extend_off, facts.c)
        if fitted is not None:
            fit, draft_kv = fitted
            fits.append(((fit.exact, len(n.graph_begins or ()), len(fits)), fit))
            weights = facts.weights
            if draft_kv and pre and weights is not None and mfs * pre > weights:
                facts.draft_kv_ratio = max(facts.draft_kv_ratio, draft_kv / (mfs * pre - weights))
                facts.pool_base = weights
        elif rec.outcome is Outcome.OOM_GRAPH_CAPTURE:
            a = _graph_slope(n, bs, facts)
            if a is not None:
                a_values.append(a)
        elif rec.outcome is Outcome.OOM_RUNTIME and n.tried_gib is not None:
            start = _capture_start(n)
            if start is not None and n.free_gib is not None and n.graph_last_bs is not None:
                graphs = start - n.free_gib + 2 * ROUNDING_GIB
                facts.graph_at[bs] = max(facts.graph_at.get(bs, 0.0), graphs)
    facts.fits = [fit for _, fit in sorted(fits, key=lambda kf: kf[0], reverse=True)]
    if facts.weights is not None and facts.pre:
        # A pool must be > 0; the weights figure is a difference of two rounded ones.
        facts.lo = max(facts.lo, _down((facts.weights - 2 * ROUNDING_GIB) / facts.pre) + 1)
    if facts.c is None and a_values and facts.graph_at:
        # A capture OOM's first step gave the slope, a warmup OOM the whole graph memory at
        # some bs: what the slope leaves of it is the later steps, which sizes them (rather
        # than the step prior, whose error the slope would absorb and misplace at other bs).
        slope = max(a_values)
        per_step = max(
            (g - slope * b) / len(capture_bs_list(b)) for b, g in facts.graph_at.items()
        )
        if per_step > ctx.priors.step_gib:
            facts.c = per_step
    step = facts.c if facts.c is not None else ctx.priors.step_gib
    for bs, graphs in facts.graph_at.items():
        a_values.append(max(0.0, graphs - step * len(capture_bs_list(bs))) / bs)
    if a_values:
        facts.a = max(a_values)
    return facts


def _hidden(n: Numbers, mfs: float) -> float | None:
    """GiB of the ``(1 - mfs) x pre`` headroom gone before capture began (0 in the simulator).

    Real logs can show less free memory at capture than SGLang's arithmetic leaves (other
    allocations, another process): that memory is needed again next time, at any bs. When
    the log shows no capture start, the OOM's own ``free`` stands for it, which turns the
    estimate into plain deficit arithmetic.
    """
    pre = n.pre_load_avail_gib
    start = _capture_start(n)
    if start is None:
        start = n.free_gib
    if not pre or start is None:
        return None
    return max(0.0, pre * (1 - mfs) - start - ROUNDING_GIB)


def _capture_start(n: Numbers) -> float | None:
    """Free GiB when the first capture pass began (or the pool ended): what all passes share."""
    for value in (n.graph_first_begin_avail_gib, n.graph_begin_avail_gib, n.pool_end_avail_gib):
        if value is not None:
            return value
    return None


def _cap_of(params: LaunchParams, n: Numbers, spec: bool, bs: int) -> int:
    """The graph max bs SGLang really captures: ``bs`` capped by the running-request limit
    (explicit, or shown by the log, or 48 under speculative decoding)."""
    cap = params.max_running_requests or n.max_running_requests
    if cap is None and (spec or n.speculative):
        cap = SPEC_RUNNING_REQUESTS
    return bs if cap is None else max(1, min(bs, cap))


def _pass_width(gpass: GraphPass, n: Numbers, version: str) -> int:
    """Tokens per request a draft pass's graphs run (SGLang's capture width; 1 otherwise).

    Draft decode: ``topk``. One graph holds the steps, but its forwards run one after another
    on ``bs x topk`` tokens each, so its activations are one step's (0.5.10
    ``eagle_draft_cuda_graph_runner.py:87``: ``num_tokens_per_bs = topk``;
    ``eagle_worker.draft_forward``, l.622-700; 0.5.23 ``spec_utils.resolve_num_tokens_per_req``
    and ``eagle_worker_v2.draft_forward``, l.742-923). Only ``out_cache_loc`` (int64, ``max_bs x
    topk x steps``, a few KiB) and the attention backend's per-step index state grow with the
    steps (``launcher.sim.memory.MemoryScenario.draft_passes``). Draft extend:
    ``steps + 1`` on 0.5.10 (``eagle_draft_extend_cuda_graph_runner.py``: ``num_tokens_per_bs
    = speculative_num_steps + 1``), ``--speculative-num-draft-tokens`` from 0.5.23 ("full tree
    width ... not num_steps + 1"). Unset values are SGLang's auto shape (3, 1, 4).
    """
    steps = n.speculative_num_steps or SPEC_AUTO_STEPS
    if gpass is GraphPass.DRAFT_DECODE:
        return n.speculative_eagle_topk or 1
    if gpass is GraphPass.DRAFT_EXTEND:
        if at_least(version, DRAFT_EXTEND_FULL_WIDTH_FROM):
            return n.speculative_num_draft_tokens or SPEC_AUTO_STEPS + 1
        return steps + 1
    return 1


def _later_passes(gpass: GraphPass, n: Numbers, ctx: _Context, extend_off: bool) -> list[
    tuple[GraphPass, float]
]:
    """The capture passes SGLang runs after ``gpass``, each with its estimated size as a share
    of ``gpass``'s first step.

    A draft pass after a target pass: ``Priors.draft_after_target_share`` of it (no
    SGLang formula relates the draft model's cost per token to the target's, and no log shows
    it before the draft's graphs). A pass of the same model after another: as large per
    captured token, since SGLang sizes every decode-like graph from ``max_bs x`` its width
    (``_pass_width``): draft extend after a draft decode of ``topk`` tokens per request (one
    step's activations: its forwards run one after another) is that decode pass times
    ``width(extend) / topk``. After a prefill pass the caller scales by the tokens that pass
    ran.
    """
    spec = ctx.spec or n.speculative
    steps = n.speculative_num_steps or SPEC_AUTO_STEPS
    extend = not (extend_off and at_least(ctx.version, DRAFT_EXTEND_SWITCH_FROM))
    drafts = [p for p, keep in ((GraphPass.DRAFT_DECODE, steps > 1),
                                (GraphPass.DRAFT_EXTEND, extend)) if keep]
    same, after = ctx.priors.same_model_share, ctx.priors.draft_after_target_share
    if gpass is GraphPass.TARGET_PREFILL:
        target = GraphPass.TARGET_VERIFY if spec else GraphPass.TARGET_DECODE
        return [(target, same), *((p, after) for p in drafts if spec)]
    if gpass in (GraphPass.TARGET_DECODE, GraphPass.TARGET_VERIFY):
        return [(p, after) for p in drafts] if spec else []
    if gpass is GraphPass.DRAFT_PREFILL:
        return [(p, same) for p in drafts]
    if gpass is GraphPass.DRAFT_DECODE and GraphPass.DRAFT_EXTEND in drafts:
        # Per captured token as large: scaled by the two passes' widths.
        ratio = _pass_width(GraphPass.DRAFT_EXTEND, n, ctx.version) / _pass_width(
            gpass, n, ctx.version)
        return [(GraphPass.DRAFT_EXTEND, same * ratio)]
    return []


@dataclass(frozen=True)
class _PassFit:
    """The capture passes of one multi-pass OOM, split by how they grow with the graph bs.

    ``fixed``: GiB that do not depend on the decode graph bs (prefill passes, 0.5.10's draft
    weights, memory missing at a failed first step beyond its static buffers). ``scaled``:
    the GiB of each decode-like pass's first capture step (activations and static buffers
    sized from the largest captured bs), proportional to the effective bs. ``step``: GiB per
    further captured size of each of ``passes`` decode-like passes. ``later_*``: the part
    that is a guess for passes not yet begun (``Priors.draft_after_target_share``); ``ext_*``: the
    draft-extend pass's part. ``exact``: every pass ended (a warmup OOM).
    """

    bs: int
    spec: bool
    fixed: float
    scaled: float
    step: float
    passes: int
    later_scaled: float = 0.0
    later_passes: int = 0
    ext_scaled: float = 0.0
    ext_passes: int = 0
    ext_later: bool = False
    exact: bool = False

    def at(self, bs: int, *, without_extend: bool = False, seen_only: bool = False) -> float:
        """GiB of all capture passes at effective graph max ``bs``; ``seen_only`` leaves the
        guessed later passes out, ``without_extend`` the draft-extend pass."""
        scaled, passes = self.scaled, self.passes
        if seen_only:
            scaled, passes = scaled - self.later_scaled, passes - self.later_passes
        if without_extend and not (seen_only and self.ext_later):
            scaled, passes = scaled - self.ext_scaled, passes - self.ext_passes
        steps = len(captured_sizes(bs, spec=self.spec))
        return (self.fixed + max(0.0, scaled) * bs / max(1, self.bs)
                + self.step * max(0, passes) * steps)


def _pass_fit(
    n: Numbers,
    outcome: Outcome,
    mfs: float,
    bs: int,
    ctx: _Context,
    extend_off: bool,
    step_known: float | None,
) -> tuple[_PassFit, float | None] | None:
    """The fit of one capture (or warmup) OOM in a log that names its passes, and 0.5.10's
    draft KV pool at ``mfs`` when the log shows it (allocated, or the allocation that failed).

    Each finished pass's size is the difference of consecutive ``Capture ... begin`` figures
    (``graph_begins``; on 0.5.10 less the draft's weights and pool loaded between the target
    and draft graphs). The failing pass needs again what it held, the failed ``tried`` and
    its remaining steps; passes not yet begun are estimated (``_later_passes``). ``start``,
    the first begin's free memory, is capped at the ``(1 - mfs) x pre`` SGLang leaves, so that
    with odd capture figures this stays the plain deficit rule.
    """
    pre = n.pre_load_avail_gib
    if n.graph_pass is None or n.free_gib is None or not pre:
        return None
    if outcome is Outcome.OOM_GRAPH_CAPTURE and n.tried_gib is None:
        return None
    headroom = (1 - mfs) * pre
    start = min(_capture_start(n) or headroom, headroom)
    current = n.graph_begin_avail_gib if n.graph_begin_avail_gib is not None else start
    begins = list(n.graph_begins or [(n.graph_pass, current)])
    begins = [(name, min(avail, start)) for name, avail in begins]
    spec = ctx.spec or n.speculative
    old_draft = spec and not at_least(ctx.version, DRAFT_IN_BUDGET_FROM)
    n_steps = len(captured_sizes(bs, spec=spec))
    c = step_known if step_known is not None else ctx.priors.step_gib
    draft_w = n.draft_weights_gib or 0.0
    draft_kv = n.draft_kv_gib
    acc = {"fixed": 0.0, "scaled": 0.0, "passes": 0, "ext": 0.0, "ext_passes": 0}
    if n.graph_begins is None:
        acc["fixed"] += start - begins[0][1]  # earlier passes of unknown kind: kept, not scaled

    def add(name: str, size: float, steps: int, step: float) -> float:
        """Count one pass of ``size`` GiB; returns its first step (scaling part)."""
        if GraphPass(name) in PREFILL_PASSES:
            acc["fixed"] += max(0.0, size)
            return max(0.0, size)
        first = max(0.0, size - step * steps)
        acc["scaled"] += first
        acc["passes"] += 1
        acc["fixed"] += min(max(0.0, size), step * steps) - c * steps
        if name == GraphPass.DRAFT_EXTEND:
            acc["ext"] += first
            acc["ext_passes"] += 1
        return first

    def draft_between(name: str, following: str | None) -> bool:
        """0.5.10 loads the draft's weights and pool after the target's last pass."""
        return old_draft and not GraphPass(name).is_draft and (
            following is None or GraphPass(following).is_draft
        )

    for (name, b0), (following, b1) in itertools.pairwise(begins):
        size = b0 - b1
        if draft_between(name, following):
            size -= draft_w + (draft_kv or 0.0)
            acc["fixed"] += draft_w
        add(name, size, n_steps, c)
    name, begin = begins[-1]
    free = min(n.free_gib, begin)
    gpass = GraphPass(name)
    exact = outcome is Outcome.OOM_RUNTIME
    later: list[tuple[GraphPass, float]] = []
    if exact:
        size = begin - free
        if draft_between(name, None):
            size -= draft_w + (draft_kv or 0.0)
            acc["fixed"] += draft_w
        add(name, size, n_steps, c)
    else:
        assert n.tried_gib is not None
        tried = n.tried_gib + ROUNDING_GIB
        ended = n.graph_passes_ended or 0
        if draft_between(name, None) and ended >= len(begins):
            # The target's graphs are done: the draft's weights (not yet shown) or its pool
            # failed to allocate; the draft graphs are still to come.
            size = begin - free
            if n.draft_weights_gib is None:
                acc["fixed"] += tried
            else:
                size -= draft_w
                acc["fixed"] += draft_w
                draft_kv = tried
            first = add(name, size, n_steps, c)
        else:
            done, steps = n.graph_steps_done or 0, n.graph_steps_total or n_steps
            # A later step tried just its own size; after a failed first step, the rest are
            # small.
            step = tried if done >= 1 else c
            rest = max(0, steps - done - 1) * step
            # What this pass holds before the failing step: after a first step that failed,
            # only its static buffers (begin to progress bar); free memory missing beyond that
            # is needed again but is not this pass's size.
            bar = n.graph_last_avail_gib if n.graph_last_avail_gib is not None else begin
            held = begin - free if done >= 1 else max(0.0, begin - max(bar, free))
            acc["fixed"] += (begin - free) - held
            first = add(name, held + tried + rest, steps, step)
        later = _later_passes(gpass, n, ctx, extend_off)
        if gpass is GraphPass.TARGET_PREFILL and (n.graph_steps_done or 0) == 0 and (
            n.graph_last_bs
        ):
            # The same model's activations grow with the tokens a graph runs: the decode (or
            # verify) graph runs bs x tokens per request, the failed prefill shape
            # ``graph_last_bs`` tokens (the bar's num_tokens).
            per_req = (n.speculative_num_draft_tokens or SPEC_AUTO_STEPS + 1) if spec else 1
            ratio = min(1.0, bs * per_req / n.graph_last_bs)
            later = [(p, share * ratio) for p, share in later]
        for p, share in later:
            acc["scaled"] += share * first
            acc["passes"] += 1
            if p is GraphPass.DRAFT_EXTEND:
                acc["ext"] += share * first
                acc["ext_passes"] += 1
    later_scaled = sum(share * first for _, share in later) if later else 0.0
    fit = _PassFit(
        bs=bs,
        spec=spec,
        fixed=acc["fixed"] + 2 * ROUNDING_GIB,
        scaled=acc["scaled"],
        step=c,
        passes=int(acc["passes"]),
        later_scaled=later_scaled,
        later_passes=len(later),
        ext_scaled=acc["ext"],
        ext_passes=int(acc["ext_passes"]),
        ext_later=any(p is GraphPass.DRAFT_EXTEND for p, _ in later),
        exact=exact,
    )
    return fit, draft_kv if old_draft else None


def _graph_slope(n: Numbers, bs: int, facts: _Facts) -> float | None:
    """GiB per unit of max bs of the first capture step, from a capture OOM (also sets ``c``)."""
    if n.tried_gib is None or bs <= 0:
        return None
    done = n.graph_steps_done or 0
    if done == 0:
        # The failing step is the first: it tried a x bs + c.
        return (n.tried_gib + ROUNDING_GIB) / bs
    step = n.tried_gib + ROUNDING_GIB  # a later step tried just its own c
    facts.c = max(facts.c or 0.0, step)
    start = n.graph_begin_avail_gib if n.graph_begin_avail_gib is not None else n.pool_end_avail_gib
    if start is None or n.graph_last_avail_gib is None:
        return None
    consumed = start - n.graph_last_avail_gib + 2 * ROUNDING_GIB
    return max(0.0, consumed - n.tried_gib * done) / bs


def _bs_ladder(current: int, bounds: Bounds) -> list[int]:
    """Graph bs to consider, largest first: ``current``, smaller captured sizes, the floor."""
    floor = bounds.graph_bs_floor
    if current <= floor:
        return [floor]
    smaller = [b for b in capture_bs_list(current) if floor <= b < current]
    ladder = [current, *sorted(smaller, reverse=True)]
    if ladder[-1] != floor:
        ladder.append(floor)
    return ladder


def _check(bounds: Bounds) -> None:
    if not 0 < bounds.mem_fraction_floor < bounds.mem_fraction_ceiling <= 1:
        raise PolicyError(
            f"bounds need 0 < mem_fraction_floor ({bounds.mem_fraction_floor}) < "
            f"mem_fraction_ceiling ({bounds.mem_fraction_ceiling}) <= 1",
            remedy="fix [policy] mem_fraction_floor / mem_fraction_ceiling",
        )
    if bounds.graph_bs_floor < 1 or bounds.max_attempts < 1:
        raise PolicyError(
            f"bounds need graph_bs_floor >= 1 and max_attempts >= 1, got "
            f"{bounds.graph_bs_floor} and {bounds.max_attempts}",
            remedy="fix [policy] graph_bs_floor / max_attempts",
        )


def next_params(
    initial: LaunchParams,
    bounds: Bounds,
    history: Sequence[AttemptRecord],
    *,
    tp: int | None = None,
    sglang_version: str | None = None,
    priors: Priors = DEFAULT_PRIORS,
    estimate: Estimate | None = None,
) -> Decision:
    """What to launch after ``history`` (oldest first), or give up.

    - No history: ``initial`` as configured.
    - Last attempt ready: its params again (made explicit where the log showed them).
    - bad_argument / model_not_found / port_in_use / cuda_error_other / other: give up.
    - hang / killed / nccl_error / incomplete: the same params again.
    - oom_weights: give up (mem-fraction cannot make weights fit).
    - Memory outcomes: new explicit params from the numbers, strictly inside the known brackets,
      within ``bounds``; give up when no bracket is left even at the bs floor.
    - Give up once ``bounds.max_attempts`` attempts have run since the last ready one.

    ``tp`` and ``sglang_version`` only serve SGLang's auto rules when an auto param was launched
    and the log did not show its value (assumed 1 and 0.5.23 when not given). ``priors``: the
    guesses for what the logs do not show yet (:class:`~launcher.memory.priors.Priors`).
    ``estimate``: the memory estimate of this server (its model, GPUs, flags), whose graph and
    warmup figures size the graph bs of the relaunch after a pool too small (no capture has run
    yet, so no log shows them); None: the graph bs is kept there.
    Raises ``PolicyError`` for impossible bounds.
    """
    _check(bounds)
    if not history:
        return Decision(initial, "first attempt: as configured")
    last = history[-1]
    spec = any(r.numbers.speculative for r in history)
    ctx = _Context(
        next((r.numbers.total_gib for r in reversed(history) if r.numbers.total_gib), None),
        tp or ASSUMED_TP,
        sglang_version or ASSUMED_VERSION,
        spec=spec,
        draft_extend_off=last.params.env_value(DISABLE_DRAFT_EXTEND_ENV) == "1",
        priors=priors,
    )
    mfs, bs = _resolve(last.params, last.numbers, ctx)
    if last.outcome is Outcome.READY:
        return Decision(_same(last), "last attempt was ready: relaunch with its settings")
    fix = prescription(last.numbers, ctx.version)
    if fix is not None and last.outcome is Outcome.BAD_ARGUMENT:
        if not bounds.apply_prescribed_fixes:
            return Decision(
                None,
                f"SGLang's error prescribes its fix: {fix.describe()}; set it in the server's "
                f"config, or set [policy] apply_prescribed_fixes = true. Config change:\n"
                f"{fix.toml()}",
            )
        fixed = fix.apply(last.params)
        if fix.applied_in(last.params) or any(r.params == fixed for r in history[:-1]):
            return Decision(None, f"SGLang's prescribed fix ({fix.describe()}) was applied "
                            "and did not help; read the log")
        return Decision(fixed, f"applying the fix SGLang's error prescribes: {fix.describe()}")
    if last.outcome in _FATAL_REASONS:
        return Decision(None, f"{last.outcome.value}: {_FATAL_REASONS[last.outcome]}")
    if last.outcome is Outcome.OOM_WEIGHTS:
        return Decision(None, _weights_reason(last.numbers, last.phase, ctx.tp))
    since_ready = len(history) - max(
        (i + 1 for i, r in enumerate(history) if r.outcome is Outcome.READY), default=0
    )
    if since_ready >= bounds.max_attempts:
        return Decision(
            None,
            f"gave up after {since_ready} attempts (max_attempts), last {last.outcome.value} "
            f"at {LaunchParams(mfs, bs).describe()}; raise [policy] max_attempts, or the "
            f"model {_MORE_HARDWARE}",
        )
    if last.outcome in _TRANSIENT:
        return Decision(_same(last), f"{last.outcome.value}: retry with the same settings")
    if last.outcome is Outcome.HYBRID_STATE_TOO_SMALL:
        decision = _hybrid_decision(last, mfs, bounds, ctx)
        return _graph_aware(decision, last, bs, bounds, estimate, ctx)
    return _memory_decision(last, mfs, bs, bounds, _learn(history, ctx, bounds), estimate)


def _same(rec: AttemptRecord) -> LaunchParams:
    """The record's params, with auto values replaced by what its log showed (if it did)."""
    p, n = rec.params, rec.numbers
    mfs = p.mem_fraction_static if p.mem_fraction_static is not None else n.mem_fraction_static
    bs = p.cuda_graph_max_bs if p.cuda_graph_max_bs is not None else n.cuda_graph_max_bs
    return replace(p, mem_fraction_static=mfs, cuda_graph_max_bs=bs)


def _shows_hybrid(rec: AttemptRecord, version: str) -> bool:
    """Whether an attempt shows a hybrid (Mamba / linear-attention) model: a ``Mamba Cache is
    allocated`` line or a state-cache error, a Mamba knob in its params, or a strategy in the
    args dump that only a hybrid resolves to. The dump's strategy alone is no sign: 0.5.10
    turns ``auto`` into ``no_buffer`` for every model (server_args.py:964-967), and from the
    new spelling on ``auto`` stays for models without Mamba state (0.5.23
    arg_groups/overrides.py ``_mamba_radix_cache_resolution`` returns nothing for them)."""
    n, p = rec.numbers, rec.params
    if n.mamba_cache_size is not None or rec.outcome is Outcome.HYBRID_STATE_TOO_SMALL:
        return True
    if (p.mamba_strategy, p.max_mamba_cache_size, p.mamba_full_memory_ratio) != (None,) * 3:
        return True
    shown = n.mamba_strategy
    if shown is None or shown == "auto":
        return False
    return at_least(version, MAMBA_RADIX_SPELLING_FROM) or shown != "no_buffer"


def _hybrid_decision(last: AttemptRecord, mfs: float, bounds: Bounds, ctx: _Context) -> Decision:
    """A 0.5.23 hybrid state-cache error ("Not enough GPU memory for hybrid (mamba/linear-
    attention) state cache" or "... state cache is too small to serve any requests").

    SGLang's message says "Try: (1) reduce --max-running-requests, (2) increase
    --mem-fraction-static, (3) reduce --speculative-num-draft-tokens", but its sizing reads no
    running-request count where these errors can fire (0.5.23 kv_cache_configurator.py):
    ``_handle_max_mamba_cache`` (l.3229-3399) takes the slot count K from a configured
    ``--max-mamba-cache-size``, or (radix cache off) from ``--max-running-requests`` itself,
    which is at least 1, or else from ``rest x r / (1 + r)`` alone (r =
    ``--mamba-full-memory-ratio``); "not enough" is K <= 0. ``resolve_max_num_reqs``
    (l.3119-3160) serves ``min(requests, K // slots per request)`` and is "too small" only when
    ``K // slots`` is 0. So lowering the running requests cannot cure either; this never does.

    - A configured ``--max-mamba-cache-size`` is the slot count: it is doubled.
    - Else the fraction is raised until K holds ``MIN_RUNNING_REQUESTS`` requests' slots: K
      grows by one per ``per_req x (1 + D / slots)`` (D the draft tokens; ``per_req`` without
      speculative decoding) of state budget, i.e. per ``(1 + r) / r`` times that of rest, which
      grows by ``pre`` per unit of fraction. The figures are "Not enough"'s K and
      ``mamba_cache_per_req``, ``Load weight begin``'s ``pre`` and the server_args dump's
      strategy (slots per request, ``modelfacts.mamba_slot_ratio``; ``auto`` resolves to
      ``extra_buffer`` with overlap, 5).
    - Without those figures (0.5.23 prints no per-request size with "too small", and its
      ``Mamba Cache is allocated`` line only after that check), the fraction is raised by
      ``STEP_FRACTION``.

    Capped at the ceiling; at the ceiling already, give up. The speculative shape is never
    touched (it is the experiment).
    """
    p, n = last.params, last.numbers
    head = "hybrid state cache too small"
    if n.mamba_cache_size is not None:
        head += f" (max_mamba_cache_size={n.mamba_cache_size})"
    if p.max_mamba_cache_size is not None:
        new = p.max_mamba_cache_size * 2
        return Decision(replace(p, mem_fraction_static=mfs, max_mamba_cache_size=new),
                        f"{head}; max_mamba_cache_size {p.max_mamba_cache_size}→{new}")
    ceiling = _down(bounds.mem_fraction_ceiling)
    if _down(mfs) >= ceiling:
        return Decision(None, f"{head} at mem_fraction_static {mfs:.3f}, the ceiling; the "
                        f"model {_MORE_HARDWARE}")
    grow = _state_cache_growth(p, n, ctx)
    target, why = (_up(mfs + grow[0]), grow[1]) if grow else (_down(mfs + STEP_FRACTION), "")
    new_mfs = _f(min(target, ceiling))
    return Decision(replace(p, mem_fraction_static=new_mfs),
                    f"{head}; fraction {mfs:.3f}→{new_mfs:.3f}{why}")


def _state_cache_growth(p: LaunchParams, n: Numbers, ctx: _Context) -> tuple[float, str] | None:
    """The fraction a hybrid state cache needs to hold ``MIN_RUNNING_REQUESTS`` requests'
    slots, and the reason's words; None without the figures (see ``_hybrid_decision``)."""
    k, pre = n.mamba_cache_size, n.pre_load_avail_gib
    if k is None or pre is None or pre <= 0:
        return None
    if n.mamba_per_req_mib is None or n.mamba_per_req_mib <= 0:
        return None
    strategy = n.mamba_strategy or "auto"
    slots = mamba_slot_ratio("extra_buffer" if strategy == "auto" else strategy, overlap=True)
    # Draft tokens: the dump's, else SGLang's auto shape (3, 1, 4).
    spec = ctx.spec or n.speculative
    d = (n.speculative_num_draft_tokens or SPEC_AUTO_STEPS + 1) if spec else 0
    per_req = n.mamba_per_req_mib / 1024
    slot = per_req * (1 + d / slots)
    ratio = p.mamba_full_memory_ratio or MAMBA_FULL_MEMORY_RATIO
    need = slots * MIN_RUNNING_REQUESTS
    # K is a floor: one slot more covers the fraction it dropped.
    rest = (need - k + 1) * slot * (1 + ratio) / ratio
    return rest / pre, (
        f" (state for {MIN_RUNNING_REQUESTS} requests: {need} slots of "
        f"{slot * 1024:.0f} MiB; SGLang sizes it without max_running_requests)"
    )


def _weights_reason(n: Numbers, phase: Phase, tp: int) -> str:
    if phase is Phase.INIT:
        return (
            f"out of memory before weight load ({_gib(n.free_gib)} GiB free of "
            f"{_gib(n.total_gib)}): other processes hold the GPU; free it, or the model "
            f"{_MORE_HARDWARE}"
        )
    return (
        f"weights do not fit: loading needed {_gib(n.tried_gib)} GiB more with "
        f"{_gib(n.free_gib)} free of {_gib(n.pre_load_avail_gib)} pre-load per GPU at tp={tp}; "
        f"mem-fraction cannot help, the model {_MORE_HARDWARE}"
    )


def _gib(value: float | None) -> str:
    return "?" if value is None else f"{value:.2f}"


def _memory_decision(
    last: AttemptRecord, mfs: float, raw_bs: int, bounds: Bounds, facts: _Facts,
    estimate: Estimate | None = None,
) -> Decision:
    # Under speculative decoding graph bs above the running-request cap captures nothing more:
    # the search runs on the bs SGLang really captures.
    bs = _cap_of(last.params, last.numbers, facts.ctx.spec, raw_bs)
    ceiling = _down(bounds.mem_fraction_ceiling)
    if facts.lo > ceiling:
        return Decision(
            None,
            f"the KV cache needs mem_fraction_static > {_f(facts.lo - 1)}, above the ceiling "
            f"{bounds.mem_fraction_ceiling:.3f}: the weights leave too little room; the model "
            f"{_MORE_HARDWARE}",
        )
    ladder = _bs_ladder(bs, bounds)
    open_bs = [b for b in ladder if facts.lo <= facts.hi(b, ceiling)]
    if not open_bs:
        floor_bs = ladder[-1]
        return Decision(
            None,
            f"no mem_fraction_static fits even at cuda_graph_max_bs={floor_bs}: the KV cache "
            f"needs > {_f(facts.lo - 1)}, graphs and warmup OOM at >= "
            f"{_f(facts.hi(floor_bs, ceiling) + 1)} (floor {bounds.mem_fraction_floor:.3f}); "
            f"the model {_MORE_HARDWARE}, or disable CUDA graphs",
        )
    extend_off = False
    if facts.has_model():
        milli, new_bs = _by_model(facts, open_bs, ceiling)
        if _draft_extend_switch(facts, bounds) and facts.estimate(new_bs) < max(
            facts.lo, facts.soft_lo()
        ):
            # Fraction and graph bs cannot make room with a useful KV pool: the third lever.
            switched = _by_model(facts, open_bs, ceiling, without_extend=True)
            if switched != (milli, new_bs):
                (milli, new_bs), extend_off = switched, True
    else:
        milli, new_bs = _by_step(last, mfs, ladder[0], facts, bounds, ladder, ceiling)
    graphs_note = ""
    if (last.outcome is Outcome.KV_TOO_SMALL and estimate is not None
            and facts.pre is not None and not facts.has_model()):
        open_here = [b for b in open_bs if b <= new_bs and facts.hi(b, ceiling) >= milli]
        new_bs, graphs_note = _graph_bs_for(estimate, _f(milli), facts.pre, new_bs, open_here)
    milli = min(milli, max(facts.lo, _deficit_cap(last, mfs, new_bs, bs, facts)))
    params = replace(last.params, mem_fraction_static=_f(milli))
    if new_bs != bs or raw_bs == bs or params.cuda_graph_max_bs is None:
        params = replace(params, cuda_graph_max_bs=new_bs if new_bs != bs else raw_bs)
    if extend_off:
        params = params.with_env(DISABLE_DRAFT_EXTEND_ENV, "1")
    why = _why(last, mfs, bs, milli, new_bs, facts) + graphs_note
    if extend_off:
        why += f"; {DISABLE_DRAFT_EXTEND_ENV}=1 (draft extend graph off)"
    if facts.ctx.spec:
        why += "; speculative params unchanged"
    return Decision(params, why)


def _graph_need(e: Estimate, bs: int, pre: float) -> float:
    """GiB the estimate says graphs and warmup take at graph max ``bs``, with the margin (and,
    up to 0.5.15, the draft's weights, loaded from the same headroom)."""
    need = e.graphs_gib(bs) + e.activations_gib() + margin_gib(pre)
    return need if e.one_budget else need + e.draft_weights_gib


def _graph_bs_for(
    e: Estimate, mfs: float, pre: float, bs: int, ladder: Sequence[int]
) -> tuple[int, str]:
    """After a pool too small: the largest graph bs (``bs`` or down ``ladder``) whose graphs and
    warmup, by the estimate, fit the headroom ``(1 - mfs) x pre`` the relaunch leaves; the
    smallest on the ladder when none does. Returns it and the reason's words ("" when ``bs``
    fits). The figures are the estimate's for the model; no capture has run yet, so no log
    shows them."""
    headroom = (1 - mfs) * pre
    need = _graph_need(e, bs, pre)
    if need <= headroom or not ladder:
        return bs, ""
    fits = [b for b in ladder if _graph_need(e, b, pre) <= headroom]
    new = fits[0] if fits else ladder[-1]
    if new == bs:
        return bs, ""
    return new, (f"; the estimate's graphs and warmup at bs {bs} ({need:.2f} GiB with the "
                 f"margin) exceed the {headroom:.2f} GiB headroom at {mfs:.3f}: graph bs "
                 f"{bs}→{new} ({_graph_need(e, new, pre):.2f} GiB)")


def _graph_aware(
    decision: Decision, last: AttemptRecord, bs: int, bounds: Bounds,
    estimate: Estimate | None, ctx: _Context,
) -> Decision:
    """A hybrid state-cache decision with its graph bs lowered, as after ``kv_too_small``,
    where the estimate says the raised fraction leaves too little headroom for the graphs."""
    p, pre = decision.params, last.numbers.pre_load_avail_gib
    if p is None or estimate is None or not pre or p.mem_fraction_static is None:
        return decision
    cap = _cap_of(last.params, last.numbers, ctx.spec, bs)
    new_bs, note = _graph_bs_for(estimate, p.mem_fraction_static, pre, cap,
                                 _bs_ladder(cap, bounds))
    if not note:
        return decision
    return Decision(replace(p, cuda_graph_max_bs=new_bs), decision.reason + note)


def _draft_extend_switch(facts: _Facts, bounds: Bounds) -> bool:
    """Whether the policy may turn the draft-extend graph off (the third lever)."""
    ctx = facts.ctx
    return (
        bounds.allow_disable_draft_extend_graph
        and ctx.spec
        and not ctx.draft_extend_off
        and at_least(ctx.version, DRAFT_EXTEND_SWITCH_FROM)
        and any(f.ext_scaled > 0 for f in facts.fits)
    )


def _deficit_cap(
    last: AttemptRecord, mfs: float, new_bs: int, bs: int, facts: _Facts
) -> int:
    """The highest fraction the OOM's own deficit allows at an unchanged graph bs.

    ``tried - free`` more GiB are needed than the failed attempt had, so at the same bs the
    fraction must fall by at least that over ``pre`` (whatever a model estimates).
    """
    n = last.numbers
    size = facts.pre or n.total_gib
    if (
        last.outcome not in (Outcome.OOM_GRAPH_CAPTURE, Outcome.OOM_RUNTIME)
        or new_bs < bs
        or n.tried_gib is None
        or n.free_gib is None
        or not size
    ):
        return _MILLI
    # A 0.5.10 draft pool in the same headroom shrinks with the fraction: each thousandth
    # frees (1 + k) thousandths of pre.
    return _down(mfs - max(0.0, n.tried_gib - n.free_gib) / (size * (1 + facts.draft_kv_ratio)))


def _by_model(
    facts: _Facts, open_bs: list[int], ceiling: int, *, without_extend: bool = False
) -> tuple[int, int]:
    """Highest estimated-fitting fraction at the largest bs that leaves a useful KV pool."""
    want = max(facts.lo, facts.soft_lo())
    for b in open_bs:
        est = facts.estimate(b, without_extend=without_extend)
        if est >= want:
            return min(est, facts.hi(b, ceiling)), b
    # Nothing is estimated to fit with a useful pool. At the smallest open bs, try the most KV
    # the brackets allow without the estimate's guesses: if a window exists it is at the top,
    # and a failure there narrows the brackets with exact figures.
    b = open_bs[-1]
    est = facts.estimate(b, optimistic=True, without_extend=without_extend)
    hi = facts.hi(b, ceiling)
    if est < facts.lo:
        # The graph estimate is below a fraction known to leave too small a KV pool, so it is
        # wrong and says nothing: proposing that bound alone would walk the pool up a
        # thousandth a try. Take what the KV figures imply (soft_lo: SGLang's
        # minimum or the weights plus a cushion, a pool found too small times KV_GROWTH);
        # where the brackets cap that, bisect between the two brackets.
        grown = facts.soft_lo()
        return (grown if grown <= hi else (facts.lo + hi + 1) // 2), b
    return max(facts.lo, min(est, hi)), b


def _by_step(
    last: AttemptRecord,
    mfs: float,
    bs: int,
    facts: _Facts,
    bounds: Bounds,
    ladder: list[int],
    ceiling: int,
) -> tuple[int, int]:
    """Without a graph model: SGLang's stated minimum, the deficit, or a fixed step."""
    n = last.numbers
    pre = facts.pre
    if last.outcome is Outcome.KV_TOO_SMALL:
        # SGLang's stated minimum (or weights / pre) plus a cushion, never the auto value: the
        # auto value keeps only what SGLang's rule keeps for graphs, and a 0.60 whose minimum
        # was 0.648 went to 0.856 and then OOMed at warmup. Without figures, a fixed step (at
        # least the auto value's level when the GPU size is known). Once a pool > 0 was too
        # small, the need is unknown: take the most the brackets allow (an OOM there brings
        # the graph figures).
        if facts.knows_kv():
            target = facts.soft_lo()
        else:
            target = max(facts.lo, _down(mfs + STEP_FRACTION))
            auto = facts.auto_target(bs)
            if auto is not None:
                target = max(target, auto)
        if facts.small_pool > 0:
            target = facts.hi(bs, ceiling)
    else:
        # The deficit in fraction terms; without ``pre`` the GPU size stands in for it, and
        # before warmup the warmup guess is added. No figures at all: SGLang's own advice.
        step = STEP_FRACTION
        size = pre or n.total_gib
        if n.tried_gib is not None and n.free_gib is not None and size:
            deficit = n.tried_gib - n.free_gib + margin_gib(size)
            if last.outcome is not Outcome.OOM_RUNTIME:
                deficit += facts.ctx.priors.warmup_gib(size)
            step = deficit / size
        target = _down(mfs - step)
    if target >= facts.lo and facts.lo <= facts.hi(bs, ceiling):
        return min(target, facts.hi(bs, ceiling)), bs
    # The fraction would cross the floor or the too-small bound (or nothing is open at this
    # bs): halve the graph bs. hi() only grows as bs shrinks, so the floor is open if any is.
    half = max(bounds.graph_bs_floor, bs // 2)
    b = next(x for x in ladder if x <= half and facts.lo <= facts.hi(x, ceiling))
    return max(facts.lo, min(target, facts.hi(b, ceiling))), b


def _why(last: AttemptRecord, mfs: float, bs: int, milli: int, new_bs: int, facts: _Facts) -> str:
    n = last.numbers
    pre = f"{facts.pre:.2f}" if facts.pre is not None else "?"
    if last.outcome is Outcome.KV_TOO_SMALL:
        stated = (
            f", SGLang's minimum {n.min_mem_fraction:.4f}" if n.min_mem_fraction is not None else ""
        )
        head = f"KV cache too small{stated}"
    else:
        label = {
            Outcome.OOM_GRAPH_CAPTURE: "capture OOM",
            Outcome.OOM_KV_CACHE: "KV-pool OOM",
            Outcome.OOM_RUNTIME: f"{last.phase.value} OOM",
        }[last.outcome]
        where = f" in {n.graph_pass}" if n.graph_pass and last.outcome is (
            Outcome.OOM_GRAPH_CAPTURE) else ""
        head = (f"{label}{where}: needed {_gib(n.tried_gib)} GiB, {_gib(n.free_gib)} free of "
                f"{pre} pre-load")
        start = _capture_start(n)
        if start is not None and last.outcome is Outcome.OOM_GRAPH_CAPTURE:
            head += f", {start:.2f} free when capture began"
    kept = f"{bs} kept" if new_bs == bs else f"{bs}→{new_bs}"
    return f"{head}; fraction {mfs:.3f}→{_f(milli):.3f}, graph bs {kept}"


def capture_oom_ladder(
    initial: LaunchParams,
    bounds: Bounds,
    *,
    gpu_total_gib: float | None,
    tp: int,
    sglang_version: str,
) -> list[LaunchParams]:
    """The params ``next_params`` would try after successive capture OOMs with no numbers.

    What ``launcher plan`` shows. Auto params are resolved with SGLang's auto rules when the
    GPU size is known, else assumed (see ``resolve_params``). The list holds the retries only
    (not ``initial``) and ends where the policy would give up.
    """
    _check(bounds)
    history: list[AttemptRecord] = []
    params = initial
    ladder: list[LaunchParams] = []
    while True:
        numbers = Numbers(total_gib=gpu_total_gib)
        history.append(AttemptRecord(params, Outcome.OOM_GRAPH_CAPTURE, Phase.CUDA_GRAPH, numbers))
        decision = next_params(initial, bounds, history, tp=tp, sglang_version=sglang_version)
        if decision.params is None:
            return ladder
        ladder.append(decision.params)
        params = decision.params
