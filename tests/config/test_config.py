
"""Tests of launcher.config.schema and launcher.durations: real TOML files in tmp_path, real
loading."""

from __future__ import annotations

import dataclasses
import math
import sys
from pathlib import Path

import pytest

from launcher.config.load import config_from_dict, load_config
from launcher.config.placeholders import expand_placeholders
from launcher.config.schema import (
    Config,
    HostConfig,
    MetricsConfig,
    PolicyConfig,
    ServerConfig,
    SlackConfig,
    StallBudgets,
    default_state_dir,
    probe_address,
    resolve_secret_env,
)
from launcher.durations import format_duration, parse_duration
from launcher.errors import ConfigError
from launcher.sglang.flags import params_argv
from launcher.sglang.phases import Phase

REPO = Path(__file__).resolve().parents[2]
HOST = """
[[hosts]]
name = "gpu1"
address = "10.0.0.5"
"""
SERVER = """
[[servers]]
name = "llama"
host = "gpu1"
model_path = "/models/x"
tp = 2
gpus = [0, 1]
"""
BASE = HOST + SERVER


def write(tmp_path: Path, text: str) -> Path:
    path = tmp_path / "config.toml"
    path.write_text(text, encoding="utf-8")
    return path


def load(tmp_path: Path, text: str, environ: dict[str, str] | None = None) -> Config:
    return load_config(write(tmp_path, text), environ={"HOME": "/home/op", **(environ or {})})


def problems(tmp_path: Path, text: str, environ: dict[str, str] | None = None) -> list[str]:
    with pytest.raises(ConfigError) as caught:
        load(tmp_path, text, environ)
    return caught.value.problems


# --- shipped configs -----------------------------------------------------------------------


def test_example_config_loads() -> None:
    """The shipped 8-GPU example loads with two tp4 servers, one explicit and one auto."""
    config = load_config(REPO / "configs" / "example-8gpu.toml", environ={"HOME": "/home/op"})
    llama, qwen = config.server("llama"), config.server("qwen")
    assert (4, [0, 1, 2, 3], 0.85, 256) == (
        llama.tp,
        llama.gpus,
        llama.mem_fraction_static,
        llama.cuda_graph_max_bs,
    )
    assert (4, [4, 5, 6, 7], None, None) == (
        qwen.tp,
        qwen.gpus,
        qwen.mem_fraction_static,
        qwen.cuda_graph_max_bs,
    )
    assert ["--context-length", "32768"] == qwen.extra_args
    assert {"HF_TOKEN": "file:/etc/launcher/hf-token"} == llama.secret_env
    assert "ssh" == config.host("h100-a").transport
    assert (8, 2700.0, 1800.0) == (
        config.policy_for("llama").max_attempts,
        config.policy_for("llama").start_deadline,
        config.policy_for("llama").stall.weights,
    )
    assert 4 == config.policy_for("qwen").max_attempts
    assert 9400 == (config.metrics.port if config.metrics else None)


def test_demo_config_loads() -> None:
    """The shipped demo names the local simulated host and one simulated tp2 server."""
    path = REPO / "configs" / "demo.toml"
    config = expand_placeholders(load_config(path, environ={"HOME": "/home/op"}), path)
    host, server = config.host("sim"), config.server("demo")
    configs = str(path.parent.resolve())
    assert ("local", [sys.executable, "-m", "launcher.sim.nvidia_smi"]) == (
        host.transport,
        host.nvidia_smi,
    )
    assert f"{configs}/../run/demo" == host.run_dir
    assert {"SGLANG_SIM_HOST": f"{configs}/sim/host.json"} == host.env
    assert (f"{configs}/sim/models/llama-70b-sim", [0, 1], 30123, 0.99, 256, "0.5.23") == (
        server.model_path,
        server.gpus,
        server.port,
        server.mem_fraction_static,
        server.cuda_graph_max_bs,
        server.sglang_version,
    )
    assert [sys.executable, "-m", "launcher.sim.server"] == server.command
    policy = config.policy_for("demo")
    assert 1.0 == policy.probe_interval
    assert [20.0] * 5 == [policy.stall.for_phase(p) for p in Phase if p is not Phase.READY]


def test_minimal_config_gets_documented_defaults(tmp_path: Path) -> None:
    """A host and a server with only required keys get the documented defaults."""
    config = load(tmp_path, BASE)
    server, host = config.server("llama"), config.host("gpu1")
    assert (30000, "127.0.0.1", "tunnel", 1, None, None) == (
        server.port,
        server.listen,
        server.probe,
        server.dp,
        server.mem_fraction_static,
        server.sglang_version,
    )
    assert ["python3", "-m", "sglang.launch_server"] == server.command
    assert ("ssh", None, True, False, 10.0, 15.0, ["nvidia-smi"], "~/.launcher/runs") == (
        host.transport,
        host.port,
        host.use_ssh_config,
        host.trust_on_first_use,
        host.connect_timeout,
        host.keepalive_interval,
        host.nvidia_smi,
        host.run_dir,
    )
    assert PolicyConfig() == config.policy
    assert (1800.0, 120.0, 30.0, 600.0, 3600.0) == (
        config.policy.start_deadline,
        config.policy.gpu_free_timeout,
        config.policy.probe_timeout,
        config.policy.restart_backoff_max,
        config.policy.restart_window,
    )
    assert (None, None) == (config.slack, config.metrics)


def test_strings_and_numbers_are_normalised(tmp_path: Path) -> None:
    """String argv is shell-split, env numbers become strings and ~ is expanded locally only."""
    text = BASE.replace('address = "10.0.0.5"', 'address = "10.0.0.5"\nidentity_file = "~/k"')
    text += 'command = "/opt/venv/bin/python -m sglang.launch_server"\n'
    text += "env = { OMP_NUM_THREADS = 8 }\n"
    config = load(tmp_path, text)
    server = config.server("llama")
    assert ["/opt/venv/bin/python", "-m", "sglang.launch_server"] == server.command
    assert {"OMP_NUM_THREADS": "8"} == server.env
    assert Path("~/k").expanduser() == config.host("gpu1").identity_file
    assert "~/.launcher/runs" == config.host("gpu1").run_dir


