"""Tests for launcher.sglang.classify: the verdict on every fixture log and on each hard case."""

from __future__ import annotations

import tomllib
from pathlib import Path

import pytest

from launcher.params import LaunchParams
from launcher.sglang.classify import ADVICE, RETRYABLE, classify, diagnose, diagnose_text
from launcher.sglang.flags import params_argv, params_from_argv
from launcher.sglang.logparse import LineSplitter, LogFollower, split_records
from launcher.sglang.outcome import Diagnosis, Outcome
from launcher.sglang.phases import Phase
from launcher.sim import logfmt as sim_logfmt
from launcher.sim.model import mamba_hook_error

LOGS = Path(__file__).parents[1] / "data" / "logs"


def read_log(name: str) -> str:
    """A fixture log exactly as written, ``\\r`` included."""
    with open(LOGS / name, encoding="utf-8", newline="") as f:
        return f.read()


def diag(name: str, exit_status: int | None = None, *, hung: bool = False) -> Diagnosis:
    return diagnose_text(read_log(name), exit_status, hung=hung)


# (fixture, exit status, outcome, phase, rank). Exit statuses are what the process gave.
CATALOGUE = [
    ("v056_ready_tp1.log", None, "ready", "ready", None),
    ("v0523_ready_tp2.log", None, "ready", "ready", None),
    ("v0523_oom_graph_capture_seed_tp4.log", 137, "oom_graph_capture", "cuda_graph", "TP1"),
    ("v056_oom_graph_capture_wrapped_tp2.log", 137, "oom_graph_capture", "cuda_graph", "TP0"),
    # The seeds' DeepSeek-V4-Flash MTP OOM (docs/incidents.md; tp4, 94.97 GiB, 0.70, bs 32,
    # NEXTN 1/1/2), written in each version's start-up order and texts (0.5.23: draft weights
    # before the pools, managers/scheduler.py:1128-1146; 0.5.10: the whole target first, then
    # the draft); labelled by the wrapped CUDA OOM.
    ("v0523_oom_draft_extend_mtp_seed_tp4.log", 137, "oom_graph_capture", "cuda_graph", "TP1"),
    ("v0510_oom_draft_extend_mtp_seed_tp4.log", 137, "oom_graph_capture", "cuda_graph", "TP1"),
    ("v0410_oom_weights_old_torch.log", 137, "oom_weights", "weights", None),
    ("v056_oom_kv_cache_tp2.log", 137, "oom_kv_cache", "kv_cache", "TP1"),
    ("v056_oom_runtime_warmup_tp2.log", 137, "oom_runtime", "warmup", "TP0"),
    ("v0523_oom_runtime_after_ready.log", -9, "oom_runtime", "ready", None),
    ("v0523_nccl_oom_calloc_tp2.log", -9, "oom_graph_capture", "cuda_graph", "TP1"),
    ("v056_nccl_oom_warn_tp4.log", 137, "oom_graph_capture", "cuda_graph", None),
    ("v056_kv_too_small.log", 137, "kv_too_small", "kv_cache", None),
    ("v0523_kv_too_small_min_fraction.log", -9, "kv_too_small", "kv_cache", None),
    ("v056_kv_too_small_pool.log", 137, "kv_too_small", "kv_cache", None),
    # Built from 0.5.23's texts (kv_cache_configurator.py:3394, the scheduler's frames as in
    # the other 0.5.23 fixtures); labelled by that source's RuntimeError.
    ("v0523_hybrid_state_too_small_mtp.log", -9, "hybrid_state_too_small", "kv_cache", None),
    ("v056_port_in_use_false_ready.log", 3, "port_in_use", "warmup", None),
    ("v0523_port_in_use_internal.log", 1, "port_in_use", "init", None),
    ("v056_port_in_use_torch_dist.log", 137, "port_in_use", "init", "TP0"),
    ("v056_bad_argument_unrecognized.log", 2, "bad_argument", "init", None),
    ("v0523_bad_argument_ambiguous.log", 2, "bad_argument", "init", None),
    ("v0523_bad_argument_required.log", 2, "bad_argument", "init", None),
    ("v056_bad_argument_context_length.log", 137, "bad_argument", "init", "TP0"),
    ("v0510_bad_argument_mamba_spec.log", 1, "bad_argument", "init", None),
    ("v056_model_not_found_repo_id.log", 1, "model_not_found", "init", None),
    ("v0523_model_not_found_offline.log", 1, "model_not_found", "init", None),
    ("v0523_model_not_found_unknown_id.log", 1, "model_not_found", "init", None),
    ("v056_model_not_found_unrecognized.log", 1, "model_not_found", "init", None),
    ("v056_model_not_found_config_json.log", 1, "model_not_found", "init", None),
    ("v0523_nccl_error_system_tp2.log", -9, "nccl_error", "init", None),
    ("v0523_capture_failed_no_kernel_image.log", -9, "cuda_error_other", "cuda_graph", None),
    ("v056_capture_failed_illegal_access.log", 137, "cuda_error_other", "cuda_graph", None),
    ("v056_capture_failed_ninja.log", 137, "other", "cuda_graph", None),
    ("v056_host_oom_errno12.log", 137, "other", "weights", "TP5"),
    ("v056_gpu_busy_unbalanced.log", 137, "other", "init", "TP2"),
    ("v056_warmup_proxy_502.log", 137, "other", "warmup", None),
    ("v056_killed_scheduler_dead_tp2.log", 1, "killed", "weights", None),
    ("v0523_killed_oom_killer_tp2.log", -9, "killed", "weights", None),
    ("v0523_incomplete_loading.log", None, "incomplete", "weights", None),
    ("v056_hang_health_check_after_ready.log", None, "hang", "ready", None),
    ("v0523_hang_watchdog_after_ready.log", -9, "hang", "ready", None),
    ("v056_root_cause_tp3.log", 137, "oom_kv_cache", "kv_cache", "TP3"),
]  # fmt: skip


