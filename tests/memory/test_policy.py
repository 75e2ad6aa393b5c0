"""Unit tests of the OOM policy (``next_params``, ``capture_oom_ladder``) and of ``observed``."""

from __future__ import annotations

import itertools
from dataclasses import replace
from pathlib import Path

import pytest

from launcher.errors import PolicyError
from launcher.memory.policy import (
    ASSUMED_GRAPH_BS,
    ASSUMED_MEM_FRACTION,
    STEP_FRACTION,
    AttemptRecord,
    Bounds,
    capture_oom_ladder,
    next_params,
    resolve_params,
)
from launcher.memory.priors import DEFAULT_PRIORS
from launcher.params import DISABLE_DRAFT_EXTEND_ENV, LaunchParams
from launcher.sglang.autoargs import auto_cuda_graph_max_bs, auto_mem_fraction_static
from launcher.sglang.classify import diagnose_text
from launcher.sglang.outcome import Numbers, Outcome
from launcher.sglang.phases import GraphPass, Phase
from launcher.sim.memory import MemoryScenario, SpecScenario, simulate
from launcher.sim.model import scenario_from_argv
from launcher.sim.observe import observed, run_policy
from tests.multipass import Pass, World
from tests.multipass import run_policy as run_multipass
from tests.simhost import model_dir

CAPTURE = (Outcome.OOM_GRAPH_CAPTURE, Phase.CUDA_GRAPH)
TOO_SMALL = (Outcome.KV_TOO_SMALL, Phase.KV_CACHE)


def record(
    params: LaunchParams, kind: tuple[Outcome, Phase], **numbers: float | int
) -> AttemptRecord:
    return AttemptRecord(params, kind[0], kind[1], Numbers(**numbers))  # type: ignore[arg-type]


def decide(*history: AttemptRecord, bounds: Bounds | None = None) -> tuple[float, int]:
    """The next params of ``history``, asserting the policy did not give up."""
    decision = next_params(history[0].params, bounds or Bounds(), list(history))
    assert decision.params is not None, decision.reason
    mfs, bs = decision.params.mem_fraction_static, decision.params.cuda_graph_max_bs
    assert mfs is not None and bs is not None
    return mfs, bs


# --- the engineer's capture OOM --------------------------------------------------------------


def test_seed_capture_oom_lowers_the_fraction_by_at_least_the_deficit() -> None:
    """Tried 7.50 GiB with 2.30 free of 85 pre-load at (0.70, 32): the fraction drops >= 5.2/85."""
    seed = LaunchParams(0.70, 32)
    rec = record(
        seed, CAPTURE, tried_gib=7.5, free_gib=2.3, total_gib=93.0, pre_load_avail_gib=85.0
    )
    decision = next_params(seed, Bounds(), [rec])
    assert decision.params is not None
    mfs, bs = decision.params.mem_fraction_static, decision.params.cuda_graph_max_bs
    assert mfs is not None and bs is not None
    # Next time the capture starts with (1 - mfs) x 85 less what was already gone (25.5 - 2.3);
    # it must hold the 7.50 GiB capture, the six smaller ones and warmup.
    free_next = (1 - mfs) * 85.0 - (0.30 * 85.0 - 2.3)
    assert free_next >= 7.5 + 6 * 0.02 + 0.5
    assert (32, True) == (bs, 0.5 <= mfs <= 0.70 - 5.2 / 85)
    assert "capture OOM: needed 7.50 GiB, 2.30 free of 85.00 pre-load" in decision.reason
    assert f"fraction 0.700→{mfs:.3f}, graph bs 32 kept" in decision.reason


def engineer_scenario(warmup_gib: float = 0.5) -> MemoryScenario:
    """A GPU where (0.70, 32) fails its first capture trying 7.50 GiB with 2.30 GiB free."""
    return MemoryScenario(
        gpu_total_gib=24.0,
        other_used_gib=24.0 - 1.0 - 2.3 / 0.3,  # pre-load free = 2.3 / (1 - 0.70)
        context_gib=1.0,
        weights_gib=3.0,
        graph_gib_per_bs=7.49 / 32,
        graph_overhead_gib=0.01,
        warmup_gib=warmup_gib,
    )


def test_engineer_scenario_reproduces_the_log_numbers() -> None:
    """The simulator's log for (0.70, 32) shows the engineer's figures."""
    s = engineer_scenario()
    outcome, phase, n = observed(s, simulate(s, LaunchParams(0.70, 32)))
    assert (Outcome.OOM_GRAPH_CAPTURE, Phase.CUDA_GRAPH) == (outcome, phase)
    assert (7.5, 2.3, 0, 32) == (n.tried_gib, n.free_gib, n.graph_steps_done, n.graph_last_bs)


def test_capture_too_big_for_any_fraction_lowers_the_graph_bs_and_comes_up() -> None:
    """When even the floor fraction cannot hold the first capture, bs drops; one retry is ready."""
    s = engineer_scenario()
    history = run_policy(s, LaunchParams(0.70, 32), Bounds())
    assert [Outcome.OOM_GRAPH_CAPTURE, Outcome.READY] == [r.outcome for r in history]
    retry = history[1].params
    assert retry.cuda_graph_max_bs is not None and retry.cuda_graph_max_bs < 32
    assert retry.mem_fraction_static is not None and 0.5 <= retry.mem_fraction_static <= 0.95


def test_capture_oom_with_total_but_no_pre_load_uses_the_gpu_size() -> None:
    """Without the pre-load figure the deficit is taken over the GPU size, plus a warmup guess."""
    seed = LaunchParams(0.70, 32)
    mfs, bs = decide(record(seed, CAPTURE, tried_gib=7.5, free_gib=2.3, total_gib=93.0))
    assert 32 == bs
    assert mfs <= 0.70 - 5.2 / 93


