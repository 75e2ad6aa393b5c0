"""Contract tests of the multi-pass capture fit (``launcher.memory.policy._pass_fit``):
how a capture or warmup OOM in a log that names its passes is split into what stays fixed, what
scales with the graph bs and what is a guess for passes still to come, seen through the
decision ``next_params`` takes.

Every expected value is worked out by hand in the docstring from the rules of the policy's
module docstring and SGLang's figures, never copied from what the code returned. The common
setting: pre-load 100.00 GiB per rank, weights 40.00 (``Load weight end`` avail 60.00), the
pool leaving (1 - 0.80) x 100 = 20.00 at mem_fraction_static 0.80, graph max bs 32. Then the
warmup guess is 2% of 100 = 2.00 GiB, the margin 0.25% of 100 = 0.25, the default later step
0.02 GiB, every figure read is counted 0.005 up (two roundings 0.01 per fit), and the KV bound
is the fraction floor 0.50. Speculative decoding (EAGLE) captures bs 32 in 20 sizes, bs 24 in
16, bs 16 in 12; plain decoding bs 32 in 8 sizes. A fraction is the largest thousandth at or
below ``1 - need / pre`` (with 0.5.10's draft pool solved for), capped by the OOM's own
deficit at an unchanged bs.
"""

from __future__ import annotations

import pytest

from launcher.memory.policy import AttemptRecord, Bounds, Decision, next_params
from launcher.params import LaunchParams
from launcher.sglang.outcome import Numbers, Outcome
from launcher.sglang.phases import Phase

CAPTURE = (Outcome.OOM_GRAPH_CAPTURE, Phase.CUDA_GRAPH)
WARMUP = (Outcome.OOM_RUNTIME, Phase.WARMUP)
POOL = dict(pre_load_avail_gib=100.0, post_weights_avail_gib=60.0, pool_end_avail_gib=20.0,
            total_gib=110.0)
EAGLE3 = dict(speculative_algorithm="EAGLE", speculative_num_steps=3)


def rec(kind: tuple[Outcome, Phase], params: LaunchParams | None = None,
        **numbers: object) -> AttemptRecord:
    figures: dict[str, object] = dict(POOL)
    figures.update(numbers)
    return AttemptRecord(params or LaunchParams(0.8, 32), kind[0], kind[1],
                         Numbers(**figures))  # type: ignore[arg-type]


def decide(record: AttemptRecord, version: str, bounds: Bounds | None = None) -> Decision:
    return next_params(record.params, bounds or Bounds(), [record], sglang_version=version)


def proposal(decision: Decision) -> tuple[float, int]:
    assert decision.params is not None, decision.reason
    mfs, bs = decision.params.mem_fraction_static, decision.params.cuda_graph_max_bs
    assert mfs is not None and bs is not None
    return mfs, bs


# --- 0.5.10: the draft's weights and pool load between the target's and the draft's graphs ----


