#!/usr/bin/env python3
"""What-if sweep of the OOM policy's priors on the random scenario families of ``bench_oom.py``.

Usage::

    nice -n 19 .venv/bin/python scripts/bench/bench_frontier.py [--seeds 1,2,3] [--n 200]
        [--family multipass,eagle] [--points shipped,oracle-warmup] [--floor 0.5]

THIS IS A WHAT-IF, NOT THE SHIPPED POLICY. For each point of the sweep the script builds a
:class:`launcher.memory.priors.Priors` value (``Point.priors``: the shipped ``DEFAULT_PRIORS``
with some fields replaced) and passes it to ``next_params(..., priors=)`` through
``scripts/bench/bench_oom.py``'s family benchmark (``draw_family_case`` -> ``run`` -> ``score``,
the ``policy`` strategy only). Nothing shipped is rebound for a prior; CI never runs this
script.

The priors swept (fields of ``Priors``):

- the warmup guess (``Priors.warmup_gib``, read by ``_Facts.need``, ``_Facts.estimate`` and
  ``_by_step``): the activation need after capture, assumed until a warmup OOM shows it.
  Swept as the shipped rule times k in {0, 0.5, 1, 2, 4} (``Priors.scaled_warmup``).
- ``draft_after_target_share`` (read by ``_later_passes``): a draft capture pass not yet begun
  as a share of the failing target pass, {0.25 (shipped), 0.5, 1.0}.
- ``kv_cushion`` (read by ``_Facts.soft_lo``): the smallest useful KV pool, as a fraction of
  ``pre``, {0, 0.01, 0.02 (shipped), 0.05, 0.10}. ``soft_lo`` serves both the step after
  ``kv_too_small`` (SGLang's minimum + cushion) and, after an OOM, the lowest fraction the
  model-based search accepts before it cuts the graph bs, so the cushion moves both.
- ``step_gib`` (read by ``_Facts.graphs``, ``_learn`` and ``_pass_fit``): the cost of each
  captured graph after the first, until a log shows a later step. When a pass's *first* step
  fails (the common capture OOM), no log line sizes the later steps, and the generator draws
  the per-graph cost U(0.001, 0.05) GiB against the prior's 0.02, over up to 52 captured sizes.
  Swept {0.02 (shipped), 0.035, 0.05}.

Oracle rows bound what any prior for these unknowns could give:

- ``oracle-warmup``: the warmup guess is, for each case, the case's true activation
  need after capture, ``scenario.warmup_gib`` (``launcher.sim.memory.simulate`` charges
  nothing else after the last capture pass). The policy still adds its margin
  (``margin_gib``) on top, as it does to a seen warmup.
- ``oracle-later`` (the points ``oracle-warmup+later`` and ``oracle-all*``): additionally
  what loads after a failing capture pass is true, from the simulator at the attempt's own
  params. These rows replace two private functions of the policy (an oracle replaces the
  policy's reasoning, not a prior), in this process only, restored after the point
  (``patched``; ``check_patch_points`` verifies before any figure that the policy still looks
  them up by global name). ``_later_passes`` keeps the policy's choice of which
  passes follow, with each share set so that ``share x first + step x sizes`` is that pass's
  true size (``first``: the failing pass's first-step activations, a prefill pass's whole
  size; after a prefill pass the policy's own token ratio is divided back out).
  ``_pass_fit`` adds, as fixed GiB, 0.5.23's draft prefill pass (not in the policy's list)
  and, on 0.5.10 while the target's pass runs, the draft's weights; it returns the draft's
  true pool as if the log had shown its ``KV Cache is allocated`` line. Approximate: the
  share multiplies the policy's *estimate* of the failing pass's first step, and sizes are
  exact only at the attempt's own bs and fraction.
- ``oracle-all``: additionally ``step_gib`` is, per case, the target's true per-graph
  cost (``graph_overhead_gib``; the draft's, drawn separately, is not given).
  Still hidden even here: the graphs after ``kv_too_small`` (no capture has run; the issue's
  rule, SGLang's minimum + ``kv_cushion``, meets them blind), and the margin the policy adds.

Where this may mislead:

- The families' generator draws the hidden quantities (warmup U(0.1, 3) GiB, draft graphs)
  independently of what the log shows (bench_oom's module docstring), so a prior can only be
  a bet on the generator's ranges; a good point here says nothing about real models.
- Points are one factor at a time around the shipped one plus a few combinations, not a
  grid: the frontier is of the points run, not of every possible prior.
- Pooled figures weigh the three seeds' runs together; the targets are per seed and family,
  so "meets" is reported per seed too.
"""

