"""Learning from the fleet: per-component cost corrections from the ledger's observations.

Pure (no I/O). The estimator (``launcher.memory.estimate``) guesses each memory component of a
server per GPU from the model's files (``CostGuess``); the ledger keeps, per attempt, what the
log showed those components cost (``launcher.sglang.observed.Observed``) beside the guess the
attempt started from. ``calibrate`` turns observations into corrections per component
(``Correction``): the median of observed / guessed over the observations of one key (weights,
KV and state bytes, each capture pass or all of them), the CUDA context as a difference, the
activations only ever raised (by OOMs after ready). Graph memory has a part that does not grow
with the model or the bs; ``apply`` keeps the measured figure as a bound and, once
observations lie far enough apart, fits that part (``CalibratedEstimate``).
Ratios, not absolute figures, are what carries over: a second model of the same architecture
on the same GPU type (Qwen3-32B after Qwen3-8B) has other sizes, but the estimator errs on it
the same way (the same kernels' workspaces, the same graph buffers per batch size, the same
allocator rounding), so its guesses corrected by the first model's ratios start from measured
costs.

Keys (``ObservationKey``): architecture (config.json ``architectures[0]``), GPU model (the
``nvidia-smi`` name), SGLang version and speculative settings. ``select`` prefers observations
of the exact key, then of the same architecture and GPU model under other versions or
speculative settings (weights and KV carry over; the draft's figures only match like with like
and are skipped when the speculative settings differ); nothing else is used (another GPU type
or architecture says nothing about this one).
"""

from __future__ import annotations

import dataclasses
import enum
import statistics
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from typing import Any

from launcher.memory.estimate import DEFAULT_MARGIN, Estimate
from launcher.sglang.modelfacts import GIB
from launcher.sglang.observed import Observed
from launcher.sglang.phases import GraphPass

__all__ = [
    "ALL_PASSES",
    "CALIBRATED_MARGIN",
    "COLD_MARGIN",
    "CalibratedEstimate",
    "Correction",
    "CostGuess",
    "KeyedObservation",
    "Match",
    "ObservationKey",
    "apply",
    "calibrate",
    "corrected",
    "describe",
    "guess_of",
    "learn",
    "learn_estimate",
    "select",
]

# The margin ``launcher.memory.estimate.choose`` leaves (a share of the estimated graph +
# activation memory): the estimator's cold prior, and what measured costs of this
# architecture on this GPU type warrant (the log's rounding, run-to-run noise, and the spread
# between observations, added on top).
COLD_MARGIN = DEFAULT_MARGIN
CALIBRATED_MARGIN = 0.06


@dataclass(frozen=True)
class ObservationKey:
    """What observations must share to correct each other. Empty strings: unknown."""

    architecture: str = ""
    gpu_model: str = ""
    sglang_version: str = ""
    speculative: str = ""  # launcher.sglang.observed.speculative_key; "" when off

    @property
    def family(self) -> tuple[str, str]:
        """(architecture, GPU model): the wider key whose weights / KV ratios carry over."""
        return (self.architecture, self.gpu_model)

    def as_dict(self) -> dict[str, str]:
        return {"architecture": self.architecture, "gpu_model": self.gpu_model,
                "sglang_version": self.sglang_version, "speculative": self.speculative}


ALL_PASSES = "*"  # a CostGuess.graph_gib key: every capture pass together


