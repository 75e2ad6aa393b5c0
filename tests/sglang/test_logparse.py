"""Tests for launcher.sglang.logparse: record splitting, line prefixes, the follower's events."""

from __future__ import annotations

import itertools
from pathlib import Path
from typing import TypeVar

import pytest
from hypothesis import given
from hypothesis import strategies as st

from launcher.params import LaunchParams
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
    PhaseLine,
    Progress,
    ReadyLine,
    Signature,
    Source,
    Traceback,
    fill_error_figures,
    graph_pass_of,
    match_signatures,
    parse_line,
    parse_oom,
    parse_size_gib,
    split_records,
)
from launcher.sglang.outcome import Numbers
from launcher.sglang.phases import GraphPass, Phase

LOGS = Path(__file__).parents[1] / "data" / "logs"
T = TypeVar("T")


def read_log(name: str) -> str:
    """A fixture log exactly as written, ``\\r`` included."""
    with open(LOGS / name, encoding="utf-8", newline="") as f:
        return f.read()


def follow(text: str) -> tuple[LogFollower, list[LogEvent]]:
    follower = LogFollower()
    events: list[LogEvent] = []
    for line in split_records(text):
        events.extend(follower.feed_line(line))
    events.extend(follower.finish())
    return follower, events


def of_type(events: list[LogEvent], kind: type[T]) -> list[T]:
    return [e for e in events if isinstance(e, kind)]


# -- records ----------------------------------------------------------------------------------


def test_split_records_splits_on_cr_and_lf() -> None:
    """tqdm redraws (\\r) and log lines (\\n, \\r\\n) each end a record."""
    text = "a\r\nb\rbar 1/2\rbar 2/2\nc"
    assert ["a", "b", "bar 1/2", "bar 2/2", "c"] == split_records(text)


def test_split_records_keeps_blank_lines_but_not_empty_redraws() -> None:
    """A blank line is a record; the empty piece before a redraw's leading \\r is not."""
    text = "line\n\rbar 0/5\rbar 5/5\n\nTraceback (most recent call last):\n"
    assert ["line", "bar 0/5", "bar 5/5", "", "Traceback (most recent call last):"] == (
        split_records(text)
    )


def test_line_splitter_handles_cut_utf8_and_cut_crlf() -> None:
    """A chunk may end inside a UTF-8 sequence (the bar's █) or between \\r and \\n."""
    data = "Capturing █▏ 1/36\r\nnext\n".encode()
    cut = data.index("█".encode()) + 1
    splitter = LineSplitter()
    lines = splitter.feed(data[:cut])
    lines += splitter.feed(data[cut : data.index(b"\r") + 1])
    lines += splitter.feed(data[data.index(b"\r") + 1 :])
    lines += splitter.flush()
    assert ["Capturing █▏ 1/36", "next"] == lines


def test_line_splitter_flush_returns_unterminated_last_line() -> None:
    """The last line of a log that ends without a newline comes out on flush."""
    splitter = LineSplitter()
    assert ["a"] == splitter.feed(b"a\npartial")
    assert ["partial"] == splitter.flush()
    assert [] == splitter.flush()


def test_line_splitter_replaces_invalid_utf8() -> None:
    """Bytes that are not UTF-8 become U+FFFD instead of raising."""
    splitter = LineSplitter()
    assert ["a\ufffdb"] == splitter.feed(b"a\xffb\n")


@given(
    text=st.text(alphabet=st.sampled_from(list("ab █é\r\n\t[]:"))),
    cuts=st.lists(st.integers(min_value=0, max_value=400), max_size=12),
)
def test_any_chunking_gives_the_same_lines(text: str, cuts: list[int]) -> None:
    """Feeding a log's bytes in any chunks gives exactly split_records of the whole text."""
    data = text.encode()
    bounds = sorted({min(c, len(data)) for c in cuts} | {0, len(data)})
    splitter = LineSplitter()
    lines: list[str] = []
    for start, end in itertools.pairwise(bounds):
        lines.extend(splitter.feed(data[start:end]))
    lines.extend(splitter.flush())
    assert split_records(text) == lines


@given(data=st.binary(max_size=200), cuts=st.lists(st.integers(0, 200), max_size=8))
def test_any_chunking_of_arbitrary_bytes_gives_the_same_lines(data: bytes, cuts: list[int]) -> None:
    """Even invalid UTF-8 splits the same way whatever the chunking."""
    bounds = sorted({min(c, len(data)) for c in cuts} | {0, len(data)})
    chunked = LineSplitter()
    lines: list[str] = []
    for start, end in itertools.pairwise(bounds):
        lines.extend(chunked.feed(data[start:end]))
    lines.extend(chunked.flush())
    whole = LineSplitter()
    assert whole.feed(data) + whole.flush() == lines


