"""The simulated SGLang host (launcher.sim): real processes, real sockets, real files.

Expected figures come from launcher.sim.memory.simulate() on a scenario built here from the
model's config.json, so every number the sim prints is checked against the memory model.
"""

from __future__ import annotations

import json
import signal
import socket
import subprocess
import time
import urllib.error
import urllib.request
from collections.abc import Callable, Mapping
from pathlib import Path

import pytest

from launcher.params import LaunchParams
from launcher.sglang.autoargs import auto_chunked_prefill_size
from launcher.sglang.budget import GIB, ModelFacts
from launcher.sglang.outcome import Outcome
from launcher.sglang.phases import Phase
from launcher.sim.faults import FaultKind, FaultPlan, FaultProfileError, load_profile, parse_profile
from launcher.sim.gpustate import FOREIGN_PID, SimGpuHost, proc_start_time
from launcher.sim.logfmt import format_size, progress_bar, shard_bar
from launcher.sim.memory import MemoryScenario, StartupTrace, simulate
from tests.simhost import READY_LINE, SimHost, free_port, make_sim_host, model_dir, split_output

TINY = str(model_dir("tiny-1b-sim"))
REPO = Path(__file__).resolve().parents[2]


def model_scenario(
    name: str, total: float, *, tp: int = 1, other: float = 0.0, version: str = "0.5.23"
) -> MemoryScenario:
    """The memory scenario the sim must run for ``name`` (its "sim" object, per the docs:
    weights and KV per 1k tokens are whole-model figures, the rest per rank)."""
    data = json.loads((model_dir(name) / "config.json").read_text())
    sim = data["sim"]
    # SGLang's cell size (pool_configurator._compute_cell_size), from the HF keys
    kv_bytes = ModelFacts.from_config(data).kv_bytes_per_token(tp)
    # the decode graphs' pool per captured token and the warmup chunk's activations, from the
    # tensor truths (launcher/sim/model.py's docstring): whole + split / tp (+ the gathered
    # logits at tp > 1), the pool factor, and 4 bytes per token of context of attention state
    graph_per_bs, warmup = sim.get("graph_gib_per_bs"), sim.get("warmup_gib")
    if "graph_bytes_whole" in sim:
        tensors = (sim["graph_bytes_whole"] + sim["graph_bytes_split"] / tp
                   + (sim["graph_bytes_gathered"] if tp > 1 else 0))
        context = data["max_position_embeddings"]
        graph_per_bs = (sim["graph_pool_factor"] * tensors + 4 * context) / GIB
    if "warmup_bytes_whole" in sim:
        chunk = auto_chunked_prefill_size(total, version)
        warmup = chunk * (sim["warmup_bytes_whole"] + sim["warmup_bytes_split"] / tp) / GIB
    return MemoryScenario(
        gpu_total_gib=total,
        weights_gib=sim["weights_gib"],
        tp=tp,
        other_used_gib=other,
        context_gib=sim["context_gib"],
        kv_gib_per_1k_tokens=kv_bytes * 1000 / GIB,
        min_kv_tokens=sim["min_kv_tokens"],
        graph_gib_per_bs=graph_per_bs,
        graph_overhead_gib=sim["graph_overhead_gib"],
        warmup_gib=warmup,
        shard_gib=sim["shard_gib"],
        sglang_version=version,
        prefill_graph_gib=sim.get("prefill_graph_gib", 0.0),
        prefill_graph_overhead_gib=sim.get("prefill_graph_overhead_gib", 0.0),
    )


def http(
    port: int,
    path: str,
    body: Mapping[str, object] | None = None,
    headers: dict[str, str] | None = None,
) -> tuple[int, str]:
    """One request to the sim on loopback, bypassing any proxy."""
    opener = urllib.request.build_opener(urllib.request.ProxyHandler({}))
    data = None if body is None else json.dumps(body).encode()
    req = urllib.request.Request(f"http://127.0.0.1:{port}{path}", data=data, headers=headers or {})
    try:
        with opener.open(req, timeout=5) as resp:
            return int(resp.status), resp.read().decode()
    except urllib.error.HTTPError as exc:
        return int(exc.code), exc.read().decode()


def last_line(output: str) -> str:
    return split_output(output)[-1]


def children_of(pid: int) -> list[int]:
    """Live (non-zombie) child pids of ``pid``, from /proc."""
    out = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            raw = (entry / "stat").read_text()
        except OSError:
            continue
        fields = raw[raw.rfind(")") + 2 :].split()
        if int(fields[1]) == pid and fields[0] not in "ZX":
            out.append(int(entry.name))
    return out


def cmdline(pid: int) -> str:
    return (Path(f"/proc/{pid}/cmdline").read_bytes()).replace(b"\0", b" ").decode()


