"""The classifier's last-resort rules, pinned one at a time (the mutation run's survivors).

The logs here are built from SGLang's own line formats (0.5.10: managers/scheduler.py's
"Scheduler hit an exception" header, model_runner.py's "Init torch distributed begin.",
server_args.py's attention-backend line) so that each test isolates one rule of
``launcher.sglang.classify``'s documented order; the expected verdicts are those rules, not what
the classifier happened to answer. Real logs for the common cases are in test_classify.py.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from launcher.sglang.classify import ADVICE, classify, diagnose_text
from launcher.sglang.outcome import Confidence, Outcome
from launcher.sglang.phases import Phase

HEADER = (
    "[2026-03-02 10:00:01 {rank}] Scheduler hit an exception: Traceback (most recent call last):"
)
FRAME = (
    '  File "/usr/lib/python3/dist-packages/sglang/srt/managers/scheduler.py", line 2400, '
    "in run_scheduler_process"
)
NCCL_LINE = (
    "[2026-03-02 10:00:01 TP0] RuntimeError: NCCL error: remote process exited or there was "
    "a network error"
)
ILLEGAL_ACCESS = "RuntimeError: CUDA error: an illegal memory access was encountered"
CLEAN = [
    "[2026-03-02 10:00:00] server_args=ServerArgs(model_path='/models/m', tp_size=2)",
    "",
    "[2026-03-02 10:00:00] Attention backend not specified. Use flashinfer backend by default.",
    "[2026-03-02 10:00:00 TP0] Init torch distributed begin.",
    "[2026-03-02 10:00:00 TP1] Init torch distributed begin.",
    "   ",
]


def read_fixture(name: str) -> str:
    """A fixture log of tests/data/logs verbatim (carriage returns kept)."""
    return (Path(__file__).parents[1] / "data" / "logs" / name).read_bytes().decode("utf-8")


def traceback(rank: str, exception: str) -> list[str]:
    return [HEADER.format(rank=rank), FRAME, exception]


def text(*parts: list[str]) -> str:
    return "\n".join(line for part in parts for line in part) + "\n"


# -- the last resort --------------------------------------------------------------------------


@pytest.mark.parametrize("status", [1, 3, 134])
def test_non_zero_exit_with_nothing_recognised_is_other(status: int) -> None:
    """A process that failed without any known error, kill or ready line: other, not
    retryable, the generic advice, and the last three non-blank lines as evidence."""
    d = diagnose_text(text(CLEAN), status)
    assert (Outcome.OTHER, Phase.INIT, None, False, status) == (
        d.outcome, d.phase, d.rank, d.retryable, d.exit_status)
    assert ADVICE[Outcome.OTHER] == d.advice
    assert [
        "[2026-03-02 10:00:00] Attention backend not specified. Use flashinfer backend by default.",
        "[2026-03-02 10:00:00 TP0] Init torch distributed begin.",
        "[2026-03-02 10:00:00 TP1] Init torch distributed begin.",
    ] == d.evidence


@pytest.mark.parametrize("status", [143, -15, 137, -9])
def test_sigterm_and_sigkill_without_an_error_are_killed(status: int) -> None:
    """Exit 143 / -15 (SIGTERM, shell or Popen style) count as killed like 137 / -9:
    retryable, with the log's tail as evidence, then a line naming the signal (the log has
    no error line to show; the last evidence line is what Slack calls the error)."""
    d = diagnose_text(text(CLEAN), status)
    assert (Outcome.KILLED, True, ADVICE[Outcome.KILLED]) == (d.outcome, d.retryable, d.advice)
    signal = {143: "15 (SIGTERM)", -15: "15 (SIGTERM)", 137: "9 (SIGKILL)", -9: "9 (SIGKILL)"}
    assert [
        "[2026-03-02 10:00:00 TP1] Init torch distributed begin.",
        f"killed by signal {signal[status]}; no error in the log",
    ] == d.evidence[-2:]


def test_a_kill_of_a_serving_server_never_shows_an_access_line_as_its_evidence() -> None:
    """A server killed while serving ends its log with uvicorn access lines and batch
    statistics; none of them is evidence of the kill (Slack would show
    ``GET /health 200 OK`` as the error)."""
    serving = [
        "[2026-03-02 10:00:00 TP0] Init torch distributed begin.",
        "[2026-03-02 10:01:00] The server is fired up and ready to roll!",
        "[2026-03-02 10:02:00 TP0] Decode batch, #running-req: 1, #token: 90, "
        "token usage: 0.00, cuda graph: True, gen throughput (token/s): 40.12, #queue-req: 0,",
        '[2026-03-02 10:02:01] INFO:     127.0.0.1:51234 - "GET /health HTTP/1.1" 200 OK',
    ]
    d = diagnose_text(text(serving), 137)
    assert Outcome.KILLED == d.outcome
    assert "killed by signal 9 (SIGKILL); no error in the log" == d.evidence[-1]
    assert not [line for line in d.evidence if "GET /health" in line or "Decode batch" in line]


# -- value errors ---------------------------------------------------------------------------


def test_an_early_value_error_is_a_bad_argument() -> None:
    """A ValueError before any phase past init is config validation: bad_argument, fatal."""
    d = diagnose_text(text(CLEAN, traceback("TP0", "ValueError: --foo must divide --bar")), 1)
    assert (Outcome.BAD_ARGUMENT, Phase.INIT, "TP0", False) == (
        d.outcome, d.phase, d.rank, d.retryable)
    assert [HEADER.format(rank="TP0"), "ValueError: --foo must divide --bar"] == d.evidence


@pytest.mark.parametrize(
    "exception",
    [
        "ImportError: cannot import name 'fused_moe' from 'sgl_kernel'",
        "RuntimeError: Expected all tensors to be on the same device",
        "KeyError: 'model.layers.0.mlp.gate_proj.weight'",
        "AttributeError: 'NoneType' object has no attribute 'shape'",
    ],
)
def test_an_early_traceback_that_is_not_a_value_error_is_other(exception: str) -> None:
    """Only a ValueError is taken for config validation: any other unknown early exception
    is other (retryable: no; advice: read the log), never a bad_argument."""
    d = diagnose_text(text(CLEAN, traceback("TP0", exception)), 1)
    assert (Outcome.OTHER, Phase.INIT, "TP0", False) == (d.outcome, d.phase, d.rank, d.retryable)
    assert ADVICE[Outcome.OTHER] == d.advice
    assert [HEADER.format(rank="TP0"), exception] == d.evidence


def test_a_value_error_after_init_is_not_a_bad_argument() -> None:
    """A ValueError raised while loading weights is not about the command line: other."""
    weights = ["[2026-03-02 10:00:00 TP0] Load weight begin. avail mem=78.50 GB"]
    d = diagnose_text(text(CLEAN, weights, traceback("TP0", "ValueError: shape mismatch")), 1)
    assert (Outcome.OTHER, Phase.WEIGHTS, "TP0") == (d.outcome, d.phase, d.rank)


# -- root cause across ranks ------------------------------------------------------------


def test_a_later_specific_error_outranks_an_earlier_nccl_error() -> None:
    """TP0's NCCL error (usually a consequence) printed first does not hide TP1's CUDA
    error: the verdict, rank and evidence are TP1's."""
    d = diagnose_text(text(CLEAN, [NCCL_LINE], traceback("TP1", ILLEGAL_ACCESS)), 137)
    assert (Outcome.CUDA_ERROR_OTHER, "TP1", False) == (d.outcome, d.rank, d.retryable)
    assert [HEADER.format(rank="TP1"), ILLEGAL_ACCESS] == d.evidence