from __future__ import annotations

import argparse
import random
import statistics
import sys
import time
from collections import Counter
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field, replace
from types import ModuleType

from bench_oom import (
    FAMILIES,
    FIXABLE,
    OOMS,
    TARGET_ATTEMPTS_AFTER_FAILURE,
    TARGET_HEADROOM,
    TOO_SMALL,
    Case,
    Run,
    Scored,
    Strategy,
    Truth,
    draw_family_case,
    run,
    score,
    truth,
    with_params,
)

import launcher.memory.policy as policy
from launcher.memory.policy import AttemptRecord, Bounds
from launcher.memory.priors import DEFAULT_PRIORS, Priors
from launcher.params import LaunchParams
from launcher.sglang.outcome import Numbers, Outcome
from launcher.sglang.phases import GraphPass
from launcher.sim.memory import GraphPass as SimPass
from launcher.sim.memory import simulate

# The shipped oracle seams, captured at import: restored after every oracle-later point.
SHIPPED_LATER = policy._later_passes
SHIPPED_PASS_FIT = policy._pass_fit

# Each patched name and the policy functions that must read it as a global at call time.
PATCH_POINTS: dict[str, tuple[Callable[..., object], ...]] = {
    "_later_passes": (policy._pass_fit,),
    "_pass_fit": (policy._learn,),
}


@dataclass(frozen=True)
class Point:
    """One setting of the priors. ``warmup_scale`` multiplies the shipped warmup guess;
    ``oracle_warmup`` / ``oracle_later``: the case's true figures instead (module docstring)."""

    name: str
    warmup_scale: float = 1.0
    draft_share: float = DEFAULT_PRIORS.draft_after_target_share
    cushion: float = DEFAULT_PRIORS.kv_cushion
    step_gib: float = DEFAULT_PRIORS.step_gib
    oracle_warmup: bool = False
    oracle_later: bool = False
    oracle_step: bool = False

    @property
    def oracle(self) -> bool:
        return self.oracle_warmup or self.oracle_later or self.oracle_step

    def priors(self, case: Case | None = None) -> Priors:
        """The priors of this point; the oracle fields take ``case``'s true figures."""
        p = replace(DEFAULT_PRIORS.scaled_warmup(self.warmup_scale),
                    draft_after_target_share=self.draft_share, kv_cushion=self.cushion,
                    step_gib=self.step_gib)
        if case is not None and self.oracle_warmup:
            w = case.scenario.warmup_gib
            p = replace(p, warmup_share=0.0, warmup_min_gib=w, warmup_max_gib=w)
        if case is not None and self.oracle_step:
            p = replace(p, step_gib=case.scenario.graph_overhead_gib)
        return p

    def describe(self) -> str:
        warm = "true" if self.oracle_warmup else f"x{self.warmup_scale:g}"
        later = "true" if self.oracle_later else f"{self.draft_share:g}"
        step = "true" if self.oracle_step else f"{self.step_gib:g} GiB"
        return (f"warmup {warm}, draft share {later}, cushion {self.cushion:g}, "
                f"step {step}")