def wait_until(predicate: Callable[[], bool], timeout: float = 5.0) -> bool:
    """Poll ``predicate`` until it holds or ``timeout`` passes; its last value."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if predicate():
            return True
        time.sleep(0.02)
    return bool(predicate())


@pytest.fixture
def host24(tmp_path: Path) -> SimHost:
    """Four 24 GiB GPUs."""
    return make_sim_host(tmp_path, gpu_count=4, gpu_total_gib=24.0, gpu_name="NVIDIA L4")


# ---------------------------------------------------------------------------------------------
# Pure parts


def test_format_size_follows_torch() -> None:
    """Sizes print like torch's format_size: bytes, KiB, MiB or GiB with two decimals."""
    assert ["512 bytes", "2.00 KiB", "448.00 MiB", "7.50 GiB"] == [
        format_size(512 / 2**30),
        format_size(2 / 2**20),
        format_size(448 / 1024),
        format_size(7.5),
    ]


def test_progress_bars_follow_tqdm() -> None:
    """Progress lines have tqdm's layout, as in SGLang's logs."""
    assert (
        "Capturing batches (bs=256 avail_mem=20.12 GB):  11%|█▏        | 4/35 "
        "[00:01<00:07,  4.00it/s]"
        == progress_bar("Capturing batches (bs=256 avail_mem=20.12 GB)", 4, 35, 1.0)
    )
    assert "Loading safetensors checkpoint shards:   0% Completed | 0/2 [00:00<?, ?it/s]" == (
        shard_bar("Loading safetensors checkpoint shards", 0, 2, 0.0)
    )
    assert (
        "Loading safetensors checkpoint shards:  50% Completed | 1/2 [00:37<00:37, 37.50s/it]"
        == (shard_bar("Loading safetensors checkpoint shards", 1, 2, 37.5))
    )


def test_fault_profile_rejects_unknown_kind_and_keys() -> None:
    """A profile with an unknown kind or key is refused with the entry named."""
    with pytest.raises(FaultProfileError, match=r"profile\[0\]: kind must be one of"):
        parse_profile([{"kind": "explode"}])
    with pytest.raises(FaultProfileError, match=r"profile\[1\]: unknown key"):
        parse_profile([{"kind": "hang"}, {"kind": "hang", "phaze": "init"}])


def test_fault_plan_applies_only_to_listed_attempts(tmp_path: Path) -> None:
    """A fault limited to attempt 1 is active on attempt 1 and gone on attempt 2."""
    path = tmp_path / "f.json"
    path.write_text(json.dumps([{"kind": "die_silently", "phase": "weights", "attempts": [1]}]))
    env = {"SGLANG_SIM_FAULTS": str(path)}
    first = FaultPlan.from_env({**env, "LAUNCHER_ATTEMPT": "1"})
    second = FaultPlan.from_env({**env, "LAUNCHER_ATTEMPT": "2"})
    assert FaultKind.DIE_SILENTLY == getattr(first.in_phase(Phase.WEIGHTS), "kind", None)
    assert None is second.in_phase(Phase.WEIGHTS)


def test_shipped_host_and_fault_profiles_load() -> None:
    """configs/sim/host.json is 8 x H100 80GB with state next to it; every profile parses."""
    host = SimGpuHost.load(REPO / "configs/sim/host.json", {})
    assert (8, 79.19, REPO / "configs/sim/state") == (
        host.gpu_count,
        host.gpu_total_gib,
        host.state_dir,
    )
    profiles = sorted((REPO / "configs/sim/faults").glob("*.json"))
    assert len(profiles) >= 5
    for path in profiles:
        assert load_profile(path)


def test_demo_model_ooms_in_capture_and_a_modest_change_fits() -> None:
    """llama-70b-sim at tp=2 on 0.5.23 (pre-load free 78.19 GiB): 0.99 / bs 256 leaves 0.78
    GiB; the prefill graphs take 58 x 8 MiB and the decode graph's first capture (bs 256 x
    the pool per token, + 8 MiB) does not fit in the 0.32 GiB left. 0.95 fits; so does 0.88
    (3.1 GiB of graphs and warmup in a 9.4 GiB headroom). Feasible at bs 256:
    (0.829, 0.970]: low = (64.2 GiB of weights + 4096 x 163,840 bytes of KV) / 78.19, high =
    1 - (prefill + decode graphs + warmup) / 78.19."""
    s = model_scenario("llama-70b-sim", 79.19, tp=2)
    t = simulate(s, LaunchParams(0.99, 256))
    assert t.failure is not None and Outcome.OOM_GRAPH_CAPTURE == t.failure.outcome
    assert ("target_decode", 0) == (t.failure.graph_pass, t.failure.step)
    assert t.failure.tried_gib == pytest.approx(256 * s.graph_gib_per_bs + 8 / 1024)
    assert simulate(s, LaunchParams(0.95, 256)).ok
    assert simulate(s, LaunchParams(0.88, 256)).ok
    prefill = 58 * 0.008
    decode = 256 * s.graph_gib_per_bs + 36 * 8 / 1024
    low, high = s.feasible_range(256) or (0.0, 0.0)
    assert low == pytest.approx((64.2 + 4096 * 163_840 / GIB) / 78.19)
    assert high == pytest.approx(1 - (prefill + decode + s.warmup_gib) / 78.19)
    assert 0.82 < low < 0.84 and 0.96 < high < 0.98


