"""Contract with SGLang's own parser: what ``launcher plan`` would run parses, in each version's
dialect, to exactly the intended values, and the wrong dialect fails as SGLang fails it.

The real parser runs in a separate venv, built outside the work tree by
``scripts/sglang-contract-env.sh`` (CPU torch, SGLang 0.5.23 and 0.5.10), through
``scripts/sglang_argparse_probe.py`` in a subprocess: one probe per version parses every command
line of the module at once, since importing SGLang takes seconds. The simulator's parser
(``launcher.sim.server``) is held to the same verdicts.
"""

from __future__ import annotations

import hashlib
import json
import re
import shlex
import subprocess
import sys
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest

from launcher.params import LaunchParams
from launcher.plan.command import build_command
from launcher.sglang.flags import graph_bs_flag, mamba_strategy_flag
from launcher.sglang.versions import GATED_LAUNCH_FROM, at_least
from launcher.sim.logfmt import Dialect
from launcher.sim.server import Flags

pytestmark = [pytest.mark.contract, pytest.mark.timeout(600)]

ROOT = Path(__file__).resolve().parents[2]
ENV_SCRIPT = ROOT / "scripts" / "sglang-contract-env.sh"
PROBE = ROOT / "scripts" / "sglang_argparse_probe.py"
# Must match `versions` in scripts/sglang-contract-env.sh. 0.5.10 is the newest release that
# launcher drives with --cuda-graph-max-bs; 0.5.23 the newest on the registry.
VERSIONS = ("0.5.23", "0.5.10")
COMMAND = ["python3", "-m", "sglang.launch_server"]
AMBIGUOUS = (
    "sglang serve: error: ambiguous option: --cuda-graph-max-bs could match "
    "--cuda-graph-max-bs-decode, --cuda-graph-max-bs-prefill"
)


@dataclass(frozen=True)
class Server:
    """One [[servers]] table of the test config and what SGLang must make of its command line."""

    name: str
    keys: dict[str, Any]
    expected: dict[str, Any]
    expected_namespace: dict[str, Any] = field(default_factory=dict)


SERVERS = (
    Server(
        "explicit",
        {
            "model_path": "/models/Llama-3.1-8B-Instruct",
            "served_model_name": "llama-3.1-8b",
            "gpus": [0],
            "port": 30000,
            "mem_fraction_static": 0.85,
            "cuda_graph_max_bs": 256,
            "extra_args": ["--context-length", "8192", "--enable-metrics"],
        },
        {
            "model_path": "/models/Llama-3.1-8B-Instruct",
            "served_model_name": "llama-3.1-8b",
            "tp_size": 1,
            "dp_size": 1,
            "host": "127.0.0.1",
            "port": 30000,
            "mem_fraction_static": 0.85,
            "cuda_graph_max_bs": 256,
            "log_level": "info",
            "context_length": 8192,
        },
        {"enable_metrics": True},
    ),
    Server(
        "auto",
        {"model_path": "Qwen/Qwen2.5-7B-Instruct", "gpus": [1], "port": 30001},
        {
            "model_path": "Qwen/Qwen2.5-7B-Instruct",
            "served_model_name": None,
            "tp_size": 1,
            "dp_size": 1,
            "host": "127.0.0.1",
            "port": 30001,
            "mem_fraction_static": None,
            "cuda_graph_max_bs": None,
            "log_level": "info",
            "context_length": None,
        },
    ),
    Server(
        "tp4",
        {
            "model_path": "/models/Llama-3.1-70B-Instruct",
            "tp": 4,
            "gpus": [2, 3, 4, 5],
            "port": 30002,
            "listen": "0.0.0.0",
            "mem_fraction_static": 0.825,
            "cuda_graph_max_bs": 160,
        },
        {
            "model_path": "/models/Llama-3.1-70B-Instruct",
            "served_model_name": None,
            "tp_size": 4,
            "dp_size": 1,
            "host": "0.0.0.0",
            "port": 30002,
            "mem_fraction_static": 0.825,
            "cuda_graph_max_bs": 160,
            "log_level": "info",
            "context_length": None,
        },
    ),
    Server(
        "dp2",
        {
            "model_path": "/models/Mistral-7B",
            "dp": 2,
            "gpus": [6, 7],
            "port": 30003,
            "mem_fraction_static": 0.7,
            "extra_args": "--context-length 32768 --trust-remote-code --chunked-prefill-size 4096",
        },
        {
            "model_path": "/models/Mistral-7B",
            "served_model_name": None,
            "tp_size": 1,
            "dp_size": 2,
            "host": "127.0.0.1",
            "port": 30003,
            "mem_fraction_static": 0.7,
            "cuda_graph_max_bs": None,
            "log_level": "info",
            "context_length": 32768,
        },
        {"trust_remote_code": True, "chunked_prefill_size": 4096},
    ),
)
# Speculative decoding and hybrid (Mamba) servers: the knobs a relaunch may change are config
# fields rendered in each version's dialect; the speculative shape stays in extra_args.
SPEC_MTP = ["--speculative-algorithm", "EAGLE", "--speculative-num-steps", "1",
            "--speculative-eagle-topk", "1", "--speculative-num-draft-tokens", "2"]