SHIPPED = Point("shipped")
POINTS: tuple[Point, ...] = (
    SHIPPED,
    Point("warmup-x0", warmup_scale=0.0),
    Point("warmup-x0.5", warmup_scale=0.5),
    Point("warmup-x2", warmup_scale=2.0),
    Point("warmup-x4", warmup_scale=4.0),
    Point("share-0.5", draft_share=0.5),
    Point("share-1.0", draft_share=1.0),
    Point("cushion-0", cushion=0.0),
    Point("cushion-0.01", cushion=0.01),
    Point("cushion-0.05", cushion=0.05),
    Point("cushion-0.10", cushion=0.10),
    Point("step-0.035", step_gib=0.035),
    Point("step-0.05", step_gib=0.05),
    Point("x2/0.5/0.05", warmup_scale=2.0, draft_share=0.5, cushion=0.05),
    Point("x2/1.0/0.10", warmup_scale=2.0, draft_share=1.0, cushion=0.10),
    Point("x4/0.5/0.05", warmup_scale=4.0, draft_share=0.5, cushion=0.05),
    Point("x4/1.0/0.10", warmup_scale=4.0, draft_share=1.0, cushion=0.10),
    Point("x0.5/1.0/0.02", warmup_scale=0.5, draft_share=1.0),
    Point("x2/0.5/0.02/s0.05", warmup_scale=2.0, draft_share=0.5, step_gib=0.05),
    Point("x4/1.0/0.10/s0.05", warmup_scale=4.0, draft_share=1.0, cushion=0.10, step_gib=0.05),
    Point("x4/1.0/0/s0.05", warmup_scale=4.0, draft_share=1.0, cushion=0.0, step_gib=0.05),
    Point("x2/0.5/0.01/s0.05", warmup_scale=2.0, draft_share=0.5, cushion=0.01, step_gib=0.05),
    Point("oracle-warmup", oracle_warmup=True),
    Point("oracle-warmup+later", oracle_warmup=True, oracle_later=True),
    Point("oracle-all", oracle_warmup=True, oracle_later=True, oracle_step=True),
    Point("oracle-all+cushion-0", oracle_warmup=True, oracle_later=True, oracle_step=True,
          cushion=0.0),
    Point("oracle-all+cushion-0.05", oracle_warmup=True, oracle_later=True, oracle_step=True,
          cushion=0.05),
    Point("oracle-all+cushion-0.10", oracle_warmup=True, oracle_later=True, oracle_step=True,
          cushion=0.10),
)


# --- patching --------------------------------------------------------------------------------


def check_patch_points(modules: Sequence[ModuleType] | None = None) -> list[str]:
    """Problems that would make a patch miss the policy (empty when every patch is read).

    Each reading function must load the name as a global (``co_names``), and no loaded module
    but ``launcher.memory.policy`` may hold the shipped object under the same name (a copy bound at
    import, which rebinding ``launcher.memory.policy``'s attribute would not reach).
    """
    problems = []
    for name, readers in PATCH_POINTS.items():
        for fn in readers:
            if name not in fn.__code__.co_names:
                problems.append(f"{fn.__qualname__} no longer reads {name} by global lookup")
    shipped = {"_later_passes": SHIPPED_LATER, "_pass_fit": SHIPPED_PASS_FIT}
    for mod in modules if modules is not None else list(sys.modules.values()):
        if mod is policy or mod is None:
            continue
        for name, obj in shipped.items():
            if getattr(mod, name, None) is obj:
                problems.append(f"{mod.__name__} holds its own binding of policy.{name}")
    return problems


@dataclass(frozen=True)
class AttemptTruth:
    """The simulator's truth for one attempt, at that attempt's own params."""

    passes: list[SimPass]  # every capture pass SGLang would run, in order
    effective_bs: int  # the largest decode-like size captured (request cap applied)
    draft_weights_gib: float  # 0 without speculative decoding
    draft_kv_gib: float | None  # 0.5.10's draft pool at this fraction (None: 0.5.23 / none)


@dataclass
class Oracle:
    """What the oracle rows know about the case being decided: its true warmup need and, per
    attempt (keyed by the ``Numbers`` object the policy reads), ``AttemptTruth``."""

    case: Case | None = None
    attempts: dict[int, AttemptTruth] = field(default_factory=dict)


ORACLE = Oracle()


def _first_step(p: SimPass) -> float:
    """A pass's size as the policy's fit counts the failing pass: a prefill pass whole, a
    decode-like pass its first step's activations (first allocation less the per-graph cost)."""
    if GraphPass(p.name) in policy.PREFILL_PASSES:
        return p.total_gib
    allocs = p.allocations
    over = allocs[-1][1] if len(allocs) > 1 else 0.0
    return max(0.0, allocs[0][1] - over)