# ---------------------------------------------------------------------------------------------
# Start-up to ready


def test_clean_start_serves_http_only_after_load_and_health_only_after_warmup(
    host24: SimHost,
) -> None:
    """Nothing listens while loading; /health is 503 during warmup and 200 once ready; the
    API key guards everything but /health."""
    port = free_port()
    key = {"Authorization": "Bearer k"}
    faults = host24.write_faults([{"kind": "slow", "phase": "warmup", "factor": 40}])
    flags = ["--model-path", TINY, "--port", str(port), "--api-key", "k"]
    with host24.start(*flags, faults=faults) as sim:
        with pytest.raises(urllib.error.URLError):
            http(port, "/health")
        sim.wait_for("Uvicorn running on")
        assert 503 == http(port, "/health")[0]
        code, body = http(port, "/model_info", headers=key)
        assert (200, "llama") == (code, json.loads(body)["model_type"])
        sim.wait_for(READY_LINE)
        assert (200, 401) == (http(port, "/health")[0], http(port, "/v1/models")[0])
        code, body = http(port, "/v1/models", headers=key)
        assert (200, TINY) == (code, json.loads(body)["data"][0]["id"])
        code, body = http(port, "/server_info", headers=key)
        expected = model_scenario("tiny-1b-sim", 24.0).resolve(LaunchParams())
        info = json.loads(body)
        assert expected == (info["mem_fraction_static"], info["cuda_graph_max_bs_decode"])
        request = {"text": "Hi", "sampling_params": {"max_new_tokens": 2}}
        code, body = http(port, "/generate", request, headers=key)
        assert (200, 2) == (code, json.loads(body)["meta_info"]["completion_tokens"])
    lines = [line.split("] ", 1)[-1] for line in split_output(sim.output)]
    order = [
        "Init parallel begin.",
        "Load weight begin.",
        "Load weight end.",
        "KV Cache is allocated.",
        "Memory pool end.",
        "Capture target decode CUDA graph end.",
        "max_total_num_tokens=",
        "INFO:     Uvicorn running on",
        READY_LINE,
    ]
    firsts = [next(i for i, line in enumerate(lines) if line.startswith(m)) for m in order]
    assert sorted(firsts) == firsts


@pytest.mark.parametrize("version", ["0.5.6", "0.5.23"])
def test_tp2_log_figures_match_simulate(host24: SimHost, version: str) -> None:
    """Each rank prints its own free memory (TP1's GPU is partly busy); the pool and summary
    come from simulate(); progress bars appear once (rank 0)."""
    host = make_sim_host(
        host24.path.parent.parent / "b", gpu_count=2, gpu_total_gib=24.0, foreign_used_gib={1: 3.0}
    )
    flag = "--cuda-graph-max-bs" if version == "0.5.6" else "--cuda-graph-max-bs-decode"
    flags = [
        "--model-path",
        TINY,
        "--tp",
        "2",
        "--mem-fraction-static",
        "0.8",
        flag,
        "64",
        "--port",
        str(free_port()),
    ]
    trace = simulate(
        model_scenario("tiny-1b-sim", 24.0, tp=2, other=3.0, version=version), LaunchParams(0.8, 64)
    )
    assert trace.ok
    with host.start(*flags, version=version) as sim:
        sim.wait_for(READY_LINE)
    out = sim.output
    pre = trace.pre_load_free_gib
    assert f" TP0] Load weight begin. avail mem={pre + 3.0:.2f} GB" in out
    assert f" TP1] Load weight begin. avail mem={pre:.2f} GB" in out
    assert f" TP1] Memory pool end. avail mem={trace.pool_end_free_gib:.2f} GB" in out
    assert 2 == out.count(f"#tokens: {trace.kv_tokens}, K size")
    assert f" TP0] max_total_num_tokens={trace.kv_tokens}, " in out
    assert 1 == out.count(
        "Loading safetensors checkpoint shards: 100% Completed | 2/2 [01:15<00:00, 37.50s/it]\n"
    )
    dump = next(line for line in split_output(out) if "server_args=" in line)
    if version == "0.5.6":
        assert "ServerArgs(" in dump and "mem_fraction_static=0.8," in dump
        assert "cuda_graph_max_bs=64," in dump and "Init torch distributed begin." in out
    else:
        assert "'mem_fraction_static': 0.8," in dump and "'cuda_graph_max_bs_decode': 64," in dump
        assert "Init parallel begin." in out and "Memory baseline taken." in out


# ---------------------------------------------------------------------------------------------
# Memory failures


