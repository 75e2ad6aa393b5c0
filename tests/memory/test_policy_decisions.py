"""Contract tests of ``next_params``' rules outside the memory arithmetic: the reasons
given for a first attempt and a ready relaunch, a fix SGLang prescribes applied once, how an
auto graph bs is resolved from a log, and that an OOM with the draft-extend graph on says
nothing about settings with it off. Whole decisions are compared, reasons included.
"""

from __future__ import annotations

from dataclasses import replace

from launcher.memory.policy import AttemptRecord, Bounds, Decision, next_params, resolve_params
from launcher.params import LaunchParams
from launcher.sglang.autoargs import auto_cuda_graph_max_bs
from launcher.sglang.outcome import Numbers, Outcome
from launcher.sglang.phases import Phase

OFF = ("SGLANG_DISABLE_DRAFT_EXTEND_CUDA_GRAPH", "1")


def test_the_first_attempt_is_launched_as_configured() -> None:
    initial = LaunchParams(0.8, 32)
    assert next_params(initial, Bounds(), []) == Decision(initial, "first attempt: as configured")


def test_a_ready_attempt_is_relaunched_with_its_settings() -> None:
    """The log's resolved values make an auto param explicit (here the dump's 0.871)."""
    ready = AttemptRecord(LaunchParams(None, 32), Outcome.READY, Phase.READY,
                          Numbers(mem_fraction_static=0.871))
    assert next_params(ready.params, Bounds(), [ready]) == Decision(
        LaunchParams(0.871, 32), "last attempt was ready: relaunch with its settings")


# --- a fix SGLang's error prescribes (0.5.10: the strategy and SGLANG_ENABLE_SPEC_V2=1) --------

MAMBA_SPEC = Numbers(prescribed_mamba_strategy="extra_buffer",
                     prescribed_env="SGLANG_ENABLE_SPEC_V2=1")
FIX = "--mamba-scheduler-strategy extra_buffer and SGLANG_ENABLE_SPEC_V2=1"
APPLY = Bounds(apply_prescribed_fixes=True)


def fixed(p: LaunchParams) -> LaunchParams:
    return replace(p, mamba_strategy="extra_buffer", env=(("SGLANG_ENABLE_SPEC_V2", "1"),))


def test_a_prescribed_fix_is_applied_naming_it() -> None:
    """Also after earlier attempts at other settings (a hang at 0.70): none ran the fix."""
    p = LaunchParams(0.8, 32)
    bad = AttemptRecord(p, Outcome.BAD_ARGUMENT, Phase.INIT, MAMBA_SPEC)
    hang = AttemptRecord(LaunchParams(0.7, 32), Outcome.HANG, Phase.WEIGHTS, Numbers())
    for history in ([bad], [hang, bad]):
        assert next_params(p, APPLY, history, sglang_version="0.5.10") == Decision(
            fixed(p), f"applying the fix SGLang's error prescribes: {FIX}")


def test_a_prescribed_fix_any_earlier_attempt_ran_is_not_applied_again() -> None:
    """The second of three attempts already ran with the fix (it hung); the third, without
    it, is refused for the same reason: the fix was tried and did not help. (Only earlier
    attempts count, and every one of them.)"""
    p = LaunchParams(0.8, 32)
    history = [
        AttemptRecord(LaunchParams(0.7, 32), Outcome.HANG, Phase.WEIGHTS, Numbers()),
        AttemptRecord(fixed(p), Outcome.HANG, Phase.WEIGHTS, Numbers()),
        AttemptRecord(p, Outcome.BAD_ARGUMENT, Phase.INIT, MAMBA_SPEC),
    ]
    assert next_params(p, APPLY, history, sglang_version="0.5.10") == Decision(
        None, f"SGLang's prescribed fix ({FIX}) was applied and did not help; read the log")


# --- the graph bs an auto launch ran with ------------------------------------------------------