@pytest.mark.parametrize(("name", "status", "outcome", "phase", "rank"), CATALOGUE)
def test_catalogue(
    name: str, status: int | None, outcome: str, phase: str, rank: str | None
) -> None:
    """Each fixture log gets its outcome, phase, rank, retryability and verbatim evidence."""
    d = diag(name, status)
    assert (Outcome(outcome), Phase(phase), rank) == (d.outcome, d.phase, d.rank)
    assert (Outcome(outcome) in RETRYABLE, status) == (d.retryable, d.exit_status)
    assert d.advice
    text = read_log(name)
    assert d.evidence and all(line and line in text for line in d.evidence)


def test_catalogue_covers_every_outcome_and_every_fixture() -> None:
    """The fixtures exercise every outcome kind, and every fixture is in the catalogue."""
    assert set(Outcome) == {Outcome(row[2]) for row in CATALOGUE}
    assert sorted(p.name for p in LOGS.glob("*.log")) == sorted(row[0] for row in CATALOGUE)


def test_every_outcome_has_advice_and_retryability_follows_the_rules() -> None:
    """ADVICE covers every outcome; only memory, hang, kill, NCCL and incomplete retry."""
    assert set(Outcome) == set(ADVICE)
    not_retryable = {
        Outcome.OOM_WEIGHTS, Outcome.PORT_IN_USE, Outcome.BAD_ARGUMENT, Outcome.MODEL_NOT_FOUND,
        Outcome.CUDA_ERROR_OTHER, Outcome.OTHER, Outcome.READY,
    }  # fmt: skip
    assert set(Outcome) - not_retryable == RETRYABLE
    assert "mem-fraction will not help" in ADVICE[Outcome.OOM_WEIGHTS]


# -- graph capture wrapping ---------------------------------------------------------------------


def test_capture_failed_wrapping_a_cuda_error_is_not_an_oom() -> None:
    """ "Capture cuda graph failed: CUDA error: no kernel image ..." is a CUDA error."""
    d = diag("v0523_capture_failed_no_kernel_image.log")
    assert (Outcome.CUDA_ERROR_OTHER, False) == (d.outcome, d.retryable)
    assert any("no kernel image" in line for line in d.evidence)


def test_capture_failed_wrapping_illegal_access_is_not_an_oom() -> None:
    """An illegal memory access during capture is a CUDA error, whatever "memory" says."""
    assert Outcome.CUDA_ERROR_OTHER == diag("v056_capture_failed_illegal_access.log").outcome


