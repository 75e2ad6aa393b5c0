"""What the log reader takes from each start-up line: exact figures, phases and events.

From the mutation run (docs/testing.md, "Mutation testing"): these tests pin the behaviour the
surviving mutants of ``launcher/sglang/logparse.py`` showed unpinned. Every line is either
verbatim from a real log in tests/fixtures/real_logs (read from the file by name and line
number; provenance in the ``.toml`` beside it) or written exactly as SGLang's source prints it,
cited as ``file:line`` under ``sglang/srt/`` of 0.5.10 or 0.5.23. Rank prefixes are SGLang's
``[%(asctime)s TPn] ``.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from launcher.sglang import logparse
from launcher.sglang.logparse import (
    MAX_FAILURES,
    FailureSignature,
    Figure,
    LineSplitter,
    LogEvent,
    LogFollower,
    MemoryFigure,
    OomFigures,
    ParsedLine,
    PhaseLine,
    Progress,
    ReadyLine,
    Signature,
    Source,
    Traceback,
    fill_error_figures,
    parse_line,
    parse_oom,
    split_records,
)
from launcher.sglang.outcome import Numbers
from launcher.sglang.phases import GraphPass, Phase

REAL = Path(__file__).parents[1] / "fixtures" / "real_logs"


def real_lines(name: str) -> list[str]:
    """A real log's records, verbatim (``\\r`` redraws split as the splitter splits them)."""
    with open(REAL / name, encoding="utf-8", newline="") as f:
        return split_records(f.read())


def real_line(name: str, number: int) -> str:
    """Line ``number`` (1-based, as ``grep -n`` counts) of a real log, verbatim."""
    with open(REAL / name, encoding="utf-8", newline="") as f:
        return f.read().split("\n")[number - 1].rstrip("\r")


def feed(lines: list[str]) -> tuple[LogFollower, list[LogEvent]]:
    follower = LogFollower()
    events: list[LogEvent] = []
    for line in lines:
        events.extend(follower.feed_line(line))
    events.extend(follower.finish())
    return follower, events


# -- lines SGLang prints, as its source writes them ---------------------------------------------


def load_end(rank: str, model: str, avail: str, usage: str) -> str:
    """0.5.10 model_runner.py:1247 / 0.5.23 model_runner.py:1373."""
    return (f"[2026-06-17 19:52:31 {rank}] Load weight end. elapsed=72.10 s, type={model}, "
            f"avail mem={avail} GB, mem usage={usage} GB.")


def kv_line(rank: str, label: str, tokens: int, k: str, v: str) -> str:
    """0.5.23 memory_pool.py:2088 (``allocation_label`` "Full"/"SWA": swa_memory_pool.py:81,92)."""
    return (f"[2026-06-17 19:52:42 {rank}] {label} KV Cache is allocated. dtype: torch.bfloat16, "
            f"#tokens: {tokens}, K size: {k} GB, V size: {v} GB")


def decode_begin(rank: str, avail: str) -> str:
    """0.5.23 cuda_graph_setup.py:759."""
    return (f"[2026-06-17 19:52:52 {rank}] Capture target decode CUDA graph begin. backend=full, "
            f"num_tokens_per_req=1, avail mem={avail} GB")


def prefill_begin(rank: str, avail: str) -> str:
    """0.5.23 cuda_graph_setup.py:685."""
    return (f"[2026-06-17 19:52:43 {rank}] Capture target prefill CUDA graph begin. "
            f"backend=breakable, num_tokens=[64, 128], avail mem={avail} GB")


def prefill_end(rank: str, usage: str, avail: str) -> str:
    """0.5.23 cuda_graph_setup.py:696."""
    return (f"[2026-06-17 19:52:52 {rank}] Capture target prefill CUDA graph end. "
            f"elapsed=9.20 s, mem usage={usage} GB, avail mem={avail} GB.")


def v0510_graph_end(rank: str, usage: str, avail: str) -> str:
    """0.5.10 model_runner.py:2460."""
    return (f"[2026-06-17 19:53:10 {rank}] Capture cuda graph end. Time elapsed: 3.21 s. "
            f"mem usage={usage} GB. avail mem={avail} GB.")


# tqdm's line for SGLang's capture bar (0.5.10 cuda_graph_runner.py:784, 0.5.23
# decode_cuda_graph_runner.py:1343: desc f"Capturing batches ({bs=} {avail_mem=:.2f} GB)"),
# in tqdm's default format.
DECODE_BAR = ("Capturing batches (bs=32 avail_mem=19.50 GB):  25%|██▌       "
              "| 1/4 [00:01<00:03,  1.02s/it]")
# 0.5.23 prefill_cuda_graph_runner.py:1734
PREFILL_BAR = ("Capturing prefill shape (num_tokens=128 avail_mem=27.96 GB): 100%|██████████"
               "| 2/2 [00:02<00:00,  1.31s/it]")