# --- validation rules ----------------------------------------------------------------------

RULES = [
    pytest.param(
        BASE + "mem_fraction_static = 1.3\n",
        "servers[0].mem_fraction_static: 1.3 is not < 1",
        id="mem-fraction-range",
    ),
    pytest.param(
        BASE + "cuda_graph_max_bs = 0\n",
        "servers[0].cuda_graph_max_bs: 0 is not >= 1",
        id="graph-bs-range",
    ),
    pytest.param(
        BASE + 'hots = "gpu1"\n',
        "servers[0].hots: unknown key; did you mean 'host'?",
        id="did-you-mean-server",
    ),
    pytest.param(
        BASE.replace("tp = 2", "tpp = 2"),  # not also "gpus lists 2 but tp*dp = 1*1"
        "servers[0].tpp: unknown key; did you mean 'tp'?",
        id="did-you-mean-no-follow-on",
    ),
    pytest.param(
        "sever = 1\n" + BASE,
        "sever: unknown key; did you mean 'servers'?",
        id="did-you-mean-top",
    ),
    pytest.param(
        BASE + "[policy.stall]\nweigths = '1m'\n",
        "policy.stall.weigths: unknown key; did you mean 'weights'?",
        id="did-you-mean-stall",
    ),
    pytest.param(
        BASE + "policy = { max_attempt = 2 }\n",
        "servers[0].policy.max_attempt: unknown key; did you mean 'max_attempts'?",
        id="did-you-mean-server-policy",
    ),
    pytest.param(
        BASE.replace('host = "gpu1"', 'host = "gpu2"'),
        "servers[0].host: unknown host 'gpu2'; did you mean 'gpu1'? known: gpu1",
        id="unknown-host",
    ),
    pytest.param(
        BASE + SERVER.replace("gpus = [0, 1]", "gpus = [2, 3]\nport = 30001"),
        "servers[1].name: 'llama' is already the name of servers[0]",
        id="duplicate-server",
    ),
    pytest.param(
        HOST + HOST + SERVER,
        "hosts[1].name: 'gpu1' is already the name of hosts[0]",
        id="duplicate-host",
    ),
    pytest.param(
        BASE + "port = 70000\n",
        "servers[0].port: 70000 is not <= 65535",
        id="server-port-range",
    ),
    pytest.param(
        BASE.replace('address = "10.0.0.5"', 'address = "10.0.0.5"\nport = 0'),
        "hosts[0].port: 0 is not >= 1",
        id="host-port-range",
    ),
    pytest.param(
        BASE.replace("tp = 2", "tp = 2\ndp = 2"),
        "servers[0].gpus: lists 2 GPU(s) but tp*dp = 2*2 = 4; list exactly 4",
        id="gpus-count",
    ),
    pytest.param(
        BASE.replace("gpus = [0, 1]", "gpus = [1, 1]"),
        "servers[0].gpus: GPU 1 listed more than once",
        id="gpus-unique",
    ),
    pytest.param(
        BASE.replace("gpus = [0, 1]", "gpus = [0, -1]"),
        "servers[0].gpus[1]: -1 is not >= 0",
        id="gpus-non-negative",
    ),
    pytest.param(
        BASE + SERVER.replace('"llama"', '"qwen"').replace("[0, 1]", "[1, 2]") + "port = 30001\n",
        "servers[1].gpus: GPU 1 on host 'gpu1' is also used by servers[0] ('llama')",
        id="gpu-shared",
    ),
    pytest.param(
        BASE + SERVER.replace('"llama"', '"qwen"').replace("[0, 1]", "[2, 3]"),
        "servers[1].port: port 30000 on host 'gpu1' is also used by servers[0] ('llama')",
        id="port-shared",
    ),
    pytest.param(
        BASE + 'env = { HF_TOKEN = "hf_abc" }\n',
        "servers[0].env.HF_TOKEN: looks like a secret written inline; put it in secret_env "
        'instead (HF_TOKEN = "env:HF_TOKEN" or "file:/path") so it is read on this machine and '
        "never stored in the config",
        id="inline-secret-server",
    ),
    pytest.param(
        HOST + 'env = { DB_PASSWORD = "x" }\n' + SERVER,
        "hosts[0].env.DB_PASSWORD: looks like a secret written inline; put it in secret_env "
        'instead (DB_PASSWORD = "env:DB_PASSWORD" or "file:/path") so it is read on this machine '
        "and never stored in the config",
        id="inline-secret-host",
    ),
    pytest.param(
        BASE + 'sglang_version = "0.5"\n',
        "servers[0].sglang_version: '0.5' is not a version like '0.5.23' or '0.5.6.post2'",
        id="version-format",
    ),
    pytest.param(
        '[[hosts]]\nname = "gpu1"\n' + SERVER,
        "hosts[0].address: required when transport = 'ssh'",
        id="ssh-needs-address",
    ),
    pytest.param(
        BASE.replace('address = "10.0.0.5"', 'transport = "telnet"'),
        "hosts[0].transport: input should be 'ssh' or 'local' (got 'telnet')",
        id="transport-choice",
    ),
    pytest.param(
        BASE.replace('name = "gpu1"', 'name = "gpu 1"').replace('host = "gpu1"', 'host = "gpu 1"'),
        "hosts[0].name: 'gpu 1' is not a valid name: use letters, digits, '_', '.' and '-'",
        id="host-name-chars",
    ),
    pytest.param(
        BASE + "[policy]\nprobe_timeout = '20s'\n",
        "policy.probe_timeout: 20s is not > 20s: SGLang's /health itself waits up to 20 s "
        "(SGLANG_HEALTH_CHECK_TIMEOUT) before answering, so a shorter probe calls a busy server "
        "dead; use e.g. '30s'",
        id="probe-timeout",
    ),
    pytest.param(
        BASE + "[policy]\nmem_fraction_floor = 0.9\nmem_fraction_ceiling = 0.8\n",
        "policy.mem_fraction_ceiling: 0.8 is not > mem_fraction_floor (0.9)",
        id="floor-ceiling",
    ),
    pytest.param(
        BASE + "[policy]\nrestart_backoff_initial = '1m'\nrestart_backoff_max = '30s'\n",
        "policy.restart_backoff_max: 30s is less than restart_backoff_initial (1m)",
        id="backoff-order",
    ),
    pytest.param(
        BASE + "[policy]\nmax_attempts = 0\n",
        "policy.max_attempts: 0 is not >= 1",
        id="max-attempts",
    ),
    pytest.param(
        BASE + "[policy.stall]\nweights = '0s'\n",
        "policy.stall.weights: duration '0s' must be more than 0 s",
        id="duration-positive",
    ),
    pytest.param(
        BASE + "command = []\n",
        "servers[0].command: must name a program (a non-empty list of strings)",
        id="command-non-empty",
    ),
    pytest.param(
        BASE + 'command = ["docker", "exec", "sglang", "python3", "-m", "sglang.launch_server"]\n',
        "servers[0].command: 'docker exec sglang': a process that docker starts belongs to the "
        "container runtime (or another machine), not to the process group launcher signals, "
        "so stop and kill would end only the client and leave the server holding its GPUs; "
        "run sglang on the host, add the container (with an sshd) as a host of its own, or use "
        "a prefix that keeps the server its child (unshare, nsenter, env, nice, numactl, "
        "taskset)",
        id="command-docker-exec",
    ),
    pytest.param(
        BASE.replace('model_path = "/models/x"\n', ""),
        "servers[0].model_path: required key is missing",
        id="model-path-required",
    ),
    pytest.param(
        BASE + "[metrics]\nlisten = '9400'\n",
        "metrics.listen: '9400' is not HOST:PORT with a port in 1..65535",
        id="metrics-listen",
    ),
    pytest.param(
        "policy = 3\n" + BASE,
        "policy: expected a table, got 3",
        id="table-type",
    ),
    pytest.param(
        BASE + 'extra_args = "--context-length \'8192"\n',
        'servers[0].extra_args: cannot split "--context-length \'8192" into arguments: '
        "No closing quotation",
        id="extra-args-quotes",
    ),
]


