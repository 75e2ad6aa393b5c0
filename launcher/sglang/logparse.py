"""Reading an SGLang server's output: records, line prefixes, start-up progress, failure texts.

No I/O here: callers hand in bytes or lines. Three layers, each usable alone:

- ``split_records`` / ``LineSplitter``: raw output -> lines. Logging lines end with ``\\n``;
  tqdm bars (weight shards, graph capture) redraw with ``\\r``; both end a record.
- ``parse_line``: one line -> ``ParsedLine`` (timestamp, rank prefix, uvicorn level, message).
- ``LogFollower``: lines -> ``LogEvent`` values (phase changes, progress, memory figures,
  readiness, failure signatures, whole tracebacks), keeping the figures and the resolved
  settings the log has shown so far in ``follower.numbers``.

Following a live log (what the supervisor does)::

    splitter, follower = LineSplitter(), LogFollower()
    for chunk in chunks:                      # bytes, cut anywhere
        for line in splitter.feed(chunk):
            for event in follower.feed_line(line):
                ...                           # PhaseEntered, Progress, ReadyLine, ...
    for line in splitter.flush():             # the process ended
        follower.feed_line(line)
    follower.finish()
    verdict = launcher.sglang.classify.diagnose(follower, exit_status)

Formats are those of SGLang 0.4.10 .. 0.5.23 (see docs/sglang.md, "The log" and "Failures").
Patterns are searched, never anchored to a version, so spelling drift between versions is
tolerated where the reference lists both spellings.
"""

from __future__ import annotations

import codecs
import enum
import re
from collections import deque
from dataclasses import dataclass, field
from datetime import datetime

from launcher.params import LaunchParams
from launcher.sglang.outcome import Numbers
from launcher.sglang.phases import GraphPass, Phase
from launcher.untrusted import bounded_float, bounded_int

__all__ = [
    "DEFAULT_TAIL",
    "MAX_FAILURES",
    "MAX_KEPT_CHARS",
    "MAX_LINE_CHARS",
    "FailureSignature",
    "Figure",
    "LineSplitter",
    "LogEvent",
    "LogFollower",
    "MemoryFigure",
    "OomFigures",
    "ParsedLine",
    "PhaseLine",
    "Progress",
    "RaisedException",
    "ReadyLine",
    "Signature",
    "Source",
    "Traceback",
    "fill_error_figures",
    "is_routine",
    "match_signatures",
    "parse_line",
    "parse_oom",
    "parse_size_gib",
    "split_records",
]

MAX_LINE_CHARS = 1 << 20  # a line longer than this is cut into pieces (a runaway writer)
DEFAULT_TAIL = 400  # lines kept in LogFollower.last_lines
# What LogFollower keeps of one line (tail, evidence, traceback frames): a whole line is
# parsed (up to MAX_LINE_CHARS, e.g. a long server_args dump) but only this much is held.
MAX_KEPT_CHARS = 16 * 1024
_MAX_MESSAGE_LINES = 200  # lines kept of one exception's message
MAX_FAILURES = 64  # failure records kept by LogFollower (the first ones: the root cause is early)

# ---------------------------------------------------------------------------------------------
# Records

_TERMINATOR = re.compile(r"\r\n|\r|\n")


def _cut(segment: str, max_line: int) -> list[str]:
    pieces = []
    while len(segment) > max_line:
        pieces.append(segment[:max_line])
        segment = segment[max_line:]
    pieces.append(segment)
    return pieces


def _split(text: str, *, final: bool, max_line: int) -> tuple[list[str], str]:
    """Split ``text`` into complete lines and the unterminated rest.

    ``\\r\\n``, ``\\r`` and ``\\n`` each end a line. An empty record ended by a bare ``\\r`` is
    dropped: tqdm writes ``\\r`` before every redraw, so ``"...\\n\\rbar"`` must not yield a
    blank line (blank lines are meaningful inside tracebacks). Unless ``final``, a trailing
    ``\\r`` is held back because it may be the first half of a ``\\r\\n`` cut by a chunk border.
    """
    hold = ""
    if not final and text.endswith("\r"):
        text, hold = text[:-1], "\r"
    lines: list[str] = []
    pos = 0
    for m in _TERMINATOR.finditer(text):
        segment = text[pos : m.start()]
        pos = m.end()
        if segment or m.group() != "\r":
            lines.extend(_cut(segment, max_line))
    rest = text[pos:]
    if final:
        if rest:
            lines.extend(_cut(rest, max_line))
        rest = ""
    else:
        # Cut only beyond the limit (not at it), so the pieces do not depend on the chunking.
        while len(rest) > max_line:
            lines.append(rest[:max_line])
            rest = rest[max_line:]
    return lines, rest + hold


def _kept(line: str) -> str:
    """``line`` cut to MAX_KEPT_CHARS, so that what LogFollower holds stays bounded."""
    if len(line) <= MAX_KEPT_CHARS:
        return line
    return line[:MAX_KEPT_CHARS] + f" …[{len(line) - MAX_KEPT_CHARS} characters cut]"


def split_records(chunk: str, *, max_line: int = MAX_LINE_CHARS) -> list[str]:
    """All lines of a complete piece of output, split on ``\\r`` and ``\\n``.

    A final line without a terminator is included. Gives exactly what ``LineSplitter`` gives
    for the same text fed in any chunking, followed by ``flush()``.
    """
    return _split(chunk, final=True, max_line=max_line)[0]


class LineSplitter:
    """Incremental ``split_records`` over bytes that arrive in arbitrary chunks.

    Chunks may end mid-line, between ``\\r`` and ``\\n``, or inside a UTF-8 sequence. Invalid
    UTF-8 is replaced by U+FFFD rather than raising: a log is evidence, not input to reject.
    """

    def __init__(self, *, max_line: int = MAX_LINE_CHARS) -> None:
        self._decoder = codecs.getincrementaldecoder("utf-8")(errors="replace")
        self._rest = ""
        self._max_line = max_line

    def feed(self, data: bytes) -> list[str]:
        """Lines completed by ``data`` (possibly none)."""
        text = self._rest + self._decoder.decode(data, final=False)
        lines, self._rest = _split(text, final=False, max_line=self._max_line)
        return lines

    def flush(self) -> list[str]:
        """The last, unterminated line if any; the splitter is then empty and reusable."""
        text = self._rest + self._decoder.decode(b"", final=True)
        self._rest = ""
        self._decoder.reset()
        return _split(text, final=True, max_line=self._max_line)[0]


# ---------------------------------------------------------------------------------------------
# Line prefixes

_PREFIX = re.compile(
    r"^\[(\d{4}-\d\d-\d\d \d\d:\d\d:\d\d)(?:\.(\d{3}))?((?: [A-Z][A-Z_]*\d+)*)\] ?(.*)$", re.S
)
_RANK_PART = re.compile(r"([A-Z][A-Z_]*?)(\d+)")
_UVICORN_LEVEL = re.compile(r"^(TRACE|DEBUG|INFO|WARNING|ERROR|CRITICAL):\s+(.*)$", re.S)


class Source(enum.StrEnum):
    """Who wrote a line, judged by its shape."""

    SGLANG = "sglang"  # "[ts( TPn...)] message" from SGLang's logging
    UVICORN = "uvicorn"  # "[ts] INFO:     message" from uvicorn, reformatted by SGLang
    BARE = "bare"  # no prefix: traceback, tqdm bar, warning, shell or NCCL output