@given(
    text=st.text(alphabet=st.sampled_from(list("abc\r\n")), max_size=60),
    cuts=st.lists(st.integers(0, 60), max_size=8),
)
def test_overlong_lines_are_cut_the_same_way_whatever_the_chunking(
    text: str, cuts: list[int]
) -> None:
    """A runaway line is cut into max_line pieces independently of chunk borders."""
    data = text.encode()
    bounds = sorted({min(c, len(data)) for c in cuts} | {0, len(data)})
    splitter = LineSplitter(max_line=4)
    lines: list[str] = []
    for start, end in itertools.pairwise(bounds):
        lines.extend(splitter.feed(data[start:end]))
    lines.extend(splitter.flush())
    assert split_records(text, max_line=4) == lines
    assert all(len(line) <= 4 for line in lines)


def test_fixture_logs_split_the_same_in_chunks_of_any_small_size() -> None:
    """Every fixture log gives the same records fed in 1..64-byte chunks as split whole."""
    for path in sorted(LOGS.glob("*.log")):
        text = read_log(path.name)
        data = text.encode()
        expected = split_records(text)
        for size in (1, 7, 64):
            splitter = LineSplitter()
            lines = [
                ln for i in range(0, len(data), size) for ln in splitter.feed(data[i : i + size])
            ]
            assert expected == lines + splitter.flush(), (path.name, size)


# -- prefixes -------------------------------------------------------------------------------


def test_parse_line_reads_timestamp_rank_and_message() -> None:
    """A scheduler line gives its timestamp, its rank and the message after the prefix."""
    p = parse_line("[2025-10-16 09:06:10 TP3] Load weight begin. avail mem=137.29 GB")
    assert Source.SGLANG == p.source
    assert "2025-10-16 09:06:10" == p.timestamp
    assert "TP3" == p.rank
    assert {"TP": 3} == p.ranks
    assert "Load weight begin. avail mem=137.29 GB" == p.message


def test_parse_line_reads_every_rank_part_and_milliseconds() -> None:
    """All six rank parts (0.5.23) and the SGLANG_LOG_MS milliseconds are read."""
    p = parse_line(
        "[2026-05-02 08:31:18.042 DP0 TP1 PP0 EP2 ATTN_CP0 MOE_DP0] Init parallel begin."
    )
    assert "DP0 TP1 PP0 EP2 ATTN_CP0 MOE_DP0" == p.rank
    assert {"DP": 0, "TP": 1, "PP": 0, "EP": 2, "ATTN_CP": 0, "MOE_DP": 0} == p.ranks
    assert 42 == p.millis
    assert p.when is not None and 42000 == p.when.microsecond


def test_parse_line_without_rank_has_none() -> None:
    """TP=1 and main-process lines have a timestamp and no rank."""
    p = parse_line("[2025-06-19 15:12:27] Load weight end. avail mem=21.96 GB")
    assert (Source.SGLANG, None, {}) == (p.source, p.rank, p.ranks)


def test_parse_line_reads_uvicorn_level() -> None:
    """A uvicorn line gives its level and the message without the padded level prefix."""
    p = parse_line(
        "[2025-08-13 11:01:02] INFO:     Uvicorn running on http://0.0.0.0:25600 (Press CTRL+C)"
    )
    assert Source.UVICORN == p.source
    assert "INFO" == p.level
    assert p.message.startswith("Uvicorn running on http://0.0.0.0:25600")


@pytest.mark.parametrize(
    "line",
    [
        "Traceback (most recent call last):",
        '  File "x.py", line 1, in <module>',
        "Capturing batches (bs=8 avail_mem=2.85 GB):  12%|█▏ | 4/35 [00:01<00:10, 3.1it/s]",
        "/opt/sglang/launch_server.py:36: UserWarning: 'python -m sglang.launch_server' is ...",
        "[W1130 06:12:52.771084120 socket.cpp:462] [c10d] waitForInput: poll returned 0",
        "",
    ],
)
def test_parse_line_leaves_bare_lines_whole(line: str) -> None:
    """Tracebacks, bars, warnings and torch's own bracketed lines have no SGLang prefix."""
    p = parse_line(line)
    assert (Source.BARE, line, None, None) == (p.source, p.message, p.timestamp, p.rank)


# -- sizes and OOM figures ----------------------------------------------------------------------