def test_the_first_specific_error_wins_over_later_ones() -> None:
    """Two specific errors from different ranks: the first printed is the root cause (its
    special advice included)."""
    host_oom = "OSError: [Errno 12] Cannot allocate memory"
    d = diagnose_text(
        text(CLEAN, traceback("TP2", host_oom), traceback("TP0", ILLEGAL_ACCESS)), 137)
    assert (Outcome.OTHER, "TP2") == (d.outcome, d.rank)
    assert d.advice.startswith("the host ran out of RAM ([Errno 12])")


@pytest.mark.parametrize("nccl_first", [True, False])
def test_with_only_consequences_the_first_printed_decides(nccl_first: bool) -> None:
    """When nothing specific was printed, the first non-specific failure (an NCCL error or an
    unknown exception) is the cause, whichever rank printed it."""
    unknown = traceback("TP1", "RuntimeError: Expected all tensors to be on the same device")
    parts = [[NCCL_LINE], unknown] if nccl_first else [unknown, [NCCL_LINE]]
    d = diagnose_text(text(CLEAN, *parts), 137)
    if nccl_first:
        assert (Outcome.NCCL_ERROR, "TP0", True) == (d.outcome, d.rank, d.retryable)
        assert [NCCL_LINE] == d.evidence
    else:
        assert (Outcome.OTHER, "TP1", False) == (d.outcome, d.rank, d.retryable)


def test_an_unknown_exception_printed_first_does_not_hide_a_specific_error() -> None:
    """An unknown exception is often a consequence of another rank's failure: a specific
    error printed after it is the root cause."""
    d = diagnose_text(text(
        CLEAN,
        traceback("TP1", "RuntimeError: Expected all tensors to be on the same device"),
        traceback("TP0", ILLEGAL_ACCESS),
    ), 137)
    assert (Outcome.CUDA_ERROR_OTHER, "TP0") == (d.outcome, d.rank)