@pytest.mark.parametrize(("draft_weights", "at_24"), [(1.0, 0.703), (None, 0.706)])
def test_0_5_10_draft_between_only_after_the_targets_last_pass(
    draft_weights: float | None, at_24: float
) -> None:
    """0.5.10, EAGLE 3 steps: target prefill began at 20.00, target verify at 18.00, draft
    decode at 9.00 and failed its first step trying 3.00 with 2.50 free; the draft's weights
    (1.00) and pool (2.00) loaded between verify and draft decode, not between prefill and
    verify. Fixed: prefill 2.00, draft weights 1.00, what the failing pass found gone (9.00 -
    2.50 = 6.50), roundings 0.01: 9.51. Scaled (first steps): verify 18 - 9 - 1 - 2 = 6.00
    less 20 steps (0.40) = 5.60; draft decode 3.005 + 19 x 0.02 = 3.385 less 0.40 = 2.985;
    draft extend to come at 4/1 of that (0.5.10 captures extend at steps + 1 = 4 tokens per
    request, decode at topk = 1: its steps run one after another) = 11.94: 20.525. Steps: 3
    passes x 20 x 0.02 = 1.20. Graphs 31.235; with warmup 2.00 and margin 0.25, 33.485. The
    draft pool is 2.00 of the target's 80 - 40, 0.05 GiB per GiB: m <= (100 - 33.485 + 0.05 x
    40) / 105 = 0.65252 -> 0.652.

    At bs 24 (floor 0.70): 9.51 + 20.525 x 24/32 + 3 x 16 x 0.02 = 25.86375, so m <= (100 -
    28.11375 + 2) / 105 = 0.70368 -> 0.703.

    Without the draft's weight line nothing is counted for the weights: the 1.00 is verify's
    (fixed 8.51, verify's first step 6.60, scaled 21.525): the same 31.235 at bs 32, but at
    bs 24 8.51 + 16.14375 + 0.96 = 25.61375, (100 - 27.86375 + 2) / 105 = 0.70606 -> 0.706."""
    oom = rec(CAPTURE, graph_pass="draft_decode", graph_first_begin_avail_gib=20.0,
              graph_begin_avail_gib=9.0, graph_passes_begun=3, graph_passes_ended=2,
              graph_begins=[("target_prefill", 20.0), ("target_verify", 18.0),
                            ("draft_decode", 9.0)],
              tried_gib=3.0, free_gib=2.5, draft_weights_gib=draft_weights, draft_kv_gib=2.0,
              **EAGLE3)
    assert proposal(decide(oom, "0.5.10")) == (0.652, 32)
    assert proposal(decide(oom, "0.5.10", Bounds(mem_fraction_floor=0.70))) == (at_24, 24)


@pytest.mark.parametrize(("draft_kv", "expected"), [(2.0, 0.792), (None, 0.792)])
def test_0_5_10_warmup_oom_after_the_targets_last_pass_is_not_draft_graph_memory(
    draft_kv: float | None, expected: float
) -> None:
    """0.5.10, EAGLE: warmup (tried 1.50, 1.00 free) after target prefill began at 20.00 and
    target verify at 18.00, the last pass shown. From 18.00 down to 1.00 the draft's weights
    (1.00) and, when its line is shown, pool (2.00) were loaded: they are not verify's size.
    Verify: 17 - 1 - 2 = 14.00, first step 14 - 0.40 = 13.60, 20 steps 0.40; fixed prefill
    2.00 + draft weights 1.00 + 0.01. Graphs 17.01; warmup 1.505, margin 0.25: need 18.765.
    With the pool (0.05 GiB per GiB of the target's): (100 - 18.765 + 2) / 105 = 0.79271 ->
    0.792. Without the pool line the 2.00 are verify's: 3.01 + 15.60 + 0.40 = 19.01, need
    20.765, 1 - 0.20765 = 0.79235 -> 0.792 (the same thousandth, by two routes). The OOM's
    own deficit allows 0.795 (0.80 - 0.50 / 105 or / 100)."""
    oom = rec(WARMUP, graph_pass="target_verify", graph_first_begin_avail_gib=20.0,
              graph_begin_avail_gib=18.0, graph_passes_begun=2, graph_passes_ended=2,
              graph_begins=[("target_prefill", 20.0), ("target_verify", 18.0)],
              tried_gib=1.5, free_gib=1.0, draft_weights_gib=1.0, draft_kv_gib=draft_kv,
              **EAGLE3)
    assert proposal(decide(oom, "0.5.10")) == (expected, 32)


def test_0_5_10_oom_loading_the_draft_weights_after_the_targets_graphs() -> None:
    """0.5.10, EAGLE 3 steps: both target passes ended (prefill began 20.00, verify 18.00),
    then 3.00 GiB failed with 1.00 free before any draft line: the draft's weights. Fixed:
    prefill 2.00 and the tried 3.005 (the weights, needed again), 0.01: 5.015. Verify held
    18 - 1 = 17.00: first step 16.60, 20 steps. The two draft passes to come are a quarter of
    verify's first step each (4.15 + 4.15). Graphs: 5.015 + 24.90 + 3 x 20 x 0.02 = 31.115,
    need 33.365: 0.66635 -> 0.666 (the deficit allows 0.78)."""
    oom = rec(CAPTURE, graph_pass="target_verify", graph_first_begin_avail_gib=20.0,
              graph_begin_avail_gib=18.0, graph_passes_begun=2, graph_passes_ended=2,
              graph_begins=[("target_prefill", 20.0), ("target_verify", 18.0)],
              tried_gib=3.0, free_gib=1.0, **EAGLE3)
    assert proposal(decide(oom, "0.5.10")) == (0.666, 32)