@dataclass(frozen=True)
class CostGuess:
    """An estimate of one server's memory components per GPU (GiB unless named otherwise),
    for the setting an attempt ran with.

    ``graph_gib`` maps a capture pass (``GraphPass`` value), or ``ALL_PASSES``, to the memory
    the estimator expects it to take at graph bs ``graph_bs``. Of the ``ALL_PASSES`` figure,
    ``attention_buffers_gib`` is the attention backend's buffers (allocated before the first
    pass) and ``prefill_graphs_gib`` 0.5.23's prefill passes (target and draft prefill), the
    parts that do not grow with the graph bs (0: not told apart, a row recorded before they
    were; see ``_graph_ratios``). ``activations_gib`` is what
    warmup needs outside the static pool beyond the graphs; ``pre_load_free_gib`` what the
    estimator expects free before the weights (the GPU less other processes and the CUDA
    context).
    """

    weights_gib: float
    kv_bytes_per_token: float
    graph_gib: Mapping[str, float] = field(default_factory=dict)
    graph_bs: int = 0
    attention_buffers_gib: float = 0.0
    prefill_graphs_gib: float = 0.0
    activations_gib: float = 0.0
    draft_weights_gib: float = 0.0
    draft_kv_bytes_per_token: float = 0.0
    mamba_gib_per_slot: float = 0.0
    pre_load_free_gib: float = 0.0

    def as_dict(self) -> dict[str, Any]:
        return {
            "weights_gib": self.weights_gib, "kv_bytes_per_token": self.kv_bytes_per_token,
            "graph_gib": dict(self.graph_gib), "graph_bs": self.graph_bs,
            "attention_buffers_gib": self.attention_buffers_gib,
            "prefill_graphs_gib": self.prefill_graphs_gib,
            "activations_gib": self.activations_gib,
            "draft_weights_gib": self.draft_weights_gib,
            "draft_kv_bytes_per_token": self.draft_kv_bytes_per_token,
            "mamba_gib_per_slot": self.mamba_gib_per_slot,
            "pre_load_free_gib": self.pre_load_free_gib,
        }

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> CostGuess | None:
        """The inverse of ``as_dict``; None when ``data`` lacks the weights or KV figure (a
        row recorded without an estimate)."""
        if data.get("weights_gib") is None or data.get("kv_bytes_per_token") is None:
            return None
        graphs = data.get("graph_gib") or {}
        return cls(
            weights_gib=float(data["weights_gib"]),
            kv_bytes_per_token=float(data["kv_bytes_per_token"]),
            graph_gib={str(k): float(v) for k, v in dict(graphs).items()},
            graph_bs=int(data.get("graph_bs") or 0),
            attention_buffers_gib=float(data.get("attention_buffers_gib") or 0.0),
            prefill_graphs_gib=float(data.get("prefill_graphs_gib") or 0.0),
            activations_gib=float(data.get("activations_gib") or 0.0),
            draft_weights_gib=float(data.get("draft_weights_gib") or 0.0),
            draft_kv_bytes_per_token=float(data.get("draft_kv_bytes_per_token") or 0.0),
            mamba_gib_per_slot=float(data.get("mamba_gib_per_slot") or 0.0),
            pre_load_free_gib=float(data.get("pre_load_free_gib") or 0.0),
        )


@dataclass(frozen=True)
class KeyedObservation:
    """One attempt's observation as the ledger holds it: its key, what the log showed, and
    the guess the attempt started from (None when it was recorded without one)."""

    key: ObservationKey
    observed: Observed
    guess: CostGuess | None
    outcome: str | None = None
    recorded_at: float = 0.0


class Match(enum.StrEnum):
    """Which observations a correction came from. Values are stable (plan, events)."""

    EXACT = "exact"  # same architecture, GPU model, SGLang version and speculative settings
    FAMILY = "family"  # same architecture and GPU model, other version / speculative settings
    NONE = "none"  # no observation: the estimator's guesses as they are


