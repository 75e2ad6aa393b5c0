"""The simulator's multi-node servers (``--nnodes 2 --node-rank R``): two sim hosts on one
machine (the second binds its HTTP port on 127.0.0.2), real processes, real sockets.

What each rank prints and does follows SGLang's source: nodes >= 1 log with their global TP
ranks, print no bars, no summary and no ready line, serve the dummy /health
(``utils/common.py`` ``launch_dummy_health_check_server``) and, on 0.5.23, ignore SIGTERM once
their schedulers are ready (``entrypoints/engine.py``); a dead peer kills the others with gloo's
``Connection closed by peer``.
"""

from __future__ import annotations

import json
import signal
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import pytest

from launcher.sim.multinode import DUMMY_STARTED
from tests.simhost import SimHost, SimProcess, free_port, make_sim_host, model_dir

MODEL = str(model_dir("tiny-1b-sim"))
pytestmark = pytest.mark.timeout(300)  # a few seconds each; room for a loaded CI box
T = 90.0  # seconds any one wait may take on a loaded box (seconds normally)


def two_hosts(tmp_path: Path, *, total_a: float = 79.19) -> tuple[SimHost, SimHost]:
    """Host a (GPUs of ``total_a`` GiB) and host b (79.19 GiB, HTTP on 127.0.0.2)."""
    a = make_sim_host(tmp_path / "a", gpu_count=2, gpu_total_gib=total_a)
    b = make_sim_host(tmp_path / "b", gpu_count=2)
    data = json.loads(b.path.read_text())
    data["loopback"] = "127.0.0.2"
    b.path.write_text(json.dumps(data))
    return a, b


def flags(port: int, dist: int, rank: int, model: str = MODEL, bs: int = 8) -> list[str]:
    return ["--model-path", model, "--tp-size", "4", "--port", str(port), "--nnodes", "2",
            "--node-rank", str(rank), "--dist-init-addr", f"127.0.0.1:{dist}",
            "--mem-fraction-static", "0.8" if bs == 8 else "0.98", "--cuda-graph-max-bs", str(bs)]


@pytest.fixture
def ports() -> tuple[int, int]:
    return free_port(), free_port()


@pytest.fixture
def procs() -> Iterator[list[SimProcess]]:
    started: list[SimProcess] = []
    yield started
    for p in started:
        p.close()


def start_pair(a: SimHost, b: SimHost, ports: tuple[int, int], procs: list[SimProcess],
               version: str = "0.5.23", model: str = MODEL, bs: int = 8
               ) -> tuple[SimProcess, SimProcess]:
    port, dist = ports
    flag = "--cuda-graph-max-bs-decode" if version >= "0.5.15" else "--cuda-graph-max-bs"
    argv = [[flag if w == "--cuda-graph-max-bs" else w for w in flags(port, dist, r, model, bs)]
            for r in (0, 1)]
    r0 = a.start(*argv[0], version=version)
    procs.append(r0)
    r1 = b.start(*argv[1], version=version)
    procs.append(r1)
    return r0, r1


def health(host: str, port: int) -> int:
    with urllib.request.urlopen(f"http://{host}:{port}/health", timeout=5) as resp:
        return int(resp.status)


def test_two_nodes_come_up_node_zero_serves_the_other_joins(
    tmp_path: Path, ports: tuple[int, int], procs: list[SimProcess]
) -> None:
    a, b = two_hosts(tmp_path)
    r0, r1 = start_pair(a, b, ports, procs)
    r0.wait_for("The server is fired up and ready to roll!", timeout=T)
    r1.wait_for("Dummy health check server started", timeout=T)
    port = ports[0]
    assert 200 == health("127.0.0.1", port) == health("127.0.0.2", port)
    out1 = r1.output
    assert DUMMY_STARTED.format(host="127.0.0.1", port=port) in out1
    assert "TP2] Load weight begin" in out1 and "TP3] Load weight begin" in out1
    assert "TP0]" not in out1 and "TP1]" not in out1
    assert "[Gloo] Rank 2 is connected to 3 peer ranks" in out1
    assert "Capturing batches" not in out1 and "max_total_num_tokens" not in out1
    assert "ready to roll" not in out1
    assert "Capturing batches" in r0.output and "TP2]" not in r0.output


def test_rank_one_killed_node_zero_dies_with_gloo_peer_closed(
    tmp_path: Path, ports: tuple[int, int], procs: list[SimProcess]
) -> None:
    a, b = two_hosts(tmp_path)
    r0, r1 = start_pair(a, b, ports, procs)
    r0.wait_for("The server is fired up and ready to roll!", timeout=T)
    r1.signal(signal.SIGKILL)
    assert -9 == r0.wait(timeout=T)
    assert "Connection closed by peer [127.0.0.1]" in r0.output
    assert "Scheduler hit an exception" in r0.output


