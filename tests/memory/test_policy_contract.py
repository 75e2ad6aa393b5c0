"""Contract tests of the OOM policy: each states one rule of ``launcher.memory.policy``
and checks it with numbers worked out by hand from the rule (the module docstring's formulas and
SGLang's own figures), never copied from what the code returned.

Module constants (``KV_CUSHION``, ``KV_GROWTH``, ``ROUNDING_GIB``, ``DEFAULT_STEP_GIB``) are not
mutated by mutmut; the tests below are placed so that another value of them changes a result.
"""

from __future__ import annotations

from dataclasses import replace

import pytest

from launcher.errors import PolicyError
from launcher.memory.policy import (
    ASSUMED_GRAPH_BS,
    ASSUMED_MEM_FRACTION,
    AttemptRecord,
    Bounds,
    Decision,
    capture_oom_ladder,
    next_params,
    resolve_params,
)
from launcher.params import LaunchParams
from launcher.sglang.outcome import Numbers, Outcome
from launcher.sglang.phases import Phase

CAPTURE = (Outcome.OOM_GRAPH_CAPTURE, Phase.CUDA_GRAPH)
TOO_SMALL = (Outcome.KV_TOO_SMALL, Phase.KV_CACHE)
WARMUP = (Outcome.OOM_RUNTIME, Phase.WARMUP)
HANG = (Outcome.HANG, Phase.WEIGHTS)
READY = (Outcome.READY, Phase.READY)


def rec(params: LaunchParams, kind: tuple[Outcome, Phase], **numbers: object) -> AttemptRecord:
    return AttemptRecord(params, kind[0], kind[1], Numbers(**numbers))  # type: ignore[arg-type]


def nxt(*history: AttemptRecord, bounds: Bounds | None = None, **kw: str | int) -> Decision:
    return next_params(history[0].params, bounds or Bounds(), list(history), **kw)  # type: ignore[arg-type]


def proposal(decision: Decision) -> tuple[float, int]:
    """(mem_fraction_static, cuda_graph_max_bs) of a decision that did not give up."""
    assert decision.params is not None, decision.reason
    mfs, bs = decision.params.mem_fraction_static, decision.params.cuda_graph_max_bs
    assert mfs is not None and bs is not None
    return mfs, bs


# --- Bounds validation -----------------------------------------------------------------------


@pytest.mark.parametrize(
    "bounds",
    [
        Bounds(0.5, 1.0),  # the ceiling may be 1 itself
        Bounds(0.001, 0.002),  # any floor above 0, below the ceiling
        Bounds(graph_bs_floor=1, max_attempts=1),  # the smallest legal bs floor and attempts
    ],
)
def test_legal_bounds_are_accepted(bounds: Bounds) -> None:
    """Bounds with 0 < floor < ceiling <= 1, graph_bs_floor >= 1 and max_attempts >= 1 are
    accepted by next_params and capture_oom_ladder."""
    assert next_params(LaunchParams(0.6, 8), bounds, []).params == LaunchParams(0.6, 8)
    capture_oom_ladder(LaunchParams(0.6, 8), bounds, gpu_total_gib=None, tp=1,
                       sglang_version="0.5.23")


@pytest.mark.parametrize(
    ("floor", "ceiling"), [(0.0, 0.9), (-0.1, 0.9), (0.8, 0.8), (0.9, 0.8), (0.5, 1.001)]
)
def test_fraction_bounds_outside_0_floor_ceiling_1_are_refused(
    floor: float, ceiling: float
) -> None:
    """The fractions must satisfy 0 < floor < ceiling <= 1: otherwise a PolicyError names both
    values and the [policy] keys to fix, from next_params and capture_oom_ladder alike."""
    bounds = Bounds(floor, ceiling)
    message = (f"bounds need 0 < mem_fraction_floor ({floor}) < mem_fraction_ceiling "
               f"({ceiling}) <= 1")
    for call in (
        lambda: next_params(LaunchParams(), bounds, []),
        lambda: capture_oom_ladder(LaunchParams(), bounds, gpu_total_gib=80.0, tp=1,
                                   sglang_version="0.5.23"),
    ):
        with pytest.raises(PolicyError) as caught:
            call()
        assert caught.value.args == (message,)
        assert caught.value.remedy == "fix [policy] mem_fraction_floor / mem_fraction_ceiling"


@pytest.mark.parametrize(("bs_floor", "attempts"), [(0, 6), (1, 0), (-1, -1)])
def test_graph_bs_floor_and_max_attempts_below_1_are_refused(bs_floor: int, attempts: int) -> None:
    """graph_bs_floor and max_attempts must be at least 1; the error names both values."""
    with pytest.raises(PolicyError) as caught:
        next_params(LaunchParams(), Bounds(graph_bs_floor=bs_floor, max_attempts=attempts), [])
    assert caught.value.args == (
        f"bounds need graph_bs_floor >= 1 and max_attempts >= 1, got {bs_floor} and {attempts}",
    )
    assert caught.value.remedy == "fix [policy] graph_bs_floor / max_attempts"


# --- the fraction an auto launch ran with, from the pool figures ------------------------------


def test_auto_fraction_is_derived_from_the_pool_figures_when_the_log_prints_none() -> None:
    """SGLang's pool takes mfs x pre and leaves (1 - mfs) x pre: with ``Load weight begin``
    avail 80.00 and ``Memory pool end`` avail 12.30, an auto launch ran at 1 - 12.30/80.00 =
    0.84625, i.e. 0.846 on the policy's thousandths grid (not 0.8462 or 0.8463)."""
    numbers = Numbers(pre_load_avail_gib=80.0, pool_end_avail_gib=12.3, total_gib=93.0)
    assert resolve_params(LaunchParams(None, 64), numbers) == (0.846, 64)
    # Another pair, so that no single ratio can pass by accident: 1 - 30/50 = 0.4.
    assert resolve_params(LaunchParams(None, 8), Numbers(
        pre_load_avail_gib=50.0, pool_end_avail_gib=30.0)) == (0.4, 8)


def test_the_pool_figures_do_not_override_an_explicit_or_printed_fraction() -> None:
    """An explicit fraction wins over everything; then the server_args dump's value; the pool
    figures only stand in when neither is known."""
    pool = dict(pre_load_avail_gib=80.0, pool_end_avail_gib=12.3)
    assert resolve_params(LaunchParams(0.7, 64), Numbers(**pool)) == (0.7, 64)  # type: ignore[arg-type]
    printed = Numbers(mem_fraction_static=0.81, **pool)  # type: ignore[arg-type]
    assert resolve_params(LaunchParams(None, 64), printed) == (0.81, 64)


@pytest.mark.parametrize(
    "numbers",
    [
        Numbers(pre_load_avail_gib=80.0),  # no pool end: nothing to derive
        Numbers(pool_end_avail_gib=12.3),  # no pre-load figure
        Numbers(pre_load_avail_gib=0.0, pool_end_avail_gib=12.3),  # a zero pre-load says nothing
    ],
)
def test_without_both_pool_figures_the_fraction_is_sglangs_fallback(numbers: Numbers) -> None:
    """Half a pair (or a pre-load of 0) derives nothing: with no GPU size either, SGLang's
    unknown-GPU values (0.88, 160) are what an auto launch ran with."""
    assert resolve_params(LaunchParams(), numbers) == (ASSUMED_MEM_FRACTION, ASSUMED_GRAPH_BS)


def test_a_derived_fraction_is_the_one_the_policy_steps_down_from() -> None:
    """An auto launch that OOMed in capture without any OOM figures: the policy steps down by
    SGLang's 0.05 from the fraction the pool figures imply (0.846 -> 0.796), not from the auto
    table's value."""
    numbers = dict(pre_load_avail_gib=80.0, pool_end_avail_gib=12.3, total_gib=93.0,
                   cuda_graph_max_bs=64)
    decision = nxt(rec(LaunchParams(), CAPTURE, **numbers))
    assert proposal(decision) == (0.796, 64)
    assert decision.reason.endswith("fraction 0.846→0.796, graph bs 64 kept")