# A 0.5.10 ServerArgs repr reduced to the fields that matter here (server_args.py prints the
# dataclass repr: "server_args=ServerArgs(model_path=..., ...)").
SPEC_DUMP_0510 = (
    "[2026-06-17 19:51:01] server_args=ServerArgs(model_path='/models/DeepSeek-V3', "
    "mem_fraction_static=0.85, max_running_requests=48, speculative_algorithm='EAGLE', "
    "speculative_num_steps=1, speculative_eagle_topk=1, speculative_num_draft_tokens=2, "
    "cuda_graph_max_bs=32)"
)


# -- readiness, init figures --------------------------------------------------------------------


def test_the_ready_line_event_carries_the_line_and_its_record_number() -> None:
    """The readiness line gives PhaseEntered(READY) and ReadyLine(line verbatim, its index)."""
    lines = real_lines("gh6753_pd_prefill_h200_ready_then_transfer_errors.log")
    ready = next(i for i, line in enumerate(lines) if "fired up" in line)
    follower = LogFollower()
    for line in lines[:ready]:
        follower.feed_line(line)
    assert [PhaseLine(Phase.READY), ReadyLine(lines[ready], ready)] == (
        follower.feed_line(lines[ready])
    )
    assert (ready, lines[ready]) == (follower.ready_line_no, follower.ready_line)


def test_init_and_baseline_usage_are_memory_figures_of_their_rank() -> None:
    """0.5.10's "Init torch distributed ends" (model_runner.py:1021) enters INIT with its
    usage; 0.5.23's "Memory baseline taken" (distributed/bootstrap.py:220) is a figure."""
    follower = LogFollower()
    dist = ("[2026-06-17 19:51:10 TP1] Init torch distributed ends. elapsed=0.52 s, "
            "mem usage=0.31 GB")
    assert [PhaseLine(Phase.INIT), MemoryFigure(Figure.DIST_INIT_USAGE, 0.31, "TP1")] == (
        follower.feed_line(dist)
    )
    baseline = "[2026-06-17 19:51:11 TP0] Memory baseline taken. mem usage=0.44 GB"
    assert [MemoryFigure(Figure.BASELINE_USAGE, 0.44, "TP0")] == follower.feed_line(baseline)


# -- weights ------------------------------------------------------------------------------------


def test_weights_are_the_largest_over_ranks_and_avail_the_smallest() -> None:
    """Each rank's first figure counts: the weights the largest over ranks (the budget must
    hold on every GPU), the avail mem after them the smallest; a draft's (type=...NextN)
    weights are the largest of its ranks' too, and not a second target."""
    n = feed([
        load_end("TP0", "DeepseekV3ForCausalLM", "55.90", "37.50"),
        load_end("TP1", "DeepseekV3ForCausalLM", "55.83", "37.57"),
        load_end("TP0", "DeepseekV3ForCausalLMNextN", "54.31", "1.52"),
        load_end("TP1", "DeepseekV3ForCausalLMNextN", "54.34", "1.49"),
    ])[0].numbers
    assert (37.57, 55.83, 1.52) == (n.weights_gib, n.post_weights_avail_gib, n.draft_weights_gib)


def test_a_ranks_phase_never_moves_back() -> None:
    """A draft model's "Load weight begin" after the target's pool leaves the rank in
    KV_CACHE (0.5.10 loads the draft after the target's pool: model_runner.py:1075, :1247,
    memory_pool.py:696)."""
    follower, _ = feed([
        "[2026-06-17 19:51:19 TP1] Load weight begin. avail mem=93.40 GB",
        load_end("TP1", "DeepseekV3ForCausalLM", "55.83", "37.57"),
        "[2026-06-17 19:52:42 TP1] KV Cache is allocated. #tokens: 1444864, "
        "K size: 12.00 GB, V size: 12.00 GB",
        "[2026-06-17 19:52:32 TP1] Load weight begin. avail mem=31.83 GB",
    ])
    assert Phase.KV_CACHE is follower.phase_of("TP1")


# -- KV pools -----------------------------------------------------------------------------------


def test_the_kv_pool_is_k_plus_v_of_the_real_line() -> None:
    """Real 0.5.x line (gh6753:18): "#tokens: 871371, K size: 53.18 GB, V size: 53.18 GB"."""
    n = feed(real_lines("gh6753_pd_prefill_h200_ready_then_transfer_errors.log"))[0].numbers
    assert (106.36, 871371, None) == (n.kv_pool_gib, n.kv_tokens, n.draft_kv_pool_gib)


def test_labelled_pools_add_up_and_a_second_pool_of_a_label_is_the_drafts() -> None:
    """0.5.23 SWA models print a "Full" and an "SWA" pool per rank: the target's pool is
    their sum; a rank's second pool of a label is the draft model's (summed the same way),
    with the draft's token count from its first line. The largest rank counts."""
    lines = [
        "[2026-06-17 19:51:01] server_args={'model_path': '/models/MiMo', "
        "'speculative_algorithm': 'EAGLE', 'speculative_num_steps': 1}",
        kv_line("TP0", "Full", 1048576, "12.00", "12.00"),
        kv_line("TP0", "SWA", 262144, "3.00", "3.00"),
        kv_line("TP1", "Full", 1048576, "12.01", "12.01"),
        kv_line("TP1", "SWA", 262144, "3.00", "3.00"),
        kv_line("TP0", "Full", 65536, "0.40", "0.40"),
        kv_line("TP0", "SWA", 16384, "0.10", "0.10"),
        kv_line("TP1", "Full", 65536, "0.40", "0.40"),
        kv_line("TP1", "SWA", 16384, "0.05", "0.05"),
    ]
    n = feed(lines)[0].numbers
    assert (30.02, 1048576) == (n.kv_pool_gib, n.kv_tokens)
    assert (1.0, 1.0, 65536) == (n.draft_kv_pool_gib, n.draft_kv_gib, n.draft_kv_tokens)