def test_capture_failed_wrapping_missing_ninja_is_other() -> None:
    """A missing build tool during capture is not about GPU memory."""
    d = diag("v056_capture_failed_ninja.log")
    assert (Outcome.OTHER, Phase.CUDA_GRAPH, False) == (d.outcome, d.phase, d.retryable)


def test_capture_failed_wrapping_cuda_oom_is_a_graph_capture_oom() -> None:
    """ "Capture cuda graph failed: CUDA out of memory" is oom_graph_capture with its figures."""
    d = diag("v056_oom_graph_capture_wrapped_tp2.log", 137)
    assert (Outcome.OOM_GRAPH_CAPTURE, True) == (d.outcome, d.retryable)
    assert (1.02, 626.56 / 1024, 79.19, 0) == pytest.approx(
        (d.numbers.tried_gib, d.numbers.free_gib, d.numbers.total_gib, d.numbers.gpu)
    )
    assert (0.93, 512, 496) == (
        d.numbers.mem_fraction_static, d.numbers.cuda_graph_max_bs, d.numbers.graph_last_bs,
    )  # fmt: skip


# -- OOM by phase -------------------------------------------------------------------------------


def test_seed_oom_is_a_graph_capture_oom_on_tp1_with_its_figures() -> None:
    """The seed's TP1 OOM during the draft model's capture: its figures, rank and settings."""
    d = diag("v0523_oom_graph_capture_seed_tp4.log", 137)
    assert (Outcome.OOM_GRAPH_CAPTURE, Phase.CUDA_GRAPH, "TP1") == (d.outcome, d.phase, d.rank)
    n = d.numbers
    assert (7.5, 2.3, 94.97, 1) == (n.tried_gib, n.free_gib, n.total_gib, n.gpu)
    assert (0.7, 48, 93.40) == (n.mem_fraction_static, n.cuda_graph_max_bs, n.pre_load_avail_gib)
    assert d.evidence[0].startswith("[2026-06-17 19:53:54 TP1] Scheduler hit an exception")
    assert d.evidence[-1].startswith(
        "torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 7.50 GiB."
    )


def test_oom_before_load_weight_end_means_the_weights_do_not_fit() -> None:
    """An OOM while shards load is oom_weights, not retryable, with old-torch figures."""
    d = diag("v0410_oom_weights_old_torch.log", 137)
    assert (Outcome.OOM_WEIGHTS, Phase.WEIGHTS, False) == (d.outcome, d.phase, d.retryable)
    assert d.advice == ADVICE[Outcome.OOM_WEIGHTS]
    assert (20 / 1024, 3.06 / 1024, 79.35) == pytest.approx(
        (d.numbers.tried_gib, d.numbers.free_gib, d.numbers.total_gib)
    )


def test_oom_in_the_kv_pool_follows_the_raising_ranks_phase() -> None:
    """TP1 raised right after its own "Load weight end": oom_kv_cache."""
    d = diag("v056_oom_kv_cache_tp2.log")
    assert (Outcome.OOM_KV_CACHE, "TP1", 1.13) == (d.outcome, d.rank, d.numbers.tried_gib)


def test_oom_in_warmup_is_a_runtime_oom_even_from_a_rank_last_seen_capturing() -> None:
    """From warmup on, the global phase counts: TP0's last own line was a capture line."""
    d = diag("v056_oom_runtime_warmup_tp2.log", 137)
    assert (Outcome.OOM_RUNTIME, Phase.WARMUP) == (d.outcome, d.phase)


def test_oom_after_ready_is_a_runtime_oom() -> None:
    """An OOM while serving, even inside a graph replay frame, is oom_runtime."""
    d = diag("v0523_oom_runtime_after_ready.log")
    assert (Outcome.OOM_RUNTIME, Phase.READY, True) == (d.outcome, d.phase, d.retryable)


def test_oom_phase_comes_from_the_frames_when_the_rank_printed_nothing() -> None:
    """A bare traceback whose deepest frames are in memory_pool.py is a KV-pool OOM."""
    text = "\n".join(
        [
            "[2025-12-09 09:12:31] Load weight begin. avail mem=78.04 GB",
            "Traceback (most recent call last):",
            '  File "/x/sglang/srt/model_executor/model_runner.py", line 1921, in init_memory_pool',
            '  File "/x/sglang/srt/mem_cache/memory_pool.py", line 471, in _create_buffers',
            "torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 1.13 GiB. GPU 0 has a "
            "total capacity of 79.19 GiB of which 1.02 GiB is free.",
        ]
    )
    d = diagnose_text(text, 1)
    assert (Outcome.OOM_KV_CACHE, Phase.KV_CACHE) == (d.outcome, d.phase)