def test_0_5_10_oom_allocating_the_draft_pool_after_the_targets_graphs() -> None:
    """As above, but the draft's weights (1.00) were shown: the 3.00 that failed is the
    draft's pool, which grows with the fraction. Fixed: prefill 2.00, draft weights 1.00,
    0.01. Verify 17 - 1 = 16.00: first step 15.60; the two draft passes 3.90 each; steps
    1.20. Graphs 27.61, need 29.86. The pool is 3.005 of the target's 80 - 40, 0.075125 per
    GiB: m <= (100 - 29.86 + 0.075125 x 40) / (100 x 1.075125) = 73.145 / 107.5125 = 0.68034
    -> 0.680."""
    oom = rec(CAPTURE, graph_pass="target_verify", graph_first_begin_avail_gib=20.0,
              graph_begin_avail_gib=18.0, graph_passes_begun=2, graph_passes_ended=2,
              graph_begins=[("target_prefill", 20.0), ("target_verify", 18.0)],
              tried_gib=3.0, free_gib=1.0, draft_weights_gib=1.0, **EAGLE3)
    assert proposal(decide(oom, "0.5.10")) == (0.68, 32)


# --- small passes: sizes are floored at 0, not at 1 GiB ----------------------------------------


def test_a_small_prefill_pass_and_a_small_first_step_count_as_printed() -> None:
    """Plain decoding on 0.5.23: target prefill began at 20.00 and took 0.50; target decode
    began at 19.50 and failed its first step trying 0.60 with 0.30 free. Fixed: prefill 0.50,
    what decode found gone (19.50 - 0.30 = 19.20), 0.01: 19.71. Decode's first step: 0.605 +
    7 x 0.02 = 0.745, less 8 steps (0.16): 0.585. Graphs 19.71 + 0.585 + 0.16 = 20.455; need
    22.705: 0.77295 -> 0.772 (the deficit allows 0.797)."""
    oom = rec(CAPTURE, graph_pass="target_decode", graph_first_begin_avail_gib=20.0,
              graph_begin_avail_gib=19.5, graph_passes_begun=2, graph_passes_ended=1,
              graph_begins=[("target_prefill", 20.0), ("target_decode", 19.5)],
              tried_gib=0.6, free_gib=0.3)
    assert proposal(decide(oom, "0.5.23")) == (0.772, 32)


def test_a_pass_smaller_than_its_default_steps_counts_as_its_size() -> None:
    """EAGLE on 0.5.23: target verify began at 20.00 and took only 0.20 (less than its 20
    default steps, 0.40); draft decode began at 19.80 and failed its first step trying 3.00
    with 2.50 free. Verify's first step is 0 and its fixed part 0.20 - 0.40 = -0.20, so the
    pass counts 0.20 at bs 32. Fixed: -0.20 + (19.80 - 2.50) + 0.01 = 17.11. Scaled: draft
    decode 3.005 + 19 x 0.02 - 0.40 = 2.985, draft extend to come at 4/1 of it (4 draft
    tokens against topk = 1: draft decode's steps run one after another) 11.94. Graphs 17.11
    + 14.925 + 3 x 20 x 0.02 = 33.235, need 35.485: 0.64515 -> 0.645."""
    oom = rec(CAPTURE, graph_pass="draft_decode", graph_first_begin_avail_gib=20.0,
              graph_begin_avail_gib=19.8, graph_passes_begun=2, graph_passes_ended=1,
              graph_begins=[("target_verify", 20.0), ("draft_decode", 19.8)],
              tried_gib=3.0, free_gib=2.5, **EAGLE3)
    assert proposal(decide(oom, "0.5.23")) == (0.645, 32)