# -- capture passes -----------------------------------------------------------------------------


def test_a_pass_takes_the_largest_usage_over_ranks_each_ranks_first() -> None:
    """0.5.10, speculative: the bare "Capture cuda graph" pass is the target's verify graph;
    its memory is the largest first figure over the ranks, not the first or last rank's."""
    begin = ("[2026-06-17 19:53:07 {}] Capture cuda graph begin. This can take up to several "
             "minutes. avail mem=28.00 GB")  # model_runner.py:2446
    n = feed([
        SPEC_DUMP_0510,
        *(begin.format(rank) for rank in ("TP0", "TP1", "TP2")),
        v0510_graph_end("TP0", "0.93", "27.07"),
        v0510_graph_end("TP1", "0.97", "27.03"),
        v0510_graph_end("TP2", "0.95", "27.05"),
        v0510_graph_end("TP0", "0.99", "26.08"),  # a second end line of TP0 does not count
    ])[0].numbers
    assert {"target_verify": 0.97} == n.graph_mem_gib


def test_an_end_line_whose_begin_was_lost_names_its_own_pass() -> None:
    """A log followed from the middle (the real gh11949 log starts at the end line) still
    gives the pass's memory, the pass named by the end line itself."""
    n = feed(real_lines("gh11949_warmup_403_proxy.log"))[0].numbers
    assert ({"target_decode": 0.93}, 1) == (n.graph_mem_gib, n.graph_passes_ended)
    n = feed([prefill_end("TP0", "1.10", "26.90")])[0].numbers
    assert {"target_prefill": 1.1} == n.graph_mem_gib
    n = feed([SPEC_DUMP_0510, v0510_graph_end("TP0", "0.93", "27.07")])[0].numbers
    assert {"target_verify": 0.93} == n.graph_mem_gib


def test_a_rank_beginning_a_pass_already_begun_keeps_the_bar_figures() -> None:
    """Ranks capture in lockstep: TP1's begin line after TP0's bar is the same pass, so the
    bar's figures and progress stay."""
    follower, _ = feed([decode_begin("TP0", "20.00"), DECODE_BAR, decode_begin("TP1", "19.90")])
    n = follower.numbers
    assert (19.5, 32, 1, 4) == (
        n.graph_last_avail_gib, n.graph_last_bs, n.graph_steps_done, n.graph_steps_total
    )
    assert ((1, 4), 0.25, 19.9) == (follower.steps, follower.progress, n.graph_begin_avail_gib)


def test_a_new_pass_clears_the_previous_passes_bar() -> None:
    """The decode pass begins with no bar of its own: the prefill bar's figures are gone."""
    follower, _ = feed([prefill_begin("TP0", "28.00"), PREFILL_BAR, decode_begin("TP0", "26.80")])
    n = follower.numbers
    assert (None, None, None, None) == (
        n.graph_last_avail_gib, n.graph_last_bs, n.graph_steps_done, n.graph_steps_total
    )
    assert (None, None) == (follower.steps, follower.progress)
    assert ("target_decode", 2, 26.8) == (n.graph_pass, n.graph_passes_begun,
                                          n.graph_begin_avail_gib)


# -- progress bars ------------------------------------------------------------------------------


def test_a_capture_bar_gives_its_avail_figure_then_its_progress() -> None:
    """The first bar of a phase enters it; a later one gives the figure and the progress."""
    follower = LogFollower()
    assert [
        PhaseLine(Phase.CUDA_GRAPH),
        MemoryFigure(Figure.GRAPH_PROGRESS_AVAIL, 19.5, None),
        Progress(Phase.CUDA_GRAPH, 1, 4),
    ] == follower.feed_line(DECODE_BAR)
    assert [
        MemoryFigure(Figure.GRAPH_PROGRESS_AVAIL, 27.96, None),
        Progress(Phase.CUDA_GRAPH, 2, 2),
    ] == follower.feed_line(PREFILL_BAR)


def test_a_one_shard_model_shows_full_progress() -> None:
    """Real gh2527:5: "Loading safetensors checkpoint shards: 100% Completed | 1/1"."""
    follower = LogFollower()
    line = real_line("gh2527_capture_ninja_missing_laptop.log", 5)
    assert [PhaseLine(Phase.WEIGHTS), Progress(Phase.WEIGHTS, 1, 1)] == (
        follower.feed_line(line)
    )
    assert ((1, 1), 1.0) == (follower.steps, follower.progress)