@pytest.mark.parametrize(("text", "expected"), RULES)
def test_rule_reports_path_named_problem(tmp_path: Path, text: str, expected: str) -> None:
    """Each validation rule yields exactly one problem, named by its TOML path."""
    assert [expected] == problems(tmp_path, text)


@pytest.mark.parametrize(
    ("arg", "field"),
    [
        ("--model-path", "model_path"),
        ("--model", "model_path"),
        ("--tp", "tp"),
        ("--tp-size=2", "tp"),
        ("--tensor-parallel-size", "tp"),
        ("--dp-size", "dp"),
        ("--port", "port"),
        ("--host", "listen"),
        ("--mem-fraction-static", "mem_fraction_static"),
        ("--mem-frac", "mem_fraction_static"),
        ("--cuda-graph-max-bs", "cuda_graph_max_bs"),
        ("--cuda-graph-max-bs-decode=64", "cuda_graph_max_bs"),
        ("--served-model-name", "served_model_name"),
        ("--max-running-requests", "max_running_requests"),
        ("--max-mamba-cache-size", "max_mamba_cache_size"),
        ("--mamba-full-memory-ratio=0.5", "mamba_full_memory_ratio"),
        ("--mamba-scheduler-strategy", "mamba_strategy"),
        ("--mamba-radix-cache-strategy", "mamba_strategy"),
        ("--disable-overlap-schedule", "disable_overlap_schedule"),
    ],
)
def test_extra_args_reject_owned_flags(tmp_path: Path, arg: str, field: str) -> None:
    """A flag launcher sets itself is rejected in extra_args, naming the field to use."""
    flag = arg.split("=")[0]
    text = BASE + f'extra_args = ["--context-length", "8192", "{arg}", "1"]\n'
    expected = f"servers[0].extra_args: '{flag}' is set by launcher; use {field} = ..."
    assert [expected] == problems(tmp_path, text)


def test_extra_args_accept_other_flags(tmp_path: Path) -> None:
    """Flags launcher does not own, even ones sharing a prefix, pass through unchanged."""
    args = ["--context-length", "8192", "--model-loader-extra-config", "{}", "--enable-metrics"]
    text = BASE + f"extra_args = {args!r}\n".replace("'", '"')
    assert args == load(tmp_path, text).server("llama").extra_args


def test_same_gpus_and_port_on_different_hosts_are_fine(tmp_path: Path) -> None:
    """GPU and port clashes only count between servers on the same host."""
    other = SERVER.replace('"llama"', '"qwen"').replace('host = "gpu1"', 'host = "gpu2"')
    text = BASE + HOST.replace("gpu1", "gpu2") + other
    config = load(tmp_path, text)
    assert ["llama", "qwen"] == [s.name for s in config.servers]


def test_valid_edge_values_load(tmp_path: Path) -> None:
    """Local hosts need no address; post versions, a 21s probe timeout and tunnels are accepted."""
    text = (
        '[[hosts]]\nname = "box"\ntransport = "local"\n'
        + SERVER.replace('"gpu1"', '"box"')
        + 'sglang_version = "0.5.6.post2"\nlisten = "0.0.0.0"\nprobe = "direct"\n'
        + "[policy]\nprobe_timeout = '21s'\n"
    )
    config = load(tmp_path, text)
    assert ("0.5.6.post2", 21.0, None) == (
        config.server("llama").sglang_version,
        config.policy.probe_timeout,
        config.host("box").address,
    )


def test_secret_env_reference_must_not_be_inline(tmp_path: Path) -> None:
    """A secret_env value that is not env:/file: is rejected without echoing the value."""
    with pytest.raises(ConfigError) as caught:
        load(tmp_path, BASE + 'secret_env = { HF_TOKEN = "hf_supersecretvalue" }\n')
    assert [
        "servers[0].secret_env: HF_TOKEN: a secret_env value must be 'env:VARIABLE' (read from "
        "this machine's environment) or 'file:/path' (read from a file on this machine), never "
        "the secret itself"
    ] == caught.value.problems
    assert "hf_supersecretvalue" not in str(caught.value)