@dataclass(frozen=True, slots=True)
class ParsedLine:
    """One line split into its prefix parts and message.

    ``rank`` is the prefix's rank parts as written, e.g. ``"TP1"`` or ``"DP0 TP1 EP1"``; None
    when the line has no rank (TP=1, the main process, or a bare line).
    """

    raw: str
    message: str
    source: Source
    timestamp: str | None = None  # "2025-10-16 09:06:10" as written
    millis: int | None = None  # only with SGLANG_LOG_MS
    rank: str | None = None
    level: str | None = None  # uvicorn lines only

    @property
    def ranks(self) -> dict[str, int]:
        """The rank parts as a dict, e.g. ``{"DP": 0, "TP": 1}``; empty when there are none."""
        if self.rank is None:
            return {}
        parts = ((name, bounded_int(n)) for name, n in _RANK_PART.findall(self.rank))
        return {name: n for name, n in parts if n is not None}

    @property
    def when(self) -> datetime | None:
        """The timestamp as a naive datetime (SGLang logs local time without a zone)."""
        if self.timestamp is None:
            return None
        try:  # the prefix's shape allows month 13 or hour 99
            stamp = datetime.strptime(self.timestamp, "%Y-%m-%d %H:%M:%S")
        except ValueError:
            return None
        return stamp.replace(microsecond=(self.millis or 0) * 1000)


def parse_line(line: str) -> ParsedLine:
    """Split one line (without its terminator) into prefix and message. Never raises."""
    m = _PREFIX.match(line)
    if m is None:
        return ParsedLine(raw=line, message=line, source=Source.BARE)
    stamp, millis, ranks, message = m.groups()
    rank = ranks.strip() or None
    level = None
    source = Source.SGLANG
    if rank is None:
        u = _UVICORN_LEVEL.match(message)
        if u is not None:
            level, message = u.groups()
            source = Source.UVICORN
    return ParsedLine(
        raw=line,
        message=message,
        source=source,
        timestamp=stamp,
        millis=bounded_int(millis, max_digits=3),
        rank=rank,
        level=level,
    )


# ---------------------------------------------------------------------------------------------
# Failure texts


class Signature(enum.StrEnum):
    """A known failure text. Values are stable (events, JSON)."""

    CUDA_OOM = "cuda_oom"  # torch "CUDA out of memory" / OutOfMemoryError
    NCCL_OOM = "nccl_oom"  # NCCL could not get GPU memory ("Failed to CUDA calloc")
    KV_TOO_SMALL = "kv_too_small"  # "Not enough memory. Please try to increase ..."
    HYBRID_STATE = "hybrid_state"  # 0.5.23 hybrid (mamba/linear-attention) state cache errors
    GRAPH_CAPTURE_FAILED = "graph_capture_failed"  # wraps the real error in its message
    PORT_IN_USE = "port_in_use"
    BAD_ARGUMENT = "bad_argument"  # argparse error or a known config ValueError
    MODEL_NOT_FOUND = "model_not_found"
    NCCL_ERROR = "nccl_error"  # NCCL failure that is not a memory one
    CUDA_ERROR = "cuda_error"  # CUDA error that is not a memory one
    HOST_OOM = "host_oom"  # host RAM, not GPU ([Errno 12])
    GPU_BUSY = "gpu_busy"  # "The memory capacity is unbalanced": another process on a GPU
    HEALTH_CHECK_FAILED = "health_check_failed"
    WATCHDOG_TIMEOUT = "watchdog_timeout"
    WARMUP_FAILED = "warmup_failed"  # "Initialization failed. warmup error: ..."
    CHILD_FAILED = "child_failed"  # the parent's follow-on lines after a child died
    KILLED = "killed"  # a shell's bare "Killed" line


_SIGNATURES: tuple[tuple[Signature, re.Pattern[str]], ...] = tuple(
    (sig, re.compile(pattern))
    for sig, pattern in (
        (
            Signature.CUDA_OOM,
            r"CUDA out of memory|OutOfMemoryError|CUDA error: out of memory"
            r"|cudaErrorMemoryAllocation|CUBLAS_STATUS_ALLOC_FAILED",
        ),
        (
            Signature.NCCL_OOM,
            r"Failed to CUDA calloc|NCCL.*\bout of memory|Cuda failure.*out of memory",
        ),
        (
            Signature.KV_TOO_SMALL,
            r"Not enough memory\. Please try to increase --mem-fraction-static"
            r"|Loaded weights leave no GPU memory for the KV cache"
            r"|Memory pool size is too small|max_running_request is zero",
        ),
        (
            Signature.HYBRID_STATE,
            r"Not enough GPU memory for hybrid \(mamba/linear-attention\) state cache"
            r"|Hybrid \(mamba/linear-attention\) state cache is too small",
        ),
        (
            Signature.GRAPH_CAPTURE_FAILED,
            r"(?i:capture\b[^.:]*\bgraph failed)|Fail when using backend: \S+ for \w+ runner",
        ),
        (
            Signature.PORT_IN_USE,
            r"(?i:address already in use)|EADDRINUSE|is not available in \d+ seconds"
            r"|Port is already in use",
        ),
        (
            Signature.BAD_ARGUMENT,
            r"error: (?:unrecognized arguments|ambiguous option"
            r"|the following arguments are required|argument -|invalid choice)"
            r"|User-specified context_length \(\d+\) is greater than the derived context_length"
            r"|is not compatible with (?:radix cache|--)|is incompatible with"
            r"|no_buffer do not support|extra_buffer is not supported for"
            r"|extra_buffer_lazy unsupported",
        ),
        (
            Signature.MODEL_NOT_FOUND,
            r"Repo id must be in the form|We couldn't connect to 'https://huggingface\.co'"
            r"|is not a local folder and is not a valid model identifier|Unrecognized model in"
            r"|does not appear to have a file named config\.json"
            r"|No such file or directory: \S*config\.json|RepositoryNotFoundError",
        ),
        (
            Signature.NCCL_ERROR,
            r"NCCL error|nccl(?:System|Internal|UnhandledCuda|Remote|InvalidUsage|InvalidArgument)"
            r"Error|NCCL WARN|DistBackendError|Watchdog caught collective operation timeout"
            # gloo (the CPU groups): a peer died or the network went; also wrapped by
            # "Capture cuda graph failed: [../third_party/gloo/gloo/transport/tcp/pair.cc:534]"
            r"|/gloo/transport/|\bGloo\b.*(?:failed|timed out)|ProcessGroupGloo",
        ),
        (
            Signature.CUDA_ERROR,
            r"CUDA error: (?!out of memory)|no kernel image is available|illegal memory access"
            r"|device-side assert|CUDA driver version is insufficient|No accelerator \(CUDA"
            r"|no CUDA-capable device|Found no NVIDIA driver|invalid device ordinal"
            r"|unspecified launch failure|CUBLAS_STATUS_(?!ALLOC_FAILED)[A-Z_]+"
            r"|cudaError(?!MemoryAllocation)[A-Z]\w*",
        ),
        (
            Signature.HOST_OOM,
            r"\[Errno 12\] Cannot allocate memory|^MemoryError\b|std::bad_alloc"
            r"|DefaultCPUAllocator: can't allocate memory",
        ),
        (Signature.GPU_BUSY, r"The memory capacity is unbalanced"),
        (Signature.HEALTH_CHECK_FAILED, r"Health check failed"),
        (Signature.WATCHDOG_TIMEOUT, r"[Ww]atchdog timeout \(self\.watchdog_timeout"),
        (Signature.WARMUP_FAILED, r"Initialization failed\. warmup error"),
        (
            Signature.CHILD_FAILED,
            r"Received sigquit from a child process|SIGQUIT received\. signum="
            r"|scheduler is dead|scheduler died during initialization"
            r"|Initialization failed\. Please see the error messages above"
            r"|crashed with exit code|unexpectedly failed with an? exit code"
            r"|kill_process_tree called|^Exit code: -?\d+",
        ),
        (Signature.KILLED, r"^Killed\s*$"),
    )
)


