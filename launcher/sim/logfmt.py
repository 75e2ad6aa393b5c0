"""SGLang's log output, per emulated version: line prefixes, phase lines, tqdm bars, torch's
OOM text, SGLang's failure messages and Python-style tracebacks.

Every string here is copied from SGLang's source (docs/sglang.md, "The log") or recorded logs;
where versions differ, :class:`Dialect` says which form a version prints. The functions are
pure; :class:`LogWriter` is the one place that writes (thread-safe, flushed per write).
"""

from __future__ import annotations

import math
import sys
import threading
from collections.abc import Sequence
from dataclasses import dataclass, field
from datetime import datetime
from typing import TextIO

from launcher.sglang.versions import SUPPORTED_VERSIONS, version_tuple

SGLANG_DIR = "/usr/local/lib/python3.12/dist-packages/sglang"
TORCH_DIR = "/usr/local/lib/python3.12/dist-packages/torch"
NCCL_VERSION = "2.27.3"


@dataclass(frozen=True)
class Dialect:
    """Which spelling of each line, flag and message one SGLang version uses."""

    version: str

    def __post_init__(self) -> None:
        vt = version_tuple(self.version)
        if len(vt) < 3 or vt[:2] != (0, 5):
            raise ValueError(
                f"unsupported SGLANG_SIM_VERSION {self.version!r}: use one of "
                + ", ".join(SUPPORTED_VERSIONS)
            )

    @property
    def vt(self) -> tuple[int, ...]:
        return version_tuple(self.version)

    def since(self, *version: int) -> bool:
        return self.vt >= version

    @property
    def prog(self) -> str:
        """argparse's program name in usage and error lines."""
        return "sglang serve" if self.since(0, 5, 10) else "launch_server.py"

    @property
    def model_info_path(self) -> str:
        """The path the warmup thread polls before its first request."""
        return "/model_info" if self.since(0, 5, 10) else "/get_model_info"

    @property
    def prefill_sep(self) -> str:
        return "," if self.since(0, 5, 10) else "."


# ---------------------------------------------------------------------------------------------
# Writing


LEVELS = {"debug": 10, "info": 20, "warning": 30, "warn": 30, "error": 40, "critical": 50}
INFO, WARNING, ERROR = 20, 30, 40


def timestamp(now: datetime, *, ms: bool) -> str:
    """``%Y-%m-%d %H:%M:%S`` plus ``.mmm`` when ``SGLANG_LOG_MS`` is set."""
    text = now.strftime("%Y-%m-%d %H:%M:%S")
    return f"{text}.{now.microsecond // 1000:03d}" if ms else text


@dataclass
class LogWriter:
    """SGLang's streams: log records, tqdm bars and tracebacks on stderr; uvicorn's access log
    on stdout. Records below ``level`` are dropped, and so are progress bars when the level is
    above INFO (as in SGLang). ``silenced`` drops scheduler and access lines (a hung scheduler);
    main-process records still print. Write errors (reader gone) are ignored."""

    level: int = INFO
    ms: bool = False
    err: TextIO = field(default_factory=lambda: sys.stderr)
    out: TextIO = field(default_factory=lambda: sys.stdout)
    silenced: bool = False
    bars: bool = True  # tqdm bars print on a TP group's rank 0 only (not on nodes >= 1)
    _lock: threading.Lock = field(default_factory=threading.Lock)

    def _write(self, stream: TextIO, text: str) -> None:
        with self._lock:
            try:
                stream.write(text)
                stream.flush()
            except (OSError, ValueError):
                pass

    def record(self, label: str | None, message: str, level: int = INFO) -> None:
        """One logging record: ``[time label] message``; continuation lines stay unprefixed."""
        if level < self.level or (self.silenced and label is not None):
            return
        stamp = timestamp(datetime.now(), ms=self.ms)
        head = f"[{stamp} {label}]" if label else f"[{stamp}]"
        self._write(self.err, f"{head} {message}\n")

    def uvicorn(self, message: str, level: int = INFO, *, access: bool = False) -> None:
        """A uvicorn record, ``[time] INFO:     message`` (access lines go to stdout)."""
        if level < self.level or (self.silenced and access):
            return
        name = {INFO: "INFO", WARNING: "WARNING", ERROR: "ERROR"}.get(level, "INFO")
        prefix = name + ":" + " " * (8 - len(name))
        stamp = timestamp(datetime.now(), ms=self.ms)
        self._write(self.out if access else self.err, f"[{stamp}] {prefix} {message}\n")

    def bar(self, text: str, *, close: bool = False) -> None:
        """One tqdm redraw (``\\r`` + bar); ``close`` ends the bar's line."""
        if self.level > INFO or self.silenced or not self.bars:
            return
        self._write(self.err, "\r" + text + ("\n" if close else ""))

    def end_bar(self) -> None:
        """End a bar's line without redrawing (the bar was interrupted by an exception)."""
        if self.level > INFO or self.silenced or not self.bars:
            return
        self._write(self.err, "\n")

    def raw(self, text: str) -> None:
        """Unformatted stderr text (Python warnings, a traceback printed by the interpreter)."""
        self._write(self.err, text)


def rank_label(*, tp_rank: int, tp_size: int, dp_rank: int, dp_size: int) -> str | None:
    """The ``DPn TPn`` part of a scheduler's prefix; None when neither dimension is in use."""
    parts = []
    if dp_size > 1:
        parts.append(f"DP{dp_rank}")
    if tp_size > 1:
        parts.append(f"TP{tp_rank}")
    return " ".join(parts) or None


