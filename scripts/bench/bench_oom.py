#!/usr/bin/env python3
"""OOM-convergence benchmark: launcher's policy against two fixed-step rules (docs/benchmarks.md).

Usage::

    .venv/bin/python scripts/bench/bench_oom.py [--n 500] [--seed 1] [--max-attempts 8] [--show 3]
    .venv/bin/python scripts/bench/bench_oom.py --families [--n 200] [--floors 0.5]
    .venv/bin/python scripts/bench/bench_oom.py --sim-families --n 200 --seeds 1,2,3 --floors 0.5
    .venv/bin/python scripts/bench/bench_oom.py --estimator [--n 400] [--curve 100]

No processes, no GPU: every attempt is the simulator's memory model (``simulate``), read the way
the log classifier reads SGLang's log (``observed``), and handed to a strategy that picks the
next setting. Three strategies, the same scenarios, starting values, bounds and attempt cap:

- ``policy``: ``launcher.memory.policy.next_params``.
- ``fixed-0.05``: after an OOM, fraction - 0.05 with the graph bs unchanged; after
  kv_too_small, fraction + 0.05 (SGLang's own advice, applied mechanically).
- ``seeds-0.10``: after an OOM, fraction - 0.10 and half the graph bs; after kv_too_small,
  fraction + 0.10 (what the operator did by hand in docs/incidents.md, incident 1).

The step rules read the resolved fraction / bs from the log (server_args dump), clamp to the
bounds, stop at a weight-load OOM and stop when clamping leaves the setting unchanged (no move
left). They have no memory: they may revisit a setting that already failed.

Ground truth. A scenario is *feasible* when its first attempt is ready, or some graph bs of the
starting capture list (>= ``graph_bs_floor``) has a fraction on the 0.001 grid within
[floor, ceiling] that ``simulate`` starts. Graph memory grows with bs, so that is decided at
the smallest such bs. The *best fraction* at a bs is the highest such fraction.

Scenarios (seeded ``random.Random``): GPU U(24, 141) GiB; tp in {1, 2, 4, 8}; other processes
hold nothing (p=0.5) or U(0, 0.3 x GPU); CUDA context U(0.5, 3); weights per rank U(0.05, 1.05)
x pre-load free (> 1 cannot load); KV U(0.01, 0.3) GiB per 1k tokens; min KV tokens 0 (p=0.5)
or U{1..16384}; graph activations log-U(0.001, 0.08) GiB per unit of max bs; per-graph overhead
U(0.001, 0.05) GiB; warmup U(0.1, 3) GiB; SGLang 0.5.6 or 0.5.23; starting fraction auto
(p=0.5) or U(0.55, 0.95) to 2 decimals; starting graph bs auto (p=0.5) or one of the usual
explicit values (8 ... 512).

Bounds: launcher's shipped ``[policy]`` defaults (fraction in [0.50, 0.95], graph bs >= 1) with
8 attempts; a second table with the floor at 0.30 (``--floors``). Metrics:

- converged: the last attempt is ready. "gave up" = the strategy stopped before the cap, "ran
  out" = the cap was reached; both counted only for feasible scenarios.
- attempts after a first memory failure: feasible scenarios whose first attempt failed with
  a capture OOM, a warmup OOM or kv_too_small (the same scenarios for every strategy); the
  attempts of the runs that reached ready, the failed first one included (2 = fixed in one).
- KV headroom left: best fraction at the final graph bs (capped at the ceiling) minus the
  fraction that came up, for runs the strategy steered (first attempt failed); in fractions
  of pre-load free memory, and in GiB. Graph bs: final over starting, same runs.

Percentiles are nearest-rank.

Scenario families (``--families``): the same metrics, policy and step rules, one table
per family, on scenarios with SGLang's multi-pass capture, speculative decoding and hybrid
models, built from the simulator's memory model (``launcher.sim.memory``, the arithmetic the
simulated server runs; ``scenario_for`` / ``scenario_from_argv`` build the same objects from
flags). Each attempt re-derives the scenario from the attempt's params (``with_params``): the
request cap (``--max-running-requests``) clamps the captured sizes, and on 0.5.23
``SGLANG_DISABLE_DRAFT_EXTEND_CUDA_GRAPH=1`` drops the draft-extend pass, as in the server.

- ``multipass``: a plain model on 0.5.23 whose prefill graphs take memory: a pool of
  U(0.2, 3) GiB plus U(0.002, 0.02) GiB per shape, captured before the decode graphs.
- ``eagle``: EAGLE with a separate draft, steps U{1..5}, topk 1 (p=0.6) or 2/4 with
  U{steps+1..16} draft tokens; draft weights U(0.02, 0.08) x the target's per rank.
- ``eagle3``: EAGLE3, steps U{2..5}, topk 1, steps+1 draft tokens; draft weights U(0.005,
  0.03) x the target's, a one-layer draft KV.
- ``mtp``: NEXTN/MTP (EAGLE with the model's own head), steps U{1..3}, topk 1, steps+1 draft
  tokens; draft weights U(0.01, 0.04) x the target's.
  Spec families: SGLang 0.5.10 or 0.5.23; draft graph activations log-U(0.0005, 0.02) GiB per
  token, draft KV U(0.02, 0.15) x the target's per token; the request cap is 48 (p=0.7) or an
  explicit U{8..256}; on 0.5.23 prefill graphs as in ``multipass`` (SGLang captures them for
  EAGLE-family targets too, then the draft's; drawn from a generator of their own so that
  every case keeps its other figures); the other figures as above.
- ``hybrid``: a Mamba hybrid with MTP (p=0.6) or without, conv+ssm state U(0.02, 0.3) GiB per
  slot, strategy as each version resolves it for a working launch (0.5.10: extra_buffer with
  spec, no_buffer without; 0.5.23: auto, i.e. extra_buffer with the overlap schedule).

All families: no minimum KV pool (``min_kv_tokens`` 0; its draw is kept so the other figures do
not move). SGLang 0.5.10 and 0.5.23 refuse a full-attention pool only at 0 tokens
(``MemoryPoolConfig.__post_init__``); the floor the plain generator draws has no counterpart
for these models (a hybrid's floor is its state cache, modelled; sliding-window models, whose
``validate_swa_pool_size`` has one, are not in the families).

Where the generator may flatter the policy (read the family tables with this in mind):

- The log is ``observed`` (the simulator's own reading of its trace), not the classifier on a
  rendered log: every figure the policy reads is present and exact to SGLang's rounding. Real
  logs lose lines (interleaved ranks, a missing begin line) and the policy then guesses.
- Memory is deterministic: a setting that failed fails again, one that fits always fits; no
  fragmentation, no allocator caching slack, no rank that differs from another.
- Graph memory is linear in the largest captured size (tokens per request included) plus a
  per-graph constant, the shape the policy's per-pass estimate assumes: a decode-like pass's
  first step proportional to the bs, a prefill pass fixed. SGLang's real growth is only
  roughly linear (attention backends, torch.compile, NCCL buffers), and a first step with a
  constant part (static buffers) is extrapolated too low to a smaller bs (the policy tests'
  ``tests/multipass.py`` world has such a part).
- Each pass's begin line is present, so every finished pass has an exact size; 0.5.10's draft
  pool is exactly the target's token count times its cell (as SGLang sizes it), which the
  policy solves for with the fraction.
- The policy's constants were not tuned to these draws, but its priors for what no log shows
  yet (warmup after a capture OOM, ``Priors.warmup_gib``; passes not yet begun,
  ``Priors.draft_after_target_share``) decide most of the attempts after a first failure: the
  warmup need is drawn U(0.1, 3) GiB whatever the model, the draft graphs independently of
  the target's.
- The truth used for "feasible" and "headroom" searches only the fraction and graph bs at the
  attempt's own request cap and env; it never credits the spec parameters (never changed, by
  design) nor Mamba knobs the policy does not touch.

The families on the simulator's own models (``--sim-families``): the same metrics, policy,
step rules and loop, but every scenario is what a simulated server started with a drawn SGLang
command line runs (``launcher.sim.model.scenario_from_argv``: flags parsed in the version's
dialect, the model's ``configs/sim/models/*/config.json``), so no cost is drawn: KV cells, state
slots and weights per rank follow SGLang's formulas, graph and warmup memory the models' "sim"
figures (tensor-derived for ``llama-70b-sim``, ``tiny-1b-sim`` and the EAGLE draft
``llama-70b-eagle-sim``; fitted to the seeds' logs for ``deepseek-v4-flash-sim``,
``kimi-k2.5-sim`` + ``kimi-k2.5-eagle3-sim`` and ``qwen3.6-27b-sim``). Draws
(``random.Random(f"sim-{seed}-{family}")``), per case:

- model: ``multipass`` one of llama-70b-sim, tiny-1b-sim, deepseek-v4-flash-sim, kimi-k2.5-sim
  (plain, 0.5.23 only: prefill graphs); ``eagle`` llama-70b-sim + llama-70b-eagle-sim (EAGLE);
  ``eagle3`` kimi-k2.5-sim + kimi-k2.5-eagle3-sim; ``mtp`` deepseek-v4-flash-sim (NEXTN);
  ``hybrid`` qwen3.6-27b-sim, with NEXTN (p=0.6) or without; spec families and hybrid on
  SGLang 0.5.10 or 0.5.23 (p=0.5 each);
- GPU: uniform over those of A100 40 GB (39.39 GiB), A100 80 GB (79.15), H100 80 GB (79.19),
  H200 (139.81), L40S (44.39), RTX PRO 6000 (94.97) on which the weights fit at tp 8; tp: the
  smallest of 1, 2, 4, 8 whose weights / tp leave a quarter of the GPU, one step more with
  p=0.3 (``bench_estimator``'s rule); other processes hold nothing (p=0.5) or U(0, 0.15 x GPU);
- spec shape: EAGLE steps U{1..5}, topk 1 (p=0.6, draft tokens steps + 1) or 2/4 with
  U{steps+1..16} draft tokens; EAGLE-3 steps U{2..5}, topk 1; MTP (and hybrid MTP) steps
  U{1..3}, topk 1; 0.5.10 hybrid with MTP passes ``--mamba-scheduler-strategy extra_buffer``
  (its ValueError's fix; SGLANG_ENABLE_SPEC_V2 changes no memory figure), otherwise each
  version's default (0.5.10 no_buffer, 0.5.23 auto);
- ``--mem-fraction-static`` auto (p=0.5) or U(0.55, 0.95) to 2 decimals; graph max bs
  (``--cuda-graph-max-bs`` / ``-decode``) auto (p=0.5) or one of ``EXPLICIT_BS``;
  ``--max-running-requests`` unset (p=0.7) or U{8..256}; ``--chunked-prefill-size`` auto (p=0.7)
  or one of 2048, 4096, 8192, 16384.

A draw the simulated server refuses (argparse exit 2, ``ConfigFailure``) is skipped and counted.
The first attempt's params are the command line's fraction, graph bs and request cap. Where it
may flatter the policy: few models (eight configs), and the policy's priors were written beside
the seeds' fitted figures (``Priors.draft_after_target_share`` 0.25 is exactly
kimi-k2.5-eagle3-sim's draft/target per-token ratio, 0.005 / 0.02); the seed-fitted models
carry one per-rank figure at every tp and GPU; and everything listed above for ``--families``
(an exact log, deterministic memory). Where it may be harsh: the seed-fitted DeepSeek-V4 graph
pools (0.368 GiB per verify token, the MTP head 0.117 per token; SGLang's 8 MiB per graph) are
not explained by SGLang's source (docs/memory.md), and they dominate ``mtp`` and half of
``multipass``.
"""

