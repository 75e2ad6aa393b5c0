"""Evidence the phase lines do not give: wrapper prefixes, traceback frames, and failure texts
that logparse's signatures leave out (gated models, older "Not enough memory" spellings,
serving-time pool exhaustion, ROCm/Triton GPU errors, interpreter crashes, NCCL watchdog
timeouts, tracebacks pasted without their header).

Pure functions over lines; ``sglang.classify`` calls them. Built from the real-log corpus in
``tests/fixtures/real_logs/``, where users paste excerpts that start mid-traceback,
carry docker/Ray/Kubernetes prefixes, and often show no phase line at all.

- ``unwrap(lines)``: the lines with a log collector's prefix removed (docker compose
  ``name-1  | ``, Docker Desktop's timestamp, Kubernetes CRI ``<ts> stdout F ``, RFC 3339
  stamps, Ray ``(Worker pid=N) ``, a Python logging wrapper, Open MPI's ``[1,0]<stderr>:``)
  and a wrapper's uniform indent.
- ``frame_phase(frames)``: the start-up phase (or serving) the outermost telling frame of a
  traceback belongs to.
- ``rejects_arguments(exc_type, text, frames)``: whether a traceback is SGLang rejecting its
  launch arguments (bad_argument) rather than an error of the environment.
- ``scan(lines)``: a :class:`Hints` summary of a log tail, and ``fallback(hints)`` the verdict
  those hints support when no failure record gave one.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Sequence
from dataclasses import dataclass

from launcher.sglang.logparse import match_signatures
from launcher.sglang.outcome import Confidence, Outcome
from launcher.sglang.phases import Phase

__all__ = [
    "Fallback",
    "Hints",
    "fallback",
    "frame_phase",
    "later",
    "rejects_arguments",
    "scan",
    "unwrap",
]

# -- wrapper prefixes ------------------------------------------------------------------------

_WRAPPERS = tuple(
    re.compile(p)
    for p in (
        r"^[\w.-]+(?:[-_]\d+\s+|\s{2,})\| ?",  # docker compose: "sglang-1  | ", "name  | "
        r"^\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d(?:\.\d+)?(?:Z|[+-]\d\d:\d\d) (?:stdout|stderr) [FP] ",
        r"^\[?\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d(?:\.\d+)?(?:Z|[+-]\d\d:\d\d)\]? ?",  # RFC 3339 stamp
        r"^\d{4}-\d\d-\d\d \d\d:\d\d:\d\d,\d{3} - \S+ - [A-Z]+ - ",  # Python logging wrapper
        r"^\d{4}-\d\d-\d\d \d\d:\d\d:\d\d(?: |$)",  # Docker Desktop's log view
        r"^\(\w+ pid=\d+(?:, ip=[\d.]+)?\) ?",  # Ray worker output
        # Open MPI's mpirun --tag-output "[jobid,rank]<stream>:", after --timestamp-output's
        # ctime stamp when both are on; it adds no space, the rest is the line as written.
        r"^(?:\w{3} \w{3} [ \d]\d \d\d:\d\d:\d\d \d{4})?\[\d+,\d+\]<std(?:out|err|diag)>:",
    )
)
_SGLANG_LINE = re.compile(r"^\[\d{4}-\d\d-\d\d|^Traceback \(most recent call last\)")


def _strip(line: str) -> str:
    for _ in range(2):  # a collector's prefix in front of another's
        for pattern in _WRAPPERS:
            m = pattern.match(line)
            if m is not None:
                line = line[m.end() :]
                break
        else:
            return line
    return line


def unwrap(lines: Iterable[str]) -> list[str]:
    """The lines as SGLang wrote them: known collector prefixes removed line by line, then a
    uniform indent removed when that indent hid SGLang's own prefixed lines."""
    out = [_strip(line) for line in lines]
    indents = [len(x) - len(x.lstrip()) for x in out if x.strip()]
    common = min(indents, default=0)
    if common and any(_SGLANG_LINE.match(x[common:]) for x in out if x.strip()):
        out = [x[common:] if x.strip() else "" for x in out]
    return out


# -- traceback frames -----------------------------------------------------------------------