# ---------------------------------------------------------------------------------------------
# tqdm


def format_interval(seconds: float) -> str:
    """tqdm's ``format_interval``: ``MM:SS`` or ``H:MM:SS``."""
    mins, secs = divmod(int(seconds), 60)
    hours, mins = divmod(mins, 60)
    return f"{hours:d}:{mins:02d}:{secs:02d}" if hours else f"{mins:02d}:{secs:02d}"


def _rate_and_remaining(n: int, total: int, elapsed: float) -> tuple[str, str]:
    rate = n / elapsed if elapsed > 0 and n > 0 else 0.0
    if not rate:
        return "?it/s", "?"
    remaining = format_interval((total - n) / rate)
    if rate < 1:
        return f"{1 / rate:5.2f}s/it", remaining
    return f"{rate:5.2f}it/s", remaining


def _bar(fraction: float, width: int = 10) -> str:
    """tqdm's unicode bar: full blocks, one partial eighth, padding."""
    charset = " ▏▎▍▌▋▊▉█"
    steps = len(charset) - 1
    full, partial = divmod(int(fraction * width * steps), steps)
    text = charset[-1] * full
    if full < width:
        text += charset[partial] + charset[0] * (width - full - 1)
    return text


def shard_bar(desc: str, n: int, total: int, elapsed: float) -> str:
    """``Loading safetensors checkpoint shards:  50% Completed | 1/2 [00:01<00:01,  1.31it/s]``"""
    rate, remaining = _rate_and_remaining(n, total, elapsed)
    pct = 100 * n / total
    return (
        f"{desc}: {pct:3.0f}% Completed | {n}/{total} "
        f"[{format_interval(elapsed)}<{remaining}, {rate}]"
    )


def progress_bar(desc: str | None, n: int, total: int, elapsed: float) -> str:
    """tqdm's default bar: ``desc:  12%|█▏        | 4/35 [00:01<00:10,  3.01it/s]``."""
    rate, remaining = _rate_and_remaining(n, total, elapsed)
    head = f"{desc}: " if desc else ""
    pct = 100 * n / total
    return (
        f"{head}{pct:3.0f}%|{_bar(n / total)}| {n}/{total} "
        f"[{format_interval(elapsed)}<{remaining}, {rate}]"
    )


# ---------------------------------------------------------------------------------------------
# Phase lines


def server_args_line(d: Dialect, items: Sequence[tuple[str, object]]) -> str:
    """The main process's args dump: a dataclass repr up to 0.5.15, a dict from 0.5.23."""
    if d.since(0, 5, 23):
        return f"server_args={dict(items)!r}"
    return "server_args=ServerArgs(" + ", ".join(f"{k}={v!r}" for k, v in items) + ")"


def gb(value: float) -> str:
    """SGLang's ``avail mem=%.2f GB`` (the unit is really GiB)."""
    return f"{value:.2f}"


def init_begin(d: Dialect) -> str:
    return "Init parallel begin." if d.since(0, 5, 23) else "Init torch distributed begin."


def init_end(d: Dialect, *, elapsed_s: float, mem_usage_gib: float) -> list[str]:
    """The line(s) closing distributed init on one rank."""
    if d.since(0, 5, 23):
        return [
            f"Init parallel ends. elapsed={elapsed_s:.2f} s",
            f"Memory baseline taken. mem usage={gb(mem_usage_gib)} GB",
        ]
    if d.since(0, 5, 10):
        return [
            f"Init torch distributed ends. elapsed={elapsed_s:.2f} s, "
            f"mem usage={gb(mem_usage_gib)} GB"
        ]
    return [f"Init torch distributed ends. mem usage={gb(mem_usage_gib)} GB"]


def weight_end(
    d: Dialect,
    *,
    elapsed_s: float,
    arch: str,
    dtype: str,
    quant: str | None,
    avail_gib: float,
    usage_gib: float,
) -> str:
    tail = f"avail mem={gb(avail_gib)} GB, mem usage={gb(usage_gib)} GB."
    q = f"quant={quant}, " if quant else ""
    if d.since(0, 5, 23):
        return f"Load weight end. elapsed={elapsed_s:.2f} s, type={arch}, {q}{tail}"
    if d.since(0, 5, 10):
        return f"Load weight end. elapsed={elapsed_s:.2f} s, type={arch}, dtype={dtype}, {q}{tail}"
    return f"Load weight end. type={arch}, dtype={dtype}, {q}{tail}"


def kv_allocated(d: Dialect, *, tokens: int, pool_gib: float, dtype: str, mla: bool = False) -> str:
    """``KV Cache is allocated. ...``: K and V sizes, or one ``KV size`` for MLA models (the
    draft's pool prints the same unlabelled line)."""
    head = (
        f"KV Cache is allocated. dtype: {dtype}, "
        if d.since(0, 5, 15)
        else "KV Cache is allocated. "
    )
    if mla:
        return f"{head}#tokens: {tokens}, KV size: {gb(pool_gib)} GB"
    half = gb(pool_gib / 2)
    if d.since(0, 5, 15):
        return (
            f"KV Cache is allocated. dtype: {dtype}, #tokens: {tokens}, "
            f"K size: {half} GB, V size: {half} GB"
        )
    return f"KV Cache is allocated. #tokens: {tokens}, K size: {half} GB, V size: {half} GB"


