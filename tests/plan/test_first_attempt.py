"""The memory estimate on a host: the facts reader (launcher/host/facts.py) over the local
transport and the simulated nvidia-smi, and the first attempt it chooses, end to end with the
real CLI against simulated servers (docs/memory.md)."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import AsyncIterator, Sequence
from contextlib import AbstractAsyncContextManager
from pathlib import Path
from typing import Any

import anyio
import pytest

from launcher import daemon
from launcher.cli.app import EXIT_GAVE_UP, EXIT_OK, EXIT_WONT_FIT
from launcher.config.load import config_from_dict
from launcher.errors import WontFit
from launcher.host.facts import MAX_CONFIG, Facts, read_gpus, read_model, server_shape
from launcher.host.transport.base import CommandResult
from launcher.host.transport.local import LocalTransport
from launcher.memory.estimate import choose
from launcher.params import LaunchParams
from launcher.plan.first_attempt import plan_first_attempt, warm_start
from launcher.sglang.modelfacts import GIB, GpuFacts, ModelFacts, NoEstimate, ServerShape
from launcher.sim.memory import simulate
from launcher.sim.model import scenario_from_argv
from launcher.store.ledger import Ledger, fingerprint, ledger_path
from tests.simhost import make_sim_host, model_dir
from tests.supervise import SimSetup, cli_argv, cli_env, json_lines, run_cli

pytestmark = pytest.mark.timeout(120)


def _local() -> LocalTransport:
    return LocalTransport("local")


# --- the facts reader ----------------------------------------------------------------------


def test_reads_config_and_index_of_a_sim_model() -> None:
    model, weights = anyio.run(read_model, _local(), str(model_dir("llama-70b-sim")))
    assert (model.arch, model.num_layers, model.num_kv_heads) == ("LlamaForCausalLM", 80, 8)
    assert (weights.source, weights.total_gib) == ("index", pytest.approx(128.4))


def test_without_an_index_the_safetensors_file_sizes_count(tmp_path: Path) -> None:
    (tmp_path / "config.json").write_text(
        (model_dir("tiny-1b-sim") / "config.json").read_text())
    (tmp_path / "model-00001-of-00002.safetensors").write_bytes(b"x" * 1000)
    (tmp_path / "model-00002-of-00002.safetensors").write_bytes(b"x" * 24)
    _, weights = anyio.run(read_model, _local(), str(tmp_path))
    assert (weights.source, weights.total_bytes) == ("files", 1024)


@pytest.mark.parametrize(
    ("files", "why"),
    [
        ({}, "config.json does not exist on local"),
        ({"config.json": "{not json"}, "config.json is not valid JSON"),
        ({"config.json": '{"hidden_size": 8}'}, "config.json has no num_hidden_layers"),
        ({"config.json": json.dumps({"num_hidden_layers": 2, "hidden_size": 64})},
         "has neither model.safetensors.index.json nor *.safetensors files"),
        ({"config.json": json.dumps({"num_hidden_layers": 2, "hidden_size": 64}),
          "model.safetensors.index.json": '{"metadata": {}}'}, "metadata.total_size"),
        ({"config.json": " " * (MAX_CONFIG + 1)}, "larger than 1 MiB"),
    ],
)
def test_bad_or_missing_files_give_no_estimate_with_the_reason(
    tmp_path: Path, files: dict[str, str], why: str
) -> None:
    for name, text in files.items():
        (tmp_path / name).write_text(text)
    with pytest.raises(NoEstimate, match="no estimate: .*" + why.replace("*", r"\*")
                       .replace(".", r"\.")):
        anyio.run(read_model, _local(), str(tmp_path))


def test_reads_gpu_totals_and_what_others_hold_from_nvidia_smi(tmp_path: Path) -> None:
    host = make_sim_host(tmp_path, gpu_count=2, gpu_total_gib=94.97,
                         foreign_used_gib={1: 3.5})
    t = LocalTransport("sim", host.env)
    smi = [sys.executable, "-m", "launcher.sim.nvidia_smi"]
    gpus = anyio.run(read_gpus, t, smi, [0, 1])
    assert [g.index for g in gpus] == [0, 1]
    assert gpus[0].total_gib == pytest.approx(94.97, abs=0.01)
    assert gpus[1].other_used_gib == pytest.approx(3.5, abs=0.01)
    with pytest.raises(NoEstimate, match="does not show GPU 5"):
        anyio.run(read_gpus, t, smi, [5])


# --- end to end: launcher up / plan on the simulator ---------------------------------------


def _llama(sim: SimSetup, **kw: object) -> dict[str, object]:
    return sim.data(model="llama-70b-sim", tp=2, **kw)  # type: ignore[arg-type]


def test_configured_params_would_oom_but_the_estimate_is_ready_on_attempt_1(
    sim: SimSetup,
) -> None:
    """llama-70b at tp2 on two H100s: 0.99 / bs 256 OOMs in capture (the demo). With
    ``[policy] initial = "estimate"`` the first attempt is the estimate's and reaches ready;
    attempt.started says why."""
    scenario, _ = scenario_from_argv(
        "0.5.23", ["--model-path", str(model_dir("llama-70b-sim")), "--tp-size", "2"], 79.19)
    assert not simulate(scenario, LaunchParams(0.99, 256)).ok

    data = _llama(sim, mem_fraction_static=0.99, cuda_graph_max_bs=256,
                  policy={"initial": "estimate"})
    config = sim.write_toml(data)
    up = run_cli("up", str(config), "--until-ready", "--log-format", "json", timeout=90)

    assert EXIT_OK == up.returncode, up.stderr + up.stdout[-3000:]
    assert sim.attempts() == [1]
    events = json_lines(up.stdout)
    started = [e for e in events if e.get("event") == "attempt.started"]
    assert started and started[0]["attempt"] == 1
    assert started[0]["why"].startswith("estimate: mem_fraction_static=")
    params = started[0]["params"]
    assert (params["mem_fraction_static"], params["cuda_graph_max_bs"]) != (0.99, 256)
    assert f"--mem-fraction-static {params['mem_fraction_static']}" in sim.cmd(1)
    assert simulate(scenario, LaunchParams(params["mem_fraction_static"],
                                           params["cuda_graph_max_bs"])).ok


def test_the_ledgers_last_good_params_win_over_the_estimate(sim: SimSetup) -> None:
    """A second `up` with the same launch starts from what was ready last time, as before."""
    config = sim.write_toml(_llama(sim, mem_fraction_static=0.85, cuda_graph_max_bs=64,
                                   policy={"initial": "estimate"}))
    first = run_cli("up", str(config), "--until-ready", "--stop-on-exit", "--log-format", "json",
                    timeout=90)
    assert EXIT_OK == first.returncode, first.stderr
    good = next(e for e in json_lines(first.stdout) if e.get("event") == "attempt.started")
    [planned] = json.loads(run_cli("plan", str(config), "--json").stdout)
    second = run_cli("up", str(config), "--until-ready", "--stop-on-exit", "--log-format",
                     "json", timeout=90)
    assert EXIT_OK == second.returncode, second.stderr
    initial = next(e for e in json_lines(second.stdout) if e.get("event") == "params.initial")
    assert initial["source"] == "ledger" and initial["reason"].startswith("warm start")
    p = dict(good["params"])
    last_good = LaunchParams.from_extras(p.pop("mem_fraction_static"),
                                         p.pop("cuda_graph_max_bs"), p)
    assert initial["params"] == last_good.describe()
    # `plan` and `up` agree on the first attempt for the same config and ledger (one rule).
    assert planned["params"] == planned["first_attempt"]["params"]
    q = dict(planned["params"])
    assert initial["params"] == LaunchParams.from_extras(
        q.pop("mem_fraction_static"), q.pop("cuda_graph_max_bs"), q).describe()
    assert "ledger" == planned["first_attempt"]["source"]


def test_warm_start_takes_the_newest_last_good_params_under_the_versions_given(
        tmp_path: Path) -> None:
    """The ledger's last good params win (the newest over the versions asked), the reason
    naming their date; ``fresh`` or a launch never ready: none, with the reason."""
    cfg = config_from_dict({
        "state_dir": str(tmp_path), "hosts": [{"name": "h", "transport": "local"}],
        "servers": [{"name": "s", "host": "h", "model_path": "/m", "gpus": [0], "port": 1}],
    }, environ={})
    s, host = cfg.servers[0], cfg.hosts[0]
    older, newer = LaunchParams(0.88, 256), LaunchParams(0.80, 128)
    with Ledger(ledger_path(tmp_path)) as ledger:
        ledger.server_ready("s", fingerprint(s, host, "0.5.6"), older, 10.0, 1, at=1.6e9)
        ledger.server_ready("s", fingerprint(s, host, "0.5.23"), newer, 10.0, 3, at=1.7e9)

        both = warm_start(ledger, cfg, s, ["0.5.6", "0.5.23"], fresh=False)
        one = warm_start(ledger, cfg, s, ["0.5.6"], fresh=False)
        fresh = warm_start(ledger, cfg, s, ["0.5.23"], fresh=True)
        never = warm_start(ledger, cfg, s, ["0.5.10"], fresh=False)

    assert (newer, "warm start from last good params of 2023-11-14 22:13 UTC") == both.warm
    assert older == (one.warm or (None,))[0]
    assert (None, "fresh start requested: configured params") == (fresh.warm, fresh.reason)
    assert (None, "no last good params for this launch: configured params") == (
        never.warm, never.reason)
    assert warm_start(None, cfg, s, ["0.5.23"], fresh=False).warm is None


def test_nothing_fits_refuses_to_launch_unless_forced(sim: SimSetup) -> None:
    """llama-70b's 128 GiB on one 79 GiB GPU: `up` says so with the numbers and the fix,
    launches nothing and exits 5; `--force` launches (and the weights OOM gives up: 4)."""
    config = sim.write_toml(sim.data(model="llama-70b-sim", tp=1))
    up = run_cli("up", str(config), "--log-format", "json")
    assert EXIT_WONT_FIT == up.returncode, up.stderr
    assert "weights alone need 128.40 GiB per GPU" in up.stderr
    assert "more GPUs (tp 2" in up.stderr and "--force" in up.stderr
    assert sim.attempts() == []

    forced = run_cli("up", str(config), "--log-format", "json", "--force", timeout=90)
    assert EXIT_GAVE_UP == forced.returncode, forced.stderr
    assert sim.attempts() and "estimate.forced" in forced.stdout


def test_nothing_fits_refuses_configured_params_too_unless_initial_is_configured(
        sim: SimSetup) -> None:
    """Both params configured (the demo's 0.99 / 256) on one GPU the weights alone exceed:
    no setting can fit, so `up` refuses as it does for the estimate's own choice (exit 5,
    nothing launched) instead of loading 128 GiB of weights to fail, and `check` says so
    beforehand. ``[policy] initial = "configured"`` opts out of the estimate, and so of the
    refusal."""
    data = sim.data(model="llama-70b-sim", tp=1, mem_fraction_static=0.99,
                    cuda_graph_max_bs=256)
    check = run_cli("check", str(sim.write_toml(data)))
    assert 1 == check.returncode, check.stdout + check.stderr
    assert ("  - nothing fits (`up` would exit 5): weights alone need 128.40 GiB per GPU"
            in check.stdout), check.stdout
    up = run_cli("up", str(sim.write_toml(data)), "--log-format", "json")
    assert EXIT_WONT_FIT == up.returncode, up.stderr + up.stdout[-2000:]
    assert "weights alone need 128.40 GiB per GPU" in up.stderr
    assert sim.attempts() == []

    opted_out = sim.write_toml({**data, "policy": {"initial": "configured"}}, "optout.toml")
    up = run_cli("up", str(opted_out), "--log-format", "json", timeout=90)
    assert EXIT_GAVE_UP == up.returncode, up.stderr
    assert sim.attempts() == [1] and "estimate.refused" not in up.stdout


@pytest.mark.parametrize(("total_gib", "refused"), [(70.0, False), (66.0, True)])
def test_configured_params_get_no_margin_only_what_must_fit(
        tmp_path: Path, total_gib: float, refused: bool) -> None:
    """llama-70b at tp2 with 0.95 / 256 configured and a 200 % margin. On 70 GiB GPUs no
    fraction leaves that margin, but a setting fits without it: the operator's params are
    launched, the reason giving the estimate's view. On 66 GiB GPUs weights + the minimum KV
    pool + graphs at bs 1 exceed the memory: refused like the estimate's own choice."""
    host = make_sim_host(tmp_path, gpu_count=2, gpu_total_gib=total_gib)
    smi = [sys.executable, "-m", "launcher.sim.nvidia_smi"]
    cfg = config_from_dict({
        "state_dir": str(tmp_path / "state"),
        "hosts": [{"name": "h", "transport": "local", "nvidia_smi": smi, "env": host.env}],
        "policy": {"estimate_margin": 2.0},
        "servers": [{"name": "s", "host": "h", "tp": 2, "gpus": [0, 1], "port": 30000,
                     "model_path": str(model_dir("llama-70b-sim")), "sglang_version": "0.5.23",
                     "mem_fraction_static": 0.95, "cuda_graph_max_bs": 256}],
    }, environ={})
    [s] = cfg.servers
    planned = anyio.run(lambda: plan_first_attempt(
        cfg, s, LocalTransport("h", host.env), "0.5.23", s.launch_params()))
    assert planned.choice is not None and not planned.choice.feasible, planned.reason
    assert (planned.refused, planned.params) == (refused, LaunchParams(0.95, 256))
    if refused:
        assert planned.reason.startswith("no setting fits: weights 64.20 GiB"), planned.reason
    else:
        assert planned.reason.startswith(
            "configured params kept (no setting fits with the 200% margin"), planned.reason