def test_a_failed_prefill_first_step_holds_its_static_buffers_and_scales_the_decode_pass() -> None:
    """Plain decoding on 0.5.23: the target prefill pass (its only pass shown) began at 20.00,
    its progress bar showed 19.70 at the 64-token shape, and its first step failed trying
    0.50 with 0.20 free. The pass held its static buffers (20.00 - 19.70 = 0.30); the rest of
    what is missing (19.80 - 0.30 = 19.50) is needed again but not its size. Prefill is
    0.30 + 0.505 = 0.805, fixed. The decode pass to come runs 32 tokens against prefill's 64:
    half of 0.805 = 0.4025, one pass of 8 steps (0.16). Graphs 19.50 + 0.805 + 0.01 + 0.4025
    + 0.16 = 20.8775, need 23.1275: 0.76872 -> 0.768 (the deficit allows 0.797)."""
    oom = rec(CAPTURE, graph_pass="target_prefill", graph_first_begin_avail_gib=20.0,
              graph_begin_avail_gib=20.0, graph_passes_begun=1, graph_last_avail_gib=19.7,
              graph_last_bs=64, graph_steps_done=0, graph_steps_total=1, tried_gib=0.5,
              free_gib=0.2)
    assert proposal(decide(oom, "0.5.23")) == (0.768, 32)


def test_a_later_step_size_shown_by_an_earlier_oom_sizes_a_pass_fits_steps() -> None:
    """An earlier capture OOM (no pass names) failed a later step trying 0.05: a step is
    0.055 GiB. The next OOM, in the plain decode pass (began 20.00, first step tried 5.00 with
    1.00 free), counts its 7 remaining steps and the pass's 8 at 0.055, not the default 0.02:
    19.00 gone, first step 5.005 + 7 x 0.055 - 8 x 0.055 = 4.95, steps 0.44, 0.01: graphs
    24.40, need 26.65: 0.7335 -> 0.733 (0.735 with 0.02 steps)."""
    earlier = rec(CAPTURE, graph_steps_done=3, graph_steps_total=8, tried_gib=0.05,
                  free_gib=0.03)
    oom = rec(CAPTURE, graph_pass="target_decode", graph_first_begin_avail_gib=20.0,
              graph_begin_avail_gib=20.0, graph_passes_begun=1, tried_gib=5.0, free_gib=1.0)
    decision = next_params(oom.params, Bounds(), [earlier, oom], sglang_version="0.5.23")
    assert proposal(decision) == (0.733, 32)


@pytest.mark.parametrize(("version", "expected"), [("0.5.10", 0.73), ("0.5.23", 0.73)])
def test_a_first_step_oom_in_the_targets_only_pass_is_that_passs(
    version: str, expected: float
) -> None:
    """EAGLE: the target verify pass began at 20.00 (its only line, no end line) and its first
    step failed trying 3.00 with 1.00 free. On either version that is verify's own OOM (not
    0.5.10's draft weights or pool after it, which need the pass's end line): 19.00 gone,
    first step 3.005 + 19 x 0.02 - 0.40 = 2.985, the draft passes to come a quarter of it
    each (1.4925), 3 passes x 20 steps 1.20, 0.01: graphs 24.6875, need 26.9375: 0.73063 ->
    0.730."""
    oom = rec(CAPTURE, graph_pass="target_verify", graph_first_begin_avail_gib=20.0,
              graph_begin_avail_gib=20.0, graph_passes_begun=1, tried_gib=3.0, free_gib=1.0,
              **EAGLE3)
    assert proposal(decide(oom, version)) == (expected, 32)


def test_on_0_5_23_an_oom_after_the_target_pass_ended_is_still_in_that_pass() -> None:
    """0.5.23 loads the draft's weights and pool before any graph, so an OOM after the plain
    decode pass printed its end line is not a draft allocation: it is counted in that pass as
    usual (19.00 gone, first step 5.005 + 7 x 0.02 - 0.16 = 4.985, 8 steps 0.16, 0.01: graphs
    24.155, need 26.405: 0.73595 -> 0.735)."""
    oom = rec(CAPTURE, graph_pass="target_decode", graph_first_begin_avail_gib=20.0,
              graph_begin_avail_gib=20.0, graph_passes_begun=1, graph_passes_ended=1,
              tried_gib=5.0, free_gib=1.0)
    assert proposal(decide(oom, "0.5.23")) == (0.735, 32)


# --- the draft-extend graph switch (0.5.23, [policy] allow_disable_draft_extend_graph) --------


SWITCH = Bounds(graph_bs_floor=32, allow_disable_draft_extend_graph=True)
NO_SWITCH = Bounds(graph_bs_floor=32)
OFF = ("SGLANG_DISABLE_DRAFT_EXTEND_CUDA_GRAPH", "1")