def mamba_allocated(
    *,
    size: int,
    conv_gib: float,
    ssm_gib: float,
    intermediate_ssm_gib: float | None = None,
    intermediate_conv_gib: float | None = None,
) -> str:
    """``Mamba Cache is allocated. ...`` (memory_pool.py; the same text in 0.5.10 and 0.5.23),
    with the speculative-decoding intermediate caches when there are any; trailing space."""
    text = (
        f"Mamba Cache is allocated. max_mamba_cache_size: {size}, "
        f"conv_state size: {conv_gib:.2f}GB, ssm_state size: {ssm_gib:.2f}GB "
    )
    if intermediate_ssm_gib is not None and intermediate_conv_gib is not None:
        text += (
            f"intermediate_ssm_state_cache size: {intermediate_ssm_gib:.2f}GB "
            f"intermediate_conv_window_cache size: {intermediate_conv_gib:.2f}GB "
        )
    return text


def prefill_graph_begin(*, tokens: Sequence[int], avail_gib: float, role: str = "target") -> str:
    """0.5.23 ``capture_prefill_graph`` (cuda_graph_setup.py l.684); ``role``: target or
    draft (EAGLE's draft worker captures its own prefill graph)."""
    return (
        f"Capture {role} prefill CUDA graph begin. backend=breakable, "
        f"num_tokens={list(tokens)}, avail mem={gb(avail_gib)} GB"
    )


def prefill_graph_end(
    *, elapsed_s: float, usage_gib: float, avail_gib: float, role: str = "target"
) -> str:
    return (
        f"Capture {role} prefill CUDA graph end. elapsed={elapsed_s:.2f} s, "
        f"mem usage={gb(usage_gib)} GB, avail mem={gb(avail_gib)} GB."
    )


def draft_graph_begin(
    d: Dialect, name: str, *, bs: Sequence[int], tokens_per_req: int, avail_gib: float
) -> str:
    """The draft's capture begin line: 0.5.23 ``eagle_worker_v2`` (rank 0 only), up to 0.5.15
    ``eagle_worker`` (every rank). ``name``: draft_decode or draft_extend."""
    if d.since(0, 5, 23):
        kind = "decode" if name == "draft_decode" else "extend"
        return (
            f"Capture draft {kind} CUDA graph begin. backend=full, "
            f"num_tokens_per_req={tokens_per_req}, bs={list(bs)}, avail mem={gb(avail_gib)} GB"
        )
    kind = "draft" if name == "draft_decode" else "draft extend"
    return (
        f"Capture {kind} cuda graph begin. This can take up to several minutes. "
        f"avail mem={gb(avail_gib)} GB"
    )


def draft_graph_end(
    d: Dialect, name: str, *, elapsed_s: float, usage_gib: float, avail_gib: float
) -> str:
    if d.since(0, 5, 23):
        kind = "decode" if name == "draft_decode" else "extend"
        return (
            f"Capture draft {kind} CUDA graph end. elapsed={elapsed_s:.2f} s, "
            f"mem usage={gb(usage_gib)} GB, avail mem={gb(avail_gib)} GB."
        )
    kind = "draft" if name == "draft_decode" else "draft extend"
    return (
        f"Capture {kind} cuda graph end. Time elapsed: {elapsed_s:.2f} s. "
        f"mem usage={gb(usage_gib)} GB. avail mem={gb(avail_gib)} GB."
    )


def graph_begin(
    d: Dialect,
    *,
    bs: Sequence[int],
    avail_gib: float,
    tokens_per_req: int = 1,
    verify: bool = False,
) -> list[str]:
    """The target decode graph's begin line(s); ``verify``: the target verify graph of
    speculative decoding (0.5.23 names it; 0.5.10 prints the plain decode lines)."""
    kind = "verify" if verify else "decode"
    if d.since(0, 5, 23):
        return [
            f"Capture target {kind} CUDA graph begin. backend=full, "
            f"num_tokens_per_req={tokens_per_req}, avail mem={gb(avail_gib)} GB"
        ]
    if d.since(0, 5, 15):
        return [
            f"Capture target {kind} CUDA graph begin. backend=full, "
            f"num_tokens_per_bs={tokens_per_req}, bs={list(bs)}, avail mem={gb(avail_gib)} GB"
        ]
    return [
        "Capture cuda graph begin. This can take up to several minutes. "
        f"avail mem={gb(avail_gib)} GB",
        f"Capture cuda graph bs {list(bs)}",
    ]


def graph_end(
    d: Dialect,
    *,
    bs: Sequence[int],
    elapsed_s: float,
    usage_gib: float,
    avail_gib: float,
    verify: bool = False,
) -> str:
    if d.since(0, 5, 15):
        kind = "verify" if verify else "decode"
        return (
            f"Capture target {kind} CUDA graph end. bs={list(bs)}, elapsed={elapsed_s:.2f} s, "
            f"mem usage={gb(usage_gib)} GB, avail mem={gb(avail_gib)} GB."
        )
    return (
        f"Capture cuda graph end. Time elapsed: {elapsed_s:.2f} s. "
        f"mem usage={gb(usage_gib)} GB. avail mem={gb(avail_gib)} GB."
    )


def summary(
    *,
    max_total_num_tokens: int,
    chunked_prefill_size: int,
    max_prefill_tokens: int,
    max_running_requests: int,
    context_len: int,
    available_gib: float,
) -> str:
    return (
        f"max_total_num_tokens={max_total_num_tokens}, "
        f"chunked_prefill_size={chunked_prefill_size}, "
        f"max_prefill_tokens={max_prefill_tokens}, max_running_requests={max_running_requests}, "
        f"context_len={context_len}, available_gpu_mem={gb(available_gib)} GB"
    )