def test_capture_oom_without_numbers_steps_down_by_sglangs_advice() -> None:
    """No figures at all: lower the fraction by the fixed step and keep the bs."""
    assert (round(0.70 - STEP_FRACTION, 3), 32) == decide(record(LaunchParams(0.70, 32), CAPTURE))


def test_capture_oom_at_a_later_step_counts_the_steps_left() -> None:
    """Failing at step 10 of 36, the remaining 25 steps of that size are reserved too."""
    p = LaunchParams(0.85, 256)
    numbers = dict(
        tried_gib=0.05, free_gib=0.03, total_gib=80.0, pre_load_avail_gib=78.0,
        post_weights_avail_gib=40.0, pool_end_avail_gib=11.7, graph_begin_avail_gib=11.7,
        graph_last_avail_gib=0.03, graph_last_bs=176, graph_steps_done=10, graph_steps_total=36,
    )  # fmt: skip
    mfs, bs = decide(record(p, CAPTURE, **numbers))
    still_needed = (0.05 - 0.03) + 25 * 0.05
    assert 256 == bs
    assert mfs <= 0.85 - still_needed / 78.0


# --- kv too small ----------------------------------------------------------------------------


def test_kv_too_small_with_stated_minimum_raises_above_it() -> None:
    """0.5.23 states the minimum: the next fraction is above it and within the ceiling."""
    p = LaunchParams(0.6, 32)
    rec = record(
        p, TOO_SMALL, min_mem_fraction=0.7123, pre_load_avail_gib=70.0,
        post_weights_avail_gib=20.14, mem_fraction_static=0.6,
    )  # fmt: skip
    decision = next_params(p, Bounds(), [rec])
    assert decision.params is not None and decision.params.mem_fraction_static is not None
    assert 0.7123 < decision.params.mem_fraction_static <= 0.95
    assert 32 == decision.params.cuda_graph_max_bs
    assert "SGLang's minimum 0.7123" in decision.reason


def test_kv_too_small_without_stated_minimum_uses_weights_over_pre() -> None:
    """0.5.6 says only "Not enough memory": weights/pre-load bounds the next fraction."""
    p = LaunchParams(0.6, 32)
    rec = record(p, TOO_SMALL, pre_load_avail_gib=70.0, post_weights_avail_gib=20.0)
    mfs, bs = decide(rec)
    assert (32, True) == (bs, mfs > 50.0 / 70.0)


def test_kv_too_small_without_figures_raises_by_a_step() -> None:
    """Nothing known but the fraction: raise it by the fixed step."""
    assert (round(0.6 + STEP_FRACTION, 3), 32) == decide(record(LaunchParams(0.6, 32), TOO_SMALL))


def test_kv_too_small_stays_below_a_fraction_that_oomed_at_that_bs() -> None:
    """Too small at 0.70 after a capture OOM at 0.80: the next fraction is inside (0.70, 0.80)."""
    oom = record(LaunchParams(0.80, 32), CAPTURE)
    small = record(LaunchParams(0.70, 32), TOO_SMALL)
    mfs, bs = decide(oom, small)
    assert (32, True) == (bs, 0.70 < mfs < 0.80)


def test_kv_too_small_above_the_ceiling_gives_up() -> None:
    """A stated minimum above the ceiling cannot be met: give up naming more GPUs."""
    p = LaunchParams(0.9, 32)
    decision = next_params(p, Bounds(), [record(p, TOO_SMALL, min_mem_fraction=0.9612)])
    assert decision.params is None
    assert "more GPUs" in decision.reason and "quantized" in decision.reason


# --- brackets ----------------------------------------------------------------------------------


def test_empty_bracket_at_the_bs_floor_gives_up() -> None:
    """Too small at 0.700 and OOM at 0.701 at bs 1 (the floor): nothing fits, give up."""
    small = record(LaunchParams(0.700, 1), TOO_SMALL)
    oom = record(LaunchParams(0.701, 1), CAPTURE)
    decision = next_params(small.params, Bounds(), [small, oom])
    assert decision.params is None
    assert "no mem_fraction_static fits even at cuda_graph_max_bs=1" in decision.reason


def test_capture_oom_at_the_floor_fraction_lowers_bs_not_below_its_floor() -> None:
    """A capture OOM at the fraction floor halves bs; at the bs floor it gives up."""
    bounds = Bounds(graph_bs_floor=8)
    assert (0.5, 16) == decide(record(LaunchParams(0.5, 32), CAPTURE), bounds=bounds)
    at_floor = record(LaunchParams(0.5, 8), CAPTURE)
    assert next_params(at_floor.params, bounds, [at_floor]).params is None


def test_kv_cache_oom_rules_the_fraction_out_at_every_bs() -> None:
    """An OOM allocating the KV pool bounds the fraction for smaller bs too."""
    oom = record(LaunchParams(0.6, 32), (Outcome.OOM_KV_CACHE, Phase.KV_CACHE))
    small = record(LaunchParams(0.5, 32), TOO_SMALL)
    mfs, _ = decide(oom, small)
    assert 0.5 < mfs < 0.6


def test_warmup_oom_lowers_the_fraction_by_the_deficit() -> None:
    """Warmup tried 1.20 GiB with 0.40 free of 50: the fraction drops by (0.80 + margin)/50."""
    p = LaunchParams(0.85, 32)
    rec = AttemptRecord(
        p,
        Outcome.OOM_RUNTIME,
        Phase.WARMUP,
        Numbers(
            tried_gib=1.2, free_gib=0.4, pre_load_avail_gib=50.0, post_weights_avail_gib=30.0,
            pool_end_avail_gib=7.5, graph_begin_avail_gib=7.5, graph_last_avail_gib=0.41,
            graph_last_bs=1, graph_steps_done=6, graph_steps_total=7,
        ),
    )  # fmt: skip
    mfs, bs = decide(rec)
    assert 32 == bs
    assert 0.85 - 0.8 / 50 - 0.01 <= mfs <= 0.85 - 0.8 / 50