@dataclass(frozen=True)
class Correction:
    """Factors to multiply the estimator's guesses by (1.0: no evidence), and their basis.

    ``graph`` holds a factor per capture pass seen (``ALL_PASSES``: all together);
    ``graph_default`` applies to passes not seen (the median of the factors). ``buffers``:
    the attention backend's buffers, observed / guessed, when the observations told the
    parts of graph memory apart (``_graph_ratios``), and ``prefill_graphs`` 0.5.23's prefill
    passes likewise; then ``graph[ALL_PASSES]``, the fit (``graph_fixed_gib``) and
    ``graph_measured_gib`` are of the rest (the passes that grow with the bs) alone. None: the
    graph factor compares the totals (rows recorded before guesses told the parts apart).
    ``spread`` is
    the largest relative disagreement between observations of one component (0 with one
    observation): how far a chooser should trust the corrected figures beyond
    ``CALIBRATED_MARGIN``.
    """

    weights: float = 1.0
    kv: float = 1.0
    graph: Mapping[str, float] = field(default_factory=dict)
    graph_default: float = 1.0
    buffers: float | None = None
    prefill_graphs: float = 1.0  # 0.5.23's prefill passes (only with ``buffers`` set)
    activations: float = 1.0
    draft_weights: float = 1.0
    draft_kv: float = 1.0
    mamba: float = 1.0
    context_gib: float = 0.0  # GiB more than guessed taken before the weights (CUDA, NCCL)
    graph_bs: int = 0  # the largest graph bs whose capture was measured (0: none)
    graph_measured_gib: float = 0.0  # the median of the measured figures (see ``buffers``)
    # With observations of graph memory at guesses far enough apart (other models of the
    # family, other bs): a fit ``measured = graph_fixed_gib + graph_default x guess``.
    graph_fitted: bool = False
    graph_fixed_gib: float = 0.0
    observations: int = 0
    match: Match = Match.NONE
    spread: float = 0.0

    @property
    def margin(self) -> float:
        """The margin for ``estimate.choose`` (share of graphs + activations) this basis
        warrants: the cold one without observations; less once measured, more the more the
        observations disagree (never more than the cold one)."""
        if self.match is Match.NONE:
            return COLD_MARGIN
        extra = 0.03 if self.match is Match.FAMILY else 0.0
        return min(COLD_MARGIN, CALIBRATED_MARGIN + extra + self.spread)

    def as_dict(self) -> dict[str, Any]:
        return {
            "weights": round(self.weights, 4), "kv": round(self.kv, 4),
            "graph": {k: round(v, 4) for k, v in sorted(self.graph.items())},
            "graph_default": round(self.graph_default, 4),
            "buffers": None if self.buffers is None else round(self.buffers, 4),
            "prefill_graphs": round(self.prefill_graphs, 4),
            "activations": round(self.activations, 4),
            "draft_weights": round(self.draft_weights, 4), "draft_kv": round(self.draft_kv, 4),
            "mamba": round(self.mamba, 4), "context_gib": round(self.context_gib, 3),
            "graph_bs": self.graph_bs,
            "graph_measured_gib": round(self.graph_measured_gib, 3),
            "graph_fitted": self.graph_fitted,
            "graph_fixed_gib": round(self.graph_fixed_gib, 3),
            "observations": self.observations,
            "match": self.match.value, "spread": round(self.spread, 4),
            "margin": round(self.margin, 4),
        }


def select(
    history: Iterable[KeyedObservation], key: ObservationKey
) -> tuple[Match, list[KeyedObservation]]:
    """The observations that may correct a server of ``key``, and on which basis.

    Only observations with a guess and an architecture and GPU model count. The exact key's
    observations when there are any; else those of the same (architecture, GPU model).
    """
    usable = [
        h for h in history
        if h.guess is not None and h.key.architecture and h.key.gpu_model
        and h.key.family == key.family
    ]
    if not key.architecture or not key.gpu_model or not usable:
        return Match.NONE, []
    exact = [h for h in usable if h.key == key]
    if exact:
        return Match.EXACT, exact
    return Match.FAMILY, usable


def _ratios(
    rows: Sequence[KeyedObservation],
    observed: Callable[[Observed], float | None],
    guessed: Callable[[CostGuess], float],
) -> list[float]:
    out = []
    for row in rows:
        assert row.guess is not None
        seen, guess = observed(row.observed), guessed(row.guess)
        if seen is not None and seen > 0 and guess > 0:
            out.append(seen / guess)
    return out


# Guesses must differ by this factor (largest / smallest) before a fixed part is fitted.
_FIT_SPREAD = 1.3