def prefill_batch(d: Dialect, *, new_tokens: int) -> str:
    return (
        f"Prefill batch{d.prefill_sep} #new-seq: 1, #new-token: {new_tokens}, #cached-token: 0, "
        "token usage: 0.00, #running-req: 0, #queue-req: 0, "
    )


LAUNCH_WARNING = (
    f"{SGLANG_DIR}/launch_server.py:36: UserWarning: 'python -m sglang.launch_server' is still "
    "supported, but 'sglang serve' is the recommended entrypoint.\n  warnings.warn(\n"
)
READY = "The server is fired up and ready to roll!"
SIGQUIT_BEFORE_SERVING = "Received sigquit from a child process. It usually means the child failed."
FAKE_FRAME = (
    f"<frame at 0x7f2c1d5e9a40, file '{SGLANG_DIR}/srt/entrypoints/http_server.py', "
    "line 1790, code launch_server>"
)


def sigquit_while_serving() -> str:
    return f"SIGQUIT received. signum=3, frame={FAKE_FRAME}. It usually means one child failed."


def sigterm_received() -> str:
    return f"SIGTERM received. signum=15 frame={FAKE_FRAME}. Draining requests and shutting down..."


def kill_process_tree_line(pid: int) -> str:
    return f"kill_process_tree called: parent_pid={pid}, include_parent=True, pid={pid}"


def bind_error(host: str, port: int, errno: int, strerror: str) -> str:
    """uvicorn's bind failure, e.g. ``[Errno 98] error while attempting to bind on address
    ('127.0.0.1', 30000): address already in use``."""
    return f"[Errno {errno}] error while attempting to bind on address {(host, port)!r}: " + (
        strerror.lower()
    )


# ---------------------------------------------------------------------------------------------
# Error messages


def format_size(gib: float) -> str:
    """torch's ``format_size`` of a size given in GiB (``N bytes``, ``x.xx KiB/MiB/GiB``)."""
    size = max(0, round(gib * 2**30))
    if size <= 1024:
        return f"{size} bytes"
    if size <= 1048576:
        return f"{size / 1024:.2f} KiB"
    if size <= 1073741824:
        return f"{size / 1048576:.2f} MiB"
    return f"{size / 1073741824:.2f} GiB"


def cuda_oom(
    *,
    tried_gib: float,
    gpu: int,
    total_gib: float,
    free_gib: float,
    others: Sequence[tuple[int, float]],
    this_process_gib: float,
    allocated_gib: float,
    private_pools_gib: float,
) -> str:
    """torch's ``CUDA out of memory. Tried to allocate ...`` message (the text after
    ``torch.OutOfMemoryError: ``). ``others`` are (pid, GiB) of other processes on that GPU."""
    procs = "".join(f"Process {pid} has {format_size(g)} memory in use. " for pid, g in others)
    pools = (
        f"with {format_size(private_pools_gib)} allocated in private pools (e.g., CUDA Graphs), "
        if private_pools_gib > 0
        else ""
    )
    return (
        f"CUDA out of memory. Tried to allocate {format_size(tried_gib)}. GPU {gpu} has a total "
        f"capacity of {format_size(total_gib)} of which {format_size(free_gib)} is free. {procs}"
        f"Including non-PyTorch memory, this process has {format_size(this_process_gib)} memory "
        f"in use. Of the allocated memory {format_size(allocated_gib)} is allocated by PyTorch, "
        f"{pools}and {format_size(0)} is reserved by PyTorch but unallocated. If reserved but "
        "unallocated memory is large try setting PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True "
        "to avoid fragmentation.  See documentation for Memory Management  "
        "(https://pytorch.org/docs/stable/notes/cuda.html#environment-variables)"
    )


def capture_failed(d: Dialect, error: str) -> str:
    """``Capture cuda graph failed: {e}`` plus the version's "Possible solutions"."""
    if d.since(0, 5, 15):
        items = (
            "1. set --mem-fraction-static to a smaller value (e.g., 0.8 or 0.7)\n"
            "2. set --cuda-graph-max-bs-decode to a smaller value (e.g., 16)\n"
            "3. disable decode CUDA graph by --cuda-graph-backend-decode=disabled. "
            "(Not recommended. Huge performance loss)\n"
        )
    else:
        items = (
            "1. set --mem-fraction-static to a smaller value (e.g., 0.8 or 0.7)\n"
            "2. set --cuda-graph-max-bs to a smaller value (e.g., 16)\n"
            "3. disable torch compile by not using --enable-torch-compile\n"
            "4. disable CUDA graph by --disable-cuda-graph. (Not recommended. Huge performance "
            "loss)\n"
        )
    return (
        f"Capture cuda graph failed: {error}\nPossible solutions:\n{items}"
        "Open an issue on GitHub https://github.com/sgl-project/sglang/issues/new/choose "
    )


def not_enough_memory(d: Dialect, mfs: float) -> str:
    """The "Not enough memory" RuntimeError message (without the type)."""
    var = "mem_fraction_static" if d.since(0, 5, 15) else "self.server_args.mem_fraction_static"
    return (
        "Not enough memory. Please try to increase --mem-fraction-static. "
        f"Current value: {var}={mfs!r}"
    )


def weights_leave_no_kv(mfs: float, minimum: float) -> str:
    """0.5.23's ValueError message for a KV pool <= 0 (without the type)."""
    ceil3 = math.ceil(minimum * 1000) / 1000
    return (
        f"Loaded weights leave no GPU memory for the KV cache under --mem-fraction-static={mfs!r}. "
        f"Raise --mem-fraction-static above {ceil3:.3f} (minimum viable = 1 - available/pre = "
        f"{minimum:.4f}). If using speculative decoding, draft weights are now counted."
    )