# --- give up / retry -------------------------------------------------------------------------


def test_weights_oom_gives_up_at_once() -> None:
    """An OOM while loading weights gives up on the first attempt: mem-fraction cannot help."""
    p = LaunchParams(0.8, 32)
    rec = AttemptRecord(
        p, Outcome.OOM_WEIGHTS, Phase.WEIGHTS,
        Numbers(tried_gib=1.1, free_gib=0.4, pre_load_avail_gib=78.0),
    )  # fmt: skip
    decision = next_params(p, Bounds(), [rec])
    assert decision.params is None
    assert "weights do not fit" in decision.reason and "quantized model" in decision.reason


def test_oom_before_weight_load_names_other_processes() -> None:
    """An OOM during init (GPU already full) gives up and says the GPU is held by others."""
    p = LaunchParams(0.8, 32)
    rec = AttemptRecord(
        p, Outcome.OOM_WEIGHTS, Phase.INIT, Numbers(tried_gib=1.0, free_gib=0.2, total_gib=80.0)
    )
    decision = next_params(p, Bounds(), [rec])
    assert decision.params is None
    assert "other processes hold the GPU" in decision.reason


@pytest.mark.parametrize(
    "outcome",
    [
        Outcome.BAD_ARGUMENT,
        Outcome.MODEL_NOT_FOUND,
        Outcome.PORT_IN_USE,
        Outcome.CUDA_ERROR_OTHER,
        Outcome.OTHER,
    ],
)
def test_non_memory_fatal_outcomes_give_up(outcome: Outcome) -> None:
    """A fatal outcome that is not about memory is never retried."""
    p = LaunchParams(0.8, 32)
    decision = next_params(p, Bounds(), [AttemptRecord(p, outcome, Phase.INIT, Numbers())])
    assert decision.params is None
    assert decision.reason.startswith(f"{outcome.value}: ")


@pytest.mark.parametrize(
    "outcome", [Outcome.HANG, Outcome.KILLED, Outcome.NCCL_ERROR, Outcome.INCOMPLETE]
)
def test_transient_outcomes_retry_the_same_resolved_params(outcome: Outcome) -> None:
    """hang/killed/nccl/incomplete relaunch the same settings, made explicit from the dump."""
    auto = LaunchParams()
    rec = AttemptRecord(
        auto, outcome, Phase.WEIGHTS, Numbers(mem_fraction_static=0.83, cuda_graph_max_bs=256)
    )
    assert LaunchParams(0.83, 256) == next_params(auto, Bounds(), [rec]).params


def test_gives_up_at_max_attempts() -> None:
    """After max_attempts attempts the policy gives up, whatever the last outcome."""
    p = LaunchParams(0.8, 32)
    history = [AttemptRecord(p, Outcome.HANG, Phase.WEIGHTS, Numbers())] * 3
    decision = next_params(p, Bounds(max_attempts=3), history)
    assert decision.params is None
    assert "gave up after 3 attempts (max_attempts)" in decision.reason


def test_no_history_launches_initial_and_ready_relaunches_its_params() -> None:
    """The first attempt is the configured params; after a ready one, the same again."""
    auto = LaunchParams()
    assert auto == next_params(auto, Bounds(), []).params
    ready = AttemptRecord(
        auto, Outcome.READY, Phase.READY, Numbers(mem_fraction_static=0.9, cuda_graph_max_bs=64)
    )
    assert LaunchParams(0.9, 64) == next_params(auto, Bounds(), [ready]).params


def test_impossible_bounds_raise_policy_error() -> None:
    """A floor at or above the ceiling is refused with a PolicyError."""
    with pytest.raises(PolicyError, match="mem_fraction_floor"):
        next_params(LaunchParams(), Bounds(0.9, 0.8), [])


# --- auto params -----------------------------------------------------------------------------


def test_auto_params_resolve_from_the_server_args_dump() -> None:
    """Launched as auto, the dump's values are the ones lowered and proposed explicitly."""
    auto = LaunchParams()
    rec = record(auto, CAPTURE, mem_fraction_static=0.83, cuda_graph_max_bs=256)
    decision = next_params(auto, Bounds(), [rec])
    assert LaunchParams(round(0.83 - STEP_FRACTION, 3), 256) == decision.params
    assert "fraction 0.830→0.780, graph bs 256 kept" in decision.reason


def test_auto_params_resolve_from_the_gpu_size() -> None:
    """Without a dump, SGLang's auto rules for the OOM message's GPU size apply."""
    bs = auto_cuda_graph_max_bs(80.0, 4, "0.5.6")
    mfs = auto_mem_fraction_static(80.0, 4, "0.5.6", bs)
    resolved = resolve_params(LaunchParams(), Numbers(total_gib=80.0), tp=4, sglang_version="0.5.6")
    assert (mfs, bs) == resolved


def test_auto_params_without_any_figure_use_sglangs_fallbacks() -> None:
    """Nothing known: SGLang's own unknown-GPU values are assumed and proposals are explicit."""
    assert (ASSUMED_MEM_FRACTION, ASSUMED_GRAPH_BS) == resolve_params(LaunchParams(), Numbers())
    expected = (round(ASSUMED_MEM_FRACTION - STEP_FRACTION, 3), ASSUMED_GRAPH_BS)
    assert expected == decide(record(LaunchParams(), CAPTURE))


# --- ladder ------------------------------------------------------------------------------------


