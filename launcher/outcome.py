"""What an attempt came to: the outcome kinds, the numbers read from the log, the diagnosis."""

from __future__ import annotations

import enum
from dataclasses import dataclass, field
from typing import Any

from launcher.phases import Phase


class Outcome(enum.StrEnum):
    """How one start-up attempt ended. Values are stable (events, JSON, ledger)."""

    READY = "ready"
    OOM_GRAPH_CAPTURE = "oom_graph_capture"  # CUDA OOM capturing CUDA graphs
    OOM_WEIGHTS = "oom_weights"  # CUDA OOM before "Load weight end": weights do not fit
    OOM_KV_CACHE = "oom_kv_cache"  # CUDA OOM while allocating the KV pool
    OOM_RUNTIME = "oom_runtime"  # CUDA OOM at warmup or while serving
    KV_TOO_SMALL = "kv_too_small"  # "Not enough memory. ... increase --mem-fraction-static"
    PORT_IN_USE = "port_in_use"  # uvicorn / internal port "address already in use"
    BAD_ARGUMENT = "bad_argument"  # argparse or config ValueError
    MODEL_NOT_FOUND = "model_not_found"  # model path / repo id not found
    NCCL_ERROR = "nccl_error"  # NCCL failure that is not an out-of-memory
    HANG = "hang"  # alive but no log progress within the phase's budget
    KILLED = "killed"  # SIGKILLed from outside with no error of its own
    CUDA_ERROR_OTHER = "cuda_error_other"  # non-memory CUDA error (no kernel image, ...)
    OTHER = "other"  # failed with an error we do not know
    INCOMPLETE = "incomplete"  # log ends with no error and no ready line

    @property
    def is_memory(self) -> bool:
        return self in MEMORY_OUTCOMES


MEMORY_OUTCOMES = frozenset(
    {
        Outcome.OOM_GRAPH_CAPTURE,
        Outcome.OOM_WEIGHTS,
        Outcome.OOM_KV_CACHE,
        Outcome.OOM_RUNTIME,
        Outcome.KV_TOO_SMALL,
    }
)


class Confidence(enum.StrEnum):
    """How firmly the log supports a verdict. Values are stable (events, JSON)."""

    DECISIVE = "decisive"  # an error text with its phase from phase lines or traceback frames
    WEAK = "weak"  # hints only: an OOM of unknown phase, serving lines without a ready line...


@dataclass
class Numbers:
    """Figures read from a log. GiB throughout (SGLang labels GiB as "GB")."""

    tried_gib: float | None = None  # "Tried to allocate X"
    free_gib: float | None = None  # "... of which X is free"
    total_gib: float | None = None  # "total capacity of X"
    gpu: int | None = None  # "GPU n has a total capacity"
    pre_load_avail_gib: float | None = None  # "Load weight begin. avail mem=X"
    post_weights_avail_gib: float | None = None  # "Load weight end. ... avail mem=X"
    weights_gib: float | None = None  # "Load weight end. ... mem usage=X"
    pool_end_avail_gib: float | None = None  # "Memory pool end. avail mem=X"
    graph_begin_avail_gib: float | None = None  # "Capture cuda graph begin ... avail mem=X"
    graph_last_avail_gib: float | None = None  # last "Capturing batches (bs=.. avail_mem=X GB)"
    graph_last_bs: int | None = None  # bs of that last progress line
    graph_steps_done: int | None = None  # k of the last "Capturing batches ... k/n"
    graph_steps_total: int | None = None  # n of the last "Capturing batches ... k/n"
    kv_tokens: int | None = None  # "KV Cache is allocated. #tokens: N"
    min_mem_fraction: float | None = None  # stated by SGLang ("minimum viable = X")
    mem_fraction_static: float | None = None  # resolved value from the server_args dump / error
    cuda_graph_max_bs: int | None = None  # resolved value from the server_args dump
    max_total_num_tokens: int | None = None  # from the TP0 summary line

    def as_dict(self) -> dict[str, Any]:
        return {k: v for k, v in self.__dict__.items() if v is not None}


@dataclass
class Diagnosis:
    """The classifier's verdict on one attempt's log (and exit status when known)."""

    outcome: Outcome
    phase: Phase
    numbers: Numbers = field(default_factory=Numbers)
    evidence: list[str] = field(default_factory=list)  # the decisive log lines, verbatim
    retryable: bool = False  # whether a relaunch (possibly with new params) can help
    advice: str = ""
    rank: str | None = None  # e.g. "TP1" when the decisive line came from one rank
    exit_status: int | None = None
    confidence: Confidence = Confidence.DECISIVE
    remarks: list[str] = field(default_factory=list)  # e.g. frames and phase lines disagree

    def as_dict(self) -> dict[str, Any]:
        return {
            "outcome": self.outcome.value,
            "confidence": self.confidence.value,
            "phase": self.phase.value,
            "rank": self.rank,
            "exit_status": self.exit_status,
            "numbers": self.numbers.as_dict(),
            "evidence": list(self.evidence),
            "retryable": self.retryable,
            "advice": self.advice,
            "remarks": list(self.remarks),
        }