def test_all_problems_reported_together(tmp_path: Path) -> None:
    """Problems in different places, pydantic's and cross-entry ones, come in one error."""
    text = (
        "[policy]\nmem_fraction_floor = 0.9\nmem_fraction_ceiling = 0.8\n"
        + HOST
        + SERVER.replace("tp = 2", "tp = 4")
        + "mem_fraction_static = 1.3\n"
        + SERVER.replace('"llama"', '"qwen"').replace('"gpu1"', '"gpu9"')
        + "hots = 1\nport = 30001\n"
    )
    path = write(tmp_path, text)
    with pytest.raises(ConfigError) as caught:
        load_config(path, environ={"HOME": "/home/op"})
    assert str(path) == caught.value.source
    assert {
        "policy.mem_fraction_ceiling: 0.8 is not > mem_fraction_floor (0.9)",
        "servers[0].mem_fraction_static: 1.3 is not < 1",
        "servers[0].gpus: lists 2 GPU(s) but tp*dp = 4*1 = 4; list exactly 4",
        "servers[1].hots: unknown key; did you mean 'host'?",
        "servers[1].host: unknown host 'gpu9'; did you mean 'gpu1'? known: gpu1",
    } == set(caught.value.problems)
    assert "5 problem(s)" in str(caught.value)


# --- file-level errors ---------------------------------------------------------------------


def test_missing_file_is_a_config_error(tmp_path: Path) -> None:
    """A missing file is one ConfigError naming the file."""
    path = tmp_path / "nope.toml"
    with pytest.raises(ConfigError) as caught:
        load_config(path, environ={})
    assert (str(path), ["cannot read the file: No such file or directory"]) == (
        caught.value.source,
        caught.value.problems,
    )


def test_toml_syntax_error_names_the_line(tmp_path: Path) -> None:
    """A TOML syntax error is one ConfigError naming line and column."""
    with pytest.raises(ConfigError) as caught:
        load(tmp_path, '[policy]\nmax_attempts = 3\nprobe_interval "1s"\n')
    assert ["line 3, column 16: TOML syntax: Expected '=' after a key in a key/value pair"] == (
        caught.value.problems
    )


def test_non_utf8_file_names_the_line(tmp_path: Path) -> None:
    """Bytes that are not UTF-8 give one ConfigError naming their line."""
    path = tmp_path / "config.toml"
    path.write_bytes(b"[policy]\n# caf\xe9\n")
    with pytest.raises(ConfigError) as caught:
        load_config(path, environ={})
    assert ["line 2: not UTF-8 text (invalid continuation byte)"] == caught.value.problems


# --- environment overrides -----------------------------------------------------------------


def test_env_overrides_apply_before_validation(tmp_path: Path) -> None:
    """LAUNCHER_ variables set nested keys, array entries by index or name, and JSON values."""
    environ = {
        "LAUNCHER_POLICY__MAX_ATTEMPTS": "3",
        "LAUNCHER_POLICY__STALL__WEIGHTS": "1h30m",
        "LAUNCHER_SERVERS__LLAMA__PORT": "30005",
        "LAUNCHER_SERVERS__0__GPUS": "[2, 3]",
        "LAUNCHER_SERVERS__0__ENV__NCCL_DEBUG": "INFO",
        "LAUNCHER_HOSTS__GPU1__TRUST_ON_FIRST_USE": "true",
        "launcher_state_dir": "/srv/launcher",
        "LAUNCHER_SLACK_WEBHOOK": "https://hooks.example/x",  # not a config key: ignored
    }
    config = load(tmp_path, BASE, environ)
    server = config.server("llama")
    assert (3, 5400.0) == (config.policy.max_attempts, config.policy.stall.weights)
    assert (30005, [2, 3], {"NCCL_DEBUG": "INFO"}) == (server.port, server.gpus, server.env)
    assert config.host("gpu1").trust_on_first_use
    assert Path("/srv/launcher") == config.state_dir
    assert config.slack is None


def test_env_override_merges_json_table(tmp_path: Path) -> None:
    """A JSON object for a table merges into it instead of replacing it."""
    environ = {"LAUNCHER_POLICY": '{"max_attempts": 2}'}
    config = load(tmp_path, BASE + "[policy]\nmax_stalls = 7\n", environ)
    assert (2, 7) == (config.policy.max_attempts, config.policy.max_stalls)


@pytest.mark.parametrize(
    ("environ", "expected"),
    [
        (
            {"LAUNCHER_POLICY__MAX_ATTEMPTS": "0"},
            "policy.max_attempts: '0' is not >= 1 (from LAUNCHER_POLICY__MAX_ATTEMPTS)",
        ),
        (
            {"LAUNCHER_POLICY__MAX_ATEMPTS": "3"},
            "policy.max_atempts: unknown key; did you mean 'max_attempts'? "
            "(from LAUNCHER_POLICY__MAX_ATEMPTS)",
        ),
        (
            {"LAUNCHER_SERVERS__3__PORT": "1"},
            "LAUNCHER_SERVERS__3__PORT: servers has no entry 3 (there are 1)",
        ),
        (
            {"LAUNCHER_SERVERS__LAMA__PORT": "1"},
            "LAUNCHER_SERVERS__LAMA__PORT: servers has no entry named 'lama'; did you mean "
            "'llama'? known: llama (or use an index)",
        ),
        (
            {"LAUNCHER_SERVERS__0__GPUS": "[0,"},
            "LAUNCHER_SERVERS__0__GPUS: value starts like JSON but does not parse: "
            "Expecting value: line 1 column 4 (char 3)",
        ),
        (
            {"LAUNCHER_SERVERS__0__PORT__X": "1"},
            "LAUNCHER_SERVERS__0__PORT__X: servers[0].port is not a table",
        ),
        (
            {"LAUNCHER_POLICY____X": "1"},
            "LAUNCHER_POLICY____X: empty key between '__' delimiters",
        ),
        (
            {"LAUNCHER_SERVERS__0__TP": "3"},
            "servers[0].gpus: lists 2 GPU(s) but tp*dp = 3*1 = 3; list exactly 3",
        ),
    ],
)
def test_env_override_problems_name_the_variable(
    tmp_path: Path, environ: dict[str, str], expected: str
) -> None:
    """A bad override is reported like any problem, naming its variable where it is the cause."""
    assert [expected] == problems(tmp_path, BASE, environ)