# --- attempts are counted since the last ready one ---------------------------------------------


@pytest.mark.parametrize(
    ("kinds", "max_attempts", "gives_up"),
    [
        ([HANG, HANG], 2, True),  # two attempts, none ready: the budget of 2 is spent
        ([HANG], 2, False),
        ([HANG, READY, HANG], 2, False),  # one attempt since the ready one
        ([HANG, READY, HANG, HANG], 2, True),  # two since the ready one
        ([HANG, HANG, HANG, READY, HANG], 2, False),  # earlier failures do not count
        ([READY, HANG, HANG], 3, False),
        ([READY, READY, HANG, HANG, HANG], 3, True),
    ],
)
def test_max_attempts_counts_the_attempts_since_the_last_ready_one(
    kinds: list[tuple[Outcome, Phase]], max_attempts: int, gives_up: bool
) -> None:
    """A ready attempt resets the count: the policy gives up once ``max_attempts`` attempts
    have run since the last ready one (or since the start), and says how many."""
    p = LaunchParams(0.8, 32)
    decision = nxt(*(rec(p, kind) for kind in kinds), bounds=Bounds(max_attempts=max_attempts))
    if gives_up:
        assert decision.params is None
        assert decision.reason == (
            f"gave up after {max_attempts} attempts (max_attempts), last hang at "
            f"{LaunchParams(0.8, 32).describe()}; raise [policy] max_attempts, or the model "
            "needs more GPUs (higher tp) or a quantized model"
        )
    else:
        assert decision == Decision(p, "hang: retry with the same settings")


# --- kv too small: SGLang's minimum or the weights, plus KV_CUSHION ------------------------------


def test_kv_too_small_goes_to_the_stated_minimum_plus_the_cushion() -> None:
    """0.5.23 states the minimum viable fraction: the next one is that plus KV_CUSHION (0.02),
    rounded up to a thousandth: 0.648 + 0.02 = 0.668 (0.688 with a 0.04 cushion, 0.649 with
    none), the graph bs kept."""
    decision = nxt(rec(LaunchParams(0.6, 32), TOO_SMALL, min_mem_fraction=0.648))
    assert proposal(decision) == (0.668, 32)
    assert decision.reason == (
        "KV cache too small, SGLang's minimum 0.6480; fraction 0.600→0.668, graph bs 32 kept"
    )


def test_kv_too_small_without_a_minimum_goes_to_the_weights_plus_a_cushion_of_pre() -> None:
    """0.5.6 says only "Not enough memory". The pool is mfs x pre - weights: weights 50.00
    (pre-load 80.00 less 30.00 after load) leave -2.00 GiB at 0.60. The next fraction leaves
    KV_CUSHION x pre = 1.60 GiB: (50.00 + 1.60) / 80.00 = 0.645."""
    decision = nxt(rec(LaunchParams(0.6, 32), TOO_SMALL, pre_load_avail_gib=80.0,
                       post_weights_avail_gib=30.0))
    assert proposal(decision) == (0.645, 32)
    assert decision.reason == "KV cache too small; fraction 0.600→0.645, graph bs 32 kept"


def test_the_weights_figure_may_come_from_the_load_lines_mem_usage() -> None:
    """Without the avail figure after load, ``Load weight end ... mem usage`` is the weights:
    (50.00 + 0.02 x 80.00) / 80.00 = 0.645 again."""
    decision = nxt(rec(LaunchParams(0.6, 32), TOO_SMALL, pre_load_avail_gib=80.0,
                       weights_gib=50.0))
    assert proposal(decision) == (0.645, 32)


def test_kv_too_small_takes_the_higher_of_the_minimum_and_the_weights_rule() -> None:
    """Both figures known: whichever needs more. Minimum 0.630 + 0.02 = 0.650 beats the
    weights' 0.645; minimum 0.600 + 0.02 = 0.620 does not."""
    weights = dict(pre_load_avail_gib=80.0, post_weights_avail_gib=30.0)
    assert proposal(nxt(rec(LaunchParams(0.55, 32), TOO_SMALL, min_mem_fraction=0.63,
                            **weights))) == (0.65, 32)
    assert proposal(nxt(rec(LaunchParams(0.55, 32), TOO_SMALL, min_mem_fraction=0.60,
                            **weights))) == (0.645, 32)


@pytest.mark.parametrize(("ratio", "expected"), [(None, 0.686), (0.5, 0.678)])
def test_a_hybrids_cushion_grows_with_its_state_share(ratio: float | None, expected: float) -> None:
    """A hybrid's state cache takes r / (1 + r) of the pool first, so its cushion is
    KV_CUSHION x (1 + r): with SGLang's default r = 0.9, 0.648 + 0.038 = 0.686; with r = 0.5
    from the params, 0.648 + 0.030 = 0.678."""
    p = LaunchParams(0.6, 32, mamba_full_memory_ratio=ratio)
    assert proposal(nxt(rec(p, TOO_SMALL, min_mem_fraction=0.648, mamba_cache_size=100))) == (
        expected, 32)


@pytest.mark.parametrize(
    ("version", "shown", "expected"),
    [
        ("0.5.10", "no_buffer", 0.668),  # every model's dump: server_args.py:964-967
        ("0.5.10", "extra_buffer", 0.686),
        ("0.5.23", "auto", 0.668),  # kept for models without Mamba state
        ("0.5.23", "no_buffer", 0.686),  # only a hybrid resolves auto
        ("0.5.23", None, 0.668),
    ],
)
def test_only_a_strategy_a_hybrid_resolves_to_makes_the_hybrid_cushion(
    version: str, shown: str | None, expected: float
) -> None:
    """The args dump always carries the Mamba strategy: 0.5.10 turns ``auto`` into
    ``no_buffer`` for every model, 0.5.23 keeps ``auto`` for non-hybrids. Only a value a hybrid
    resolves to (or a Mamba line, or a Mamba knob in the params) gets the hybrid cushion
    (0.648 + 0.038); a plain model keeps 0.648 + 0.02."""
    p = LaunchParams(0.6, 32)
    decision = nxt(rec(p, TOO_SMALL, min_mem_fraction=0.648, mamba_strategy=shown),
                   sglang_version=version)
    assert proposal(decision) == (expected, 32)
    knob = LaunchParams(0.6, 32, mamba_strategy="no_buffer")
    assert proposal(nxt(rec(knob, TOO_SMALL, min_mem_fraction=0.648, mamba_strategy=shown),
                        sglang_version=version))[0] == 0.686


def test_kv_too_small_stays_below_the_ceiling_and_gives_up_above_it() -> None:
    """The cushion never takes the fraction above the ceiling: minimum 0.94 + 0.02 is capped at
    the ceiling 0.95; a minimum of 0.95 itself leaves nothing, which gives up naming the
    bound."""
    assert proposal(nxt(rec(LaunchParams(0.9, 32), TOO_SMALL, min_mem_fraction=0.94))) == (
        0.95, 32)
    decision = nxt(rec(LaunchParams(0.9, 32), TOO_SMALL, min_mem_fraction=0.95))
    assert decision.params is None
    assert decision.reason == (
        "the KV cache needs mem_fraction_static > 0.95, above the ceiling 0.950: the weights "
        "leave too little room; the model needs more GPUs (higher tp) or a quantized model"
    )


# --- runtime (warmup) OOM: the deficit, without a warmup guess ------------------------------


def test_warmup_oom_lowers_the_fraction_by_its_deficit_and_margin() -> None:
    """Warmup tried 1.20 GiB with 0.40 free of 50.00 (no capture figures): it needs 0.80 GiB
    more plus the margin max(0.1, 0.25% x 50) = 0.125: 0.85 - 0.925 / 50 = 0.8315 -> 0.831.
    The same figures without the pre-load line, over the GPU size (total 50.00), give the
    same. No warmup guess is added: the warmup's own figure is in the deficit."""
    p = LaunchParams(0.85, 32)
    for where in ("pre_load_avail_gib", "total_gib"):
        decision = nxt(rec(p, WARMUP, tried_gib=1.2, free_gib=0.4, **{where: 50.0}))
        assert proposal(decision) == (0.831, 32)