@pytest.mark.parametrize(("version", "mfs"), [("0.5.6", "0.936"), ("0.5.23", "0.916")])
def test_capture_oom_on_the_busy_rank_matches_simulate(
    tmp_path: Path, version: str, mfs: str
) -> None:
    """The rank on the partly busy GPU fails mid-capture with torch's OOM numbers from
    simulate(), wrapped in the version's capture-failure text; the tree is SIGKILLed. (0.5.23's
    prefill graphs take memory first, so a lower fraction fails mid-way through decode.)"""
    host = make_sim_host(tmp_path, gpu_count=2, gpu_total_gib=24.0, foreign_used_gib={1: 3.0})
    trace = simulate(
        model_scenario("tiny-1b-sim", 24.0, tp=2, other=3.0, version=version),
        LaunchParams(float(mfs), 256),
    )
    fail = trace.failure
    assert fail is not None and Outcome.OOM_GRAPH_CAPTURE == fail.outcome and fail.step
    flag = "--cuda-graph-max-bs" if version == "0.5.6" else "--cuda-graph-max-bs-decode"
    code, out = host.run(
        "--model-path",
        TINY,
        "--tp",
        "2",
        "--mem-fraction-static",
        mfs,
        flag,
        "256",
        "--port",
        str(free_port()),
        version=version,
    )
    assert -signal.SIGKILL == code
    bs, free = trace.graph_steps[-1]
    bar = next(line for line in reversed(split_output(out)) if line.startswith("Capturing batches"))
    assert bar.startswith(f"Capturing batches (bs={bs} avail_mem={free + 3.0:.2f} GB)")
    assert f"| {fail.step}/36 [" in bar
    assert " TP1] Scheduler hit an exception: Traceback (most recent call last):" in out
    assert (
        f"Exception: Capture cuda graph failed: CUDA out of memory. Tried to allocate "
        f"{format_size(fail.tried_gib or 0)}. GPU 1 has a total capacity of 24.00 GiB of which "
        f"{format_size(fail.free_gib or 0)} is free. Process {FOREIGN_PID} has 3.00 GiB memory "
        "in use."
    ) in out
    solution = (
        "2. set --cuda-graph-max-bs to a smaller value (e.g., 16)"
        if version == "0.5.6"
        else "2. set --cuda-graph-max-bs-decode to a smaller value (e.g., 16)"
    )
    assert solution in out
    assert "Received sigquit from a child process. It usually means the child failed." in out
    assert (version == "0.5.23") == ("kill_process_tree called: parent_pid=" in out)


@pytest.mark.parametrize(
    ("version", "mfs", "final"),
    [
        (
            "0.5.6",
            0.09,
            "RuntimeError: Not enough memory. Please try to increase "
            "--mem-fraction-static. Current value: self.server_args.mem_fraction_static=0.09",
        ),
        (
            "0.5.23",
            0.0995,
            "RuntimeError: Not enough memory. Please try to increase "
            "--mem-fraction-static. Current value: mem_fraction_static=0.0995",
        ),
        (
            "0.5.23",
            0.09,
            "ValueError: Loaded weights leave no GPU memory for the KV cache under "
            "--mem-fraction-static=0.09. Raise --mem-fraction-static above {ceil} (minimum viable "
            "= 1 - available/pre = {minimum}). If using speculative decoding, draft weights are "
            "now counted.",
        ),
    ],
)
def test_kv_pool_too_small_in_each_version_form(
    host24: SimHost, version: str, mfs: float, final: str
) -> None:
    """A pool <= 0 or below the minimum fails with the version's message, before any pool
    line; 0.5.23 states the fraction at which simulate()'s pool would be 0."""
    trace = simulate(model_scenario("tiny-1b-sim", 24.0, version=version), LaunchParams(mfs, 8))
    fail = trace.failure
    assert fail is not None and Outcome.KV_TOO_SMALL == fail.outcome
    minimum = 1 - (trace.post_weights_free_gib or 0.0) / trace.pre_load_free_gib
    expected = final.format(ceil=f"{int(minimum * 1000 + 1) / 1000:.3f}", minimum=f"{minimum:.4f}")
    flag = "--cuda-graph-max-bs" if version == "0.5.6" else "--cuda-graph-max-bs-decode"
    code, out = host24.run(
        "--model-path",
        TINY,
        "--mem-fraction-static",
        str(mfs),
        flag,
        "8",
        "--port",
        str(free_port()),
        version=version,
    )
    assert -signal.SIGKILL == code
    assert expected in out
    assert "Load weight end." in out and "KV Cache is allocated" not in out


