"""A multi-node server end to end over real SSH: two hosts, one SGLang server across both.

Host gpu-a is a real sshd on 127.0.0.1, host gpu-b one on 127.0.0.2, each in front of its own
simulated GPU host (gpu-b's servers bind their HTTP port on 127.0.0.2, as a second machine
would). The server runs TP4 over 2 GPUs per node; the ranks rendezvous on node 0's address
(--dist-init-addr 127.0.0.1:PORT) and a dead peer kills the others as gloo does
(launcher.sim.multinode). launcher.supervise.ranks.MultiNodeSupervisor launches, follows, stops and
relaunches the ranks through the SSH transports.
"""

from __future__ import annotations

import json
import os
import re
import signal
import time
from collections.abc import AsyncIterator, Callable, Iterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import anyio
import pytest

from launcher.config.schema import Config
from launcher.supervise.lifecycle import State
from launcher.supervise.ranks import MultiNodeSupervisor
from tests.simhost import free_port, model_dir
from tests.sshd import Sshd
from tests.sshsim import (
    SIM_VERSION,
    EventRecorder,
    RecordingSSHTransport,
    Site,
    kill_leftovers,
    server_entry,
    ssh_config,
    transport_for,
)
from tests.supervise import _toml, run_cli

# Each test runs two simulated start-ups (seconds); 300 s leaves room for a loaded CI box.
pytestmark = [pytest.mark.ssh, pytest.mark.slow, pytest.mark.timeout(300)]

SERVER = "dsv3"


class SecondHostSshd(Sshd):
    """A real sshd on 127.0.0.2: a second "machine" on the loopback network."""

    host = "127.0.0.2"


@pytest.fixture
def sshd_b(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Sshd]:
    daemon = SecondHostSshd(tmp_path_factory.mktemp("sshd-b"))
    daemon.start()
    yield daemon
    daemon.stop()


@pytest.fixture
def pair(sshd_host: Sshd, sshd_b: Sshd, tmp_path: Path) -> Iterator[tuple[Site, Site]]:
    """Sites gpu-a (H200-sized GPUs) and gpu-b (H100-sized, HTTP on 127.0.0.2); every rank
    launched on them is killed at teardown."""
    a = Site.create(tmp_path, "gpu-a", sshd_host, gpu_total_gib=139.8)
    b = Site.create(tmp_path, "gpu-b", sshd_b)
    data = json.loads(b.sim.path.read_text())
    data["loopback"] = "127.0.0.2"
    b.sim.path.write_text(json.dumps(data))
    yield a, b
    kill_leftovers([a.run_dir, b.run_dir])


def config_for(tmp_path: Path, a: Site, b: Site, *, policy: dict[str, Any] | None = None,
               **server: Any) -> Config:
    fields = {"mem_fraction_static": 0.8, "cuda_graph_max_bs": 8, **server}
    entry = server_entry(SERVER, a, gpus=[0, 1], port=free_port(), tp=4, **fields)
    del entry["host"]
    entry.update(nodes=["gpu-a", "gpu-b"], dist_init_port=free_port())
    # The start-up deadline is not under test: a loaded box may spend minutes in SSH alone.
    merged = {"start_deadline": "600s", **(policy or {})}
    return ssh_config(tmp_path, [a.host_entry(), b.host_entry()], [entry], policy=merged)


@asynccontextmanager
async def supervised(config: Config, events: EventRecorder, **kwargs: Any
                     ) -> AsyncIterator[tuple[MultiNodeSupervisor,
                                              dict[str, RecordingSSHTransport]]]:
    transports = {h.name: transport_for(config, h.name) for h in config.hosts}
    sup = MultiNodeSupervisor(config, config.server(SERVER), dict(transports),
                              sglang_version=SIM_VERSION, hooks=[events], grace=5.0,
                              follower_grace=2.0, settle_s=1.0, **kwargs)
    try:
        async with anyio.create_task_group() as tg:
            await tg.start(sup.run)
            try:
                yield sup, transports
            finally:
                with anyio.move_on_after(60.0, shield=True):
                    sup.request_stop(kill=False)
                    while True:
                        if sup.state.terminal:
                            break
                        await anyio.sleep(0.02)
                tg.cancel_scope.cancel()
    finally:
        with anyio.CancelScope(shield=True):
            for t in transports.values():
                await t.aclose()


async def wait_until(predicate: Callable[[], bool], timeout: float, events: EventRecorder,
                     what: str) -> None:
    try:
        with anyio.fail_after(timeout):
            while True:
                if predicate():
                    return
                await anyio.sleep(0.02)
    except TimeoutError:
        raise AssertionError(f"{what} not within {timeout}s; events: {events.names()}") from None


def ready_count(events: EventRecorder) -> int:
    return len(events.named("server.ready"))