# A necessary condition for every pattern above: each of their alternatives contains one of
# these words once lowercased (tests/sglang/test_logparse.py checks it on every line of the corpus).
# One search of this on the lowercased line costs a tenth of the 19 searches, and almost no
# line of a serving server (decode / prefill stats, access lines) contains any of them.
_SIGNATURE_WORDS = re.compile("|".join(re.escape(word) for word in (
    "out of memory", "outofmemory", "cuda error", "cudaerror", "cublas_status", "calloc",
    "not enough", "leave no gpu memory", "too small", "is zero", "graph failed",
    "fail when using", "already in use", "eaddrinuse", "is not available in", "error: ",
    "user-specified", "compatible with", "no_buffer", "extra_buffer", "repo id",
    "couldn't connect", "local folder", "unrecognized model", "file named", "no such file",
    "repositorynotfound", "nccl", "distbackenderror", "watchdog", "gloo", "no kernel image",
    "illegal memory access", "device-side assert", "cuda driver version", "no accelerator",
    "cuda-capable", "nvidia driver", "device ordinal", "launch failure", "[errno 12]",
    "memoryerror", "bad_alloc", "defaultcpuallocator", "unbalanced", "health check failed",
    "initialization failed", "sigquit", "scheduler is dead", "scheduler died", "exit code",
    "kill_process_tree", "killed",
)))


def match_signatures(message: str) -> list[Signature]:
    """Every known failure text in one line's message (the part after any prefix).

    "Decode out of memory happened" (a scheduler retracting requests) matches nothing: it is
    normal operation, not a failure. Only the first MAX_KEPT_CHARS are searched: failure
    texts start their line, and a runaway 1 MiB line must not cost the event loop a second.
    A line without any of the _SIGNATURE_WORDS cannot match and costs one search.
    """
    head = message[:MAX_KEPT_CHARS]
    if _SIGNATURE_WORDS.search(head.lower()) is None:
        return []
    return [sig for sig, pattern in _SIGNATURES if pattern.search(head)]


def match_signatures_unfiltered(message: str) -> list[Signature]:
    """match_signatures without the word prefilter (the reference it must agree with)."""
    head = message[:MAX_KEPT_CHARS]
    return [sig for sig, pattern in _SIGNATURES if pattern.search(head)]


# ---------------------------------------------------------------------------------------------
# Sizes and the torch OOM message

_SIZE_UNITS = {
    "b": 1 / 2**30, "bytes": 1 / 2**30, "byte": 1 / 2**30,
    "kib": 1 / 2**20, "kb": 1 / 2**20,
    "mib": 1 / 2**10, "mb": 1 / 2**10,
    "gib": 1.0, "gb": 1.0,
    "tib": 2.0**10, "tb": 2.0**10,
}  # fmt: skip
_SIZE = r"(\d+(?:\.\d+)?) ?([KMGT]?i?B|bytes?)"
_OOM_TRIED = re.compile(r"Tried to allocate " + _SIZE)
_OOM_NEW = re.compile(
    r"GPU (\d+) has a total capac(?:i)?ty of " + _SIZE + r" of which " + _SIZE + r" is free"
)
_OOM_OLD = re.compile(
    r"\(GPU (\d+); " + _SIZE + r" total capacity;(?:[^;)]*;)*? " + _SIZE + r" free"
)


def parse_size_gib(number: str, unit: str) -> float | None:
    """``("448.00", "MiB")`` -> 0.4375. torch's ``format_size`` units, and the "GB" SGLang
    prints for what is really GiB. None when ``number`` is out of bounds (``bounded_float``).
    Raises ValueError for an unknown unit."""
    factor = _SIZE_UNITS.get(unit.lower())
    if factor is None:
        raise ValueError(f"unknown size unit {unit!r}")
    value = bounded_float(number)
    return None if value is None else value * factor


@dataclass(frozen=True)
class OomFigures:
    """Figures of one torch OOM message; a field is None when the message lacks it."""

    tried_gib: float | None = None
    free_gib: float | None = None
    total_gib: float | None = None
    gpu: int | None = None


def parse_oom(text: str) -> OomFigures | None:
    """The figures of a torch CUDA OOM message, new or old torch format; None if no figure.

    New: ``Tried to allocate 7.50 GiB. GPU 1 has a total capacity of 94.97 GiB of which
    2.30 GiB is free.`` Old: ``Tried to allocate 20.00 MiB (GPU 0; 79.35 GiB total capacity;
    77.80 GiB already allocated; 3.06 MiB free; ...)``.
    """
    tried = _OOM_TRIED.search(text)
    capacity = _OOM_NEW.search(text) or _OOM_OLD.search(text)  # same groups, same order
    if tried is None and capacity is None:
        return None
    tried_gib = parse_size_gib(*tried.groups()) if tried else None
    if capacity is None:
        return OomFigures(tried_gib=tried_gib)
    gpu, total_n, total_u, free_n, free_u = capacity.groups()
    return OomFigures(
        tried_gib=tried_gib,
        free_gib=parse_size_gib(free_n, free_u),
        total_gib=parse_size_gib(total_n, total_u),
        gpu=bounded_int(gpu),
    )


_NUM = r"(\d+(?:\.\d+)?)"
_MIN_VIABLE = re.compile(r"minimum viable = [^)]*?" + _NUM + r"\)")
_RAISE_ABOVE = re.compile(r"Raise --mem-fraction-static above " + _NUM)
_MFS_STATED = re.compile(r"mem_fraction_static=" + _NUM + r"|--mem-fraction-static=" + _NUM)
_MAMBA_SIZE_STATED = re.compile(r"(?:Computed )?max_mamba_cache_size=(-?\d+)")
_MAMBA_PER_REQ = re.compile(r"mamba_cache_per_req=" + _NUM + r" MB")
# The fix an error names: "please use --mamba-scheduler-strategy extra_buffer", "...; use
# no_buffer.", "set SGLANG_ENABLE_SPEC_V2=1" ("To use radix cache" names no strategy).
_USE_STRATEGY = re.compile(
    r"\buse (?:--mamba-(?:scheduler|radix-cache)-strategy )?(no_buffer|extra_buffer(?:_lazy)?)\b"
)
_SET_ENV = re.compile(r"\bset (SGLANG_[A-Z0-9_]+)=(\w+)")
# 0.5.23 mamba_hook.validate_mamba_no_buffer: "Try to set disable_overlap_schedule=True."
_SET_NO_OVERLAP = re.compile(r"\bset disable_overlap_schedule=True\b")


def fill_error_figures(numbers: Numbers, message: str, *, overwrite: bool) -> None:
    """Copy the figures an error message states into ``numbers``.

    OOM sizes (only when ``overwrite`` or none were read yet), the minimum viable
    ``--mem-fraction-static`` and the current one stated by a "Not enough memory" error, the
    hybrid state-cache figures of 0.5.23's errors, and a fix the message prescribes (a Mamba
    strategy to use, ``SGLANG_*`` variables to set, or 0.5.23's "set
    disable_overlap_schedule=True").
    """
    oom = parse_oom(message)
    if oom is not None and (overwrite or numbers.tried_gib is None):
        numbers.tried_gib, numbers.free_gib = oom.tried_gib, oom.free_gib
        numbers.total_gib, numbers.gpu = oom.total_gib, oom.gpu
    m = _MIN_VIABLE.search(message) or _RAISE_ABOVE.search(message)
    if m is not None:
        numbers.min_mem_fraction = bounded_float(m.group(1))
    m = _MFS_STATED.search(message)
    if m is not None:
        numbers.mem_fraction_static = bounded_float(m.group(1) or m.group(2))
    if "mamba/linear-attention" in message:
        if m := _MAMBA_SIZE_STATED.search(message):
            numbers.mamba_cache_size = bounded_int(m.group(1), signed=True)
        if m := _MAMBA_PER_REQ.search(message):
            numbers.mamba_per_req_mib = bounded_float(m.group(1))
    if m := _USE_STRATEGY.search(message):
        numbers.prescribed_mamba_strategy = m.group(1)
        env = _SET_ENV.findall(message)
        numbers.prescribed_env = ",".join(f"{k}={v}" for k, v in env) or None
    if _SET_NO_OVERLAP.search(message):
        numbers.prescribed_disable_overlap = True