def test_capture_oom_ladder_steps_down_then_halves_bs() -> None:
    """Without numbers the ladder lowers the fraction by the step, then halves bs at the floor."""
    ladder = capture_oom_ladder(
        LaunchParams(0.6, 32), Bounds(), gpu_total_gib=None, tp=1, sglang_version="0.5.23"
    )
    expected = [
        LaunchParams(0.55, 32),
        LaunchParams(0.5, 32),
        LaunchParams(0.5, 16),
        LaunchParams(0.5, 8),
        LaunchParams(0.5, 4),
    ]
    assert expected == ladder


def test_capture_oom_ladder_resolves_auto_with_the_gpu_size() -> None:
    """An auto start on a known GPU begins from SGLang's auto values, all retries explicit."""
    bs = auto_cuda_graph_max_bs(80.0, 1, "0.5.23")
    mfs = auto_mem_fraction_static(80.0, 1, "0.5.23", bs)
    ladder = capture_oom_ladder(
        LaunchParams(), Bounds(), gpu_total_gib=80.0, tp=1, sglang_version="0.5.23"
    )
    assert LaunchParams(round(mfs - STEP_FRACTION, 3), bs) == ladder[0]
    assert Bounds().max_attempts - 1 == len(ladder)


# --- observed --------------------------------------------------------------------------------


def test_observed_capture_oom_has_the_progress_line_before_the_failing_step() -> None:
    """A capture OOM shows pre/post/pool figures and the last "Capturing batches" line."""
    s = MemoryScenario(gpu_total_gib=80.0, weights_gib=40.0, graph_gib_per_bs=0.1)
    trace = simulate(s, LaunchParams(0.9, 256))
    outcome, phase, n = observed(s, trace)
    assert (Outcome.OOM_GRAPH_CAPTURE, Phase.CUDA_GRAPH) == (outcome, phase)
    assert (0.9, 256) == (n.mem_fraction_static, n.cuda_graph_max_bs)
    assert (79.0, 39.0, 40.0) == (n.pre_load_avail_gib, n.post_weights_avail_gib, n.weights_gib)
    assert (7.9, 7.9, 7.9) == (n.pool_end_avail_gib, n.graph_begin_avail_gib, n.free_gib)
    assert (256, 0, 36, 25.61, 80.0) == (
        n.graph_last_bs, n.graph_steps_done, n.graph_steps_total, n.tried_gib, n.total_gib
    )  # fmt: skip


def test_observed_states_the_minimum_only_on_0_5_23_with_no_pool() -> None:
    """0.5.23's "Loaded weights leave no GPU memory" (pool <= 0) states the minimum; 0.5.6's not."""
    new = MemoryScenario(gpu_total_gib=80.0, weights_gib=60.0, context_gib=2.0)
    _, _, n = observed(new, simulate(new, LaunchParams(0.7, 32)))
    assert round(60.0 / 78.0, 4) == n.min_mem_fraction
    assert n.kv_tokens is None
    old = MemoryScenario(
        gpu_total_gib=80.0, weights_gib=60.0, context_gib=2.0, sglang_version="0.5.6"
    )
    outcome, _, n = observed(old, simulate(old, LaunchParams(0.7, 32)))
    assert (Outcome.KV_TOO_SMALL, None) == (outcome, n.min_mem_fraction)


def test_observed_too_small_positive_pool_shows_tokens_not_minimum() -> None:
    """A pool > 0 below the scenario's minimum shows its token count and no stated minimum."""
    s = MemoryScenario(gpu_total_gib=80.0, weights_gib=60.0, context_gib=2.0, min_kv_tokens=50_000)
    outcome, _, n = observed(s, simulate(s, LaunchParams(0.8, 32)))
    assert (Outcome.KV_TOO_SMALL, None) == (outcome, n.min_mem_fraction)
    assert n.kv_tokens is not None and 0 < n.kv_tokens < 50_000


def test_observed_init_oom_has_no_pre_load_figure() -> None:
    """An OOM before weight load shows the torch figures but no "Load weight begin" line."""
    s = MemoryScenario(gpu_total_gib=24.0, weights_gib=10.0, other_used_gib=23.5, context_gib=1.0)
    outcome, phase, n = observed(s, simulate(s, LaunchParams(0.8, 8)))
    assert (Outcome.OOM_WEIGHTS, Phase.INIT, None) == (outcome, phase, n.pre_load_avail_gib)
    assert (1.0, 0.5, 24.0) == (n.tried_gib, n.free_gib, n.total_gib)


def test_observed_ready_has_the_token_summary() -> None:
    """A ready start-up shows max_total_num_tokens and no OOM figures."""
    s = MemoryScenario(gpu_total_gib=80.0, weights_gib=16.0)
    outcome, phase, n = observed(s, simulate(s, LaunchParams(0.8, 32)))
    assert (Outcome.READY, Phase.READY, None) == (outcome, phase, n.tried_gib)
    assert n.max_total_num_tokens == n.kv_tokens and n.kv_tokens is not None


# --- multi-pass capture, speculative decoding, hybrid models, prescribed fixes ---------------

SEED_LOGS = Path(__file__).parents[1] / "data" / "logs"


def seed_record(version: str) -> AttemptRecord:
    """The seeds' DeepSeek-V4-Flash MTP OOM at (0.70, 32), read from its log like the daemon."""
    text = (SEED_LOGS / f"v{version}_oom_draft_extend_mtp_seed_tp4.log").read_text()
    d = diagnose_text(text, 137)
    return AttemptRecord(LaunchParams(0.70, 32), d.outcome, d.phase, d.numbers)