SPEC_HYBRID_SERVERS = (
    Server(
        "dsv4-mtp",
        {"model_path": "/data/models/DeepSeek-V4-Flash", "tp": 4, "gpus": [0, 1, 2, 3],
         "port": 30010, "mem_fraction_static": 0.7, "cuda_graph_max_bs": 32,
         "max_running_requests": 48, "extra_args": SPEC_MTP},
        {"mem_fraction_static": 0.7, "cuda_graph_max_bs": 32, "tp_size": 4},
        {"speculative_algorithm": "EAGLE", "speculative_num_steps": 1,
         "speculative_eagle_topk": 1, "speculative_num_draft_tokens": 2,
         "max_running_requests": 48},
    ),
    Server(
        "qwen36-hybrid-mtp",
        {"model_path": "/models/Qwen3.6-27B", "gpus": [4], "port": 30011,
         "mem_fraction_static": 0.8, "cuda_graph_max_bs": 16, "max_running_requests": 24,
         "max_mamba_cache_size": 64, "mamba_full_memory_ratio": 0.5,
         "mamba_strategy": "extra_buffer",
         "extra_args": ["--speculative-algorithm", "EAGLE", "--speculative-num-steps", "3",
                        "--speculative-eagle-topk", "1", "--speculative-num-draft-tokens", "4"]},
        {"mem_fraction_static": 0.8, "cuda_graph_max_bs": 16, "tp_size": 1},
        {"speculative_algorithm": "EAGLE", "speculative_num_steps": 3,
         "speculative_num_draft_tokens": 4, "max_running_requests": 24,
         "max_mamba_cache_size": 64, "mamba_full_memory_ratio": 0.5},
    ),
)
SHIPPED_CONFIGS = ("configs/example-8gpu.toml", "configs/demo.toml")
# Fractions build_command writes with up to three decimals; each must parse back to itself.
FRACTIONS = (0.5, 0.6, 0.75, 0.835, 0.88, 0.9, 0.95, 0.123, 0.999)
# Command lines SGLang rejects for reasons other than the graph flag: the simulator must too.
BROKEN = (
    ["--tp-size", "2"],
    ["--model-path", "/m", "--tp-size", "two"],
    ["--model-path", "/m", "--port", "http"],
    ["--model-path", "/m", "--mem-fraction-static", "high"],
    ["--model-path", "/m", "--no-such-flag"],
)

