"""Pure GPU memory model of SGLang's start-up: the physics of the simulator.

It follows SGLang's own arithmetic (see shared/sglang-reference.md §3-4):

- ``pre`` = free memory on the busiest GPU after CUDA/NCCL init, before weights
  ("Load weight begin. avail mem=pre"). SGLang takes the minimum over ranks.
- Weights load shard by shard; each rank holds ``weights / tp``. Not fitting is an OOM
  during weight load, which no mem-fraction can fix.
- KV pool = free after weights - pre x (1 - mem_fraction_static). A pool <= 0 is SGLang's
  "Not enough memory. Please try to increase --mem-fraction-static"; so is a pool below the
  scenario's minimum token count.
- What is left after the pool is exactly ``pre x (1 - mfs)``: CUDA graphs and warmup
  activations must fit in it. Graphs are captured largest batch size first: the first capture
  allocates the activation pool for ``max_bs``, every captured graph adds a small overhead.
- Warmup needs ``warmup_gib`` of transient activations after capture.

A setting (mfs, bs) is therefore feasible iff ``low < mfs <= high(bs)`` where
``low = (w + min_kv)/pre`` and ``high(bs) = 1 - (graph(bs) + warmup)/pre``.
Everything here is pure and deterministic; the simulator prints these numbers and the
benchmarks/property tests use the same functions as ground truth.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

from launcher.outcome import Outcome
from launcher.params import LaunchParams
from launcher.phases import Phase


def version_tuple(version: str) -> tuple[int, ...]:
    """'0.5.23' -> (0, 5, 23); '0.5.6.post2' -> (0, 5, 6)."""
    parts: list[int] = []
    for piece in version.split("."):
        if not piece.isdigit():
            break
        parts.append(int(piece))
    return tuple(parts)


def _new_table(version: str) -> bool:
    return version_tuple(version) >= (0, 5, 15)


def auto_chunked_prefill_size(gpu_mem_gib: float, version: str) -> int:
    """SGLang's auto ``--chunked-prefill-size`` for a GPU of this size."""
    if gpu_mem_gib < 20:
        return 2048
    if gpu_mem_gib < 35:
        return 4096 if _new_table(version) else 2048
    if gpu_mem_gib < 60:
        return 4096
    if gpu_mem_gib < 160:
        return 8192
    return 16384


def auto_cuda_graph_max_bs(gpu_mem_gib: float, tp: int, version: str) -> int:
    """SGLang's auto decode CUDA-graph max batch size (server_args auto defaults)."""
    big_tp = tp >= 4
    if gpu_mem_gib < 20:
        return 8
    if gpu_mem_gib < 35:
        if _new_table(version):
            return 160 if big_tp else 48
        return 80 if big_tp else 24
    if gpu_mem_gib < 60:
        return 160 if big_tp else 32
    if gpu_mem_gib < 160:
        return 512 if big_tp else 256
    return 512


def auto_mem_fraction_static(gpu_mem_gib: float, tp: int, version: str, max_bs: int) -> float:
    """SGLang's auto ``--mem-fraction-static``: (gpu_mem - reserved) / gpu_mem, rounded to 3."""
    gpu_mem_mib = gpu_mem_gib * 1024
    chunk = auto_chunked_prefill_size(gpu_mem_gib, version)
    reserved = 512 + max(chunk, 2048) * 1.5 + max_bs * 2 + tp / 8 * 1024
    if gpu_mem_gib > 60:
        reserved = max(reserved, 10240)
    if _new_table(version):
        reserved += 400  # prefill CUDA graphs (len(prefill_graph_bs) x 8 MiB, about 50 sizes)
    return round((gpu_mem_mib - reserved) / gpu_mem_mib, 3)


def capture_bs_list(max_bs: int) -> list[int]:
    """Decode batch sizes SGLang captures for ``max_bs``, ascending (captured in reverse)."""
    sizes = [1, 2, 4, 8, 12, *range(16, 257, 8), *range(272, 512, 16), *range(512, max_bs + 1, 32)]
    out = sorted({b for b in sizes if b <= max_bs})
    if not out or out[-1] != max_bs:
        out.append(max_bs)  # SGLang always captures max_bs itself
    return out