def test_plan_draws_a_bar_per_gpu_and_carries_memory_in_json(sim: SimSetup) -> None:
    config = sim.write_toml(_llama(sim))
    js = run_cli("plan", str(config), "--json")
    assert js.returncode == 0, js.stderr
    row = json.loads(js.stdout)[0]
    assert row["first_attempt"]["source"] == "estimate"
    mem = row["memory"]
    assert [g["gpu"] for g in mem] == [0, 1]
    keys = {"total_gib", "weights_gib", "kv_gib", "graphs_gib", "activations_gib", "other_gib",
            "free_gib"}
    assert keys <= set(mem[0])
    g = mem[0]
    assert g["total_gib"] == pytest.approx(79.19, abs=0.01)
    assert g["weights_gib"] == pytest.approx(64.2, abs=0.01)
    parts = sum(g[k] for k in keys - {"total_gib"}) + g["context_gib"]
    assert parts == pytest.approx(g["total_gib"], abs=0.05)
    mfs = row["first_attempt"]["params"]["mem_fraction_static"]
    assert row["estimate"]["mem_fraction_static"] == mfs and row["estimate"]["fits"]

    text = run_cli("plan", str(config))
    assert text.returncode == 0, text.stderr
    assert "GPU 0" in text.stdout and "GPU 1" in text.stdout
    assert f"mem_fraction_static {mfs:.3f}: static budget (weights + KV)" in text.stdout
    assert "weights 64.20" in text.stdout


