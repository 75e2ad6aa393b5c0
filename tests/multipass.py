"""A small multi-pass capture model for the policy tests (SGLang's order, memory per pass).

Not the simulator (``launcher/sim`` has its own, richer one): this is the ground truth the
policy tests drive ``next_params`` against, with the figures a log of SGLang 0.5.23 or 0.5.10
shows. Memory after the pools is ``(1 - mfs) x pre``; each capture pass then takes its share
in SGLang's order (target prefill, target decode/verify, draft decode, draft extend), its
first captured size (the largest bs) allocating ``fixed + per_bs x bs`` and each smaller size
``step``; memory consumed between passes (0.5.10 loads the draft's weights and pool after the
target graphs) is ``before``. Warmup then needs ``warmup`` GiB.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from launcher.memory.policy import AttemptRecord, Bounds, next_params
from launcher.params import DISABLE_DRAFT_EXTEND_ENV, LaunchParams
from launcher.sglang.autoargs import capture_bs_list
from launcher.sglang.outcome import Numbers, Outcome
from launcher.sglang.phases import GraphPass, Phase
from launcher.sglang.versions import version_tuple


def _r(x: float) -> float:
    return round(x, 2)


@dataclass(frozen=True)
class Pass:
    name: GraphPass
    fixed_gib: float
    per_bs_gib: float
    step_gib: float
    before_gib: float = 0.0  # consumed between the previous pass and this one


@dataclass(frozen=True)
class World:
    pre: float  # free GiB before weight load, per rank
    weights: float
    passes: tuple[Pass, ...]
    warmup: float
    gpu_total: float = 94.97
    draft_weights: float = 0.0
    spec: bool = False
    steps: int = 1
    topk: int = 1
    draft_tokens: int = 2
    version: str = "0.5.23"
    kv_min_gib: float = 0.5
    tp: int = 4

    def run(self, params: LaunchParams) -> AttemptRecord:
        """One start-up at ``params`` (explicit fraction and bs), as its log reads."""
        mfs, bs = params.mem_fraction_static, params.cuda_graph_max_bs
        assert mfs is not None and bs is not None
        cap = params.max_running_requests or (48 if self.spec else None)
        eff = bs if cap is None else min(bs, cap)
        n = Numbers(
            pre_load_avail_gib=_r(self.pre), post_weights_avail_gib=_r(self.pre - self.weights),
            weights_gib=_r(self.weights), mem_fraction_static=mfs, cuda_graph_max_bs=bs,
            total_gib=None,
        )
        if self.spec:
            n.speculative_algorithm, n.speculative_num_steps = "EAGLE", self.steps
            n.speculative_eagle_topk, n.speculative_num_draft_tokens = self.topk, self.draft_tokens
            n.max_running_requests = cap
            n.draft_weights_gib = self.draft_weights or None
        counted = self.draft_weights if version_tuple(self.version) >= (0, 5, 23) else 0.0
        pool = mfs * self.pre - self.weights - counted
        if pool < self.kv_min_gib:
            if pool <= 0 and version_tuple(self.version) >= (0, 5, 23):
                n.min_mem_fraction = round((self.weights + counted) / self.pre, 4)
            return AttemptRecord(params, Outcome.KV_TOO_SMALL, Phase.KV_CACHE, n)
        free = (1 - mfs) * self.pre
        n.pool_end_avail_gib = _r(free)
        sizes = sorted(capture_bs_list(eff), reverse=True)
        extend_off = params.env_value(DISABLE_DRAFT_EXTEND_ENV) == "1"
        begun = 0
        for p in self.passes:
            if p.name is GraphPass.DRAFT_EXTEND and extend_off:
                continue
            free -= p.before_gib
            begun += 1
            n.graph_pass, n.graph_passes_begun = p.name.value, begun
            n.graph_begin_avail_gib = _r(free)
            if n.graph_first_begin_avail_gib is None:
                n.graph_first_begin_avail_gib = _r(free)
            allocs = [p.fixed_gib + p.per_bs_gib * eff] + [p.step_gib] * (len(sizes) - 1)
            for k, alloc in enumerate(allocs):
                n.graph_last_bs, n.graph_last_avail_gib = sizes[k], _r(free)
                n.graph_steps_done, n.graph_steps_total = k, len(sizes)
                if alloc > free:
                    n.tried_gib, n.free_gib, n.total_gib = _r(alloc), _r(free), self.gpu_total
                    return AttemptRecord(params, Outcome.OOM_GRAPH_CAPTURE, Phase.CUDA_GRAPH, n)
                free -= alloc
        if self.warmup > free:
            n.tried_gib, n.free_gib, n.total_gib = _r(self.warmup), _r(free), self.gpu_total
            return AttemptRecord(params, Outcome.OOM_RUNTIME, Phase.WARMUP, n)
        return AttemptRecord(params, Outcome.READY, Phase.READY, n)

    def feasible(self, bs: int, bounds: Bounds, *, cushion: float = 0.0) -> bool:
        """Whether some fraction on the 0.001 grid is ready at graph bs ``bs`` with a pool of
        at least ``cushion`` x pre beyond SGLang's minimum."""
        top = round(bounds.mem_fraction_ceiling * 1000)
        for milli in range(top, round(bounds.mem_fraction_floor * 1000) - 1, -1):
            rec = self.run(LaunchParams(milli / 1000, bs))
            if rec.outcome is Outcome.READY:
                counted = self.draft_weights if version_tuple(self.version) >= (0, 5, 23) else 0.0
                return milli / 1000 * self.pre - self.weights - counted >= cushion * self.pre
            if rec.outcome is Outcome.KV_TOO_SMALL:
                return False
        return False


@dataclass
class Run:
    history: list[AttemptRecord] = field(default_factory=list)
    reason: str = ""

    @property
    def ready(self) -> bool:
        return bool(self.history) and self.history[-1].outcome is Outcome.READY

    @property
    def after_first_failure(self) -> int:
        """Attempts launched after the first memory failure (0 when the first was ready)."""
        return max(0, len(self.history) - 1)


def run_policy(world: World, initial: LaunchParams, bounds: Bounds | None = None) -> Run:
    """Drive the world and the policy until ready or give-up."""
    b = bounds or Bounds()
    run = Run()
    params: LaunchParams | None = initial
    while params is not None:
        rec = world.run(params)
        run.history.append(rec)
        if rec.outcome is Outcome.READY:
            break
        decision = next_params(initial, b, run.history, tp=world.tp,
                               sglang_version=world.version)
        run.reason = decision.reason
        params = decision.params
    return run
