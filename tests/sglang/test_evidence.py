"""launcher.sglang.evidence and what classify makes of it, on cases of the real-log corpus."""

from __future__ import annotations

from pathlib import Path

from launcher.sglang import evidence
from launcher.sglang.classify import diagnose_text
from launcher.sglang.outcome import Confidence, Outcome
from launcher.sglang.phases import Phase

CORPUS = Path(__file__).resolve().parents[1] / "fixtures" / "real_logs"


def _log(case: str) -> str:
    return (CORPUS / f"{case}.log").read_text(encoding="utf-8")


def test_collector_prefixes_are_removed() -> None:
    compose = _log("gh12496_docker_prefix_kv_pool_oom").splitlines()
    assert all(not line.startswith("sglang-1") for line in evidence.unwrap(compose))
    desktop = evidence.unwrap(_log("jerryzsj_docker_desktop_ready_tp1").splitlines())
    assert desktop[0].startswith("[2025-02-04 05:21:33] server_args=ServerArgs(")
    ray = evidence.unwrap(_log("verl1611_ray_prefix_illegal_access_rollout").splitlines())
    assert ray[5] == "RuntimeError: CUDA error: an illegal memory access was encountered"
    indented = evidence.unwrap(_log("areal232_pp_indented_index_error").splitlines())
    assert indented[3].startswith("[2025-08-11 11:11:20 TP1 PP0] Scheduler hit an exception")


def test_unprefixed_lines_are_left_alone() -> None:
    lines = _log("gh4289_nccl_unhandled_system_error").splitlines()
    assert evidence.unwrap(lines) == lines


def test_outermost_telling_frame_decides_the_phase() -> None:
    # A serving OOM allocates in memory_pool.py; the event loop above it says "serving".
    frames = [
        '  File "/x/sglang/srt/managers/scheduler.py", line 993, in event_loop_normal',
        '  File "/x/sglang/srt/mem_cache/memory_pool.py", line 80, in alloc',
    ]
    assert evidence.frame_phase(frames) is Phase.READY
    assert evidence.frame_phase(frames[1:]) is Phase.KV_CACHE
    capture = _log("gh5285_deepep_2node_capture_oom").splitlines()
    assert evidence.frame_phase(capture) is Phase.CUDA_GRAPH


def test_retraction_is_serving_not_an_oom() -> None:
    hints = evidence.scan(_log("gh4184_decode_retract_serving").splitlines())
    assert hints.serving and evidence.fallback(hints) is None
    diag = diagnose_text(_log("gh4184_decode_retract_serving"))
    assert (diag.outcome, diag.confidence) == (Outcome.READY, Confidence.WEAK)


def test_serving_oom_without_phase_lines_is_a_runtime_oom() -> None:
    diag = diagnose_text(_log("gh4547_overlap_thread_oom_serving"))
    assert (diag.outcome, diag.phase) == (Outcome.OOM_RUNTIME, Phase.READY)
    assert diag.confidence is Confidence.DECISIVE


def test_an_oom_with_neither_phase_lines_nor_frames_is_weak() -> None:
    diag = diagnose_text(_log("pr17744_deepseek_weight_load_oom"))
    assert (diag.outcome, diag.confidence) == (Outcome.OOM_WEIGHTS, Confidence.WEAK)
    assert diag.as_dict()["confidence"] == "weak"


def test_gated_model_old_spelling_and_segfaults() -> None:
    assert diagnose_text(_log("gh387_gated_llama2")).outcome is Outcome.MODEL_NOT_FOUND
    assert diagnose_text(_log("pr14644_gated_llama32_oserror")).outcome is Outcome.MODEL_NOT_FOUND
    nccl = diagnose_text(_log("gh3451_segfault_nccl_comm_init"))
    assert (nccl.outcome, nccl.phase) == (Outcome.NCCL_ERROR, Phase.INIT)
    other = diagnose_text(_log("gh10350_docker_segfault_pd"))
    assert (other.outcome, other.confidence) == (Outcome.OTHER, Confidence.WEAK)


def test_frames_and_phase_lines_that_disagree_are_reported() -> None:
    text = (
        "[2025-01-01 00:00:00 TP0] Capture cuda graph begin. This can take up to several "
        "minutes.\n"
        "[2025-01-01 00:00:01 TP0] Traceback (most recent call last):\n"
        '  File "/x/sglang/srt/model_executor/model_runner.py", line 1, in load_model\n'
        "torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 2.00 GiB.\n"
    )
    diag = diagnose_text(text)
    assert diag.outcome is Outcome.OOM_GRAPH_CAPTURE
    assert diag.remarks and "weights" in diag.remarks[0] and "cuda_graph" in diag.remarks[0]


def test_evidence_lines_are_not_repeated() -> None:
    # A re-raised OOM: the chained traceback ends in the same torch message twice.
    line = "torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 20.00 MiB."
    frame = '  File "/x/a.py", line 1, in f'
    head = "Traceback (most recent call last):"
    text = (
        f"{head}\n{frame}\n{line}\n\n"
        "During handling of the above exception, another exception occurred:\n\n"
        f"{head}\n{frame}\n{line}\n"
    )
    assert diagnose_text(text).evidence == [head, line]


