"""Speculative decoding and multi-pass CUDA-graph capture in the simulated SGLang host.

What is checked, against SGLang 0.5.10's and 0.5.23's source (paths under python/sglang/srt/ in
the published wheels): the start-up order and line texts per version (0.5.23
``managers/scheduler.py:1128-1146``, draft weights before the pools; 0.5.10 the whole target
first, ``model_executor/model_runner.py:461-658``), the memory each capture pass takes from what
the previous one left, the running-request cap of 48 (0.5.23
``arg_groups/speculative_hook.py:1072-1093``), the graph memory's growth with batch size, draft
tokens, topk and steps, the auto ``--mem-fraction-static`` per version (0.5.10
``server_args.py:1315-1322`` adds 4 GiB for EAGLE-family drafts; 0.5.23
``arg_groups/memory_hook.py:47`` adds nothing), and the DeepSeek-V4-Flash MTP and Kimi-K2.5
EAGLE-3 deployments of docs/incidents.md ("the seeds"). Expected figures come
from ``launcher.sim.memory.simulate`` on the scenario the server builds from the same argv
(``scenario_from_argv``), so every number printed is checked against the memory model.
"""

from __future__ import annotations

import re
import signal
from pathlib import Path

import pytest

from launcher.sglang.autoargs import auto_mem_fraction_static, capture_bs_list, captured_sizes
from launcher.sglang.outcome import Outcome
from launcher.sim.logfmt import format_size
from launcher.sim.memory import MemoryScenario, SpecScenario, StartupTrace, simulate
from launcher.sim.model import scenario_from_argv
from launcher.sim.observe import observed
from tests.simhost import READY_LINE, SimHost, free_port, make_sim_host, model_dir, split_output

PRO6000 = 94.97  # RTX PRO 6000 Blackwell, as torch reports it in the seeds
DSV4 = str(model_dir("deepseek-v4-flash-sim"))
KIMI = str(model_dir("kimi-k2.5-sim"))
KIMI_DRAFT = str(model_dir("kimi-k2.5-eagle3-sim"))
VERSIONS = ("0.5.10", "0.5.23")


def graph_flag(version: str) -> str:
    return "--cuda-graph-max-bs-decode" if version == "0.5.23" else "--cuda-graph-max-bs"


def mtp(version: str, mfs: str, bs: str, *extra: str) -> list[str]:
    """The seeds' DeepSeek-V4-Flash launch: tp 4, EAGLE (MTP) 1/1/2."""
    return [
        "--model-path",
        DSV4,
        "--tp",
        "4",
        "--speculative-algorithm",
        "EAGLE",
        "--speculative-num-steps",
        "1",
        "--speculative-eagle-topk",
        "1",
        "--speculative-num-draft-tokens",
        "2",
        "--mem-fraction-static",
        mfs,
        graph_flag(version),
        bs,
        *extra,
    ]


def eagle3(version: str, mfs: str, *extra: str) -> list[str]:
    """Kimi-K2.5 with its EAGLE-3 draft, 3/1/4, graph bs 128 (the seeds' second attempt)."""
    return [
        "--model-path",
        KIMI,
        "--tp",
        "8",
        "--speculative-algorithm",
        "EAGLE3",
        "--speculative-draft-model-path",
        KIMI_DRAFT,
        "--speculative-num-steps",
        "3",
        "--speculative-eagle-topk",
        "1",
        "--speculative-num-draft-tokens",
        "4",
        "--mem-fraction-static",
        mfs,
        graph_flag(version),
        "128",
        *extra,
    ]


def trace_of(version: str, argv: list[str]) -> tuple[MemoryScenario, StartupTrace]:
    scenario, params = scenario_from_argv(version, argv, PRO6000)
    return scenario, simulate(scenario, params)


def records(output: str) -> list[tuple[str | None, str]]:
    """(rank label or None, message) of each log record, in order; bars and tracebacks left out."""
    out = []
    for line in split_output(output):
        m = re.match(r"^\[\d{4}-\d\d-\d\d \d\d:\d\d:\d\d(?: (TP\d+))?\] (.*)$", line)
        if m:
            out.append((m[1], m[2]))
    return out