# -- not failures / not GPU ----------------------------------------------------------------------


def test_decode_retraction_after_ready_is_not_a_failure() -> None:
    """ "Decode out of memory happened" while serving leaves the server ready."""
    d = diag("v0523_ready_tp2.log")
    assert (Outcome.READY, Phase.READY) == (d.outcome, d.phase)
    assert "Decode out of memory happened" in read_log("v0523_ready_tp2.log")


def test_failures_before_ready_did_not_stop_the_server() -> None:
    """A traceback printed before "fired up" (an optional import) is not the verdict."""
    text = read_log("v056_ready_tp1.log").replace(
        "[2025-11-20 10:14:26] INFO:     Started server process [48213]",
        "Traceback (most recent call last):\n"
        '  File "x.py", line 1, in <module>\n'
        "ModuleNotFoundError: No module named 'vllm'\n"
        "[2025-11-20 10:14:26] INFO:     Started server process [48213]",
    )
    assert Outcome.READY == diagnose_text(text).outcome


def test_host_errno_12_is_not_a_gpu_oom() -> None:
    """ "[Errno 12] Cannot allocate memory" is host RAM: other, not retryable, host advice."""
    d = diag("v056_host_oom_errno12.log", 137)
    assert (Outcome.OTHER, False) == (d.outcome, d.retryable)
    assert "host" in d.advice and "RAM" in d.advice
    assert d.numbers.tried_gib is None


def test_gpu_busy_advice_names_leftover_processes() -> None:
    """ "The memory capacity is unbalanced" says another process holds a GPU."""
    d = diag("v056_gpu_busy_unbalanced.log")
    assert Outcome.OTHER == d.outcome
    assert "leftover" in d.advice


def test_warmup_failure_advice_names_the_proxy() -> None:
    """A warmup request answered 502 points at http_proxy/no_proxy."""
    assert "no_proxy" in diag("v056_warmup_proxy_502.log").advice


# -- NCCL -------------------------------------------------------------------------------------


def test_nccl_calloc_failure_is_a_gpu_oom_by_phase() -> None:
    """ "Failed to CUDA calloc" in a DistBackendError message is an OOM in its phase."""
    d = diag("v0523_nccl_oom_calloc_tp2.log")
    assert (Outcome.OOM_GRAPH_CAPTURE, "TP1") == (d.outcome, d.rank)


def test_nccl_out_of_memory_warning_outranks_the_nccl_error_it_causes() -> None:
    """NCCL's own "Cuda failure 'out of memory'" line beats the follow-on "NCCL error"."""
    d = diag("v056_nccl_oom_warn_tp4.log")
    assert Outcome.OOM_GRAPH_CAPTURE == d.outcome
    assert ["NCCL WARN Cuda failure 2 'out of memory'" in line for line in d.evidence] == [True]


def test_nccl_system_error_is_an_nccl_error() -> None:
    """A connection refused / unhandled system error is nccl_error, retryable."""
    d = diag("v0523_nccl_error_system_tp2.log")
    assert (Outcome.NCCL_ERROR, True) == (d.outcome, d.retryable)


@pytest.mark.parametrize(
    "line",
    [
        "RuntimeError: NCCL error: ncclSystemError: System call (e.g. socket, malloc) failed",
        "RuntimeError: NCCL error: ncclInternalError: Internal check failed.",
        "host:1:2 [0] misc/socket.cc:484 NCCL WARN socketStartConnect: Connect to 10.0.0.2<1> "
        "failed : Connection refused",
    ],
)
def test_other_nccl_failures_are_nccl_errors(line: str) -> None:
    """ncclSystemError, ncclInternalError and NCCL WARN lines without OOM are nccl_error."""
    assert Outcome.NCCL_ERROR == diagnose_text(line + "\n", 1).outcome


# -- killed -------------------------------------------------------------------------------------


def test_trailing_killed_and_137_after_a_traceback_go_by_the_traceback() -> None:
    """SGLang kills its own tree after an error: the error decides, not the kill."""
    d = diag("v056_kv_too_small.log", 137)
    assert Outcome.KV_TOO_SMALL == d.outcome
    assert read_log("v056_kv_too_small.log").rstrip().endswith("Killed")