def _fit(points: Sequence[tuple[float, float]]) -> tuple[float, float] | None:
    """Least squares ``y = a + k x`` with ``a, k >= 0`` over (guess, measured) points; None
    when the guesses are too close together to tell a fixed part from a proportional one."""
    xs = [x for x, _ in points]
    if len(points) < 2 or min(xs) <= 0 or max(xs) / min(xs) < _FIT_SPREAD:
        return None
    mx = statistics.fmean(xs)
    my = statistics.fmean(y for _, y in points)
    sxx = sum((x - mx) ** 2 for x in xs)
    k = sum((x - mx) * (y - my) for x, y in points) / sxx
    a = my - k * mx
    if a < 0:  # no fixed part: through the origin
        return 0.0, sum(x * y for x, y in points) / sum(x * x for x in xs)
    if k < 0:  # nothing proportional: all fixed
        return my, 0.0
    return a, k


_PREFILL_PASSES = (GraphPass.TARGET_PREFILL.value, GraphPass.DRAFT_PREFILL.value)


def _split(row: KeyedObservation) -> bool:
    """Whether ``row`` tells the parts of graph memory apart: its guess names the attention
    buffers' share and its log showed them (the prefill passes are named in any log)."""
    return (row.guess is not None and row.guess.attention_buffers_gib > 0
            and row.observed.attention_buffers_gib is not None)


@dataclass
class _GraphParts:
    """What ``_graph_ratios`` collects besides the ratios."""

    bs_seen: list[int] = field(default_factory=list)
    totals: list[float] = field(default_factory=list)  # the measured figures the floor uses
    points: list[tuple[float, float]] = field(default_factory=list)  # (guess, measured)
    buffers: list[float] = field(default_factory=list)  # observed / guessed
    prefill: list[float] = field(default_factory=list)  # observed / guessed
    split: bool = False


def _graph_ratios(
    rows: Sequence[KeyedObservation], name: str, parts: _GraphParts | None = None,
) -> list[float]:
    """observed / guessed memory of capture pass ``name`` (``ALL_PASSES``: the sum of every
    pass, only from attempts that got past the capture), at the bs the attempt ran with
    (appended to ``parts.bs_seen``; the measured figures to ``parts.totals``).

    For ``ALL_PASSES``, when any row tells the parts apart (``_split``), only such rows
    count, and each part gets its own ratio: the attention backend's buffers
    (``parts.buffers``) and 0.5.23's prefill passes (``parts.prefill``), which are fixed per
    backend and GPU (FA3 ~0.1 GiB, FlashInfer ~0.57 GiB, 8 MiB per prefill shape:
    ``launcher.memory.priors``), apart from the rest (decode, verify, draft passes), which
    grows with the bs and the model and is what the returned ratios compare (and
    ``parts.totals`` / ``parts.points`` hold). One ratio of them all together, learnt where
    the fixed parts weigh much (a small bs, a small model), scales the growing part by too
    little where they weigh little. Otherwise the totals, buffers included, are compared."""
    split = name == ALL_PASSES and any(_split(r) for r in rows)
    if parts is not None and split:
        parts.split = True
    out = []
    for row in rows:
        o, g = row.observed, row.guess
        if g is None or g.graph_gib.get(name, 0.0) <= 0:
            continue
        if g.graph_bs and o.graph_max_bs and o.graph_max_bs != g.graph_bs:
            continue  # the guess was for another setting than the one that ran
        guessed = g.graph_gib[name]
        seen: float | None
        prefill: float | None = None
        if name == ALL_PASSES:
            if o.ready_avail_gib is None or not o.graph_mem_gib:
                continue
            passes = sum(o.graph_mem_gib.values())
            own = o.attention_buffers_gib or 0.0
            if split:
                rest = guessed - g.attention_buffers_gib - g.prefill_graphs_gib
                if not _split(row) or rest <= 0:
                    continue
                shown = [v for k, v in o.graph_mem_gib.items() if k in _PREFILL_PASSES]
                # Prefill passes the guess had no share for stay in the growing part: taken
                # out here, nothing would add them back.
                prefill = sum(shown) if shown and g.prefill_graphs_gib > 0 else None
                seen, guessed = passes - (prefill or 0.0), rest
            else:
                # the estimate's graphs include the attention backend's buffers, which the log
                # shows before the first pass (``Observed.attention_buffers_gib``)
                seen = passes + own
        else:
            seen = o.graph_mem_gib.get(name)
        if seen is None or seen <= 0:
            continue
        out.append(seen / guessed)
        if parts is None:
            continue
        parts.bs_seen.append(g.graph_bs or o.graph_max_bs or 0)
        if name == ALL_PASSES:
            parts.totals.append(seen)
            parts.points.append((guessed, seen))
            if split:
                parts.buffers.append(own / g.attention_buffers_gib)
                if prefill is not None and g.prefill_graphs_gib > 0:
                    parts.prefill.append(prefill / g.prefill_graphs_gib)
    return out