@pytest.fixture
def pro6000(tmp_path: Path) -> SimHost:
    return make_sim_host(
        tmp_path,
        gpu_count=8,
        gpu_total_gib=PRO6000,
        gpu_name="NVIDIA RTX PRO 6000 Blackwell Server Edition",
    )


# ---------------------------------------------------------------------------------------------
# Pure: the memory model


def test_spec_capture_list_is_denser_and_clamped_to_the_request_cap() -> None:
    """Speculative decoding captures 1..8, 10..32 by 2, 40..64 by 4 ... and never above the
    request pool (48 unless --max-running-requests), adding the cap itself."""
    assert [*range(1, 9), *range(10, 33, 2)] == capture_bs_list(32, spec=True)
    assert [1, 2, 4, 8, 12, 16, 24, 32] == capture_bs_list(32)
    assert [*range(1, 9), *range(10, 33, 2), 40, 44, 48] == captured_sizes(128, spec=True, cap=48)
    assert [*range(1, 9), *range(10, 33, 2), *range(40, 65, 4)] == captured_sizes(
        64, spec=True, cap=64
    )


def test_graph_bs_above_the_running_request_cap_changes_nothing() -> None:
    """With the default cap of 48, graph bs 64 and 512 capture the same graphs with the same
    memory; raising --max-running-requests to 64 makes bs 64 capture more."""
    _, at64 = trace_of("0.5.23", [*eagle3("0.5.23", "0.88")[:-1], "64"])
    _, at512 = trace_of("0.5.23", [*eagle3("0.5.23", "0.88")[:-1], "512"])
    assert at64.passes == at512.passes and at64.ok
    raised = eagle3("0.5.23", "0.88", "--max-running-requests", "64")
    raised[raised.index("128")] = "64"
    _, at64_cap64 = trace_of("0.5.23", raised)
    verify = at64_cap64.pass_named("target_verify")
    assert verify is not None and 64 == verify.sizes[-1]
    assert (at64_cap64.graph_mem_gib or 0) > (at64.graph_mem_gib or 0)


def test_graph_memory_grows_with_bs_draft_tokens_and_topk() -> None:
    """Verify and draft extend grow with max_bs x num_draft_tokens, draft decode with
    max_bs x topk: its steps run one after another in the graph (eagle_worker.draft_forward),
    so a fitted draft is charged one step, 0.01 x 32 x 2 + 0.005 (0.01 x 32 x 2 x 3 + 0.005
    under the old topk x steps width); one step captures no draft decode graph."""
    spec = SpecScenario(
        "EAGLE", num_steps=3, topk=2, num_draft_tokens=6, draft_graph_gib_per_token=0.01
    )
    s = MemoryScenario(
        gpu_total_gib=80, weights_gib=10, graph_gib_per_bs=0.1, graph_overhead_gib=0, spec=spec
    )
    passes = {p.name: p for p in s.graph_passes(32)}
    first = {name: p.allocations[0][1] for name, p in passes.items()}
    assert pytest.approx(0.1 * 32 * 6) == first["target_verify"]
    assert pytest.approx(0.01 * 32 * 2 + 0.005) == first["draft_decode"]
    assert pytest.approx(0.01 * 32 * 6 + 0.005) == first["draft_extend"]
    one_step = MemoryScenario(
        gpu_total_gib=80,
        weights_gib=10,
        spec=SpecScenario("EAGLE", num_steps=1, topk=1, num_draft_tokens=2),
    )
    assert ["target_prefill", "target_verify", "draft_prefill", "draft_extend"] == [
        p.name for p in one_step.graph_passes(32)
    ]
    assert ["target_verify", "draft_extend"] == [
        p.name
        for p in MemoryScenario(80, 10, sglang_version="0.5.10", spec=one_step.spec).graph_passes(
            32
        )
    ]


def _draft_decode_first(version: str, steps: int, topk: int, attn: float) -> float:
    """The draft decode pass's first capture step (GiB) at bs 32, 0.01 GiB per token."""
    spec = SpecScenario("EAGLE", num_steps=steps, topk=topk, num_draft_tokens=steps * topk + 1,
                        draft_graph_gib_per_token=0.01, draft_attn_state_gib_per_token=attn)
    s = MemoryScenario(gpu_total_gib=80, weights_gib=10, graph_gib_per_bs=0.1,
                       graph_overhead_gib=0, spec=spec, sglang_version=version)
    return next(p for p in s.graph_passes(32) if p.name == "draft_decode").allocations[0][1]