def test_draft_extend_to_come_is_left_out_when_the_switch_turns_it_off() -> None:
    """EAGLE 3 steps on 0.5.23 with weights 64.00 (the KV pool wants (64.00 + 2.00) / 100 =
    0.66) and the graph bs floor at 32. Prefill began at 20.00, verify at 18.00, draft decode
    at 10.00, whose first step tried 3.00 with 2.50 free. Graphs at 32: fixed 2.00 + 7.50 +
    0.01 = 9.51; first steps verify 7.60, draft decode 2.985, draft extend to come 4/1 of it
    (4 draft tokens against topk = 1) 11.94; 3 x 20 steps 1.20: 33.235, need 35.485: 0.645
    leaves too small a pool. Without the switch the most the brackets allow without the
    guesses (margin, warmup) is tried: 1 - 33.235/100 -> 0.667. With it, draft extend is left
    out (its 11.94 and 20 steps): 9.51 + 10.585 + 0.80 = 20.895, need 23.145: 0.76855 ->
    0.768, with SGLANG_DISABLE_DRAFT_EXTEND_CUDA_GRAPH=1."""
    oom = rec(CAPTURE, graph_pass="draft_decode", graph_first_begin_avail_gib=20.0,
              graph_begin_avail_gib=10.0, graph_passes_begun=3, post_weights_avail_gib=36.0,
              graph_begins=[("target_prefill", 20.0), ("target_verify", 18.0),
                            ("draft_decode", 10.0)],
              tried_gib=3.0, free_gib=2.5, **EAGLE3)
    head = ("capture OOM in draft_decode: needed 3.00 GiB, 2.50 free of 100.00 pre-load, "
            "20.00 free when capture began; fraction 0.800→")
    assert decide(oom, "0.5.23", SWITCH) == Decision(
        LaunchParams(0.768, 32, env=(OFF,)),
        head + "0.768, graph bs 32 kept; SGLANG_DISABLE_DRAFT_EXTEND_CUDA_GRAPH=1 (draft "
        "extend graph off); speculative params unchanged")
    assert decide(oom, "0.5.23", NO_SWITCH) == Decision(
        LaunchParams(0.667, 32), head + "0.667, graph bs 32 kept; speculative params unchanged")


def test_a_draft_extend_pass_seen_is_left_out_when_the_switch_turns_it_off() -> None:
    """As above with weights 76.00 (the pool wants 0.78; the KV bound is 0.760): verify began
    at 18.00, draft decode at 10.00, draft extend at 6.00, whose first step tried 2.00 with
    1.50 free. Fixed 2.00 + 4.50 + 0.01 = 6.51; first steps verify 7.60, draft decode 3.60,
    draft extend 2.005 + 0.38 - 0.40 = 1.985; steps 1.20: 20.895, need 23.145: 0.768, too
    little pool. The switch leaves out draft extend's 1.985 and its 20 steps: 18.51, need
    20.76: 0.7924 -> 0.792 (the OOM's deficit allows 0.795). Without it: 1 - 20.895/100 ->
    0.791."""
    oom = rec(CAPTURE, graph_pass="draft_extend", graph_first_begin_avail_gib=20.0,
              graph_begin_avail_gib=6.0, graph_passes_begun=4, post_weights_avail_gib=24.0,
              graph_begins=[("target_prefill", 20.0), ("target_verify", 18.0),
                            ("draft_decode", 10.0), ("draft_extend", 6.0)],
              tried_gib=2.0, free_gib=1.5, **EAGLE3)
    assert decide(oom, "0.5.23", SWITCH).params == LaunchParams(0.792, 32, env=(OFF,))
    assert decide(oom, "0.5.23", NO_SWITCH).params == LaunchParams(0.791, 32)


@pytest.mark.parametrize(("steps", "topk", "expected"),
                         [(2, 1, 0.645), (5, 1, 0.645), (2, 2, 0.704), (5, 2, 0.704)])