def _oracle_later(
    gpass: GraphPass, n: Numbers, ctx: policy._Context, extend_off: bool
) -> list[tuple[GraphPass, float]]:
    """``_later_passes`` with true shares (module docstring, ``oracle-later``): the passes the
    policy expects, each sized so that ``share x first + step x captured sizes`` is the true
    pass at this attempt's bs (``step``: ``Priors.step_gib`` as the fit uses it)."""
    guessed = SHIPPED_LATER(gpass, n, ctx, extend_off)
    truth_ = ORACLE.attempts.get(id(n))
    if not guessed or truth_ is None:
        return guessed
    names = [p.name for p in truth_.passes]
    if gpass.value not in names:
        return guessed
    failing = truth_.passes[names.index(gpass.value)]
    base = _first_step(failing)
    if base <= 0:
        return guessed
    after = {p.name: p for p in truth_.passes[names.index(gpass.value) + 1:]}
    step = ctx.priors.step_gib
    out = []
    for p, _share in guessed:
        true = after.get(p.value)
        gib = 0.0 if true is None else true.total_gib - step * len(true.allocations)
        out.append((p, gib / base))
    if gpass is GraphPass.TARGET_PREFILL and (n.graph_steps_done or 0) == 0 and n.graph_last_bs:
        # _pass_fit scales these by the decode graph's tokens over the prefill shape's.
        spec = ctx.spec or n.speculative
        per_req = (n.speculative_num_draft_tokens or policy.SPEC_AUTO_STEPS + 1) if spec else 1
        ratio = min(1.0, truth_.effective_bs * per_req / n.graph_last_bs)
        if ratio > 0:
            out = [(p, share / ratio) for p, share in out]
    return out


def _oracle_pass_fit(
    n: Numbers,
    outcome: Outcome,
    mfs: float,
    bs: int,
    ctx: policy._Context,
    extend_off: bool,
    step_known: float | None,
) -> tuple[policy._PassFit, float | None] | None:
    """``_pass_fit`` told what loads after a failing capture pass besides the passes
    ``_later_passes`` names (module docstring, ``oracle-later``): 0.5.23's draft prefill pass
    (fixed GiB), and on 0.5.10 the draft's weights (fixed) and pool (returned as the figure
    the policy reads from the draft's ``KV Cache is allocated`` line) when the log has not
    shown them yet."""
    fitted = SHIPPED_PASS_FIT(n, outcome, mfs, bs, ctx, extend_off, step_known)
    truth_ = ORACLE.attempts.get(id(n))
    if fitted is None or truth_ is None or outcome is not Outcome.OOM_GRAPH_CAPTURE:
        return fitted
    fit, draft_kv = fitted
    begun = {name for name, _ in (n.graph_begins or ())} | {n.graph_pass or ""}
    extra = sum(
        p.total_gib for p in truth_.passes
        if p.name == GraphPass.DRAFT_PREFILL.value and p.name not in begun
    )
    # 0.5.10: the draft's weights and pool load after the target's last pass; once that pass
    # ended, _pass_fit itself reads the failed load's figures.
    target_running = (n.graph_passes_ended or 0) < len(n.graph_begins or [n.graph_pass])
    if (
        truth_.draft_kv_gib is not None
        and target_running
        and not any(GraphPass(name).is_draft for name in begun)
    ):
        if n.draft_weights_gib is None:
            extra += truth_.draft_weights_gib
        if draft_kv is None:
            draft_kv = truth_.draft_kv_gib
    return replace(fit, fixed=fit.fixed + extra), draft_kv


@contextmanager
def patched(point: Point) -> Iterator[None]:
    """Replace the policy's oracle seams for an ``oracle_later`` point; the shipped functions
    are restored on exit. (Priors are not patched: ``Point.priors`` passes them.)"""
    try:
        if point.oracle_later:
            policy._later_passes = _oracle_later
            policy._pass_fit = _oracle_pass_fit
        yield
    finally:
        restore()


def restore() -> None:
    """Put the shipped functions back into ``launcher.memory.policy``."""
    policy._later_passes = SHIPPED_LATER
    policy._pass_fit = SHIPPED_PASS_FIT


def is_shipped() -> bool:
    """Whether ``launcher.memory.policy`` holds the shipped functions."""
    return policy._later_passes is SHIPPED_LATER and policy._pass_fit is SHIPPED_PASS_FIT


def attempt_truth(case: Case, params: LaunchParams) -> AttemptTruth:
    """The simulator's passes, effective bs and draft figures for an attempt at ``params``."""
    s = with_params(case.scenario, params)
    _, bs = s.resolve(params)
    trace = simulate(s, params)
    passes = s.graph_passes(bs, trace.max_running_requests)
    decode = [p for p in passes if not p.draft and GraphPass(p.name) not in
              policy.PREFILL_PASSES]
    spec = s.spec
    draft_kv = None
    if spec is not None and not s.new_order and trace.kv_tokens is not None:
        draft_kv = trace.kv_tokens / 1000 * spec.draft_kv_gib_per_1k_tokens
    return AttemptTruth(
        passes,
        decode[0].sizes[-1] if decode else bs,
        spec.draft_weights_gib if spec is not None else 0.0,
        draft_kv,
    )