# Speculative-decoding and hybrid (Mamba) command lines as the seeds' deployments run them, in
# each version's dialect and in the other's: the simulator must accept and read them as SGLang
# does (values compared in test_simulator_reads_spec_and_mamba_flags_as_sglang).
_SPEC = [
    "--speculative-algorithm",
    "EAGLE",
    "--speculative-num-steps",
    "1",
    "--speculative-eagle-topk",
    "1",
    "--speculative-num-draft-tokens",
    "2",
]
SPEC_HYBRID = (
    ["--model-path", "/m", "--tp-size", "4", *_SPEC, "--mem-fraction-static", "0.7"],
    ["--model-path", "/m", "--speculative-algorithm", "NEXTN", "--speculative-draft-model", "/d"],
    [
        "--model-path",
        "/m",
        "--speculative-algorithm",
        "EAGLE3",
        "--speculative-draft-model-path",
        "/d",
        "--speculative-num-steps",
        "3",
        "--speculative-eagle-topk",
        "1",
        "--speculative-num-draft-tokens",
        "4",
        "--max-running-requests",
        "64",
    ],
    ["--model-path", "/m", "--speculative-algorithm", "FOO"],
    ["--model-path", "/m", *_SPEC, "--mamba-scheduler-strategy", "no_buffer"],
    ["--model-path", "/m", *_SPEC, "--mamba-scheduler-strategy", "extra_buffer"],
    ["--model-path", "/m", "--mamba-scheduler-strategy", "bogus"],
    ["--model-path", "/m", *_SPEC, "--mamba-radix-cache-strategy", "extra_buffer"],
    ["--model-path", "/m", "--mamba-radix-cache-strategy", "extra_buffer_lazy"],
    [
        "--model-path",
        "/m",
        "--max-mamba-cache-size",
        "24",
        "--mamba-full-memory-ratio",
        "0.4",
        "--mamba-ssm-dtype",
        "bfloat16",
        "--disable-radix-cache",
        "--disable-overlap-schedule",
    ],
    ["--model-path", "/m", "--mamba-ssm-dtype", "float64"],
)
# LoRA command lines in the forms SGLang takes (launcher.sglang.lora reads the same forms):
# the simulator must accept and read them as SGLang does, and reject what SGLang rejects.
LORA = (
    ["--model-path", "/m", "--lora-paths", "a=/x/a", "/x/b",
     '{"lora_name": "c", "lora_path": "/x/c", "pinned": true}', "--max-loras-per-batch", "3"],
    ["--model-path", "/m", "--enable-lora", "--max-lora-rank", "64",
     "--lora-target-modules", "q_proj", "v_proj", "gate_proj"],
    ["--model-path", "/m", "--lora-paths=/x/a", "--lora-target-modules", "all"],
    ["--model-path", "/m", "--lora-paths", "/x/a", "--lora-target-modules", "q_a_proj"],
    ["--model-path", "/m", "--lora-paths", "/x/a", "--lora-target-modules", "bogus"],
    ["--model-path", "/m", "--lora-paths", "/x/a", "--max-lora-rank", "big"],
)
LORA_FIELDS = ("enable_lora", "lora_paths", "max_loras_per_batch", "max_lora_rank",
               "lora_target_modules")
# Namespace key in SGLang -> Flags attribute in the simulator.
SPEC_HYBRID_FIELDS = {
    "speculative_algorithm": "speculative_algorithm",
    "speculative_draft_model_path": "speculative_draft_model_path",
    "speculative_num_steps": "speculative_num_steps",
    "speculative_eagle_topk": "speculative_eagle_topk",
    "speculative_num_draft_tokens": "speculative_num_draft_tokens",
    "max_running_requests": "max_running_requests",
    "max_mamba_cache_size": "max_mamba_cache_size",
    "mamba_full_memory_ratio": "mamba_full_memory_ratio",
    "mamba_ssm_dtype": "mamba_ssm_dtype",
    "disable_radix_cache": "disable_radix_cache",
    "disable_overlap_schedule": "disable_overlap_schedule",
}


def _toml(value: Any) -> str:
    if isinstance(value, str):
        return json.dumps(value)
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, list):
        return "[" + ", ".join(_toml(v) for v in value) + "]"
    return repr(value)


def _config(version: str, servers: tuple[Server, ...] = SERVERS) -> str:
    lines = ["[[hosts]]", 'name = "gpu-a"', 'transport = "local"']
    for s in servers:
        keys = {"name": s.name, "host": "gpu-a", **s.keys, "sglang_version": version}
        lines += ["", "[[servers]]", *(f"{k} = {_toml(v)}" for k, v in keys.items())]
    return "\n".join(lines) + "\n"