@pytest.mark.parametrize(("version", "sglang"), [("0523", "0.5.23"), ("0510", "0.5.10")])
def test_seed_mtp_oom_steps_by_at_least_the_deficit_and_keeps_spec(
    version: str, sglang: str
) -> None:
    """Tried 7.50 with 2.30 free of 93.40 pre-load in draft extend: the step is >= 5.2/93.4,
    it covers everything capture used since the first pass began, bs 32 and spec stay."""
    rec = seed_record(version)
    decision = next_params(rec.params, Bounds(), [rec], tp=4, sglang_version=sglang)
    p = decision.params
    assert p is not None and p.mem_fraction_static is not None
    assert p.mem_fraction_static <= 0.70 - 5.2 / 93.4
    # Next time all passes start with (1 - mfs) x 93.40: they used 28.00 - 2.30 and need 7.50.
    assert (1 - p.mem_fraction_static) * 93.4 >= 28.0 - 2.3 + 7.5 + 0.5
    assert p == LaunchParams(p.mem_fraction_static, 32)  # nothing else changed
    assert "capture OOM in draft_extend: needed 7.50 GiB, 2.30 free of 93.40" in decision.reason
    assert "speculative params unchanged" in decision.reason


def test_seed_mtp_converges_within_two_relaunches() -> None:
    """A world with the seed's shape (prefill, verify, draft extend) is ready by attempt 3."""
    for v in ("0.5.23", "0.5.10"):
        run = run_multipass(SEED_WORLD if v == "0.5.23" else replace(SEED_WORLD, version=v),
                            LaunchParams(0.70, 32))
        assert run.ready and len(run.history) <= 3, run.reason
        assert all(r.params.cuda_graph_max_bs == 32 for r in run.history)


SEED_WORLD = World(
    pre=93.4, weights=37.57, draft_weights=1.49, spec=True, steps=1, draft_tokens=2, warmup=1.5,
    passes=(Pass(GraphPass.TARGET_PREFILL, 1.1, 0.0, 0.0),
            Pass(GraphPass.TARGET_VERIFY, 2.0, 0.45, 0.06),
            Pass(GraphPass.DRAFT_EXTEND, 3.0, 0.35, 0.05)),
)


def test_plain_capture_oom_at_075_counts_the_prefill_pass() -> None:
    """Non-speculative: the decode graphs fail after the prefill graphs took 6 GiB; the next
    fraction leaves room for both, so the loop is ready within 2 attempts after the OOM."""
    world = World(
        pre=80.0, weights=40.0, tp=1, warmup=1.0,
        passes=(Pass(GraphPass.TARGET_PREFILL, 6.0, 0.0, 0.0),
                Pass(GraphPass.TARGET_DECODE, 3.0, 0.05, 0.02)),
    )
    run = run_multipass(world, LaunchParams(0.75, 256))
    assert Outcome.OOM_GRAPH_CAPTURE == run.history[0].outcome
    assert "target_decode" == run.history[0].numbers.graph_pass
    assert run.ready and run.after_first_failure <= 2


def test_spec_graph_bs_above_the_running_request_cap_is_searched_at_the_cap() -> None:
    """bs 160 with spec captures only up to 48: a smaller bs is below 48, never 160 → 128."""
    world = replace(SEED_WORLD, weights=60.0)
    run = run_multipass(world, LaunchParams(0.80, 160))
    bss = [r.params.cuda_graph_max_bs for r in run.history[1:]]
    assert all(b is not None and (b == 160 or b < 48) for b in bss), bss


def test_draft_extend_graph_goes_off_only_when_policy_allows_it() -> None:
    """Fraction and bs cannot make room with a useful pool: on 0.5.23 with the [policy] switch
    the next attempt sets SGLANG_DISABLE_DRAFT_EXTEND_CUDA_GRAPH=1; without it, never."""
    world = replace(SEED_WORLD, weights=62.0, passes=(
        Pass(GraphPass.TARGET_VERIFY, 12.0, 0.05, 0.01),
        Pass(GraphPass.DRAFT_EXTEND, 14.0, 0.02, 0.01),
    ))
    allowed = Bounds(graph_bs_floor=8, allow_disable_draft_extend_graph=True)
    run = run_multipass(world, LaunchParams(0.70, 32), allowed)
    assert run.ready, run.reason
    assert "1" == run.history[-1].params.env_value(DISABLE_DRAFT_EXTEND_ENV)
    plain = run_multipass(world, LaunchParams(0.70, 32), Bounds(graph_bs_floor=8))
    assert all(r.params.env == () for r in plain.history)
    old = run_multipass(replace(world, version="0.5.10"), LaunchParams(0.70, 32), allowed)
    assert all(r.params.env == () for r in old.history)  # 0.5.10 has no such switch


def test_kv_too_small_goes_to_the_stated_minimum_plus_a_cushion_not_the_auto_value() -> None:
    """Too small at 0.60 whose minimum was 0.648: next is about 0.668, not 0.856."""
    p = LaunchParams(0.60, 32)
    rec = record(p, TOO_SMALL, min_mem_fraction=0.648, pre_load_avail_gib=93.4,
                 post_weights_avail_gib=32.88, total_gib=94.97, mem_fraction_static=0.6)
    mfs, bs = decide(rec)
    assert (32, True) == (bs, 0.648 < mfs <= 0.648 + DEFAULT_PRIORS.kv_cushion + 0.002)


def hybrid_record(params: LaunchParams, **numbers: object) -> AttemptRecord:
    n = Numbers(speculative_algorithm="EAGLE", mamba_cache_size=-3, **numbers)  # type: ignore[arg-type]
    return AttemptRecord(params, Outcome.HYBRID_STATE_TOO_SMALL, Phase.KV_CACHE, n)