@pytest.mark.parametrize(
    ("number", "unit", "gib"),
    [("512", "bytes", 512 / 2**30), ("1.5", "KiB", 1.5 / 2**20), ("448.00", "MiB", 0.4375),
     ("7.50", "GiB", 7.5), ("2.00", "TiB", 2048.0), ("21.96", "GB", 21.96)],
)  # fmt: skip
def test_parse_size_gib_converts_every_unit(number: str, unit: str, gib: float) -> None:
    """torch's format_size units (and SGLang's "GB", which is GiB) convert to GiB."""
    assert gib == pytest.approx(parse_size_gib(number, unit))


def test_parse_size_gib_rejects_unknown_units() -> None:
    """An unknown unit is an error, not a silent wrong number."""
    with pytest.raises(ValueError, match="unknown size unit"):
        parse_size_gib("1", "parsecs")


def test_parse_oom_reads_new_torch_format() -> None:
    """The seed's OOM line gives tried, free, total and the GPU."""
    line = (
        "torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 7.50 GiB. GPU 1 has a "
        "total capacity of 94.97 GiB of which 2.30 GiB is free. Including non-PyTorch memory, "
        "this process has 92.67 GiB memory in use. Of the allocated memory 91.30 GiB is "
        "allocated b..."
    )
    assert OomFigures(7.5, 2.3, 94.97, 1) == parse_oom(line)


def test_parse_oom_reads_old_torch_format_in_mib() -> None:
    """The old "(GPU 0; X total capacity; ...; Y free; ...)" format converts MiB to GiB."""
    line = (
        "CUDA out of memory. Tried to allocate 20.00 MiB (GPU 0; 79.35 GiB total capacity; "
        "77.80 GiB already allocated; 3.06 MiB free; 78.11 GiB reserved in total by PyTorch)"
    )
    figures = parse_oom(line)
    assert figures is not None
    assert (20 / 1024, 3.06 / 1024, 79.35, 0) == pytest.approx(
        (figures.tried_gib, figures.free_gib, figures.total_gib, figures.gpu)
    )


def test_parse_oom_without_figures_is_none() -> None:
    """A message with no OOM figure gives None."""
    assert parse_oom("RuntimeError: CUDA error: out of memory") is None


def test_decode_retraction_is_not_a_failure_text() -> None:
    """The scheduler's "Decode out of memory happened" is normal operation."""
    line = "Decode out of memory happened. #retracted_reqs: 1, #new_token_ratio: 0.7 -> 1.0"
    assert [] == match_signatures(line)


def test_killed_only_counts_as_a_bare_line() -> None:
    """Only a shell's own "Killed" line is the KILLED signature."""
    assert [Signature.KILLED] == match_signatures("Killed")
    assert [] == match_signatures("Killed 3 workers")


# -- follower: phases, progress, figures ------------------------------------------------------


@pytest.mark.parametrize("name", ["v056_ready_tp1.log", "v0523_ready_tp2.log"])
def test_follower_enters_every_phase_in_order(name: str) -> None:
    """A full start-up log enters init .. ready once each, in order, and ends ready."""
    follower, events = follow(read_log(name))
    assert list(Phase) == [e.phase for e in of_type(events, PhaseLine)]
    assert Phase.READY == follower.phase
    assert 1 == len(of_type(events, ReadyLine))


def test_follower_reports_shard_and_capture_progress() -> None:
    """Shard and capture bars become Progress events with done/total."""
    _, events = follow(read_log("v056_ready_tp1.log"))
    progress = of_type(events, Progress)
    shards = [(p.done, p.total) for p in progress if p.phase is Phase.WEIGHTS]
    graphs = [(p.done, p.total) for p in progress if p.phase is Phase.CUDA_GRAPH]
    assert [(0, 5), (1, 5), (2, 5), (3, 5), (4, 5), (5, 5), (5, 5)] == shards
    assert (0, 36) == graphs[0]
    assert (36, 36) == graphs[-1]


def test_follower_progress_is_the_current_phases_fraction() -> None:
    """progress is the bar's fraction while its phase lasts, None once the phase changes."""
    follower = LogFollower()

    def state(line: str) -> tuple[Phase | None, float | None]:
        follower.feed_line(line)
        return follower.phase, follower.progress

    assert (Phase.WEIGHTS, None) == state(
        "[2025-10-16 09:06:10] Load weight begin. avail mem=137.29 GB"
    )
    assert (Phase.WEIGHTS, 0.5) == state(
        "Loading safetensors checkpoint shards:  50% Completed | 1/2 [00:01<00:01,  1.31it/s]"
    )
    assert (Phase.KV_CACHE, None) == state(
        "[2025-10-16 09:06:12] Load weight end. type=X, avail mem=21.96 GB, mem usage=8.81 GB."
    )
    assert (Phase.CUDA_GRAPH, 4 / 35) == state(
        "Capturing batches (bs=256 avail_mem=20.12 GB):  12%|█▏ | 4/35 [00:01<00:10, 3.1it/s]"
    )
    assert (256, 20.12, 4, 35) == (
        follower.numbers.graph_last_bs,
        follower.numbers.graph_last_avail_gib,
        follower.numbers.graph_steps_done,
        follower.numbers.graph_steps_total,
    )