def test_draft_extend_to_come_is_scaled_by_topk_not_topk_times_steps(
    steps: int, topk: int, expected: float
) -> None:
    """EAGLE on 0.5.23 with 4 draft tokens: the draft decode graph runs its steps one after
    another on ``bs x topk`` tokens (eagle_worker_v2.draft_forward, l.808; the runner's
    width is ``resolve_num_tokens_per_req("draft_decode")`` = topk), draft extend 4 tokens
    per request, so extend is expected at 4/topk times the decode pass's first step,
    whatever the steps. Prefill began at 20.00, verify at 18.00, draft decode at 10.00 (first
    step tried 3.00, 2.50 free): fixed 2.00 + 7.50 + 0.01 = 9.51; first steps verify 7.60,
    draft decode 2.985; 3 x 20 steps 1.20. topk 1: draft extend 4 x 2.985 = 11.94, graphs
    33.235, need 35.485: 0.64515 -> 0.645. topk 2: 2 x 2.985 = 5.97, graphs 27.265, need
    29.515: 0.70485 -> 0.704. (The old width topk x steps gave 0.704 at 2 steps / topk 1 and
    0.734 at 2 steps / topk 2: graphs 24.28.)"""
    oom = rec(CAPTURE, graph_pass="draft_decode", graph_first_begin_avail_gib=20.0,
              graph_begin_avail_gib=10.0, graph_passes_begun=3,
              graph_begins=[("target_prefill", 20.0), ("target_verify", 18.0),
                            ("draft_decode", 10.0)],
              tried_gib=3.0, free_gib=2.5, speculative_algorithm="EAGLE",
              speculative_num_steps=steps, speculative_eagle_topk=topk,
              speculative_num_draft_tokens=4)
    assert proposal(decide(oom, "0.5.23")) == (expected, 32)


def test_a_pass_oom_at_graph_bs_1_scales_its_first_step_by_1() -> None:
    """Plain decoding at graph max bs 1 (one captured size): the decode pass began at 20.00 and
    its only step tried 5.00 with 1.00 free. At bs 1 the graphs are 19.00 gone + 5.005 (first
    step 4.985 and one 0.02 step) + 0.01 = 24.015, need 26.265: 0.73735 -> 0.737."""
    oom = rec(CAPTURE, LaunchParams(0.8, 1), graph_pass="target_decode",
              graph_first_begin_avail_gib=20.0, graph_begin_avail_gib=20.0,
              graph_passes_begun=1, tried_gib=5.0, free_gib=1.0)
    assert proposal(decide(oom, "0.5.23")) == (0.737, 1)


@pytest.mark.parametrize(
    ("draft_tokens", "shape", "expected"),
    [
        (2, 256, 0.759),  # 32 x 2 tokens against 256: r = 0.25
        (None, 256, 0.756),  # SGLang's auto 4 draft tokens: 32 x 4 / 256 = 0.5
        (None, 64, 0.75),  # 128 tokens against 64: as large, never larger (r = 1)
    ],
)
def test_after_a_failed_prefill_first_step_the_passes_to_come_scale_by_their_tokens(
    draft_tokens: int | None, shape: int, expected: float
) -> None:
    """EAGLE 3 steps on 0.5.23: the target prefill pass began at 20.00, its bar showed 19.70
    at the ``shape``-token graph, and that first step failed trying 0.50 with 0.20 free
    (one size to capture). Fixed: 19.50 missing beyond the static buffers, prefill 0.30 +
    0.505 = 0.805, 0.01: 20.315. The verify pass to come runs 32 x draft tokens against the
    prefill shape: r = min(1, 32 x tokens / shape) of 0.805, the two draft passes a quarter
    of that each: 1.2075 r; 3 passes x 20 steps 1.20. Need 23.765 + 1.2075 r: r = 0.25 ->
    24.0669 -> 0.759; r = 0.5 -> 24.3688 -> 0.756; r = 1 -> 24.9725 -> 0.750."""
    oom = rec(CAPTURE, graph_pass="target_prefill", graph_first_begin_avail_gib=20.0,
              graph_begin_avail_gib=20.0, graph_passes_begun=1, graph_last_avail_gib=19.7,
              graph_last_bs=shape, graph_steps_done=0, graph_steps_total=1, tried_gib=0.5,
              free_gib=0.2, speculative_num_draft_tokens=draft_tokens, **EAGLE3)
    assert proposal(decide(oom, "0.5.23")) == (expected, 32)