def test_an_empty_shard_bar_shows_no_fraction() -> None:
    """tqdm with SGLang's BAR_FORMAT (0.5.23 utils/common.py:1414) over no shards prints
    "0/0": the phase and the event come, but no progress fraction (nothing to divide by)."""
    follower = LogFollower()
    line = ("Loading safetensors checkpoint shards:   0% Completed | 0/0 "
            "[00:00<?, ?it/s]")
    assert [PhaseLine(Phase.WEIGHTS), Progress(Phase.WEIGHTS, 0, 0)] == (
        follower.feed_line(line)
    )
    assert (None, None) == (follower.steps, follower.progress)


# -- the args dump ------------------------------------------------------------------------------


GLM5 = "amdissues_glm5_mi355x_tp8_hip_oom_transformers_fallback.log"


def test_a_real_0_5_8_dump_gives_its_settings_and_none_for_unset_ones() -> None:
    """Real gh-issue dump (0.5.8 ServerArgs repr, line 15): ``speculative_algorithm=None``
    stays None and does not stop the fields after it being read."""
    n = feed([real_line(GLM5, 15)])[0].numbers
    assert (0.7718, 512, "no_buffer") == (
        n.mem_fraction_static, n.cuda_graph_max_bs, n.mamba_strategy
    )
    assert (None, None, None) == (
        n.speculative_algorithm, n.speculative_num_steps, n.max_running_requests
    )


def test_a_long_args_dump_is_read_whole() -> None:
    """Only the args dump may be longer than MAX_KEPT_CHARS: the real 0.5.8 dump with a long
    ``--json-model-override-args`` (printed inside the repr) is still read past that."""
    override = "{" + ", ".join(f'"layer_{i}": {{"rope_theta": 10000}}' for i in range(600)) + "}"
    dump = real_line(GLM5, 15).replace("json_model_override_args='{}'",
                                       f"json_model_override_args='{override}'")
    assert dump.index("cuda_graph_max_bs=512") > logparse.MAX_KEPT_CHARS
    n = feed([dump])[0].numbers
    assert (512, "no_buffer") == (n.cuda_graph_max_bs, n.mamba_strategy)


def test_args_key_reads_every_name_in_both_dump_spellings() -> None:
    """``_args_key`` builds the module's dump patterns at import (so mutation testing reaches
    it only through a direct call): each name, ``name=value`` (0.5.10 repr) or ``'name':
    value`` (0.5.23 dict)."""
    pattern = logparse._args_key("mamba_scheduler_strategy", "mamba_radix_cache_strategy")
    for text, value in [
        ("ServerArgs(model_path='m', mamba_scheduler_strategy='extra_buffer')", "extra_buffer"),
        ("{'model_path': 'm', 'mamba_radix_cache_strategy': 'no_buffer'}", "no_buffer"),
    ]:
        m = pattern.search(text)
        assert m is not None and value == m.group(1)
    assert pattern.search("ServerArgs(model_path='m', mamba_ssm_dtype='float32')") is None


# -- OOM figures --------------------------------------------------------------------------------


def test_each_line_of_a_reflowed_oom_message_gives_its_own_figures() -> None:
    """Real gh23769 (an OOM message reflowed one sentence per line): the capacity line alone
    gives free, total and GPU; the "Tried to allocate" line alone gives the tried size."""
    name = "gh23769_dsv4_eagle_2node_capture_oom_reflowed.log"
    assert OomFigures(None, 200.75 / 1024, 140.06, 0) == parse_oom(real_line(name, 4))
    assert OomFigures(tried_gib=672 / 1024) == parse_oom(real_line(name, 2))
    assert parse_oom(real_line(name, 1)) is None  # "CUDA out of memory." states no figure


def test_the_first_oom_figures_are_kept_and_an_overwrite_replaces_them() -> None:
    """Eight ranks each raise an OOM (real GLM-5 log): the follower keeps the first one's
    figures; ``fill_error_figures(overwrite=True)`` replaces them with another's."""
    lines = real_lines(GLM5)
    n = feed(lines)[0].numbers
    assert (12.0, 3.88, 287.98, 3) == (n.tried_gib, n.free_gib, n.total_gib, n.gpu)
    fill_error_figures(n, real_line(GLM5, 489), overwrite=True)
    assert (12.0, 3.89, 287.98, 2) == (n.tried_gib, n.free_gib, n.total_gib, n.gpu)
    fresh = Numbers()
    fill_error_figures(fresh, real_line(GLM5, 489), overwrite=False)
    assert 2 == fresh.gpu


# -- tracebacks ---------------------------------------------------------------------------------


def test_a_full_failure_list_does_not_grow_with_an_open_traceback() -> None:
    """With MAX_FAILURES kept, a traceback still being read is not added."""
    follower = LogFollower()
    for i in range(MAX_FAILURES):  # NCCL's WARN line format (debug.cc), one per peer
        follower.feed_line(f"gpu-node-12:1180825:1180825 [0] misc/socket.cc:484 NCCL WARN "
                           f"socketStartConnect: Connect to 10.99.91.{i}<58525> failed : "
                           "Connection refused")
    follower.feed_line("Traceback (most recent call last):")
    assert MAX_FAILURES == len(follower.failures())