def test_phases_only_move_forward() -> None:
    """A draft model's "Load weight begin" after graph capture does not move the phase back."""
    _, events = follow(read_log("v0523_oom_graph_capture_seed_tp4.log"))
    entered = [e.phase for e in of_type(events, PhaseLine)]
    assert [Phase.INIT, Phase.WEIGHTS, Phase.KV_CACHE, Phase.CUDA_GRAPH] == entered


def test_each_rank_has_its_own_phase_until_warmup() -> None:
    """A rank still loading keeps its own phase while another rank allocates the KV pool."""
    follower = LogFollower()
    follower.feed_line("[2025-12-09 09:12:16 TP0] Load weight begin. avail mem=78.04 GB")
    follower.feed_line("[2025-12-09 09:12:16 TP1] Load weight begin. avail mem=78.04 GB")
    follower.feed_line(
        "[2025-12-09 09:12:31 TP0] Load weight end. type=Q, avail mem=49.51 GB, mem usage=28.53 GB."
    )
    assert (Phase.KV_CACHE, Phase.KV_CACHE, Phase.WEIGHTS, Phase.KV_CACHE) == (
        follower.phase,
        follower.phase_of("TP0"),
        follower.phase_of("TP1"),
        follower.phase_of(None),
    )
    follower.feed_line("[2025-12-09 09:13:00] INFO:     Application startup complete.")
    assert Phase.WARMUP == follower.phase_of("TP1")


def test_follower_fills_numbers_from_a_0_5_6_log() -> None:
    """Figures and the resolved settings of the 0.5.6 args dump land in numbers."""
    follower, events = follow(read_log("v056_ready_tp1.log"))
    n = follower.numbers
    assert (78.68, 63.21, 15.47, 12.66, 12.12) == (
        n.pre_load_avail_gib, n.post_weights_avail_gib, n.weights_gib,
        n.pool_end_avail_gib, n.graph_begin_avail_gib,
    )  # fmt: skip
    assert (364032, 364032, 0.835, 256) == (
        n.kv_tokens, n.max_total_num_tokens, n.mem_fraction_static, n.cuda_graph_max_bs,
    )  # fmt: skip
    assert LaunchParams(0.835, 256) == follower.resolved_params
    names = {e.name for e in of_type(events, MemoryFigure)}
    assert {Figure.KV_K_SIZE, Figure.GRAPH_END_AVAIL, Figure.SUMMARY_AVAIL} <= names


def test_follower_fills_numbers_from_a_0_5_23_dict_dump() -> None:
    """The 0.5.23 dict dump gives mem_fraction_static and the decode graph max bs."""
    follower, _ = follow(read_log("v0523_ready_tp2.log"))
    assert LaunchParams(0.812, 256) == follower.resolved_params


def test_avail_figures_take_each_ranks_first_value_and_the_minimum() -> None:
    """Per rank the first figure counts (later ones are a draft model's); ranks give the min."""
    follower, events = follow(read_log("v0523_oom_graph_capture_seed_tp4.log"))
    assert 93.40 == follower.numbers.pre_load_avail_gib
    assert 37.57 == follower.numbers.weights_gib
    begins = [e for e in of_type(events, MemoryFigure) if e.name is Figure.WEIGHT_BEGIN_AVAIL]
    assert (8, "TP3", 47.98) == (len(begins), begins[-1].rank, begins[-1].gib)


def test_follower_tail_is_bounded() -> None:
    """last_lines keeps only the most recent lines."""
    follower = LogFollower(tail=3)
    for i in range(10):
        follower.feed_line(f"line {i}")
    assert ["line 7", "line 8", "line 9"] == list(follower.last_lines)


def test_a_log_line_glued_to_an_unfinished_bar_is_read() -> None:
    """A prefixed line written right after an unterminated tqdm bar is still parsed."""
    follower = LogFollower()
    events = follower.feed_line(
        "Loading safetensors checkpoint shards:  26% Completed | 42/163 [01:04<03:05,  1.53s/it]"
        "[2025-10-05 03:34:41] Received sigquit from a child process. It usually means the child."
    )
    assert [Progress(Phase.WEIGHTS, 42, 163)] == of_type(events, Progress)
    assert [Signature.CHILD_FAILED] == [e.kind for e in of_type(events, FailureSignature)]
    assert 2 == follower.line_count


# -- follower: tracebacks and failures -------------------------------------------------------