def oracle_decision(
    case: Case, bounds: Bounds, history: Sequence[AttemptRecord], point: Point | None = None
) -> policy.Decision:
    """``next_params`` with ``point``'s priors for ``case`` (the shipped ones by default) and
    ``ORACLE`` told the case and each attempt's truth (read by the oracle-later seams)."""
    ORACLE.case = case
    ORACLE.attempts = {id(rec.numbers): attempt_truth(case, rec.params) for rec in history}
    try:
        s = case.scenario
        priors = (point or SHIPPED).priors(case)
        return policy.next_params(
            case.initial, bounds, history, tp=s.tp, sglang_version=s.sglang_version,
            priors=priors,
        )
    finally:
        ORACLE.case = None
        ORACLE.attempts = {}


def strategy_for(point: Point) -> Strategy:
    """The ``policy`` strategy deciding with ``point``'s priors."""

    def decide(case: Case, bounds: Bounds, history: Sequence[AttemptRecord]) -> LaunchParams | None:
        return oracle_decision(case, bounds, history, point).params

    return Strategy("policy", decide)


# --- measuring -------------------------------------------------------------------------------


@dataclass(frozen=True)
class Figures:
    """One point on one family (one seed, or the seeds pooled)."""

    feasible: int
    converged: int
    after: tuple[int, ...]  # attempts of feasible runs whose first attempt failed (memory)
    headroom: tuple[float, ...]  # chosen runs
    # The same, split by the first failure: an OOM (capture / warmup), or a pool too small
    # (kv_too_small / hybrid state cache).
    after_oom: tuple[int, ...] = ()
    after_kv: tuple[int, ...] = ()
    headroom_oom: tuple[float, ...] = ()
    headroom_kv: tuple[float, ...] = ()

    @property
    def mean_after(self) -> float:
        return statistics.fmean(self.after) if self.after else float("nan")

    @property
    def mean_headroom(self) -> float:
        return statistics.fmean(self.headroom) if self.headroom else float("nan")

    @property
    def all_converged(self) -> bool:
        return self.converged == self.feasible

    @property
    def meets(self) -> bool:
        return (
            self.all_converged
            and (not self.after or self.mean_after <= TARGET_ATTEMPTS_AFTER_FAILURE)
            and (not self.headroom or self.mean_headroom <= TARGET_HEADROOM)
        )

    def __add__(self, other: Figures) -> Figures:
        return Figures(
            self.feasible + other.feasible,
            self.converged + other.converged,
            self.after + other.after,
            self.headroom + other.headroom,
            self.after_oom + other.after_oom,
            self.after_kv + other.after_kv,
            self.headroom_oom + other.headroom_oom,
            self.headroom_kv + other.headroom_kv,
        )

    def split(self) -> str:
        """'OOM-first: n, mean attempts, headroom | too-small-first: the same'."""

        def part(after: tuple[int, ...], head: tuple[float, ...]) -> str:
            a = statistics.fmean(after) if after else float("nan")
            h = statistics.fmean(head) if head else float("nan")
            return f"{len(after)}: {a:.2f} / {h:.3f}"

        oom, kv = part(self.after_oom, self.headroom_oom), part(self.after_kv, self.headroom_kv)
        return f"{oom} | {kv}"

    def cell(self) -> str:
        conv = "" if self.all_converged else f" ({self.feasible - self.converged} not ready)"
        return f"{self.mean_after:.2f} / {self.mean_headroom:.3f}{conv}"


def figures(scored: Sequence[Scored]) -> Figures:
    """bench_oom's family_summary figures: convergence, mean attempts, headroom mean."""
    feasible = [x for x in scored if x.truth.feasible]

    def after(kinds: frozenset[Outcome]) -> tuple[int, ...]:
        return tuple(x.attempts for x in feasible if x.truth.first in kinds and x.ready)

    def headroom(kinds: frozenset[Outcome]) -> tuple[float, ...]:
        return tuple(
            x.headroom
            for x in scored
            if x.chosen and x.headroom is not None and x.truth.first in kinds
        )

    return Figures(
        len(feasible),
        sum(x.ready for x in feasible),
        after(FIXABLE),
        tuple(x.headroom for x in scored if x.chosen and x.headroom is not None),
        after(OOMS),
        after(TOO_SMALL),
        headroom(OOMS),
        headroom(TOO_SMALL),
    )