def test_plan_without_facts_says_why(sim: SimSetup, tmp_path: Path) -> None:
    empty = tmp_path / "no-model"
    empty.mkdir()
    config = sim.write_toml(sim.data(server={"model_path": str(empty)}))
    js = run_cli("plan", str(config), "--json")
    assert js.returncode == 0, js.stderr
    row = json.loads(js.stdout)[0]
    assert row["memory"] is None
    assert row["no_estimate"].startswith("no estimate: ") and "config.json" in row["no_estimate"]


def test_diagnose_draws_the_failed_attempt_with_the_pass_and_the_deficit(tmp_path: Path) -> None:
    host = make_sim_host(tmp_path, gpu_count=2)
    code, log = host.run("--model-path", str(model_dir("llama-70b-sim")), "--tp-size", "2",
                         "--mem-fraction-static", "0.99", "--cuda-graph-max-bs-decode", "256",
                         "--port", "0", timeout=60)
    assert code != 0
    path = tmp_path / "oom.log"
    path.write_text(log)
    js = run_cli("diagnose", str(path), "--json")
    data = json.loads(js.stdout)
    mem = data["memory"][0]
    assert mem["broke"] == "cuda_graph (target_decode)"
    assert mem["weights_gib"] == pytest.approx(64.2, abs=0.01)
    assert mem["total_gib"] == pytest.approx(79.19, abs=0.01)
    assert mem["deficit_gib"] > 0 and mem["graphs_gib"] > 0
    text = run_cli("diagnose", str(path))
    assert "broke in cuda_graph (target_decode)" in text.stdout
    assert "deficit:" in text.stdout and "static budget (weights + KV)" in text.stdout