def test_chained_traceback_is_one_record_with_both_exceptions() -> None:
    """A "During handling" chain with SGLang's "Possible solutions" is one traceback."""
    _, events = follow(read_log("v056_oom_graph_capture_wrapped_tp2.log"))
    [tb] = of_type(events, Traceback)
    assert ("TP0", Phase.CUDA_GRAPH) == (tb.rank, tb.phase)
    assert ["torch.OutOfMemoryError", "Exception"] == [e.type for e in tb.exceptions]
    assert tb.message is not None and tb.message.startswith("Capture cuda graph failed: CUDA out")
    assert tb.message.splitlines()[1:3] == [
        "Possible solutions:",
        "1. set --mem-fraction-static to a smaller value (e.g., 0.8 or 0.7)",
    ]
    assert {Signature.CUDA_OOM, Signature.GRAPH_CAPTURE_FAILED} == tb.signatures


def test_message_resumes_after_the_blank_line_a_cuda_error_ends_with() -> None:
    """A wrapped CUDA error ends in a newline; SGLang's advice after the blank still belongs."""
    _, events = follow(read_log("v0523_capture_failed_no_kernel_image.log"))
    [tb] = of_type(events, Traceback)
    assert tb.message is not None
    lines = tb.message.splitlines()
    assert "Possible solutions:" in lines
    assert lines[-1].startswith("Open an issue on GitHub")


def test_source_lines_in_frames_are_not_failure_texts() -> None:
    """`raise RuntimeError(f"NCCL error: ...")` in a frame is code, not a failure."""
    follower = LogFollower()
    lines = [
        "[2025-11-02 05:40:44 TP2] Scheduler hit an exception: Traceback (most recent call last):",
        '  File "pynccl_wrapper.py", line 374, in NCCL_CHECK',
        '    raise RuntimeError(f"NCCL error: {error_str}")',
        "KeyError: 'model.layers.47.input_layernorm.weight'",
        "",
        "[2025-11-02 05:40:44] Received sigquit from a child process.",
    ]
    events = [e for line in lines for e in follower.feed_line(line)]
    [tb] = of_type(events, Traceback)
    assert frozenset() == tb.signatures
    assert ("KeyError", "'model.layers.47.input_layernorm.weight'") == (tb.exc_type, tb.message)
    assert [Signature.CHILD_FAILED] == [e.kind for e in of_type(events, FailureSignature)]


def test_lines_interleaved_in_frames_stay_outside_the_traceback() -> None:
    """Another process's log line or bar in the middle of frames is processed on its own."""
    follower = LogFollower()
    events: list[LogEvent] = []
    for line in [
        "Traceback (most recent call last):",
        '  File "a.py", line 1, in f',
        "[2025-11-02 05:40:43 TP1] Capture cuda graph begin. avail mem=0.80 GB",
        "Capturing batches (bs=512 avail_mem=0.71 GB):   0%|          | 0/52 [00:00<?, ?it/s]",
        '  File "b.py", line 2, in g',
        "AssertionError",
    ]:
        events.extend(follower.feed_line(line))
    events.extend(follower.finish())
    [tb] = of_type(events, Traceback)
    assert ('  File "a.py", line 1, in f', '  File "b.py", line 2, in g') == tb.frames
    assert ("AssertionError", "") == (tb.exc_type, tb.message)
    assert Phase.CUDA_GRAPH == follower.phase


def test_unfinished_traceback_is_closed_by_finish() -> None:
    """A log cut inside a traceback still yields it, without an exception."""
    follower = LogFollower()
    follower.feed_line(
        "[2025-11-02 05:40:44 TP2] Scheduler hit an exception: Traceback (most recent call last):"
    )
    follower.feed_line('  File "a.py", line 1, in f')
    assert 1 == len(follower.failures())  # visible mid-stream, follower untouched
    [tb] = of_type(follower.finish(), Traceback)
    assert (None, "TP2") == (tb.exc_type, tb.rank)
    assert [] == follower.finish()


def test_readiness_drops_earlier_failures_but_not_a_port_in_use() -> None:
    """Failures before "fired up" did not stop the server; a busy port is kept anyway."""
    follower, _ = follow(read_log("v056_port_in_use_false_ready.log"))
    assert [] == follower.failures()
    assert follower.port_in_use is not None
    assert "address already in use" in follower.port_in_use.line


def test_failures_kept_are_bounded() -> None:
    """A flood of failure lines keeps only the first MAX_FAILURES."""
    follower = LogFollower()
    for i in range(MAX_FAILURES + 10):
        follower.feed_line(f"host:1:{i} [0] NCCL WARN something {i}")
    kept = follower.failures()
    assert MAX_FAILURES == len(kept)
    assert isinstance(kept[0], FailureSignature) and kept[0].line.endswith("something 0")