def _median(values: list[float]) -> float:
    return statistics.median(values) if values else 1.0


def _spread(values: list[float]) -> float:
    if len(values) < 2:
        return 0.0
    mid = statistics.median(values)
    if mid <= 0:  # most observations showed none (buffers): any other one disagrees wholly
        return 0.0 if max(values) <= 0 else 1.0
    return max(abs(v - mid) for v in values) / mid


def _activation_ratios(rows: Sequence[KeyedObservation]) -> list[float]:
    """Lower bounds on activations / guess from OOMs while serving: memory free at ready,
    less what was free when torch failed, plus what it tried to allocate, was needed."""
    out = []
    for row in rows:
        o, guess = row.observed, row.guess
        if (guess is None or guess.activations_gib <= 0 or o.ready_avail_gib is None
                or o.tried_gib is None or o.free_gib is None):
            continue
        need = o.ready_avail_gib - o.free_gib + o.tried_gib
        out.append(max(1.0, need / guess.activations_gib))
    return out


def calibrate(
    rows: Sequence[KeyedObservation], match: Match = Match.EXACT
) -> Correction:
    """Corrections from ``rows`` (all of one key, or of one family: see ``select``).

    Each component's factor is the median of observed / guessed over the rows that showed
    it. Graph memory is compared per captured batch size (observations with another
    ``cuda_graph_max_bs`` still count), the attention backend's buffers and the prefill
    passes apart from the passes that grow with the bs where the rows tell them apart
    (``_graph_ratios``). The draft's factors come only from rows of the exact key (other
    speculative settings size the draft differently). Activations are only ever raised, by
    OOMs after ready (nothing in a good start-up's log measures them).
    """
    if not rows:
        return Correction()
    weights = _ratios(rows, lambda o: o.weights_gib, lambda g: g.weights_gib)
    kv = _ratios(rows, lambda o: o.kv_bytes_per_token, lambda g: g.kv_bytes_per_token)
    mamba = _ratios(rows, lambda o: o.mamba_gib_per_slot, lambda g: g.mamba_gib_per_slot)
    passes = sorted({p for r in rows if r.guess is not None for p in r.guess.graph_gib})
    graph: dict[str, float] = {}
    graph_all: list[float] = []
    parts = _GraphParts()
    for name in passes:
        ratios = _graph_ratios(rows, name, parts)
        if ratios:
            graph[name] = _median(ratios)
            graph_all.extend(ratios)
    draft_w: list[float] = []
    draft_kv: list[float] = []
    if match is Match.EXACT:
        draft_w = _ratios(rows, lambda o: o.draft_weights_gib, lambda g: g.draft_weights_gib)
        draft_kv = _ratios(rows, lambda o: o.draft_kv_bytes_per_token,
                           lambda g: g.draft_kv_bytes_per_token)
    activations = _activation_ratios(rows)
    context = [
        r.guess.pre_load_free_gib - r.observed.pre_load_avail_gib
        for r in rows
        if r.guess is not None and r.guess.pre_load_free_gib > 0
        and r.observed.pre_load_avail_gib is not None
    ]
    fit = _fit(parts.points)
    if fit is not None:
        fixed, k = fit
        graph_all = [y / (fixed + k * x) for x, y in parts.points if fixed + k * x > 0]
        graph = {**graph, ALL_PASSES: k}
    spread = max(_spread(v) for v in (weights, kv, graph_all, mamba, parts.buffers,
                                       parts.prefill))
    return Correction(
        weights=_median(weights), kv=_median(kv), graph=graph,
        graph_default=_median(list(graph.values())),
        buffers=statistics.median(parts.buffers) if parts.buffers else None,
        prefill_graphs=_median(parts.prefill),
        graph_fitted=fit is not None, graph_fixed_gib=fit[0] if fit is not None else 0.0,
        activations=max(activations, default=1.0),
        draft_weights=_median(draft_w), draft_kv=_median(draft_kv), mamba=_median(mamba),
        context_gib=statistics.median(context) if context else 0.0,
        graph_bs=max(parts.bs_seen, default=0),
        graph_measured_gib=statistics.median(parts.totals) if parts.totals else 0.0,
        observations=len(rows), match=match, spread=spread,
    )