from __future__ import annotations

import argparse
import contextlib
import functools
import io
import json
import math
import random
import statistics
import time
from collections import Counter
from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace
from pathlib import Path

from launcher.memory.policy import AttemptRecord, Bounds, _Context, _learn, _pass_width, next_params
from launcher.params import DISABLE_DRAFT_EXTEND_ENV, LaunchParams
from launcher.sglang.autoargs import capture_bs_list
from launcher.sglang.outcome import Outcome
from launcher.sglang.phases import GraphPass
from launcher.sglang.versions import version_tuple
from launcher.sim.memory import HybridScenario, MemoryScenario, SpecScenario, simulate
from launcher.sim.model import ConfigFailure, scenario_from_argv
from launcher.sim.observe import observed

EXPLICIT_BS = (8, 16, 32, 48, 64, 96, 128, 160, 256, 384, 512)
OOMS = frozenset({Outcome.OOM_GRAPH_CAPTURE, Outcome.OOM_RUNTIME, Outcome.OOM_KV_CACHE})
# Memory outcomes a fraction / bs change can fix; 0.5.23's hybrid state-cache errors too
# ("increase --mem-fraction-static", kv_cache_configurator.py:3154, 3394).
TOO_SMALL = frozenset({Outcome.KV_TOO_SMALL, Outcome.HYBRID_STATE_TOO_SMALL})
FIXABLE = OOMS | TOO_SMALL

# Targets (docs/benchmarks.md, "OOM convergence").
TARGET_ATTEMPTS_AFTER_FAILURE = 2.0
TARGET_HEADROOM = 0.03


@dataclass(frozen=True)
class Case:
    """One scenario and the setting it is first launched with."""

    index: int
    scenario: MemoryScenario
    initial: LaunchParams
    family: str = "plain"


Decide = Callable[[Case, Bounds, Sequence[AttemptRecord]], LaunchParams | None]


@dataclass(frozen=True)
class Strategy:
    name: str
    decide: Decide


@dataclass(frozen=True)
class Run:
    """One strategy on one case: every attempt, and how it ended."""

    history: list[AttemptRecord]
    end: str  # "ready", "gave_up" (strategy stopped) or "out_of_attempts"


def draw_case(rng: random.Random, index: int) -> Case:
    """A random scenario and starting setting (distribution in the module docstring)."""
    gpu = rng.uniform(24.0, 141.0)
    tp = rng.choice((1, 2, 4, 8))
    other = 0.0 if rng.random() < 0.5 else rng.uniform(0.0, 0.3 * gpu)
    context = rng.uniform(0.5, 3.0)
    pre = gpu - other - context
    weights_share = rng.uniform(0.05, 1.05)
    scenario = MemoryScenario(
        gpu_total_gib=gpu,
        weights_gib=weights_share * pre * tp,
        tp=tp,
        other_used_gib=other,
        context_gib=context,
        kv_gib_per_1k_tokens=rng.uniform(0.01, 0.3),
        min_kv_tokens=0 if rng.random() < 0.5 else rng.randint(1, 16384),
        graph_gib_per_bs=math.exp(rng.uniform(math.log(0.001), math.log(0.08))),
        graph_overhead_gib=rng.uniform(0.001, 0.05),
        warmup_gib=rng.uniform(0.1, 3.0),
        sglang_version=rng.choice(("0.5.6", "0.5.23")),
    )
    mfs = None if rng.random() < 0.5 else round(rng.uniform(0.55, 0.95), 2)
    bs = None if rng.random() < 0.5 else rng.choice(EXPLICIT_BS)
    return Case(index, scenario, LaunchParams(mfs, bs))