def rank_pid(site: Site, attempt: int, rank: int) -> int:
    return site.server_pid(SERVER if rank == 0 else f"{SERVER}.node{rank}", attempt)


def rank_log(site: Site, attempt: int, rank: int) -> str:
    name = SERVER if rank == 0 else f"{SERVER}.node{rank}"
    return site.log_bytes(name, attempt).decode(errors="replace")


def stopped(events: EventRecorder) -> list[tuple[str, int, list[str]]]:
    return [(e.data["reason"], e.data["rank"], e.data["signals"])
            for e in events.named("process.stopped")]


async def test_normal_start_node_zero_probed_node_one_joined(
    pair: tuple[Site, Site], tmp_path: Path
) -> None:
    """Both ranks launch together; the server is ready once node 0 printed its ready line,
    node 1 printed its dummy-health line, and node 0's /health answered through gpu-a's
    tunnel (gpu-b is never probed)."""
    a, b = pair
    config = config_for(tmp_path, a, b)
    events = EventRecorder()
    async with supervised(config, events) as (sup, transports):
        await wait_until(lambda: sup.state is State.READY, 180, events, "ready")
        snap = sup.snapshot()
    [launched] = events.named("ranks.launched")
    assert [(0, "gpu-a"), (1, "gpu-b")] == [(r["rank"], r["host"])
                                          for r in launched.data["ranks"]]
    joined = events.first("rank.joined")
    ready = events.first("server.ready")
    assert joined is not None and ready is not None and joined.at <= ready.at
    assert (1, "gpu-b") == (joined.data["rank"], joined.data["node"])
    assert "Dummy health check server started" in rank_log(b, 1, 1)
    assert "--node-rank 1" in (b.attempt_dir(f"{SERVER}.node1", 1) / "cmd").read_text()
    assert [config.server(SERVER).port] == sorted({p for p, _ in transports["gpu-a"].forwards})
    assert [] == transports["gpu-b"].forwards
    assert ("ready", "gpu-a", 1) == (snap.state, snap.host, snap.attempt)
    assert not events.named("attempt.failed")


async def test_sigkill_of_rank_one_after_ready_restarts_all_node_zero_first(
    pair: tuple[Site, Site], tmp_path: Path
) -> None:
    """Rank 1 SIGKILLed while serving: node 0 dies of the closed connection (a consequence),
    the cause named is rank 1 killed; node 0 is stopped first, then every rank is launched
    again and the server is ready on attempt 2."""
    a, b = pair
    config = config_for(tmp_path, a, b)
    events = EventRecorder()
    async with supervised(config, events) as (sup, _):
        await wait_until(lambda: sup.state is State.READY, 180, events, "ready")
        killed_at = time.monotonic()
        os.kill(rank_pid(b, 1, 1), signal.SIGKILL)
        await wait_until(lambda: ready_count(events) == 2, 180, events, "ready again")
        back_at = time.monotonic()
    cause = events.first("rank.cause")
    [failed] = events.named("attempt.failed")
    assert cause is not None
    assert (1, "gpu-b", "killed") == (cause.data["rank"], cause.data["node"],
                                      cause.data["outcome"])
    consequences = [(e.data["rank"], e.data["outcome"]) for e in events.named("rank.exited")
                    if e.data["attempt"] == 1 and e.data["consequence"]]
    assert [(0, "nccl_error")] == consequences
    assert ("killed", True) == (failed.data["outcome"], failed.data["after_ready"])
    assert failed.data["advice"].startswith("node 1 (gpu-b)")
    assert "Connection closed by peer" in rank_log(a, 1, 0)
    assert [0, 1] == [rank for _, rank, _ in stopped(events)][:2]
    assert b.attempt_dir(f"{SERVER}.node1", 2).is_dir() and a.attempt_dir(SERVER, 2).is_dir()
    print(f"rank death -> all ranks ready: {back_at - killed_at:.2f}s")


