"""The classifier's last-resort rules, pinned one at a time (issue 18's mutation survivors).

The logs here are built from SGLang's own line formats (0.5.10: managers/scheduler.py's
"Scheduler hit an exception" header, model_runner.py's "Init torch distributed begin.",
server_args.py's attention-backend line) so that each test isolates one rule of
``launcher.classify``'s documented order; the expected verdicts are those rules, not what
the classifier happened to answer. Real logs for the common cases are in test_classify.py.
"""

from __future__ import annotations

import pytest

from launcher.classify import ADVICE, diagnose_text
from launcher.outcome import Outcome
from launcher.phases import Phase

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
    retryable, with the log's tail as evidence."""
    d = diagnose_text(text(CLEAN), status)
    assert (Outcome.KILLED, True, ADVICE[Outcome.KILLED]) == (d.outcome, d.retryable, d.advice)
    assert "[2026-03-02 10:00:00 TP1] Init torch distributed begin." == d.evidence[-1]


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