@dataclass
class Family:
    """One seed's cases of one family, their truths, and a cache of scored final settings."""

    name: str
    seed: int
    cases: list[Case]
    truths: list[Truth]
    scored: dict[tuple[int, LaunchParams], Scored] = field(default_factory=dict)

    def score(self, i: int, r: Run, bounds: Bounds) -> Scored:
        """bench_oom.score, reused for a run that ended ready on a final setting already
        scored (the headroom and bs ratio depend only on it; ``repeated`` on the run)."""
        if r.end != "ready":
            return score(self.cases[i], self.truths[i], r, bounds)
        key = (i, r.history[-1].params)
        hit = self.scored.get(key)
        if hit is None:
            hit = self.scored[key] = score(self.cases[i], self.truths[i], r, bounds)
            return hit
        fresh = score_repeated(self.cases[i], r)
        return replace(hit, truth=self.truths[i], run=r, repeated=fresh)


def score_repeated(case: Case, r: Run) -> bool:
    """bench_oom.score's ``repeated``: relaunched a setting that had already failed."""
    seen = [case.scenario.resolve(rec.params) for rec in r.history]
    return any(
        seen[i] == seen[j] and r.history[j].outcome is not Outcome.READY
        for i in range(len(seen))
        for j in range(i)
    )


def load(name: str, seed: int, n: int, bounds: Bounds) -> Family:
    """bench_oom's ``main_families`` draw for (seed, family), with the truths."""
    rng = random.Random(f"{seed}-{name}")
    cases = [draw_family_case(rng, i, name) for i in range(n)]
    return Family(name, seed, cases, [truth(c, bounds) for c in cases])


def measure(point: Point, fam: Family, bounds: Bounds) -> list[Scored]:
    strategy = strategy_for(point)
    with patched(point):
        runs = [run(c, bounds, strategy) for c in fam.cases]
    return [fam.score(i, r, bounds) for i, r in enumerate(runs)]


def blind_runs(truths: Sequence[Truth]) -> list[int]:
    """Indices of the feasible runs whose first attempt failed with a pool too small
    (kv_too_small / hybrid state cache) and for which no fraction within the bounds starts at
    the starting graph bs. The policy keeps the graph bs after such an error, whatever its
    priors (``_by_step``, ``_hybrid_decision``), and the log shows no graph figure yet, so
    each of these runs fails at least once more: at least 3 attempts."""
    return [
        i for i, t in enumerate(truths)
        if t.feasible and t.first in TOO_SMALL and not t.start_feasible
    ]


def extra_trails(scored: Sequence[Scored]) -> Counter[str]:
    """Outcome sequences of feasible runs whose first attempt failed and that took more than
    one relaunch (or never came up)."""
    return Counter(
        " > ".join(rec.outcome.value for rec in x.run.history)
        + ("" if x.ready else f" ({x.run.end})")
        for x in scored
        if x.truth.feasible and x.truth.first in FIXABLE and (x.attempts > 2 or not x.ready)
    )


# --- reporting -------------------------------------------------------------------------------


def pareto(items: Sequence[tuple[str, float, float]]) -> list[tuple[str, float, float]]:
    """The non-dominated (name, mean attempts, headroom) items, by mean attempts: none other is
    at least as good in both and better in one."""
    front = [
        (name, a, h)
        for name, a, h in items
        if not any(
            (a2 <= a and h2 <= h) and (a2 < a or h2 < h) for _, a2, h2 in items
        )
    ]
    return sorted(front, key=lambda x: (x[1], x[2]))