MAX_RUNNING_RESET = (
    "Max running requests is reset to 48 for speculative decoding. You can override this by "
    "explicitly setting --max-running-requests."
)
DRAFT_TOKENS_ADJUSTED = (
    "speculative_num_draft_tokens is adjusted to speculative_num_steps + 1 when "
    "speculative_eagle_topk == 1"
)
OVERLAP_DISABLED_SPEC_V1 = (
    "Overlap scheduler is disabled when spec v2 is off or using unsupported speculative "
    "algorithm. You can set env SGLANG_ENABLE_SPEC_V2=True to enable the experimental overlap "
    "scheduler. "
)
SPEC_V2_ON = (
    "Spec v2 is enabled for eagle/eagle3 speculative decoding and overlap schedule is turned on."
)


def spec_no_buffer_error(arch: str) -> str:
    """0.5.10 ``_handle_mamba_radix_cache`` (server_args.py l.2207): two f-strings joined with no
    space after ``no_buffer.``."""
    return (
        f"ValueError: Speculative decoding for {arch} is not compatible with radix cache when "
        "using --mamba-scheduler-strategy no_buffer.To use radix cache with speculative "
        "decoding, please use --mamba-scheduler-strategy extra_buffer and set "
        "SGLANG_ENABLE_SPEC_V2=1."
    )


NO_BUFFER_OVERLAP = (
    "AssertionError: no_buffer do not support overlap schedule. Try to set "
    "disable_overlap_schedule=True."
)


def hybrid_state_memory_error(*, size: int, rest_gib: float, per_req_mib: float) -> str:
    """0.5.23 kv_cache_configurator.py l.3394."""
    return (
        "RuntimeError: Not enough GPU memory for hybrid (mamba/linear-attention) state cache. "
        f"Computed max_mamba_cache_size={size} (total_rest_memory={rest_gib:.2f} GB, "
        f"mamba_cache_per_req={per_req_mib:.2f} MB). Try: (1) reduce --max-running-requests, "
        "(2) increase --mem-fraction-static, (3) reduce --speculative-num-draft-tokens, or "
        "(4) use GPUs with more memory."
    )


def hybrid_too_small_error(*, size: int, ratio: int, reqs: int) -> str:
    """0.5.23 kv_cache_configurator.py l.3154."""
    return (
        "RuntimeError: Hybrid (mamba/linear-attention) state cache is too small to serve any "
        f"requests. max_mamba_cache_size={size}, mamba_ratio={ratio}, resulting "
        f"max_num_reqs={reqs}. Try: (1) reduce --max-running-requests, (2) increase "
        "--mem-fraction-static, or (3) use GPUs with more memory."
    )


def mamba_capped_warning(*, cap: int, size: int, ratio: int) -> str:
    """0.5.23 kv_cache_configurator.py l.3141."""
    return (
        f"max_running_requests is capped to {cap} by the mamba state cache "
        f"(max_mamba_cache_size={size}, {ratio} state slots per request). To raise it: increase "
        "--mamba-full-memory-ratio or --max-mamba-cache-size, or halve the state size with "
        "--mamba-ssm-dtype bfloat16."
    )


NCCL_ERROR = (
    "torch.distributed.DistBackendError: NCCL error in: "
    "/pytorch/torch/csrc/distributed/c10d/ProcessGroupNCCL.cpp:3356, unhandled system error "
    f"(run with NCCL_DEBUG=INFO for details), NCCL version {NCCL_VERSION}\n"
    "ncclSystemError: System call (e.g. socket, malloc) or external library call failed or "
    "device error. \nLast error:\n"
    "socketStartConnect: Connect to 127.0.0.1<45931> failed : Software caused connection abort"
)
CUDA_ILLEGAL_ACCESS = (
    "torch.AcceleratorError: CUDA error: an illegal memory access was encountered\n"
    "CUDA kernel errors might be asynchronously reported at some other API call, so the "
    "stacktrace below might be incorrect.\n"
    "For debugging consider passing CUDA_LAUNCH_BLOCKING=1\n"
    "Compile with `TORCH_USE_CUDA_DSA` to enable device-side assertions.\n"
)
INVALID_DEVICE = (
    "torch.AcceleratorError: CUDA error: invalid device ordinal\n"
    "GPU device may be out of range, do you have enough GPUs?\n"
    "CUDA kernel errors might be asynchronously reported at some other API call, so the "
    "stacktrace below might be incorrect.\n"
    "For debugging consider passing CUDA_LAUNCH_BLOCKING=1\n"
    "Compile with `TORCH_USE_CUDA_DSA` to enable device-side assertions.\n"
)


# ---------------------------------------------------------------------------------------------
# Tracebacks

Frame = tuple[str, int, str, str]  # (file, line, function, source line)


def _sg(path: str) -> str:
    return f"{SGLANG_DIR}/{path}"


def traceback_text(frames: Sequence[Frame], final: str) -> str:
    """A Python traceback: header, frames, then ``final`` (``Type: message``)."""
    lines = ["Traceback (most recent call last):"]
    for file, line, func, code in frames:
        lines.append(f'  File "{file}", line {line}, in {func}')
        lines.append(f"    {code}")
    return "\n".join(lines) + "\n" + final


def chained(inner: str, outer: str, *, cause: bool = False) -> str:
    """Two tracebacks joined the way Python prints an exception raised while handling another
    (``cause``: ``raise ... from``)."""
    glue = (
        "The above exception was the direct cause of the following exception:"
        if cause
        else "During handling of the above exception, another exception occurred:"
    )
    return f"{inner.rstrip()}\n\n{glue}\n\n{outer}"