def test_two_tracebacks_apart_without_a_chain_line_are_two() -> None:
    """A blank line then a new header, with no "During handling" line between, ends the
    first traceback: each rank's own (bare) traceback is a record of its own."""
    tb = [
        "Traceback (most recent call last):",
        '  File "/sgl-workspace/sglang/python/sglang/srt/managers/scheduler.py", line 2311, '
        "in run_scheduler_process",
        "    scheduler = Scheduler(server_args, port_args, gpu_id, tp_rank, dp_rank)",
        "RuntimeError: NCCL error in: ../torch/csrc/distributed/c10d/NCCLUtils.hpp:275, "
        "unhandled system error",
    ]
    _, events = feed([*tb, "", *tb])
    assert 2 == len([e for e in events if isinstance(e, Traceback)])


def test_a_message_is_bounded_and_resumes_after_its_blank_line() -> None:
    """An exception message keeps at most 200 lines, also when SGLang's advice resumes it
    after a blank line ("Capture cuda graph failed: {e}\\n" + "Possible solutions:",
    0.5.10 cuda_graph_runner.py)."""
    head = [
        "Traceback (most recent call last):",
        '  File "/sgl-workspace/sglang/python/sglang/srt/model_executor/cuda_graph_runner.py",'
        " line 388, in __init__",
        "    self.capture()",
        "Exception: Capture cuda graph failed: CUDA out of memory.",
    ]
    _, events = feed([*head, "", "Possible solutions:", "1. set --mem-fraction-static"])
    (tb,) = [e for e in events if isinstance(e, Traceback)]
    assert ("Capture cuda graph failed: CUDA out of memory.\nPossible solutions:\n"
            "1. set --mem-fraction-static") == tb.message
    # torch's C++ frames continue a message at column 0 (real gh3254:2 shows the format)
    filler = [f"frame #{i}: c10::Error::Error(c10::SourceLocation, std::string) + 0x96 "
              "(0x7ea82996c446 in /opt/conda/envs/sglang/lib/python3.10/site-packages/torch/"
              "lib/libc10.so)" for i in range(250)]
    _, events = feed([*head, *filler, "", "Possible solutions:"])
    (tb,) = [e for e in events if isinstance(e, Traceback)]
    assert tb.message is not None
    assert 200 == len(tb.message.split("\n"))
    assert "Possible solutions:" not in tb.message


def test_a_header_while_frames_are_read_closes_the_first_traceback() -> None:
    """All ranks fail at once (real gh2384, eight schedulers): TP0's prefixed header arriving
    while TP4's frames are being read ends TP4's traceback, cut short, as a record of its
    own; TP0's is read whole."""
    name = "gh2384_rocm_mi300_tp8_triton_shared_mem_no_wrapper.log"
    tp4 = [real_line(name, n) for n in (112, 113, 114)]
    tp0 = [real_line(name, n) for n in range(183, 253)]
    follower = LogFollower()
    for line in tp4:
        assert [] == [e for e in follower.feed_line(line) if isinstance(e, Traceback)]
    events = follower.feed_line(tp0[0])
    for line in tp0[1:]:
        events.extend(follower.feed_line(line))
    events.extend(follower.finish())
    assert [
        (0, tp4[0], "TP4", None),
        (3, tp0[0], "TP0", "triton.runtime.errors.OutOfResources"),
    ] == [(t.line_no, t.header, t.rank, t.exc_type) for t in events if isinstance(t, Traceback)]


def test_an_exception_class_without_the_usual_suffix_ends_a_traceback() -> None:
    """Real gh2384:181: ``triton.runtime.errors.OutOfResources: out of resource: ...`` is the
    exception line, though its name ends in none of Error/Exception/Exit/Interrupt."""
    name = "gh2384_rocm_mi300_tp8_triton_shared_mem_no_wrapper.log"
    _, events = feed([real_line(name, n) for n in range(112, 183)])
    (tb,) = [e for e in events if isinstance(e, Traceback)]
    assert ("triton.runtime.errors.OutOfResources", real_line(name, 181)) == (
        tb.exc_type, tb.exceptions[-1].line
    )


def test_a_traceback_and_a_failure_line_carry_the_phase_of_their_own_rank() -> None:
    """Before warmup each rank is at its own phase: TP1, still initialising while TP0 loads
    weights, warns of unbalanced memory (0.5.10 model_runner.py:1013, logged as a warning) and
    then raises; both records carry INIT, not the global WEIGHTS."""
    unbalanced = (
        "[2026-06-17 19:51:12 TP1] The memory capacity is unbalanced. Some GPUs may be occupied "
        "by other processes. pre_model_load_memory=70.12, local_gpu_memory=79.21, "
        "local_gpu_memory * 0.9=71.289"
    )
    lines = [
        "[2026-06-17 19:51:10 TP0] Init torch distributed ends. elapsed=0.52 s, "
        "mem usage=0.31 GB",
        "[2026-06-17 19:51:11 TP0] Load weight begin. avail mem=78.80 GB",
        "[2026-06-17 19:51:11 TP1] Init torch distributed begin.",  # model_runner.py:891
        unbalanced,
        "[2026-06-17 19:51:12 TP1] Scheduler hit an exception: Traceback (most recent call "
        "last):",  # scheduler.py:3620
        '  File "/sgl-workspace/sglang/python/sglang/srt/managers/scheduler.py", line 2311, '
        "in run_scheduler_process",
        "RuntimeError: The memory capacity is unbalanced. Some GPUs may be occupied by other "
        "processes.",
    ]
    follower, events = feed(lines)
    assert Phase.WEIGHTS is follower.phase
    sig = next(e for e in events if isinstance(e, FailureSignature))
    assert FailureSignature(Signature.GPU_BUSY, unbalanced, 3, "TP1", Phase.INIT, False) == sig
    (tb,) = [e for e in events if isinstance(e, Traceback)]
    assert ("TP1", Phase.INIT) == (tb.rank, tb.phase)