@pytest.mark.parametrize("status", [137, -9])
def test_sigkill_without_any_error_is_killed(status: int) -> None:
    """Exit 137 / -9 with no error in the log is killed, retryable."""
    d = diag("v0523_incomplete_loading.log", status)
    assert (Outcome.KILLED, Phase.WEIGHTS, True) == (d.outcome, d.phase, d.retryable)


def test_a_shells_killed_line_alone_is_killed() -> None:
    """A bare "Killed" with no error and no exit status is killed."""
    d = diagnose_text(read_log("v0523_incomplete_loading.log") + "\nKilled\n")
    assert (Outcome.KILLED, ["Killed"]) == (d.outcome, d.evidence)


def test_a_child_killed_by_sigkill_is_killed() -> None:
    """The parent's "Exit code: -9" / "crashed with exit code -9" with no error: killed."""
    assert Outcome.KILLED == diag("v056_killed_scheduler_dead_tp2.log", 1).outcome
    assert Outcome.KILLED == diag("v0523_killed_oom_killer_tp2.log", -9).outcome


def test_a_child_that_died_otherwise_without_an_error_is_other() -> None:
    """A child that exited 1 with nothing printed is other, not killed."""
    text = (
        "[2026-05-11 04:19:51] Subprocess sglang::scheduler_TP0 (pid=7) crashed with exit code 1. "
        "Triggering SIGQUIT for cleanup...\n"
    )
    assert Outcome.OTHER == diagnose_text(text, 137).outcome


# -- root cause ---------------------------------------------------------------------------------


def test_root_cause_is_the_first_specific_error_from_any_rank() -> None:
    """TP3's OOM wins over TP0's later connection error and the parent's follow-on lines."""
    d = diag("v056_root_cause_tp3.log", 137)
    assert (Outcome.OOM_KV_CACHE, "TP3", 0.4375) == (d.outcome, d.rank, d.numbers.tried_gib)
    assert not any("scheduler is dead" in line for line in d.evidence)


def test_a_later_specific_error_outranks_an_earlier_consequence() -> None:
    """An NCCL error printed first by a healthy rank does not hide another rank's OOM."""
    text = "\n".join(
        [
            "[2025-12-05 01:41:53 TP0] Load weight end. type=Q, avail mem=7.4 GB, mem usage=6 GB.",
            "RuntimeError: NCCL error: remote process exited or there was a network error",
            "[2025-12-05 01:41:55 TP3] Scheduler hit an exception: "
            "Traceback (most recent call last):",
            '  File "a.py", line 1, in f',
            "torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 448.00 MiB.",
            "",
        ]
    )
    d = diagnose_text(text, 137)
    assert (Outcome.OOM_KV_CACHE, "TP3") == (d.outcome, d.rank)


# -- kv too small -------------------------------------------------------------------------------


def test_not_enough_memory_0_5_6_gives_the_current_fraction() -> None:
    """0.5.6's "Current value: self.server_args.mem_fraction_static=0.6"."""
    d = diag("v056_kv_too_small.log")
    assert (Outcome.KV_TOO_SMALL, 0.6, None) == (
        d.outcome, d.numbers.mem_fraction_static, d.numbers.min_mem_fraction,
    )  # fmt: skip


def test_not_enough_memory_0_5_23_form() -> None:
    """0.5.23's "Current value: mem_fraction_static=0.6" is kv_too_small with the value."""
    text = (
        "[2026-06-02 09:30:41] Scheduler hit an exception: Traceback (most recent call last):\n"
        '  File "/x/sglang/srt/model_executor/pool_configurator.py", line 96, in configure\n'
        "RuntimeError: Not enough memory. Please try to increase --mem-fraction-static. "
        "Current value: mem_fraction_static=0.6\n"
    )
    d = diagnose_text(text, -9)
    assert (Outcome.KV_TOO_SMALL, 0.6, True) == (
        d.outcome, d.numbers.mem_fraction_static, d.retryable,
    )  # fmt: skip