def test_capture_oom_without_pre_load_adds_the_warmup_guess_to_its_deficit() -> None:
    """A capture OOM with the same figures comes before warmup, so the warmup guess
    (2% of 50 = 1.00 GiB) is added: 0.85 - (0.80 + 0.125 + 1.00) / 50 = 0.8115 -> 0.811."""
    decision = nxt(rec(LaunchParams(0.85, 32), CAPTURE, tried_gib=1.2, free_gib=0.4,
                       total_gib=50.0))
    assert proposal(decision) == (0.811, 32)
    assert decision.reason == (
        "capture OOM: needed 1.20 GiB, 0.40 free of ? pre-load; fraction 0.850→0.811, "
        "graph bs 32 kept"
    )


def test_a_pool_found_too_small_is_grown_kv_growth_fold_before_a_bs_is_chosen() -> None:
    """After a KV pool of 1.60 GiB proved too small (0.52 x 80.00 - 40.00 weights), a useful
    pool is KV_GROWTH (4) times that, 6.40 GiB: a fraction >= 0.58. The graph model (a capture
    OOM at 0.60 / bs 32 that tried 23.80 GiB with 4.80 free) estimates about 0.562 at bs 8,
    a pool of about 5 GiB, too little; at bs 4 about 0.599. So the bs drops to 4 rather than
    propose the smaller pool (a growth of 2 would have accepted bs 8)."""
    weights = dict(pre_load_avail_gib=80.0, post_weights_avail_gib=40.0)
    oom = rec(LaunchParams(0.6, 32), CAPTURE, tried_gib=23.8, free_gib=4.8, **weights)
    small = rec(LaunchParams(0.52, 8), TOO_SMALL, **weights)
    mfs, bs = proposal(nxt(oom, small))
    assert bs == 4
    assert mfs * 80.0 - 40.0 >= 4 * (0.52 * 80.0 - 40.0)
    assert mfs < 0.6  # below the fraction that OOMed in capture


def test_kv_too_small_with_pre_load_but_no_weights_figure_rises_to_the_auto_level() -> None:
    """Too small at 0.60 with only the pre-load figure (58.00 GiB on a 62.00 GiB GPU, SGLang
    0.5.6, bs 64, tp 1): the KV need is unknown, so the next fraction keeps after the pool
    only what SGLang's auto rule keeps for this GPU. The rule reserves 512 + 8192 x 1.5 +
    64 x 2 + 1024/8 = 13056 MiB (> 60 GiB: chunk 8192), auto 1 - 13056/63488 = 0.794, keeping
    62 x 0.206 = 12.772 GiB: 1 - 12.772/58 = 0.7798 -> 0.779, above the plain 0.05 step."""
    decision = nxt(rec(LaunchParams(0.6, 64), TOO_SMALL, pre_load_avail_gib=58.0,
                       total_gib=62.0), sglang_version="0.5.6")
    assert proposal(decision) == (0.779, 64)


def test_kv_too_small_with_no_figures_steps_up_by_sglangs_advice() -> None:
    """No pre-load, no weights, no minimum: up by STEP_FRACTION (0.05), 0.60 -> 0.65, even
    when the GPU size is known (the auto level needs the pre-load figure)."""
    decision = nxt(rec(LaunchParams(0.6, 64), TOO_SMALL, total_gib=62.0), sglang_version="0.5.6")
    assert proposal(decision) == (0.65, 64)


# --- weight-load OOMs: the reasons name the figures ---------------------------------------------


def test_weights_oom_reason_names_the_load_figures_and_tp() -> None:
    """A weight-load OOM gives up with the log's figures to two decimals and the tp."""
    p = LaunchParams(0.8, 32)
    decision = nxt(AttemptRecord(p, Outcome.OOM_WEIGHTS, Phase.WEIGHTS, Numbers(
        tried_gib=1.1, free_gib=0.4, pre_load_avail_gib=78.0)), tp=4)
    assert decision == Decision(None, (
        "weights do not fit: loading needed 1.10 GiB more with 0.40 free of 78.00 pre-load "
        "per GPU at tp=4; mem-fraction cannot help, the model needs more GPUs (higher tp) or a "
        "quantized model"))


def test_init_oom_reason_names_the_free_memory_and_the_gpu_size() -> None:
    """An OOM before weight load: other processes hold the GPU; unknown figures show as ?."""
    p = LaunchParams(0.8, 32)
    decision = nxt(AttemptRecord(p, Outcome.OOM_WEIGHTS, Phase.INIT, Numbers(
        tried_gib=1.0, free_gib=0.25, total_gib=80.0)))
    assert decision == Decision(None, (
        "out of memory before weight load (0.25 GiB free of 80.00): other processes hold the "
        "GPU; free it, or the model needs more GPUs (higher tp) or a quantized model"))
    bare = nxt(AttemptRecord(p, Outcome.OOM_WEIGHTS, Phase.INIT, Numbers()))
    assert bare.reason.startswith("out of memory before weight load (? GiB free of ?)")


# --- hybrid state cache too small: SGLang's order of knobs --------------------------------------


def hybrid(params: LaunchParams, **numbers: object) -> AttemptRecord:
    return AttemptRecord(params, Outcome.HYBRID_STATE_TOO_SMALL, Phase.KV_CACHE,
                         Numbers(**numbers))  # type: ignore[arg-type]


def test_hybrid_doubles_a_configured_mamba_cache_size_and_makes_the_fraction_explicit() -> None:
    """A configured max_mamba_cache_size is doubled first (24 -> 48); an auto fraction becomes
    the value the log printed; the reason quotes the size SGLang allocated."""
    p = LaunchParams(None, 48, max_mamba_cache_size=24)
    decision = nxt(hybrid(p, mamba_cache_size=30, mem_fraction_static=0.8))
    assert decision == Decision(
        LaunchParams(0.8, 48, max_mamba_cache_size=48),
        "hybrid state cache too small (max_mamba_cache_size=30); max_mamba_cache_size 24→48",
    )


@pytest.mark.parametrize(("bs", "running"), [(64, 21), (None, 21), (64, 9), (4, 40)])
def test_hybrid_never_touches_the_running_requests_or_the_graph_bs(
    bs: int | None, running: int
) -> None:
    """Without a configured cache size SGLang's state-cache sizing does not read
    max_running_requests (here from the log): it is left alone, the graph bs too; without the
    error's figures the fraction rises by STEP_FRACTION (0.05), made explicit."""
    decision = nxt(hybrid(LaunchParams(None, bs), max_running_requests=running,
                          mem_fraction_static=0.8))
    assert decision == Decision(
        LaunchParams(0.85, bs), "hybrid state cache too small; fraction 0.800→0.850"
    )