async def test_sigstop_of_rank_one_during_init_is_a_stall_then_all_restart(
    pair: tuple[Site, Site], tmp_path: Path
) -> None:
    """Rank 1 stopped (SIGSTOP) as it starts: its log stays silent past the init budget
    while node 0 waits for it at the rendezvous; the stall names rank 1, node 0 is stopped
    first, then rank 1 (SIGTERM, continued so that it acts on it), and attempt 2 gets
    ready."""
    a, b = pair
    config = config_for(tmp_path, a, b, policy={"stall": {
        "init": "2s", "weights": "15s", "kv_cache": "15s", "cuda_graph": "15s",
        "warmup": "15s"}})
    events = EventRecorder()
    pid_file = b.attempt_dir(f"{SERVER}.node1", 1) / "pid"
    async with supervised(config, events):
        with anyio.fail_after(30):
            while True:
                if pid_file.exists() and pid_file.read_text().strip():
                    break
                await anyio.sleep(0.002)
        os.kill(int(pid_file.read_text()), signal.SIGSTOP)
        await wait_until(lambda: ready_count(events) == 1, 180, events, "ready")
    stall = events.first("rank.stalled")
    assert stall is not None
    assert (1, "gpu-b", "init") == (stall.data["rank"], stall.data["node"], stall.data["phase"])
    [failed] = events.named("attempt.failed")
    assert ("hang", "init") == (failed.data["outcome"], failed.data["phase"])
    assert "node 1 (gpu-b)" in failed.data["advice"]
    first_stops = stopped(events)[:2]
    assert [("stall", 0), ("stall", 1)] == [(reason, rank) for reason, rank, _ in first_stops]
    assert ["SIGTERM"] == first_stops[1][2][:1]
    assert "Load weight begin" not in rank_log(b, 1, 1)
    assert 2 == events.named("server.ready")[0].data["attempt"]


async def test_oom_on_rank_one_during_capture_steps_the_policy_for_all_ranks(
    pair: tuple[Site, Site], tmp_path: Path
) -> None:
    """gpu-b's smaller GPUs run out of memory capturing CUDA graphs at fraction 0.98 and graph
    bs 512 (node 0's larger GPUs would hold them); node 0 dies of the closed connection. The
    cause (node 1's OOM, with its numbers) feeds the policy; every rank is relaunched with the
    lower fraction and gets ready."""
    a, b = pair
    config = config_for(tmp_path, a, b, model_path=str(model_dir("llama-70b-sim")),
                        mem_fraction_static=0.98, cuda_graph_max_bs=512)
    events = EventRecorder()
    async with supervised(config, events) as (sup, _):
        await wait_until(lambda: sup.state in (State.READY, State.GAVE_UP), 240, events,
                         "ready")
        final = sup.state
    cause = events.first("rank.cause")
    failed = events.named("attempt.failed")
    started = [e.data["params"] for e in events.named("attempt.started")]
    assert cause is not None
    assert (1, "oom_graph_capture") == (cause.data["rank"], cause.data["outcome"])
    assert ("oom_graph_capture", "cuda_graph") == (failed[0].data["outcome"],
                                                   failed[0].data["phase"])
    assert 79.19 == failed[0].data["numbers"]["total_gib"]  # node 1's GPU, not node 0's
    assert started[1]["mem_fraction_static"] < 0.98
    assert State.READY == final
    last = len(started)
    for site, rank in ((a, 0), (b, 1)):
        name = SERVER if rank == 0 else f"{SERVER}.node1"
        cmd = (site.attempt_dir(name, last) / "cmd").read_text()
        assert f"--mem-fraction-static {started[-1]['mem_fraction_static']}" in cmd


async def test_host_b_unreachable_for_a_while_relaunches_nothing(
    pair: tuple[Site, Site], sshd_b: Sshd, tmp_path: Path
) -> None:
    """gpu-b's sshd goes away for 3 s while the server is ready: gpu-b is reported
    unreachable and reachable again, nothing fails, stalls or relaunches, and both ranks
    keep their pids."""
    a, b = pair
    config = config_for(tmp_path, a, b)
    events = EventRecorder()
    async with supervised(config, events) as (sup, _):
        await wait_until(lambda: sup.state is State.READY, 180, events, "ready")
        pids = rank_pid(a, 1, 0), rank_pid(b, 1, 1)
        await anyio.to_thread.run_sync(sshd_b.stop)
        await wait_until(lambda: bool(events.named("host.unreachable")), 30, events,
                         "host.unreachable")
        await anyio.sleep(3.0)
        state_while_down = sup.state
        await anyio.to_thread.run_sync(sshd_b.start)
        await wait_until(lambda: bool(events.named("host.reachable")), 120, events,
                         "host.reachable")
        await anyio.sleep(1.0)
        final = sup.state
    assert (State.READY, State.READY) == (state_while_down, final)
    assert {"gpu-b"} == {e.data["node"] for e in events.named("host.unreachable")}
    assert not events.named("attempt.failed") and 1 == len(events.named("attempt.started"))
    assert all(_alive(pid) for pid in pids)