# ---------------------------------------------------------------------------------------------
# Events


@dataclass(frozen=True)
class PhaseLine:
    """The server entered ``phase`` (phases only move forward)."""

    phase: Phase


@dataclass(frozen=True)
class Progress:
    """A progress bar of ``phase`` showed ``done`` of ``total`` steps (rank 0 only)."""

    phase: Phase
    done: int
    total: int


class Figure(enum.StrEnum):
    """Names of the memory figures SGLang logs. All are GiB (SGLang labels them "GB")."""

    DIST_INIT_USAGE = "dist_init_usage"  # "Init torch distributed ends. mem usage="
    BASELINE_USAGE = "baseline_usage"  # 0.5.23 "Memory baseline taken. mem usage="
    WEIGHT_BEGIN_AVAIL = "weight_begin_avail"  # "Load weight begin. avail mem="
    WEIGHT_END_AVAIL = "weight_end_avail"  # "Load weight end. ... avail mem="
    WEIGHT_END_USAGE = "weight_end_usage"  # "Load weight end. ... mem usage="
    KV_K_SIZE = "kv_k_size"
    KV_V_SIZE = "kv_v_size"
    KV_SIZE = "kv_size"  # MLA: "KV size:"
    POOL_END_AVAIL = "pool_end_avail"  # "Memory pool end. avail mem="
    GRAPH_BEGIN_AVAIL = "graph_begin_avail"  # "Capture ... graph begin ... avail mem="
    GRAPH_PROGRESS_AVAIL = "graph_progress_avail"  # "Capturing batches (... avail_mem=X GB)"
    GRAPH_END_USAGE = "graph_end_usage"
    GRAPH_END_AVAIL = "graph_end_avail"
    SUMMARY_AVAIL = "summary_avail"  # "max_total_num_tokens=... available_gpu_mem="


@dataclass(frozen=True)
class MemoryFigure:
    """One memory figure from the log, with the rank that printed it (None: no rank prefix)."""

    name: Figure
    gib: float
    rank: str | None


@dataclass(frozen=True)
class ReadyLine:
    """``The server is fired up and ready to roll!`` was printed."""

    line: str
    line_no: int


@dataclass(frozen=True)
class FailureSignature:
    """A line matched a known failure text.

    ``in_traceback`` is True for exception lines and their continuation inside a traceback
    (the same failure also arrives as part of a ``Traceback`` event when it closes).
    ``phase`` is the phase of the printing rank at that moment.
    """

    kind: Signature
    line: str
    line_no: int
    rank: str | None
    phase: Phase | None
    in_traceback: bool


@dataclass(frozen=True)
class RaisedException:
    """One exception of a traceback: ``type`` as printed (``torch.OutOfMemoryError``) and its
    message including continuation lines, joined with ``\\n``."""

    type: str
    message: str
    line: str  # the ``Type: message`` line verbatim


@dataclass(frozen=True)
class Traceback:
    """A whole Python traceback, chained exceptions included, emitted once it has ended.

    ``exceptions`` are in printed order: for ``During handling of the above exception`` chains
    the inner one comes first and the last one is what was finally raised. ``rank`` and
    ``phase`` come from a prefixed header such as ``[ts TP3] Scheduler hit an exception:
    Traceback (most recent call last):``; a bare header has rank None and the global phase.
    """

    line_no: int  # of the header line
    header: str  # the header line verbatim
    rank: str | None
    phase: Phase | None
    exceptions: tuple[RaisedException, ...]
    frames: tuple[str, ...]  # the indented lines (the last ones if there were very many)
    signatures: frozenset[Signature]

    @property
    def exc_type(self) -> str | None:
        return self.exceptions[-1].type if self.exceptions else None

    @property
    def message(self) -> str | None:
        return self.exceptions[-1].message if self.exceptions else None

    @property
    def text(self) -> str:
        """Header and exception texts (no frames): what the traceback says, for searching."""
        parts = [self.header]
        parts.extend(f"{e.type}: {e.message}" for e in self.exceptions)
        return "\n".join(parts)

    @property
    def evidence(self) -> list[str]:
        """The header and each exception line, verbatim."""
        return [self.header, *(e.line for e in self.exceptions)]


LogEvent = PhaseLine | Progress | MemoryFigure | ReadyLine | FailureSignature | Traceback

# ---------------------------------------------------------------------------------------------
# Traceback assembly

_TB_HEADER = "Traceback (most recent call last):"
_CHAIN_SEPARATORS = frozenset(
    {
        "During handling of the above exception, another exception occurred:",
        "The above exception was the direct cause of the following exception:",
    }
)
# The final line of a traceback starts at column 0 with a class name, dotted or not.
_EXC_LINE = re.compile(r"^((?:[A-Za-z_]\w*\.)*[A-Z]\w*)(:(?: (.*))?)?$", re.S)
_EXC_SUFFIXES = ("Error", "Exception", "Exit", "Interrupt")


def _exception_line(text: str) -> tuple[str, str] | None:
    """``(type, message)`` if ``text`` is a traceback's ``Type: message`` line.

    Without a colon the name must look like an exception class, so a stray bare word written
    in the middle of a traceback is not taken for its end.
    """
    m = _EXC_LINE.match(text)
    if m is None:
        return None
    name, colon, message = m.groups()
    if colon is None and not name.endswith(_EXC_SUFFIXES):
        return None
    return name, message or ""


_MAX_FRAMES = 200
# "Capture cuda graph failed: {e}\nPossible solutions:..." where {e} (a CUDA error) itself ends
# with a newline: the message resumes after a blank line.
_MESSAGE_RESUMES = ("Possible solutions:", "Possible suggestions:")


class _TbState(enum.Enum):
    FRAMES = enum.auto()  # reading "  File ..." lines
    MESSAGE = enum.auto()  # after "Type: message": further bare lines continue the message
    AFTER_BLANK = enum.auto()  # a blank line: the end, unless a chain separator follows
    CHAIN = enum.auto()  # saw a chain separator: the next traceback header continues this one


class _Role(enum.Enum):
    OUTSIDE = enum.auto()  # not part of the open traceback (interleaved, or it ended)
    FRAME = enum.auto()  # part of it; not searched for failure texts (source code lines)
    TEXT = enum.auto()  # part of it; an exception line or message continuation


@dataclass
class _OpenTraceback:
    line_no: int
    header: str
    rank: str | None
    phase: Phase | None
    state: _TbState = _TbState.FRAMES
    frames: deque[str] = field(default_factory=lambda: deque(maxlen=_MAX_FRAMES))
    exceptions: list[tuple[str, list[str], str]] = field(default_factory=list)
    signatures: set[Signature] = field(default_factory=set)

    def close(self) -> Traceback:
        return Traceback(
            line_no=self.line_no,
            header=self.header,
            rank=self.rank,
            phase=self.phase,
            exceptions=tuple(
                RaisedException(type=t, message="\n".join(msg), line=line)
                for t, msg, line in self.exceptions
            ),
            frames=tuple(self.frames),
            signatures=frozenset(self.signatures),
        )