def test_a_line_interleaved_in_frames_is_not_part_of_the_traceback() -> None:
    """torch's NCCL watchdog (real gh3368:13) writes while a traceback's frames are being
    printed: its signature is its own (no rank, outside the traceback) and not one of the
    traceback's."""
    name = "gh2384_rocm_mi300_tp8_triton_shared_mem_no_wrapper.log"
    watchdog = real_line("gh3368_2node_watchdog_timeout_after_load.log", 13)
    lines = [real_line(name, 112), real_line(name, 113), watchdog,
             *(real_line(name, n) for n in range(114, 182))]
    _, events = feed(lines)
    sigs = [e for e in events if isinstance(e, FailureSignature) and e.line == watchdog]
    assert [FailureSignature(Signature.NCCL_ERROR, watchdog, 2, None, None, False)] == sigs
    (tb,) = [e for e in events if isinstance(e, Traceback)]
    assert Signature.NCCL_ERROR not in tb.signatures


def test_killed_logged_behind_a_prefix_is_not_the_shells_line() -> None:
    """``Killed`` means the OOM killer only as a shell's own bare line; a message that
    reads "Killed" behind SGLang's prefix is not that signature."""
    follower = LogFollower()
    assert [] == follower.feed_line("[2026-06-17 19:53:02 TP0] Killed")
    assert [Signature.KILLED] == [
        e.kind for e in follower.feed_line("Killed") if isinstance(e, FailureSignature)
    ]


def test_a_kv_too_small_line_gives_the_fraction_it_states() -> None:
    """Real gpustack3831:1 (0.5.6 on Ascend): the follower copies what a "Not enough memory"
    line states into its numbers, as it does for an OOM line."""
    line = real_line("gpustack3831_ascend_sglang056_not_enough_memory_line.log", 1)
    follower = LogFollower()
    assert [Signature.KV_TOO_SMALL] == [
        e.kind for e in follower.feed_line(line) if isinstance(e, FailureSignature)
    ]
    assert 0.2 == follower.numbers.mem_fraction_static


# -- records, kept text, prefixes ---------------------------------------------------------------


def test_lines_longer_than_the_limit_are_cut_into_pieces_of_the_limit() -> None:
    """A line beyond ``max_line`` is cut into pieces of exactly ``max_line`` (a line of the
    limit is one piece), the same whether it arrives whole or in chunks."""
    line = real_line("gh11949_warmup_403_proxy.log", 1)
    size = 53
    pieces = [line[:size], line[size:]]
    assert [size, size] == [len(p) for p in pieces]
    assert pieces == split_records(line + "\n", max_line=size)
    assert [*pieces, "x"] == split_records(line + "x", max_line=size)
    splitter = LineSplitter(max_line=size)
    assert pieces[:1] == splitter.feed(line[:80].encode())
    assert [] == splitter.feed(line[80:].encode())  # the limit exactly: held, not cut
    assert pieces[1:] == splitter.feed(b"\n")
    assert [] == splitter.flush()


def test_a_log_cut_inside_a_character_ends_with_a_replacement() -> None:
    """A process killed while writing a bar's █ leaves half a UTF-8 sequence: flush gives
    the last line with U+FFFD, not nothing."""
    bar = "Capturing batches (bs=32 avail_mem=19.50 GB):  25%|█".encode()
    splitter = LineSplitter()
    assert [] == splitter.feed(bar[:-1])
    assert ["Capturing batches (bs=32 avail_mem=19.50 GB):  25%|\ufffd"] == splitter.flush()


def test_the_tail_keeps_a_line_of_the_limit_whole_and_cuts_a_longer_one_with_a_note() -> None:
    """``last_lines`` holds at most MAX_KEPT_CHARS of a line, plus how much was cut."""
    limit = logparse.MAX_KEPT_CHARS
    dump = real_line(GLM5, 15)
    exact = (dump * 2)[:limit]
    longer = dump + dump[: limit - len(dump) + 10]
    follower = LogFollower()
    follower.feed_line(exact)
    follower.feed_line(longer)
    assert [exact, longer[:limit] + " …[10 characters cut]"] == list(follower.last_lines)