def test_state_dir_defaults_follow_systemd_then_xdg_then_home() -> None:
    """The default state dir is $STATE_DIRECTORY, else $XDG_STATE_HOME/launcher, else ~/.local."""
    assert Path("/var/lib/launcher") == default_state_dir(
        {"STATE_DIRECTORY": "/var/lib/launcher:/var/lib/other", "XDG_STATE_HOME": "/x"}
    )
    assert Path("/x/launcher") == default_state_dir({"XDG_STATE_HOME": "/x", "HOME": "/h"})
    assert Path("/h/.local/state/launcher") == default_state_dir(
        {"XDG_STATE_HOME": "relative", "HOME": "/h"}
    )


def test_state_dir_comes_from_the_given_environ(tmp_path: Path) -> None:
    """load_config computes the default state dir from the environ it is given."""
    config = load(tmp_path, BASE, {"XDG_STATE_HOME": "/xdg"})
    assert Path("/xdg/launcher") == config.state_dir


# --- durations -----------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("text", "seconds"),
    [
        ("90s", 90.0),
        ("20m", 1200.0),
        ("1h", 3600.0),
        ("1h30m", 5400.0),
        ("500ms", 0.5),
        ("1m30s", 90.0),
        ("1.5h", 5400.0),
        ("2d", 172800.0),
        (" 10s ", 10.0),
        ("90", 90.0),
        ("2.5", 2.5),
        (45, 45.0),
        (0.25, 0.25),
    ],
)
def test_parse_duration_accepts_documented_forms(text: str | float, seconds: float) -> None:
    """Unit strings, bare numbers and numbers all become float seconds."""
    assert seconds == parse_duration(text)


@pytest.mark.parametrize(
    "text", ["", "abc", "10x", "30m1h", "1h1h", "-5", "-5s", "inf", "nan", "1 h", "m", "10 s s"]
)
def test_parse_duration_rejects_junk(text: str) -> None:
    """Anything else raises ValueError listing the accepted forms."""
    with pytest.raises(ValueError, match=r"invalid duration .*'500ms', '90s', '20m', '1h'"):
        parse_duration(text)


def test_parse_duration_rejects_bool() -> None:
    """A boolean is not a number of seconds."""
    with pytest.raises(ValueError, match="invalid duration True"):
        parse_duration(True)


@pytest.mark.parametrize("seconds", [0.5, 1.5, 90.0, 3600.0, 5400.0, 90061.0])
def test_format_duration_round_trips(seconds: float) -> None:
    """format_duration writes text that parse_duration reads back to the same seconds."""
    assert seconds == parse_duration(format_duration(seconds))


def test_duration_field_reports_accepted_forms(tmp_path: Path) -> None:
    """A junk duration in the config names its path and the accepted forms."""
    [problem] = problems(tmp_path, BASE + "[policy.stall]\nweights = 'soon'\n")
    assert problem.startswith("policy.stall.weights: invalid duration 'soon': use a number")


# --- policy merge and lookups --------------------------------------------------------------


def test_policy_override_merges_field_by_field(tmp_path: Path) -> None:
    """A server's policy table replaces only the keys it sets, stall budgets included."""
    other = SERVER.replace('"llama"', '"qwen"').replace("[0, 1]", "[2, 3]") + "port = 30001\n"
    text = (
        "[policy]\nmax_attempts = 5\nprobe_interval = '5s'\n[policy.stall]\nweights = '10m'\n"
        + BASE
        + "[servers.policy]\nmax_attempts = 2\n[servers.policy.stall]\ncuda_graph = '1m'\n"
        + other
    )
    config = load(tmp_path, text)
    llama, qwen = config.policy_for("llama"), config.policy_for("qwen")
    assert (2, 5.0, 600.0, 60.0, 300.0) == (
        llama.max_attempts,
        llama.probe_interval,
        llama.stall.weights,
        llama.stall.cuda_graph,
        llama.stall.init,
    )
    assert config.policy == qwen


def test_policy_override_checked_after_merge(tmp_path: Path) -> None:
    """An override that breaks a cross-field rule against the global policy is reported."""
    text = BASE + "policy = { mem_fraction_floor = 0.96 }\n"
    assert [
        "servers[0].policy.mem_fraction_ceiling: 0.95 is not > mem_fraction_floor (0.96)"
    ] == problems(tmp_path, text)


def test_stall_budget_for_phase() -> None:
    """Each start-up phase has its budget; READY has no stall budget (infinite)."""
    budgets = StallBudgets(init=1, weights=2, kv_cache=3, cuda_graph=4, warmup=5)
    assert [1.0, 2.0, 3.0, 4.0, 5.0, math.inf] == [budgets.for_phase(p) for p in Phase]


def test_unknown_server_and_host_lookups(tmp_path: Path) -> None:
    """Looking up a name that is not configured raises ConfigError with a suggestion."""
    config = load(tmp_path, BASE)
    with pytest.raises(ConfigError) as server_error:
        config.server("lama")
    with pytest.raises(ConfigError) as host_error:
        config.host("gpu7")
    assert ["servers: no server named 'lama'; did you mean 'llama'? known: llama"] == (
        server_error.value.problems
    )
    assert ["hosts: no host named 'gpu7'; did you mean 'gpu1'? known: gpu1"] == (
        host_error.value.problems
    )


def test_config_from_dict_validates_like_load(tmp_path: Path) -> None:
    """config_from_dict applies the same cross-entry rules to a parsed table."""
    data = {
        "hosts": [{"name": "a", "transport": "local"}],
        "servers": [{"name": "s", "host": "b", "model_path": "/m", "gpus": [0]}],
    }
    with pytest.raises(ConfigError) as caught:
        config_from_dict(data, environ={}, source="test")
    assert ("test", ["servers[0].host: unknown host 'b'; known: a"]) == (
        caught.value.source,
        caught.value.problems,
    )