@pytest.mark.parametrize(
    ("per_req_mib", "k", "spec_tokens", "strategy", "new"),
    [
        # (5 x 8 - 0 + 1) x 0.5 GiB x 1.9 / 0.9 / 100 = 0.4328 -> 0.5 + 0.4328 = 0.933
        (512.0, 0, None, "extra_buffer", 0.933),
        # no_buffer: 3 slots per request: (24 + 1) x 0.5 x 1.9 / 0.9 / 100 = 0.2639 -> 0.764
        (512.0, 0, None, "no_buffer", 0.764),
        # 4 draft tokens: a slot is 0.25 x (1 + 4/5) GiB: (40 + 10 + 1) x 0.45 x 1.9 / 0.9
        # / 100 = 0.4845 -> capped at the ceiling 0.95
        (256.0, -10, 4, "auto", 0.95),
        # K = 30 of 40: (40 - 30 + 1) x 0.25 x 1.8 x 1.9 / 0.9 / 100 = 0.1045 -> 0.605
        (256.0, 30, 4, "extra_buffer", 0.605),
        # speculative, draft tokens not in the dump: SGLang's auto 4, the same 0.605
        (256.0, 30, 0, "extra_buffer", 0.605),
    ],
)
def test_hybrid_state_error_raises_the_fraction_to_hold_eight_requests(
    per_req_mib: float, k: int, spec_tokens: int | None, strategy: str, new: float
) -> None:
    """Slots per request by strategy (extra_buffer with overlap 5, no_buffer 3; auto is
    extra_buffer), a slot's state ``per_req x (1 + D / slots)`` with D draft tokens, the rest
    ``(1 + 0.9) / 0.9`` times the state, over pre (100 GiB); rounded up, capped at 0.95."""
    numbers = {"mamba_cache_size": k, "mamba_per_req_mib": per_req_mib,
               "pre_load_avail_gib": 100.0, "mamba_strategy": strategy}
    if spec_tokens is not None:
        numbers |= {"speculative_algorithm": "EAGLE",
                    "speculative_num_draft_tokens": spec_tokens or None}
    decision = nxt(hybrid(LaunchParams(0.5, 32), **numbers))
    assert decision.params == LaunchParams(new, 32)


def test_hybrid_state_error_uses_the_configured_mamba_full_memory_ratio() -> None:
    """The state cache gets ``r / (1 + r)`` of the rest: with r = 1.9, (40 - 4 + 1) x 0.5 x
    1.8 x 2.9 / 1.9 / 100 = 0.5083 above 0.2 -> 0.709 (0.903 at the default 0.9)."""
    numbers = {"mamba_cache_size": 4, "mamba_per_req_mib": 512.0, "pre_load_avail_gib": 100.0,
               "mamba_strategy": "extra_buffer", "speculative_algorithm": "EAGLE",
               "speculative_num_draft_tokens": 4}
    assert nxt(hybrid(LaunchParams(0.2, 32), **numbers)).params == LaunchParams(0.903, 32)
    ratio = LaunchParams(0.2, 32, mamba_full_memory_ratio=1.9)
    assert nxt(hybrid(ratio, **numbers)).params == replace(ratio, mem_fraction_static=0.709)


@pytest.mark.parametrize(("mfs", "new"), [(0.6, 0.65), (0.93, 0.95), (0.949, 0.95)])
def test_hybrid_at_8_running_requests_raises_the_fraction_to_the_ceiling(
    mfs: float, new: float
) -> None:
    """At 8 running requests (or none known, without speculative decoding) the fraction goes
    up by STEP_FRACTION (0.05), capped at the ceiling 0.95."""
    for p in (LaunchParams(mfs, 8, max_running_requests=8), LaunchParams(mfs, 8)):
        decision = nxt(hybrid(p, mamba_cache_size=5))
        assert decision == Decision(
            LaunchParams(new, 8, max_running_requests=p.max_running_requests),
            f"hybrid state cache too small (max_mamba_cache_size=5); fraction {mfs:.3f}→"
            f"{new:.3f}",
        )


def test_hybrid_at_the_ceiling_gives_up() -> None:
    """At the ceiling with 8 running requests nothing is left to turn: give up."""
    decision = nxt(hybrid(LaunchParams(0.95, 8, max_running_requests=8)))
    assert decision == Decision(None, (
        "hybrid state cache too small at mem_fraction_static 0.950, the ceiling; the model "
        "needs more GPUs (higher tp) or a quantized model"))


def test_auto_params_resolve_from_the_callers_gpu_size_when_the_log_has_none() -> None:
    """Without a GPU size in the log, the caller's ``gpu_total_gib`` feeds SGLang's auto rules:
    80 GiB at tp 4 on 0.5.6 is bs 512 (tp >= 4, 60-160 GiB); SGLang reserves 512 + 8192 x 1.5
    + 512 x 2 + 4/8 x 1024 = 14336 MiB, so the fraction is (81920 - 14336) / 81920 = 0.825."""
    assert resolve_params(LaunchParams(), Numbers(), gpu_total_gib=80.0, tp=4,
                          sglang_version="0.5.6") == (0.825, 512)


def test_a_ready_or_transient_relaunch_keeps_explicit_params_over_printed_ones() -> None:
    """Explicit params are relaunched as they are (a printed value only fills an auto one)."""
    p = LaunchParams(0.8, 32)
    for kind in (READY, HANG):
        shown = rec(p, kind, mem_fraction_static=0.7, cuda_graph_max_bs=16)
        assert nxt(shown).params == p
        assert nxt(rec(p, kind)).params == p
    half = rec(LaunchParams(None, 32), READY, mem_fraction_static=0.7, cuda_graph_max_bs=16)
    assert nxt(half).params == LaunchParams(0.7, 32)


# --- the graph model's figures, rounding included ----------------------------------------------
#
# SGLang prints GiB to two decimals, so each figure may be up to ROUNDING_GIB (0.005) off; the
# policy counts every figure in the direction that needs more memory. On a pre-load of 100 GiB
# (margin 0.25, warmup guess 2.00) with the pool ending at 20.00 and capture beginning at
# ``start``, the estimate at bs 32 (8 captured sizes) is 1 - need / 100 with
#     need = hidden + graphs(32) + warmup + 0.25,  hidden = max(0, 20.00 - start - 0.005).
# Each pair of cases puts ``need`` at exactly 23.30 GiB (0.767: one more hundredth of a GiB
# anywhere and it is 0.766) and at 23.31 (0.766: one hundredth less and it is 0.767).
_POOL = dict(pre_load_avail_gib=100.0, post_weights_avail_gib=60.0, pool_end_avail_gib=20.0,
             total_gib=110.0)


@pytest.mark.parametrize(
    ("kind", "figures", "expected"),
    [
        # First capture step failed: graphs = (tried + 0.005) + 8 x DEFAULT_STEP_GIB (0.02);
        # start 19.99: hidden 0.005; need = 0.005 + 20.885 + 0.16 + 2.25 = 23.30.
        (CAPTURE, dict(graph_begin_avail_gib=19.99, tried_gib=20.88, free_gib=19.5), 0.767),
        (CAPTURE, dict(graph_begin_avail_gib=19.99, tried_gib=20.89, free_gib=19.5), 0.766),
        # Step 5 of 8 failed: c = tried + 0.005 = 0.505; the four steps before consumed
        # start - last + 0.01, of which 4 x tried were later steps: a x 32 = 20 - last + 0.01
        # - 2; graphs = a x 32 + 8c; need = 19.01 - last + 4.04 + 2.25 = 24.30 - last.
        (CAPTURE, dict(graph_begin_avail_gib=20.0, graph_last_avail_gib=1.0, graph_last_bs=8,
                       graph_steps_done=4, graph_steps_total=8, tried_gib=0.5, free_gib=0.3),
         0.767),
        (CAPTURE, dict(graph_begin_avail_gib=20.0, graph_last_avail_gib=0.99, graph_last_bs=8,
                       graph_steps_done=4, graph_steps_total=8, tried_gib=0.5, free_gib=0.3),
         0.766),
        # The same from the pool-end figure alone (0.5.6 prints no capture begin line).
        (CAPTURE, dict(graph_last_avail_gib=1.0, graph_last_bs=8, graph_steps_done=4,
                       graph_steps_total=8, tried_gib=0.5, free_gib=0.3), 0.767),
        # Warmup OOM after all graphs: graphs = start - free + 0.01 exactly, warmup = tried +
        # 0.005; start 19.99 (hidden 0.005): need = 0.005 + 19.60 + 3.445 + 0.25 = 23.30.
        (WARMUP, dict(graph_begin_avail_gib=19.99, graph_last_avail_gib=0.5, graph_last_bs=1,
                      graph_steps_done=8, graph_steps_total=8, tried_gib=3.44, free_gib=0.4),
         0.767),
        (WARMUP, dict(graph_begin_avail_gib=19.99, graph_last_avail_gib=0.5, graph_last_bs=1,
                      graph_steps_done=8, graph_steps_total=8, tried_gib=3.45, free_gib=0.4),
         0.766),
    ],
)
def test_graph_model_counts_each_printed_figure_at_its_rounding_bound(
    kind: tuple[Outcome, Phase], figures: dict[str, float], expected: float
) -> None:
    """The estimate at an unchanged bs from one OOM's figures, to the thousandth."""
    decision = nxt(rec(LaunchParams(0.8, 32), kind, **_POOL, **figures))
    assert proposal(decision) == (expected, 32)