def report(
    points: Sequence[Point],
    names: Sequence[str],
    seeds: Sequence[int],
    results: dict[tuple[str, str, int], Figures],
    trails: dict[tuple[str, str], Counter[str]],
    blind: dict[str, tuple[int, int]],
) -> list[str]:
    """The tables; ``blind``: per family, (feasible runs whose first attempt failed with a
    memory outcome, those of them that ``blind_runs`` counts), the seeds pooled."""
    lines = ["", "## Points", ""]
    lines += [f"- `{p.name}`: {p.describe()}" for p in points]
    target = f"mean <= {TARGET_ATTEMPTS_AFTER_FAILURE}, headroom <= {TARGET_HEADROOM}"
    lines += [
        "",
        f"## Per seed: mean attempts after a first memory failure / headroom mean ({target})",
    ]
    for name in names:
        lines += ["", f"### {name}", "",
                  "| point | " + " | ".join(f"seed {s}" for s in seeds) + " | seeds met |",
                  "|---|" + "---|" * (len(seeds) + 1)]
        for p in points:
            cells = [results[(p.name, name, s)] for s in seeds]
            met = sum(c.meets for c in cells)
            lines.append(
                f"| {p.name} | " + " | ".join(c.cell() for c in cells) + f" | {met}/{len(seeds)} |"
            )
    pooled = {
        (p.name, name): sum((results[(p.name, name, s)] for s in seeds[1:]),
                            results[(p.name, name, seeds[0])])
        for p in points for name in names
    }
    lines += ["", f"## Seeds pooled ({', '.join(map(str, seeds))}): mean attempts / headroom "
              "mean; * = meets both targets in every seed", "",
              "| point | " + " | ".join(names) + " |", "|---|" + "---|" * len(names)]
    for p in points:
        row = []
        for name in names:
            star = "*" if all(results[(p.name, name, s)].meets for s in seeds) else ""
            row.append(pooled[(p.name, name)].cell() + star)
        lines.append(f"| {p.name} | " + " | ".join(row) + " |")
    lines += ["", "## Seeds pooled, split by the first failure (OOM: capture / warmup; small: "
              "kv_too_small / hybrid state cache); n: mean attempts / headroom mean", "",
              "| point | " + " | ".join(f"{n} OOM | {n} small" for n in names) + " |",
              "|---|" + "---|" * (2 * len(names))]
    for p in points:
        lines.append(
            f"| {p.name} | " + " | ".join(pooled[(p.name, n)].split() for n in names) + " |"
        )
    lines += ["", "## Pareto frontier per family (seeds pooled; mean attempts, headroom mean)"]
    for name in names:
        for label, keep in (("priors", False), ("with oracles", True)):
            items = [
                (p.name, pooled[(p.name, name)].mean_after, pooled[(p.name, name)].mean_headroom)
                for p in points
                if (keep or not p.oracle) and pooled[(p.name, name)].all_converged
            ]
            front = pareto(items)
            lines.append(
                f"- {name}, {label}: "
                + ", ".join(f"{n} ({a:.2f}, {h:.3f})" for n, a, h in front)
            )
    lines += ["", "## Does any point meet both targets?"]
    for name in names:
        for label, keep in (("priors", False), ("oracles", True)):
            cand = [p for p in points if p.oracle == keep]
            if not cand:
                continue
            every = [p.name for p in cand
                     if all(results[(p.name, name, s)].meets for s in seeds)]
            pool_ok = [p.name for p in cand if pooled[(p.name, name)].meets]
            best_a = min(cand, key=lambda p: pooled[(p.name, name)].mean_after)
            best_h = min(cand, key=lambda p: pooled[(p.name, name)].mean_headroom)
            lines.append(
                f"- {name} ({label}): every seed: {', '.join(every) or 'none'}; pooled: "
                f"{', '.join(pool_ok) or 'none'}; lowest mean attempts "
                f"{pooled[(best_a.name, name)].mean_after:.2f} ({best_a.name}, headroom "
                f"{pooled[(best_a.name, name)].mean_headroom:.3f}); lowest headroom "
                f"{pooled[(best_h.name, name)].mean_headroom:.3f} ({best_h.name}, mean "
                f"{pooled[(best_h.name, name)].mean_after:.2f})"
            )
    lines += ["", "## Best mean attempts among the points that meet the headroom target in every "
              "seed (convergence too)"]
    for name in names:
        for label, keep in (("priors", False), ("oracles", True)):
            ok = [
                p for p in points
                if p.oracle == keep and all(
                    results[(p.name, name, s)].all_converged
                    and results[(p.name, name, s)].mean_headroom <= TARGET_HEADROOM
                    for s in seeds
                )
            ]
            if not ok:
                lines.append(f"- {name} ({label}): none")
                continue
            best = min(ok, key=lambda p: pooled[(p.name, name)].mean_after)
            per_seed = ", ".join(f"{results[(best.name, name, s)].mean_after:.2f}" for s in seeds)
            lines.append(
                f"- {name} ({label}): {best.name}, pooled {pooled[(best.name, name)].cell()} "
                f"(per seed {per_seed})"
            )
    lines += ["", "## A floor no prior moves: pool-too-small first, no fraction starts at the "
              "starting graph bs", ""]
    for name in names:
        failed, blind_n = blind.get(name, (0, 0))
        if failed:
            lines.append(
                f"- {name}: {blind_n} of {failed} runs; mean attempts >= 2 + {blind_n}/{failed} "
                f"= {2 + blind_n / failed:.2f} for a policy that keeps the graph bs after a "
                "pool-too-small error"
            )
    for (pname, name), seqs in sorted(trails.items()):
        lines += ["", f"## {pname}, {name}: runs that took more than one relaunch "
                  f"(seeds pooled, {sum(seqs.values())} runs)"]
        lines += [f"  {k:4d}  {seq}" for seq, k in seqs.most_common(12)]
    return lines


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0] if __doc__ else None)
    parser.add_argument("--n", type=int, default=200, help="scenarios per family (default 200)")
    parser.add_argument("--seeds", default="1,2,3", help="comma list of seeds (default 1,2,3)")
    parser.add_argument("--family", default=None, help=f"comma list of {', '.join(FAMILIES)}")
    parser.add_argument("--points", default=None, help="comma list of point names (default all)")
    parser.add_argument("--floor", type=float, default=0.5, help="fraction floor (default 0.5)")
    parser.add_argument("--ceiling", type=float, default=0.95, help="fraction ceiling (0.95)")
    parser.add_argument("--max-attempts", type=int, default=8, help="attempt cap (default 8)")
    parser.add_argument(
        "--trails", default="shipped,oracle-warmup+later",
        help="points whose extra-attempt outcome sequences are printed",
    )
    args = parser.parse_args(argv)
    problems = check_patch_points()
    if problems:
        print("a patch would not reach the policy:\n  " + "\n  ".join(problems), file=sys.stderr)
        return 2
    names = FAMILIES if args.family is None else tuple(args.family.split(","))
    by_name = {p.name: p for p in POINTS}
    points = list(by_name) if args.points is None else args.points.split(",")
    for flag, given, known in (("--family", names, FAMILIES), ("--points", points, by_name)):
        unknown = [x for x in given if x not in known]
        if unknown:
            parser.error(f"{flag}: unknown {', '.join(unknown)} (one of {', '.join(known)})")
    try:
        seeds = [int(s) for s in args.seeds.split(",")]
    except ValueError:
        parser.error(f"--seeds: {args.seeds!r} is not a comma list of integers")
    wanted = tuple(by_name[x] for x in points)
    show = set(args.trails.split(",")) if args.trails else set()
    bounds = Bounds(args.floor, args.ceiling, 1, args.max_attempts)
    began = time.perf_counter()
    print(
        f"what-if sweep of launcher.memory.policy's priors (shipped policy unchanged): families "
        f"{', '.join(names)}, seeds {', '.join(map(str, seeds))}, n={args.n}, fraction in "
        f"[{args.floor:.2f}, {args.ceiling:.2f}], max_attempts {args.max_attempts}",
        flush=True,
    )
    results: dict[tuple[str, str, int], Figures] = {}
    trails: dict[tuple[str, str], Counter[str]] = {}
    blind: dict[str, tuple[int, int]] = {}
    for seed in seeds:
        for name in names:
            t0 = time.perf_counter()
            fam = load(name, seed, args.n, bounds)
            failed, blind_n = blind.get(name, (0, 0))
            blind[name] = (failed + sum(t.feasible and t.first in FIXABLE for t in fam.truths),
                           blind_n + len(blind_runs(fam.truths)))
            for p in wanted:
                scored = measure(p, fam, bounds)
                results[(p.name, name, seed)] = figures(scored)
                if p.name in show:
                    trails.setdefault((p.name, name), Counter()).update(extra_trails(scored))
            print(f"  seed {seed} {name}: {time.perf_counter() - t0:.1f} s", flush=True)
    if not is_shipped():
        print("the shipped policy functions were not restored", file=sys.stderr)
        return 3
    print("\n".join(report(wanted, names, seeds, results, trails, blind)))
    print(f"\n({time.perf_counter() - began:.1f} s)")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