def test_open_mpi_tag_output_prefix_is_removed() -> None:
    # mpirun --tag-output, with and without --timestamp-output; Open MPI adds no space.
    lines = [
        'Thu Jan 23 11:55:50 2025[1,1]<stderr>:  File "/x/scheduler.py", line 4, in f',
        "Thu Jan  2 01:05:00 2025[12,0]<stdout>:[2025-01-02 01:05:00 TP0] Load weight begin.",
        "[0,3]<stderr>:ImportError: undefined symbol: cuModuleGetFunction",
        "[1,1]<stdin>: not a stream Open MPI tags",
    ]
    assert evidence.unwrap(lines) == [
        '  File "/x/scheduler.py", line 4, in f',
        "[2025-01-02 01:05:00 TP0] Load weight begin.",
        "ImportError: undefined symbol: cuModuleGetFunction",
        "[1,1]<stdin>: not a stream Open MPI tags",
    ]


def test_a_traceback_pasted_without_its_header_is_an_error() -> None:
    diag = diagnose_text(_log("gh3065_mpirun_tagged_triton_cuda_utils_importerror"))
    assert (diag.outcome, diag.phase) == (Outcome.OTHER, Phase.READY)  # event_loop frames
    assert diag.evidence[0].startswith("ImportError: ") and diag.confidence is Confidence.WEAK
    # One that carries a text logparse knows is judged by logparse as before.
    nccl = diagnose_text(_log("gh4289_nccl_unhandled_system_error"))
    assert nccl.outcome is Outcome.NCCL_ERROR


def test_a_headless_exception_needs_frames_before_it_and_no_header() -> None:
    frame = '  File "/x/sglang/srt/managers/scheduler.py", line 9, in event_loop_normal'
    assert evidence.scan([frame, "    f()", "KeyError: 'x'"]).headless_exception == "KeyError: 'x'"
    # A whole traceback is logparse's; its EOFError (a parent's pipe) stays a follow-on.
    whole = ["Traceback (most recent call last):", frame, "EOFError"]
    assert evidence.scan(whole).headless_exception is None
    assert evidence.scan(["RuntimeError: not after frames"]).headless_exception is None
    # Two ranks' tracebacks interleaved: each exception line closes one that had its header.
    head0 = (
        "[2025-01-01 00:00:00 TP0] Scheduler hit an exception: Traceback (most recent call last):"
    )
    head1 = head0.replace("TP0", "TP1")
    both = [head0, frame, head1, frame, "KeyError: 'a'", frame, "KeyError: 'b'"]
    assert evidence.scan(both).headless_exception is None
    # Before the readiness line it did not stop the server.
    ready_line = "[2025-01-01 00:00:00] The server is fired up and ready to roll!"
    ready = [frame, "ValueError: x", ready_line]
    assert evidence.scan(ready).headless_exception is None
    assert diagnose_text("\n".join(ready)).outcome is Outcome.READY


def test_rocm_and_triton_spellings_of_gpu_errors_are_cuda_errors() -> None:
    diag = diagnose_text(_log("gh3400_rocm_mi210_4node_warmup_hip_invalid_arg"))
    assert (diag.outcome, diag.phase) == (Outcome.CUDA_ERROR_OTHER, Phase.WARMUP)
    assert diag.evidence == [
        "RuntimeError: Triton Error [HIP]:  Code: 1, Messsage: invalid argument"
    ]
    for line in (
        "RuntimeError: Triton Error [HIP]: Code: 1, Message: invalid argument",
        "RuntimeError: Triton Error [CUDA]: misaligned address",
        "RuntimeError: HIP error: invalid device function",
        "hipErrorNoBinaryForGpu: Unable to find code object for all current devices!",
    ):
        assert evidence.scan([line]).gpu_error == line
        assert diagnose_text(line).outcome is Outcome.CUDA_ERROR_OTHER, line
    for oom in (
        "RuntimeError: Triton Error [CUDA]: out of memory",
        "RuntimeError: HIP error: out of memory",
        "hipErrorOutOfMemory",
    ):
        assert evidence.scan([oom]).gpu_error is None, oom