@pytest.mark.parametrize("version", VERSIONS)
def test_draft_decode_holds_one_steps_activations_and_per_step_attention_state(
    version: str,
) -> None:
    """SGLang's draft decode graph runs its ``steps - 1`` forwards one after another on
    ``bs x topk`` tokens (0.5.10 eagle_worker.py:652, 0.5.23 eagle_worker_v2.py:808): its pool
    holds one step's activations, whatever the steps. Only the attention backend's graph
    state is per step: FlashInfer's ``(steps, max_bs x topk x context)`` int32 on 0.5.23
    (flashinfer_backend.py:2630-2646), ``(steps, max_bs x context)`` on 0.5.10 (l.1627-1632).

    A fitted draft (no attention term), bs 32, topk 2, 0.01 GiB per token: 0.01 x 32 x 2 +
    0.005 = 0.645 at 2 steps and at 5 (the old width charged 1.285 and 3.205). A
    tensor-derived one with 0.002 of its 0.01 per token attention state: one step's 0.008 x 32
    x 2 = 0.512, plus 0.002 x 32 x w x steps with w = 2 (0.5.23) or 1 (0.5.10): 2 steps
    0.512 + 0.256 / 0.128, 5 steps 0.512 + 0.64 / 0.32, each + 0.005. Steps 5 and 2 differ by
    the attention term alone, 3 x 0.002 x 32 x w."""
    w = 2 if version == "0.5.23" else 1
    for steps in (2, 5):
        assert pytest.approx(0.645) == _draft_decode_first(version, steps, 2, 0.0)
    two, five = (_draft_decode_first(version, n, 2, 0.002) for n in (2, 5))
    assert pytest.approx(0.512 + 0.002 * 32 * w * 2 + 0.005) == two
    assert pytest.approx(0.512 + 0.002 * 32 * w * 5 + 0.005) == five
    assert pytest.approx(3 * 0.002 * 32 * w) == five - two
    # topk scales it: one step at topk 1 is half of topk 2's activations
    assert pytest.approx(0.01 * 32 + 0.005) == _draft_decode_first(version, 3, 1, 0.0)


@pytest.mark.parametrize(
    ("algorithm", "extra_mib"),
    [("EAGLE", 4096), ("EAGLE3", 4096), ("STANDALONE", 6144), ("NGRAM", 0)],
)
def test_auto_fraction_reserves_for_spec_on_0_5_10_only(algorithm: str, extra_mib: int) -> None:
    """0.5.10 reserves +4096 MiB (EAGLE family) / +6144 (STANDALONE) after the 10 GiB floor;
    0.5.23 adds nothing."""
    gpu = 79.19
    plain = auto_mem_fraction_static(gpu, 1, "0.5.10", 256)
    spec = auto_mem_fraction_static(gpu, 1, "0.5.10", 256, speculative_algorithm=algorithm)
    assert pytest.approx(extra_mib / (gpu * 1024), abs=0.0011) == plain - spec
    assert auto_mem_fraction_static(gpu, 1, "0.5.23", 256) == auto_mem_fraction_static(
        gpu, 1, "0.5.23", 256, speculative_algorithm=algorithm
    )