# --- secrets and optional sections ---------------------------------------------------------


def server_with_secrets(secret_env: dict[str, str]) -> ServerConfig:
    return ServerConfig(name="llama", host="gpu1", model_path="/m", gpus=[0], secret_env=secret_env)


def test_resolve_secret_env_reads_env_and_file(tmp_path: Path) -> None:
    """env: references read the given environ, file: references read the file, stripped."""
    key_file = tmp_path / "key"
    key_file.write_text("sk-from-file\n", encoding="utf-8")
    server = server_with_secrets({"HF_TOKEN": "env:MY_HF", "API_KEY": f"file:{key_file}"})
    assert {"HF_TOKEN": "hf_abc", "API_KEY": "sk-from-file"} == resolve_secret_env(
        server, {"MY_HF": "hf_abc"}
    )


def test_resolve_secret_env_lists_every_missing_secret(tmp_path: Path) -> None:
    """Unset, empty and unreadable secrets are all named, with their variable or file."""
    empty = tmp_path / "empty"
    empty.write_text("\n", encoding="utf-8")
    server = server_with_secrets(
        {
            "A_TOKEN": "env:UNSET_VAR",
            "B_TOKEN": "env:EMPTY_VAR",
            "C_KEY": f"file:{tmp_path / 'missing'}",
            "D_KEY": f"file:{empty}",
        }
    )
    with pytest.raises(ConfigError) as caught:
        resolve_secret_env(server, {"EMPTY_VAR": ""})
    assert [
        "servers[llama].secret_env.A_TOKEN: environment variable UNSET_VAR is not set on this "
        "machine",
        "servers[llama].secret_env.B_TOKEN: environment variable EMPTY_VAR is empty on this "
        "machine",
        f"servers[llama].secret_env.C_KEY: cannot read {tmp_path / 'missing'}: No such file or "
        "directory",
        f"servers[llama].secret_env.D_KEY: file {empty} is empty",
    ] == caught.value.problems


def test_slack_webhook_url_from_env_or_file(tmp_path: Path) -> None:
    """The webhook URL comes from the file when set, else from the named variable."""
    url_file = tmp_path / "hook"
    url_file.write_text("https://hooks.example/file\n", encoding="utf-8")
    assert "https://hooks.example/env" == SlackConfig().webhook_url(
        {"LAUNCHER_SLACK_WEBHOOK": "https://hooks.example/env"}
    )
    assert SlackConfig(webhook_url_env="HOOK").webhook_url({}) is None
    assert "https://hooks.example/file" == SlackConfig(webhook_url_file=url_file).webhook_url({})


def test_slack_remind_every_takes_a_duration_or_off(tmp_path: Path) -> None:
    """[slack] remind_every: a duration of at least a minute, or "off" (0); 4h by default;
    anything else is one problem naming the key and what to write."""
    assert 4 * 3600.0 == SlackConfig().remind_every
    slack = load(tmp_path, BASE + '[slack]\nremind_every = "30m"\n').slack
    assert slack is not None and 1800.0 == slack.remind_every
    slack = load(tmp_path, BASE + '[slack]\nremind_every = "off"\n').slack
    assert slack is not None and 0.0 == slack.remind_every
    assert ['slack.remind_every: 10s is too short: use at least 1m, or "off" to turn '
            'reminders off'] == problems(tmp_path, BASE + '[slack]\nremind_every = "10s"\n')
    [bad] = problems(tmp_path, BASE + '[slack]\nremind_every = "soon"\n')
    assert bad.startswith("slack.remind_every: invalid duration 'soon'")


def test_metrics_listen_splits_host_and_port() -> None:
    """MetricsConfig exposes the bind address and port, IPv6 brackets removed."""
    assert ("127.0.0.1", 9400) == (MetricsConfig().host, MetricsConfig().port)
    ipv6 = MetricsConfig(listen="[::1]:9500")
    assert ("::1", 9500) == (ipv6.host, ipv6.port)


@pytest.mark.parametrize(("listen", "dialled"), [
    ("127.0.0.1", "127.0.0.1"),  # the default
    ("localhost", "127.0.0.1"),
    ("0.0.0.0", "127.0.0.1"),  # every IPv4 interface: its loopback
    ("::", "::1"),  # uvicorn binds :: IPv6-only: 127.0.0.1 would be refused
    ("[::]", "::1"),
    ("::1", "::1"),
    ("[::1]", "::1"),
    ("10.0.4.22", "10.0.4.22"),  # one interface: only that address reaches the server
    ("127.0.0.2", "127.0.0.2"),
    ("fd00::7", "fd00::7"),
    ("gpu-b.internal", "gpu-b.internal"),  # a name: the host resolves it
])
def test_the_probes_dial_the_address_a_server_listens_on(tmp_path: Path, listen: str,
                                                         dialled: str) -> None:
    """probe_address: a specific listen address as it is, a wildcard at its family's
    loopback; the same for a server's and a router's probes."""
    assert dialled == probe_address(listen)
    router = (f'[[routers]]\nname = "front"\nhost = "gpu1"\nport = 31000\n'
              f'servers = ["llama"]\nlisten = "{listen}"\napi_key = "env:KEY"\n')
    config = load(tmp_path, BASE.replace('gpus = [0, 1]', f'gpus = [0, 1]\nlisten = "{listen}"')
                  + router)
    assert dialled == config.server("llama").probe_address
    assert dialled == config.routers[0].probe_address


def test_models_are_frozen() -> None:
    """Config objects cannot be changed after loading."""
    host = HostConfig(name="h", transport="local")
    with pytest.raises(ValueError, match="frozen"):
        host.name = "other"  # type: ignore[misc]