# ---------------------------------------------------------------------------------------------
# Start-up progress patterns (docs/sglang.md, "The log": phases)

_F = _NUM + r" GB"
_INIT_MARK = re.compile(r"^(?:server_args=|Init torch distributed|Init parallel)")
_ARGS_MFS = re.compile(r"""['"]?mem_fraction_static['"]?\s*[=:]\s*""" + _NUM)
_ARGS_GRAPH_BS = re.compile(r"""['"]?cuda_graph_max_bs(?:_decode)?['"]?\s*[=:]\s*(\d+)""")


def _args_key(*names: str) -> re.Pattern[str]:
    """``name=value`` (0.5.10's ``ServerArgs(...)`` repr) or ``'name': value`` (0.5.23 dict)."""
    alt = "|".join(names)
    return re.compile(r"""[(,{]\s*['"]?(?:""" + alt + r""")['"]?\s*[=:]\s*['"]?([\w.]+)""")


_ARGS_SPEC = {
    "speculative_algorithm": _args_key("speculative_algorithm"),
    "speculative_num_steps": _args_key("speculative_num_steps"),
    "speculative_eagle_topk": _args_key("speculative_eagle_topk"),
    "speculative_num_draft_tokens": _args_key("speculative_num_draft_tokens"),
    "max_running_requests": _args_key("max_running_requests"),
    "mamba_strategy": _args_key("mamba_scheduler_strategy", "mamba_radix_cache_strategy"),
}
_SPEC_RESET = re.compile(r"^Max running requests is reset to (\d+) for speculative decoding")
# Draft models' EntryClass names: DeepseekV3ForCausalLMNextN, Qwen3_5ForCausalLMMTP, MiMoMTP,
# LlamaForCausalLMEagle3, LlamaForCausalLMEagle, Qwen2ForCausalLMEagle (models/*.py).
_WEIGHT_TYPE = re.compile(r"\btype=(\w+)")
_DRAFT_TYPE = re.compile(r"(?:NextN|MTP|Eagle3?|Medusa)$")
_MAMBA_ALLOC = re.compile(
    r"Mamba Cache is allocated\. max_mamba_cache_size: (\d+), conv_state size: ([\d.]+) ?GB, "
    r"ssm_state size: ([\d.]+) ?GB(?: intermediate_ssm_state_cache size: ([\d.]+) ?GB "
    r"intermediate_conv_window_cache size: ([\d.]+) ?GB)?"
)
# "Capture {role} {kind} CUDA graph begin." (0.5.23), "Capture cuda graph begin." and "Capture
# draft (extend )?cuda graph begin" (0.5.10), plus the special runners' spellings.
_PASS_WORDS = re.compile(
    r"^Capture (?:(target|draft) )?(?:(prefill|decode|verify|extend) )?\w+ graph begin\b"
)
_DIST_USAGE = re.compile(r"^Init torch distributed ends\..*?mem usage=" + _F)
_BASELINE = re.compile(r"^Memory baseline taken\. mem usage=" + _F)
_WEIGHT_BEGIN = re.compile(r"Load weight begin\. avail mem=" + _F)
_WEIGHT_END = re.compile(r"Load weight end\..*?avail mem=" + _F + r", mem usage=" + _F)
_KV_MARK = re.compile(r"(?:KV|Mamba) Cache is allocated|^Memory pool end")
_KV_ALLOC = re.compile(
    r"KV Cache (?:is allocated|VA upper bound)\.(?: dtype: \S+,)? #tokens: (\d+), "
    r"(?:K size: " + _F + r", V size: " + _F + r"|KV size: " + _F + r")"
)
# "Capture cuda graph bs [1, 2, 4]" (0.5.10), "Capture target decode CUDA graph end. bs=[1, 2]"
# (0.5.23); not "num_tokens=[...]" (prefill graphs are sized by tokens, not batch size).
_CAPTURE_BS_LIST = re.compile(r"\bbs[= ]?\[([\d, ]*)\]")
_POOL_END = re.compile(r"^Memory pool end\. avail mem=" + _F)
_GRAPH_BEGIN = re.compile(r"(?i)^capture .*?(?:graph|single-CG draft extend) begin\b")
_AVAIL = re.compile(r"avail mem=" + _F)
# "Capture ... graph end. ... mem usage=X GB, avail mem=Y GB.", and 0.5.23's "Capture single-CG
# draft extend end." (multi_layer_eagle_draft_extend_cuda_graph_runner.py:1039), as at begin.
_GRAPH_END = re.compile(
    r"(?i)^capture .*?(?:graph|single-CG draft extend) end\..*?mem usage=" + _F
    + r".*?avail mem=" + _F
)
_GRAPH_BAR = re.compile(
    r"^(?:Capturing batches|Capturing num tokens|Capturing prefill shape|Compiling num tokens)"
    r" \(([^)]*)\):.*?\|\s*(\d+)/(\d+)"
)
_BAR_BS = re.compile(r"\bbs=(\d+)")
_BAR_AVAIL = re.compile(r"avail_mem=" + _F)
_SHARD_BAR = re.compile(
    r"^(?:Loading \S+ checkpoint shards|Multi-thread loading shards):\s+\d+% Completed"
    r" \| (\d+)/(\d+)"
)
_SUMMARY = re.compile(r"^max_total_num_tokens=(\d+),.*?available_(?:gpu|cpu)_mem=" + _F)
_HTTP_UP = re.compile(r"^(?:Uvicorn running on|Application startup complete)")
READY_TEXT = "The server is fired up and ready to roll!"
# A tqdm bar that is not finished has no line end, so another process's log line lands right
# after it: "...| 42/163 [01:04<03:05,  1.53s/it][2025-10-05 03:34:41 TP5] Scheduler hit...".
_GLUED_PREFIX = re.compile(
    r"(?<=it/s\]|s/it\])(?=\[\d{4}-\d\d-\d\d \d\d:\d\d:\d\d(?:\.\d{3})?(?: [A-Z][A-Z_]*\d+)*\] )"
)

# The key of a line without a rank prefix in the follower's per-rank tables (TP=1, the main
# process); a rank prefix is never empty.
_NO_RANK = ""

# Figure -> (Numbers field, take the largest over ranks rather than the smallest). Each
# rank's *first* value is used: later ones belong to a draft model (speculative decoding).
# Avail figures take the minimum because SGLang sizes its pools from the minimum over ranks.
_FIGURE_FIELDS: dict[Figure, tuple[str, bool]] = {
    Figure.WEIGHT_BEGIN_AVAIL: ("pre_load_avail_gib", False),
    Figure.WEIGHT_END_AVAIL: ("post_weights_avail_gib", False),
    Figure.WEIGHT_END_USAGE: ("weights_gib", True),
    Figure.POOL_END_AVAIL: ("pool_end_avail_gib", False),
    Figure.GRAPH_BEGIN_AVAIL: ("graph_first_begin_avail_gib", False),
}


# SGLang's batch statistics: numbers only, the bulk of a serving server's log.
_BATCH_STATS = ("Decode batch", "Prefill batch")
# uvicorn's access line: the client's request line follows, which a client writes.
_ACCESS_LINE = re.compile(r'\d{1,3}(?:\.\d{1,3}){3}:\d+ - "')


def _cannot_matter(p: ParsedLine) -> bool:
    """Lines that no classification reads, skipped without a search for failure texts or
    start-up marks: SGLang's batch statistics, and uvicorn's access lines (a client must not
    be able to forge a failure by requesting a path that reads like one). Only ever asked
    outside a traceback."""
    if p.source is Source.SGLANG:
        return p.message.startswith(_BATCH_STATS)
    return p.source is Source.UVICORN and _ACCESS_LINE.match(p.message) is not None