# A frame line, Python's ('File "p", line 3, in f') or faulthandler's ('File "p", line 3 in f'),
# also when a paste split it after the path or lost its indentation.
_FRAME = re.compile(r'File "[^"]*"|^\s*line \d+,? in \w+')
# Searched in the outermost-first order of a Python traceback: the first telling frame is the
# call site that says what the process was doing (deeper frames can be shared: a serving
# forward and a capture both run the model; a serving allocation runs in memory_pool.py).
_FRAME_RULES: tuple[tuple[Phase, re.Pattern[str]], ...] = tuple(
    (phase, re.compile(pattern))
    for phase, pattern in (
        (
            Phase.READY,
            r"\bin (?:event_loop\w*|run_event_loop|run_batch|forward_batch_generation"
            r"|forward_batch_speculative_generation|forward_thread_func|process_batch_result\w*"
            r"|resolve_last_batch_result|pop_and_process|exposed_step|forward_step"
            r"|embed_mm_inputs|general_mm_embed_routine|get_model_worker_batch"
            r"|prepare_for_(?:extend|decode))\b"
            r'|model_runner\.py", line \d+,? in forward_(?:extend|decode|idle)\b',
        ),
        (
            Phase.CUDA_GRAPH,
            r"cuda_graph_runner|\bin (?:init_cuda_graphs|init_device_graphs|capture"
            r"|capture_one_batch_size)\b",
        ),
        (
            Phase.KV_CACHE,
            r"\bin (?:init_memory_pool\w*|_init_mamba_pool|profile_max_num_token)\b"
            r"|memory_pool|kv_cache|pool_configurator",
        ),
        (
            Phase.WEIGHTS,
            r"model_loader|weight_utils|\bin (?:load_model|load_weights|get_model|weight_loader)\b"
            # torch's device context: tensors created while the model is being built
            r'|torch/utils/_device\.py", line \d+,? in __torch_function__',
        ),
    )
)


def _phase_of(frame: str) -> Phase | None:
    for phase, pattern in _FRAME_RULES:
        if pattern.search(frame):
            return phase
    return None


def frame_phase(frames: Sequence[str]) -> Phase | None:
    """The phase named by the outermost telling frame (Phase.READY: serving), or None."""
    for frame in frames:
        if _FRAME.search(frame):
            phase = _phase_of(frame)
            if phase is not None:
                return phase
    return None


# -- phase lines of SGLang before 0.3 ------------------------------------------------------

# Printed without a timestamp (logparse reads only timestamped lines) behind the rank: "Rank N: "
# in the router era (0.1, managers/router/model_runner.py), "[gpu_id=N] " and "[gpu=N] " in
# 0.2 (model_executor/model_runner.py). Every rank prints each of them.
_LEGACY_LINE = re.compile(r"^(?:Rank (\d+): |\[gpu(?:_id)?=(\d+)\] )(.*)")
_LEGACY_PHASES: tuple[tuple[Phase, re.Pattern[str]], ...] = (
    (Phase.WEIGHTS, re.compile(r"(?i)^load weight begin\b")),
    (Phase.KV_CACHE, re.compile(r"(?i)^load weight end\b|^Memory pool end\b")),
    (Phase.CUDA_GRAPH, re.compile(r"^Capture cuda graph begin\b")),
    (Phase.WARMUP, re.compile(r"^max_total_num_tokens?=")),  # the pools are sized
)


def _legacy_phase(ranks: dict[str, Phase]) -> Phase | None:
    # Ranks wait for each other at every collective: the start-up stands where the slowest is.
    return min(ranks.values(), key=lambda p: p.order, default=None)


def later(*phases: Phase | None) -> Phase | None:
    """The latest of ``phases`` that is not None (None when all are)."""
    return max((p for p in phases if p is not None), key=lambda p: p.order, default=None)


# -- rejected arguments ---------------------------------------------------------------------

# SGLang validates its arguments with ValueError and assert in server_args.py (ServerArgs
# __post_init__, check_server_args); 0.5.23 moved most checks to srt/arg_groups/*_hook.py.
_VALIDATION_FRAME = re.compile(r"sglang/srt/(?:server_args\.py|arg_groups/)")
_VALIDATION_TYPES = frozenset({"ValueError", "AssertionError"})
_FLAG = re.compile(r"(?<![\w-])--[a-z][a-z0-9]*(?:[-_][a-z0-9]+)*\b")


def rejects_arguments(exc_type: str | None, text: str, frames: Sequence[str]) -> bool:
    """Whether a traceback is SGLang rejecting its launch arguments.

    True for a ValueError or failed assert raised by SGLang's argument validation (the
    raising frame, the last one, is in ``server_args.py`` or ``arg_groups/``), and for a
    ValueError whose ``text`` names a command-line flag to change, wherever it was raised
    (a quantization kernel building the layers: "Consider reducing tensor_parallel_size or
    running with --quantization gptq"), unless the flag is pip's. Other ValueErrors, such as
    transformers not knowing a model type or a registry clash between transformers and
    SGLang, come from the environment: relaunching with other arguments does not help.
    """
    if exc_type is None:
        return False
    name = exc_type.rsplit(".", 1)[-1]
    raising = next((f for f in reversed(frames) if 'File "' in f), None)
    if name in _VALIDATION_TYPES and raising and _VALIDATION_FRAME.search(raising):
        return True
    return name == "ValueError" and bool(_FLAG.search(text)) and "pip install" not in text