def test_a_later_step_oom_without_the_progress_figure_falls_back_to_the_deficit() -> None:
    """Without the last progress bar's free memory the first step's size is unknown: the plain
    deficit rule, 0.80 - (0.50 - 0.30 + 0.25 margin + 2.00 warmup guess) / 100 = 0.7755 ->
    0.775."""
    figures = dict(graph_begin_avail_gib=20.0, graph_last_bs=8, graph_steps_done=4,
                   graph_steps_total=8, tried_gib=0.5, free_gib=0.3)
    assert proposal(nxt(rec(LaunchParams(0.8, 32), CAPTURE, **_POOL, **figures))) == (0.775, 32)


@pytest.mark.parametrize(("before", "ceiling"), [((), 0.95), ((0.9,), 0.899)])
def test_once_a_real_pool_proved_too_small_the_most_the_brackets_allow_is_tried(
    before: tuple[float, ...], ceiling: float
) -> None:
    """Too small at 0.63 with weights 50.00 of 80.00: the pool was 0.63 x 80 - 50 = 0.40 GiB,
    more than nothing, so the KV need is unknown: the next fraction is the most the brackets
    allow, the ceiling 0.95, or just below a fraction that OOMed in capture at that bs (0.90)."""
    weights = dict(pre_load_avail_gib=80.0, post_weights_avail_gib=30.0)
    history = [rec(LaunchParams(m, 32), CAPTURE) for m in before]
    history.append(rec(LaunchParams(0.63, 32), TOO_SMALL, **weights))
    assert proposal(nxt(*history)) == (ceiling, 32)


def test_capture_oom_ladder_resolves_auto_params_with_the_given_tp_and_version() -> None:
    """``launcher plan``'s ladder for an auto start on an 80 GiB GPU at tp 4 on 0.5.6: SGLang's
    auto values there are bs 512 and 0.825 (see above), then 0.05 lower per capture OOM until
    max_attempts (6) attempts have run."""
    ladder = capture_oom_ladder(LaunchParams(), Bounds(), gpu_total_gib=80.0, tp=4,
                                sglang_version="0.5.6")
    assert ladder == [LaunchParams(m, 512) for m in (0.775, 0.725, 0.675, 0.625, 0.575)]


# --- the reasons a decision gives --------------------------------------------------------------


def test_reasons_name_the_oom_its_figures_and_the_change() -> None:
    """A memory decision's reason names the kind of OOM, the log's figures to two decimals
    (with the capture start for a capture OOM), and the fraction and bs change."""
    capture = rec(LaunchParams(0.8, 32), CAPTURE, **_POOL, graph_begin_avail_gib=19.99,
                  tried_gib=20.88, free_gib=19.5)
    assert nxt(capture).reason == (
        "capture OOM: needed 20.88 GiB, 19.50 free of 100.00 pre-load, 19.99 free when capture "
        "began; fraction 0.800→0.767, graph bs 32 kept")
    warmup = rec(LaunchParams(0.8, 32), WARMUP, **_POOL, graph_begin_avail_gib=19.99,
                 graph_last_avail_gib=0.5, graph_last_bs=1, graph_steps_done=8,
                 graph_steps_total=8, tried_gib=3.44, free_gib=0.4)
    assert nxt(warmup).reason == (
        "warmup OOM: needed 3.44 GiB, 0.40 free of 100.00 pre-load; fraction 0.800→0.767, "
        "graph bs 32 kept")
    pool = rec(LaunchParams(0.8, 32), (Outcome.OOM_KV_CACHE, Phase.KV_CACHE))
    assert nxt(pool).reason == (
        "KV-pool OOM: needed ? GiB, ? free of ? pre-load; fraction 0.800→0.750, graph bs 32 kept")
    halved = rec(LaunchParams(0.5, 32), CAPTURE)
    assert nxt(halved).reason == (
        "capture OOM: needed ? GiB, ? free of ? pre-load; fraction 0.500→0.500, graph bs 32→16")


def test_no_open_bracket_at_the_bs_floor_gives_up_naming_both_bounds() -> None:
    """Too small at 0.700 and a capture OOM at 0.701, both at the bs floor 1: the reason gives
    the KV bound, the graph bound and the floor."""
    small = rec(LaunchParams(0.7, 1), TOO_SMALL)
    oom = rec(LaunchParams(0.701, 1), CAPTURE)
    assert nxt(small, oom) == Decision(None, (
        "no mem_fraction_static fits even at cuda_graph_max_bs=1: the KV cache needs > 0.7, "
        "graphs and warmup OOM at >= 0.701 (floor 0.500); the model needs more GPUs (higher "
        "tp) or a quantized model, or disable CUDA graphs"))


def test_the_gpu_size_for_auto_rules_comes_from_any_earlier_attempt() -> None:
    """A capture OOM without figures after an attempt whose log showed an 80 GiB GPU: the auto
    params are resolved for that GPU (0.5.23, tp 1: bs 256; reserved 512 + 12288 + 512 + 128
    + 400 = 13840 MiB, (81920 - 13840) / 81920 = 0.831), then lowered by 0.05."""
    auto = LaunchParams()
    shown = rec(auto, HANG, total_gib=80.0)
    assert proposal(nxt(shown, rec(auto, CAPTURE))) == (0.781, 256)
    assert proposal(nxt(rec(auto, CAPTURE, total_gib=80.0), rec(auto, CAPTURE))) == (0.781, 256)


@pytest.mark.parametrize(
    ("bs", "floor", "new_bs"), [(32, 1, 16), (20, 1, 8), (33, 1, 16), (10, 6, 6), (7, 6, 6)]
)
def test_at_the_fraction_floor_the_graph_bs_halves_to_a_captured_size(
    bs: int, floor: int, new_bs: int
) -> None:
    """A capture OOM without figures at the fraction floor (0.50) keeps the fraction and takes
    the largest size SGLang captures (1, 2, 4, 8, 12, 16, 24, ...) at or below half the bs,
    never below the bs floor."""
    decision = nxt(rec(LaunchParams(0.5, bs), CAPTURE), bounds=Bounds(graph_bs_floor=floor))
    assert proposal(decision) == (0.5, new_bs)


def test_at_the_fraction_floor_and_the_bs_floor_the_policy_gives_up() -> None:
    """Nothing is left below (0.50, bs floor 6): give up, naming both bounds."""
    decision = nxt(rec(LaunchParams(0.5, 6), CAPTURE), bounds=Bounds(graph_bs_floor=6))
    assert decision == Decision(None, (
        "no mem_fraction_static fits even at cuda_graph_max_bs=6: the KV cache needs > 0.499, "
        "graphs and warmup OOM at >= 0.5 (floor 0.500); the model needs more GPUs (higher tp) "
        "or a quantized model, or disable CUDA graphs"))


# --- speculative decoding: the graph bs above the running-request cap captures nothing ----------


def test_spec_capture_oom_keeps_a_graph_bs_above_the_cap_while_the_fraction_moves() -> None:
    """Under EAGLE SGLang caps running requests at 48 and captures graphs only up to that: a
    configured bs 128 is searched as 48 and, while only the fraction moves, left as it was."""
    decision = nxt(rec(LaunchParams(0.7, 128), CAPTURE, speculative_algorithm="EAGLE"))
    assert decision == Decision(LaunchParams(0.65, 128), (
        "capture OOM: needed ? GiB, ? free of ? pre-load; fraction 0.700→0.650, graph bs 48 "
        "kept; speculative params unchanged"))