def test_weights_leave_no_kv_gives_the_minimum_fraction() -> None:
    """0.5.23 states the minimum viable fraction; it lands in numbers and the advice."""
    d = diag("v0523_kv_too_small_min_fraction.log")
    assert (Outcome.KV_TOO_SMALL, 0.9113, 0.85) == (
        d.outcome, d.numbers.min_mem_fraction, d.numbers.mem_fraction_static,
    )  # fmt: skip
    assert "0.9113" in d.advice


def test_raise_above_is_used_when_no_minimum_is_stated() -> None:
    """Without "minimum viable =", "Raise --mem-fraction-static above X" gives the minimum."""
    text = (
        "ValueError: Loaded weights leave no GPU memory for the KV cache under "
        "--mem-fraction-static=0.8. Raise --mem-fraction-static above 0.875.\n"
    )
    assert 0.875 == diagnose_text(text, 1).numbers.min_mem_fraction


def test_memory_pool_too_small_is_kv_too_small() -> None:
    """ "Memory pool size is too small" is kv_too_small."""
    assert Outcome.KV_TOO_SMALL == diag("v056_kv_too_small_pool.log").outcome


# -- port in use --------------------------------------------------------------------------------


def test_port_in_use_wins_even_when_ready_follows() -> None:
    """The warmup thread can reach another server and print "fired up": still port_in_use."""
    d = diag("v056_port_in_use_false_ready.log", 3)
    assert (Outcome.PORT_IN_USE, False) == (d.outcome, d.retryable)
    assert "The server is fired up and ready to roll!" in read_log(
        "v056_port_in_use_false_ready.log"
    )
    assert "[Errno 98]" in d.evidence[0]


@pytest.mark.parametrize(
    "name", ["v0523_port_in_use_internal.log", "v056_port_in_use_torch_dist.log"]
)
def test_internal_and_torch_ports_in_use_are_port_in_use(name: str) -> None:
    """ "is not available in 30 seconds" and torch's EADDRINUSE are port_in_use."""
    assert Outcome.PORT_IN_USE == diag(name).outcome


# -- bad argument / model ---------------------------------------------------------------------


def test_exit_2_with_an_empty_log_is_a_bad_argument() -> None:
    """argparse exits 2; with no log at all the status alone says bad_argument."""
    d = classify([], 2)
    assert (Outcome.BAD_ARGUMENT, Phase.INIT, False) == (d.outcome, d.phase, d.retryable)


def test_context_length_value_error_is_a_bad_argument() -> None:
    """The context-length ValueError from every rank is one bad_argument."""
    d = diag("v056_bad_argument_context_length.log", 137)
    assert (Outcome.BAD_ARGUMENT, "TP0") == (d.outcome, d.rank)


def test_a_value_error_before_any_gpu_work_is_a_bad_argument() -> None:
    """An unknown ValueError raised while parsing args is a config error."""
    text = (
        "Traceback (most recent call last):\n"
        '  File "/x/sglang/srt/server_args.py", line 900, in __post_init__\n'
        "ValueError: --foo-size must be a multiple of --page-size\n"
    )
    assert Outcome.BAD_ARGUMENT == diagnose_text(text, 1).outcome


# -- hang / incomplete / ready --------------------------------------------------------------


def test_log_without_error_or_ready_is_incomplete_or_hang() -> None:
    """No error and no ready line: incomplete; the caller's hung flag makes it a hang."""
    assert Outcome.INCOMPLETE == diag("v0523_incomplete_loading.log").outcome
    d = diag("v0523_incomplete_loading.log", hung=True)
    assert (Outcome.HANG, Phase.WEIGHTS, True) == (d.outcome, d.phase, d.retryable)
    assert d.evidence[-1].startswith("Loading safetensors checkpoint shards:  41%")


def test_lost_exit_status_is_incomplete() -> None:
    """255 (ssh without a waiting shell) does not say the process is gone."""
    assert Outcome.INCOMPLETE == diag("v0523_incomplete_loading.log", 255).outcome


def test_health_check_failure_after_ready_is_a_hang_in_ready() -> None:
    """ "Health check failed" after "fired up" is hang, phase ready."""
    d = diag("v056_hang_health_check_after_ready.log")
    assert (Outcome.HANG, Phase.READY) == (d.outcome, d.phase)


def test_watchdog_timeout_after_ready_is_a_hang_in_ready() -> None:
    """The scheduler watchdog's timeout is hang, even though it kills the tree (exit -9)."""
    d = diag("v0523_hang_watchdog_after_ready.log", -9)
    assert (Outcome.HANG, Phase.READY, True) == (d.outcome, d.phase, d.retryable)