# -- failure texts --------------------------------------------------------------------------

_TEXTS: tuple[tuple[str, re.Pattern[str]], ...] = tuple(
    (name, re.compile(pattern))
    for name, pattern in (
        (
            "model_not_found",
            r"Cannot access gated repo|You are trying to access a gated repo"
            r"|Access to model \S+ is restricted|GatedRepoError|Repository Not Found for url",
        ),
        ("kv_too_small", r"(?i:not enought? memory)\W.*(?:mem[-_]fraction|increase)"),
        ("kv_negative", r"is larger than the profiled value -\d+"),
        (
            "serving_oom",
            r"Decode out of memory\. Try|Prefill out of memory\. Try"
            r"|alloc_req_slots runs out of memory",
        ),
        (
            # GPU runtime errors in the spellings logparse's CUDA ones leave out: Triton's
            # launcher ("Triton Error [CUDA]: %s", "Triton Error [HIP]:  Code: %d, Messsage:
            # %s" sic), torch on ROCm ("HIP error: ...") and HIP's own enum names.
            "gpu_error",
            r"Triton Error \[(?:CUDA|HIP)\]:(?!.*out of memory)|\bHIP error: (?!out of memory)"
            r"|\bhipError(?!OutOfMemory)[A-Z]\w*",
        ),
        (
            "nccl_timeout",
            r"ProcessGroupNCCL\.cpp.*(?:Timeout at NCCL work|timed out|detected by watchdog)"
            r"|Some NCCL operations have failed or timed out",
        ),
        (
            "crash",
            r"Fatal Python error: (?:Fatal Python error: )?"
            r"(?:Segmentation fault|Bus error|Aborted)",
        ),
    )
)
_NCCL_INIT_FRAME = re.compile(r"ncclCommInit|pynccl")
# A native stack frame: UCX's and gdb's "N 0x... func() file:line", glibc's
# "lib.so(+0x..)[0x..]", c10's "frame #N: ..."; in NCCL when its symbol, source or library is.
_NATIVE_FRAME = re.compile(r"^\s*#?\d+\s+0x[0-9a-fA-F]+\s|^\s*frame #\d+: |\.so(?:\.\d+)*\(\+?0x")
_NCCL_NATIVE = re.compile(r"(?i)nccl")
# uvicorn is up: SGLang's warmup request follows, and only then its readiness line
# (http_server._wait_and_warmup), so batches in between are the warmup's, not serving.
_HTTP_START = re.compile(r"Uvicorn running on|Application startup complete")
# The line that ends a Python traceback: the exception's (qualified) type and its message.
_EXC_LINE = re.compile(r"^(?:[A-Za-z_]\w*\.)*[A-Z]\w*(?:Error|Exception)(?::|$)")
_TB_HEADER = "Traceback (most recent call last):"
_READY_TEXT = "The server is fired up and ready to roll"
_CHILD_SIGKILL = re.compile(r"(?i)\bexit ?code:? \(?-9\b")
_SERVING_LINE = re.compile(
    r"\] (?:Decode|Prefill) batch[.,]|Decode out of memory happened"
    r'|"(?:POST|GET) /(?:generate|v1/\S+) HTTP/1\.1" 200|Health check failed'
)


@dataclass(frozen=True)
class Hints:
    """What a log tail shows besides failure records and phase lines (first line of each)."""

    frame_phase: Phase | None = None
    legacy_phase: Phase | None = None  # from SGLang's pre-0.3 progress lines (slowest rank's)
    model_not_found: str | None = None
    kv_too_small: str | None = None
    kv_negative: str | None = None
    serving_oom: str | None = None
    gpu_error: str | None = None
    nccl_timeout: str | None = None
    crash: str | None = None
    crash_in_nccl_init: bool = False
    crash_in_nccl: bool = False  # a native stack frame of the crash is in NCCL
    # The exception line of a traceback pasted without its header (an excerpt that starts
    # mid-traceback) and without a text logparse knows, when no readiness line follows it:
    # logparse sees no traceback there.
    headless_exception: str | None = None
    # A decode/prefill batch, a served request, a health check; not the warmup's (those
    # between uvicorn's start and the readiness line).
    serving: bool = False
    child_sigkill: bool = False  # the parent reports a child's exit code -9 (any spelling)


