"""What an attempt came to: the outcome kinds, the numbers read from the log, the diagnosis."""

from __future__ import annotations

import enum
from dataclasses import dataclass, field
from typing import Any

from launcher.sglang.phases import Phase


class Outcome(enum.StrEnum):
    """How one start-up attempt ended. Values are stable (events, JSON, ledger)."""

    READY = "ready"
    OOM_GRAPH_CAPTURE = "oom_graph_capture"  # CUDA OOM capturing CUDA graphs
    OOM_WEIGHTS = "oom_weights"  # CUDA OOM before "Load weight end": weights do not fit
    OOM_KV_CACHE = "oom_kv_cache"  # CUDA OOM while allocating the KV pool
    OOM_RUNTIME = "oom_runtime"  # CUDA OOM at warmup or while serving
    KV_TOO_SMALL = "kv_too_small"  # "Not enough memory. ... increase --mem-fraction-static"
    # 0.5.23 "Not enough GPU memory for hybrid (mamba/linear-attention) state cache" / "...
    # state cache is too small to serve any requests"
    HYBRID_STATE_TOO_SMALL = "hybrid_state_too_small"
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
        Outcome.HYBRID_STATE_TOO_SMALL,
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
    # "Capture ... graph begin ... avail mem=X" of the LAST begin line (the failing pass),
    # the smallest over the ranks that printed it; the first begin line's is kept apart.
    graph_begin_avail_gib: float | None = None
    graph_first_begin_avail_gib: float | None = None  # first "Capture ... begin" (any pass)
    graph_pass: str | None = None  # GraphPass value of the last "Capture ... begin" line
    graph_passes_begun: int | None = None  # how many capture passes began
    # (GraphPass value, avail mem) of every "Capture ... begin" line in order (the smallest
    # over the ranks that printed it); None when a begin line showed no avail figure.
    graph_begins: list[tuple[str, float]] | None = None
    graph_passes_ended: int | None = None  # how many "Capture ... end" lines (one rank)
    graph_last_avail_gib: float | None = None  # last "Capturing batches (bs=.. avail_mem=X GB)"
    graph_last_bs: int | None = None  # bs of that last progress line
    graph_steps_done: int | None = None  # k of the last "Capturing batches ... k/n"
    graph_steps_total: int | None = None  # n of the last "Capturing batches ... k/n"
    kv_tokens: int | None = None  # "KV Cache is allocated. #tokens: N"
    # Observed costs (the ledger's observations, launcher.sglang.observed): the target's KV
    # pool per GPU (K + V, or MLA's KV; 0.5.23's labelled pools such as "Full"/"SWA" summed),
    # the draft model's pool (speculative decoding: a rank's second unlabelled pool), the
    # memory each capture pass took ("Capture ... graph end. ... mem usage=X", by GraphPass
    # value, largest over ranks), the largest batch size a capture line listed, and what
    # was free at ready (the summary line's available_gpu_mem).
    kv_pool_gib: float | None = None
    draft_kv_tokens: int | None = None
    draft_kv_pool_gib: float | None = None
    graph_mem_gib: dict[str, float] | None = None
    graph_captured_max_bs: int | None = None
    ready_avail_gib: float | None = None
    min_mem_fraction: float | None = None  # stated by SGLang ("minimum viable = X")
    mem_fraction_static: float | None = None  # resolved value from the server_args dump / error
    cuda_graph_max_bs: int | None = None  # resolved value from the server_args dump
    max_total_num_tokens: int | None = None  # from the TP0 summary line
    draft_weights_gib: float | None = None  # draft "Load weight end. type=...NextN/MTP/Eagle"
    # The draft's pool: the second "KV Cache is allocated" line of a rank (K + V, or KV size).
    # 0.5.10 allocates it after the target's graphs, out of the (1 - mfs) x pre headroom.
    draft_kv_gib: float | None = None
    # Speculative decoding and hybrid settings, from the server_args dump (None: not shown).
    speculative_algorithm: str | None = None
    speculative_num_steps: int | None = None
    speculative_eagle_topk: int | None = None
    speculative_num_draft_tokens: int | None = None
    max_running_requests: int | None = None  # resolved (also "reset to 48 for speculative")
    mamba_strategy: str | None = None  # mamba_scheduler_strategy / mamba_radix_cache_strategy
    mamba_cache_size: int | None = None  # "Mamba Cache is allocated. max_mamba_cache_size: N"
    mamba_state_gib: float | None = None  # conv + ssm (+ intermediate) state sizes of that line
    mamba_per_req_mib: float | None = None  # hybrid state error: "mamba_cache_per_req=Y MB"
    # A fix SGLang's own error names ("please use --mamba-scheduler-strategy extra_buffer and
    # set SGLANG_ENABLE_SPEC_V2=1"): the strategy and "NAME=value" env settings it asks for.
    prescribed_mamba_strategy: str | None = None
    prescribed_env: str | None = None  # "NAME=value[,NAME=value]"
    # 0.5.23's "no_buffer do not support overlap schedule. Try to set
    # disable_overlap_schedule=True.": --disable-overlap-schedule.
    prescribed_disable_overlap: bool | None = None

    @property
    def speculative(self) -> bool:
        """Whether the log showed speculative decoding on (other than NGRAM, no draft graphs)."""
        algo = (self.speculative_algorithm or "").upper()
        return bool(algo) and algo not in ("NONE", "NGRAM")

    def as_dict(self) -> dict[str, Any]:
        return {
            k: dict(v) if isinstance(v, dict) else v
            for k, v in self.__dict__.items()
            if v is not None
        }


@dataclass
class Diagnosis:
    """The classifier's verdict on one attempt's log (and exit status when known)."""

    outcome: Outcome
    phase: Phase
    numbers: Numbers = field(default_factory=Numbers)
    # The decisive log lines, verbatim; for a kill the log does not record, its last lines
    # that are not routine traffic and then one line of launcher's own saying so.
    evidence: list[str] = field(default_factory=list)
    retryable: bool = False  # whether a relaunch (possibly with new params) can help
    advice: str = ""
    rank: str | None = None  # e.g. "TP1" when the decisive line came from one rank
    exit_status: int | None = None
    confidence: Confidence = Confidence.DECISIVE
    remarks: list[str] = field(default_factory=list)  # e.g. frames and phase lines disagree
    # A fix SGLang's error names, in the server's version's dialect (``launcher.sglang.prescribe``):
    # {"description", "flags", "env", "toml"}; None when none (or the version is unknown).
    prescribed_fix: dict[str, Any] | None = None

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
            "prescribed_fix": self.prescribed_fix,
        }