# -- capture passes, draft weights, hybrid and speculative settings ----------------------------


@pytest.mark.parametrize(
    ("message", "speculative", "gpass"),
    [
        # 0.5.23 cuda_graph_setup.py:685/759, eagle_worker_v2.py:515/634
        ("Capture target prefill CUDA graph begin. backend=breakable, num_tokens=[64], "
         "avail mem=28.00 GB", True, GraphPass.TARGET_PREFILL),
        ("Capture target decode CUDA graph begin. backend=full, num_tokens_per_req=1, "
         "avail mem=20.00 GB", False, GraphPass.TARGET_DECODE),
        ("Capture target verify CUDA graph begin. backend=full, num_tokens_per_req=4, "
         "avail mem=20.00 GB", True, GraphPass.TARGET_VERIFY),
        ("Capture draft prefill CUDA graph begin. backend=breakable, num_tokens=[64], "
         "avail mem=9.00 GB", True, GraphPass.DRAFT_PREFILL),
        ("Capture draft decode CUDA graph begin. backend=full, num_tokens_per_req=1, bs=[1, 2], "
         "avail mem=9.00 GB", True, GraphPass.DRAFT_DECODE),
        ("Capture draft extend CUDA graph begin. backend=full, num_tokens_per_req=4, bs=[1, 2], "
         "avail mem=9.00 GB", True, GraphPass.DRAFT_EXTEND),
        ("Capture draft extend CUDA graph begin. step=1, avail mem=9.00 GB", True,
         GraphPass.DRAFT_EXTEND),
        ("Capture single-CG draft extend begin. This can take several minutes. avail mem=9.00 GB",
         True, GraphPass.DRAFT_EXTEND),
        ("Capture Frozen-KV MTP draft cuda graph begin.", True, GraphPass.DRAFT_DECODE),
        # 0.5.10 model_runner.py:2446/2566, eagle_worker.py:250/265
        ("Capture cuda graph begin. This can take up to several minutes. avail mem=28.00 GB",
         False, GraphPass.TARGET_DECODE),
        ("Capture cuda graph begin. This can take up to several minutes. avail mem=28.00 GB",
         True, GraphPass.TARGET_VERIFY),
        ("Capture piecewise CUDA graph begin. avail mem=30.00 GB", False,
         GraphPass.TARGET_PREFILL),
        ("Capture draft cuda graph begin. This can take up to several minutes. avail mem=8 GB",
         True, GraphPass.DRAFT_DECODE),
        ("Capture draft extend cuda graph begin. This can take up to several minutes. "
         "avail mem=8.49 GB", True, GraphPass.DRAFT_EXTEND),
        ("Capture draft extend cuda graph begin (step 2). This can take up to several minutes. "
         "avail mem=8.49 GB", True, GraphPass.DRAFT_EXTEND),
    ],
)
def test_graph_pass_of_names_every_capture_begin_spelling(
    message: str, speculative: bool, gpass: GraphPass
) -> None:
    """Each version's begin line names its pass; 0.5.10's bare one is decode or verify."""
    assert gpass is graph_pass_of(message, speculative=speculative)


def test_capture_figures_belong_to_the_last_pass_begun() -> None:
    """0.5.23 order: the failing pass's start and bar, the first pass's start kept apart."""
    follower, _ = follow(read_log("v0523_oom_draft_extend_mtp_seed_tp4.log"))
    n = follower.numbers
    assert ("draft_extend", 3, 9.26, 28.0) == (
        n.graph_pass, n.graph_passes_begun, n.graph_begin_avail_gib, n.graph_first_begin_avail_gib
    )
    assert (9.2, 32, 0, 20) == (
        n.graph_last_avail_gib, n.graph_last_bs, n.graph_steps_done, n.graph_steps_total
    )


def test_a_new_pass_starts_its_own_figures_and_ranks_in_lockstep_share_one() -> None:
    """TP1's prefill begin after TP0's verify begin does not reopen the prefill pass."""
    text = (
        "[2026-06-17 19:52:43 TP0] Capture target prefill CUDA graph begin. backend=breakable, "
        "num_tokens=[64], avail mem=28.00 GB\n"
        "[2026-06-17 19:52:52 TP0] Capture target verify CUDA graph begin. backend=full, "
        "num_tokens_per_req=2, avail mem=26.88 GB\n"
        "[2026-06-17 19:52:43 TP1] Capture target prefill CUDA graph begin. backend=breakable, "
        "num_tokens=[64], avail mem=27.90 GB\n"
        "[2026-06-17 19:52:52 TP1] Capture target verify CUDA graph begin. backend=full, "
        "num_tokens_per_req=2, avail mem=26.70 GB\n"
    )
    n = follow(text)[0].numbers
    assert ("target_verify", 2, 26.7, 27.9) == (
        n.graph_pass, n.graph_passes_begun, n.graph_begin_avail_gib, n.graph_first_begin_avail_gib
    )