def test_weights_that_do_not_fit_oom_during_shard_load(tmp_path: Path) -> None:
    """On a 2.5 GiB GPU the second shard OOMs with simulate()'s numbers; no weight-end line."""
    host = make_sim_host(tmp_path, gpu_count=1, gpu_total_gib=2.5)
    fail = simulate(model_scenario("tiny-1b-sim", 2.5), LaunchParams()).failure
    assert fail is not None and Outcome.OOM_WEIGHTS == fail.outcome and 1 == fail.step
    code, out = host.run("--model-path", TINY, "--port", str(free_port()))
    assert -signal.SIGKILL == code
    assert "Loading safetensors checkpoint shards:  50% Completed | 1/2" in out
    assert "Load weight end." not in out
    assert (
        f"torch.OutOfMemoryError: CUDA out of memory. Tried to allocate "
        f"{format_size(fail.tried_gib or 0)}. GPU 0 has a total capacity of 2.50 GiB of which "
        f"{format_size(fail.free_gib or 0)} is free."
    ) in out


# ---------------------------------------------------------------------------------------------
# Command line and config


@pytest.mark.parametrize(
    ("version", "flags", "code", "message"),
    [
        (
            "0.5.23",
            ["--model-path", "/m", "--bogus", "1"],
            2,
            "sglang serve: error: unrecognized arguments: --bogus 1",
        ),
        (
            "0.5.6",
            ["--port", "1"],
            2,
            "launch_server.py: error: the following arguments are required: --model-path/--model",
        ),
        (
            "0.5.23",
            ["--model-path", "/m", "--cuda-graph-max-bs", "16"],
            2,
            "sglang serve: error: ambiguous option: --cuda-graph-max-bs could match "
            "--cuda-graph-max-bs-decode, --cuda-graph-max-bs-prefill",
        ),
        (
            "0.5.6",
            ["--model-path", "/m", "--cuda-graph-max-bs-decode", "16"],
            2,
            "launch_server.py: error: unrecognized arguments: --cuda-graph-max-bs-decode 16",
        ),
        ("0.5.6", ["--model-path", "/m", "--tp", "2", "--cuda-graph-max-bs", "16"], 1, "OSError"),
        ("0.5.15", ["--model-path", "/m", "--cuda-graph-max-bs", "16"], 1, "OSError"),
        (
            "0.5.23",
            ["--model-path", "/m", "--tp", "2", "--cuda-graph-max-bs-decode", "16"],
            1,
            "OSError",
        ),
    ],
)
def test_flags_parse_in_the_versions_dialect(
    host24: SimHost, version: str, flags: list[str], code: int, message: str
) -> None:
    """argparse errors exit 2 with SGLang's text; accepted spellings get past argparse."""
    actual_code, out = host24.run(*flags, version=version)
    assert (code, True) == (actual_code, message in out)


def test_missing_model_path_fails_like_huggingface_before_gpu_work(host24: SimHost) -> None:
    """A missing path ends in HF's repo-id OSError, exit 1, with no init line."""
    code, out = host24.run("--model-path", "/nonexistent/model")
    assert 1 == code
    assert (
        "OSError: Repo id must be in the form 'repo_name' or 'namespace/repo_name': "
        "'/nonexistent/model'. Use `repo_type` argument if needed."
    ) == last_line(out)
    assert "Init parallel" not in out and "server_args=" not in out


def test_model_dir_without_config_is_unrecognized(host24: SimHost, tmp_path: Path) -> None:
    """A directory without config.json ends in transformers' ValueError, exit 1."""
    empty = tmp_path / "empty-model"
    empty.mkdir()
    code, out = host24.run("--model-path", str(empty))
    assert (
        1,
        f"ValueError: Unrecognized model in {empty}. Should have a `model_type` key in "
        "its config.json.",
    ) == (code, last_line(out))


# ---------------------------------------------------------------------------------------------
# Ports


def test_port_taken_fails_after_loading_with_uvicorn_bind_error(host24: SimHost) -> None:
    """A listener on the port makes the sim fail at bind, after capture, with exit 3."""
    with socket.socket() as blocker:
        blocker.bind(("127.0.0.1", 0))
        blocker.listen()
        port = blocker.getsockname()[1]
        code, out = host24.run("--model-path", TINY, "--port", str(port))
    assert 3 == code
    assert (
        f"ERROR:    [Errno 98] error while attempting to bind on address ('127.0.0.1', {port}): "
        "address already in use"
    ) in out
    assert out.index("max_total_num_tokens=") < out.index("[Errno 98]")
    assert READY_LINE not in out


def test_port_taken_by_another_sim_gives_false_ready_then_exit_3(host24: SimHost) -> None:
    """The warmup reaches the other server on the port, prints the ready line, then exit 3."""
    port = free_port()
    with host24.start(
        "--model-path", TINY, "--port", str(port), env={"CUDA_VISIBLE_DEVICES": "0"}
    ) as first:
        first.wait_for(READY_LINE)
        code, out = host24.run(
            "--model-path", TINY, "--port", str(port), env={"CUDA_VISIBLE_DEVICES": "1"}
        )
    assert 3 == code
    assert out.index("address already in use") < out.index(READY_LINE)