@pytest.mark.parametrize(("running", "new_bs"), [(None, 24), (20, 8), (100, 48)])
def test_spec_capture_oom_at_the_floor_halves_from_the_running_request_cap(
    running: int | None, new_bs: int
) -> None:
    """At the fraction floor the bs halves from what SGLang captures: min(bs, cap), the cap
    being max_running_requests when set, else 48 under speculative decoding."""
    p = LaunchParams(0.5, 128, max_running_requests=running)
    decision = nxt(rec(p, CAPTURE, speculative_algorithm="EAGLE"))
    assert decision.params == LaunchParams(0.5, new_bs, max_running_requests=running)
    assert decision.reason.endswith(f"graph bs {min(128, running or 48)}→{new_bs}; speculative "
                                    "params unchanged")


# --- the OOM's own deficit bounds the fraction at an unchanged bs -------------------------------


def test_at_an_unchanged_bs_the_fraction_falls_by_at_least_the_ooms_deficit() -> None:
    """The first capture step tried 5.00 GiB with 1.00 free: whatever the graph model says
    (here it would allow 0.799, just under the failed 0.80), the same bs needs 4.00 GiB more
    than the attempt had, so the fraction falls by at least 4.00 / 100: 0.76."""
    figures = dict(graph_begin_avail_gib=20.0, tried_gib=5.0, free_gib=1.0)
    decision = nxt(rec(LaunchParams(0.8, 32), CAPTURE, **_POOL, **figures))
    assert proposal(decision) == (0.76, 32)



def test_a_first_step_oom_at_bs_1_still_sizes_the_graphs() -> None:
    """At bs 1 the failed first step is the whole slope (15.005 GiB per bs): the model allows
    just under the failed 0.80, and the deficit (15.00 - 14.00 = 1.00 GiB of 100) caps it at
    0.79. Without the slope it would be the plain deficit rule, 0.8 - 3.25/100 = 0.767."""
    figures = dict(graph_begin_avail_gib=20.0, tried_gib=15.0, free_gib=14.0)
    assert proposal(nxt(rec(LaunchParams(0.8, 1), CAPTURE, **_POOL, **figures))) == (0.79, 1)


@pytest.mark.parametrize(
    ("figures", "expected"),
    [
        # The capture begin line (19.50), not the pool end (20.00), is where the graphs
        # start: hidden 20 - 19.50 - 0.005 = 0.495; a x 32 = 19.50 - 1.00 + 0.01 - 4 x 0.50;
        # need = 0.495 + 16.51 + 8 x 0.505 + 2.25 = 23.295 -> 0.767 (0.762 from the pool end).
        (dict(graph_begin_avail_gib=19.5, graph_last_avail_gib=1.0), 0.767),
        # The steps before used less than the later steps' tried sizes account for: the first
        # step is taken as 0 GiB, never negative: hidden 20 - 5 - 0.005 = 14.995; consumed
        # 5.00 - 2.50 + 0.01 = 2.51, less 4 x 0.50 leaves 0.51 GiB for the first step;
        # need = 14.995 + 0.51 + 4.04 + 2.25 = 21.795 -> 0.782.
        (dict(graph_begin_avail_gib=5.0, graph_last_avail_gib=2.5), 0.782),
    ],
)
def test_later_step_oom_sizes_the_first_step_from_the_capture_begin(
    figures: dict[str, float], expected: float
) -> None:
    """A capture OOM at step 5 of 8 (tried 0.50 with 0.30 free, pre-load 100, pool end 20)."""
    steps = dict(graph_last_bs=8, graph_steps_done=4, graph_steps_total=8, tried_gib=0.5,
                 free_gib=0.3)
    decision = nxt(rec(LaunchParams(0.8, 32), CAPTURE, **_POOL, **steps, **figures))
    assert proposal(decision) == (expected, 32)


@pytest.mark.parametrize("figures", [dict(tried_gib=2.0), dict(free_gib=2.0)])
def test_half_an_oom_message_is_no_deficit(figures: dict[str, float]) -> None:
    """Only "Tried to allocate" or only "free" (a cut message) gives no deficit: SGLang's
    fixed 0.05 step, 0.80 -> 0.75, even with the GPU size known."""
    decision = nxt(rec(LaunchParams(0.8, 32), CAPTURE, total_gib=80.0, **figures))
    assert proposal(decision) == (0.75, 32)


def test_a_step_below_the_floor_stops_at_the_floor_and_halves_the_bs() -> None:
    """A capture OOM without figures at 0.52: 0.47 would cross the floor 0.50, so the bs
    halves (32 -> 16) and the fraction stops at the floor."""
    assert proposal(nxt(rec(LaunchParams(0.52, 32), CAPTURE))) == (0.5, 16)


def test_a_single_open_thousandth_at_the_bs_is_taken() -> None:
    """Too small at 0.699 and a capture OOM at 0.701 at bs 32 leave exactly 0.700 open there:
    it is proposed at bs 32 (the bs is not halved while a fraction is open)."""
    oom = rec(LaunchParams(0.701, 32), CAPTURE)
    small = rec(LaunchParams(0.699, 32), TOO_SMALL)
    assert proposal(nxt(oom, small)) == (0.7, 32)


def test_halving_takes_a_bs_where_a_single_thousandth_is_open() -> None:
    """Too small at 0.699 (bs 32), a capture OOM at 0.701 from bs 16 and one at 0.72 at bs 32:
    0.67 would be below the KV bound, so the bs halves; at 16 only 0.700 is open, and that is
    enough: (0.700, 16), not a smaller bs."""
    small = rec(LaunchParams(0.699, 32), TOO_SMALL)
    oom16 = rec(LaunchParams(0.701, 16), CAPTURE)
    oom32 = rec(LaunchParams(0.72, 32), CAPTURE)
    assert proposal(nxt(small, oom16, oom32)) == (0.7, 16)


# --- multi-pass capture: which passes are still to come ----------------------------------------


def pass_oom(params: LaunchParams, gpass: str, **numbers: object) -> AttemptRecord:
    """A first-step capture OOM in ``gpass`` (tried 5.00, 1.00 free), the only pass begun,
    on a pre-load of 100 with weights 40 and the pool ending at 20.00."""
    figures: dict[str, object] = dict(
        _POOL, graph_pass=gpass, graph_begin_avail_gib=20.0, graph_first_begin_avail_gib=20.0,
        graph_passes_begun=1, tried_gib=5.0, free_gib=1.0)
    figures.update(numbers)
    return rec(params, CAPTURE, **figures)


def test_a_plain_decode_pass_oom_expects_no_later_pass() -> None:
    """Without speculative decoding the decode pass is the last: everything since capture
    began is needed again (20.00 - 1.00), plus the 5.005 tried and the 7 remaining steps at
    0.02, two roundings, the warmup guess 2.00 and the margin 0.25: need 26.405 of 100, so
    0.73595 -> 0.735 at the same bs."""
    decision = nxt(pass_oom(LaunchParams(0.8, 32), "target_decode"), sglang_version="0.5.23")
    assert proposal(decision) == (0.735, 32)


def verify_fraction(steps: int, *, env: tuple[tuple[str, str], ...] = (),
                    version: str = "0.5.23", shown_first: bool = False) -> float:
    """The next fraction after an EAGLE target-verify capture OOM (see pass_oom)."""
    p = LaunchParams(0.8, 32, env=env)
    spec = dict(speculative_algorithm="EAGLE", speculative_num_steps=steps)
    if shown_first:  # an earlier attempt showed the speculative settings, this one did not
        history = [rec(p, HANG, **spec), pass_oom(p, "target_verify")]
    else:
        history = [pass_oom(p, "target_verify", **spec)]
    return proposal(nxt(*history, sglang_version=version))[0]


def test_the_draft_decode_pass_is_expected_only_with_more_than_one_step() -> None:
    """SGLang captures the draft decode graphs only with --speculative-num-steps > 1: after a
    target-verify OOM one step leaves room for one guessed later pass (draft extend), two or
    three steps for two, so the fraction is lower, and the same for 2 and 3."""
    one, two, three = (verify_fraction(s) for s in (1, 2, 3))
    assert one > two == three