@pytest.mark.parametrize("version", ["0523", "0510"])
def test_draft_weights_are_not_a_second_target(version: str) -> None:
    """type=...NextN is the draft: the target's weight figures stay, the draft's are apart."""
    n = follow(read_log(f"v{version}_oom_draft_extend_mtp_seed_tp4.log"))[0].numbers
    assert (93.4, 55.83, 37.57, 1.49) == (
        n.pre_load_avail_gib, n.post_weights_avail_gib, n.weights_gib, n.draft_weights_gib
    )


@pytest.mark.parametrize("version", ["0523", "0510"])
def test_speculative_settings_come_from_the_args_dump(version: str) -> None:
    """0.5.23's dict and 0.5.10's ServerArgs repr both give the spec shape and the cap."""
    n = follow(read_log(f"v{version}_oom_draft_extend_mtp_seed_tp4.log"))[0].numbers
    assert ("EAGLE", 1, 1, 2, 48, 32) == (
        n.speculative_algorithm, n.speculative_num_steps, n.speculative_eagle_topk,
        n.speculative_num_draft_tokens, n.max_running_requests, n.cuda_graph_max_bs,
    )
    assert n.speculative


def test_0_5_10_bare_capture_line_is_target_verify_with_spec() -> None:
    """In 0.5.10 the first (target) pass of a speculative server is the verify graph."""
    lines = read_log("v0510_oom_draft_extend_mtp_seed_tp4.log").split("\n")
    upto = next(i for i, line in enumerate(lines) if "Capture cuda graph begin" in line)
    assert "target_verify" == follow("\n".join(lines[: upto + 1]))[0].numbers.graph_pass


@pytest.mark.parametrize(
    ("version", "begins", "ended", "draft_kv"),
    [
        # 0.5.23: both pools first (the draft's is the second KV line, 2.00 GB), then target
        # prefill, target verify (ended) and draft extend (failed).
        ("0523",
         [("target_prefill", 28.0), ("target_verify", 26.88), ("draft_extend", 9.26)], 2, 2.0),
        # 0.5.10: target verify (ended), the draft's weights and its pool (0.40 GB, after the
        # target's graphs), then draft extend (failed).
        ("0510", [("target_verify", 28.0), ("draft_extend", 8.49)], 1, 0.4),
    ],
)
def test_every_capture_pass_and_the_draft_pool_are_read(
    version: str, begins: list[tuple[str, float]], ended: int, draft_kv: float
) -> None:
    """Each ``Capture ... begin`` line's pass and avail mem (the smallest over ranks), the
    ``end`` lines, and the draft's ``KV Cache is allocated`` line (a rank's second)."""
    n = follow(read_log(f"v{version}_oom_draft_extend_mtp_seed_tp4.log"))[0].numbers
    assert (begins, ended, draft_kv) == (n.graph_begins, n.graph_passes_ended, n.draft_kv_gib)
    assert n.kv_tokens == 1444864  # the target's line still gives the token count


def test_a_begin_line_without_avail_mem_leaves_the_pass_sizes_unknown() -> None:
    """A pass whose begin line shows no figure cannot be sized: no ``graph_begins``."""
    text = (
        "[2026-06-17 19:52:43 TP0] Capture target prefill CUDA graph begin. backend=breakable, "
        "num_tokens=[64, 128], avail mem=28.00 GB\n"
        "[2026-06-17 19:52:52 TP0] Capture target verify CUDA graph begin. backend=full\n"
    )
    n = follow(text)[0].numbers
    assert (None, "target_verify") == (n.graph_begins, n.graph_pass)


@pytest.mark.parametrize(
    ("line", "size", "gib"),
    [
        # 0.5.23 memory_pool.py:1005 (no spec; trailing space as printed)
        ("[2026-07-02 10:14:40] Mamba Cache is allocated. max_mamba_cache_size: 288, "
         "conv_state size: 0.41GB, ssm_state size: 12.66GB ", 288, 13.07),
        # 0.5.10 memory_pool.py:311 (spec: the intermediate caches on the same line)
        ("[2026-07-02 10:14:40] Mamba Cache is allocated. max_mamba_cache_size: 96, "
         "conv_state size: 0.14GB, ssm_state size: 4.22GB intermediate_ssm_state_cache size: "
         "2.11GB intermediate_conv_window_cache size: 0.07GB ", 96, 6.54),
    ],
)
def test_mamba_cache_line_is_read(line: str, size: int, gib: float) -> None:
    n = follow(line + "\n")[0].numbers
    assert (size, gib) == (n.mamba_cache_size, n.mamba_state_gib)