def test_a_rank_line_has_no_uvicorn_level() -> None:
    """Real gh6753:8 (no rank) and a TP line: SGLang's own lines carry no level."""
    line = real_line("gh6753_pd_prefill_h200_ready_then_transfer_errors.log", 8)
    assert ParsedLine(raw=line, message="Load weight begin. avail mem=139.20 GB",
                      source=Source.SGLANG, timestamp="2025-05-29 23:22:54") == parse_line(line)
    tp = "[2025-10-16 09:06:10 TP3] Load weight begin. avail mem=137.29 GB"
    assert ParsedLine(raw=tp, message="Load weight begin. avail mem=137.29 GB",
                      source=Source.SGLANG, timestamp="2025-10-16 09:06:10",
                      rank="TP3") == parse_line(tp)


# -- figure events of the pool, capture and summary lines ---------------------------------------


def test_kv_lines_give_their_k_v_or_kv_figures() -> None:
    """0.5.10 memory_pool.py:696 (K and V) and :702 (MLA's one KV size)."""
    follower = LogFollower()
    kv = ("[2026-06-17 19:52:42 TP0] KV Cache is allocated. #tokens: 655360, "
          "K size: 12.00 GB, V size: 8.00 GB")
    assert [
        PhaseLine(Phase.KV_CACHE),
        MemoryFigure(Figure.KV_K_SIZE, 12.0, "TP0"),
        MemoryFigure(Figure.KV_V_SIZE, 8.0, "TP0"),
    ] == follower.feed_line(kv)
    mla = "[2026-06-17 19:52:42 TP1] KV Cache is allocated. #tokens: 1444864, KV size: 24.32 GB"
    assert [MemoryFigure(Figure.KV_SIZE, 24.32, "TP1")] == follower.feed_line(mla)
    assert 24.32 == follower.numbers.kv_pool_gib  # the largest rank's pool


def test_the_capture_end_and_summary_lines_give_their_figures() -> None:
    """Real gh11949:1-2: the capture end's usage and avail, then the summary's tokens and
    what was free at ready."""
    follower = LogFollower()
    end, summary = (real_line("gh11949_warmup_403_proxy.log", n) for n in (1, 2))
    assert [
        MemoryFigure(Figure.GRAPH_END_USAGE, 0.93, None),
        MemoryFigure(Figure.GRAPH_END_AVAIL, 52.97, None),
    ] == follower.feed_line(end)
    assert [PhaseLine(Phase.WARMUP), MemoryFigure(Figure.SUMMARY_AVAIL, 52.97, None)] == (
        follower.feed_line(summary)
    )
    assert (154231, 52.97) == (follower.numbers.max_total_num_tokens,
                               follower.numbers.ready_avail_gib)


def test_the_largest_batch_size_any_capture_line_lists_is_kept() -> None:
    """0.5.10 cuda_graph_runner.py:570 lists the target's batch sizes, 0.5.23 draft decode
    (eagle_worker_v2.py:515) the draft's; the largest counts, and an empty list
    (cuda_graph_setup.py:788 over no sizes) gives nothing."""
    follower = LogFollower()
    follower.feed_line("[2026-06-17 19:53:10 TP0] Capture cuda graph bs [1, 2, 4, 8, 16, 24, 32]")
    assert 32 == follower.numbers.graph_captured_max_bs
    follower.feed_line("[2026-06-17 19:53:20 TP0] Capture draft decode CUDA graph begin. "
                       "backend=full, num_tokens_per_req=1, bs=[1, 2, 4, 8], avail mem=9.00 GB")
    assert 32 == follower.numbers.graph_captured_max_bs
    empty = LogFollower()
    empty.feed_line("[2026-06-17 19:53:30 TP0] Capture target decode CUDA graph end. bs=[], "
                    "elapsed=0.01 s, mem usage=0.00 GB, avail mem=20.00 GB.")
    assert empty.numbers.graph_captured_max_bs is None


def test_the_single_cg_draft_extend_pass_is_read_begin_to_end() -> None:
    """0.5.23's single-CG runner (multi_layer_eagle_draft_extend_cuda_graph_runner.py:1025,
    :1039) spells begin and end without "graph": its end is still an ended pass with its
    memory."""
    n = feed([
        "[2026-06-17 19:51:01] server_args={'model_path': '/models/MiMo', "
        "'speculative_algorithm': 'EAGLE', 'speculative_num_steps': 3}",
        "[2026-06-17 19:53:40 TP0] Capture single-CG draft extend begin. This can take several "
        "minutes. avail mem=9.00 GB",
        "[2026-06-17 19:53:52 TP0] Capture single-CG draft extend end. elapsed=12.31 s, "
        "mem usage=0.62 GB, avail mem=8.38 GB.",
    ])[0].numbers
    assert ("draft_extend", 1, 1, {"draft_extend": 0.62}) == (
        n.graph_pass, n.graph_passes_begun, n.graph_passes_ended, n.graph_mem_gib
    )


_USAGE = "mem usage=0.50 GB, avail mem=8.50 GB."
_USAGE_0510 = "Time elapsed: 3.21 s. mem usage=0.50 GB. avail mem=8.50 GB."