async def test_0523_rank_one_ignores_sigterm_and_stops_on_node_zeros_shutdown(
    pair: tuple[Site, Site], tmp_path: Path
) -> None:
    """0.5.23: a SIGTERM to rank 1 alone is logged and ignored (nothing fails, nothing is
    relaunched); a stop signals node 0 first, and rank 1 leaves by itself when node 0's tree
    goes (no signal from launcher reaches it)."""
    a, b = pair
    config = config_for(tmp_path, a, b)
    events = EventRecorder()
    async with supervised(config, events) as (sup, _):
        await wait_until(lambda: sup.state is State.READY, 180, events, "ready")
        pid = rank_pid(b, 1, 1)
        os.kill(pid, signal.SIGTERM)
        await wait_until(lambda: "SIGTERM received on node_rank 1" in rank_log(b, 1, 1), 10,
                         events, "rank 1's SIGTERM line")
        await anyio.sleep(0.5)
        assert _alive(pid) and sup.state is State.READY
        sup.request_stop(kill=True)
        await wait_until(lambda: sup.state.terminal, 90, events, "stopped")
    assert [("stop", 0, ["SIGTERM"]), ("stop", 1, [])] == stopped(events)
    assert not _alive(pid)
    assert (b.attempt_dir(f"{SERVER}.node1", 1) / "exit_status").exists()
    assert not events.named("attempt.failed") and 1 == len(events.named("attempt.started"))


def _alive(pid: int) -> bool:
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return False
    return stat.rsplit(")", 1)[1].split()[0] != "Z"


async def test_restarted_launcher_adopts_the_running_rank_group(
    pair: tuple[Site, Site], tmp_path: Path
) -> None:
    """A second supervisor (a restarted launcher) finds every node running attempt 1: it
    adopts the group, follows every rank again and is ready without launching anything."""
    a, b = pair
    config = config_for(tmp_path, a, b)
    first = EventRecorder()
    async with supervised(config, first) as (sup, _):
        await wait_until(lambda: sup.state is State.READY, 180, first, "ready")
    pids = rank_pid(a, 1, 0), rank_pid(b, 1, 1)
    events = EventRecorder()
    async with supervised(config, events) as (sup, _):
        await wait_until(lambda: sup.state is State.READY, 180, events, "ready again")
    adopted = events.first("server.adopted")
    assert adopted is not None and 1 == adopted.data["attempt"]
    assert not events.named("attempt.started") and not events.named("process.stopped")
    assert all(_alive(pid) for pid in pids)


async def test_0523_gated_launch_opens_once_every_rank_waits(
    pair: tuple[Site, Site], tmp_path: Path
) -> None:
    """gated_launch_port: every rank blocks after distributed init; launcher opens the gate
    (POST /gate/activate through gpu-a's transport) only once all four schedulers on both
    nodes logged that they wait, and nothing loads weights before it."""
    a, b = pair
    gate = free_port()
    config = config_for(tmp_path, a, b, gated_launch_port=gate)
    events = EventRecorder()
    async with supervised(config, events) as (sup, transports):
        await wait_until(lambda: sup.state is State.READY, 180, events, "ready")
    opened = events.first("ranks.gate_opened")
    assert opened is not None and gate == opened.data["port"]
    assert gate in {p for p, _ in transports["gpu-a"].forwards}
    logs = rank_log(a, 1, 0), rank_log(b, 1, 1)
    for log, ranks in zip(logs, ((0, 1), (2, 3)), strict=True):
        for r in ranks:
            assert log.index(f"Gated launch waiting for activation. rank={r}") < log.index(
                "Gated launch activated")
        assert log.index("Gated launch activated") < log.index("Load weight begin")
    assert f"--gated-launch-port {gate}" in (b.attempt_dir(f"{SERVER}.node1", 1) / "cmd"
                                            ).read_text()


async def test_down_stops_node_zero_then_the_other_ranks(
    pair: tuple[Site, Site], tmp_path: Path
) -> None:
    """`launcher down` on a multi-node server left running: node 0 first, then node 1
    (stopped, or gone with node 0 already), each node's GPUs checked free (exit 0)."""
    a, b = pair
    config = config_for(tmp_path, a, b)
    events = EventRecorder()
    async with supervised(config, events) as (sup, _):
        await wait_until(lambda: sup.state is State.READY, 180, events, "ready")
    pids = rank_pid(a, 1, 0), rank_pid(b, 1, 1)
    assert all(_alive(pid) for pid in pids)
    entry = {**config.server(SERVER).model_dump(mode="json", exclude_none=True)}
    entry.pop("host")
    data = {"state_dir": str(tmp_path / "state"),
            "hosts": [a.host_entry(), b.host_entry()], "servers": [entry]}
    path = tmp_path / "down.toml"
    path.write_text(_toml(data))
    result = await anyio.to_thread.run_sync(lambda: run_cli("down", str(path), timeout=240))
    assert 0 == result.returncode, result.stdout + result.stderr
    said = result.stdout.replace("\n", " ")
    # Node 1 leaves with node 0's tree (peer death) unless launcher gets there first.
    assert "node 0 (gpu-a): stopped" in said, said
    assert re.search(r"node 1 \(gpu-b\): (stopped|not running)[^;]*; GPUs free", said), said
    assert said.index("node 0 (gpu-a)") < said.index("node 1 (gpu-b)")
    assert not any(_alive(pid) for pid in pids)