# ---------------------------------------------------------------------------------------------
# Faults


def test_die_silently_is_sigkill_without_a_message(host24: SimHost) -> None:
    """die_silently in weights: exit -9 and no error text at all."""
    faults = host24.write_faults([{"kind": "die_silently", "phase": "weights", "after_s": 0.0}])
    code, out = host24.run("--model-path", TINY, "--port", str(free_port()), faults=faults)
    assert -signal.SIGKILL == code
    assert "Load weight begin." in out and "Load weight end." not in out
    assert not any(w in out for w in ("Traceback", "Error", "sigquit", "kill_process_tree"))


def test_hang_keeps_the_process_alive_and_the_log_silent(host24: SimHost) -> None:
    """A hang in the KV phase: alive, no new output, and SIGTERM still ends it (-15)."""
    faults = host24.write_faults([{"kind": "hang", "phase": "kv_cache"}])
    with host24.start("--model-path", TINY, "--port", str(free_port()), faults=faults) as sim:
        sim.wait_for("Load weight end.")
        time.sleep(0.3)
        before = sim.output
        time.sleep(0.5)
        assert (None, before) == (sim.proc.poll(), sim.output)
        sim.signal(signal.SIGTERM)
        assert -signal.SIGTERM == sim.wait(timeout=5)
    assert "KV Cache is allocated" not in sim.output


def test_crash_after_ready_prints_a_scheduler_traceback_and_kills_the_tree(
    host24: SimHost,
) -> None:
    """crash_after_ready: ready, then the scheduler's traceback, SIGQUIT text and exit -9."""
    faults = host24.write_faults([{"kind": "crash_after_ready", "after_s": 0.1}])
    code, out = host24.run("--model-path", TINY, "--port", str(free_port()), faults=faults)
    assert -signal.SIGKILL == code
    assert out.index(READY_LINE) < out.index("Scheduler hit an exception: Traceback")
    assert "torch.AcceleratorError: CUDA error: an illegal memory access was encountered" in out
    assert "SIGQUIT received. signum=3, frame=" in out


def test_hang_after_ready_turns_health_to_503_and_silences_the_scheduler(
    host24: SimHost,
) -> None:
    """hang_after_ready: /health 200 then 503; the access log and scheduler stop printing."""
    port = free_port()
    faults = host24.write_faults([{"kind": "hang_after_ready", "after_s": 0.3}])
    with host24.start("--model-path", TINY, "--port", str(port), faults=faults) as sim:
        sim.wait_for(READY_LINE)
        assert 200 == http(port, "/health")[0]
        assert wait_until(lambda: http(port, "/health")[0] == 503)
        assert 200 == http(port, "/model_info")[0]
        time.sleep(0.1)
        assert sim.output.count('"GET /model_info HTTP/1.1" 200 OK') == 1  # the warmup's only
        assert sim.proc.poll() is None


def test_nvidia_smi_reports_foreign_memory_and_an_orphan_until_its_hold_ends(
    tmp_path: Path,
) -> None:
    """nvidia-smi shows the foreign process, a running server's scheduler, and after the
    server is SIGKILLed, the orphan scheduler's memory for orphan_hold_s, then nothing."""
    host = make_sim_host(tmp_path, gpu_count=4, gpu_total_gib=24.0, foreign_used_gib={3: 20.0})
    assert ["0, 0, 24576", "3, 20480, 24576"] == host.nvidia_smi(
        "--query-gpu=index,memory.used,memory.total", "--format=csv,noheader,nounits", "-i", "0,3"
    ).stdout.splitlines()
    trace: StartupTrace = simulate(model_scenario("tiny-1b-sim", 24.0), LaunchParams(0.5, 16))
    held = round((0.5 + 2.3 + (trace.kv_pool_gib or 0) + (trace.graph_mem_gib or 0) + 0.25) * 1024)
    faults = host.write_faults([{"kind": "orphan_hold", "orphan_hold_s": 1.0}])
    with host.start(
        "--model-path",
        TINY,
        "--mem-fraction-static",
        "0.5",
        "--cuda-graph-max-bs-decode",
        "16",
        "--port",
        str(free_port()),
        faults=faults,
    ) as sim:
        sim.wait_for(READY_LINE)
        apps = host.nvidia_smi(
            "--query-compute-apps=pid,used_memory", "--format=csv,noheader,nounits"
        ).stdout.splitlines()
        scheduler = next(
            int(a.split(", ")[0]) for a in apps if a.split(", ")[0] != str(FOREIGN_PID)
        )
        assert sorted([f"{FOREIGN_PID}, 20480", f"{scheduler}, {held}"]) == sorted(apps)
        assert cmdline(scheduler).startswith("sglang::scheduler_TP0")
        sim.signal(signal.SIGKILL)
        sim.wait()
    gpu0 = ["--query-gpu=memory.used", "--format=csv,noheader,nounits", "-i", "0"]
    assert [str(held)] == host.nvidia_smi(*gpu0).stdout.split()  # the orphan still holds it
    assert wait_until(lambda: host.nvidia_smi(*gpu0).stdout.split() == ["0"], timeout=5)
    assert None is proc_start_time(scheduler)