def test_weights_per_rank_in_the_estimate_match_the_simulated_log() -> None:
    """The estimator reads the same files: its target weights per rank are the sim's."""
    scenario, _ = scenario_from_argv(
        "0.5.23", ["--model-path", str(model_dir("llama-70b-sim")), "--tp-size", "2"], 79.19)
    _, weights = anyio.run(read_model, _local(), str(model_dir("llama-70b-sim")))
    assert weights.total_bytes / GIB / 2 == pytest.approx(scenario.weights_per_rank_gib)


def test_a_running_server_is_adopted_not_refused(sim: SimSetup) -> None:
    """A server that was launched with --force still runs (here: hung in weight loading); a
    new `up` without --force adopts it instead of refusing (exit 5) and logs why."""
    data = sim.data(model="llama-70b-sim", tp=1,
                    faults=[{"kind": "hang", "phase": "weights", "after_s": 0.0}])
    config = sim.write_toml(data)
    forced = subprocess.Popen(cli_argv("up", str(config), "--log-format", "json", "--force"),
                              env=cli_env(), stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                              start_new_session=True)
    try:
        deadline = time.monotonic() + 30
        while not (sim.attempts() and (sim.attempt_dir(1) / "pid").exists()):
            assert time.monotonic() < deadline, "the forced attempt never started"
            time.sleep(0.1)
    finally:
        os.killpg(forced.pid, signal.SIGKILL)
        forced.wait()
    assert sim.alive(1)

    second = subprocess.Popen(cli_argv("up", str(config), "--log-format", "json"),
                              env=cli_env(), stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                              text=True, start_new_session=True)
    try:
        assert second.stdout is not None
        seen = []
        for line in second.stdout:
            seen.append(line)
            if "server.adopted" in line:
                break
        text = "".join(seen)
        assert "estimate.refused_but_running" in text, text[-2000:]
        assert "server.adopted" in text
    finally:
        os.killpg(second.pid, signal.SIGTERM)
        second.communicate(timeout=30)
    assert second.returncode == EXIT_OK


