"""Hybrid (Mamba / linear-attention) models in the simulated SGLang host.

Checked against SGLang 0.5.10 (python/sglang/srt/server_args.py:2123
``_handle_mamba_radix_cache``, model_executor/model_runner_kv_cache_mixin.py:179
``handle_max_mamba_cache``) and 0.5.23 (arg_groups/overrides.py, arg_groups/mamba_hook.py:156
``validate_mamba_no_buffer``, mem_cache/kv_cache_configurator.py:3229 ``_handle_max_mamba_cache``
and :3119 ``resolve_max_num_reqs``): the flag dialects, the spec + no_buffer errors word for
word, the ``Mamba Cache is allocated`` line, the 0.5.23 state-cache errors with their figures,
and the knobs that size the state cache. The model is the Qwen3.6-27B hybrid with MTP of
docs/incidents.md.
"""

from __future__ import annotations

import signal
from pathlib import Path

import pytest

from launcher.sglang.classify import diagnose_text
from launcher.sglang.outcome import Outcome
from launcher.sim.memory import simulate
from launcher.sim.model import scenario_from_argv
from launcher.sim.observe import observed
from tests.simhost import READY_LINE, SimHost, free_port, make_sim_host, model_dir, split_output

PRO6000 = 94.97
QWEN = str(model_dir("qwen3.6-27b-sim"))
VERSIONS = ("0.5.10", "0.5.23")
MTP = [
    "--speculative-algorithm",
    "NEXTN",
    "--speculative-num-steps",
    "3",
    "--speculative-eagle-topk",
    "1",
    "--speculative-num-draft-tokens",
    "4",
]
NO_BUFFER_0_5_10 = (
    "ValueError: Speculative decoding for Qwen3_5ForConditionalGeneration is not compatible with "
    "radix cache when using --mamba-scheduler-strategy no_buffer.To use radix cache with "
    "speculative decoding, please use --mamba-scheduler-strategy extra_buffer and set "
    "SGLANG_ENABLE_SPEC_V2=1."
)


def qwen(*extra: str, spec: bool = True, mfs: str = "0.90") -> list[str]:
    return ["--model-path", QWEN, *(MTP if spec else []), "--mem-fraction-static", mfs, *extra]


@pytest.fixture
def pro6000(tmp_path: Path) -> SimHost:
    return make_sim_host(tmp_path, gpu_count=2, gpu_total_gib=PRO6000)


def mamba_line(out: str) -> str:
    return next(
        line.split("] ", 1)[1] for line in split_output(out) if "Mamba Cache is allocated." in line
    )


# ---------------------------------------------------------------------------------------------
# Flags and the errors SGLang's server args raise


@pytest.mark.parametrize("strategy", [None, "no_buffer"])
def test_0_5_10_refuses_spec_with_no_buffer_and_radix_cache(
    pro6000: SimHost, strategy: str | None
) -> None:
    """The default strategy (auto = no_buffer) or an explicit no_buffer with MTP and the radix
    cache is 0.5.10's ValueError, word for word (no space after "no_buffer."), in the main
    process before any log line; exit 1."""
    extra = [] if strategy is None else ["--mamba-scheduler-strategy", strategy]
    code, out = pro6000.run(*qwen(*extra), "--port", str(free_port()), version="0.5.10")
    assert 1 == code
    assert out.rstrip().endswith(NO_BUFFER_0_5_10)
    assert "server_args=" not in out and "in _handle_mamba_radix_cache\n" in out


def test_0_5_10_no_buffer_is_fine_without_spec_or_without_radix_cache(pro6000: SimHost) -> None:
    """Without speculative decoding, or with --disable-radix-cache, no_buffer starts."""
    for argv in (qwen(spec=False), qwen("--disable-radix-cache", "--max-running-requests", "16")):
        with pro6000.start(*argv, "--port", str(free_port()), version="0.5.10") as sim:
            sim.wait_for(READY_LINE)