def test_max_running_requests_reset_warning_sets_the_cap() -> None:
    """speculative_hook.py: "Max running requests is reset to 48 for speculative decoding."."""
    line = (
        "[2026-06-17 19:51:01] Max running requests is reset to 48 for speculative decoding. "
        "You can override this by explicitly setting --max-running-requests.\n"
    )
    assert 48 == follow(line)[0].numbers.max_running_requests


def test_hybrid_state_errors_are_their_own_signature() -> None:
    """Both 0.5.23 texts (kv_cache_configurator.py:3154, 3394); neither is kv_too_small."""
    for text in (
        "RuntimeError: Not enough GPU memory for hybrid (mamba/linear-attention) state cache. "
        "Computed max_mamba_cache_size=-3 (total_rest_memory=0.41 GB, ...",
        "RuntimeError: Hybrid (mamba/linear-attention) state cache is too small to serve any "
        "requests. max_mamba_cache_size=2, mamba_ratio=3, resulting max_num_reqs=0. Try: ...",
    ):
        assert [Signature.HYBRID_STATE] == match_signatures(text)


def test_strategy_named_by_using_is_not_a_prescription() -> None:
    """"when using --mamba-scheduler-strategy no_buffer" is the cause, not the fix."""
    n = Numbers()
    fill_error_figures(
        n, "Speculative decoding for X is not compatible with radix cache when using "
        "--mamba-scheduler-strategy no_buffer.", overwrite=True,
    )
    assert n.prescribed_mamba_strategy is None
    fill_error_figures(n, "AssertionError: extra_buffer is not supported for NemotronHForCausalLM; "
                       "use no_buffer.", overwrite=True)
    assert ("no_buffer", None) == (n.prescribed_mamba_strategy, n.prescribed_env)


def _corpus_lines() -> list[str]:
    """Every line of the verbatim real logs and the simulator-made logs under tests/."""
    root = Path(__file__).resolve().parents[1]
    lines: list[str] = []
    for path in sorted([*root.glob("fixtures/real_logs/*.log"), *root.glob("data/logs/*.log")]):
        lines += split_records(path.read_text("utf-8", errors="replace"))
    return lines


def test_the_word_prefilter_never_hides_a_signature() -> None:
    """match_signatures skips the 19 searches on lines without any of its words; on every
    line of the corpus (and with its prefix kept, as bare lines are searched) the answer is
    that of the unfiltered searches, and lines with signatures are among them."""
    lines = _corpus_lines()
    found = 0
    for line in lines:
        for text in (line, parse_line(line).message):
            expected = logparse.match_signatures_unfiltered(text)
            assert expected == logparse.match_signatures(text), text
            found += bool(expected)
    assert len(lines) > 5000
    assert found > 100


def test_batch_statistics_and_access_lines_are_skipped_but_failures_still_count() -> None:
    """Lines that cannot matter (batch statistics, access lines) give no events, even an
    access line whose request path a client wrote to read like a failure; the failure
    lines around them are still seen, as is the tail."""
    follower = LogFollower()
    follower.feed_line("[2026-12-01 18:00:00] The server is fired up and ready to roll!")
    quiet = [
        "[2026-12-01 18:00:01 TP0] Decode batch, #running-req: 3, #token: 4096, token usage: "
        "0.05, cuda graph: True, gen throughput (token/s): 1234.56, #queue-req: 0,",
        "[2026-12-01 18:00:01 TP0] Prefill batch, #new-seq: 1, #new-token: 7, #cached-token: "
        "0, token usage: 0.05, #running-req: 1, #queue-req: 0,",
        '[2026-12-01 18:00:02] INFO:     127.0.0.1:40001 - "GET /CUDA%20out%20of%20memory '
        'HTTP/1.1" 404 Not Found',
        '[2026-12-01 18:00:02] INFO:     10.0.0.7:5123 - "GET /RuntimeError: CUDA error: '
        'an illegal memory access HTTP/1.1" 404 Not Found',
    ]
    assert [[], [], [], []] == [follower.feed_line(line) for line in quiet]
    oom = ("[2026-12-01 18:00:03 TP0] torch.OutOfMemoryError: CUDA out of memory. "
           "Tried to allocate 2.00 GiB")
    kinds = [e.kind for e in follower.feed_line(oom) if isinstance(e, FailureSignature)]
    assert [Signature.CUDA_OOM] == kinds
    assert [*quiet, oom] == list(follower.last_lines)[-5:]