def test_a_segfault_whose_native_backtrace_is_in_nccl_is_an_nccl_error() -> None:
    diag = diagnose_text(_log("gh5013_2node_dp_nccl_segfault_during_capture"))
    assert (diag.outcome, diag.phase) == (Outcome.NCCL_ERROR, Phase.CUDA_GRAPH)
    assert diag.confidence is Confidence.DECISIVE
    crash = "Fatal Python error: Segmentation fault"
    in_nccl = [
        "/usr/lib/x86_64-linux-gnu/libnccl.so.2(+0x7a1b2)[0x7f2ec7a1b2]",
        "#2  0x00007f2ec7a1b2 in ncclProxyProgress () from /usr/lib/libnccl.so.2",
    ]
    for frame in in_nccl:
        assert diagnose_text(f"{frame}\n{crash}\n").outcome is Outcome.NCCL_ERROR, frame
    # An indented native frame right after a Python frame (streams interleave) still counts.
    python = '  File "/x/torch/cuda/__init__.py", line 954 in synchronize'
    native = " 1 0x00000000000494f4 uploadProxyOps()  /build/nccl/src/enqueue.cc:1131"
    assert diagnose_text(f"{python}\n{native}\n{crash}\n").outcome is Outcome.NCCL_ERROR
    # Native frames elsewhere, or NCCL named outside a stack frame, say nothing about NCCL.
    elsewhere = " 1 0x00000000000494f4 at::native::copy_()  /pytorch/aten/src/Copy.cpp:11"
    nccl_info = "host:343:1213 [5] NCCL INFO [Service thread] Connection closed by localRank 7"
    for text in (f"{elsewhere}\n{crash}\n", f"{nccl_info}\n{crash}\n"):
        diag = diagnose_text(text)
        assert (diag.outcome, diag.confidence) == (Outcome.OTHER, Confidence.WEAK), text


def test_bad_argument_is_sglang_rejecting_the_arguments_not_any_value_error() -> None:
    awq = diagnose_text(_log("gh3571_awq_tp2_not_divisible_valueerror"))
    assert (awq.outcome, awq.phase) == (Outcome.BAD_ARGUMENT, Phase.WEIGHTS)
    for environment in (
        "gh4629_singularity_transformers_registry_valueerror",
        "amdissues_glm5_mi355x_unknown_model_type",
    ):
        assert diagnose_text(_log(environment)).outcome is Outcome.OTHER, environment
    hook = '  File "/x/sglang/srt/arg_groups/parallel_hook.py", line 80, in apply'
    tf = '  File "/x/site-packages/transformers/configuration_utils.py", line 9, in get'
    assert evidence.rejects_arguments("AssertionError", "AssertionError: tp_size % nnodes", [hook])
    assert evidence.rejects_arguments("ValueError", "ValueError: no --foo-size with --bar", [tf])
    assert not evidence.rejects_arguments("KeyError", "KeyError: --x", [hook])
    assert not evidence.rejects_arguments("ValueError", "ValueError: unknown model", [tf])
    pip = "ValueError: too old; run pip install --upgrade transformers"
    assert not evidence.rejects_arguments("ValueError", pip, [tf])


def test_the_warmup_requests_are_not_serving() -> None:
    diag = diagnose_text(_log("gh1191_tp8_l4_dies_at_warmup_no_error"))
    assert (diag.outcome, diag.confidence) == (Outcome.INCOMPLETE, Confidence.WEAK)
    up = "[2025-01-01 00:00:00] INFO:     Uvicorn running on http://0.0.0.0:30000"
    info = '[2025-01-01 00:00:01] INFO:     127.0.0.1:1 - "GET /get_model_info HTTP/1.1" 200 OK'
    prefill = "[2025-01-01 00:00:01 TP0] Prefill batch. #new-seq: 1, #new-token: 7"
    ready = "[2025-01-01 00:00:02] The server is fired up and ready to roll!"
    assert not evidence.scan([up, info, prefill]).serving
    assert evidence.scan([up, info, prefill, ready, prefill]).serving
    assert evidence.scan([prefill]).serving  # an excerpt from a server already serving


def test_phase_lines_of_sglang_before_0_3_are_read() -> None:
    for case, phase in (
        ("gh445_router_tp8_stuck_load_weight_begin", Phase.WEIGHTS),
        ("gh465_router_tp2_rank0_stuck_loading", Phase.WEIGHTS),  # rank 0 never ended
    ):
        diag = diagnose_text(_log(case), hung=True)
        assert (diag.outcome, diag.phase) == (Outcome.HANG, phase), case
    capture = diagnose_text(_log("gh748_sm75_no_kernel_image_capture"))
    assert (capture.outcome, capture.phase) == (Outcome.CUDA_ERROR_OTHER, Phase.CUDA_GRAPH)
    warmup = diagnose_text(_log("gh1191_tp8_l4_dies_at_warmup_no_error"))
    assert (warmup.outcome, warmup.phase) == (Outcome.INCOMPLETE, Phase.WARMUP)

    def phase(*lines: str) -> Phase | None:
        return evidence.scan(lines).legacy_phase

    assert phase("Rank 0: load weight begin.", "Rank 0: load weight end.") is Phase.KV_CACHE
    assert phase("[gpu_id=1] Memory pool end. avail mem=2.52 GB") is Phase.KV_CACHE
    slowest = (
        "[gpu=0] max_total_num_tokens=463405, max_prefill_tokens=16384",
        "[gpu=1] Load weight end.",
    )
    assert phase(*slowest) is Phase.KV_CACHE
    assert phase("[2025-01-01 00:00:00 TP0] Load weight begin. avail mem=70.00 GB") is None
    assert evidence.later(None, Phase.WEIGHTS, Phase.INIT) is Phase.WEIGHTS
    assert evidence.later(None, None) is None