_E3 = ["--speculative-algorithm", "EAGLE3", "--speculative-draft-model-path",
       str(model_dir("kimi-k2.5-eagle3-sim")), "--speculative-num-steps", "3",
       "--speculative-eagle-topk", "1", "--speculative-num-draft-tokens", "4"]


@pytest.mark.parametrize(
    ("model", "tp", "gib", "version", "extra"),
    [
        ("llama-70b-sim", 2, 79.19, "0.5.23", []),
        ("llama-70b-sim", 2, 79.19, "0.5.10", []),
        ("tiny-1b-sim", 1, 24.0, "0.5.23", []),
        ("qwen3.6-27b-sim", 1, 94.97, "0.5.23", ["--speculative-algorithm", "NEXTN"]),
        ("kimi-k2.5-sim", 8, 94.97, "0.5.23", _E3),
        ("kimi-k2.5-sim", 8, 94.97, "0.5.10", _E3),
    ],
)
def test_the_cold_estimate_starts_the_sim_models_on_attempt_1(
    tmp_path: Path, model: str, tp: int, gib: float, version: str, extra: list[str]
) -> None:
    """The facts read from the sim model's files (and the config's extra_args, as `up` reads
    them) give a first attempt that the simulator's start-up arithmetic brings to ready. (The
    DeepSeek-V4 seed's graph costs are beyond the cold prior: docs/memory.md.)"""
    cfg = config_from_dict({
        "state_dir": str(tmp_path),
        "hosts": [{"name": "h", "transport": "local"}],
        "servers": [{"name": "s", "host": "h", "model_path": str(model_dir(model)), "tp": tp,
                     "gpus": list(range(tp)), "port": 30000, "sglang_version": version,
                     "extra_args": extra}],
    }, environ={})
    server = cfg.servers[0]
    m, w = anyio.run(read_model, _local(), server.model_path)
    shape, draft_path = server_shape(server, version, LaunchParams(), m)
    d = dw = None
    if draft_path is not None:
        d, dw = anyio.run(read_model, _local(), draft_path)
    facts = Facts(m, w, [GpuFacts(i, gib) for i in range(tp)], shape, d, dw)
    choice = choose(facts.estimate(), LaunchParams())
    assert choice.feasible, choice.reason
    scenario, _ = scenario_from_argv(
        version, ["--model-path", server.model_path, "--tp-size", str(tp), *extra], gib)
    trace = simulate(scenario, choice.params)
    assert trace.ok, (choice.reason, trace.failure)


