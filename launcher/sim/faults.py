"""Fault profiles: what a simulated server does wrong besides running out of memory.

A profile is a JSON list named by ``SGLANG_SIM_FAULTS``; each object has a ``kind`` and::

    phase          init | weights | kv_cache | cuda_graph | warmup   (where it applies)
    after_s        wall-clock seconds into the phase, or after the ready line
    factor         duration multiplier (slow)
    attempts       [1, 2]: apply only when LAUNCHER_ATTEMPT (default "1") is listed
    orphan_hold_s  seconds a dead server's schedulers keep holding GPU memory (orphan_hold)
    message        final ``Type: message`` of a crash_after_ready traceback (optional)

Kinds:

    die_silently       SIGKILL itself, no message (in ``phase``; without a phase: after_s
                       seconds after ready)
    hang               stop logging for ever in ``phase`` (still answers signals)
    nccl_error         NCCL DistBackendError traceback in ``phase`` (default init), exit 137
    slow               multiply ``phase``'s duration by ``factor``
    crash_after_ready  scheduler traceback after_s seconds after ready, exit 137
    oom_runtime        CUDA OOM traceback after_s seconds after ready, exit 137
    hang_after_ready   after_s seconds after ready: /health 503, no more scheduler log
    orphan_hold        schedulers outlive a dead server by orphan_hold_s seconds

An in-phase fault fires at the first step of its phase that starts ``after_s`` or more seconds
into the phase, and at the latest at the phase's end.
"""

from __future__ import annotations

import enum
import json
import math
import os
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path

from launcher.sglang.phases import Phase

ENV_FAULTS = "SGLANG_SIM_FAULTS"
ENV_ATTEMPT = "LAUNCHER_ATTEMPT"

STARTUP_PHASES = (Phase.INIT, Phase.WEIGHTS, Phase.KV_CACHE, Phase.CUDA_GRAPH, Phase.WARMUP)


class FaultKind(enum.StrEnum):
    DIE_SILENTLY = "die_silently"
    HANG = "hang"
    CRASH_AFTER_READY = "crash_after_ready"
    OOM_RUNTIME = "oom_runtime"
    SLOW = "slow"
    NCCL_ERROR = "nccl_error"
    HANG_AFTER_READY = "hang_after_ready"
    ORPHAN_HOLD = "orphan_hold"


IN_PHASE_KINDS = frozenset({FaultKind.DIE_SILENTLY, FaultKind.HANG, FaultKind.NCCL_ERROR})
AFTER_READY_KINDS = frozenset(
    {FaultKind.CRASH_AFTER_READY, FaultKind.OOM_RUNTIME, FaultKind.HANG_AFTER_READY}
)
_DEFAULT_PHASE = {FaultKind.HANG: Phase.WEIGHTS, FaultKind.NCCL_ERROR: Phase.INIT}
_KEYS = {"kind", "phase", "after_s", "factor", "attempts", "orphan_hold_s", "message"}


class FaultProfileError(ValueError):
    """A fault profile that cannot be used; the message names the entry and the problem."""


@dataclass(frozen=True)
class Fault:
    """One fault of a profile (see the module docstring for the fields)."""

    kind: FaultKind
    phase: Phase | None = None
    after_s: float = 0.0
    factor: float = 1.0
    attempts: frozenset[int] | None = None
    orphan_hold_s: float = 0.0
    message: str | None = None

    def applies_to(self, attempt: int) -> bool:
        return self.attempts is None or attempt in self.attempts

    @property
    def fires_after_ready(self) -> bool:
        return self.kind in AFTER_READY_KINDS or (
            self.kind is FaultKind.DIE_SILENTLY and self.phase is None
        )


def _number(entry: Mapping[str, object], key: str, default: float, where: str) -> float:
    value = entry.get(key, default)
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise FaultProfileError(f"{where}: {key} must be a number, got {value!r}")
    number = float(value)
    if math.isnan(number) or number < 0:
        raise FaultProfileError(f"{where}: {key} must be >= 0, got {value!r}")
    return number