def test_hybrid_state_error_raises_the_fraction_and_never_the_running_requests() -> None:
    """0.5.23's "Not enough GPU memory for hybrid ... state cache" (K = -3, 146.25 MB per
    request, pre 93.88, 0.56, MTP with 4 draft tokens, extra_buffer: 5 slots per request).
    SGLang sizes K from ``rest x 0.9 / 1.9`` alone (kv_cache_configurator.py:3347-3380), so
    halving max_running_requests (what its message says first) would fail again. The fraction
    rises until K holds 8 requests: (40 + 3 + 1) slots x 146.25 MiB x (1 + 4/5) x 1.9 / 0.9
    = 23.88 GiB of rest, / 93.88 = 0.2544: 0.56 -> 0.815; nothing else changes."""
    text = (SEED_LOGS / "v0523_hybrid_state_too_small_mtp.log").read_text()
    d = diagnose_text(text, -9)
    p = LaunchParams(0.56, None)
    rec = AttemptRecord(p, d.outcome, d.phase, d.numbers)
    decision = next_params(p, Bounds(), [rec], sglang_version="0.5.23")
    assert decision.params == LaunchParams(0.815, None)
    assert "SGLang sizes it without max_running_requests" in decision.reason


def test_seed_qwen_hybrid_state_error_is_ready_in_one_relaunch_with_its_running_requests() -> None:
    """The seeds' Qwen3.6-27B hybrid + MTP (simulated, 0.5.23, one RTX PRO 6000) at 0.56: the
    state-cache error, then ready at the raised fraction with 8 or more running requests and
    max_running_requests untouched (halving it, 48 -> 24 -> 12 -> 8, changed nothing here)."""
    argv = ["--model-path", str(model_dir("qwen3.6-27b-sim")), "--speculative-algorithm",
            "NEXTN", "--speculative-num-steps", "3", "--speculative-eagle-topk", "1",
            "--speculative-num-draft-tokens", "4", "--mem-fraction-static", "0.56"]
    scenario, params = scenario_from_argv("0.5.23", argv, 94.97)
    for halved in ("24", "12", "8"):
        same = simulate(*scenario_from_argv("0.5.23", [*argv, "--max-running-requests", halved],
                                            94.97))
        assert same.failure is not None and "hybrid_state_memory" == same.failure.kind
    history = run_policy(scenario, params, Bounds())
    assert [Outcome.HYBRID_STATE_TOO_SMALL, Outcome.READY] == [r.outcome for r in history]
    assert all(r.params.max_running_requests is None for r in history)
    ready = simulate(scenario, history[-1].params)
    assert ready.max_running_requests is not None and ready.max_running_requests >= 8


def test_hybrid_state_error_doubles_a_configured_mamba_cache_size_first() -> None:
    p = LaunchParams(0.8, 48, max_mamba_cache_size=24)
    decision = next_params(p, Bounds(), [hybrid_record(p)])
    assert decision.params == replace(p, max_mamba_cache_size=48)


MAMBA_SPEC = Numbers(prescribed_mamba_strategy="extra_buffer",
                     prescribed_env="SGLANG_ENABLE_SPEC_V2=1")


def test_prescribed_fix_is_advised_but_not_applied_by_default() -> None:
    p = LaunchParams(0.8, 32)
    rec = AttemptRecord(p, Outcome.BAD_ARGUMENT, Phase.INIT, MAMBA_SPEC)
    decision = next_params(p, Bounds(), [rec], sglang_version="0.5.10")
    assert decision.give_up
    assert "--mamba-scheduler-strategy extra_buffer and SGLANG_ENABLE_SPEC_V2=1" in decision.reason
    assert "apply_prescribed_fixes" in decision.reason


@pytest.mark.parametrize(
    ("version", "env"), [("0.5.10", (("SGLANG_ENABLE_SPEC_V2", "1"),)), ("0.5.23", ())]
)
def test_prescribed_fix_is_applied_once_in_the_versions_dialect(
    version: str, env: tuple[tuple[str, str], ...]
) -> None:
    """0.5.10 gets the env var too; 0.5.23 no longer reads it. A repeat gives up."""
    p = LaunchParams(0.8, 32)
    bounds = Bounds(apply_prescribed_fixes=True)
    rec = AttemptRecord(p, Outcome.BAD_ARGUMENT, Phase.INIT, MAMBA_SPEC)
    fixed = next_params(p, bounds, [rec], sglang_version=version).params
    assert fixed == replace(p, mamba_strategy="extra_buffer", env=env)
    again = AttemptRecord(fixed, Outcome.BAD_ARGUMENT, Phase.INIT, MAMBA_SPEC)
    assert next_params(p, bounds, [rec, again], sglang_version=version).give_up


def test_relaunch_keeps_the_other_knobs() -> None:
    """A capture OOM changes the fraction; running requests, Mamba knobs and env stay."""
    p = LaunchParams(0.7, 32, max_running_requests=32, mamba_strategy="extra_buffer",
                     env=(("SGLANG_ENABLE_SPEC_V2", "1"),))
    rec = record(p, CAPTURE, tried_gib=7.5, free_gib=2.3, total_gib=93.0, pre_load_avail_gib=85.0)
    new = next_params(p, Bounds(), [rec]).params
    assert new is not None and new == replace(p, mem_fraction_static=new.mem_fraction_static)