def corrected(guess: CostGuess, correction: Correction) -> CostGuess:
    """``guess`` with each component multiplied by its factor."""
    graphs = {
        name: gib * correction.graph.get(name, correction.graph_default)
        for name, gib in guess.graph_gib.items()
    }
    return replace(
        guess,
        weights_gib=guess.weights_gib * correction.weights,
        kv_bytes_per_token=guess.kv_bytes_per_token * correction.kv,
        graph_gib=graphs,
        pre_load_free_gib=guess.pre_load_free_gib - correction.context_gib,
        activations_gib=guess.activations_gib * correction.activations,
        draft_weights_gib=guess.draft_weights_gib * correction.draft_weights,
        draft_kv_bytes_per_token=guess.draft_kv_bytes_per_token * correction.draft_kv,
        mamba_gib_per_slot=guess.mamba_gib_per_slot * correction.mamba,
    )


def learn(
    history: Iterable[KeyedObservation], key: ObservationKey, guess: CostGuess
) -> tuple[CostGuess, Correction]:
    """``guess`` corrected by what ``history`` measured for ``key`` (``select`` +
    ``calibrate`` + ``corrected``), and the correction with its basis."""
    match, rows = select(history, key)
    correction = calibrate(rows, match)
    return corrected(guess, correction), correction


def describe(correction: Correction) -> str:
    """One line for ``plan`` and the ``attempt.started`` event."""
    if correction.match is Match.NONE:
        return "no observations of this architecture on this GPU type: estimated costs"
    basis = ("this key" if correction.match is Match.EXACT
             else "this architecture on this GPU type")
    parts = [f"weights x{correction.weights:.3f}", f"KV x{correction.kv:.3f}"]
    if correction.graph_fitted:
        parts.append(f"graphs {correction.graph_fixed_gib:.2f} GiB + "
                     f"x{correction.graph.get(ALL_PASSES, 1.0):.3f}")
    elif correction.graph:
        parts.append(f"graphs x{correction.graph_default:.3f}")
    if correction.buffers is not None:
        parts.append(f"attention buffers x{correction.buffers:.3f}")
    if correction.activations != 1.0:
        parts.append(f"activations x{correction.activations:.3f}")
    if correction.context_gib:
        parts.append(f"context {correction.context_gib:+.2f} GiB")
    return (f"corrected by {correction.observations} observation(s) of {basis}: "
            + ", ".join(parts) + f"; margin {correction.margin:.3f}")


# --- the estimator's side (launcher.memory.estimate) -----------------------------------------