def _scheduler_head(d: Dialect) -> list[Frame]:
    line = 6372 if d.since(0, 5, 23) else 2714
    return [
        (_sg("srt/managers/scheduler.py"), line, "run_scheduler_process", "scheduler = Scheduler("),
        (_sg("srt/managers/scheduler.py"), 312, "__init__", "self.init_model_worker()"),
        (
            _sg("srt/managers/scheduler.py"),
            459,
            "init_model_worker",
            "self.tp_worker = TpModelWorker(",
        ),
        (_sg("srt/managers/tp_worker.py"), 237, "__init__", "self._model_runner = ModelRunner("),
    ]


def _initialize_head(d: Dialect) -> list[Frame]:
    """Down to ``ModelRunner.initialize`` (weights, KV pool, graphs)."""
    runner = _sg("srt/model_executor/model_runner.py")
    return [*_scheduler_head(d), (runner, 322, "__init__", "self.initialize(min_per_gpu_memory)")]


def init_frames(d: Dialect) -> list[Frame]:
    """Frames of an error raised during distributed init (NCCL barrier)."""
    return [
        *_scheduler_head(d),
        (
            _sg("srt/model_executor/model_runner.py"),
            318,
            "__init__",
            "min_per_gpu_memory = self.init_torch_distributed()",
        ),
        (
            _sg("srt/model_executor/model_runner.py"),
            680,
            "init_torch_distributed",
            "initialize_model_parallel(",
        ),
        (
            _sg("srt/distributed/parallel_state.py"),
            1456,
            "initialize_model_parallel",
            "_TP = init_model_parallel_group(",
        ),
        (f"{TORCH_DIR}/distributed/c10d_logger.py", 81, "wrapper", "return func(*args, **kwargs)"),
        (
            f"{TORCH_DIR}/distributed/distributed_c10d.py",
            4735,
            "barrier",
            "work = group.barrier(opts=opts)",
        ),
    ]


def device_frames(d: Dialect) -> list[Frame]:
    """Frames of an error raised when a scheduler selects its GPU."""
    return [
        *_scheduler_head(d),
        (
            _sg("srt/model_executor/model_runner.py"),
            318,
            "__init__",
            "min_per_gpu_memory = self.init_torch_distributed()",
        ),
        (
            _sg("srt/model_executor/model_runner.py"),
            640,
            "init_torch_distributed",
            "torch.get_device_module(self.device).set_device(self.gpu_id)",
        ),
        (f"{TORCH_DIR}/cuda/__init__.py", 567, "set_device", "torch._C._cuda_setDevice(device)"),
    ]


def weights_frames(d: Dialect) -> list[Frame]:
    """Frames of an OOM while copying a checkpoint shard to the GPU."""
    return [
        *_initialize_head(d),
        (_sg("srt/model_executor/model_runner.py"), 401, "initialize", "self.load_model()"),
        (_sg("srt/model_executor/model_runner.py"), 790, "load_model", "self.model = get_model("),
        (_sg("srt/model_loader/__init__.py"), 28, "get_model", "return loader.load_model("),
        (
            _sg("srt/model_loader/loader.py"),
            594,
            "load_model",
            "self.load_weights_and_postprocess(",
        ),
        (
            _sg("srt/model_loader/loader.py"),
            602,
            "load_weights_and_postprocess",
            "model.load_weights(weights)",
        ),
        (_sg("srt/models/llama.py"), 705, "load_weights", "weight_loader(param, loaded_weight)"),
        (
            _sg("srt/model_loader/weight_utils.py"),
            987,
            "default_weight_loader",
            "param.data.copy_(loaded_weight)",
        ),
    ]


def kv_frames(d: Dialect, *, value_error: bool) -> list[Frame]:
    """Frames of the KV-pool sizing errors."""
    head = [
        *_initialize_head(d),
        (_sg("srt/model_executor/model_runner.py"), 450, "initialize", "self.init_memory_pool("),
    ]
    if not d.since(0, 5, 23):
        return [
            *head,
            (
                _sg("srt/model_executor/model_runner.py"),
                1746,
                "init_memory_pool",
                "raise RuntimeError(",
            ),
        ]
    if value_error:
        return [
            *head,
            (
                _sg("srt/mem_cache/kv_cache_configurator.py"),
                3047,
                "_profile_available_bytes",
                "raise ValueError(",
            ),
        ]
    return [
        *head,
        (_sg("srt/model_executor/pool_configurator.py"), 96, "configure", "raise RuntimeError("),
    ]


def capture_inner_frames(d: Dialect) -> list[Frame]:
    """Frames of an error inside one decode-graph capture (the wrapped exception)."""
    runner = (
        "srt/model_executor/runner/decode_cuda_graph_runner.py"
        if d.since(0, 5, 23)
        else "srt/model_executor/cuda_graph_runner.py"
    )
    return [
        (_sg(runner), 380, "__init__", "self.capture()"),
        (_sg(runner), 498, "capture", ") = self.capture_one_batch_size(bs, forward)"),
        (_sg(runner), 660, "capture_one_batch_size", "run_once()"),
        (_sg(runner), 647, "run_once", "logits_output_or_pp_proxy_tensors = forward("),
        (
            f"{TORCH_DIR}/utils/_contextlib.py",
            120,
            "decorate_context",
            "return func(*args, **kwargs)",
        ),
        (_sg("srt/models/llama.py"), 468, "forward", "hidden_states = self.model("),
    ]