def test_an_auto_graph_bs_is_the_first_capture_steps_bs_when_the_log_shows_it() -> None:
    """Graphs are captured largest first: a capture that failed at its first step (0 done)
    on a progress bar at bs 64 ran with max bs 64. After a step was done the bar shows a
    smaller bs, so SGLang's auto rule for the GPU size (80 GiB, tp 1) is taken instead."""
    first = Numbers(graph_steps_done=0, graph_last_bs=64, total_gib=80.0)
    assert resolve_params(LaunchParams(0.8, None), first) == (0.8, 64)
    later = replace(first, graph_steps_done=1)
    assert resolve_params(LaunchParams(0.8, None), later) == (
        0.8, auto_cuda_graph_max_bs(80.0, 1, "0.5.23"))
    assert resolve_params(LaunchParams(0.8, None), replace(first, graph_last_bs=None)) == (
        0.8, auto_cuda_graph_max_bs(80.0, 1, "0.5.23"))


def test_an_auto_graph_bs_follows_the_versions_table() -> None:
    """SGLang's auto max bs for a 30 GiB GPU at tp 1 is 24 before its table changed and 48
    after: resolve_params uses the version it is given."""
    numbers = Numbers(total_gib=30.0)
    assert resolve_params(LaunchParams(0.8, None), numbers, sglang_version="0.5.6") == (0.8, 24)
    assert resolve_params(LaunchParams(0.8, None), numbers, sglang_version="0.5.23") == (0.8, 48)


# --- the draft-extend graph ------------------------------------------------------------------


def test_an_oom_with_draft_extend_on_does_not_bound_settings_with_it_off() -> None:
    """A capture OOM at 0.70 with the draft-extend graph on, then one at 0.80 with it off
    (SGLANG_DISABLE_DRAFT_EXTEND_CUDA_GRAPH=1): the first does not bound the second's search.
    The second (plain decode pass began 20.00 of a 100.00 pre-load, first step tried 5.00
    with 1.00 free) alone gives 0.735 (19.00 gone, first step 4.985, 8 steps 0.16, 0.01:
    24.155, with warmup 2.00 and margin 0.25 26.405), above 0.70; the switch stays on."""
    pool = dict(pre_load_avail_gib=100.0, post_weights_avail_gib=60.0, pool_end_avail_gib=20.0,
                total_gib=110.0)
    on = AttemptRecord(LaunchParams(0.7, 32), Outcome.OOM_GRAPH_CAPTURE, Phase.CUDA_GRAPH,
                       Numbers())
    off = AttemptRecord(
        LaunchParams(0.8, 32, env=(OFF,)), Outcome.OOM_GRAPH_CAPTURE, Phase.CUDA_GRAPH,
        Numbers(**pool, graph_pass="target_decode", graph_first_begin_avail_gib=20.0,  # type: ignore[arg-type]
                graph_begin_avail_gib=20.0, graph_passes_begun=1, tried_gib=5.0,
                free_gib=1.0))
    decision = next_params(on.params, Bounds(), [on, off], sglang_version="0.5.23")
    assert decision.params == LaunchParams(0.735, 32, env=(OFF,))


# --- a graph estimate below the KV bound ------------------------------------------------------


def test_the_bisection_of_the_open_bracket_rounds_its_midpoint_down() -> None:
    """As ``test_a_graph_estimate_below_the_kv_bound_bisects_between_the_brackets`` (a capture
    OOM at 0.60 / bs 32 whose optimistic estimate at bs 1 is about 0.650; weights 40.00 of
    80.00), but the pool was found too small at 0.651: the KV bound is 0.652 and 4 x the
    12.08 GiB pool is above the ceiling, so the bracket 0.652-0.950 is bisected: (652 + 950 +
    1) // 2 = 801 thousandths, the middle thousandth rounded down."""
    weights = dict(pre_load_avail_gib=80.0, post_weights_avail_gib=40.0)
    oom = AttemptRecord(LaunchParams(0.6, 32), Outcome.OOM_GRAPH_CAPTURE, Phase.CUDA_GRAPH,
                        Numbers(tried_gib=23.8, free_gib=4.8, **weights))
    small = AttemptRecord(LaunchParams(0.651, 8), Outcome.KV_TOO_SMALL, Phase.KV_CACHE,
                          Numbers(**weights))
    decision = next_params(oom.params, Bounds(), [oom, small])
    assert decision.params == LaunchParams(0.801, 1)