def _prefill_graphs(e: Estimate) -> float:
    """The part of ``e``'s graph figure (``Estimate.graphs_gib``, any bs) that is 0.5.23's
    prefill passes (target and draft prefill: ``prefill_graph_gib_per_shape`` per shape, or
    ``mla_prefill_graph_gib``); 0 on earlier versions and with graphs disabled."""
    flat = replace(e, coeffs=replace(e.coeffs, prefill_graph_gib_per_shape=0.0,
                                     mla_prefill_graph_gib=0.0))
    return max(0.0, Estimate.graphs_gib(e, 1) - Estimate.graphs_gib(flat, 1))


def guess_of(e: Estimate, bs: int) -> CostGuess:
    """What the estimate ``e`` expects of an attempt at graph bs ``bs``: the guess to store
    with that attempt. Store the *uncorrected* estimate's guess (default coefficients), so
    that observed / guessed ratios always compare with the same prior and never compound."""
    return CostGuess(
        weights_gib=e.weights_gib,
        kv_bytes_per_token=float(e.kv_bytes_per_token),
        graph_gib={ALL_PASSES: e.graphs_gib(bs)},
        graph_bs=bs,
        attention_buffers_gib=e.graph_fixed_gib() * e.coeffs.graphs_scale,
        prefill_graphs_gib=_prefill_graphs(e),
        activations_gib=e.activations_gib(),
        draft_weights_gib=e.draft_weights_gib,
        draft_kv_bytes_per_token=float(e.draft_kv_bytes_per_token),
        mamba_gib_per_slot=e.state_bytes_per_req / GIB,
        pre_load_free_gib=e.pre_load_free_gib,
    )


@dataclass(frozen=True)
class CalibratedEstimate(Estimate):
    """An estimate whose graph memory was measured: ``graphs_measured_gib`` at graph bs
    ``graphs_measured_bs`` (of this model, or of another of its family).

    Graph memory is a part that grows with the captured sizes and the model (activation
    pools) and a part that does not (workspaces, 0.5.23's prefill-graph pool, NCCL buffers);
    one measurement cannot split them, so the answer is the larger of the two readings: the
    prior scaled by the measured ratio (all of it proportional), at no smaller a bs than the
    measured one (graph memory only grows with the bs), and the measured figure itself (all
    of it fixed). For the measured model at the measured bs both are the measurement.

    ``graphs_buffers_gib`` not None: the log told the attention backend's buffers and the
    prefill passes apart (``Correction.buffers``); they are the measured
    ``graphs_buffers_gib`` + ``graphs_prefill_gib``, and all of the above applies to the rest
    of the figure alone (the ratio, the measured figure and the fit are of the rest).
    """

    graphs_measured_bs: int = 0
    graphs_measured_gib: float = 0.0
    # Fitted (several observations far enough apart): fixed part + the scaled prior.
    graphs_fitted: bool = False
    graphs_fixed_gib: float = 0.0
    graphs_prior_scale: float = 1.0  # the uncorrected estimate's coeffs.graphs_scale
    graphs_buffers_gib: float | None = None
    graphs_prefill_gib: float = 0.0

    def _own_parts(self, e: Estimate) -> float:
        """The prior's buffers and prefill passes within ``e``'s graph figure (0 when the
        parts were not told apart: then the whole figure is scaled)."""
        if self.graphs_buffers_gib is None:
            return 0.0
        return e.graph_fixed_gib() * e.coeffs.graphs_scale + _prefill_graphs(e)

    def graphs_gib(self, bs: int) -> float:
        measured_parts = (0.0 if self.graphs_buffers_gib is None
                          else self.graphs_buffers_gib + self.graphs_prefill_gib)
        if self.shape.disable_cuda_graph:
            if self.graphs_buffers_gib is not None:
                return self.graphs_buffers_gib
            return super().graphs_gib(bs)
        own = self._own_parts(self)

        def rest(at: int) -> float:
            return super(CalibratedEstimate, self).graphs_gib(at) - own

        if self.graphs_fitted:
            # fixed + k x prior, but never below the measured figure: the fit extrapolates in
            # the prior's terms (hidden size x tokens), which miss parts such as the logits'
            # vocab x bs, and errs low for a model unlike the measured ones. (A bound from
            # only the measurements of no bigger settings was tried: 2-5 points fewer first
            # attempts ready in scripts/bench/bench_estimator.py for 0.001 less fraction error.)
            # Above the largest measured bs the fit knows nothing of the growth with bs (all
            # its points may share one bs): the measured figure, less the fitted fixed part
            # (which does not grow), grows as the prior does.
            out = max(self.graphs_fixed_gib + rest(bs), self.graphs_measured_gib)
            if self.graphs_measured_bs and bs > self.graphs_measured_bs:
                prior = replace(self, coeffs=replace(self.coeffs,
                                                     graphs_scale=self.graphs_prior_scale))
                prior_own = self._own_parts(prior)
                at = Estimate.graphs_gib(prior, self.graphs_measured_bs) - prior_own
                if at > 0:
                    grown = (Estimate.graphs_gib(prior, bs) - prior_own) / at
                    fixed = min(self.graphs_fixed_gib, self.graphs_measured_gib)
                    out = max(out, fixed + (self.graphs_measured_gib - fixed) * grown)
            return measured_parts + out
        scaled = rest(max(bs, self.graphs_measured_bs))
        return measured_parts + max(scaled, self.graphs_measured_gib)