def capture_outer_frames(d: Dialect) -> list[Frame]:
    """Frames of the ``Exception: Capture cuda graph failed`` raised around a capture."""
    runner = (
        "srt/model_executor/runner/decode_cuda_graph_runner.py"
        if d.since(0, 5, 23)
        else "srt/model_executor/cuda_graph_runner.py"
    )
    return [
        *_initialize_head(d),
        (_sg("srt/model_executor/model_runner.py"), 460, "initialize", "self.init_device_graphs()"),
        (
            _sg("srt/model_executor/model_runner.py"),
            2449,
            "init_device_graphs",
            "self.graph_runner = graph_runners[self.device](self)",
        ),
        (_sg(runner), 382, "__init__", "raise Exception("),
    ]


def draft_capture_inner_frames(d: Dialect, name: str) -> list[Frame]:
    """Frames of an error inside one draft-graph capture (the wrapped exception)."""
    extend = name == "draft_extend"
    if extend:
        runner = "srt/speculative/eagle_draft_extend_cuda_graph_runner.py"
        lines = (303, 305) if d.since(0, 5, 23) else (218, 220)
    else:
        runner = "srt/speculative/eagle_draft_cuda_graph_runner.py"
        lines = (294, 296) if d.since(0, 5, 23) else (164, 166)
    return [
        (_sg(runner), lines[0], "__init__", "self.capture()"),
        (
            _sg(
                "srt/model_executor/cuda_graph_runner.py"
                if not d.since(0, 5, 23)
                else "srt/model_executor/runner/base_cuda_graph_runner.py"
            ),
            498,
            "capture",
            ") = self.capture_one_batch_size(bs, forward)",
        ),
        (_sg(runner), 380, "capture_one_batch_size", "run_once()"),
        (
            f"{TORCH_DIR}/utils/_contextlib.py",
            120,
            "decorate_context",
            "return func(*args, **kwargs)",
        ),
    ]


def draft_capture_outer_frames(d: Dialect, name: str) -> list[Frame]:
    """Frames of the ``Exception: Capture cuda graph failed`` raised by a draft runner."""
    extend = name == "draft_extend"
    head = [
        *_scheduler_head(d)[:2],
        (
            _sg("srt/managers/scheduler.py"),
            1035 if d.since(0, 5, 23) else 520,
            "maybe_init_draft_worker" if d.since(0, 5, 23) else "init_model_worker",
            "self.draft_worker = DraftWorkerClass(",
        ),
    ]
    if d.since(0, 5, 23):
        worker = _sg("srt/speculative/eagle_worker_v2.py")
        call = (
            (
                worker,
                638,
                "_capture_cuda_graphs",
                "self.cuda_graph_runner_for_draft_extend = extend_runner_cls(self)",
            )
            if extend
            else (
                worker,
                519,
                "_capture_cuda_graphs",
                "self.cuda_graph_runner = draft_runner_cls(self)",
            )
        )
        runner = (
            "srt/speculative/eagle_draft_extend_cuda_graph_runner.py"
            if extend
            else "srt/speculative/eagle_draft_cuda_graph_runner.py"
        )
        line = 305 if extend else 296
    else:
        worker = _sg("srt/speculative/eagle_worker.py")
        call = (
            (
                worker,
                266,
                "init_cuda_graphs",
                "self.cuda_graph_runner_for_draft_extend = EAGLEDraftExtendCudaGraphRunner(",
            )
            if extend
            else (
                worker,
                252,
                "init_cuda_graphs",
                "self.cuda_graph_runner = Device2DraftCudaGraphRunner[",
            )
        )
        runner = (
            "srt/speculative/eagle_draft_extend_cuda_graph_runner.py"
            if extend
            else "srt/speculative/eagle_draft_cuda_graph_runner.py"
        )
        line = 220 if extend else 166
    return [*head, call, (_sg(runner), line, "__init__", "raise Exception(")]


def server_args_error(
    d: Dialect, final: str, *, func: str, line: int, code: str, via: tuple[int, str]
) -> str:
    """An error ``ServerArgs.__post_init__`` raises in the main process (exit 1); ``via``: the
    (line, source) of the ``__post_init__`` call that leads to ``func``."""
    args = _sg("srt/server_args.py")
    return (
        traceback_text(
            [
                ("<frozen runpy>", 198, "_run_module_as_main", ""),
                ("<frozen runpy>", 88, "_run_code", ""),
                (
                    _sg("launch_server.py"),
                    24,
                    "<module>",
                    "server_args = prepare_server_args(sys.argv[1:])",
                ),
                (args, 4012, "prepare_server_args", "return ServerArgs.from_cli_args(raw_args)"),
                (
                    args,
                    3650,
                    "from_cli_args",
                    "return cls(**{attr: getattr(args, attr) for attr in attrs})",
                ),
                ("<string>", 335, "__init__", ""),
                (args, via[0], "__post_init__", via[1]),
                *(
                    [
                        (
                            args,
                            2001,
                            "_handle_model_specific_adjustments",
                            "self._handle_mamba_radix_cache(",
                        )
                    ]
                    if func == "_handle_mamba_radix_cache"
                    else []
                ),
                (args, line, func, code),
            ],
            final,
        )
        + "\n"
    )