def is_routine(line: str) -> bool:
    """Whether ``line`` is routine traffic of a serving server (an uvicorn access line or
    SGLang's batch statistics): never an error, so never shown as one."""
    return _cannot_matter(parse_line(line))


def _sum_gib(values: tuple[str | None, ...]) -> float | None:
    """The sum of the GB figures a pool line states (None ones absent), rounded to 0.01;
    None when one of them is out of bounds."""
    figures = [bounded_float(v) for v in values if v is not None]
    if None in figures:
        return None
    return round(sum(f for f in figures if f is not None), 2)


def graph_pass_of(message: str, *, speculative: bool) -> GraphPass:
    """The capture pass a ``Capture ... begin`` message opens (see ``GraphPass``).

    A line without a role word is the target's (0.5.10); its plain "cuda graph" is the decode
    graph, which is the target *verify* graph when speculative decoding is on.
    """
    m = _PASS_WORDS.match(message)
    if m is not None:
        draft, kind = m.group(1) == "draft", m.group(2)
    else:
        # piecewise (0.5.10 prefill), "single-CG draft extend", "Frozen-KV MTP draft", "UNO
        # tree draft"
        low = message.lower()
        draft = " draft" in low
        kind = "extend" if "extend" in low else "prefill" if "piecewise" in low else None
    if draft:
        if kind == "prefill":
            return GraphPass.DRAFT_PREFILL
        return GraphPass.DRAFT_EXTEND if kind == "extend" else GraphPass.DRAFT_DECODE
    if kind == "prefill":
        return GraphPass.TARGET_PREFILL
    if kind == "verify" or (kind is None and speculative):
        return GraphPass.TARGET_VERIFY
    return GraphPass.TARGET_DECODE