@dataclass(frozen=True)
class MemoryScenario:
    """One server on one kind of GPU. All sizes GiB; per-rank unless said otherwise."""

    gpu_total_gib: float  # capacity of each GPU
    weights_gib: float  # the whole model; each TP rank holds weights_gib / tp
    tp: int = 1
    other_used_gib: float = 0.0  # held by other processes on the busiest GPU of the server
    context_gib: float = 1.0  # CUDA context + NCCL buffers before weight load
    kv_gib_per_1k_tokens: float = 0.1
    min_kv_tokens: int = 0  # below this many tokens SGLang refuses ("pool too small")
    graph_gib_per_bs: float = 0.02  # activations of the largest decode graph, per unit of bs
    graph_overhead_gib: float = 0.01  # per captured graph
    warmup_gib: float = 0.5  # transient activations of the warmup prefill
    shard_gib: float = 4.6  # checkpoint shard size (whole model)
    sglang_version: str = "0.5.23"

    @property
    def pre_load_free_gib(self) -> float:
        return self.gpu_total_gib - self.other_used_gib - self.context_gib

    @property
    def weights_per_rank_gib(self) -> float:
        return self.weights_gib / self.tp

    def resolve(self, params: LaunchParams) -> tuple[float, int]:
        """The (mem_fraction_static, cuda_graph_max_bs) SGLang would run with."""
        bs = params.cuda_graph_max_bs
        if bs is None:
            bs = auto_cuda_graph_max_bs(self.gpu_total_gib, self.tp, self.sglang_version)
        mfs = params.mem_fraction_static
        if mfs is None:
            mfs = auto_mem_fraction_static(self.gpu_total_gib, self.tp, self.sglang_version, bs)
        return mfs, bs

    def graph_allocations(self, max_bs: int) -> list[tuple[int, float]]:
        """(bs, GiB allocated) per capture step, in capture order (largest bs first)."""
        steps = list(reversed(capture_bs_list(max_bs)))
        first = self.graph_gib_per_bs * max_bs
        over = self.graph_overhead_gib
        return [(b, (first if i == 0 else 0.0) + over) for i, b in enumerate(steps)]

    def graph_total_gib(self, max_bs: int) -> float:
        return sum(a for _, a in self.graph_allocations(max_bs))

    def min_kv_gib(self) -> float:
        return self.min_kv_tokens / 1000 * self.kv_gib_per_1k_tokens

    def feasible_range(self, max_bs: int) -> tuple[float, float] | None:
        """(low, high): feasible fractions are low < mfs <= high. None when weights don't fit."""
        pre = self.pre_load_free_gib
        w = self.weights_per_rank_gib
        if pre <= 0 or self.weights_fail():
            return None
        low = (w + self.min_kv_gib()) / pre
        high = 1 - (self.graph_total_gib(max_bs) + self.warmup_gib) / pre
        return (low, high) if high > low else None

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
    step: int | None = None  # index of the failing shard or capture step


@dataclass(frozen=True)
class StartupTrace:
    """The memory figures of one simulated start-up, as SGLang would log them."""

    mem_fraction_static: float
    cuda_graph_max_bs: int
    pre_load_free_gib: float
    shards: list[tuple[float, float]] = field(default_factory=list)
    post_weights_free_gib: float | None = None
    kv_pool_gib: float | None = None
    kv_tokens: int | None = None
    pool_end_free_gib: float | None = None
    graph_steps: list[tuple[int, float]] = field(default_factory=list)  # (bs, free before)
    graph_end_free_gib: float | None = None
    graph_mem_gib: float | None = None
    failure: Failure | None = None

    @property
    def ok(self) -> bool:
        return self.failure is None


def simulate(s: MemoryScenario, params: LaunchParams) -> StartupTrace:
    """Run SGLang's start-up arithmetic for ``params``; stop at the first failure."""
    mfs, bs = s.resolve(params)
    pre = s.pre_load_free_gib
    base = {"mem_fraction_static": mfs, "cuda_graph_max_bs": bs, "pre_load_free_gib": pre}
    if pre <= 0:
        fail = Failure(Outcome.OOM_WEIGHTS, Phase.INIT, s.context_gib, s.context_gib + pre)
        return StartupTrace(**base, failure=fail)  # type: ignore[arg-type]

    shards: list[tuple[float, float]] = []
    free = pre
    for i, (alloc, after) in enumerate(s.shard_allocations()):
        if alloc > free:
            fail = Failure(Outcome.OOM_WEIGHTS, Phase.WEIGHTS, alloc, free, step=i)
            return StartupTrace(**base, shards=shards, failure=fail)  # type: ignore[arg-type]
        shards.append((alloc, after))
        free = after

    post_w = free
    kv = post_w - pre * (1 - mfs)
    tokens = int(kv / s.kv_gib_per_1k_tokens * 1000) if kv > 0 else 0
    partial = {**base, "shards": shards, "post_weights_free_gib": post_w}
    if kv <= 0 or tokens < s.min_kv_tokens:
        need = 1 - (post_w - s.min_kv_gib()) / pre
        fail = Failure(Outcome.KV_TOO_SMALL, Phase.KV_CACHE, min_mem_fraction=need)
        return StartupTrace(**partial, kv_pool_gib=kv, kv_tokens=tokens, failure=fail)  # type: ignore[arg-type]

    free = post_w - kv
    partial.update(kv_pool_gib=kv, kv_tokens=tokens, pool_end_free_gib=free)
    steps: list[tuple[int, float]] = []
    graph_begin = free
    for i, (b, alloc) in enumerate(s.graph_allocations(bs)):
        steps.append((b, free))
        if alloc > free:
            fail = Failure(Outcome.OOM_GRAPH_CAPTURE, Phase.CUDA_GRAPH, alloc, free, step=i)
            return StartupTrace(**partial, graph_steps=steps, failure=fail)  # type: ignore[arg-type]
        free -= alloc

    partial.update(graph_steps=steps, graph_end_free_gib=free, graph_mem_gib=graph_begin - free)
    if s.warmup_gib > free:
        fail = Failure(Outcome.OOM_RUNTIME, Phase.WARMUP, s.warmup_gib, free)
        return StartupTrace(**partial, failure=fail)  # type: ignore[arg-type]
    return StartupTrace(**partial)  # type: ignore[arg-type]