def test_kv_too_small_after_a_large_capture_oom_does_not_creep_a_thousandth() -> None:
    """A 0.001 creep, on an EAGLE scenario of ``bench_oom.py --families`` (seed 1,
    eagle case 177, figures rounded): a capture OOM at 0.95 bs 160 sent the policy to bs 1 below
    a fraction the model estimate could not reach; each kv_too_small then raised the fraction
    0.001 (0.720, 0.721, ... until attempts ran out) although the weights figures imply a pool
    far bigger. The next try must follow the KV figures, and the loop be ready soon."""
    scenario = MemoryScenario(
        gpu_total_gib=36.249, weights_gib=194.252, tp=8, other_used_gib=0.0,
        context_gib=1.644, kv_gib_per_1k_tokens=0.0498, min_kv_tokens=12192,
        graph_gib_per_bs=0.0725, graph_overhead_gib=0.0046, warmup_gib=0.683,
        sglang_version="0.5.23",
        spec=SpecScenario(algorithm="EAGLE", num_steps=1, topk=2, num_draft_tokens=9,
                          max_running_requests=180, draft_weights_gib=0.616,
                          draft_kv_gib_per_1k_tokens=0.00538,
                          draft_graph_gib_per_token=0.00491,
                          draft_graph_overhead_gib=0.00149),
    )
    history = run_policy(scenario, LaunchParams(0.71, 160), Bounds(0.5, 0.95, 1, 8))
    steps = [(r.params.mem_fraction_static, r.params.cuda_graph_max_bs, r.outcome)
             for r in history]
    assert history[-1].outcome is Outcome.READY, steps
    assert len(history) <= 4, steps
    for before, after in itertools.pairwise(history):
        if before.outcome is Outcome.KV_TOO_SMALL:
            assert after.params.mem_fraction_static is not None
            assert before.params.mem_fraction_static is not None
            assert after.params.mem_fraction_static - before.params.mem_fraction_static > 0.002, (
                steps)


# --- per-pass fits (no fixed share of a multi-pass figure; 0.5.10's draft pool) ---------------


def test_seed_capture_oom_scales_the_decode_passes_not_the_prefill_pass() -> None:
    """The 0.5.23 seed OOM (draft extend tried 7.50 GiB at bs 32) with the fraction floor at
    0.65: no fraction above the floor fits bs 32, so the bs drops. The begin lines size the
    passes: prefill 28.00 -> 26.88 (per token count: kept whole at any bs), verify 26.88 ->
    9.26 and the failed draft-extend first step 7.50 (both proportional to the bs). At the new
    bs the headroom holds that, plus no more than the warmup guess, margin and steps."""
    rec = seed_record("0523")
    p = next_params(rec.params, Bounds(mem_fraction_floor=0.65), [rec], tp=4,
                    sglang_version="0.5.23").params
    assert p is not None and p.mem_fraction_static is not None and p.cuda_graph_max_bs
    bs, headroom = p.cuda_graph_max_bs, (1 - p.mem_fraction_static) * 93.4
    assert bs < 32
    at_32 = 28.00 - 2.30 + 7.50  # every pass since the first began, and what was tried
    scaling = (26.88 - 9.26) + 7.50  # the verify pass and the draft-extend first step
    at_bs = at_32 - scaling * (1 - bs / 32)
    assert at_bs <= headroom <= at_bs + 3.0  # 2% warmup guess (1.87), margin (0.23), steps


def test_0_5_10_draft_pool_grows_with_the_fraction() -> None:
    """0.5.10 allocates the draft's pool (the seed log's second ``KV Cache is allocated``
    line, 0.40 GB, the target's 1444864 tokens) after the target's graphs, out of the same
    headroom: at a lower fraction it is smaller, so the fraction need not fall as far as if
    those 0.40 GiB were graph memory."""
    rec = seed_record("0510")
    assert rec.numbers.draft_kv_gib == 0.40
    as_graph = replace(rec, numbers=replace(rec.numbers, draft_kv_gib=None))
    pooled = next_params(rec.params, Bounds(), [rec], tp=4, sglang_version="0.5.10").params
    fixed = next_params(rec.params, Bounds(), [as_graph], tp=4, sglang_version="0.5.10").params
    assert pooled is not None and fixed is not None
    assert pooled.cuda_graph_max_bs == fixed.cuda_graph_max_bs == 32
    assert pooled.mem_fraction_static is not None and fixed.mem_fraction_static is not None
    # The pool at m is 0.40 x (m x 93.40 - 37.57) / (0.70 x 93.40 - 37.57): about 0.27 GiB at
    # 0.62, so about 0.13 GiB (0.0014 of pre) more room than counting 0.40 GiB fixed.
    assert pooled.mem_fraction_static > fixed.mem_fraction_static


def test_a_verify_graph_bigger_than_any_headroom_cuts_the_bs_in_proportion() -> None:
    """EAGLE case 20 of ``bench_oom.py --families`` (seed 1, figures rounded, without the
    prefill graphs the family has since d29c806): the target verify graph's first step at
    bs 128 (x 10 draft tokens) tried 85 GiB, more than any fraction leaves. A fixed half of
    it at every bs (the former FIXED_GRAPH_SHARE) sent the policy to bs 1 at the 0.50 floor;
    the verify pass is proportional to the bs, so one relaunch at a bs in proportion is
    ready, above the floor. (The draft passes not yet seen
    are guessed at LATER_PASS_SHARE of the verify pass, far more than this draft takes: the
    fraction stays about 0.13 below the best at that bs.)"""
    scenario = MemoryScenario(
        gpu_total_gib=102.191, weights_gib=29.545, tp=1, context_gib=2.976,
        kv_gib_per_1k_tokens=0.1881, graph_gib_per_bs=0.06673, graph_overhead_gib=0.0305,
        warmup_gib=1.810, sglang_version="0.5.23",
        spec=SpecScenario(algorithm="EAGLE", num_steps=4, topk=4, num_draft_tokens=10,
                          max_running_requests=223, draft_weights_gib=1.3395,
                          draft_kv_gib_per_1k_tokens=0.004723,
                          draft_graph_gib_per_token=0.0008627,
                          draft_graph_overhead_gib=0.001039),
    )
    history = run_policy(scenario, LaunchParams(None, 128), Bounds(0.5, 0.95, 1, 8))
    steps = [(r.params.describe(), r.outcome.value) for r in history]
    assert [Outcome.OOM_GRAPH_CAPTURE, Outcome.READY] == [r.outcome for r in history], steps
    mfs, bs = history[-1].params.mem_fraction_static, history[-1].params.cuda_graph_max_bs
    assert mfs is not None and bs is not None, steps
    assert (bs > 8, mfs > 0.52) == (True, True), steps