def test_sigterm_on_rank_one_is_ignored_on_0523_and_rank_zero_stops_it(
    tmp_path: Path, ports: tuple[int, int], procs: list[SimProcess]
) -> None:
    """0.5.23: node 1 logs the SIGTERM and keeps running; node 0's SIGTERM shutdown
    broadcasts ShutdownReq and node 1 exits cleanly (its dummy server stopped)."""
    a, b = two_hosts(tmp_path)
    r0, r1 = start_pair(a, b, ports, procs)
    r0.wait_for("The server is fired up and ready to roll!", timeout=T)
    r1.wait_for("Dummy health check server started", timeout=T)
    r1.signal(signal.SIGTERM)
    r1.wait_for("SIGTERM received on node_rank 1; waiting for the rank-0 ShutdownReq", timeout=T)
    assert r1.proc.poll() is None
    r0.signal(signal.SIGTERM)
    assert 0 == r1.wait(timeout=T)
    assert "Dummy health check server stopped at 127.0.0.1" in r1.output
    assert "Connection closed by peer" not in r1.output
    assert -9 == r0.wait(timeout=T)


def test_sigterm_on_rank_one_kills_it_on_0510(
    tmp_path: Path, ports: tuple[int, int], procs: list[SimProcess]
) -> None:
    a, b = two_hosts(tmp_path)
    r0, r1 = start_pair(a, b, ports, procs, version="0.5.10")
    r1.wait_for("Dummy health check server started", timeout=T)
    r1.signal(signal.SIGTERM)
    assert -15 == r1.wait(timeout=T)
    assert -9 == r0.wait(timeout=T)
    assert "Connection closed by peer" in r0.output


def test_oom_in_capture_on_rank_one(
    tmp_path: Path, ports: tuple[int, int], procs: list[SimProcess]
) -> None:
    """Node 1 has the smaller GPUs (80 GB against 141 GB): at fraction 0.98 and graph bs 512
    its capture runs out of memory (1.56 GiB of headroom for 0.46 GiB of prefill graphs and
    1.14 GiB of decode graphs), while node 0's 2.78 GiB holds graphs and warmup; node 0
    dies of the closed connection, never an OOM."""
    a, b = two_hosts(tmp_path, total_a=139.8)
    r0, r1 = start_pair(a, b, ports, procs, model=str(model_dir("llama-70b-sim")), bs=512)
    assert -9 == r1.wait(timeout=T)
    assert "CUDA out of memory" in r1.output and "Capture cuda graph failed" in r1.output
    assert -9 == r0.wait(timeout=T)
    assert "Connection closed by peer" in r0.output
    assert "CUDA out of memory" not in r0.output


def test_0523_gated_launch_holds_every_rank_until_activated(
    tmp_path: Path, ports: tuple[int, int], procs: list[SimProcess]
) -> None:
    """--gated-launch-port: every scheduler of both nodes logs that it waits after "Init
    parallel ends" and loads nothing until POST /gate/activate reaches node 0's gate."""
    a, b = two_hosts(tmp_path)
    gate = free_port()
    port, dist = ports
    argv = [[*flags(port, dist, r), "--gated-launch-port", str(gate)] for r in (0, 1)]
    r0 = a.start(*[w.replace("--cuda-graph-max-bs", "--cuda-graph-max-bs-decode") for w in
                   argv[0]], version="0.5.23")
    procs.append(r0)
    r1 = b.start(*[w.replace("--cuda-graph-max-bs", "--cuda-graph-max-bs-decode") for w in
                   argv[1]], version="0.5.23")
    procs.append(r1)
    r0.wait_for(f"Gated launch control server started on 127.0.0.1:{gate}", timeout=T)
    r1.wait_for("Gated launch waiting for activation. rank=3", timeout=T)
    r0.wait_for("Gated launch still waiting for activation. rank=0", timeout=T)
    assert "Load weight begin" not in r0.output + r1.output
    assert "Gated launch waiting for activation. rank=1" in r0.output
    request = urllib.request.Request(f"http://127.0.0.1:{gate}/gate/activate", method="POST")
    with urllib.request.urlopen(request, timeout=5) as resp:
        assert 200 == resp.status
    r0.wait_for("The server is fired up and ready to roll!", timeout=T)
    r1.wait_for("Dummy health check server started", timeout=T)
    for out in (r0.output, r1.output):
        ends, activated, baseline = (out.index(t) for t in (
            "Init parallel ends", "Gated launch activated", "Memory baseline taken"))
        assert ends < activated < baseline