def test_after_a_failed_later_prefill_step_the_passes_to_come_are_as_large() -> None:
    """As above, but the prefill pass failed its second (last) step: it held 20.00 - 0.20 =
    19.80 and tried 0.505, 20.305 in all, fixed; the passes to come are not scaled by tokens
    (the failing shape is not the first): verify 20.305, the draft passes 5.07625 each,
    30.4575 scaled. At bs 32 that needs 20.315 + 30.4575 + 1.20 + 2.25 = 54.2225 (0.457,
    below the floor 0.50); at bs 24 (16 sizes) 20.315 + 22.843125 + 0.96 + 2.25 = 46.368125:
    0.53632 -> 0.536."""
    oom = rec(CAPTURE, graph_pass="target_prefill", graph_first_begin_avail_gib=20.0,
              graph_begin_avail_gib=20.0, graph_passes_begun=1, graph_last_avail_gib=0.6,
              graph_last_bs=256, graph_steps_done=1, graph_steps_total=2, tried_gib=0.5,
              free_gib=0.2, **EAGLE3)
    assert proposal(decide(oom, "0.5.23")) == (0.536, 24)


def test_an_oom_at_the_last_step_of_a_pass_has_no_steps_left() -> None:
    """The plain decode pass (began 20.00) failed its 8th and last step trying 0.50 with 0.30
    free: no step remains. It held 19.70 and needs 0.505 more: 20.205, of which the 8 steps
    at the tried size (4.04) less 8 default steps (0.16) stay fixed, 3.88 (3.89 with the
    roundings), and 16.165 is the first step. Graphs 3.89 + 16.165 + 0.16 = 20.215, need
    22.465: 0.77535 -> 0.775."""
    oom = rec(CAPTURE, graph_pass="target_decode", graph_first_begin_avail_gib=20.0,
              graph_begin_avail_gib=20.0, graph_passes_begun=1, graph_steps_done=7,
              graph_steps_total=8, graph_last_avail_gib=0.6, graph_last_bs=1, tried_gib=0.5,
              free_gib=0.3)
    assert proposal(decide(oom, "0.5.23")) == (0.775, 32)


# --- the KV bound from the weights figure ------------------------------------------------------


@pytest.mark.parametrize("post_weights", [4.99, 4.98])
def test_weights_above_the_ceiling_by_a_printed_hundredth_give_up(post_weights: float) -> None:
    """The weights are a difference of two printed figures, each within 0.005: 100.00 -
    4.99 = 95.01 may be 95.00, so a pool needs more than (95.01 - 0.01) / 100 = 0.950, above
    the ceiling 0.95: give up (also at 95.02). A kv_too_small at 0.90 is the attempt."""
    small = rec((Outcome.KV_TOO_SMALL, Phase.KV_CACHE), LaunchParams(0.9, 32),
                post_weights_avail_gib=post_weights)
    assert decide(small, "0.5.23") == Decision(
        None, "the KV cache needs mem_fraction_static > 0.95, above the ceiling 0.950: the "
        "weights leave too little room; the model needs more GPUs (higher tp) or a quantized "
        "model")


def test_weights_at_the_ceiling_within_the_rounding_still_try_the_ceiling() -> None:
    """100.00 - 5.00 = 95.00 may be 94.99: a pool above (95.00 - 0.01) / 100 = 0.9499 may
    exist at 0.950, so the policy tries the ceiling (the cushion's 0.97 is above it)."""
    small = rec((Outcome.KV_TOO_SMALL, Phase.KV_CACHE), LaunchParams(0.9, 32),
                post_weights_avail_gib=5.0)
    assert proposal(decide(small, "0.5.23")) == (0.95, 32)