def _multinode_config(version: str) -> str:
    """One server over two hosts (TP4 = 2 GPUs × 2 nodes), gated on versions that have it."""
    gate = "gated_launch_port = 5100\n" if at_least(version, GATED_LAUNCH_FROM) else ""
    return (
        '[[hosts]]\nname = "gpu-a"\naddress = "10.0.4.21"\n\n'
        '[[hosts]]\nname = "gpu-b"\naddress = "10.0.4.22"\n\n'
        '[[servers]]\nname = "multi"\nnodes = ["gpu-a", "gpu-b"]\nmodel_path = "/models/m"\n'
        f'tp = 4\ngpus = [0, 1]\ndist_init_port = 5000\nsglang_version = "{version}"\n{gate}'
    )


def _plan(config: Path) -> list[dict[str, Any]]:
    """``launcher plan --json`` of ``config``, run as a user runs it."""
    done = subprocess.run(
        [sys.executable, "-m", "launcher.cli.main", "plan", str(config), "--json"],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert 0 == done.returncode, done.stderr
    rows: list[dict[str, Any]] = json.loads(done.stdout)
    return rows


def _sglang_args(argv: list[str]) -> list[str]:
    """What SGLang's parser sees: the argv after the program (build_command starts it there)."""
    return argv[argv.index("--model-path") :]


def _argv(version: str, s: Server, params: LaunchParams) -> list[str]:
    """build_command for server ``s`` as ``launcher plan`` and the supervisor call it."""
    k = s.keys
    extra = k.get("extra_args", [])
    return build_command(
        command=COMMAND,
        model_path=k["model_path"],
        tp=k.get("tp", 1),
        dp=k.get("dp", 1),
        port=k["port"],
        listen=k.get("listen", "127.0.0.1"),
        gpus=k["gpus"],
        params=params,
        sglang_version=version,
        served_model_name=k.get("served_model_name"),
        extra_args=shlex.split(extra) if isinstance(extra, str) else extra,
        server_name=s.name,
    ).argv


def _initial(s: Server) -> LaunchParams:
    return LaunchParams(s.keys.get("mem_fraction_static"), s.keys.get("cuda_graph_max_bs"))


def _other(version: str) -> str:
    return next(v for v in VERSIONS if v != version)


@dataclass
class Cases:
    """Every command line of this module, per version, collected before any probe runs."""

    plans: dict[str, list[dict[str, Any]]]  # version -> rows of `launcher plan --json`
    shipped: list[dict[str, Any]]  # rows of the shipped configs' plans
    argvs: dict[str, list[list[str]]]  # version -> SGLang argv lists to parse
    spec_plans: dict[str, list[dict[str, Any]]] = field(default_factory=dict)
    # version -> spec/hybrid argv lists, parsed by SGLang only (not yet the simulator's parser)
    spec_argvs: dict[str, list[list[str]]] = field(default_factory=dict)
    # version -> (rank, argv) of every rank of a multi-node server's plan
    multinode: dict[str, list[tuple[int, list[str]]]] = field(default_factory=dict)

    def add(self, version: str, argv: list[str]) -> list[str]:
        if argv not in self.argvs[version]:
            self.argvs[version].append(argv)
        return argv


def _collect(tmp: Path) -> Cases:
    cases = Cases(plans={}, shipped=[], argvs={v: [] for v in VERSIONS})
    for version in VERSIONS:
        config = tmp / f"launcher-{version}.toml"
        config.write_text(_config(version))
        cases.plans[version] = _plan(config)
        for row in cases.plans[version]:
            cases.add(version, _sglang_args(row["argv"]))
            s = next(s for s in SERVERS if s.name == row["server"])
            for step in row["oom_ladder"]:
                params = LaunchParams(step["mem_fraction_static"], step["cuda_graph_max_bs"])
                cases.add(version, _sglang_args(_argv(version, s, params)))
            # The other version's spelling: what a wrongly detected version would run.
            cases.add(version, _sglang_args(_argv(_other(version), s, _initial(s))))
        for mfs in FRACTIONS:
            cases.add(version, _sglang_args(_argv(version, SERVERS[0], LaunchParams(mfs, 64))))
        for argv in BROKEN:
            cases.add(version, list(argv))
        multi = tmp / f"launcher-multinode-{version}.toml"
        multi.write_text(_multinode_config(version))
        [row] = _plan(multi)
        cases.multinode[version] = [(r["rank"], cases.add(version, _sglang_args(r["argv"])))
                                    for r in row["ranks"]]
        # Spec and hybrid servers, in a config of their own (see test_spec_and_hybrid_...).
        spec_config = tmp / f"launcher-spec-{version}.toml"
        spec_config.write_text(_config(version, SPEC_HYBRID_SERVERS))
        cases.spec_plans[version] = _plan(spec_config)
        for argv in [_sglang_args(r["argv"]) for r in cases.spec_plans[version]] + [
            _strategy_only(version)
        ]:
            for v in (version, _other(version)):
                if argv not in cases.spec_argvs.setdefault(v, []):
                    cases.spec_argvs[v].append(argv)
        for argv in (*SPEC_HYBRID, *LORA):
            cases.add(version, list(argv))
    for path in SHIPPED_CONFIGS:
        for row in _plan(ROOT / path):
            cases.shipped.append(row)
            if row["sglang_version"] in cases.argvs:
                cases.add(row["sglang_version"], _sglang_args(row["argv"]))
    return cases


def _require_env() -> Path:
    """The contract venv's python; fails (never skips) when the env is missing or stale."""
    where = subprocess.run(
        ["bash", str(ENV_SCRIPT), "--print-venv"], capture_output=True, text=True, check=True
    )
    venv = Path(where.stdout.strip())
    digest = hashlib.sha256(ENV_SCRIPT.read_bytes()).hexdigest()[:16]
    python = venv / "bin" / "python"
    if not (venv / f".ready-{digest}").is_file() or not python.exists():
        pytest.fail(
            f"no SGLang contract env at {venv} (missing, unfinished or built by an older "
            f"{ENV_SCRIPT.name}): run scripts/sglang-contract-env.sh (a few minutes, needs PyPI)",
            pytrace=False,
        )
    return python


@dataclass(frozen=True)
class Parsed:
    """The probe's verdicts for one version, by argv."""

    prog: str
    by_argv: dict[tuple[str, ...], dict[str, Any]]

    def __getitem__(self, argv: list[str]) -> dict[str, Any]:
        return self.by_argv[tuple(argv)]


@pytest.fixture(scope="module")
def cases(tmp_path_factory: pytest.TempPathFactory) -> Cases:
    """All command lines of the module, from real `launcher plan` runs and build_command."""
    return _collect(tmp_path_factory.mktemp("contract"))


@pytest.fixture(scope="module")
def real(cases: Cases, tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[str, Parsed]]:
    """SGLang's own verdicts, per version: one probe process each, run side by side."""
    python = _require_env()
    inputs = tmp_path_factory.mktemp("probe")
    procs: dict[str, subprocess.Popen[str]] = {}
    out: dict[str, Parsed] = {}
    try:
        for v in VERSIONS:
            # A file, not a pipe, for stdin: each probe reads it at once and starts importing.
            argvs = inputs / f"{v}.json"
            argvs.write_text(json.dumps(cases.argvs[v] + cases.spec_argvs.get(v, [])))
            with argvs.open() as stdin:
                procs[v] = subprocess.Popen(
                    [str(python), str(PROBE), "--sglang-version", v],
                    stdin=stdin,
                    stdout=subprocess.PIPE,
                    stderr=subprocess.PIPE,
                    text=True,
                )
        for v, proc in procs.items():
            stdout, stderr = proc.communicate(timeout=480)
            assert 0 == proc.returncode, f"probe for SGLang {v} failed:\n{stderr}"
            report = json.loads(stdout)
            assert v == report["sglang_version"]
            out[v] = Parsed(report["prog"], {tuple(r["argv"]): r for r in report["results"]})
        yield out
    finally:
        for proc in procs.values():
            if proc.poll() is None:
                proc.kill()
                proc.wait()


def _graph_dest(version: str) -> str:
    return graph_bs_flag(version).removeprefix("--").replace("-", "_")


@pytest.mark.parametrize("version", VERSIONS)
@pytest.mark.parametrize("server", SERVERS, ids=lambda s: s.name)
def test_planned_command_parses_to_intended_values(
    version: str, server: Server, cases: Cases, real: dict[str, Parsed]
) -> None:
    """`launcher plan`'s command line for the server parses to exactly the configured values."""
    row = next(r for r in cases.plans[version] if r["server"] == server.name)
    assert COMMAND == row["argv"][: len(COMMAND)]
    result = real[version][_sglang_args(row["argv"])]
    assert (True, 0) == (result["ok"], result["exit_code"]), result.get("error")
    values = dict(result["values"])
    dest = values.pop("graph_bs_dest")
    assert server.expected == values
    assert _graph_dest(version) == dest
    namespace = {k: result["namespace"][k] for k in server.expected_namespace}
    assert server.expected_namespace == namespace


@pytest.mark.parametrize("version", VERSIONS)
def test_multinode_rank_lines_parse_to_their_rank(
    version: str, cases: Cases, real: dict[str, Parsed]
) -> None:
    """Every rank's line of a multi-node plan parses, in SGLang's own parser, to --nnodes 2,
    its --node-rank, node 0's --dist-init-addr and (0.5.23) the gated-launch port."""
    ranks = cases.multinode[version]
    assert [0, 1] == [rank for rank, _ in ranks]
    for rank, argv in ranks:
        result = real[version][argv]
        assert (True, 0) == (result["ok"], result["exit_code"]), result.get("error")
        ns = result["namespace"]
        assert (2, rank, "10.0.4.21:5000") == (
            ns["nnodes"], ns["node_rank"], ns["dist_init_addr"])
        if at_least(version, GATED_LAUNCH_FROM):
            assert 5100 == ns["gated_launch_port"]


@pytest.mark.parametrize("version", VERSIONS)
def test_plan_agrees_with_build_command(version: str, cases: Cases) -> None:
    """The plan's first attempt is build_command's, so the relaunch lines below are launcher's."""
    for s in SERVERS:
        row = next(r for r in cases.plans[version] if r["server"] == s.name)
        assert _argv(version, s, _initial(s)) == row["argv"]


@pytest.mark.parametrize("version", VERSIONS)
def test_oom_ladder_relaunch_lines_parse_to_the_ladder_values(
    version: str, cases: Cases, real: dict[str, Parsed]
) -> None:
    """Every relaunch in each server's plan ladder parses to that step's fraction and graph bs."""
    steps = 0
    for row in cases.plans[version]:
        s = next(s for s in SERVERS if s.name == row["server"])
        for step in row["oom_ladder"]:
            params = LaunchParams(step["mem_fraction_static"], step["cuda_graph_max_bs"])
            result = real[version][_sglang_args(_argv(version, s, params))]
            assert result["ok"], result.get("error")
            parsed = (
                result["values"]["mem_fraction_static"],
                result["values"]["cuda_graph_max_bs"],
            )
            assert (step["mem_fraction_static"], step["cuda_graph_max_bs"]) == parsed
            steps += 1
    assert steps >= len(SERVERS)


@pytest.mark.parametrize("version", VERSIONS)
def test_fractions_survive_formatting(version: str, real: dict[str, Parsed]) -> None:
    """Each fraction launcher may pass comes back from SGLang's float parser unchanged."""
    parsed = [
        real[version][_sglang_args(_argv(version, SERVERS[0], LaunchParams(mfs, 64)))]["values"][
            "mem_fraction_static"
        ]
        for mfs in FRACTIONS
    ]
    assert list(FRACTIONS) == parsed


def test_old_spelling_is_ambiguous_in_0_5_23(cases: Cases, real: dict[str, Parsed]) -> None:
    """0.5.23 rejects --cuda-graph-max-bs (0.5.10's spelling) as an ambiguous prefix, exit 2."""
    argv = _sglang_args(_argv("0.5.10", SERVERS[0], _initial(SERVERS[0])))
    assert "--cuda-graph-max-bs" in argv
    result = real["0.5.23"][argv]
    assert (False, 2, AMBIGUOUS) == (result["ok"], result["exit_code"], result["error"])


def test_new_spelling_is_unknown_in_0_5_10(cases: Cases, real: dict[str, Parsed]) -> None:
    """0.5.10 rejects --cuda-graph-max-bs-decode (0.5.23's spelling) as unrecognized, exit 2."""
    argv = _sglang_args(_argv("0.5.23", SERVERS[0], _initial(SERVERS[0])))
    result = real["0.5.10"][argv]
    expected = "sglang serve: error: unrecognized arguments: --cuda-graph-max-bs-decode 256"
    assert (False, 2, expected) == (result["ok"], result["exit_code"], result["error"])


def test_shipped_configs_parse(cases: Cases, real: dict[str, Parsed]) -> None:
    """Every server of the shipped configs plans a command line its SGLang version accepts."""
    verdicts: dict[tuple[str, str], bool] = {}
    for r in cases.shipped:
        version = r["sglang_version"]
        assert version in real, f"{r['server']}: no SGLang {version} in the contract env"
        verdicts[(r["server"], version)] = real[version][_sglang_args(r["argv"])]["ok"]
    assert {key: True for key in verdicts} == verdicts
    assert len(verdicts) >= 3


def _sim_parse(version: str, argv: list[str], capsys: pytest.CaptureFixture[str]) -> Any:
    """The simulator's verdict: its Flags, or (exit status, last stderr line)."""
    capsys.readouterr()
    try:
        return Flags.parse(Dialect(version), argv)
    except SystemExit as exc:
        lines = [line for line in capsys.readouterr().err.splitlines() if line.strip()]
        return (exc.code, lines[-1] if lines else "")


def _message(error_line: str) -> str:
    """An argparse error line without its program name, option aliases in a fixed order."""
    message = error_line.split(": error: ", 1)[-1]
    return re.sub(
        r"^argument (\S+):", lambda m: f"argument {'/'.join(sorted(m[1].split('/')))}:", message
    )


@pytest.mark.parametrize("version", VERSIONS)
def test_simulator_gives_sglangs_verdicts(
    version: str, cases: Cases, real: dict[str, Parsed], capsys: pytest.CaptureFixture[str]
) -> None:
    """The simulator accepts what SGLang accepts, with the same values, and rejects the rest
    with SGLang's exit status and message (up to program name and alias order, tested below)."""
    expected: list[Any] = []
    actual: list[Any] = []
    for argv in cases.argvs[version]:
        result = real[version][argv]
        sim = _sim_parse(version, argv, capsys)
        if result["ok"]:
            v = result["values"]
            expected.append(
                (
                    argv,
                    v["model_path"],
                    v["tp_size"],
                    v["dp_size"],
                    v["host"],
                    v["port"],
                    v["mem_fraction_static"],
                    v["cuda_graph_max_bs"],
                    v["context_length"],
                    v["log_level"],
                )
            )
            actual.append(
                (
                    argv,
                    sim.model_path,
                    sim.tp,
                    sim.dp,
                    sim.host,
                    sim.port,
                    sim.mem_fraction_static,
                    sim.graph_bs,
                    sim.context_length,
                    sim.log_level,
                )
                if isinstance(sim, Flags)
                else (argv, sim)
            )
        else:
            expected.append((argv, result["exit_code"], _message(result["error"])))
            actual.append(
                (argv, sim[0], _message(sim[1])) if isinstance(sim, tuple) else (argv, "accepted")
            )
    assert expected == actual


@pytest.mark.parametrize("version", VERSIONS)
def test_simulator_error_lines_are_sglangs(
    version: str, cases: Cases, real: dict[str, Parsed], capsys: pytest.CaptureFixture[str]
) -> None:
    """Every rejected command line gets SGLang's exact last stderr line from the simulator."""
    rejected = [argv for argv in cases.argvs[version] if not real[version][argv]["ok"]]
    expected = [(argv, real[version][argv]["error"]) for argv in rejected]
    actual = [(argv, _sim_parse(version, argv, capsys)[1]) for argv in rejected]
    assert len(rejected) >= len(BROKEN)
    assert expected == actual


@pytest.mark.parametrize("version", VERSIONS)
@pytest.mark.parametrize("server", SPEC_HYBRID_SERVERS, ids=lambda s: s.name)
def test_spec_and_hybrid_plans_parse_in_each_versions_dialect(
    version: str, server: Server, cases: Cases, real: dict[str, Parsed]
) -> None:
    """`launcher plan` renders running requests and the Mamba knobs as the version spells them
    (--mamba-scheduler-strategy in 0.5.10, --mamba-radix-cache-strategy in 0.5.23); SGLang's
    own parser reads back the configured values, and the other version rejects the strategy
    flag as SGLang does (unrecognized, exit 2)."""
    row = next(r for r in cases.spec_plans[version] if r["server"] == server.name)
    argv = _sglang_args(row["argv"])
    result = real[version][argv]
    assert (True, 0) == (result["ok"], result["exit_code"]), result.get("error")
    values = {k: result["values"][k] for k in server.expected}
    assert server.expected == values
    namespace = {k: result["namespace"][k] for k in server.expected_namespace}
    assert server.expected_namespace == namespace
    strategy = server.keys.get("mamba_strategy")
    if strategy is None:
        return
    flag = mamba_strategy_flag(version)
    assert strategy == result["namespace"][flag.removeprefix("--").replace("-", "_")]
    other = real[_other(version)][_strategy_only(version)]
    expected = f"sglang serve: error: unrecognized arguments: {flag} extra_buffer"
    assert (False, 2, expected) == (other["ok"], other["exit_code"], other["error"])


def _strategy_only(version: str) -> list[str]:
    """A command line whose only version-specific flag is the Mamba strategy."""
    return ["--model-path", "/m", mamba_strategy_flag(version), "extra_buffer"]


@pytest.mark.parametrize("version", VERSIONS)
def test_simulator_reads_spec_and_mamba_flags_as_sglang(
    version: str, real: dict[str, Parsed], capsys: pytest.CaptureFixture[str]
) -> None:
    """Speculative-decoding and Mamba flags: where SGLang accepts a command line, the simulator
    holds the same values (the strategy under the version's own flag name); the rejected ones
    are covered by test_simulator_gives_sglangs_verdicts."""
    strategy_key = (
        "mamba_radix_cache_strategy" if version == "0.5.23" else "mamba_scheduler_strategy"
    )
    expected: list[Any] = []
    actual: list[Any] = []
    accepted = 0
    for argv in SPEC_HYBRID:
        result = real[version][list(argv)]
        if not result["ok"]:
            continue
        accepted += 1
        ns = result["namespace"]
        sim = _sim_parse(version, list(argv), capsys)
        assert isinstance(sim, Flags), (argv, sim)
        expected.append((argv, {k: ns[k] for k in SPEC_HYBRID_FIELDS}, ns[strategy_key]))
        actual.append(
            (
                argv,
                {k: getattr(sim, attr) for k, attr in SPEC_HYBRID_FIELDS.items()},
                sim.mamba_strategy,
            )
        )
    assert expected == actual
    assert accepted >= 5


@pytest.mark.parametrize("version", VERSIONS)
def test_simulator_reads_lora_flags_as_sglang(
    version: str, real: dict[str, Parsed], capsys: pytest.CaptureFixture[str]
) -> None:
    """LoRA flags: where SGLang accepts a command line, the simulator holds the same values
    (the rejected ones are covered by test_simulator_gives_sglangs_verdicts)."""
    expected: list[Any] = []
    actual: list[Any] = []
    for argv in LORA:
        result = real[version][list(argv)]
        if not result["ok"]:
            continue
        sim = _sim_parse(version, list(argv), capsys)
        assert isinstance(sim, Flags), (argv, sim)
        expected.append((argv, {k: result["namespace"][k] for k in LORA_FIELDS}))
        actual.append((argv, {k: getattr(sim, k) for k in LORA_FIELDS}))
    assert expected == actual
    assert len(expected) >= 3