FAMILIES = ("multipass", "eagle", "eagle3", "mtp", "hybrid")


def _base(rng: random.Random, versions: Sequence[str]) -> MemoryScenario:
    """draw_case's plain scenario, on one of ``versions``, without a minimum KV pool.

    SGLang 0.5.10 and 0.5.23 refuse a full-attention KV pool only when it has no token at all
    (``MemoryPoolConfig.__post_init__``: ``max_total_num_tokens <= 0``, 0.5.10
    model_runner_kv_cache_mixin.py:56, 0.5.23 pool_configurator.py:95); the families' models
    have no sliding window (whose floor is ``validate_swa_pool_size``), and a hybrid's floor
    is its state cache, modelled separately. So ``min_kv_tokens`` is 0 here; its draw is kept
    so that every other figure is the one drawn before this fix.
    """
    gpu = rng.uniform(24.0, 141.0)
    tp = rng.choice((1, 2, 4, 8))
    other = 0.0 if rng.random() < 0.5 else rng.uniform(0.0, 0.3 * gpu)
    context = rng.uniform(0.5, 3.0)
    pre = gpu - other - context
    weights = rng.uniform(0.05, 1.05) * pre * tp
    kv = rng.uniform(0.01, 0.3)
    _ = rng.random() < 0.5 or rng.randint(1, 16384)  # the former min_kv_tokens draw
    return MemoryScenario(
        gpu_total_gib=gpu,
        weights_gib=weights,
        tp=tp,
        other_used_gib=other,
        context_gib=context,
        kv_gib_per_1k_tokens=kv,
        min_kv_tokens=0,
        graph_gib_per_bs=math.exp(rng.uniform(math.log(0.001), math.log(0.08))),
        graph_overhead_gib=rng.uniform(0.001, 0.05),
        warmup_gib=rng.uniform(0.1, 3.0),
        sglang_version=rng.choice(tuple(versions)),
    )


def _spec(rng: random.Random, s: MemoryScenario, family: str) -> SpecScenario:
    w = s.weights_per_rank_gib
    if family == "eagle":
        steps = rng.randint(1, 5)
        topk = 1 if rng.random() < 0.6 else rng.choice((2, 4))
        tokens = steps + 1 if topk == 1 else rng.randint(steps + 1, 16)
        algo, draft_w = "EAGLE", rng.uniform(0.02, 0.08) * w
    elif family == "eagle3":
        steps, topk = rng.randint(2, 5), 1
        tokens = steps + 1
        algo, draft_w = "EAGLE3", rng.uniform(0.005, 0.03) * w
    else:  # mtp (NEXTN resolves to EAGLE)
        steps, topk = rng.randint(1, 3), 1
        tokens = steps + 1
        algo, draft_w = "EAGLE", rng.uniform(0.01, 0.04) * w
    cap = 48 if rng.random() < 0.7 else rng.randint(8, 256)
    return SpecScenario(
        algorithm=algo,
        num_steps=steps,
        topk=topk,
        num_draft_tokens=tokens,
        max_running_requests=cap,
        draft_weights_gib=draft_w,
        draft_kv_gib_per_1k_tokens=rng.uniform(0.02, 0.15) * s.kv_gib_per_1k_tokens,
        draft_graph_gib_per_token=math.exp(rng.uniform(math.log(0.0005), math.log(0.02))),
        draft_graph_overhead_gib=rng.uniform(0.001, 0.02),
    )


def draw_family_case(rng: random.Random, index: int, family: str) -> Case:
    """A random scenario of ``family`` (distributions in the module docstring)."""
    if family == "multipass":
        s = replace(
            _base(rng, ("0.5.23",)),
            prefill_graph_gib=rng.uniform(0.2, 3.0),
            prefill_graph_overhead_gib=rng.uniform(0.002, 0.02),
        )
    elif family in ("eagle", "eagle3", "mtp"):
        s = _base(rng, ("0.5.10", "0.5.23"))
        s = replace(s, spec=_spec(rng, s, family))
    elif family == "hybrid":
        s = _base(rng, ("0.5.10", "0.5.23"))
        spec = _spec(rng, s, "mtp") if rng.random() < 0.6 else None
        new = version_tuple(s.sglang_version) >= (0, 5, 23)
        per_req = rng.uniform(0.02, 0.3)
        conv = per_req * rng.uniform(0.02, 0.1)
        strategy = "extra_buffer" if (new or spec is not None) else "no_buffer"
        hybrid = HybridScenario(
            conv_gib_per_req=conv,
            ssm_gib_per_req=per_req - conv,
            strategy=strategy,
            overlap=new,
        )
        s = replace(s, spec=spec, hybrid=hybrid)
    else:
        raise ValueError(f"unknown family {family!r} (one of {', '.join(FAMILIES)})")
    mfs = None if rng.random() < 0.5 else round(rng.uniform(0.55, 0.95), 2)
    bs = None if rng.random() < 0.5 else rng.choice(EXPLICIT_BS)
    # 0.5.23 captures the target's prefill graphs (breakable, the CUDA default) for EAGLE-family
    # targets too, and the draft's after them (cuda_graph_setup.capture_prefill_graph,
    # eagle_worker_v2.init_cuda_graphs): the same distribution as ``multipass``, drawn from a
    # generator of its own so that every other figure, and every later case, is the one drawn
    # before this fix. 0.5.10 has no prefill graphs (speculative decoding turns its piecewise
    # graphs off).
    own = random.Random(f"prefill-{family}-{index}-{s.gpu_total_gib!r}")
    prefill = (own.uniform(0.2, 3.0), own.uniform(0.002, 0.02))
    if family in ("eagle", "eagle3", "mtp") and s.new_order:
        s = replace(s, prefill_graph_gib=prefill[0], prefill_graph_overhead_gib=prefill[1])
    return Case(index, s, LaunchParams(mfs, bs), family)


def with_params(s: MemoryScenario, params: LaunchParams) -> MemoryScenario:
    """The scenario an attempt with ``params`` runs: the knobs other than the fraction and
    graph bs applied as the simulated server applies them (``scenario_for``)."""
    spec, hybrid = s.spec, s.hybrid
    mrr = params.max_running_requests
    if spec is not None:
        if mrr is not None:
            spec = replace(spec, max_running_requests=mrr)
        if version_tuple(s.sglang_version) >= (0, 5, 23):
            off = params.env_value(DISABLE_DRAFT_EXTEND_ENV) == "1"
            spec = replace(spec, draft_extend_graph=not off)
    if hybrid is not None:
        hybrid = replace(
            hybrid,
            max_mamba_cache_size=params.max_mamba_cache_size,
            mamba_full_memory_ratio=params.mamba_full_memory_ratio or 0.9,
        )
    return replace(
        s,
        spec=spec,
        hybrid=hybrid,
        max_running_requests=mrr if spec is None else s.max_running_requests,
    )


# --- strategies ------------------------------------------------------------------------------


def policy_decide(
    case: Case, bounds: Bounds, history: Sequence[AttemptRecord]
) -> LaunchParams | None:
    s = case.scenario
    return next_params(
        case.initial, bounds, history, tp=s.tp, sglang_version=s.sglang_version
    ).params