def apply(e: Estimate, correction: Correction) -> Estimate:
    """``e`` with its costs replaced by the measured ones: weights, KV and state bytes, the
    CUDA context (and so the free memory before the weights) and the graph / activation
    coefficients, each by its correction (activations never measured are raised by the margin
    the calibrated choice gives up: ``1 + COLD_MARGIN - margin``); a ``CalibratedEstimate``
    when graph memory was measured. No observations: ``e`` unchanged."""
    if correction.match is Match.NONE:
        return e
    c = correction
    graphs = c.graph.get(ALL_PASSES, c.graph_default)  # with a fit: its proportional factor
    # Activations are measured only by an OOM after ready; until then they keep the cold
    # margin the calibrated one gives up (the margin is a share of graphs + activations).
    activations = c.activations if c.activations != 1.0 else 1.0 + COLD_MARGIN - c.margin
    coeffs = replace(
        e.coeffs,
        graphs_scale=e.coeffs.graphs_scale * graphs,
        activations_scale=e.coeffs.activations_scale * activations,
        context_gib=e.coeffs.context_gib + c.context_gib,
    )
    fields = {f.name: getattr(e, f.name) for f in dataclasses.fields(Estimate)}
    fields["graphs_measured_bs"] = c.graph_bs
    fields["graphs_measured_gib"] = c.graph_measured_gib
    fields["graphs_fitted"] = c.graph_fitted
    fields["graphs_fixed_gib"] = c.graph_fixed_gib
    fields["graphs_prior_scale"] = e.coeffs.graphs_scale
    if c.buffers is not None:
        fields["graphs_buffers_gib"] = e.graph_fixed_gib() * e.coeffs.graphs_scale * c.buffers
        fields["graphs_prefill_gib"] = _prefill_graphs(e) * c.prefill_graphs
    return replace(
        CalibratedEstimate(**fields),
        coeffs=coeffs,
        weights_gib=e.weights_gib * c.weights,
        draft_weights_gib=e.draft_weights_gib * c.draft_weights,
        kv_bytes_per_token=max(1, round(e.kv_bytes_per_token * c.kv)),
        draft_kv_bytes_per_token=round(e.draft_kv_bytes_per_token * c.draft_kv),
        state_bytes_per_req=round(e.state_bytes_per_req * c.mamba),
        context_gib=e.context_gib + c.context_gib,
        pre_load_free_gib=e.pre_load_free_gib - c.context_gib,
    )


def learn_estimate(
    history: Iterable[KeyedObservation], key: ObservationKey, e: Estimate
) -> tuple[Estimate, Correction]:
    """``e`` corrected by what ``history`` measured for ``key``, and the correction (its
    ``margin`` is the one to choose with). The first-attempt choice calls this."""
    match, rows = select(history, key)
    correction = calibrate(rows, match)
    return apply(e, correction), correction