def test_0_5_10_draft_pool_oom_after_the_target_graphs_does_not_walk_the_bs() -> None:
    """MTP case 141 of ``bench_oom.py --families`` (seed 1, figures rounded), the one family
    miss left by policyfix9: on 0.5.10 the draft's pool has the target's token count and is
    allocated after the target's graphs. Read as graph memory, it made the policy raise the
    fraction a little and drop the bs one rung per attempt (0.858/176, 0.861/168, ...) until
    attempts ran out. With the pool solved for, the first OOM in a draft pass is the last.
    (``min_kv_tokens`` as the generator drew it then; it costs the two kv_too_small first.)"""
    scenario = MemoryScenario(
        gpu_total_gib=71.804, weights_gib=102.355, tp=2, other_used_gib=3.152,
        context_gib=2.787, kv_gib_per_1k_tokens=0.2856, min_kv_tokens=13487,
        graph_gib_per_bs=0.005367,
        graph_overhead_gib=0.02342, warmup_gib=0.708, sglang_version="0.5.10",
        spec=SpecScenario(algorithm="EAGLE", num_steps=3, topk=1, num_draft_tokens=4,
                          max_running_requests=230, draft_weights_gib=1.619,
                          draft_kv_gib_per_1k_tokens=0.04047,
                          draft_graph_gib_per_token=0.003767,
                          draft_graph_overhead_gib=0.01376),
    )
    history = run_policy(scenario, LaunchParams(0.77, None), Bounds(0.5, 0.95, 1, 8))
    steps = [(r.params.describe(), r.outcome.value, r.numbers.graph_pass) for r in history]
    assert history[-1].outcome is Outcome.READY, steps
    draft = next(i for i, r in enumerate(history) if (r.numbers.graph_pass or "").startswith(
        "draft"))
    assert draft == len(history) - 2, steps


def _best_fraction(world: World, bs: int) -> float | None:
    """The highest fraction on the 0.001 grid at which ``world`` is ready at graph bs ``bs``."""
    for milli in range(950, 499, -1):
        if world.run(LaunchParams(milli / 1000, bs)).outcome is Outcome.READY:
            return milli / 1000
    return None


def test_draft_extend_after_a_draft_decode_oom_is_sized_by_sglangs_capture_widths() -> None:
    """0.5.23, EAGLE 3 steps / topk 1 / 4 draft tokens: the draft decode graph runs its 3
    steps one after another on bs x topk tokens (one step's activations, 0.1 GiB per bs),
    the draft extend graph bs x 4 (SGLang's ``resolve_num_tokens_per_req``), 0.4 per bs: 4
    times decode. At 0.93 (5.60 free) verify takes 2.60 + 7 x 0.01 and draft decode's 3.20
    does not fit in 2.93. After that OOM the next fraction leaves room for the extend pass
    (12.80 + 0.07, as 4 x the decode step seen): ready in one relaunch. Sizing extend by
    topk x steps (4/3 of decode, 4.27) would fail it once more."""
    world = World(
        pre=80.0, weights=40.0, tp=1, warmup=0.5, spec=True, steps=3, draft_tokens=4,
        passes=(Pass(GraphPass.TARGET_VERIFY, 1.0, 0.05, 0.01),
                Pass(GraphPass.DRAFT_DECODE, 0.0, 0.1, 0.01),
                Pass(GraphPass.DRAFT_EXTEND, 0.0, 0.4, 0.01)),
    )
    run = run_multipass(world, LaunchParams(0.93, 32))
    assert run.history[0].outcome is Outcome.OOM_GRAPH_CAPTURE
    assert "draft_decode" == run.history[0].numbers.graph_pass
    assert run.ready and len(run.history) == 2, [
        (r.params.describe(), r.outcome.value, r.numbers.graph_pass) for r in run.history
    ]


def test_0_5_10_draft_extend_is_sized_by_steps_plus_one_not_the_tree() -> None:
    """0.5.10, EAGLE 2 steps / topk 4 / 8 draft tokens: draft decode runs topk = 4 tokens per
    request (its steps one after another; 0.1 GiB per token: 0.4 per bs), draft extend
    ``steps + 1`` = 3 (eagle_draft_extend_cuda_graph_runner.py ``num_tokens_per_bs``), 0.3
    per bs. At 0.85 (15.00 free) verify takes 2.60 + 7 x 0.01 and draft decode's 12.80 does
    not fit in 12.33. After that OOM the extend pass is expected at 3/4 of it (9.60), not at
    the tree's 8/4: ready in one relaunch at bs 32, with little KV left unused."""
    world = World(
        pre=100.0, weights=30.0, tp=1, warmup=0.5, spec=True, steps=2, topk=4, draft_tokens=8,
        version="0.5.10",
        passes=(Pass(GraphPass.TARGET_VERIFY, 1.0, 0.05, 0.01),
                Pass(GraphPass.DRAFT_DECODE, 0.0, 0.4, 0.01),
                Pass(GraphPass.DRAFT_EXTEND, 0.0, 0.3, 0.01)),
    )
    run = run_multipass(world, LaunchParams(0.85, 32))
    assert "draft_decode" == run.history[0].numbers.graph_pass
    assert run.ready and len(run.history) == 2, run.reason
    last = run.history[-1].params
    assert last.cuda_graph_max_bs == 32 and last.mem_fraction_static is not None
    best = _best_fraction(world, 32)
    assert best is not None and best - last.mem_fraction_static <= 0.03