@pytest.mark.parametrize(
    ("begin", "end", "speculative", "gpass"),
    [
        # 0.5.10 model_runner.py:2446/2460, :2566/2574; eagle_worker.py:250/257, :265/272;
        # multi_layer_eagle_draft_extend_cuda_graph_runner.py:683/698
        ("Capture cuda graph begin. This can take up to several minutes. avail mem=9.00 GB",
         f"Capture cuda graph end. {_USAGE_0510}", False, GraphPass.TARGET_DECODE),
        ("Capture cuda graph begin. This can take up to several minutes. avail mem=9.00 GB",
         f"Capture cuda graph end. {_USAGE_0510}", True, GraphPass.TARGET_VERIFY),
        ("Capture piecewise CUDA graph begin. avail mem=9.00 GB",
         f"Capture piecewise CUDA graph end. {_USAGE_0510}", False, GraphPass.TARGET_PREFILL),
        ("Capture draft cuda graph begin. This can take up to several minutes. "
         "avail mem=9.00 GB",
         f"Capture draft cuda graph end. {_USAGE_0510}", True, GraphPass.DRAFT_DECODE),
        ("Capture draft extend cuda graph begin. This can take up to several minutes. "
         "avail mem=9.00 GB",
         f"Capture draft extend cuda graph end. {_USAGE_0510}", True, GraphPass.DRAFT_EXTEND),
        ("Capture draft extend cuda graph begin (step 2). This can take up to several minutes. "
         "avail mem=9.00 GB",
         f"Capture draft extend cuda graph end. {_USAGE_0510}", True, GraphPass.DRAFT_EXTEND),
        # 0.5.23 cuda_graph_setup.py:685/696, :759/788; eagle_worker_v2.py:515/533, :634/654;
        # multi_layer_eagle_draft_extend_cuda_graph_runner.py:632/641, :1025/1039;
        # uno_worker_v2.py:166/187
        ("Capture target prefill CUDA graph begin. backend=breakable, num_tokens=[64], "
         "avail mem=9.00 GB",
         f"Capture target prefill CUDA graph end. elapsed=1.00 s, {_USAGE}", True,
         GraphPass.TARGET_PREFILL),
        ("Capture draft prefill CUDA graph begin. backend=breakable, num_tokens=[64], "
         "avail mem=9.00 GB",
         f"Capture draft prefill CUDA graph end. elapsed=1.00 s, {_USAGE}", True,
         GraphPass.DRAFT_PREFILL),
        ("Capture target decode CUDA graph begin. backend=full, num_tokens_per_req=1, "
         "avail mem=9.00 GB",
         f"Capture target decode CUDA graph end. bs=[1, 2], elapsed=1.00 s, {_USAGE}", False,
         GraphPass.TARGET_DECODE),
        ("Capture target verify CUDA graph begin. backend=full, num_tokens_per_req=4, "
         "avail mem=9.00 GB",
         f"Capture target verify CUDA graph end. bs=[1, 2], elapsed=1.00 s, {_USAGE}", True,
         GraphPass.TARGET_VERIFY),
        ("Capture draft decode CUDA graph begin. backend=full, num_tokens_per_req=1, "
         "bs=[1, 2], avail mem=9.00 GB",
         f"Capture draft decode CUDA graph end. elapsed=1.00 s, {_USAGE}", True,
         GraphPass.DRAFT_DECODE),
        ("Capture draft extend CUDA graph begin. backend=full, num_tokens_per_req=4, "
         "bs=[1, 2], avail mem=9.00 GB",
         f"Capture draft extend CUDA graph end. elapsed=1.00 s, {_USAGE}", True,
         GraphPass.DRAFT_EXTEND),
        ("Capture draft extend CUDA graph begin. step=1, avail mem=9.00 GB",
         f"Capture draft extend CUDA graph end. step=1, elapsed=1.00 s, {_USAGE}", True,
         GraphPass.DRAFT_EXTEND),
        ("Capture single-CG draft extend begin. This can take several minutes. "
         "avail mem=9.00 GB",
         f"Capture single-CG draft extend end. elapsed=1.00 s, {_USAGE}", True,
         GraphPass.DRAFT_EXTEND),
        ("Capture UNO tree draft CUDA graph begin. num_tokens_per_req=4, avail mem=9.00 GB",
         f"Capture UNO tree draft CUDA graph end. elapsed=1.00 s, {_USAGE}", True,
         GraphPass.DRAFT_DECODE),
    ],
)
def test_every_end_line_names_the_pass_its_begin_line_opened(
    begin: str, end: str, speculative: bool, gpass: GraphPass
) -> None:
    """Each pass's memory is filed under its pass whether its begin line was read (the
    rank's current pass) or lost (the end line names the pass itself): every begin/end pair
    SGLang prints names the same pass."""
    prefix = "[2026-06-17 19:53:00 TP0] "
    dump = [SPEC_DUMP_0510] if speculative else []
    with_begin = feed([*dump, prefix + begin, prefix + end])[0].numbers
    end_only = feed([*dump, prefix + end])[0].numbers
    assert {gpass.value: 0.5} == with_begin.graph_mem_gib == end_only.graph_mem_gib
    assert gpass.value == with_begin.graph_pass