def test_env_override_of_missing_array_names_the_variable(tmp_path: Path) -> None:
    """Overriding an entry of an array the file does not have is reported with the variable."""
    text = '[[servers]]\nname = "s"\nhost = "h"\nmodel_path = "/m"\ngpus = [0]\n'
    assert [
        "LAUNCHER_HOSTS__0__PORT: hosts has no entries to override",
        "servers[0].host: unknown host 'h'; known: none",
    ] == problems(tmp_path, text, {"LAUNCHER_HOSTS__0__PORT": "22"})


def test_relaunch_knobs_load_into_the_first_params(tmp_path: Path) -> None:
    """Running requests and the Mamba knobs are config fields; the spec shape stays in
    extra_args (launcher never changes it)."""
    text = BASE + (
        'max_running_requests = 32\nmax_mamba_cache_size = 64\nmamba_full_memory_ratio = 0.5\n'
        'mamba_strategy = "extra_buffer"\nextra_args = ["--speculative-algorithm", "EAGLE", '
        '"--speculative-num-steps", "3", "--mamba-ssm-dtype", "bfloat16"]\n'
    )
    p = load(tmp_path, text).server("llama").launch_params()
    assert (None, None, 32, 64, 0.5, "extra_buffer", ()) == (
        p.mem_fraction_static, p.cuda_graph_max_bs, p.max_running_requests,
        p.max_mamba_cache_size, p.mamba_full_memory_ratio, p.mamba_strategy, p.env,
    )


def test_disable_overlap_schedule_is_a_server_field(tmp_path: Path) -> None:
    """0.5.23's prescribed fix for a forced no_buffer: the key passes --disable-overlap-schedule;
    false (or unset) passes nothing."""
    on = load(tmp_path, BASE + "disable_overlap_schedule = true\n").server("llama")
    assert on.launch_params().disable_overlap_schedule is True
    assert ["--disable-overlap-schedule"] == params_argv(on.launch_params(), "0.5.23")
    off = load(tmp_path, BASE + "disable_overlap_schedule = false\n").server("llama")
    assert [] == params_argv(off.launch_params(), "0.5.23")


def test_extra_buffer_lazy_needs_a_version_that_has_it(tmp_path: Path) -> None:
    text = BASE + 'sglang_version = "0.5.10"\nmamba_strategy = "extra_buffer_lazy"\n'
    assert any("extra_buffer_lazy" in p and "0.5.15" in p for p in problems(tmp_path, text))
    ok = BASE + 'sglang_version = "0.5.23"\nmamba_strategy = "extra_buffer_lazy"\n'
    assert "extra_buffer_lazy" == load(tmp_path, ok).server("llama").mamba_strategy


def test_policy_switches_default_off_and_override_per_server(tmp_path: Path) -> None:
    text = BASE + "[servers.policy]\napply_prescribed_fixes = true\n"
    config = load(tmp_path, text)
    assert (False, False) == (
        config.policy.apply_prescribed_fixes, config.policy.allow_disable_draft_extend_graph
    )
    assert config.policy_for("llama").apply_prescribed_fixes


# --- pydantic-settings sources: TOML file, environment, credentials ------------------------


