"""Learning from the fleet: per-component cost corrections from the ledger's observations.

Pure (no I/O). The estimator (``launcher.sglang.budget``) guesses each memory component of a
server per GPU from the model's files (``CostGuess``); the ledger keeps, per attempt, what the
log showed those components cost (``launcher.sglang.observed.Observed``) beside the guess the
attempt started from. ``calibrate`` turns observations into multiplicative corrections per
component (``Correction``): the median of observed / guessed over the observations of one key.
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

import enum
import statistics
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from typing import Any

from launcher.sglang.observed import Observed

__all__ = [
    "CALIBRATED_MARGIN",
    "COLD_MARGIN",
    "Correction",
    "CostGuess",
    "KeyedObservation",
    "Match",
    "ObservationKey",
    "calibrate",
    "corrected",
    "describe",
    "learn",
    "select",
]

# Safety margins (fraction of the GPU) a chooser may leave: without observations the guess
# can be off by several percent of the card; once corrected by measured costs of this
# architecture on this GPU type, by the log's rounding and run-to-run noise.
COLD_MARGIN = 0.04
CALIBRATED_MARGIN = 0.015


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


@dataclass(frozen=True)
class CostGuess:
    """An estimate of one server's memory components per GPU (GiB unless named otherwise).

    ``graph_gib_per_bs`` maps a capture pass (``GraphPass`` value) to its memory per captured
    batch size; ``activations_gib`` is what warmup and serving need outside the static pool
    beyond the graphs.
    """

    weights_gib: float
    kv_bytes_per_token: float
    graph_gib_per_bs: Mapping[str, float] = field(default_factory=dict)
    activations_gib: float = 0.0
    draft_weights_gib: float = 0.0
    draft_kv_bytes_per_token: float = 0.0
    mamba_gib_per_slot: float = 0.0

    def as_dict(self) -> dict[str, Any]:
        return {
            "weights_gib": self.weights_gib, "kv_bytes_per_token": self.kv_bytes_per_token,
            "graph_gib_per_bs": dict(self.graph_gib_per_bs),
            "activations_gib": self.activations_gib,
            "draft_weights_gib": self.draft_weights_gib,
            "draft_kv_bytes_per_token": self.draft_kv_bytes_per_token,
            "mamba_gib_per_slot": self.mamba_gib_per_slot,
        }

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> CostGuess | None:
        """The inverse of ``as_dict``; None when ``data`` lacks the weights or KV figure (a
        row recorded without an estimate)."""
        if data.get("weights_gib") is None or data.get("kv_bytes_per_token") is None:
            return None
        graphs = data.get("graph_gib_per_bs") or {}
        return cls(
            weights_gib=float(data["weights_gib"]),
            kv_bytes_per_token=float(data["kv_bytes_per_token"]),
            graph_gib_per_bs={str(k): float(v) for k, v in dict(graphs).items()},
            activations_gib=float(data.get("activations_gib") or 0.0),
            draft_weights_gib=float(data.get("draft_weights_gib") or 0.0),
            draft_kv_bytes_per_token=float(data.get("draft_kv_bytes_per_token") or 0.0),
            mamba_gib_per_slot=float(data.get("mamba_gib_per_slot") or 0.0),
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

    ``graph`` holds a factor per capture pass seen; ``graph_default`` applies to passes not
    seen (the median of those seen). ``spread`` is the largest relative disagreement between
    observations of one component (0 with one observation): how far a chooser should trust
    the corrected figures beyond ``CALIBRATED_MARGIN``.
    """

    weights: float = 1.0
    kv: float = 1.0
    graph: Mapping[str, float] = field(default_factory=dict)
    graph_default: float = 1.0
    activations: float = 1.0
    draft_weights: float = 1.0
    draft_kv: float = 1.0
    mamba: float = 1.0
    observations: int = 0
    match: Match = Match.NONE
    spread: float = 0.0

    @property
    def margin(self) -> float:
        """The safety margin (fraction of the GPU) this basis warrants."""
        if self.match is Match.NONE:
            return COLD_MARGIN
        return min(COLD_MARGIN, CALIBRATED_MARGIN + self.spread / 4)

    def as_dict(self) -> dict[str, Any]:
        return {
            "weights": round(self.weights, 4), "kv": round(self.kv, 4),
            "graph": {k: round(v, 4) for k, v in sorted(self.graph.items())},
            "graph_default": round(self.graph_default, 4),
            "activations": round(self.activations, 4),
            "draft_weights": round(self.draft_weights, 4), "draft_kv": round(self.draft_kv, 4),
            "mamba": round(self.mamba, 4), "observations": self.observations,
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


def _observed_graph(name: str) -> Callable[[Observed], float | None]:
    return lambda o: o.graph_gib_per_bs(name)


def _guessed_graph(name: str) -> Callable[[CostGuess], float]:
    return lambda g: g.graph_gib_per_bs.get(name, 0.0)


def _median(values: list[float]) -> float:
    return statistics.median(values) if values else 1.0


def _spread(values: list[float]) -> float:
    if len(values) < 2:
        return 0.0
    mid = statistics.median(values)
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
    ``cuda_graph_max_bs`` still count). The draft's factors come only from rows of the
    exact key (other speculative settings size the draft differently). Activations are only
    ever raised, by OOMs after ready (nothing in a good start-up's log measures them).
    """
    if not rows:
        return Correction()
    weights = _ratios(rows, lambda o: o.weights_gib, lambda g: g.weights_gib)
    kv = _ratios(rows, lambda o: o.kv_bytes_per_token, lambda g: g.kv_bytes_per_token)
    mamba = _ratios(rows, lambda o: o.mamba_gib_per_slot, lambda g: g.mamba_gib_per_slot)
    passes = sorted({p for r in rows for p in r.observed.graph_mem_gib})
    graph: dict[str, float] = {}
    graph_all: list[float] = []
    for name in passes:
        ratios = _ratios(rows, _observed_graph(name), _guessed_graph(name))
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
    spread = max(_spread(v) for v in (weights, kv, graph_all, mamba))
    return Correction(
        weights=_median(weights), kv=_median(kv), graph=graph,
        graph_default=_median(list(graph.values())),
        activations=max(activations, default=1.0),
        draft_weights=_median(draft_w), draft_kv=_median(draft_kv), mamba=_median(mamba),
        observations=len(rows), match=match, spread=spread,
    )


def corrected(guess: CostGuess, correction: Correction) -> CostGuess:
    """``guess`` with each component multiplied by its factor."""
    graphs = {
        name: gib * correction.graph.get(name, correction.graph_default)
        for name, gib in guess.graph_gib_per_bs.items()
    }
    return replace(
        guess,
        weights_gib=guess.weights_gib * correction.weights,
        kv_bytes_per_token=guess.kv_bytes_per_token * correction.kv,
        graph_gib_per_bs=graphs,
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
    if correction.graph:
        parts.append(f"graphs x{correction.graph_default:.3f}")
    if correction.activations != 1.0:
        parts.append(f"activations x{correction.activations:.3f}")
    return (f"corrected by {correction.observations} observation(s) of {basis}: "
            + ", ".join(parts) + f"; margin {correction.margin:.3f}")