def parse_fault(entry: object, where: str = "fault") -> Fault:
    """One profile entry -> Fault. Raises FaultProfileError for unknown kinds, phases or keys."""
    if not isinstance(entry, dict):
        raise FaultProfileError(f"{where}: must be an object, got {entry!r}")
    unknown = set(entry) - _KEYS
    if unknown:
        raise FaultProfileError(f"{where}: unknown key(s) {sorted(unknown)}")
    try:
        kind = FaultKind(str(entry.get("kind")))
    except ValueError:
        kinds = ", ".join(k.value for k in FaultKind)
        raise FaultProfileError(f"{where}: kind must be one of {kinds}") from None
    phase: Phase | None = _DEFAULT_PHASE.get(kind)
    if entry.get("phase") is not None:
        try:
            phase = Phase(entry["phase"])
        except ValueError:
            names = ", ".join(p.value for p in STARTUP_PHASES)
            raise FaultProfileError(f"{where}: phase must be one of {names}") from None
        if phase not in STARTUP_PHASES:
            raise FaultProfileError(f"{where}: phase {phase.value!r} is not a start-up phase")
    if kind is FaultKind.SLOW and phase is None:
        raise FaultProfileError(f"{where}: slow needs a phase")
    attempts = entry.get("attempts")
    if attempts is not None and (
        not isinstance(attempts, list)
        or not all(isinstance(a, int) and not isinstance(a, bool) for a in attempts)
    ):
        raise FaultProfileError(f"{where}: attempts must be a list of integers")
    message = entry.get("message")
    if message is not None and not isinstance(message, str):
        raise FaultProfileError(f"{where}: message must be a string")
    return Fault(
        kind=kind,
        phase=phase,
        after_s=_number(entry, "after_s", 0.0, where),
        factor=_number(entry, "factor", 1.0, where),
        attempts=None if attempts is None else frozenset(attempts),
        orphan_hold_s=_number(entry, "orphan_hold_s", 0.0, where),
        message=message,
    )


def parse_profile(data: object, source: str = "profile") -> list[Fault]:
    """A whole profile (a JSON list) -> faults, in order."""
    if not isinstance(data, list):
        raise FaultProfileError(f"{source}: a fault profile is a JSON list of fault objects")
    return [parse_fault(entry, f"{source}[{i}]") for i, entry in enumerate(data)]


def load_profile(path: Path) -> list[Fault]:
    try:
        data = json.loads(path.read_text())
    except (OSError, ValueError) as exc:
        raise FaultProfileError(f"{path}: cannot read fault profile: {exc}") from exc
    return parse_profile(data, str(path))


@dataclass(frozen=True)
class FaultPlan:
    """The faults that apply to this attempt, looked up by where they fire."""

    faults: tuple[Fault, ...] = field(default=())

    @classmethod
    def from_env(cls, environ: Mapping[str, str] | None = None) -> FaultPlan:
        """Faults of ``SGLANG_SIM_FAULTS`` that apply to attempt ``LAUNCHER_ATTEMPT``."""
        env = os.environ if environ is None else environ
        path = env.get(ENV_FAULTS)
        if not path:
            return cls()
        try:
            attempt = int(env.get(ENV_ATTEMPT) or "1")
        except ValueError:
            raise FaultProfileError(f"{ENV_ATTEMPT} must be an integer") from None
        return cls(tuple(f for f in load_profile(Path(path)) if f.applies_to(attempt)))

    def in_phase(self, phase: Phase) -> Fault | None:
        """The first die/hang/nccl fault of ``phase``."""
        return next((f for f in self.faults if f.kind in IN_PHASE_KINDS and f.phase is phase), None)

    def slow_factor(self, phase: Phase) -> float:
        factor = 1.0
        for f in self.faults:
            if f.kind is FaultKind.SLOW and f.phase is phase:
                factor *= f.factor
        return factor

    @property
    def orphan_hold_s(self) -> float:
        return max(
            (f.orphan_hold_s for f in self.faults if f.kind is FaultKind.ORPHAN_HOLD), default=0.0
        )

    @property
    def after_ready(self) -> list[Fault]:
        """Faults that fire after the ready line, earliest first."""
        return sorted((f for f in self.faults if f.fires_after_ready), key=lambda f: f.after_s)