def test_the_draft_extend_pass_is_not_expected_once_turned_off_on_0_5_23() -> None:
    """With SGLANG_DISABLE_DRAFT_EXTEND_CUDA_GRAPH=1 0.5.23 captures no draft extend graph, so
    less is reserved for later passes; 0.5.10 has no such switch and reserves the same."""
    off = (("SGLANG_DISABLE_DRAFT_EXTEND_CUDA_GRAPH", "1"),)
    assert verify_fraction(3, env=off) > verify_fraction(3)
    assert verify_fraction(3, env=off, version="0.5.10") == verify_fraction(3, version="0.5.10")


def test_speculative_decoding_shown_by_any_attempt_counts_for_later_passes() -> None:
    """A log that lacks the server_args dump is still read as speculative when an earlier
    attempt of the server showed it: the same decision as if it had shown it itself."""
    assert verify_fraction(3, shown_first=True) == verify_fraction(3)


@pytest.mark.parametrize(("version", "expected"), [("0.5.23", 0.67), ("0.5.10", 0.645)])
def test_draft_weights_count_in_the_kv_bound_from_0_5_23(version: str, expected: float) -> None:
    """0.5.23 counts the draft model's weights in the static budget: too small at 0.60 with
    weights 50.00 and draft weights 2.00 of 80.00 goes to (50 + 2 + 1.60) / 80 = 0.67; 0.5.10
    loads the draft outside it, (50 + 1.60) / 80 = 0.645."""
    decision = nxt(rec(LaunchParams(0.6, 32), TOO_SMALL, pre_load_avail_gib=80.0,
                       post_weights_avail_gib=30.0, draft_weights_gib=2.0,
                       speculative_algorithm="EAGLE"), sglang_version=version)
    assert proposal(decision) == (expected, 32)


@pytest.mark.parametrize(
    ("figures", "expected"),
    [
        # Capture figures above the (1 - 0.80) x 100 = 20 GiB SGLang leaves are capped at it:
        # the same as a capture that began at 20.00 (0.735 above).
        (dict(graph_begin_avail_gib=25.0, graph_first_begin_avail_gib=25.0), 0.735),
        # Capture began at 19.50: 0.495 GiB of the headroom was gone before it (hidden), then
        # 19.50 - 1.00 + 5.005 + 0.14 + 0.01 + 2.25 needed: 26.40 of 100 -> 0.736.
        (dict(graph_begin_avail_gib=19.5, graph_first_begin_avail_gib=19.5), 0.736),
        # Only the first begin line's figure: the failing pass is taken to begin there.
        (dict(graph_begin_avail_gib=None), 0.735),
    ],
)
def test_a_pass_oom_counts_from_where_capture_began(
    figures: dict[str, object], expected: float
) -> None:
    """A first-step OOM in the plain decode pass, with different capture-begin figures."""
    decision = nxt(pass_oom(LaunchParams(0.8, 32), "target_decode", **figures),
                   sglang_version="0.5.23")
    assert proposal(decision) == (expected, 32)


def test_a_warmup_oom_in_a_log_with_passes_takes_the_graphs_as_measured() -> None:
    """Warmup failed after the decode pass began at 20.00 and left 1.00 free: the graphs took
    19.00 GiB (+ 0.01 rounding); the warmup itself is unknown without a "Tried" figure, so the
    2.00 guess stands: need 19.01 + 2.00 + 0.25 = 21.26 -> 0.7874 -> 0.787. (A capture OOM
    without "Tried" has no pass figures to fit: SGLang's 0.05 step.)"""
    decision = nxt(pass_oom(LaunchParams(0.8, 32), "target_decode", tried_gib=None),
                   sglang_version="0.5.23")
    assert proposal(decision) == (0.75, 32)  # a capture OOM without "Tried": SGLang's step
    warmup = AttemptRecord(LaunchParams(0.8, 32), Outcome.OOM_RUNTIME, Phase.WARMUP, Numbers(
        **_POOL, graph_pass="target_decode", graph_begin_avail_gib=20.0,  # type: ignore[arg-type]
        graph_first_begin_avail_gib=20.0, graph_passes_begun=1, graph_passes_ended=1,
        free_gib=1.0))
    assert proposal(nxt(warmup, sglang_version="0.5.23")) == (0.787, 32)


def test_a_draft_decode_oom_counts_every_pass_since_capture_began_and_the_one_to_come() -> None:
    """EAGLE on 0.5.23 (3 steps, bs 32: 20 captured sizes), pre-load 100 at 0.80: target
    prefill began at 20.00, target verify at 18.00, draft decode at 10.00, whose first step
    tried 3.00 GiB with 2.50 free. By the rule: everything since the first pass began is
    needed again (20.00 - 2.50 = 17.50), plus the tried 3.005 and the pass's 19 remaining
    steps (0.38), plus the draft extend pass still to come (as large per captured token as
    the draft decode pass's first step, 3.385 - 20 x 0.02 = 2.985: SGLang 0.5.23 captures draft
    extend at the 4 draft tokens per request, draft decode at topk = 1 (its 3 steps run one
    after another, so one step's activations), so 2.985 x 4/1 = 11.94, and its 20 steps, 0.40),
    and two roundings: 33.235 GiB of graphs. With warmup 2.00 and margin 0.25: 1 -
    35.485/100 -> 0.645.

    With the floor at 0.76 the bs drops: the prefill pass (2.00) and what was gone before the
    failing pass began (7.50) stay, the decode-like passes' first steps (verify 7.60, draft
    decode 2.985, draft extend 11.94: 22.525) scale by 16/32, and 3 passes x 12 sizes x 0.02
    are steps: 9.51 + 11.2625 + 0.72 = 21.4925, so 1 - 23.7425/100 -> 0.762 at bs 16 (bs 18,
    13 sizes: 9.51 + 12.670 + 0.78 + 2.25 = 25.21, 0.748, below the floor)."""
    begins = [("target_prefill", 20.0), ("target_verify", 18.0), ("draft_decode", 10.0)]
    oom = pass_oom(LaunchParams(0.8, 32), "draft_decode", graph_begins=begins,
                   graph_begin_avail_gib=10.0, graph_passes_begun=3, tried_gib=3.0,
                   free_gib=2.5, speculative_algorithm="EAGLE", speculative_num_steps=3)
    assert proposal(nxt(oom, sglang_version="0.5.23")) == (0.645, 32)
    floor = Bounds(mem_fraction_floor=0.76)
    assert proposal(nxt(oom, sglang_version="0.5.23", bounds=floor)) == (0.762, 16)


def draft_decode_oom(**numbers: object) -> AttemptRecord:
    """The draft-decode OOM of the test above."""
    begins = [("target_prefill", 20.0), ("target_verify", 18.0), ("draft_decode", 10.0)]
    figures: dict[str, object] = dict(
        graph_begins=begins, graph_begin_avail_gib=10.0, graph_passes_begun=3, tried_gib=3.0,
        free_gib=2.5, speculative_algorithm="EAGLE", speculative_num_steps=3)
    figures.update(numbers)
    return pass_oom(LaunchParams(0.8, 32), "draft_decode", **figures)


def test_after_a_draft_decode_oom_with_draft_extend_off_no_pass_is_expected() -> None:
    """With SGLANG_DISABLE_DRAFT_EXTEND_CUDA_GRAPH=1 on 0.5.23 the draft decode pass is the
    last: the 2.985 + 0.40 GiB guessed for draft extend above are not reserved:
    need 26.53 - 3.385 = 23.145 of 100 -> 0.768."""
    off = (("SGLANG_DISABLE_DRAFT_EXTEND_CUDA_GRAPH", "1"),)
    oom = draft_decode_oom()
    oom = replace(oom, params=replace(oom.params, env=off))
    assert proposal(nxt(oom, sglang_version="0.5.23")) == (0.768, 32)