@pytest.mark.parametrize("version", VERSIONS)
def test_each_pass_starts_where_the_previous_left_off(version: str) -> None:
    """The seeds' MTP launch: every pass's begin figure is the previous pass's end (0.5.10: less
    the draft's weights and pool in between); the failing pass reports its own free memory."""
    scenario, trace = trace_of(version, mtp(version, "0.70", "32"))
    names = [p.name for p in trace.passes]
    if version == "0.5.23":
        assert ["target_prefill", "target_verify", "draft_prefill", "draft_extend"] == names
        for before, after in zip(trace.passes, trace.passes[1:], strict=False):
            assert after.begin_free_gib == before.end_free_gib
        extend = trace.passes[-1]
        # The draft's weights and pool are inside the static budget.
        assert pytest.approx(trace.pre_load_free_gib * 0.30) == trace.draft_pool_end_free_gib
    else:
        assert ["target_verify", "draft_extend"] == names
        verify, extend = trace.passes
        assert pytest.approx(trace.pre_load_free_gib * 0.30) == trace.pool_end_free_gib
        spec = scenario.spec
        assert spec is not None
        gap = (verify.end_free_gib or 0) - extend.begin_free_gib
        assert pytest.approx(spec.draft_weights_gib + (trace.draft_kv_pool_gib or 0)) == gap
    fail = trace.failure
    assert fail is not None and "draft_extend" == fail.graph_pass and 0 == fail.step
    assert (7.50, 2.30) == (round(fail.tried_gib or 0, 2), round(fail.free_gib or 0, 2))
    assert extend.begin_free_gib == fail.free_gib < trace.passes[0].begin_free_gib - 20
    outcome, _, numbers = observed(scenario, trace)
    assert (Outcome.OOM_GRAPH_CAPTURE, 2.30, 0, 20) == (
        outcome,
        numbers.graph_begin_avail_gib,
        numbers.graph_steps_done,
        numbers.graph_steps_total,
    )


@pytest.mark.parametrize("version", VERSIONS)
def test_seed_mtp_fits_at_a_lower_fraction_or_batch_size(version: str) -> None:
    """The seeds' fix (0.60, bs 16) starts; so do 0.70 at bs 16 and 0.62 at bs 32; bs 32 needs
    the fraction below about 0.64 (0.637 on 0.5.23, 0.639 on 0.5.10)."""
    for mfs, bs in (("0.60", "16"), ("0.70", "16"), ("0.62", "32")):
        assert trace_of(version, mtp(version, mfs, bs))[1].ok, (mfs, bs)
    scenario, _ = trace_of(version, mtp(version, "0.70", "32"))
    low, high = scenario.feasible_range(32) or (0.0, 0.0)
    assert 0.45 < low < 0.55 and 0.63 < high < 0.64


def test_draft_extend_runs_steps_plus_one_tokens_on_0_5_10_and_the_draft_tree_on_0_5_23(
) -> None:
    """SGLang 0.5.10 captures the draft-extend graph at steps + 1 tokens per request
    (eagle_draft_extend_cuda_graph_runner.py:92, ``num_tokens_per_bs``); 0.5.23 at the whole
    draft tree, --speculative-num-draft-tokens (spec_utils.resolve_num_tokens_per_req). With
    3 steps, topk 2 and 6 draft tokens at bs 32: 0.01 x 32 x 4 on 0.5.10, 0.01 x 32 x 6 on
    0.5.23 (plus the 0.005 overhead in the first step)."""
    spec = SpecScenario(
        "EAGLE", num_steps=3, topk=2, num_draft_tokens=6, draft_graph_gib_per_token=0.01
    )
    for version, width in (("0.5.10", 4), ("0.5.23", 6)):
        s = MemoryScenario(gpu_total_gib=80, weights_gib=10, graph_gib_per_bs=0.1,
                           graph_overhead_gib=0, spec=spec, sglang_version=version)
        extend = next(p for p in s.graph_passes(32) if p.name == "draft_extend")
        assert pytest.approx(0.01 * 32 * width + 0.005) == extend.allocations[0][1], version