def test_nvidia_smi_rejects_unknown_fields_and_needs_a_host(host24: SimHost) -> None:
    """An unknown query field exits 2 with nvidia-smi's message; without a host it exits 9."""
    bad = host24.nvidia_smi("--query-gpu=index,bogus", "--format=csv")
    assert (2, 'Field "bogus" is not a valid field to query.\n') == (bad.returncode, bad.stdout)
    env = {k: v for k, v in host24.env.items() if k != "SGLANG_SIM_HOST"}
    no_host = SimHost(host24.path, host24.state_dir, env, host24.bin_dir).nvidia_smi()
    assert 9 == no_host.returncode


def test_busy_gpu_leaves_a_second_server_less_memory(host24: SimHost) -> None:
    """A second server on the first one's GPU starts from what the first left free."""
    trace = simulate(model_scenario("tiny-1b-sim", 24.0), LaunchParams(0.5, 16))
    held = 0.5 + 2.3 + (trace.kv_pool_gib or 0) + (trace.graph_mem_gib or 0) + 0.25
    flags = [
        "--model-path",
        TINY,
        "--mem-fraction-static",
        "0.5",
        "--cuda-graph-max-bs-decode",
        "16",
    ]
    env = {"CUDA_VISIBLE_DEVICES": "2"}
    with host24.start(*flags, "--port", str(free_port()), env=env) as first:
        first.wait_for(READY_LINE)
        with host24.start(*flags, "--port", str(free_port()), env=env) as second:
            second.wait_for("Load weight begin.")
    assert f"Load weight begin. avail mem={24.0 - held - 0.5:.2f} GB" in second.output


# ---------------------------------------------------------------------------------------------
# Shutdown and process tree


@pytest.mark.parametrize("force", [True, False])
def test_sigterm_after_ready_exits_promptly_and_frees_the_gpu(host24: SimHost, force: bool) -> None:
    """SIGTERM after ready drains (or force-exits with SGL_FORCE_SHUTDOWN=1) within seconds,
    kills the tree (-9) and leaves no memory held."""
    env = {"SGL_FORCE_SHUTDOWN": "1"} if force else {}
    with host24.start("--model-path", TINY, "--port", str(free_port()), env=env) as sim:
        sim.wait_for(READY_LINE)
        children = children_of(sim.pid)
        sim.signal(signal.SIGTERM)
        assert -signal.SIGKILL == sim.wait(timeout=5)
    out = sim.output
    assert "SIGTERM received. signum=15 frame=" in out
    assert force == ("Signal SIGTERM received while force shutdown flag set. Force exiting." in out)
    assert (not force) == ("Gracefully exiting... Remaining number of requests 0." in out)
    assert [] == [pid for pid in children if proc_start_time(pid) is not None]
    assert (
        "0\n0\n0\n0\n"
        == host24.nvidia_smi("--query-gpu=memory.used", "--format=csv,noheader,nounits").stdout
    )


def test_scheduler_children_are_named_and_die_with_the_parent(host24: SimHost) -> None:
    """One sglang::scheduler_TPn per rank plus a detokenizer; SIGKILL of the parent takes
    them all down (PDEATHSIG)."""
    faults = host24.write_faults([{"kind": "hang", "phase": "weights"}])
    with host24.start(
        "--model-path", TINY, "--tp", "2", "--port", str(free_port()), faults=faults
    ) as sim:
        sim.wait_for("Load weight begin.")
        children = children_of(sim.pid)
        names = sorted(cmdline(pid).split()[0] for pid in children)
        assert ["sglang::detokenizer", "sglang::scheduler_TP0", "sglang::scheduler_TP1"] == names
        sim.signal(signal.SIGKILL)
        sim.wait()
    assert wait_until(lambda: all(proc_start_time(pid) is None for pid in children), timeout=3)


def test_each_version_reaches_ready_with_its_own_lines(host24: SimHost) -> None:
    """0.5.10 and 0.5.15 print their own init, weight and capture line shapes."""
    outs = {}
    for version, flag in (("0.5.10", "--cuda-graph-max-bs"), ("0.5.15", "--cuda-graph-max-bs")):
        with host24.start(
            "--model-path", TINY, flag, "16", "--port", str(free_port()), version=version
        ) as sim:
            sim.wait_for(READY_LINE)
            out = sim.output
        outs[version] = out
    assert "Init torch distributed ends. elapsed=15.00 s, mem usage=0.50 GB" in outs["0.5.10"]
    assert "Capture cuda graph begin. This can take up to several minutes." in outs["0.5.10"]
    assert (
        "Capture target decode CUDA graph begin. backend=full, num_tokens_per_bs=1"
        in outs["0.5.15"]
    )
    assert "cuda_graph_max_bs_decode=16" in outs["0.5.15"]
    assert "--cuda-graph-max-bs is deprecated" in outs["0.5.15"]