@pytest.mark.parametrize(
    ("exception", "outcome", "phase"),
    [
        ("RuntimeError: Not enough memory. Please try to increase --mem-fraction-static. "
         "Current value: mem_fraction_static=0.5", Outcome.KV_TOO_SMALL, Phase.INIT),
        ("Exception: Capture cuda graph failed: ninja is required to load C++ extensions",
         Outcome.OTHER, Phase.CUDA_GRAPH),
        ("ValueError: --foo must divide --bar", Outcome.BAD_ARGUMENT, Phase.INIT),
        ("OSError: [Errno 12] Cannot allocate memory", Outcome.OTHER, Phase.INIT),
    ],
)
def test_specific_errors_outrank_an_earlier_nccl_error(
    exception: str, outcome: Outcome, phase: Phase
) -> None:
    """KV too small, a capture failure that is not about memory, an early ValueError and the
    host's errno 12 are each specific: TP1's error decides over TP0's earlier NCCL error."""
    d = diagnose_text(text(CLEAN, [NCCL_LINE], traceback("TP1", exception)), 137)
    assert (outcome, phase, "TP1") == (d.outcome, d.phase, d.rank)


def test_an_nccl_error_keeps_the_phase_of_its_rank() -> None:
    weights = ["[2026-03-02 10:00:00 TP0] Load weight begin. avail mem=78.50 GB"]
    d = diagnose_text(text(CLEAN, weights, [NCCL_LINE]), 137)
    assert (Outcome.NCCL_ERROR, Phase.WEIGHTS, "TP0") == (d.outcome, d.phase, d.rank)


# -- OOM phase and figures --------------------------------------------------------------------

OOM_448M = ("torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 448.00 MiB. GPU 3 has "
            "a total capacity of 79.19 GiB of which 100.00 MiB is free.")
OOM_2G = ("torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 2.00 GiB. GPU 0 has a "
          "total capacity of 79.19 GiB of which 1.00 GiB is free.")
WEIGHTS_BEGIN = "[2026-03-02 10:00:00 TP0] Load weight begin. avail mem=78.50 GB"
WEIGHTS_END = ("[2026-03-02 10:00:00 TP0] Load weight end. elapsed=3.21 s, type=LlamaForCausalLM, "
               "avail mem=60.00 GB, mem usage=18.00 GB.")
LOADER_FRAME = ('  File "/usr/lib/python3/dist-packages/sglang/srt/model_loader/loader.py", '
                "line 300, in load_model")


def test_the_root_causes_figures_are_reported_not_a_later_ranks() -> None:
    """Two ranks OOM: the first is the cause, and the figures are the ones its own message
    gives (tried, free, GPU), not the later rank's."""
    d = diagnose_text(text(CLEAN, traceback("TP3", OOM_448M), traceback("TP0", OOM_2G)), 137)
    n = d.numbers
    assert ("TP3", 0.4375, 100 / 1024, 79.19, 3) == (
        d.rank, n.tried_gib, n.free_gib, n.total_gib, n.gpu)


def test_figures_come_from_the_fatal_oom_not_one_the_server_survived() -> None:
    """An OOM printed before the ready line did not stop the server; the verdict on the
    later, fatal OOM (fixture log, 0.5.23) reports that one's figures."""
    log = read_fixture("v0523_oom_runtime_after_ready.log").replace(
        "[2026-05-20 12:00:30] The server is fired up and ready to roll!",
        "\n".join(traceback("TP0", OOM_448M))
        + "\n[2026-05-20 12:00:30] The server is fired up and ready to roll!",
    )
    d = diagnose_text(log, -9)
    assert (Outcome.OOM_RUNTIME, Phase.READY) == (d.outcome, d.phase)
    n = d.numbers
    assert (7.83, 6.90, 79.19, 0) == (n.tried_gib, n.free_gib, n.total_gib, n.gpu)


def test_a_stated_minimum_fraction_only_changes_kv_too_small_advice() -> None:
    """TP0's CUDA error is the cause; TP1's later KV message with a minimum fraction does not
    add KV advice to the CUDA error's."""
    kv = ("ValueError: Loaded weights leave no GPU memory for the KV cache under "
          "--mem-fraction-static=0.85. Raise --mem-fraction-static above 0.912 (minimum viable "
          "= 1 - available/pre = 0.9113).")
    d = diagnose_text(text(CLEAN, traceback("TP0", ILLEGAL_ACCESS), traceback("TP1", kv)), 137)
    assert (Outcome.CUDA_ERROR_OTHER, ADVICE[Outcome.CUDA_ERROR_OTHER]) == (d.outcome, d.advice)