def scan(lines: Iterable[str]) -> Hints:
    """The hints in ``lines`` (a log or its tail, in order)."""
    found: dict[str, str] = {}
    frames: list[str] = []
    serving = nccl_init = nccl_native = sigkill = warming = False
    headless: str | None = None
    legacy: dict[str, Phase] = {}
    headers = 0  # traceback headers whose exception line has not come yet (ranks interleave)
    in_frames = False  # the last lines were frames
    for line in lines:
        if _FRAME.search(line):
            frames.append(line)
            nccl_init = nccl_init or bool(_NCCL_INIT_FRAME.search(line))
            in_frames = True
            continue
        if not (in_frames and line[:1].isspace()):  # else a frame's source line: it goes on
            if in_frames and _EXC_LINE.match(line):
                if not headers and not match_signatures(line):
                    headless = line  # (logparse already judges a line with a known text)
                headers = max(headers - 1, 0)  # the exception line closed a traceback
            if _TB_HEADER in line:
                headers += 1
            in_frames = False
        if _READY_TEXT in line:
            headless = None  # a failure before readiness did not stop the server
            warming = False
        elif _HTTP_START.search(line):
            warming, serving = True, False
        if m := _LEGACY_LINE.match(line):
            rank = m.group(1) or m.group(2)
            for phase, pattern in _LEGACY_PHASES:
                now = legacy.get(rank)
                if pattern.search(m.group(3)) and (now is None or phase.order > now.order):
                    legacy[rank] = phase
        if _NATIVE_FRAME.search(line):
            nccl_native = nccl_native or bool(_NCCL_NATIVE.search(line))
        serving = serving or (not warming and bool(_SERVING_LINE.search(line)))
        sigkill = sigkill or bool(_CHILD_SIGKILL.search(line))
        for name, pattern in _TEXTS:
            if name not in found and pattern.search(line):
                found[name] = line
    return Hints(
        frame_phase=frame_phase(frames),
        legacy_phase=_legacy_phase(legacy),
        model_not_found=found.get("model_not_found"),
        kv_too_small=found.get("kv_too_small"),
        kv_negative=found.get("kv_negative"),
        serving_oom=found.get("serving_oom"),
        gpu_error=found.get("gpu_error"),
        nccl_timeout=found.get("nccl_timeout"),
        crash=found.get("crash"),
        crash_in_nccl_init=nccl_init and "crash" in found,
        crash_in_nccl=nccl_native and "crash" in found,
        headless_exception=headless,
        serving=serving,
        child_sigkill=sigkill,
    )


@dataclass(frozen=True)
class Fallback:
    """A verdict the hints support: outcome, phase (None: keep the log's), evidence line."""

    outcome: Outcome
    phase: Phase | None
    line: str
    confidence: Confidence


def fallback(h: Hints) -> Fallback | None:
    """The verdict for a log whose failure records gave none (or only a vague one)."""
    decisive, weak = Confidence.DECISIVE, Confidence.WEAK
    if h.model_not_found:
        return Fallback(Outcome.MODEL_NOT_FOUND, Phase.INIT, h.model_not_found, decisive)
    if h.kv_too_small:
        return Fallback(Outcome.KV_TOO_SMALL, Phase.KV_CACHE, h.kv_too_small, decisive)
    if h.serving_oom:
        return Fallback(Outcome.OOM_RUNTIME, Phase.READY, h.serving_oom, decisive)
    if h.kv_negative:
        return Fallback(Outcome.KV_TOO_SMALL, Phase.KV_CACHE, h.kv_negative, weak)
    if h.gpu_error:  # a cause where it shows; NCCL timeouts are often its consequence
        return Fallback(Outcome.CUDA_ERROR_OTHER, None, h.gpu_error, decisive)
    if h.nccl_timeout:
        return Fallback(Outcome.NCCL_ERROR, None, h.nccl_timeout, decisive)
    if h.crash:
        if h.crash_in_nccl_init:  # faulthandler shows the crash inside NCCL communicator init
            return Fallback(Outcome.NCCL_ERROR, Phase.INIT, h.crash, decisive)
        if h.crash_in_nccl:  # the native backtrace shows it in NCCL (e.g. its proxy path)
            return Fallback(Outcome.NCCL_ERROR, None, h.crash, decisive)
        return Fallback(Outcome.OTHER, None, h.crash, weak)
    if h.headless_exception:  # an error launcher does not know, in its frames' phase
        return Fallback(Outcome.OTHER, h.frame_phase, h.headless_exception, weak)
    return None