# --- `up`'s estimate pass: concurrent, one nvidia-smi query per host -------------------------


class _Recording:
    """A Transport that runs every command on ``inner`` and records the nvidia-smi ones and
    how many commands were in flight at once."""

    def __init__(self, inner: LocalTransport, smi: list[str]) -> None:
        self.inner, self.smi = inner, smi
        self.smi_calls: list[tuple[str, ...]] = []
        self.in_flight = self.most_in_flight = 0

    @property
    def host_name(self) -> str:
        return self.inner.host_name

    async def run(self, argv: Sequence[str], **kw: Any) -> CommandResult:
        if list(argv[:len(self.smi)]) == self.smi:
            self.smi_calls.append(tuple(argv))
        self.in_flight += 1
        self.most_in_flight = max(self.most_in_flight, self.in_flight)
        try:
            return await self.inner.run(argv, **kw)
        finally:
            self.in_flight -= 1

    def stream(self, argv: Sequence[str], **kw: Any) -> AsyncIterator[bytes]:
        return self.inner.stream(argv, **kw)

    def forward_port(self, remote_port: int, address: str,
                     ) -> AbstractAsyncContextManager[tuple[str, int]]:
        return self.inner.forward_port(remote_port, address)

    async def aclose(self) -> None:
        await self.inner.aclose()