def test_disabling_draft_extend_graph_skips_the_pass_on_0_5_23_only(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """SGLANG_DISABLE_DRAFT_EXTEND_CUDA_GRAPH=1 drops the draft extend graph in 0.5.23 (the seeds'
    OOM then does not happen); 0.5.10 has no such switch."""
    monkeypatch.setenv("SGLANG_DISABLE_DRAFT_EXTEND_CUDA_GRAPH", "1")
    _, new = trace_of("0.5.23", mtp("0.5.23", "0.70", "32"))
    assert new.ok and None is new.pass_named("draft_extend")
    _, old = trace_of("0.5.10", mtp("0.5.10", "0.70", "32"))
    assert old.failure is not None and "draft_extend" == old.failure.graph_pass


@pytest.mark.parametrize(("version", "graph_pass", "tried"),
                         [("0.5.10", "draft_extend", 0.97), ("0.5.23", "draft_decode", 0.25)])
def test_kimi_eagle3_ooms_in_draft_capture_at_0_93_and_fits_at_0_88(
    version: str, graph_pass: str, tried: float
) -> None:
    """The draft's fitted 0.005 GiB per captured token and 0.01 per graph, capped at 48
    requests (23 sizes), 3 steps / topk 1 / 4 draft tokens: draft decode 0.005 x 48 x 1 +
    0.01 = 0.25 in its first step (one step's activations) and 0.47 in all, draft extend 0.005
    x 48 x 4 + 0.01 = 0.97 and 1.19. At 0.93 0.5.23 (prefill graphs and the draft prefill
    before) has 0.13 left when draft decode begins, short of its 0.25; 0.5.10 has 1.13 there,
    0.66 when draft extend begins, short of its 0.97. At 0.88 both come up. (0.92, the
    launch before draft decode was one step's: 0.5.10 then captures everything and has 0.42
    for its 0.5 warmup.)"""
    _, bad = trace_of(version, eagle3(version, "0.93"))
    assert bad.failure is not None and Outcome.OOM_GRAPH_CAPTURE == bad.failure.outcome
    assert graph_pass == bad.failure.graph_pass and 0 == bad.failure.step
    assert pytest.approx(tried) == bad.failure.tried_gib
    assert trace_of(version, eagle3(version, "0.88"))[1].ok


# ---------------------------------------------------------------------------------------------
# Processes: the log a version prints


def _begin_figures(recs: list[tuple[str | None, str]], rank: str) -> list[tuple[str, str]]:
    """(first words, avail) of each capture begin line of ``rank``."""
    out = []
    for label, msg in recs:
        m = re.match(
            r"^(Capture(?: .*?)?) (?:CUDA|cuda) graph begin\..*avail mem=([\d.]+) GB$", msg
        )
        if m and label == rank:
            out.append((m[1], m[2]))
    return out


@pytest.mark.parametrize("version", VERSIONS)
def test_seed_mtp_log_order_figures_and_oom_text(pro6000: SimHost, version: str) -> None:
    """The seeds' DeepSeek-V4-Flash MTP launch at 0.70 / bs 32 prints each version's start-up
    order, each pass's own avail figure, the NextN draft's weights and the seeds' OOM text
    wrapped in the version's capture failure."""
    scenario, trace = trace_of(version, mtp(version, "0.70", "32"))
    code, out = pro6000.run(
        *mtp(version, "0.70", "32"), "--port", str(free_port()), version=version
    )
    assert -signal.SIGKILL == code
    recs = records(out)
    tp0 = [msg for label, msg in recs if label == "TP0"]
    marks = [
        "Load weight end. elapsed=75.00 s, type=DeepseekV4ForCausalLM,",
        "Load weight end. elapsed=9.00 s, type=DeepseekV4ForCausalLMNextN,",
        "KV Cache is allocated.",
        "Capture target prefill CUDA graph begin.",
        "Capture target verify CUDA graph begin.",
        "Capture draft prefill CUDA graph begin.",
        "Capture draft extend CUDA graph begin.",
    ]
    if version == "0.5.10":
        marks = [
            marks[0],
            "KV Cache is allocated.",
            "Capture cuda graph begin.",
            "Capture cuda graph end.",
            marks[1],
            "KV Cache is allocated.",
            "Capture draft extend cuda graph begin.",
        ]
    at = 0
    for mark in marks:
        at = next(i for i in range(at, len(tp0)) if tp0[i].startswith(mark)) + 1
    kv_lines = [m for m in tp0 if m.startswith("KV Cache is allocated.")]
    assert 2 == len(kv_lines) and all(f"#tokens: {trace.kv_tokens}," in m for m in kv_lines)
    if version == "0.5.23":
        assert (
            "Load weight end. elapsed=9.00 s, type=DeepseekV4ForCausalLMNextN, avail mem=47.57 GB, "
            "mem usage=1.49 GB."
        ) in tp0
        # Draft decode/extend lines come from rank 0 only; the draft prefill's from every rank.
        tp1 = [msg for label, msg in recs if label == "TP1"]
        assert not any("Capture draft extend" in msg for msg in tp1)
        assert any("Capture draft prefill CUDA graph begin" in msg for msg in tp1)
    else:
        assert 4 == sum("Capture draft extend cuda graph begin" in msg for _, msg in recs)
    expected = [f"{p.begin_free_gib:.2f}" for p in trace.passes]
    assert expected == [avail for _, avail in _begin_figures(recs, "TP0")]
    oom = (
        "CUDA out of memory. Tried to allocate 7.50 GiB. GPU 0 has a total capacity of 94.97 GiB "
        "of which 2.30 GiB is free. Including non-PyTorch memory, this process has 92.67 GiB "
        "memory in use."
    )
    assert f"torch.OutOfMemoryError: {oom}" in out
    assert f"Exception: Capture cuda graph failed: {oom}" in out
    runner = "eagle_draft_extend_cuda_graph_runner.py"
    assert f'{runner}", line {305 if version == "0.5.23" else 220}, in __init__' in out
    assert "Possible solutions:\n1. set --mem-fraction-static to a smaller value" in out
    assert "Max running requests is reset to 48 for speculative decoding." in out
    assert ("Overlap scheduler is disabled when spec v2 is off" in out) == (version == "0.5.10")
    bar = next(line for line in reversed(split_output(out)) if line.startswith("Capturing batches"))
    assert bar.startswith("Capturing batches (bs=32 avail_mem=2.30 GB)") and "| 0/20 [" in bar
    assert scenario.spec is not None and 2 == scenario.spec.num_draft_tokens


@pytest.mark.parametrize("version", VERSIONS)
def test_seed_mtp_comes_up_at_the_seeds_fix(pro6000: SimHost, version: str) -> None:
    """0.60 / bs 16 reaches ready; the summary says 48 running requests, and each pass's end
    line carries the figures simulate() gives."""
    _, trace = trace_of(version, mtp(version, "0.60", "16"))
    assert trace.ok
    with pro6000.start(
        *mtp(version, "0.60", "16"), "--port", str(free_port()), version=version
    ) as sim:
        sim.wait_for(READY_LINE)
    out = sim.output
    assert f"max_total_num_tokens={trace.kv_tokens}," in out and "max_running_requests=48," in out
    extend = trace.pass_named("draft_extend")
    assert extend is not None
    end = (
        "Capture draft extend CUDA graph end."
        if version == "0.5.23"
        else "Capture draft extend cuda graph end."
    )
    line = next(msg for _, msg in records(out) if msg.startswith(end))
    assert f"avail mem={extend.end_free_gib:.2f} GB." in line
    assert f"mem usage={extend.mem_gib:.2f} GB" in line


@pytest.mark.parametrize("version", VERSIONS)
def test_kimi_eagle3_draft_loads_its_own_class_and_caps_capture_at_48(
    pro6000: SimHost, version: str
) -> None:
    """A separate EAGLE-3 draft logs LlamaForCausalLMEagle3; graph bs 128 captures only up to
    48; at 0.93 the draft's capture OOMs with the pass's own figures."""
    _, trace = trace_of(version, eagle3(version, "0.93"))
    fail = trace.failure
    assert fail is not None
    code, out = pro6000.run(*eagle3(version, "0.93"), "--port", str(free_port()), version=version)
    assert -signal.SIGKILL == code
    assert "type=LlamaForCausalLMEagle3," in out
    if version == "0.5.23":
        assert (
            "Capture draft decode CUDA graph begin. backend=full, num_tokens_per_req=1, bs=[" in out
        )
        assert "Capture target verify CUDA graph begin. backend=full, num_tokens_per_req=4," in out
    else:
        assert "Capture draft cuda graph begin. This can take up to several minutes." in out
        assert "Capture cuda graph bs [1, 2, 3, 4, 5, 6, 7, 8, 10, 12," in out
    lists = re.findall(r"(?:bs=|graph bs )\[([\d, ]+)\]", out)
    assert lists and all(lst.endswith(", 40, 44, 48") for lst in lists)
    assert (
        f"Tried to allocate {format_size(fail.tried_gib or 0)}. GPU 0 has a total capacity of "
        f"94.97 GiB of which {format_size(fail.free_gib or 0)} is free."
    ) in out


def test_topk_one_forces_draft_tokens_and_explicit_cap_silences_the_reset(pro6000: SimHost) -> None:
    """topk 1 with draft tokens != steps + 1 is adjusted with SGLang's warning; an explicit
    --max-running-requests keeps its value and drops the reset warning."""
    argv = mtp("0.5.23", "0.60", "16", "--max-running-requests", "16")
    argv[argv.index("--speculative-num-draft-tokens") + 1] = "5"
    scenario, _ = trace_of("0.5.23", argv)
    assert scenario.spec is not None and 2 == scenario.spec.num_draft_tokens
    assert 16 == scenario.spec.max_running_requests
    with pro6000.start(*argv, "--port", str(free_port()), version="0.5.23") as sim:
        sim.wait_for(READY_LINE)
    out = sim.output
    assert (
        "speculative_num_draft_tokens is adjusted to speculative_num_steps + 1 when "
        "speculative_eagle_topk == 1"
    ) in out
    assert "Max running requests is reset" not in out and "max_running_requests=16," in out
    assert "num_tokens_per_req=2," in out


def test_auto_draft_params_and_auto_fraction_per_version() -> None:
    """Without steps/topk/draft tokens SGLang picks 3/1/4; the auto fraction with EAGLE is the
    plain one less 4096 MiB on 0.5.10 and the plain one on 0.5.23."""
    argv = ["--model-path", KIMI, "--tp", "8", "--speculative-algorithm", "EAGLE3",
            "--speculative-draft-model", KIMI_DRAFT]  # fmt: skip
    for version in VERSIONS:
        scenario, params = scenario_from_argv(version, argv, PRO6000)
        spec = scenario.spec
        assert spec is not None and (3, 1, 4) == (spec.num_steps, spec.topk, spec.num_draft_tokens)
        mfs, bs = scenario.resolve(params)
        plain = auto_mem_fraction_static(PRO6000, 8, version, bs, mla=True)
        assert (plain - mfs > 0.04) == (version == "0.5.10")


def test_0_5_10_spec_v2_refuses_topk_above_one(pro6000: SimHost) -> None:
    """0.5.10 with SGLANG_ENABLE_SPEC_V2=1 and topk > 1: ServerArgs' ValueError, exit 1, before
    any log line; without the variable it starts (spec v1, overlap off)."""
    argv = mtp("0.5.10", "0.60", "16")
    argv[argv.index("--speculative-eagle-topk") + 1] = "2"
    argv[argv.index("--speculative-num-draft-tokens") + 1] = "4"
    code, out = pro6000.run(
        *argv, "--port", str(free_port()), version="0.5.10", env={"SGLANG_ENABLE_SPEC_V2": "1"}
    )
    assert 1 == code and "server_args=" not in out
    assert out.rstrip().endswith(
        "ValueError: Spec v2 currently only supports topk = 1 for speculative decoding."
    )
    scenario, _ = trace_of("0.5.10", argv)
    assert scenario.spec is not None and (2, 4) == (
        scenario.spec.topk,
        scenario.spec.num_draft_tokens,
    )


def test_0_5_23_too_small_pool_counts_the_draft_weights(pro6000: SimHost) -> None:
    """A fraction below the weights' share fails 0.5.23's ValueError, its stated minimum taken
    after the draft's weights (1 - 47.57/93.40 for the seeds' MTP launch)."""
    scenario, trace = trace_of("0.5.23", mtp("0.5.23", "0.45", "16"))
    fail = trace.failure
    assert fail is not None and Outcome.KV_TOO_SMALL == fail.outcome
    _, _, numbers = observed(scenario, trace)
    assert 0.4907 == numbers.min_mem_fraction
    code, out = pro6000.run(*mtp("0.5.23", "0.45", "16"), "--port", str(free_port()))
    assert -signal.SIGKILL == code
    assert (
        "ValueError: Loaded weights leave no GPU memory for the KV cache under "
        "--mem-fraction-static=0.45. Raise --mem-fraction-static above 0.491 (minimum viable = "
        "1 - available/pre = 0.4907). If using speculative decoding, draft weights are now counted."
    ) in out