def test_ready_server_killed_later_is_killed_in_ready() -> None:
    """A ready server that dies by SIGKILL with no error of its own was killed."""
    d = diag("v056_ready_tp1.log", 137)
    assert (Outcome.KILLED, Phase.READY) == (d.outcome, d.phase)


def test_ready_server_reported_hung_is_a_hang() -> None:
    """The caller's hung flag on a ready server without errors gives hang in ready."""
    assert (Outcome.HANG, Phase.READY) == (
        diag("v056_ready_tp1.log", hung=True).outcome,
        diag("v056_ready_tp1.log", hung=True).phase,
    )


def test_ready_evidence_is_the_ready_line() -> None:
    """The readiness verdict cites the readiness line verbatim."""
    d = diag("v056_ready_tp1.log")
    assert ["[2025-11-20 10:14:28] The server is fired up and ready to roll!"] == d.evidence


# -- entry points agree ---------------------------------------------------------------------------


def test_diagnose_on_a_streaming_follower_matches_classify() -> None:
    """Judging the supervisor's follower fed chunk by chunk gives classify's verdict."""
    for name, status, *_ in CATALOGUE:
        data = read_log(name).encode()
        splitter, follower = LineSplitter(), LogFollower()
        for i in range(0, len(data), 97):
            for line in splitter.feed(data[i : i + 97]):
                follower.feed_line(line)
        for line in splitter.flush():
            follower.feed_line(line)
        assert diag(name, status).as_dict() == diagnose(follower, status).as_dict(), name


def test_classify_accepts_lines_with_terminators_and_embedded_cr() -> None:
    """readlines()-style items (with \\n, and tqdm's \\r inside) classify like the text."""
    text = read_log("v0523_oom_graph_capture_seed_tp4.log")
    items = text.splitlines(keepends=True)
    assert diagnose_text(text, 137).as_dict() == classify(items, 137).as_dict()
    assert diagnose_text(text, 137).as_dict() == classify(iter(items), 137).as_dict()


def test_diagnose_does_not_disturb_the_follower() -> None:
    """Asking for a verdict mid-stream leaves the follower able to continue."""
    lines = split_records(read_log("v056_oom_graph_capture_wrapped_tp2.log"))
    follower = LogFollower()
    for line in lines[:-5]:
        follower.feed_line(line)
    first = diagnose(follower)
    for line in lines[-5:]:
        follower.feed_line(line)
    assert (Outcome.OOM_GRAPH_CAPTURE, Outcome.OOM_GRAPH_CAPTURE) == (
        first.outcome,
        diagnose(follower).outcome,
    )


GLOO_WRAPPED = "\n".join([
    "[2026-06-17 19:52:52 TP0] Capture target verify CUDA graph begin. backend=full, "
    "num_tokens_per_req=4, avail mem=26.88 GB",
    "[2026-06-17 19:53:10 TP0] Scheduler hit an exception: Traceback (most recent call last):",
    '  File "/opt/venv/lib/python3.12/site-packages/sglang/srt/model_executor/runner/'
    'decode_cuda_graph_runner.py", line 612, in __init__',
    "    raise Exception(",
    "Exception: Capture cuda graph failed: [../third_party/gloo/gloo/transport/tcp/pair.cc:534] "
    "Connection closed by peer [10.0.0.2]:41822",
    "Possible solutions:",
    "1. set --mem-fraction-static to a smaller value (e.g., 0.8 or 0.7)",
    "",
    "[2026-06-17 19:53:10] Received sigquit from a child process. It usually means the child "
    "failed.",
    "",
])


def test_capture_failed_wrapping_a_gloo_error_is_nccl_error_not_oom() -> None:
    """sglang#4205: the capture wrapper around a gloo peer loss is nccl_error (retryable)."""
    d = diagnose_text(GLOO_WRAPPED, 137)
    assert (Outcome.NCCL_ERROR, Phase.CUDA_GRAPH, "TP0") == (d.outcome, d.phase, d.rank)
    assert d.numbers.tried_gib is None