def test_config_is_a_settings_root_that_reads_nothing_outside_a_load(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Config is a pydantic-settings BaseSettings; built in code (not by load_config) it takes
    only its arguments, so a LAUNCHER_ variable in os.environ changes nothing."""
    from pydantic_settings import BaseSettings

    monkeypatch.setenv("LAUNCHER_POLICY__MAX_ATTEMPTS", "2")
    monkeypatch.setenv("LAUNCHER_STATE_DIR", "/from/env")
    config = Config(state_dir=Path("/given"))
    assert isinstance(config, BaseSettings)
    assert (Path("/given"), 6) == (config.state_dir, config.policy.max_attempts)


def test_nested_delimiter_overrides_merge_into_file_tables(tmp_path: Path) -> None:
    """LAUNCHER_A__B__C sets one key of a nested table; the file's other keys stay."""
    text = BASE + "[policy]\nmax_stalls = 7\n[policy.stall]\ninit = '1m'\n"
    environ = {"LAUNCHER_POLICY__STALL__WEIGHTS": "2h", "LAUNCHER_METRICS__LISTEN": "[::1]:9500"}
    config = load(tmp_path, text, environ)
    assert (7, 60.0, 7200.0, 300.0) == (
        config.policy.max_stalls,
        config.policy.stall.init,
        config.policy.stall.weights,
        config.policy.stall.kv_cache,
    )
    assert ("::1", 9500) == (config.metrics.host, config.metrics.port) if config.metrics else None


def test_entry_override_applies_to_a_whole_array_override(tmp_path: Path) -> None:
    """LAUNCHER_SERVERS (JSON) replaces the file's array; entry overrides address that one."""
    servers = '[{"name": "qwen", "host": "gpu1", "model_path": "/q", "gpus": [3]}]'
    environ = {"LAUNCHER_SERVERS": servers, "LAUNCHER_SERVERS__QWEN__PORT": "30009"}
    config = load(tmp_path, BASE, environ)
    assert [("qwen", 30009, [3])] == [(s.name, s.port, s.gpus) for s in config.servers]


def test_entry_override_problem_names_the_variable(tmp_path: Path) -> None:
    """A bad value set by name in an array entry is reported at its TOML path with the
    variable that set it."""
    environ = {"LAUNCHER_SERVERS__LLAMA__MEM_FRACTION_STATIC": "1.3"}
    assert [
        "servers[0].mem_fraction_static: '1.3' is not < 1 "
        "(from LAUNCHER_SERVERS__LLAMA__MEM_FRACTION_STATIC)"
    ] == problems(tmp_path, BASE, environ)


def test_unknown_top_level_override_gets_did_you_mean(tmp_path: Path) -> None:
    """A nested override under a top-level key that does not exist is not silently ignored."""
    assert [
        "polcy: unknown key; did you mean 'policy'? (from LAUNCHER_POLCY__MAX_ATTEMPTS)"
    ] == problems(tmp_path, BASE, {"LAUNCHER_POLCY__MAX_ATTEMPTS": "3"})


def credentials(tmp_path: Path, files: dict[str, str]) -> Path:
    directory = tmp_path / "credentials"
    directory.mkdir()
    for name, text in files.items():
        (directory / name).write_text(text + "\n", encoding="utf-8")
    return directory


def test_credentials_directory_overrides_like_variables(tmp_path: Path) -> None:
    """Files in $CREDENTIALS_DIRECTORY (systemd LoadCredential=) named like overrides set the
    same keys as the variables would, below the environment and above the file; the Slack
    webhook comes from one and never shows in the config's repr."""
    hook = "https://hooks.example/services/T0/B0/cred"
    directory = credentials(
        tmp_path,
        {
            "LAUNCHER_SLACK__WEBHOOK": hook,
            "LAUNCHER_POLICY__MAX_ATTEMPTS": "4",
            "LAUNCHER_POLICY__MAX_STALLS": "5",
            "LAUNCHER_SERVERS__LLAMA__PORT": "30007",
            "hf-token": "hf_not_an_override",
        },
    )
    environ = {"CREDENTIALS_DIRECTORY": str(directory), "LAUNCHER_POLICY__MAX_STALLS": "1"}
    config = load(tmp_path, BASE + "[policy]\nmax_attempts = 9\n", environ)
    assert (4, 1, 30007) == (
        config.policy.max_attempts,
        config.policy.max_stalls,
        config.server("llama").port,
    )
    assert config.slack is not None
    assert hook == config.slack.webhook_url({})
    assert "hooks.example" not in repr(config)


def test_empty_webhook_credential_is_unset(tmp_path: Path) -> None:
    """The unit's LoadCredential= file as the install script creates it (empty): no webhook
    from it; the variable of the env file is used instead, or none at all."""
    directory = credentials(tmp_path, {"LAUNCHER_SLACK__WEBHOOK": "\n"})
    config = load(tmp_path, BASE, {"CREDENTIALS_DIRECTORY": str(directory)})
    assert config.slack is not None
    hook = "https://hooks.example/services/T0/B0/env"
    assert None is config.slack.webhook_url({})
    assert hook == config.slack.webhook_url({"LAUNCHER_SLACK_WEBHOOK": hook})


def test_credential_problem_names_the_credential(tmp_path: Path) -> None:
    """A bad value from a credential file is reported with the credential's name."""
    directory = credentials(tmp_path, {"LAUNCHER_POLICY__MAX_ATTEMPTS": "0"})
    assert [
        "policy.max_attempts: '0' is not >= 1 (from credential LAUNCHER_POLICY__MAX_ATTEMPTS)"
    ] == problems(tmp_path, BASE, {"CREDENTIALS_DIRECTORY": str(directory)})


def test_missing_credentials_directory_is_a_config_error(tmp_path: Path) -> None:
    """$CREDENTIALS_DIRECTORY naming no directory is one ConfigError naming the variable."""
    [problem] = problems(tmp_path, BASE, {"CREDENTIALS_DIRECTORY": str(tmp_path / "none")})
    assert problem.startswith("$CREDENTIALS_DIRECTORY: ")
    assert "does not exist" in problem


def test_webhook_written_in_the_file_is_refused_unshown(tmp_path: Path) -> None:
    """slack.webhook is a secret: written in the TOML it is a problem, its value not echoed."""
    text = BASE + '[slack]\nwebhook = "https://hooks.example/inline-secret"\n'
    with pytest.raises(ConfigError) as caught:
        load(tmp_path, text)
    [problem] = caught.value.problems
    assert problem.startswith("slack.webhook: the webhook URL is a secret; do not write it")
    assert "inline-secret" not in str(caught.value)


def test_secret_env_cred_reads_the_credentials_directory(tmp_path: Path) -> None:
    """cred:NAME reads $CREDENTIALS_DIRECTORY/NAME; unset directory and missing file are named."""
    directory = credentials(tmp_path, {"hf-token": "hf_from_credential"})
    server = server_with_secrets({"HF_TOKEN": "cred:hf-token", "B_KEY": "cred:missing"})
    with pytest.raises(ConfigError) as unset:
        resolve_secret_env(server, {})
    with pytest.raises(ConfigError) as missing:
        resolve_secret_env(server, {"CREDENTIALS_DIRECTORY": str(directory)})
    ok = server_with_secrets({"HF_TOKEN": "cred:hf-token"})
    assert {"HF_TOKEN": "hf_from_credential"} == resolve_secret_env(
        ok, {"CREDENTIALS_DIRECTORY": str(directory)}
    )
    assert (
        "servers[llama].secret_env.HF_TOKEN: credential hf-token: $CREDENTIALS_DIRECTORY is not "
        "set on this machine (systemd sets it for LoadCredential=hf-token:/path in the unit)"
    ) == unset.value.problems[0]
    assert [
        f"servers[llama].secret_env.B_KEY: cannot read {directory / 'missing'}: No such file or "
        "directory"
    ] == missing.value.problems


@pytest.mark.parametrize("ref", ["cred:../hf-token", "cred:a/b", "cred:..", "cred:"])
def test_secret_env_cred_must_be_a_plain_name(tmp_path: Path, ref: str) -> None:
    """A cred: reference names one file of the credentials directory, never a path."""
    [problem] = problems(tmp_path, BASE + f'secret_env = {{ HF_TOKEN = "{ref}" }}\n')
    assert problem.startswith("servers[0].secret_env: HF_TOKEN: a secret_env value must be")


def test_policy_bounds_carry_every_field_of_the_policy() -> None:
    """``PolicyConfig.bounds()`` sets every ``Bounds`` field from the policy field of the same
    name (`up` and `plan` search within the same limits)."""
    policy = PolicyConfig(mem_fraction_floor=0.6, mem_fraction_ceiling=0.9, graph_bs_floor=4,
                          max_attempts=9, apply_prescribed_fixes=True,
                          allow_disable_draft_extend_graph=True)
    bounds = policy.bounds()
    assert {f.name: getattr(policy, f.name) for f in dataclasses.fields(bounds)} == (
        dataclasses.asdict(bounds))
    assert bounds.apply_prescribed_fixes and bounds.allow_disable_draft_extend_graph