def test_0_5_10_prescribed_fix_starts(pro6000: SimHost) -> None:
    """The fix the error names (extra_buffer + SGLANG_ENABLE_SPEC_V2=1) comes up ready, with the
    spec-v2 warning and the intermediate state caches in the Mamba line."""
    argv = qwen("--mamba-scheduler-strategy", "extra_buffer")
    env = {"SGLANG_ENABLE_SPEC_V2": "1"}
    with pro6000.start(*argv, "--port", str(free_port()), version="0.5.10", env=env) as sim:
        sim.wait_for(READY_LINE)
    assert "Spec v2 is enabled for eagle/eagle3 speculative decoding" in sim.output
    assert "intermediate_ssm_state_cache size: " in mamba_line(sim.output)


@pytest.mark.parametrize(
    ("version", "flag", "value"),
    [
        ("0.5.23", "--mamba-scheduler-strategy", "extra_buffer"),
        ("0.5.10", "--mamba-radix-cache-strategy", "extra_buffer"),
    ],
)
def test_each_version_rejects_the_others_strategy_flag(
    pro6000: SimHost, version: str, flag: str, value: str
) -> None:
    """0.5.23 removed --mamba-scheduler-strategy; 0.5.10 has no --mamba-radix-cache-strategy:
    argparse's unrecognized arguments, exit 2."""
    code, out = pro6000.run(*qwen(flag, value), "--port", str(free_port()), version=version)
    assert 2 == code
    assert out.rstrip().endswith(f"sglang serve: error: unrecognized arguments: {flag} {value}")


def test_0_5_23_no_buffer_with_overlap_fails_its_assertion(pro6000: SimHost) -> None:
    """0.5.23 has no ValueError for spec + no_buffer; forcing no_buffer while the overlap
    schedule is on (spec v2's default) fails validate_mamba_no_buffer, exit 1. With
    --disable-overlap-schedule it starts."""
    argv = qwen("--mamba-radix-cache-strategy", "no_buffer")
    code, out = pro6000.run(*argv, "--port", str(free_port()), version="0.5.23")
    assert 1 == code
    assert out.rstrip().endswith(
        "AssertionError: no_buffer do not support overlap schedule. Try to set "
        "disable_overlap_schedule=True."
    )
    with pro6000.start(
        *argv, "--disable-overlap-schedule", "--port", str(free_port()), version="0.5.23"
    ) as sim:
        sim.wait_for(READY_LINE)


# ---------------------------------------------------------------------------------------------
# The state cache


@pytest.mark.parametrize(("version", "spec"), [(v, s) for v in VERSIONS for s in (True, False)])
def test_mamba_line_precedes_the_kv_line_with_simulated_sizes(
    pro6000: SimHost, version: str, spec: bool
) -> None:
    """``Mamba Cache is allocated. max_mamba_cache_size: N, conv_state size: X.XXGB,
    ssm_state size: Y.YYGB `` (trailing space), plus the intermediate caches with spec; printed
    before the KV pool line; the figures are simulate()'s."""
    extra = ["--mamba-scheduler-strategy", "extra_buffer"] if version == "0.5.10" else []
    argv = qwen(*extra, spec=spec)
    env = {"SGLANG_ENABLE_SPEC_V2": "1"}
    scenario, params = scenario_from_argv(version, argv, PRO6000)
    trace = simulate(scenario, params)
    m = trace.mamba
    assert trace.ok and m is not None
    with pro6000.start(*argv, "--port", str(free_port()), version=version, env=env) as sim:
        sim.wait_for(READY_LINE)
    expected = (
        f"Mamba Cache is allocated. max_mamba_cache_size: {m.max_mamba_cache_size}, "
        f"conv_state size: {m.conv_gib:.2f}GB, ssm_state size: {m.ssm_gib:.2f}GB "
    )
    if spec:
        expected += (
            f"intermediate_ssm_state_cache size: {m.intermediate_ssm_gib:.2f}GB "
            f"intermediate_conv_window_cache size: {m.intermediate_conv_gib:.2f}GB "
        )
    assert expected == mamba_line(sim.output)
    lines = split_output(sim.output)
    first_mamba = next(i for i, x in enumerate(lines) if "Mamba Cache is allocated." in x)
    first_kv = next(i for i, x in enumerate(lines) if "KV Cache is allocated." in x)
    assert first_mamba < first_kv
    assert f"#tokens: {trace.kv_tokens}," in lines[first_kv]