def test_wrapped_cuda_oom_is_attributed_to_the_last_capture_pass() -> None:
    """The 0.5.23 seed log fails in draft extend, after target prefill and verify captured."""
    n = diag("v0523_oom_draft_extend_mtp_seed_tp4.log", 137).numbers
    assert ("draft_extend", 3) == (n.graph_pass, n.graph_passes_begun)
    assert (7.5, 2.3, 9.26, 28.0) == (
        n.tried_gib, n.free_gib, n.graph_begin_avail_gib, n.graph_first_begin_avail_gib
    )


def test_hybrid_state_error_keeps_its_figures() -> None:
    """0.5.23's "Not enough GPU memory for hybrid ... state cache" states K and per-request MB."""
    d = diag("v0523_hybrid_state_too_small_mtp.log", -9)
    assert (-3, 146.25) == (d.numbers.mamba_cache_size, d.numbers.mamba_per_req_mib)
    assert d.retryable
    # The advice leads with what changes the state cache on 0.5.23, not SGLang's own first
    # suggestion (kv_cache_configurator.py: the cache size does not depend on the request cap).
    assert d.advice.startswith(
        "the hybrid (Mamba/linear-attention) state cache does not fit: raise "
        "--mem-fraction-static, or set a larger --max-mamba-cache-size"
    )


def test_the_0_5_10_mamba_spec_error_carries_its_prescribed_fix() -> None:
    """"please use --mamba-scheduler-strategy extra_buffer and set SGLANG_ENABLE_SPEC_V2=1."."""
    d = diag("v0510_bad_argument_mamba_spec.log", 1)
    assert Outcome.BAD_ARGUMENT == d.outcome
    assert ("extra_buffer", "SGLANG_ENABLE_SPEC_V2=1") == (
        d.numbers.prescribed_mamba_strategy, d.numbers.prescribed_env
    )



@pytest.mark.parametrize(
    ("version", "flags", "env"),
    [("0.5.10", ["--mamba-scheduler-strategy", "extra_buffer"], {"SGLANG_ENABLE_SPEC_V2": "1"}),
     ("0.5.23", ["--mamba-radix-cache-strategy", "extra_buffer"], {})],
)
def test_prescribed_fix_is_given_in_the_servers_dialect(
    version: str, flags: list[str], env: dict[str, str]
) -> None:
    """The advice holds the config change as TOML; 0.5.23 gets the renamed flag and not the
    variable it no longer reads."""
    d = diagnose_text(read_log("v0510_bad_argument_mamba_spec.log"), 1, sglang_version=version)
    assert d.prescribed_fix is not None
    assert (flags, env) == (d.prescribed_fix["flags"], d.prescribed_fix["env"])
    toml = d.prescribed_fix["toml"]
    assert 'mamba_strategy = "extra_buffer"' in toml and toml in d.advice
    assert ("SGLANG_ENABLE_SPEC_V2" in toml.split("\n", 1)[1]) == bool(env)
    assert d.as_dict()["prescribed_fix"] == d.prescribed_fix
    table = tomllib.loads(toml)["servers"][0]
    assert ("extra_buffer", env) == (table["mamba_strategy"], table.get("env", {}))


def test_the_0_5_23_no_buffer_overlap_assertion_prescribes_disable_overlap_schedule() -> None:
    """0.5.23's ``validate_mamba_no_buffer`` ("Try to set disable_overlap_schedule=True.", as
    the simulator writes it from arg_groups/mamba_hook.py): the fix is the
    ``disable_overlap_schedule`` key, ``--disable-overlap-schedule`` on the command line."""
    text = mamba_hook_error(sim_logfmt.NO_BUFFER_OVERLAP) + "\n"
    d = diagnose_text(text, 1, sglang_version="0.5.23")
    assert Outcome.BAD_ARGUMENT == d.outcome
    assert d.prescribed_fix is not None
    assert (["--disable-overlap-schedule"], {}) == (
        d.prescribed_fix["flags"], d.prescribed_fix["env"]
    )
    assert {"disable_overlap_schedule": True} == tomllib.loads(d.prescribed_fix["toml"])[
        "servers"
    ][0]
    params = LaunchParams(mem_fraction_static=0.9, mamba_strategy="no_buffer",
                          disable_overlap_schedule=True)
    argv = params_argv(params, "0.5.23")
    assert "--disable-overlap-schedule" == argv[-1]
    assert params == params_from_argv(argv)