def test_up_estimates_a_hosts_servers_at_once_with_one_nvidia_smi_query_each(
        tmp_path: Path) -> None:
    """Six servers on one host: the same first attempts as one at a time, but each nvidia-smi
    query (memory, names) runs once for the host, and the estimates overlap (at most
    FIRST_ATTEMPTS_PER_HOST at once)."""
    host = make_sim_host(tmp_path, gpu_count=6)
    smi = [sys.executable, "-m", "launcher.sim.nvidia_smi"]
    cfg = config_from_dict({
        "state_dir": str(tmp_path / "state"),
        "hosts": [{"name": "h", "transport": "local", "nvidia_smi": smi, "env": host.env}],
        "servers": [{"name": f"s{i}", "host": "h", "tp": 1, "gpus": [i], "port": 30000 + i,
                     "model_path": str(model_dir("llama-70b-sim" if i == 5 else "tiny-1b-sim")),
                     "sglang_version": "0.5.10"} for i in range(6)],
    }, environ={})
    (tmp_path / "state").mkdir()

    async def one_at_a_time(t: _Recording, ledger: Ledger) -> list[Any]:
        return [await plan_first_attempt(cfg, s, t, "0.5.10", s.launch_params(), ledger=ledger)
                for s in cfg.servers]

    with Ledger(tmp_path / "state" / "ledger.sqlite") as ledger:
        alone = _Recording(LocalTransport("h", host.env), smi)
        expected = anyio.run(one_at_a_time, alone, ledger)
        together = _Recording(LocalTransport("h", host.env), smi)
        with pytest.raises(WontFit) as refused:  # s5's 128 GiB of weights fit no GPU
            anyio.run(daemon._first_attempts, cfg, cfg.servers, {"h": together}, ledger,
                      daemon.Options())
        plans, _, keys = anyio.run(daemon._first_attempts, cfg, cfg.servers[:5],
                                   {"h": together}, ledger, daemon.Options())
    assert [p.refused for p in expected] == [False] * 5 + [True]
    assert refused.value.servers == ["s5"]
    assert expected[5].reason in str(refused.value)
    assert [(s.name, params, why) for s, _, params, why, _ in plans] == [
        (s.name, p.params, p.reason) for s, p in zip(cfg.servers, expected[:5], strict=False)]
    # each supervisor gets its server's estimate (the relaunch after a pool too small uses it)
    assert [e is not None for *_, e in plans] == [p.estimate is not None for p in expected[:5]]
    assert keys.contexts == {s.name: p.observation for s, p in zip(cfg.servers, expected[:5],
                                                                   strict=False)}
    assert len(alone.smi_calls) == 12  # memory and names, per server
    assert len(together.smi_calls) == 4  # memory and names, per pass (two passes)
    assert len(set(together.smi_calls)) == 2
    assert 1 < together.most_in_flight <= daemon.FIRST_ATTEMPTS_PER_HOST


def test_abbreviated_flags_shape_the_server_as_sglangs_argparse_reads_them(
    tmp_path: Path,
) -> None:
    """`--context-len 8192 --kv-cache fp8_e4m3 --disable-cuda-g` are what SGLang takes them for
    (an unambiguous prefix); a prefix of two read flags is left unread."""
    def shape_of(extra: list[str]) -> ServerShape:
        cfg = config_from_dict({
            "state_dir": str(tmp_path), "hosts": [{"name": "h", "transport": "local"}],
            "servers": [{"name": "s", "host": "h", "model_path": "/m", "gpus": [0],
                         "port": 30000, "extra_args": extra}],
        }, environ={})
        m = ModelFacts.from_config(json.loads((model_dir("tiny-1b-sim") / "config.json")
                                              .read_text()))
        return server_shape(cfg.servers[0], "0.5.23", LaunchParams(), m)[0]

    shape = shape_of(["--context-len", "8192", "--kv-cache=fp8_e4m3", "--disable-cuda-g"])
    assert (shape.context_len, shape.kv_cache_dtype, shape.disable_cuda_graph) == (
        8192, "fp8_e4m3", True)
    # steps or draft tokens: neither is read, the auto shape stands (Llama: 5 steps, not 7)
    spec = shape_of(["--speculative-algorithm", "EAGLE", "--speculative-num", "7"]).spec
    assert spec is not None and (spec.num_steps, spec.num_draft_tokens) == (5, 8)
    spec = shape_of(["--speculative-alg", "EAGLE", "--speculative-num-s", "7"]).spec
    assert spec is not None and (spec.algorithm, spec.num_steps) == ("EAGLE", 7)