def test_0_5_23_not_enough_memory_for_the_state_cache(pro6000: SimHost) -> None:
    """A tiny --mamba-full-memory-ratio leaves no slot: 0.5.23's RuntimeError with the computed
    size, the rest memory and the per-request state, from the scheduler (tree killed)."""
    argv = qwen("--mamba-full-memory-ratio", "0.005")
    scenario, params = scenario_from_argv("0.5.23", argv, PRO6000)
    fail = simulate(scenario, params).failure
    assert fail is not None and "hybrid_state_memory" == fail.kind
    assert Outcome.KV_TOO_SMALL == fail.outcome
    code, out = pro6000.run(*argv, "--port", str(free_port()), version="0.5.23")
    assert -signal.SIGKILL == code
    size = int(fail.detail["max_mamba_cache_size"])
    assert size <= 0
    assert (
        "RuntimeError: Not enough GPU memory for hybrid (mamba/linear-attention) state cache. "
        f"Computed max_mamba_cache_size={size} "
        f"(total_rest_memory={fail.detail['total_rest_gib']:.2f} GB, mamba_cache_per_req="
        f"{fail.detail['per_req_gib'] * 1024:.2f} MB). Try: (1) reduce --max-running-requests, "
        "(2) increase --mem-fraction-static, (3) reduce --speculative-num-draft-tokens, or "
        "(4) use GPUs with more memory."
    ) in out
    assert "Scheduler hit an exception: Traceback" in out and "Mamba Cache is allocated" not in out
    # The benchmark's reading of the trace is the classifier's reading of this log.
    outcome, _, numbers = observed(scenario, simulate(scenario, params))
    d = diagnose_text(out, code)
    assert Outcome.HYBRID_STATE_TOO_SMALL == outcome == d.outcome
    # The args dump is the resolved one, as SGLang logs it (engine.py:311 resolved_dict()).
    fields = ("mamba_cache_size", "mamba_per_req_mib", "speculative_num_draft_tokens",
              "max_running_requests", "mamba_strategy")
    assert [getattr(numbers, k) for k in fields] == [getattr(d.numbers, k) for k in fields]
    assert (4, 48, "extra_buffer") == (
        d.numbers.speculative_num_draft_tokens, d.numbers.max_running_requests,
        d.numbers.mamba_strategy,
    )


def test_0_5_23_sizes_the_state_cache_before_it_checks_the_rest(pro6000: SimHost) -> None:
    """Below the weights' share (0.50: rest < 0) 0.5.23 fails in ``_handle_max_mamba_cache``
    (K <= 0, "Not enough GPU memory for hybrid ...") before its "Loaded weights leave no GPU
    memory" check (kv_cache_configurator.py:3039-3058); with --max-mamba-cache-size set, K is
    that value and the rest check fails instead, with its stated minimum."""
    auto = qwen(mfs="0.50")
    code, out = pro6000.run(*auto, "--port", str(free_port()), version="0.5.23")
    assert -signal.SIGKILL == code
    assert "RuntimeError: Not enough GPU memory for hybrid" in out
    assert "Loaded weights leave no GPU memory" not in out
    d = diagnose_text(out, code)
    assert Outcome.HYBRID_STATE_TOO_SMALL == d.outcome and (d.numbers.mamba_cache_size or 0) <= 0
    sized = qwen("--max-mamba-cache-size", "40", mfs="0.50")
    scenario, params = scenario_from_argv("0.5.23", sized, PRO6000)
    fail = simulate(scenario, params).failure
    assert fail is not None and (Outcome.KV_TOO_SMALL, None) == (fail.outcome, fail.kind)
    code, out = pro6000.run(*sized, "--port", str(free_port()), version="0.5.23")
    assert "ValueError: Loaded weights leave no GPU memory for the KV cache" in out