def test_an_earlier_oom_that_saw_fewer_passes_does_not_add_its_guesses() -> None:
    """An earlier OOM in the target verify pass (first step tried 15.00) guessed the draft
    passes at a quarter of its 14.985 GiB first step each. The later draft-decode OOM saw
    them: only what the earlier one saw itself (18.395 GiB) counts, below the later fit's
    24.28, so the decision is the later OOM's alone."""
    verify = pass_oom(LaunchParams(0.8, 32), "target_verify",
                      graph_begins=[("target_prefill", 20.0), ("target_verify", 18.0)],
                      graph_begin_avail_gib=18.0, graph_passes_begun=2, tried_gib=15.0,
                      free_gib=17.0, speculative_algorithm="EAGLE", speculative_num_steps=3)
    later = draft_decode_oom()
    assert nxt(verify, later, sglang_version="0.5.23") == nxt(later, sglang_version="0.5.23")


def test_a_pass_oom_without_the_free_figure_falls_back_to_the_first_step_slope() -> None:
    """Without "free" the passes cannot be split: the failed first step (5.005 GiB at bs 32,
    plus 8 x 0.02 steps) is the graph model, as in a log without passes: 1 - (5.165 + 2.25) /
    100 = 0.926 would fit, capped just below the failed 0.80 (no deficit is known)."""
    decision = nxt(pass_oom(LaunchParams(0.8, 32), "target_decode", free_gib=None),
                   sglang_version="0.5.23")
    assert proposal(decision) == (0.799, 32)


def test_a_later_step_oom_in_a_pass_scales_what_the_pass_held() -> None:
    """The plain decode pass (began at 20.00 of a 100 pre-load at 0.80) failed its second of
    8 steps trying 0.50 with 0.30 free. By the rule: what the pass held (20.00 - 0.30 =
    19.70), the tried 0.505 and the 6 remaining steps of that size (3.03), plus two
    roundings: 23.245 GiB, so 1 - 25.495/100 -> 0.745 at bs 32. Of that, the 8 steps at the
    tried size (4.04) less 8 default steps (0.16) stay fixed (3.89 with the roundings); the
    rest, 19.195, is the first step and scales with the bs. With the floor at 0.77, at bs 24:
    3.89 + 19.195 x 24/32 + 7 x 0.02 = 18.42625, 1 - 20.67625/100 -> 0.793."""
    oom = pass_oom(LaunchParams(0.8, 32), "target_decode", graph_steps_done=1,
                   graph_steps_total=8, graph_last_avail_gib=1.0, graph_last_bs=24,
                   tried_gib=0.5, free_gib=0.3)
    assert proposal(nxt(oom, sglang_version="0.5.23")) == (0.745, 32)
    floor = Bounds(mem_fraction_floor=0.77)
    assert proposal(nxt(oom, sglang_version="0.5.23", bounds=floor)) == (0.793, 24)


def test_on_0_5_10_the_draft_weights_and_pool_between_the_passes_are_not_graph_memory() -> None:
    """0.5.10 loads the draft's weights (1.00) and pool (2.00) between the target verify pass
    (began 20.00) and the draft decode pass (began 12.00), whose first step tried 10.00 with
    3.00 free (EAGLE, 3 steps, bs 32: 20 sizes). Graphs: the verify pass 20 - 12 - 3 = 5.00
    (first step 4.60 + 20 steps), the draft weights 1.00, the draft pass 12 - 3 = 9.00 gone
    plus 10.005 tried and 19 steps (0.38), draft extend to come as large per captured token
    as the draft decode first step (9.985; 0.5.10 captures draft extend at steps + 1 = 4
    tokens per request, draft decode at topk = 1, its steps one after another: 9.985 x 4/1 =
    39.94) and 20 steps, two roundings: 65.735. The pool is 2.00 at 0.80, i.e. 0.05 GiB per
    GiB of the target's pool (80 - 40), so at m it takes 0.05 (100 m - 40): (1 - m) 100 >=
    65.735 + 2.00 + 0.25 + 0.05 (100 m - 40) gives m <= 34.015/105 = 0.324, below the floor
    0.50. At bs 24 (16 sizes) the fixed 10.01 (draft weights 1.00, the 9.00 gone, two
    roundings) stays, the first steps (4.60 + 9.985 + 39.94 = 54.525) scale by 24/32 and
    3 passes x 16 x 0.02 are steps: 51.86375, m <= 47.88625/105 = 0.456, still below. At
    bs 16 (12 sizes): 10.01 + 27.2625 + 0.72 = 37.9925, m <= 61.7575/105 -> 0.588."""
    begins = [("target_verify", 20.0), ("draft_decode", 12.0)]
    oom = pass_oom(LaunchParams(0.8, 32), "draft_decode", graph_begins=begins,
                   graph_begin_avail_gib=12.0, graph_passes_begun=2, graph_passes_ended=1,
                   tried_gib=10.0, free_gib=3.0, draft_weights_gib=1.0, draft_kv_gib=2.0,
                   speculative_algorithm="EAGLE", speculative_num_steps=3)
    assert proposal(nxt(oom, sglang_version="0.5.10")) == (0.588, 16)


def test_a_graph_estimate_below_the_kv_bound_bisects_between_the_brackets() -> None:
    """A capture OOM at 0.60 / bs 32 (first step tried 23.80 with 4.80 free, weights 40.00 of
    80.00) makes even the optimistic estimate at bs 1 about 0.650, below 0.651, the bound a
    kv_too_small at 0.65 set: the estimate is wrong and says nothing. The KV figures ask for
    4 x the 12.00 GiB pool found too small, (40 + 48) / 80 = 1.10, above the ceiling, so the
    next try bisects the open bracket at bs 1: (0.651 + 0.950 + 0.001) / 2 -> 0.801."""
    weights = dict(pre_load_avail_gib=80.0, post_weights_avail_gib=40.0)
    oom = rec(LaunchParams(0.6, 32), CAPTURE, tried_gib=23.8, free_gib=4.8, **weights)
    small = rec(LaunchParams(0.65, 8), TOO_SMALL, **weights)
    assert proposal(nxt(oom, small)) == (0.801, 1)


@pytest.mark.parametrize(
    ("total", "expected"),
    [
        # 150 GiB: margin 0.25% x 150 = 0.375, warmup guess min(2.5, 2% x 150 = 3.0) = 2.5:
        # 0.85 - (0.80 + 0.375 + 2.5) / 150 = 0.8255 -> 0.825.
        (150.0, 0.825),
        # 20 GiB: margin max(0.1, 0.05) = 0.1, warmup guess max(0.5, 0.4) = 0.5:
        # 0.85 - (0.80 + 0.1 + 0.5) / 20 = 0.78.
        (20.0, 0.78),
    ],
)
def test_margin_and_warmup_guess_are_bounded(total: float, expected: float) -> None:
    """The safety margin is 0.25% of the memory but at least 0.1 GiB; the warmup guess 2% but
    within 0.5-2.5 GiB (a capture OOM over the GPU size, tried 1.20 with 0.40 free)."""
    decision = nxt(rec(LaunchParams(0.85, 32), CAPTURE, tried_gib=1.2, free_gib=0.4,
                       total_gib=total))
    assert proposal(decision) == (expected, 32)


def test_a_small_warmup_figure_is_taken_as_printed() -> None:
    """A warmup OOM that tried only 0.50 GiB (0.40 free): the warmup need is 0.505, not a
    floor. Graphs 19.99 - 0.40 + 0.01 = 19.60, hidden 0.005: need = 0.005 + 19.60 + 0.505 +
    0.25 = 20.36 of 100 -> 0.796."""
    figures = dict(graph_begin_avail_gib=19.99, graph_last_avail_gib=0.5, graph_last_bs=1,
                   graph_steps_done=8, graph_steps_total=8, tried_gib=0.5, free_gib=0.4)
    assert proposal(nxt(rec(LaunchParams(0.8, 32), WARMUP, **_POOL, **figures))) == (0.796, 32)
