"""Multi-node config (``nodes = [...]``): its problems, each rank's command line, `plan`."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from launcher.config.load import load_config
from launcher.config.schema import Config
from launcher.errors import ConfigError
from launcher.params import LaunchParams
from launcher.plan.multinode import dist_init_addr, rank_commands
from launcher.supervise.ranks import MultiNodeSupervisor
from launcher.supervise.supervisor import ServerSupervisor
from tests.supervise import run_cli

HOSTS = """
[[hosts]]
name = "gpu-a"
address = "10.0.4.21"

[[hosts]]
name = "gpu-b"
address = "10.0.4.22"

[[hosts]]
name = "gpu-c"
address = "fd00::7"
"""
DSV3 = """
[[servers]]
name = "dsv3"
nodes = ["gpu-a", "gpu-b"]
model_path = "/models/dsv3"
tp = 16
gpus = [0, 1, 2, 3, 4, 5, 6, 7]
dist_init_port = 5000
sglang_version = "0.5.23"
"""


def load(tmp_path: Path, text: str) -> Config:
    path = tmp_path / "config.toml"
    path.write_text(text, encoding="utf-8")
    return load_config(path, environ={"HOME": "/home/op"})


def problems(tmp_path: Path, text: str) -> list[str]:
    with pytest.raises(ConfigError) as caught:
        load(tmp_path, text)
    return caught.value.problems


def test_nodes_stand_for_host_and_every_rank_gets_its_flags(tmp_path: Path) -> None:
    """``nodes`` replaces ``host`` (node 0 is the server's host); every rank runs the same line
    but for --node-rank; --dist-init-addr is node 0's address and dist_init_port."""
    config = load(tmp_path, HOSTS + DSV3)
    server = config.server("dsv3")
    assert ("gpu-a", ["gpu-a", "gpu-b"], 2) == (server.host, server.node_hosts, server.nnodes)
    assert "10.0.4.21:5000" == dist_init_addr(config, server)

    ranks = rank_commands(config, server, LaunchParams(0.8), "0.5.23", {})

    assert [(0, "gpu-a", "dsv3"), (1, "gpu-b", "dsv3.node1")] == [
        (r.rank, r.host, r.run_name) for r, _ in ranks]
    first, second = (cmd.argv for _, cmd in ranks)
    for rank, argv in enumerate((first, second)):
        i = argv.index("--nnodes")
        assert ["--nnodes", "2", "--node-rank", str(rank), "--dist-init-addr",
                "10.0.4.21:5000"] == argv[i:i + 6]
    assert [w for w in first if w != "0"] == [w for w in second if w != "1"]
    assert "CUDA_VISIBLE_DEVICES" in ranks[1][1].env


def test_gated_launch_port_is_on_every_rank(tmp_path: Path) -> None:
    config = load(tmp_path, HOSTS + DSV3 + "gated_launch_port = 5100\n")
    for _, cmd in rank_commands(config, config.server("dsv3"), LaunchParams(), "0.5.23", {}):
        i = cmd.argv.index("--gated-launch-port")
        assert "5100" == cmd.argv[i + 1]


def test_single_host_command_has_no_multinode_flags(tmp_path: Path) -> None:
    text = HOSTS + DSV3.replace('nodes = ["gpu-a", "gpu-b"]', 'host = "gpu-a"').replace(
        "tp = 16", "tp = 8").replace("dist_init_port = 5000\n", "")
    config = load(tmp_path, text)
    [(rank, cmd)] = rank_commands(config, config.server("dsv3"), LaunchParams(), "0.5.23", {})
    assert (0, "dsv3") == (rank.rank, rank.run_name)
    assert not {"--nnodes", "--node-rank", "--dist-init-addr"} & set(cmd.argv)


def test_explicit_dist_init_addr_and_ipv6_node_zero(tmp_path: Path) -> None:
    explicit = load(tmp_path, HOSTS + DSV3.replace("dist_init_port = 5000",
                                                   'dist_init_addr = "192.168.9.1:6000"'))
    assert "192.168.9.1:6000" == dist_init_addr(explicit, explicit.server("dsv3"))
    v6 = load(tmp_path, HOSTS + DSV3.replace('["gpu-a", "gpu-b"]', '["gpu-c", "gpu-b"]'))
    assert "[fd00::7]:5000" == dist_init_addr(v6, v6.server("dsv3"))


@pytest.mark.parametrize(
    ("change", "expected"),
    [
        (('nodes = ["gpu-a", "gpu-b"]', 'host = "gpu-a"\nnodes = ["gpu-a", "gpu-b"]'),
         "servers[0].nodes: set either host or nodes, not both"),
        (('nodes = ["gpu-a", "gpu-b"]', "nodes = []"),
         "servers[0].nodes: must list at least one host"),
        (('nodes = ["gpu-a", "gpu-b"]', 'nodes = ["gpu-a", "gpu-x"]'),
         "servers[0].nodes[1]: unknown host 'gpu-x'"),
        (('nodes = ["gpu-a", "gpu-b"]', 'nodes = ["gpu-a", "gpu-a"]'),
         "servers[0].nodes: 'gpu-a' listed more than once"),
        (("dist_init_port = 5000\n", ""),
         "servers[0].dist_init_port: required with more than one node"),
        (("dist_init_port = 5000", 'dist_init_addr = "nohost"'),
         "servers[0].dist_init_addr: 'nohost' is not HOST:PORT"),
        (("tp = 16", "tp = 8"),
         "servers[0].gpus: lists 8 GPU(s) but tp*dp = 8*1 = 8; list exactly 4 per node"),
        (("tp = 16", "tp = 15"), "servers[0].tp: tp*dp = 15 does not split evenly over 2"),
        (('nodes = ["gpu-a", "gpu-b"]', 'host = "gpu-a"'),
         "servers[0].dist_init_port: is only used with nodes"),
        (("sglang_version", 'extra_args = ["--node-rank", "1"]\nsglang_version'),
         "'--node-rank' is set by launcher; use nodes"),
        (('sglang_version = "0.5.23"', 'sglang_version = "0.5.10"\ngated_launch_port = 5100'),
         "gated_launch_port needs SGLang >= 0.5.23"),
        (('nodes = ["gpu-a", "gpu-b"]', 'host = "gpu-a"\ngated_launch_port = 5100'),
         "servers[0].gated_launch_port: is only used with nodes"),
    ],
)
def test_bad_multinode_config_names_the_field(
    tmp_path: Path, change: tuple[str, str], expected: str
) -> None:
    found = problems(tmp_path, HOSTS + DSV3.replace(*change))
    assert any(expected in p for p in found), found


def test_gpu_clash_on_a_later_node(tmp_path: Path) -> None:
    """A single-host server on gpu-b clashes with the multi-node server's GPUs there."""
    other = """
[[servers]]
name = "small"
host = "gpu-b"
model_path = "/models/x"
gpus = [7]
port = 30001
"""
    found = problems(tmp_path, HOSTS + DSV3 + other)
    assert any("GPU 7 on host 'gpu-b' is also used by servers[0] ('dsv3')" in p
               for p in found), found


def test_plan_json_shows_every_rank(tmp_path: Path) -> None:
    path = tmp_path / "config.toml"
    path.write_text(HOSTS + DSV3, encoding="utf-8")
    result = run_cli("plan", str(path), "--json")
    assert 0 == result.returncode, result.stderr
    [row] = json.loads(result.stdout)
    assert [0, 1] == [r["rank"] for r in row["ranks"]]
    assert ["gpu-a", "gpu-b"] == [r["host"] for r in row["ranks"]]
    assert row["argv"] == row["ranks"][0]["argv"]
    assert "--node-rank 1 --dist-init-addr 10.0.4.21:5000" in row["ranks"][1]["command"]
    assert row["ranks"][1]["run_dir"].endswith("/dsv3.node1/<attempt>")
    text = run_cli("plan", str(path))
    assert 0 == text.returncode, text.stderr
    assert "rank 1" in text.stdout and "on gpu-b" in text.stdout


def test_run_dir_of_is_the_units_own_else_its_hosts(tmp_path: Path) -> None:
    """``Config.run_dir_of``: a server's ``run_dir`` wins on every node; without one, each
    node's host's ``run_dir`` (node 0's host by default)."""
    hosts = HOSTS.replace('address = "10.0.4.22"', 'address = "10.0.4.22"\nrun_dir = "/b/runs"')
    config = load(tmp_path, hosts + DSV3)
    dsv3 = config.server("dsv3")
    assert "~/.launcher/runs" == config.run_dir_of(dsv3)
    assert "/b/runs" == config.run_dir_of(dsv3, "gpu-b")

    own = load(tmp_path, hosts + DSV3.replace('tp = 16', 'tp = 16\nrun_dir = "/srv/runs"'))
    assert ["/srv/runs", "/srv/runs"] == [
        own.run_dir_of(own.server("dsv3"), h) for h in ("gpu-a", "gpu-b")]


def test_the_multinode_supervisor_overrides_only_the_documented_extension_points() -> None:
    """``MultiNodeSupervisor`` replaces no private method of ``ServerSupervisor``: only the
    public extension points its docstring lists."""
    base = ServerSupervisor.__doc__ or ""
    overridden = {name for name in vars(MultiNodeSupervisor)
                  if name in vars(ServerSupervisor) and not name.startswith("__")}
    assert overridden and not [n for n in overridden if n.startswith("_")], overridden
    assert [] == [n for n in sorted(overridden) if f"``{n}``" not in base]