def test_0_5_23_state_cache_too_small_to_serve(pro6000: SimHost) -> None:
    """--max-mamba-cache-size below the slots per request (5: extra_buffer with overlap) leaves
    no request: 0.5.23's "too small to serve any requests" with its figures."""
    argv = qwen("--max-mamba-cache-size", "4")
    code, out = pro6000.run(*argv, "--port", str(free_port()), version="0.5.23")
    assert -signal.SIGKILL == code
    scenario, params = scenario_from_argv("0.5.23", argv, PRO6000)
    outcome, _, numbers = observed(scenario, simulate(scenario, params))
    d = diagnose_text(out, code)
    assert Outcome.HYBRID_STATE_TOO_SMALL == outcome == d.outcome
    # The Mamba line comes with the pool, after this check: neither reading has its figures.
    assert (4, None) == (numbers.mamba_cache_size, numbers.mamba_state_gib)
    assert (4, None) == (d.numbers.mamba_cache_size, d.numbers.mamba_state_gib)
    assert (
        "RuntimeError: Hybrid (mamba/linear-attention) state cache is too small to serve any "
        "requests. max_mamba_cache_size=4, mamba_ratio=5, resulting max_num_reqs=0. Try: "
        "(1) reduce --max-running-requests, (2) increase --mem-fraction-static, or (3) use GPUs "
        "with more memory."
    ) in out


def test_0_5_23_caps_running_requests_by_the_state_cache(pro6000: SimHost) -> None:
    """The auto-sized state cache caps max_running_requests (and so the captured batch sizes)
    with SGLang's warning; the summary line carries the cap."""
    scenario, params = scenario_from_argv("0.5.23", qwen(), PRO6000)
    trace = simulate(scenario, params)
    m, cap = trace.mamba, trace.max_running_requests
    assert m is not None and cap == m.max_mamba_cache_size // 5 < 48 and trace.mamba_capped
    with pro6000.start(*qwen(), "--port", str(free_port()), version="0.5.23") as sim:
        sim.wait_for(READY_LINE)
    out = sim.output
    assert (
        f"max_running_requests is capped to {cap} by the mamba state cache "
        f"(max_mamba_cache_size={m.max_mamba_cache_size}, 5 state slots per request)."
    ) in out
    assert f"max_running_requests={cap}," in out
    verify = trace.pass_named("target_verify")
    assert verify is not None and cap == verify.sizes[-1]


@pytest.mark.parametrize("version", VERSIONS)
def test_state_cache_knobs_act_in_the_direction_sglang_names(version: str) -> None:
    """--max-mamba-cache-size sets the slot count; a lower --mamba-full-memory-ratio gives fewer
    slots and more KV tokens; --mamba-ssm-dtype bfloat16 halves the SSM state."""
    extra = ["--mamba-scheduler-strategy", "extra_buffer"] if version == "0.5.10" else []

    def run(*more: str) -> tuple[int, float, int]:
        scenario, params = scenario_from_argv(version, qwen(*extra, *more), PRO6000)
        trace = simulate(scenario, params)
        assert trace.ok and trace.mamba is not None, trace.failure
        return trace.mamba.max_mamba_cache_size, trace.mamba.ssm_gib, trace.kv_tokens or 0

    base = run()
    assert 20 == run("--max-mamba-cache-size", "20")[0]
    fewer = run("--mamba-full-memory-ratio", "0.5")
    assert fewer[0] < base[0] and fewer[2] > base[2]
    half = run("--max-mamba-cache-size", "20", "--mamba-ssm-dtype", "bfloat16")
    assert pytest.approx(run("--max-mamba-cache-size", "20")[1] / 2) == half[1]


@pytest.mark.parametrize(
    ("version", "shown"),
    [("0.5.10", "mamba_scheduler_strategy='no_buffer'"),
     ("0.5.23", "'mamba_radix_cache_strategy': 'auto'")],
)
def test_a_model_without_mamba_state_shows_the_strategy_sglang_resolves(
    pro6000: SimHost, version: str, shown: str
) -> None:
    """The args dump is the resolved one: 0.5.10 turns ``auto`` into ``no_buffer`` for every
    model (server_args.py:964-967), 0.5.23 keeps ``auto`` for a model without Mamba state; the
    log reader then sees what ``sim.observe`` reports for the same scenario."""
    argv = ["--model-path", str(model_dir("tiny-1b-sim")), "--mem-fraction-static", "0.80"]
    with pro6000.start(*argv, "--port", str(free_port()), version=version) as sim:
        sim.wait_for(READY_LINE)
    [dump] = [line for line in split_output(sim.output) if "server_args=" in line]
    assert shown in dump
    scenario, params = scenario_from_argv(version, argv, PRO6000)
    _, _, numbers = observed(scenario, simulate(scenario, params))
    assert numbers.mamba_strategy == diagnose_text(sim.output, 0).numbers.mamba_strategy