def runtime_frames(d: Dialect) -> list[Frame]:
    """Frames of an error in the scheduler's event loop (serving a batch)."""
    line = 6378 if d.since(0, 5, 23) else 2720
    return [
        (
            _sg("srt/managers/scheduler.py"),
            line,
            "run_scheduler_process",
            "scheduler.event_loop_overlap()",
        ),
        (
            f"{TORCH_DIR}/utils/_contextlib.py",
            120,
            "decorate_context",
            "return func(*args, **kwargs)",
        ),
        (
            _sg("srt/managers/scheduler.py"),
            1020,
            "event_loop_overlap",
            "batch_result = self.run_batch(batch)",
        ),
        (
            _sg("srt/managers/scheduler.py"),
            1890,
            "run_batch",
            "batch_result = self.model_worker.forward_batch_generation(",
        ),
        (
            _sg("srt/managers/tp_worker.py"),
            310,
            "forward_batch_generation",
            "logits_output, can_run_cuda_graph = self.model_runner.forward(",
        ),
        (_sg("srt/model_executor/model_runner.py"), 2180, "forward", "output = self._forward_raw("),
        (
            _sg("srt/model_executor/model_runner.py"),
            2110,
            "forward_extend",
            "return self.model.forward(",
        ),
        (_sg("srt/models/llama.py"), 468, "forward", "hidden_states = self.model("),
    ]


def hf_repo_id_error(path: str) -> str:
    """The traceback of transformers' AutoConfig on a missing absolute/relative path."""
    outer = traceback_text(
        [
            ("<frozen runpy>", 198, "_run_module_as_main", ""),
            ("<frozen runpy>", 88, "_run_code", ""),
            (
                _sg("launch_server.py"),
                24,
                "<module>",
                "server_args = prepare_server_args(sys.argv[1:])",
            ),
            (
                _sg("srt/server_args.py"),
                4012,
                "prepare_server_args",
                "return ServerArgs.from_cli_args(raw_args)",
            ),
            (
                _sg("srt/utils/hf_transformers_utils.py"),
                245,
                "get_config",
                "config = AutoConfig.from_pretrained(",
            ),
            (
                "/usr/local/lib/python3.12/dist-packages/transformers/configuration_utils.py",
                721,
                "_get_config_dict",
                "resolved_config_file = cached_file(",
            ),
            (
                "/usr/local/lib/python3.12/dist-packages/transformers/utils/hub.py",
                491,
                "cached_files",
                'raise OSError(f"{e}") from e',
            ),
        ],
        f"OSError: Repo id must be in the form 'repo_name' or 'namespace/repo_name': '{path}'. "
        "Use `repo_type` argument if needed.",
    )
    return "\n".join(line for line in outer.splitlines() if line.strip()) + "\n"


def hf_offline_error() -> str:
    """The traceback of transformers' AutoConfig on a Hub id that is not in the HF cache while
    the Hub cannot be reached (or HF_HUB_OFFLINE is set: the same text). The message is
    transformers' own (``utils/hub.py`` ``cached_files``; transformers 5.24.0 prints it
    verbatim for ``AutoConfig.from_pretrained`` of an uncached repo, online without a network
    and offline alike); it does not name the repo."""
    return (
        traceback_text(
            [
                (
                    _sg("launch_server.py"),
                    24,
                    "<module>",
                    "server_args = prepare_server_args(sys.argv[1:])",
                ),
                (
                    _sg("srt/utils/hf_transformers_utils.py"),
                    245,
                    "get_config",
                    "config = AutoConfig.from_pretrained(",
                ),
                (
                    "/usr/local/lib/python3.12/dist-packages/transformers/utils/hub.py",
                    533,
                    "cached_files",
                    "raise OSError(",
                ),
            ],
            "OSError: We couldn't connect to 'https://huggingface.co' to load the files, and "
            "couldn't find them in the cached files.\nCheck your internet connection or see "
            "how to run the library in offline mode at "
            "'https://huggingface.co/docs/transformers/installation#offline-mode'.",
        )
        + "\n"
    )


# huggingface_hub's snapshot_download (``_snapshot_download.py``) on a repo neither on the Hub
# nor in the cache: with HF_HUB_OFFLINE set, and when the Hub cannot be reached (here: no name
# resolution, huggingface_hub 2.4.0's text).
SNAPSHOT_OFFLINE = (
    "huggingface_hub.errors.LocalEntryNotFoundError: Cannot find an appropriate cached snapshot "
    "folder for the specified revision on the local disk and outgoing traffic has been "
    "disabled. To enable repo look-ups and downloads online, set 'HF_HUB_OFFLINE=0' as "
    "environment variable."
)
SNAPSHOT_UNREACHABLE = (
    "huggingface_hub.errors.LocalEntryNotFoundError: Got: ConnectError: [Errno -2] Name or "
    "service not known\nAn error happened while trying to locate the files on the Hub, and we "
    "cannot find the appropriate snapshot folder for the specified revision on the local disk. "
    "Please check your internet connection and try again."
)


def config_error(final: str) -> str:
    """A config-time error raised in the main process before any GPU work."""
    return (
        traceback_text(
            [
                (
                    _sg("launch_server.py"),
                    24,
                    "<module>",
                    "server_args = prepare_server_args(sys.argv[1:])",
                ),
                (
                    _sg("srt/server_args.py"),
                    4012,
                    "prepare_server_args",
                    "return ServerArgs.from_cli_args(raw_args)",
                ),
                (
                    _sg("srt/configs/model_config.py"),
                    112,
                    "__init__",
                    "self.hf_config = get_config(",
                ),
            ],
            final,
        )
        + "\n"
    )


def no_accelerator_error() -> str:
    return config_error("RuntimeError: No accelerator (CUDA, XPU, HPU, NPU) is available.")