def test_an_oom_with_no_phase_known_is_a_weak_weights_oom() -> None:
    """No phase line and no telling frame: nothing past init is known to have happened, so
    the verdict is a weights OOM, but a weak one (only hints; it may be a serving OOM), and
    a weak weights OOM is worth a lower retry, so it is retryable."""
    d = diagnose_text("\n".join(["Traceback (most recent call last):", FRAME, OOM_2G]), 1)
    assert (Outcome.OOM_WEIGHTS, Phase.INIT, True, Confidence.WEAK) == (
        d.outcome, d.phase, d.retryable, d.confidence)


def test_a_capture_failed_wrapper_moves_an_oom_forward_to_graph_capture() -> None:
    """The rank last said "Load weight end" (KV pool next), but SGLang's "Capture cuda graph
    failed" wrapper says where the OOM happened: a graph-capture OOM."""
    d = diagnose_text(text(CLEAN, [WEIGHTS_BEGIN, WEIGHTS_END], traceback(
        "TP0", "Exception: Capture cuda graph failed: CUDA out of memory. Tried to allocate "
        "2.00 GiB.")), 137)
    assert (Outcome.OOM_GRAPH_CAPTURE, Phase.CUDA_GRAPH, True) == (
        d.outcome, d.phase, d.retryable)


def test_frames_never_move_an_ooms_phase_back() -> None:
    """A rank that reached graph capture and OOMs inside a model-loader frame (reused by
    capture) is a graph-capture OOM, not a weights OOM."""
    capture = ["[2026-03-02 10:00:02 TP0] Capture cuda graph begin. This can take up to "
               "several minutes. avail mem=10.00 GB"]
    d = diagnose_text(text(CLEAN, [WEIGHTS_BEGIN, WEIGHTS_END], capture,
                           [HEADER.format(rank="TP0"), FRAME, LOADER_FRAME, OOM_2G]), 137)
    assert (Outcome.OOM_GRAPH_CAPTURE, Phase.CUDA_GRAPH) == (d.outcome, d.phase)


def test_frames_place_an_oom_when_no_phase_line_was_printed() -> None:
    d = diagnose_text("\n".join(["Traceback (most recent call last):", LOADER_FRAME, OOM_2G]), 1)
    assert (Outcome.OOM_WEIGHTS, Phase.WEIGHTS) == (d.outcome, d.phase)


def test_kv_too_small_advice_adds_the_stated_minimum() -> None:
    """When SGLang states the minimum viable fraction (0.5.23, fixture log), the advice keeps
    its general text and adds that value."""
    d = diagnose_text(read_fixture("v0523_kv_too_small_min_fraction.log"), -9)
    assert Outcome.KV_TOO_SMALL == d.outcome
    assert (ADVICE[Outcome.KV_TOO_SMALL]
            + "; SGLang states the minimum viable value is 0.9113") == d.advice


# -- input forms ------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("items", "evidence"),
    [
        (["[2026-03-02 10:00:00] a\r\n", "Loading 10%\rLoading 20%\n"],
         ["[2026-03-02 10:00:00] a", "Loading 10%", "Loading 20%"]),
        (["x\r\n", "y\n", "z"], ["x", "y", "z"]),
        (["a\rb", "c\nd"], ["b", "c", "d"]),
    ],
)
def test_classify_splits_items_like_the_log_text(items: list[str], evidence: list[str]) -> None:
    """Items may end in \\n or \\r\\n and hold tqdm's \\r or several lines: each record
    counts as one line, terminators dropped."""
    d = classify(items, 1)
    assert evidence == d.evidence


@pytest.mark.parametrize(("chained", "kept"), [(5, 6), (6, 6), (9, 6)])
def test_evidence_is_capped_at_six_lines(chained: int, kept: int) -> None:
    """A traceback's evidence is its header and each exception line; a long chain is cut to
    six lines so that events and notifications stay short, the header first."""
    lines = [HEADER.format(rank="TP0")]
    for i in range(chained):
        if i:
            lines += ["", "During handling of the above exception, another exception occurred:",
                      "", "Traceback (most recent call last):"]
        lines += [FRAME, f"{ILLEGAL_ACCESS} ({i})"]
    d = diagnose_text(text(lines), 1)
    assert (Outcome.CUDA_ERROR_OTHER, kept) == (d.outcome, len(d.evidence))
    assert [HEADER.format(rank="TP0"), f"{ILLEGAL_ACCESS} (0)"] == d.evidence[:2]