# ---------------------------------------------------------------------------------------------
# The classifier reads the sim's logs as SGLang's


@pytest.mark.parametrize(
    ("version", "total", "flags", "faults", "cuda_visible", "outcome"),
    [
        (
            "0.5.6",
            24.0,
            ["--mem-fraction-static", "0.953", "--cuda-graph-max-bs", "256"],
            None,
            None,
            Outcome.OOM_GRAPH_CAPTURE,
        ),
        ("0.5.23", 24.0, ["--mem-fraction-static", "0.09"], None, None, Outcome.KV_TOO_SMALL),
        ("0.5.6", 24.0, ["--mem-fraction-static", "0.0995"], None, None, Outcome.KV_TOO_SMALL),
        ("0.5.23", 2.5, [], None, None, Outcome.OOM_WEIGHTS),
        (
            "0.5.6",
            24.0,
            ["--mem-fraction-static", "0.993", "--cuda-graph-max-bs", "8"],
            None,
            None,
            Outcome.OOM_RUNTIME,
        ),
        ("0.5.23", 24.0, ["--tp", "2"], [{"kind": "nccl_error"}], None, Outcome.NCCL_ERROR),
        (
            "0.5.23",
            24.0,
            [],
            [{"kind": "crash_after_ready", "after_s": 0.05}],
            None,
            Outcome.CUDA_ERROR_OTHER,
        ),
        ("0.5.6", 24.0, [], [{"kind": "oom_runtime", "after_s": 0.05}], None, Outcome.OOM_RUNTIME),
        (
            "0.5.23",
            24.0,
            [],
            [{"kind": "die_silently", "phase": "cuda_graph"}],
            None,
            Outcome.KILLED,
        ),
        ("0.5.23", 24.0, ["--bogus"], None, None, Outcome.BAD_ARGUMENT),
        ("0.5.6", 24.0, ["--context-length", "999999999"], None, None, Outcome.BAD_ARGUMENT),
        ("0.5.23", 24.0, ["--tp", "2"], None, "0", Outcome.CUDA_ERROR_OTHER),
    ],
)
def test_classifier_reads_each_sim_failure_as_its_outcome(
    tmp_path: Path,
    version: str,
    total: float,
    flags: list[str],
    faults: list[dict[str, object]] | None,
    cuda_visible: str | None,
    outcome: Outcome,
) -> None:
    """launcher.sglang.classify turns the sim's log and exit status into the expected outcome."""
    from launcher.sglang.classify import diagnose_text

    host = make_sim_host(tmp_path, gpu_count=2, gpu_total_gib=total)
    profile = host.write_faults(faults) if faults else None
    env = {"CUDA_VISIBLE_DEVICES": cuda_visible} if cuda_visible is not None else None
    code, out = host.run(
        "--model-path",
        TINY,
        "--port",
        str(free_port()),
        *flags,
        version=version,
        faults=profile,
        env=env,
    )
    assert outcome == diagnose_text(out, code).outcome


def test_classifier_reads_missing_model_port_in_use_and_ready(host24: SimHost) -> None:
    """Missing model -> model_not_found, a taken port -> port_in_use, a running ready server
    -> ready."""
    from launcher.sglang.classify import diagnose_text

    code, out = host24.run("--model-path", "/nonexistent/model")
    assert Outcome.MODEL_NOT_FOUND == diagnose_text(out, code).outcome
    with socket.socket() as blocker:
        blocker.bind(("127.0.0.1", 0))
        blocker.listen()
        code, out = host24.run("--model-path", TINY, "--port", str(blocker.getsockname()[1]))
    assert Outcome.PORT_IN_USE == diagnose_text(out, code).outcome
    with host24.start("--model-path", TINY, "--port", str(free_port())) as sim:
        sim.wait_for(READY_LINE)
        assert Outcome.READY == diagnose_text(sim.output, None).outcome


def test_shims_work_without_the_environment(host24: SimHost) -> None:
    """bin_dir's nvidia-smi and sglang-sim-server find the host without any variable set
    (as over SSH)."""
    bare = {"PATH": "/usr/bin:/bin"}
    smi = subprocess.run(
        [str(host24.bin_dir / "nvidia-smi"), "-L"], env=bare, capture_output=True, text=True
    )
    assert (0, 4) == (smi.returncode, len(smi.stdout.splitlines()))
    server = subprocess.run(
        [str(host24.bin_dir / "sglang-sim-server"), "--model-path", "/nonexistent/model"],
        env=bare,
        capture_output=True,
        text=True,
    )
    assert (1, "OSError: Repo id must be") == (
        server.returncode,
        server.stderr.splitlines()[-1][:24],
    )