def step_rule(step: float, halve_bs: bool) -> Decide:
    """A memoryless rule: OOM -> fraction - step (and bs // 2); kv_too_small -> + step."""

    def decide(case: Case, bounds: Bounds, history: Sequence[AttemptRecord]) -> LaunchParams | None:
        last = history[-1]
        mfs = last.numbers.mem_fraction_static
        bs = last.numbers.cuda_graph_max_bs
        if mfs is None or bs is None:  # the server_args dump is always in the simulated log
            return None
        if last.outcome in TOO_SMALL:
            new_mfs, new_bs = mfs + step, bs
        elif last.outcome in OOMS:
            new_mfs = mfs - step
            new_bs = max(bounds.graph_bs_floor, bs // 2) if halve_bs else bs
        else:  # oom_weights (or anything not memory): no fraction helps
            return None
        new_mfs = round(
            min(bounds.mem_fraction_ceiling, max(bounds.mem_fraction_floor, new_mfs)), 3
        )
        if (new_mfs, new_bs) == (round(mfs, 3), bs):
            return None  # clamped onto itself: no move left
        return LaunchParams(new_mfs, new_bs)

    return decide


STRATEGIES = (
    Strategy("policy", policy_decide),
    Strategy("fixed-0.05", step_rule(0.05, halve_bs=False)),
    Strategy("seeds-0.10", step_rule(0.10, halve_bs=True)),
)


def run(case: Case, bounds: Bounds, strategy: Strategy) -> Run:
    """simulate -> observed -> decide until ready, the strategy stops, or the attempt cap."""
    history: list[AttemptRecord] = []
    params: LaunchParams | None = case.initial
    while params is not None:
        scenario = with_params(case.scenario, params)
        trace = simulate(scenario, params)
        outcome, phase, numbers = observed(scenario, trace)
        history.append(AttemptRecord(params, outcome, phase, numbers))
        if outcome is Outcome.READY:
            return Run(history, "ready")
        if len(history) >= bounds.max_attempts:
            return Run(history, "out_of_attempts")
        params = strategy.decide(case, bounds, history)
    return Run(history, "gave_up")


# --- ground truth ----------------------------------------------------------------------------


def _milli_floor(x: float) -> int:
    return math.floor(x * 1000 + 1e-6)


def _milli_ceil(x: float) -> int:
    return math.ceil(x * 1000 - 1e-6)


def best_fraction(s: MemoryScenario, bs: int, bounds: Bounds) -> int | None:
    """Highest fraction (thousandths) in [floor, ceiling] that starts at graph ``bs``, or None."""
    window = s.feasible_range(bs)
    if window is None:
        return None
    low, high = window
    bottom = _milli_ceil(bounds.mem_fraction_floor)
    milli = min(_milli_floor(bounds.mem_fraction_ceiling), _milli_floor(high) + 1)
    # The window's edges are float arithmetic; simulate (token truncation included) decides.
    while milli >= bottom and milli / 1000 > low - 0.001:
        if simulate(s, LaunchParams(milli / 1000, bs)).ok:
            return milli
        milli -= 1
    return None


def smallest_bs(case: Case, bounds: Bounds) -> int:
    """The smallest graph bs of the starting capture list that the bounds allow."""
    _, start_bs = case.scenario.resolve(case.initial)
    allowed = [b for b in capture_bs_list(start_bs) if b >= bounds.graph_bs_floor]
    return min(allowed) if allowed else start_bs


@dataclass(frozen=True)
class Truth:
    first: Outcome  # the first attempt's outcome (the same for every strategy)
    feasible: bool
    start_feasible: bool  # a fraction within bounds starts at the starting graph bs
    why_not: str  # for infeasible cases: "weights", "kv" (no pool even at the ceiling), "graphs"


def truth(case: Case, bounds: Bounds) -> Truth:
    s = case.scenario
    first = observed(s, simulate(s, case.initial))[0]
    _, start_bs = s.resolve(case.initial)
    start_ok = best_fraction(s, start_bs, bounds) is not None
    feasible = (
        first is Outcome.READY or best_fraction(s, smallest_bs(case, bounds), bounds) is not None
    )
    why = ""
    if not feasible:
        if s.weights_fail():
            why = "weights"
        else:
            ceiling = bounds.mem_fraction_ceiling
            low = (s.weights_per_rank_gib + s.min_kv_gib()) / s.pre_load_free_gib
            why = "kv" if low >= ceiling else "graphs"
    return Truth(first, feasible, start_ok, why)


# --- statistics and tables -------------------------------------------------------------------


@dataclass(frozen=True)
class Scored:
    """One run with the figures the tables need."""

    truth: Truth
    run: Run
    repeated: bool  # relaunched a setting that had already failed
    headroom: float | None  # ready: best fraction at the final bs - the chosen one
    headroom_gib: float | None
    bs_ratio: float | None  # ready: final / starting graph bs

    @property
    def attempts(self) -> int:
        return len(self.run.history)

    @property
    def ready(self) -> bool:
        return self.run.end == "ready"

    @property
    def chosen(self) -> bool:
        """Ready on a setting the strategy chose (the first attempt failed)."""
        return self.ready and self.attempts > 1


def score(case: Case, t: Truth, r: Run, bounds: Bounds) -> Scored:
    s = case.scenario
    seen = [s.resolve(rec.params) for rec in r.history]
    repeated = any(
        seen[i] == seen[j] and r.history[j].outcome is not Outcome.READY
        for i in range(len(seen))
        for j in range(i)
    )
    if r.end != "ready":
        return Scored(t, r, repeated, None, None, None)
    mfs, bs = seen[-1]
    best = best_fraction(with_params(s, r.history[-1].params), bs, bounds)
    headroom = (best / 1000 if best is not None else mfs) - mfs
    return Scored(t, r, repeated, headroom, headroom * s.pre_load_free_gib, bs / seen[0][1])


def p95(values: Sequence[float]) -> float:
    """Nearest-rank 95th percentile."""
    ordered = sorted(values)
    return ordered[max(0, math.ceil(0.95 * len(ordered)) - 1)]


def stats(values: Sequence[float], digits: int) -> str:
    """'mean / p95 / max', or '-' when empty."""
    if not values:
        return "-"
    mean, top = statistics.fmean(values), max(values)
    return f"{mean:.{digits}f} / {p95(values):.{digits}f} / {top:.{digits}f}"


def pct(part: int, whole: int) -> str:
    return "-" if whole == 0 else f"{100 * part / whole:.1f}% ({part}/{whole})"


def describe_case(case: Case) -> str:
    s = case.scenario
    return (
        f"MemoryScenario(gpu_total_gib={s.gpu_total_gib:.3f}, weights_gib={s.weights_gib:.3f}, "
        f"tp={s.tp}, other_used_gib={s.other_used_gib:.3f}, context_gib={s.context_gib:.3f}, "
        f"kv_gib_per_1k_tokens={s.kv_gib_per_1k_tokens:.4f}, min_kv_tokens={s.min_kv_tokens}, "
        f"graph_gib_per_bs={s.graph_gib_per_bs:.5f}, "
        f"graph_overhead_gib={s.graph_overhead_gib:.4f}, warmup_gib={s.warmup_gib:.3f}, "
        f"sglang_version={s.sglang_version!r}); initial {case.initial.describe()}"
    )


def describe_run(case: Case, r: Run, bounds: Bounds) -> list[str]:
    s = case.scenario
    lines = []
    for i, rec in enumerate(r.history, 1):
        mfs, bs = s.resolve(rec.params)
        best = best_fraction(with_params(s, rec.params), bs, bounds)
        best_s = "none" if best is None else f"{best / 1000:.3f}"
        lines.append(f"      {i}. mfs={mfs:.3f} bs={bs}: {rec.outcome.value} (best at bs {best_s})")
    lines.append(f"      -> {r.end}")
    return lines


Row = tuple[str, list[str], str]


def table(rows: list[Row], names: Sequence[str]) -> list[str]:
    head = ["", *names, "target"]
    body = [[label, *cells, target] for label, cells, target in rows]
    widths = [max(len(row[i]) for row in [head, *body]) for i in range(len(head))]

    def fmt(row: list[str]) -> str:
        first = row[0].ljust(widths[0])
        rest = [cell.rjust(w) for cell, w in zip(row[1:-1], widths[1:-1], strict=True)]
        return "  ".join([first, *rest, row[-1]]).rstrip()

    return [fmt(head), "-" * len(fmt(head)), *(fmt(row) for row in body)]


def verdicts(name: str, scored: Sequence[Scored]) -> list[str]:
    """MET / MISSED per target for one strategy."""
    feasible = [x for x in scored if x.truth.feasible]
    after = [x.attempts for x in feasible if x.truth.first in FIXABLE and x.ready]
    headroom = [x.headroom for x in scored if x.chosen and x.headroom is not None]
    mean_after = statistics.fmean(after) if after else float("nan")
    converged = sum(x.ready for x in feasible)

    def mark(ok: bool) -> str:
        return "MET" if ok else "MISSED"

    target = TARGET_ATTEMPTS_AFTER_FAILURE
    out = [
        f"  {name}: attempts after a first memory failure, mean {mean_after:.2f} "
        f"(<= {target}): {mark(mean_after <= target)}",
        f"  {name}: converged when feasible {converged}/{len(feasible)} (100%): "
        f"{mark(converged == len(feasible))}",
    ]
    if headroom:
        mean_h, p95_h = statistics.fmean(headroom), p95(headroom)
        out.append(
            f"  {name}: headroom left mean {mean_h:.3f} (<= {TARGET_HEADROOM}): "
            f"{mark(mean_h <= TARGET_HEADROOM)}; p95 {p95_h:.3f}: {mark(p95_h <= TARGET_HEADROOM)}"
        )
    return out


def rows_for(results: dict[str, list[Scored]], n_cases: int) -> list[Row]:
    names = list(results)
    some = results[names[0]]
    feasible_n = sum(x.truth.feasible for x in some)
    failed_first_n = sum(x.truth.feasible and x.truth.first in FIXABLE for x in some)

    def col(fn: Callable[[list[Scored]], str]) -> list[str]:
        return [fn(results[n]) for n in names]

    def count(pred: Callable[[Scored], bool]) -> Callable[[list[Scored]], str]:
        return lambda xs: str(sum(pred(x) for x in xs))

    def after(kinds: frozenset[Outcome]) -> Callable[[list[Scored]], str]:
        def cell(xs: list[Scored]) -> str:
            got = [
                x.attempts for x in xs if x.truth.feasible and x.truth.first in kinds and x.ready
            ]
            return f"n={len(got)}: {stats(got, 2)}"

        return cell

    def headroom(kinds: frozenset[Outcome], gib: bool = False) -> Callable[[list[Scored]], str]:
        def cell(xs: list[Scored]) -> str:
            got = [
                (x.headroom_gib if gib else x.headroom)
                for x in xs
                if x.chosen and x.truth.first in kinds
            ]
            return stats([g for g in got if g is not None], 2 if gib else 3)

        return cell

    def bs_cut(xs: list[Scored]) -> str:
        chosen = [x for x in xs if x.chosen and x.bs_ratio is not None]
        return pct(sum(x.bs_ratio is not None and x.bs_ratio < 1 for x in chosen), len(chosen))

    oom = frozenset(OOMS)
    kv = TOO_SMALL
    return [
        ("converged, all scenarios", col(lambda xs: pct(sum(x.ready for x in xs), n_cases)), ""),
        (
            "converged, feasible scenarios",
            col(lambda xs: pct(sum(x.ready and x.truth.feasible for x in xs), feasible_n)),
            "100%",
        ),
        (
            "feasible but gave up",
            col(count(lambda x: x.truth.feasible and x.run.end == "gave_up")),
            "0",
        ),
        (
            "feasible but ran out of attempts",
            col(count(lambda x: x.truth.feasible and x.run.end == "out_of_attempts")),
            "0",
        ),
        ("runs that relaunched a failed setting", col(count(lambda x: x.repeated)), ""),
        (
            "attempts to ready, all (mean/p95/max)",
            col(lambda xs: stats([x.attempts for x in xs if x.ready], 2)),
            "",
        ),
        (
            "first attempt failed (memory): converged",
            col(
                lambda xs: pct(
                    sum(x.ready and x.truth.feasible and x.truth.first in FIXABLE for x in xs),
                    failed_first_n,
                )
            ),
            "100%",
        ),
        (
            "first attempt failed (memory): attempts",
            col(after(FIXABLE)),
            f"mean <= {TARGET_ATTEMPTS_AFTER_FAILURE}",
        ),
        ("  first was an OOM (capture/warmup)", col(after(oom)), ""),
        ("    capture OOM", col(after(frozenset({Outcome.OOM_GRAPH_CAPTURE}))), ""),
        ("    warmup OOM", col(after(frozenset({Outcome.OOM_RUNTIME}))), ""),
        ("  first was kv_too_small / hybrid state", col(after(kv)), ""),
        (
            "infeasible: attempts spent (mean/p95/max)",
            col(lambda xs: stats([x.attempts for x in xs if not x.truth.feasible], 2)),
            "",
        ),
        (
            "KV headroom left, chosen (mean/p95/max)",
            col(headroom(FIXABLE)),
            f"<= {TARGET_HEADROOM}",
        ),
        ("  first was an OOM", col(headroom(oom)), ""),
        ("  first was kv_too_small / hybrid state", col(headroom(kv)), ""),
        ("  in GiB (mean/p95/max)", col(headroom(FIXABLE, gib=True)), ""),
        (
            "KV headroom left, first-try ready",
            col(
                lambda xs: stats(
                    [
                        x.headroom
                        for x in xs
                        if x.ready and x.attempts == 1 and x.headroom is not None
                    ],
                    3,
                )
            ),
            "",
        ),
        (
            "graph bs final/start, chosen (mean)",
            col(
                lambda xs: stats(
                    [x.bs_ratio for x in xs if x.chosen and x.bs_ratio is not None], 2
                ).split(" / ")[0]
            ),
            "",
        ),
        ("  runs that cut graph bs", col(bs_cut), ""),
        (
            "  ... although the start bs fitted",
            col(
                count(
                    lambda x: (
                        x.chosen
                        and x.bs_ratio is not None
                        and x.bs_ratio < 1
                        and x.truth.start_feasible
                    )
                )
            ),
            "",
        ),
    ]


def trails(scored: Sequence[Scored]) -> list[str]:
    """How the policy's runs went after a failed first attempt: outcome sequences, by count."""
    seqs = Counter(
        " > ".join(rec.outcome.value for rec in x.run.history)
        for x in scored
        if x.truth.feasible and x.truth.first in FIXABLE
    )
    return [f"  {n:4d}  {seq}" for seq, n in seqs.most_common()]


def bench(cases: Sequence[Case], bounds: Bounds, show: int) -> list[str]:
    return bench_scored(cases, bounds, show)[0]


def bench_scored(
    cases: Sequence[Case], bounds: Bounds, show: int
) -> tuple[list[str], list[Scored]]:
    """The report lines, and the policy's scored runs."""
    truths = [truth(c, bounds) for c in cases]
    results = {
        st.name: [
            score(c, t, run(c, bounds, st), bounds) for c, t in zip(cases, truths, strict=True)
        ]
        for st in STRATEGIES
    }
    feasible = sum(t.feasible for t in truths)
    firsts = Counter(t.first for t in truths if t.feasible)
    why = Counter(t.why_not for t in truths if not t.feasible)
    failed_first = sum(firsts[k] for k in FIXABLE)
    no_window = sum(t.feasible and t.first in FIXABLE and not t.start_feasible for t in truths)
    lines = [
        f"== bounds: mem_fraction in [{bounds.mem_fraction_floor:.2f}, "
        f"{bounds.mem_fraction_ceiling:.2f}], graph bs >= {bounds.graph_bs_floor}, "
        f"max_attempts {bounds.max_attempts} ==",
        f"scenarios {len(cases)}: feasible {feasible} (first attempt ready "
        f"{firsts[Outcome.READY]}; failed with a memory outcome {failed_first}: capture OOM "
        f"{firsts[Outcome.OOM_GRAPH_CAPTURE]}, warmup OOM {firsts[Outcome.OOM_RUNTIME]}, "
        f"kv_too_small {firsts[Outcome.KV_TOO_SMALL]}, hybrid state cache "
        f"{firsts[Outcome.HYBRID_STATE_TOO_SMALL]}; of these, no fraction fits at the "
        f"starting graph bs {no_window})",
        f"  infeasible {len(cases) - feasible}: weights do not load {why['weights']}, no KV pool "
        f"even at the ceiling {why['kv']}, graphs + warmup leave no window at any bs "
        f"{why['graphs']}",
        "",
        *table(rows_for(results, len(cases)), list(results)),
        "",
        "targets:",
    ]
    for name, scored in results.items():
        lines += verdicts(name, scored)
    lines += ["", "policy, feasible runs whose first attempt failed, by outcome sequence:"]
    lines += trails(results["policy"])
    if show:
        policy = results["policy"]
        stuck = [i for i, x in enumerate(policy) if x.truth.feasible and not x.ready]
        lines += ["", f"policy: feasible but not ready ({len(stuck)}; first {show}):"]
        for i in stuck[:show]:
            lines.append(f"  case {cases[i].index}: {describe_case(cases[i])}")
            lines += describe_run(cases[i], policy[i].run, bounds)
        worst = sorted(
            (i for i, x in enumerate(policy) if x.chosen),
            key=lambda i: -(policy[i].headroom or 0.0),
        )
        lines += ["", f"policy: most headroom left (first {show}):"]
        for i in worst[:show]:
            lines.append(
                f"  case {cases[i].index} (headroom {policy[i].headroom or 0.0:.3f}): "
                f"{describe_case(cases[i])}"
            )
            lines += describe_run(cases[i], policy[i].run, bounds)
    return lines, results["policy"]


def family_table_head(title: str) -> list[str]:
    """The title and header rows of the per-family summary table (``family_summary`` rows)."""
    return [
        "",
        title,
        "",
        "| family | scenarios | feasible | converged (feasible) | first failed (memory) | "
        "mean attempts | max | headroom mean | headroom p95 | targets |",
        "|---|---|---|---|---|---|---|---|---|---|",
    ]


def family_summary(name: str, scored: Sequence[Scored]) -> list[str]:
    """One line per family: the policy's figures against the three targets."""
    feasible = [x for x in scored if x.truth.feasible]
    converged = sum(x.ready for x in feasible)
    after = [x.attempts for x in feasible if x.truth.first in FIXABLE and x.ready]
    headroom = [x.headroom for x in scored if x.chosen and x.headroom is not None]
    mean_after = statistics.fmean(after) if after else float("nan")
    mean_h = statistics.fmean(headroom) if headroom else float("nan")
    ok = (
        converged == len(feasible)
        and (not after or mean_after <= TARGET_ATTEMPTS_AFTER_FAILURE)
        and (not headroom or mean_h <= TARGET_HEADROOM)
    )
    return [
        f"| {name} | {len(scored)} | {len(feasible)} | {pct(converged, len(feasible))} | "
        f"{len(after)} | {mean_after:.2f} | {stats(after, 0).split(' / ')[-1]} | "
        f"{mean_h:.3f} | {p95(headroom) if headroom else float('nan'):.3f} | "
        f"{'MET' if ok else 'MISSED'} |"
    ]


def main_families(args: argparse.Namespace) -> int:
    """``--families``: one bench per scenario family, then the policy's summary table."""
    began = time.perf_counter()
    names = FAMILIES if args.family is None else tuple(args.family.split(","))
    summary: list[str] = []
    for floor in (float(x) for x in args.floors.split(",")):
        bounds = Bounds(floor, args.ceiling, args.bs_floor, args.max_attempts)
        summary += family_table_head(
            f"policy per family, fraction in [{floor:.2f}, {args.ceiling:.2f}], "
            f"max_attempts {args.max_attempts}:"
        )
        for family in names:
            rng = random.Random(f"{args.seed}-{family}")
            cases = [draw_family_case(rng, i, family) for i in range(args.n)]
            print(f"\n##### family {family}: {args.n} scenarios, seed {args.seed}")
            lines, policy = bench_scored(cases, bounds, args.show)
            print("\n".join(lines))
            summary += family_summary(family, policy)
    print("\n".join(summary))
    print(f"\n({time.perf_counter() - began:.1f} s)")
    return 0


# --- the families on the simulator's own models (--sim-families) -----------------------------

SIM_MODELS = Path(__file__).resolve().parents[2] / "configs" / "sim" / "models"
# (name, memory.total in GiB as torch sees it): bench_estimator's figures, and the seeds' RTX
# PRO 6000 ("total capacity of 94.97 GiB", docs/incidents.md, incident 1).
SIM_GPUS = (
    ("A100-SXM4-40GB", 39.39),
    ("A100-SXM4-80GB", 79.15),
    ("H100 80GB HBM3", 79.19),
    ("H200", 139.81),
    ("L40S", 44.39),
    ("RTX PRO 6000", 94.97),
)
SIM_VERSIONS = ("0.5.10", "0.5.23")
# family: (target models, draft model dir or None, --speculative-algorithm, versions)
SIM_FAMILIES: dict[str, tuple[tuple[str, ...], str | None, str | None, tuple[str, ...]]] = {
    "multipass": (
        ("llama-70b-sim", "tiny-1b-sim", "deepseek-v4-flash-sim", "kimi-k2.5-sim"),
        None, None, ("0.5.23",),
    ),
    "eagle": (("llama-70b-sim",), "llama-70b-eagle-sim", "EAGLE", SIM_VERSIONS),
    "eagle3": (("kimi-k2.5-sim",), "kimi-k2.5-eagle3-sim", "EAGLE3", SIM_VERSIONS),
    "mtp": (("deepseek-v4-flash-sim",), None, "NEXTN", SIM_VERSIONS),
    "hybrid": (("qwen3.6-27b-sim",), None, "NEXTN", SIM_VERSIONS),
}
CHUNKS = (2048, 4096, 8192, 16384)


@dataclass(frozen=True)
class SimDraw:
    """How a ``--sim-families`` case was built: the SGLang command line the simulated server
    runs (``scenario_from_argv``), on which GPU type and version."""

    model: str
    gpu: str
    version: str
    argv: tuple[str, ...]


@functools.cache  # read once per model, not once per draw
def _sim_weights_gib(model: str) -> float:
    data = json.loads((SIM_MODELS / model / "config.json").read_text())
    return float(data["sim"]["weights_gib"])


def pick_tp(rng: random.Random, weights_gib: float, total: float) -> int | None:
    """The tp a scenario runs at (``--sim-families`` and bench_estimator): the smallest whose
    weights leave a quarter of the GPU, one step more with p=0.3; None when even tp 8 does not
    (then nothing is drawn from ``rng``)."""
    tp = next((t for t in (1, 2, 4, 8) if weights_gib / t < 0.75 * total), None)
    if tp is not None and tp < 8 and rng.random() < 0.3:
        tp *= 2
    return tp


def draw_sim_argv(rng: random.Random, family: str) -> SimDraw:
    """One SGLang launch of ``family`` on the simulator's models (distributions in the module
    docstring); every figure of the scenario comes from the model's files through the flags."""
    models, draft, algo, versions = SIM_FAMILIES[family]
    model = rng.choice(models)
    weights = _sim_weights_gib(model)
    fits = [(g, total) for g, total in SIM_GPUS if weights / 8 < 0.75 * total]
    gpu, total = rng.choice(fits)
    tp = pick_tp(rng, weights, total)
    assert tp is not None
    version = rng.choice(versions)
    new = version_tuple(version) >= (0, 5, 23)
    argv = ["--model-path", str(SIM_MODELS / model), "--tp-size", str(tp)]
    spec = algo is not None and (family != "hybrid" or rng.random() < 0.6)
    if spec:
        assert algo is not None
        if family == "eagle":
            steps = rng.randint(1, 5)
            topk = 1 if rng.random() < 0.6 else rng.choice((2, 4))
            tokens = steps + 1 if topk == 1 else rng.randint(steps + 1, 16)
        else:
            steps = rng.randint(2, 5) if family == "eagle3" else rng.randint(1, 3)
            topk, tokens = 1, steps + 1
        argv += ["--speculative-algorithm", algo]
        if draft is not None:
            argv += ["--speculative-draft-model-path", str(SIM_MODELS / draft)]
        argv += [
            "--speculative-num-steps", str(steps),
            "--speculative-eagle-topk", str(topk),
            "--speculative-num-draft-tokens", str(tokens),
        ]
    if family == "hybrid" and spec and not new:
        # 0.5.10 refuses spec with no_buffer and the radix cache (its ValueError names this).
        argv += ["--mamba-scheduler-strategy", "extra_buffer"]
    mfs = None if rng.random() < 0.5 else round(rng.uniform(0.55, 0.95), 2)
    if mfs is not None:
        argv += ["--mem-fraction-static", f"{mfs:.2f}"]
    bs = None if rng.random() < 0.5 else rng.choice(EXPLICIT_BS)
    if bs is not None:
        argv += ["--cuda-graph-max-bs-decode" if new else "--cuda-graph-max-bs", str(bs)]
    if rng.random() >= 0.7:
        argv += ["--max-running-requests", str(rng.randint(8, 256))]
    if rng.random() >= 0.7:
        argv += ["--chunked-prefill-size", str(rng.choice(CHUNKS))]
    return SimDraw(model, gpu, version, tuple(argv))


def sim_case(draw: SimDraw, other_gib: float, index: int, family: str) -> Case:
    """The case a simulated server started with ``draw.argv`` runs (``scenario_from_argv``);
    the first attempt's params are the command line's fraction, graph bs and request cap.
    Raises SystemExit (argparse, exit 2) or ConfigFailure as the server would."""
    total = dict(SIM_GPUS)[draw.gpu]
    with contextlib.redirect_stderr(io.StringIO()):
        scenario, params = scenario_from_argv(draw.version, draw.argv, total, other_gib)
    mrr = None
    if "--max-running-requests" in draw.argv:
        mrr = int(draw.argv[draw.argv.index("--max-running-requests") + 1])
    return Case(index, scenario, replace(params, max_running_requests=mrr), family)


def draw_sim_family_cases(
    seed: int, family: str, n: int
) -> tuple[list[Case], list[SimDraw], Counter[str]]:
    """``n`` accepted cases of ``family`` (seeded ``random.Random(f"sim-{seed}-{family}")``),
    their draws, and the draws the simulated server refused, by reason."""
    if family not in SIM_FAMILIES:
        raise ValueError(f"unknown family {family!r} (one of {', '.join(SIM_FAMILIES)})")
    rng = random.Random(f"sim-{seed}-{family}")
    cases: list[Case] = []
    draws: list[SimDraw] = []
    skipped: Counter[str] = Counter()
    while len(cases) < n:
        if sum(skipped.values()) > 10 * n:
            raise RuntimeError(f"{family}: the simulated server refused {skipped}")
        draw = draw_sim_argv(rng, family)
        total = dict(SIM_GPUS)[draw.gpu]
        other = 0.0 if rng.random() < 0.5 else rng.uniform(0.0, 0.15 * total)
        try:
            case = sim_case(draw, other, len(cases), family)
        except SystemExit:
            skipped["argparse error (exit 2)"] += 1
            continue
        except ConfigFailure as e:
            skipped[e.text.strip().splitlines()[-1][:80]] += 1
            continue
        cases.append(case)
        draws.append(draw)
    return cases, draws, skipped


def sim_mix(cases: Sequence[Case], draws: Sequence[SimDraw]) -> list[str]:
    """What was drawn: models, GPUs, versions, tp, the starting settings."""
    def share(values: Sequence[object]) -> str:
        return ", ".join(f"{k} {v}" for k, v in sorted(Counter(map(str, values)).items()))

    s = [c.scenario for c in cases]
    spec = [x.spec for x in s if x.spec is not None]
    return [
        f"  models: {share([d.model for d in draws])}",
        f"  GPUs: {share([d.gpu for d in draws])}",
        f"  versions: {share([d.version for d in draws])}; tp: {share([x.tp for x in s])}",
        f"  other processes > 0: {sum(x.other_used_gib > 0 for x in s)}; explicit fraction "
        f"{sum(c.initial.mem_fraction_static is not None for c in cases)}, graph bs "
        f"{sum(c.initial.cuda_graph_max_bs is not None for c in cases)}, request cap "
        f"{sum(c.initial.max_running_requests is not None for c in cases)}, chunk "
        f"{sum(x.chunked_prefill_size is not None for x in s)}",
        *(
            [f"  spec (steps/topk/draft tokens): "
             f"{share([f'{x.num_steps}/{x.topk}/{x.num_draft_tokens}' for x in spec])}"]
            if spec else []
        ),
    ]


def sim_by(scored: Sequence[Scored], draws: Sequence[SimDraw]) -> list[str]:
    """The policy's figures by model and version (first attempt failed on memory)."""
    groups: dict[str, list[Scored]] = {}
    for x, d in zip(scored, draws, strict=True):
        groups.setdefault(f"{d.model} {d.version}", []).append(x)
    out = []
    for key, xs in sorted(groups.items()):
        after = [x.attempts for x in xs if x.truth.feasible and x.truth.first in FIXABLE
                 and x.ready]
        head = [x.headroom for x in xs if x.chosen and x.headroom is not None]
        out.append(
            f"  {key}: {len(xs)} scenarios, first failed {len(after)}, mean attempts "
            f"{statistics.fmean(after) if after else float('nan'):.2f}, headroom mean "
            f"{statistics.fmean(head) if head else float('nan'):.3f}"
        )
    return out


def _wasted_cause(case: Case, r: Run, k: int, bounds: Bounds) -> tuple[str, tuple[float, ...]]:
    """Why attempt ``k`` (0-based, failed, not the first) of a policy run failed: its kind,
    and (the policy's guess, the simulator's figure) where a prior made the guess."""
    rec = r.history[k]
    s = with_params(case.scenario, rec.params)
    tr = simulate(s, rec.params)
    fail = tr.failure
    earlier = [h for h in r.history[:k] if h.outcome in (Outcome.OOM_GRAPH_CAPTURE,
                                                          Outcome.OOM_RUNTIME)]
    seen = {name for h in r.history[:k] for name, _ in (h.numbers.graph_begins or [])}
    ctx = _Context(s.gpu_total_gib, s.tp, s.sglang_version, spec=s.spec is not None)
    facts = _learn(r.history[:k], ctx, bounds)
    _, bs = s.resolve(rec.params)
    passes = {p.name: p for p in s.graph_passes(bs, tr.max_running_requests)}
    if rec.outcome in (Outcome.OOM_GRAPH_CAPTURE, Outcome.OOM_RUNTIME) and not earlier:
        return ("graphs met blind (only kv_too_small / state errors before)",
                (0.0, sum(p.total_gib for p in passes.values())))
    if rec.outcome is Outcome.OOM_GRAPH_CAPTURE and (fail is None or fail.graph_pass is None):
        return "0.5.10 draft weights / pool after the target's graphs", ()
    if rec.outcome is Outcome.OOM_GRAPH_CAPTURE and fail is not None and fail.graph_pass:
        name = fail.graph_pass
        if fail.step:
            if name.endswith("prefill"):
                true_c = s.prefill_graph_overhead_gib
            elif name.startswith("draft") and s.spec is not None:
                true_c = s.spec.draft_graph_overhead_gib
            else:
                true_c = s.graph_overhead_gib
            guess = facts.c if facts.c is not None else ctx.priors.step_gib
            return f"a later capture step of {name} (GiB per graph)", (guess, true_c)
        if name not in seen:
            target = passes.get("target_verify") or passes.get("target_decode")
            mine = passes[name]
            if target is None:
                return f"a pass not yet seen: {name}", ()
            share = (mine.allocations[0][1] - mine.allocations[-1][1]) / max(
                1e-9, target.allocations[0][1] - target.allocations[-1][1])
            last = earlier[-1].numbers
            if name.startswith("draft") and (last.graph_pass or "").startswith("target"):
                guess = ctx.priors.draft_after_target_share
            elif name == GraphPass.DRAFT_EXTEND and last.graph_pass == GraphPass.DRAFT_DECODE:
                guess = _pass_width(GraphPass.DRAFT_EXTEND, last, s.sglang_version) / _pass_width(
                    GraphPass.DRAFT_DECODE, last, s.sglang_version)
            else:
                guess = ctx.priors.same_model_share
            return (f"a pass not yet seen: {name} (first step / the target pass's)",
                    (guess, share))
        return f"the first step of a pass already seen ({name})", ()
    if rec.outcome is Outcome.OOM_RUNTIME:
        guess = facts.warmup
        if guess is None:
            guess = ctx.priors.warmup_gib(facts.pre or 1.0)
        return "warmup OOM after a capture OOM (GiB)", (guess, s.warmup_gib)
    return f"{rec.outcome.value} after an earlier failure", ()


def wasted_attempts(cases: Sequence[Case], scored: Sequence[Scored], bounds: Bounds) -> list[str]:
    """The policy's failed attempts after the first (feasible runs whose first attempt failed
    on memory), by cause, with the policy's guess against the simulator's figure (means). The
    guess is ``launcher.memory.policy``'s own learning (``_learn``) on the history before the
    attempt."""
    causes: Counter[str] = Counter()
    figures: dict[str, list[tuple[float, ...]]] = {}
    for case, x in zip(cases, scored, strict=True):
        if not (x.truth.feasible and x.truth.first in FIXABLE):
            continue
        for k in range(1, len(x.run.history)):
            if x.run.history[k].outcome is Outcome.READY:
                continue
            cause, figs = _wasted_cause(case, x.run, k, bounds)
            causes[cause] += 1
            if figs:
                figures.setdefault(cause, []).append(figs)
    out = []
    for cause, n in causes.most_common():
        text = f"  {n:4d}  {cause}"
        rows = figures.get(cause)
        if rows:
            guess = statistics.fmean(r[0] for r in rows)
            true = [r[1] for r in rows]
            text += (f": policy {guess:.3f}, simulator {statistics.fmean(true):.3f} "
                     f"({min(true):.3f}-{max(true):.3f})")
        out.append(text)
    return out or ["  none"]


def main_sim_families(args: argparse.Namespace) -> int:
    """``--sim-families``: the families on the simulator's own models, then the summary."""
    began = time.perf_counter()
    names = tuple(SIM_FAMILIES) if args.family is None else tuple(args.family.split(","))
    seeds = [int(x) for x in str(args.seeds or args.seed).split(",")]
    summary: list[str] = []
    for floor in (float(x) for x in args.floors.split(",")):
        bounds = Bounds(floor, args.ceiling, args.bs_floor, args.max_attempts)
        for seed in seeds:
            summary += family_table_head(
                f"policy per family on the simulator's models, seed {seed}, fraction in "
                f"[{floor:.2f}, {args.ceiling:.2f}], max_attempts {args.max_attempts}:"
            )
            for family in names:
                cases, draws, skipped = draw_sim_family_cases(seed, family, args.n)
                print(f"\n##### sim family {family}: {args.n} scenarios, seed {seed}")
                refused = ", ".join(f"{k}: {v}" for k, v in skipped.items()) or "none"
                print(f"draws the simulated server refused (skipped): {refused}")
                print("\n".join(sim_mix(cases, draws)))
                lines, policy = bench_scored(cases, bounds, args.show)
                print("\n".join(lines))
                print("\npolicy by model and version:")
                print("\n".join(sim_by(policy, draws)))
                print("\npolicy: failed attempts after the first, by cause (guess vs simulator):")
                print("\n".join(wasted_attempts(cases, policy, bounds)))
                summary += family_summary(family, policy)
    print("\n".join(summary))
    print(f"\n({time.perf_counter() - began:.1f} s)")
    return 0


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0] if __doc__ else None)
    parser.add_argument("--n", type=int, default=500, help="number of scenarios (default 500)")
    parser.add_argument("--seed", type=int, default=1, help="random seed (default 1)")
    parser.add_argument("--max-attempts", type=int, default=8, help="attempt cap (default 8)")
    parser.add_argument("--ceiling", type=float, default=0.95, help="fraction ceiling (0.95)")
    parser.add_argument(
        "--floors", default="0.5,0.3", help="fraction floors, one table each (default 0.5,0.3)"
    )
    parser.add_argument("--bs-floor", type=int, default=1, help="graph bs floor (default 1)")
    parser.add_argument(
        "--show", type=int, default=0, help="print N policy runs that missed, and N worst headroom"
    )
    parser.add_argument(
        "--families",
        action="store_true",
        help="the scenario families (multi-pass, EAGLE, EAGLE-3, MTP, hybrid)",
    )
    parser.add_argument(
        "--family", default=None, help=f"with --families: a comma list of {', '.join(FAMILIES)}"
    )
    parser.add_argument(
        "--sim-families",
        action="store_true",
        help="the families on the simulator's own (SGLang-shaped) models, built from SGLang "
        "flags (scenario_from_argv)",
    )
    parser.add_argument(
        "--seeds", default=None, help="with --sim-families: a comma list of seeds (default --seed)"
    )
    parser.add_argument(
        "--estimator", action="store_true",
        help="the estimator (cold / with the ledger) as a contender "
        "(scripts/bench/bench_estimator.py)",
    )
    import bench_estimator  # beside this script; imports it back (no cycle at load time)

    bench_estimator.add_arguments(parser)
    args = parser.parse_args(argv)
    if args.estimator:
        return bench_estimator.main_estimator(args)
    if args.families:
        return main_families(args)
    if args.sim_families:
        return main_sim_families(args)

    began = time.perf_counter()
    rng = random.Random(args.seed)
    cases = [draw_case(rng, i) for i in range(args.n)]
    print(
        f"OOM-convergence benchmark: {args.n} scenarios, seed {args.seed}, "
        f"strategies: {', '.join(st.name for st in STRATEGIES)}"
    )
    for floor in (float(x) for x in args.floors.split(",")):
        bounds = Bounds(floor, args.ceiling, args.bs_floor, args.max_attempts)
        print()
        print("\n".join(bench(cases, bounds, args.show)))
    print(f"\n({time.perf_counter() - began:.1f} s)")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