def test_when_even_without_draft_extend_no_useful_pool_is_estimated_the_optimistic_fit_decides(
) -> None:
    """The draft-decode OOM of the switch test above with weights 79.00: the KV bound is
    (79.00 - 0.01) / 100 -> 0.790, a useful pool wants 0.81. With draft extend, even without
    the guesses (1 - 25.275/100 -> 0.747) the estimate is below the KV bound, so it says
    nothing and the brackets are bisected: (0.790 + 0.799 + 0.001) / 2 -> 0.795. Without
    draft extend the estimate without the guesses is 1 - 20.895/100 -> 0.791, inside the
    brackets: with the switch allowed that is proposed, with the graph off."""
    oom = rec(CAPTURE, graph_pass="draft_decode", graph_first_begin_avail_gib=20.0,
              graph_begin_avail_gib=10.0, graph_passes_begun=3, post_weights_avail_gib=21.0,
              graph_begins=[("target_prefill", 20.0), ("target_verify", 18.0),
                            ("draft_decode", 10.0)],
              tried_gib=3.0, free_gib=2.5, **EAGLE3)
    assert decide(oom, "0.5.23", SWITCH).params == LaunchParams(0.791, 32, env=(OFF,))
    assert decide(oom, "0.5.23", NO_SWITCH).params == LaunchParams(0.795, 32)


# --- speculative decoding: the graph bs is searched at the running-request cap -----------------


@pytest.mark.parametrize("dump_shown_first", [True, False])
def test_a_graph_bs_above_the_spec_cap_is_fitted_at_the_cap_and_kept_as_launched(
    dump_shown_first: bool
) -> None:
    """EAGLE caps the captured graphs at 48 running requests: graph max bs 160 captures 48. A
    first-step capture OOM (no pass names) tried 25.00 with 19.99 free: the slope is 25.005 /
    48 per bs, so at 48 the graphs are 25.005 + 10 steps x 0.02 = 25.205; with 0.005 gone
    before capture, warmup 2.00 and margin 0.25 the need is 27.46: 0.7254 -> 0.725 (the
    deficit allows 0.749). The graph bs stays 160 as launched, or as the dump showed an
    auto one (made explicit). Speculative decoding shown only by an earlier attempt's dump
    counts the same."""
    figures: dict[str, object] = dict(tried_gib=25.0, free_gib=19.99)
    if dump_shown_first:
        params = LaunchParams(0.8, 160)
        history = [rec((Outcome.HANG, Phase.WEIGHTS), params, **EAGLE3),
                   rec(CAPTURE, params, **figures)]
    else:
        params = LaunchParams(0.8, None)
        history = [rec(CAPTURE, params, cuda_graph_max_bs=160, **figures, **EAGLE3)]
    decision = next_params(params, Bounds(), history, sglang_version="0.5.23")
    assert decision.params == LaunchParams(0.725, 160)


# --- which attempts bound the fraction ----------------------------------------------------------


def test_a_hang_is_no_memory_fact() -> None:
    """A hang at 0.70 says nothing about memory: after it the plain decode pass's OOM at 0.80
    (began 20.00, first step tried 5.00 with 1.00 free) goes to 0.735 as on its own (19.00
    gone, 5.005 + 7 x 0.02 - 0.16 first step, 0.16 steps, 0.01: 24.155, need 26.405), above
    the fraction that hung."""
    hang = rec((Outcome.HANG, Phase.WEIGHTS), LaunchParams(0.7, 32))
    oom = rec(CAPTURE, graph_pass="target_decode", graph_first_begin_avail_gib=20.0,
              graph_begin_avail_gib=20.0, graph_passes_begun=1, tried_gib=5.0, free_gib=1.0)
    decision = next_params(hang.params, Bounds(), [hang, oom], sglang_version="0.5.23")
    assert proposal(decision) == (0.735, 32)


def test_a_kv_pool_oom_rules_its_fraction_out_at_every_graph_bs() -> None:
    """The KV pool is allocated before any graph: an OOM allocating it at 0.90 rules out 0.90
    and above at every graph bs, down to 1. With the fraction floor at 0.91 nothing is left:
    give up naming both bounds at the bs floor."""
    oom = rec((Outcome.OOM_KV_CACHE, Phase.KV_CACHE), LaunchParams(0.9, 32), tried_gib=2.0,
              free_gib=1.0)
    assert decide(oom, "0.5.23", Bounds(mem_fraction_floor=0.91)) == Decision(
        None, "no mem_fraction_static fits even at cuda_graph_max_bs=1: the KV cache needs > "
        "0.909, graphs and warmup OOM at >= 0.9 (floor 0.910); the model needs more GPUs "
        "(higher tp) or a quantized model, or disable CUDA graphs")