class LogFollower:
    """Follows one attempt's log line by line and says what happened, as events.

    Pure and stateful: feed lines in order with ``feed_line`` and call ``finish`` at the end
    of the log (it closes a traceback still open). State exposed between calls:

    - ``phase``: the furthest phase any line has shown, None before the first start-up line;
      it only moves forward (a draft model's ``Load weight begin`` does not move it back).
    - ``progress``: fraction 0..1 of the current phase's progress bar, None if none shown
      (nor since the current capture pass began: a new pass starts without a bar).
    - ``steps``: that bar's (done, total), e.g. (12, 40) shards or (28, 36) graphs.
    - ``numbers``: figures and resolved settings read so far (``launcher.sglang.outcome.Numbers``).
    - ``last_lines``: the most recent ``tail`` lines, verbatim, for a tail in reports.
    - ``line_count``: records read; a log line glued to an unfinished progress bar counts as
      a record of its own (``line_no`` in events counts records).
    - ``ready_line_no`` / ``ready_line``: index and text of the first readiness line.
    - ``failures()``: the failure records that count (see there); ``port_in_use``: the first
      "address already in use" signature, kept even when a readiness line follows it.

    Memory is bounded: nothing grows with the length of the log.
    """

    def __init__(self, *, tail: int = DEFAULT_TAIL) -> None:
        self.phase: Phase | None = None
        self.numbers = Numbers()
        self.last_lines: deque[str] = deque(maxlen=tail)
        self.ready_line_no: int | None = None
        self.ready_line: str | None = None
        self.line_count = 0
        self._rank_phase: dict[str, Phase] = {}
        self._progress: tuple[Phase, int, int] | None = None  # phase, done, total
        self._firsts: dict[Figure, dict[str, float]] = {f: {} for f in _FIGURE_FIELDS}
        # rank -> (capture passes it began, avail mem at its latest begin)
        self._rank_pass: dict[str, tuple[int, float | None]] = {}
        # per pass index: (GraphPass value, avail figures of its begin lines over the ranks)
        self._pass_begins: list[tuple[str, list[float | None]]] = []
        self._rank_ends: dict[str, int] = {}  # rank -> "Capture ... end" lines seen
        self._rank_pass_name: dict[str, GraphPass] = {}  # rank -> the pass it captures now
        self._pass_usage: dict[tuple[str, GraphPass], float] = {}  # (rank, pass) -> GiB
        self._kv_labels: dict[str, set[str]] = {}  # rank -> pool labels seen ("" unlabelled)
        self._kv_target: dict[str, float] = {}  # rank -> target pool GiB
        self._kv_draft: dict[str, float] = {}  # rank -> draft pool GiB
        self._draft_weights: dict[str, float] = {}
        self._tb: _OpenTraceback | None = None
        self._failures: list[Traceback | FailureSignature] = []
        self.port_in_use: FailureSignature | None = None

    @property
    def progress(self) -> float | None:
        steps = self.steps
        return None if steps is None else min(steps[0] / steps[1], 1.0)

    @property
    def steps(self) -> tuple[int, int] | None:
        if self._progress is None or self._progress[0] is not self.phase:
            return None
        return self._progress[1], self._progress[2]

    @property
    def resolved_params(self) -> LaunchParams:
        """The memory settings the args dump (or an error) showed; None fields if not shown."""
        return LaunchParams(
            mem_fraction_static=self.numbers.mem_fraction_static,
            cuda_graph_max_bs=self.numbers.cuda_graph_max_bs,
        )

    def failures(self) -> list[Traceback | FailureSignature]:
        """Tracebacks and failure lines outside tracebacks since the last readiness line.

        Failures printed before a readiness line did not stop the server, so a readiness line
        drops them. Only the first ``MAX_FAILURES`` are kept. A traceback still being read is
        included as it stands, so this can be asked mid-stream without disturbing the follower.
        """
        if self._tb is None or len(self._failures) >= MAX_FAILURES:
            return list(self._failures)
        return [*self._failures, self._tb.close()]

    def phase_of(self, rank: str | None) -> Phase | None:
        """The phase a line from ``rank`` belongs to.

        Ranks load and allocate at their own pace, so before warmup a rank's own lines count;
        from warmup on only TP0 and the main process print progress, so the global phase holds.
        """
        if rank is None or self.phase is None or self.phase.order >= Phase.WARMUP.order:
            return self.phase
        return self._rank_phase.get(rank, self.phase)

    def feed_line(self, line: str) -> list[LogEvent]:
        """Events for one line (without its terminator), in order."""
        self.last_lines.append(_kept(line))
        pieces = _GLUED_PREFIX.split(line) if line[:1] != "[" else [line]
        if len(pieces) == 1:
            return self._feed(line)
        return [event for piece in pieces for event in self._feed(piece)]

    def _feed(self, line: str) -> list[LogEvent]:
        line_no = self.line_count
        self.line_count += 1
        parsed = parse_line(line)
        if self._tb is None and _cannot_matter(parsed):
            return []
        events: list[LogEvent] = []
        role = _Role.OUTSIDE
        if self._tb is not None:
            role, closed = self._tb_step(parsed)
            if closed is not None:
                events.append(closed)
        if role is _Role.OUTSIDE and parsed.message.endswith(_TB_HEADER):
            if self._tb is not None:  # a header while one is open: the first was cut short
                events.append(self._tb.close())
            self._tb = _OpenTraceback(
                line_no=line_no, header=_kept(line), rank=parsed.rank,
                phase=self.phase_of(parsed.rank),
            )
            role = _Role.TEXT
        if role is not _Role.FRAME:
            events.extend(self._signatures(parsed, line_no, in_traceback=role is _Role.TEXT))
            if role is _Role.OUTSIDE:
                events.extend(self._startup(parsed, line_no))
        self._record(events)
        return events

    def finish(self) -> list[LogEvent]:
        """Events still pending at the end of the log: a traceback that never ended."""
        if self._tb is None:
            return []
        closed, self._tb = self._tb.close(), None
        self._record([closed])
        return [closed]

    def _record(self, events: list[LogEvent]) -> None:
        for ev in events:
            if isinstance(ev, ReadyLine):
                self._failures.clear()
            elif isinstance(ev, FailureSignature):
                if ev.kind is Signature.PORT_IN_USE and self.port_in_use is None:
                    self.port_in_use = ev
                if not ev.in_traceback:  # else the Traceback event carries it
                    self._keep_failure(ev)
            elif isinstance(ev, Traceback):
                self._keep_failure(ev)

    def _keep_failure(self, failure: Traceback | FailureSignature) -> None:
        if len(self._failures) < MAX_FAILURES:
            self._failures.append(failure)

    # -- tracebacks ------------------------------------------------------------------------

    def _tb_step(self, p: ParsedLine) -> tuple[_Role, Traceback | None]:
        tb = self._tb
        assert tb is not None
        text = p.raw
        if tb.state is _TbState.FRAMES:
            if p.source is not Source.BARE:  # another process's log line, interleaved
                return _Role.OUTSIDE, None
            if text == _TB_HEADER:
                return self._tb_close()
            if text[:1].isspace() or not text:
                tb.frames.append(_kept(text))
                return _Role.FRAME, None
            exc = _exception_line(text)
            if exc is None:  # a tqdm bar or an NCCL line written in the middle
                return _Role.OUTSIDE, None
            tb.exceptions.append((exc[0][:MAX_KEPT_CHARS], [_kept(exc[1])], _kept(text)))
            tb.state = _TbState.MESSAGE
            return _Role.TEXT, None
        if tb.state is _TbState.MESSAGE:
            if p.source is not Source.BARE or text == _TB_HEADER:
                return self._tb_close()
            if not text.strip():
                tb.state = _TbState.AFTER_BLANK
                return _Role.FRAME, None
            if len(tb.exceptions[-1][1]) < _MAX_MESSAGE_LINES:
                tb.exceptions[-1][1].append(_kept(text))
            return _Role.TEXT, None
        # AFTER_BLANK or CHAIN
        if p.source is Source.BARE and not text.strip():
            return _Role.FRAME, None
        if text in _CHAIN_SEPARATORS:
            tb.state = _TbState.CHAIN
            return _Role.FRAME, None
        if tb.state is _TbState.AFTER_BLANK and text.startswith(_MESSAGE_RESUMES):
            # SGLang appends its advice to a wrapped message that ended with a newline.
            tb.state = _TbState.MESSAGE
            if len(tb.exceptions[-1][1]) < _MAX_MESSAGE_LINES:
                tb.exceptions[-1][1].append(_kept(text))
            return _Role.TEXT, None
        if tb.state is _TbState.CHAIN and text == _TB_HEADER:
            tb.state = _TbState.FRAMES
            return _Role.FRAME, None
        return self._tb_close()

    def _tb_close(self) -> tuple[_Role, Traceback]:
        assert self._tb is not None
        closed, self._tb = self._tb.close(), None
        return _Role.OUTSIDE, closed

    def _signatures(
        self, p: ParsedLine, line_no: int, *, in_traceback: bool
    ) -> list[FailureSignature]:
        kinds = match_signatures(p.message)
        if not kinds:
            return []
        if in_traceback and self._tb is not None:
            self._tb.signatures.update(kinds)
            rank, phase = self._tb.rank, self._tb.phase
        else:
            rank, phase = p.rank, self.phase_of(p.rank)
        if Signature.CUDA_OOM in kinds or Signature.KV_TOO_SMALL in kinds:
            fill_error_figures(self.numbers, p.message[:MAX_KEPT_CHARS], overwrite=False)
        if p.source is not Source.BARE and Signature.KILLED in kinds:
            kinds.remove(Signature.KILLED)  # only a shell's own bare line means that
        return [FailureSignature(kind, _kept(p.raw), line_no, rank, phase, in_traceback)
                for kind in kinds]

    # -- start-up progress -----------------------------------------------------------------

    def _startup(self, p: ParsedLine, line_no: int) -> list[LogEvent]:
        # Progress lines are short; only the args dump can be long (and is read whole).
        msg = p.message if p.message.startswith("server_args=") else p.message[:MAX_KEPT_CHARS]
        events: list[LogEvent] = []
        rank = p.rank

        def enter(phase: Phase) -> None:
            events.extend(self._enter(phase, rank))

        def figure(name: Figure, value: str) -> None:
            gib = bounded_float(value)
            if gib is not None:  # a figure out of bounds is no figure
                events.append(self._figure(name, gib, rank))

        if p.source is Source.UVICORN:
            if _HTTP_UP.match(msg):
                enter(Phase.WARMUP)
            return events
        if p.source is Source.BARE:
            return self._bars(msg)
        if msg.startswith(READY_TEXT):
            enter(Phase.READY)
            if self.ready_line_no is None:
                self.ready_line_no, self.ready_line = line_no, _kept(p.raw)
            events.append(ReadyLine(_kept(p.raw), line_no))
        elif _INIT_MARK.match(msg):
            enter(Phase.INIT)
            if msg.startswith("server_args="):
                self._args_dump(msg)
            elif m := _DIST_USAGE.match(msg):
                figure(Figure.DIST_INIT_USAGE, m.group(1))
        elif m := _BASELINE.match(msg):
            figure(Figure.BASELINE_USAGE, m.group(1))
        elif "Load weight begin" in msg and (m := _WEIGHT_BEGIN.search(msg)):
            enter(Phase.WEIGHTS)
            figure(Figure.WEIGHT_BEGIN_AVAIL, m.group(1))
        elif "Load weight end" in msg and (m := _WEIGHT_END.search(msg)):
            kind = _WEIGHT_TYPE.search(msg)
            if kind is not None and _DRAFT_TYPE.search(kind.group(1)):
                # The draft model (speculative decoding): not a second target.
                if (draft := bounded_float(m.group(2))) is not None:
                    self._draft_weights[rank or _NO_RANK] = draft
                    self.numbers.draft_weights_gib = max(self._draft_weights.values())
            else:
                enter(Phase.KV_CACHE)
                figure(Figure.WEIGHT_END_AVAIL, m.group(1))
                figure(Figure.WEIGHT_END_USAGE, m.group(2))
        elif (" Cache is allocated" in msg or msg.startswith("Memory pool end")) and (
            _KV_MARK.search(msg)
        ):
            enter(Phase.KV_CACHE)
            if (m := _MAMBA_ALLOC.search(msg)) and self.numbers.mamba_cache_size is None:
                self.numbers.mamba_cache_size = bounded_int(m.group(1))
                self.numbers.mamba_state_gib = _sum_gib(m.groups()[1:])
            if m := _KV_ALLOC.search(msg):
                if self.numbers.kv_tokens is None:
                    self.numbers.kv_tokens = bounded_int(m.group(1))
                self._kv_pool(msg[: m.start()].strip(), m, rank)
                k, v, kv = m.group(2, 3, 4)
                for name, value in ((Figure.KV_K_SIZE, k), (Figure.KV_V_SIZE, v),
                                    (Figure.KV_SIZE, kv)):
                    if value is not None:
                        figure(name, value)
            elif m := _POOL_END.match(msg):
                figure(Figure.POOL_END_AVAIL, m.group(1))
        elif _GRAPH_BEGIN.match(msg):
            enter(Phase.CUDA_GRAPH)
            avail = _AVAIL.search(msg)
            self._begin_pass(msg, rank, bounded_float(avail.group(1)) if avail else None)
            if avail is not None:
                figure(Figure.GRAPH_BEGIN_AVAIL, avail.group(1))
        elif m := _SPEC_RESET.match(msg):
            if self.numbers.max_running_requests is None:
                self.numbers.max_running_requests = bounded_int(m.group(1))
        elif m := _GRAPH_END.match(msg):
            key = rank or _NO_RANK
            self._rank_ends[key] = self._rank_ends.get(key, 0) + 1
            self.numbers.graph_passes_ended = max(self._rank_ends.values())
            figure(Figure.GRAPH_END_USAGE, m.group(1))
            figure(Figure.GRAPH_END_AVAIL, m.group(2))
            if (usage := bounded_float(m.group(1))) is not None:
                self._end_pass(msg, rank, usage)
        elif m := _SUMMARY.match(msg):
            enter(Phase.WARMUP)
            self.numbers.max_total_num_tokens = bounded_int(m.group(1))
            self.numbers.ready_avail_gib = bounded_float(m.group(2))
            figure(Figure.SUMMARY_AVAIL, m.group(2))
        if msg.startswith("Capture ") and (m := _CAPTURE_BS_LIST.search(msg)):
            sizes = (bounded_int(b.strip()) for b in m.group(1).split(","))
            largest = max((b for b in sizes if b is not None), default=None)
            if largest is not None:
                n = self.numbers
                n.graph_captured_max_bs = max(largest, n.graph_captured_max_bs or 0)
        return events

    def _bars(self, msg: str) -> list[LogEvent]:
        events: list[LogEvent] = []
        if m := _SHARD_BAR.match(msg):
            phase, done, total = Phase.WEIGHTS, bounded_int(m.group(1)), bounded_int(m.group(2))
            if done is None or total is None:  # a bar out of bounds is no bar
                return events
        elif m := _GRAPH_BAR.match(msg):
            phase, done, total = Phase.CUDA_GRAPH, bounded_int(m.group(2)), bounded_int(m.group(3))
            if done is None or total is None:
                return events
            self.numbers.graph_steps_done, self.numbers.graph_steps_total = done, total
            if bs := _BAR_BS.search(m.group(1)):
                self.numbers.graph_last_bs = bounded_int(bs.group(1))
            if (avail := _BAR_AVAIL.search(m.group(1))) and (
                gib := bounded_float(avail.group(1))
            ) is not None:
                events.append(self._figure(Figure.GRAPH_PROGRESS_AVAIL, gib, None))
                self.numbers.graph_last_avail_gib = gib
        else:
            return events
        events[:0] = self._enter(phase, None)  # a bar implies its phase, even if a line was lost
        if total > 0:
            self._progress = (phase, done, total)
        events.append(Progress(phase, done, total))
        return events

    def _enter(self, phase: Phase, rank: str | None) -> list[LogEvent]:
        if rank is not None:
            current = self._rank_phase.get(rank)
            if current is None or phase.order > current.order:
                self._rank_phase[rank] = phase
        if self.phase is not None and phase.order <= self.phase.order:
            return []
        self.phase = phase
        return [PhaseLine(phase)]

    def _figure(self, name: Figure, gib: float, rank: str | None) -> MemoryFigure:
        target = _FIGURE_FIELDS.get(name)
        if target is not None:
            firsts = self._firsts[name]
            firsts.setdefault(rank or _NO_RANK, gib)
            field_name, largest = target
            values = firsts.values()
            setattr(self.numbers, field_name, max(values) if largest else min(values))
        return MemoryFigure(name, gib, rank)

    def _begin_pass(self, msg: str, rank: str | None, avail: float | None) -> None:
        """A ``Capture ... begin`` line: the rank's next pass; a new pass for the log when no
        rank had got that far (ranks capture in lockstep, their lines interleave).

        A new pass's figures (its begin avail, the progress bar's) start afresh, so that a
        failure is measured against the pass it happened in, not the first one.
        """
        key = rank or _NO_RANK
        count = self._rank_pass.get(key, (0, None))[0] + 1
        self._rank_pass[key] = (count, avail)
        self._rank_pass_name[key] = graph_pass_of(msg, speculative=self.numbers.speculative)
        n = self.numbers
        if count > (n.graph_passes_begun or 0):
            n.graph_pass = graph_pass_of(msg, speculative=n.speculative).value
            n.graph_passes_begun = count
            n.graph_last_avail_gib = n.graph_last_bs = None
            n.graph_steps_done = n.graph_steps_total = None
            self._progress = None  # the previous pass's finished bar is not this one's
        at_pass = [a for c, a in self._rank_pass.values() if c == n.graph_passes_begun]
        figures = [a for a in at_pass if a is not None]
        n.graph_begin_avail_gib = min(figures) if figures else None
        if count > len(self._pass_begins):
            self._pass_begins.append((graph_pass_of(msg, speculative=n.speculative).value, []))
        self._pass_begins[count - 1][1].append(avail)
        begins: list[tuple[str, float]] = []
        for name, values in self._pass_begins:
            known = [v for v in values if v is not None]
            if not known:
                n.graph_begins = None
                return
            begins.append((name, min(known)))
        n.graph_begins = begins

    def _end_pass(self, msg: str, rank: str | None, usage: float) -> None:
        """A ``Capture ... graph end. ... mem usage=X`` line: what the rank's current pass
        took. Each (rank, pass)'s first figure counts; a pass's figure is the largest over
        ranks (the budget must hold on every GPU)."""
        key = rank or _NO_RANK
        name = self._rank_pass_name.get(key)
        if name is None:  # the begin line was lost: the end line names the pass as well
            name = graph_pass_of(msg.replace(" end.", " begin."),
                                 speculative=self.numbers.speculative)
        self._pass_usage.setdefault((key, name), usage)
        by_pass: dict[str, float] = {}
        for (_, pass_name), gib in self._pass_usage.items():
            by_pass[pass_name.value] = max(gib, by_pass.get(pass_name.value, 0.0))
        self.numbers.graph_mem_gib = by_pass

    def _kv_pool(self, label: str, m: re.Match[str], rank: str | None) -> None:
        """A ``[label ]KV Cache is allocated`` line: the target's pool, or the draft's.

        A rank's first pool of a label (none, or 0.5.23's "Full"/"SWA") is the target's; a
        second pool of a label it has already shown is the draft model's (speculative
        decoding allocates the draft's pool after the target's, in both 0.5.10 and 0.5.23).
        """
        key = rank or _NO_RANK
        gib = _sum_gib(m.groups()[1:])
        if gib is None:
            return
        labels = self._kv_labels.setdefault(key, set())
        n = self.numbers
        if label not in labels:
            labels.add(label)
            self._kv_target[key] = self._kv_target.get(key, 0.0) + gib
            n.kv_pool_gib = round(max(self._kv_target.values()), 2)
            return
        self._kv_draft[key] = self._kv_draft.get(key, 0.0) + gib
        n.draft_kv_pool_gib = round(max(self._kv_draft.values()), 2)
        if n.speculative:  # the policy's reading of the same pool (model_runner_kv_cache_mixin
            n.draft_kv_gib = n.draft_kv_pool_gib  # 0.5.10, kv_cache_configurator.py 0.5.23)
        if n.draft_kv_tokens is None:
            n.draft_kv_tokens = bounded_int(m.group(1))

    def _args_dump(self, msg: str) -> None:
        n = self.numbers
        for name, pattern in _ARGS_SPEC.items():
            m = pattern.search(msg)
            if m is None or m.group(1) == "None":
                continue
            value = m.group(1)
            if name in ("speculative_algorithm", "mamba_strategy"):
                setattr(n, name, value)
            elif (number := bounded_int(value)) is not None:
                setattr(n, name, number)
        if m := _ARGS_MFS.search(msg):
            self.numbers.mem_fraction_static = bounded_float(m.group(1))
        if m := _ARGS_GRAPH_BS.search(msg):
            self.numbers.cuda_graph_max_bs = bounded_int(m.group(1))
