"""The real SGLang router (``sglang-router`` 0.3.2 from PyPI) in front of three simulated
servers, all on a "remote" host behind a real sshd, supervised and registered as ``launcher up``
wires them (``launcher.supervise.router.wire``).

The router comes from the test environment ``scripts/sglang-router-env.sh`` builds
(``scripts/setup.sh --test``); without it these tests fail, naming the command. Requests go
through the router to the simulated ``/generate`` and ``/v1/chat/completions``, whose answers
name the server that produced them (``sim_served_by``). Every server and router is SIGKILLed at
teardown (``kill_leftovers``: the router runs under the same run_dir).
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import time
from collections.abc import AsyncIterator, Callable, Iterator
from contextlib import asynccontextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import anyio
import httpx
import pytest

from launcher.config.load import config_from_dict
from launcher.config.schema import Config
from launcher.hooks.metrics import Metrics
from launcher.host.transport.base import Transport
from launcher.supervise.router import Routing, router_status, wire
from launcher.supervise.supervisor import ServerSupervisor
from tests.simhost import free_port
from tests.sshd import Sshd
from tests.sshsim import (
    FAST_POLICY,
    SIM_VERSION,
    EventRecorder,
    Site,
    kill_leftovers,
    server_entry,
    transport_for,
)
from tests.supervise import SimSetup, json_lines, run_cli

# Four Python processes start here; on a loaded 2-core machine that alone can take a minute.
pytestmark = [pytest.mark.ssh, pytest.mark.timeout(300)]

REPO = Path(__file__).resolve().parents[2]
SERVERS = ("r1", "r2", "r3")


def router_python() -> str:
    """The Python of the router test environment; fails (never skips) when it is not built."""
    script = REPO / "scripts" / "sglang-router-env.sh"
    venv = Path(subprocess.run([str(script), "--print-venv"], capture_output=True, text=True,
                               check=True).stdout.strip())
    if not list(venv.glob(".ready-*")):
        pytest.fail(f"the sglang-router test environment {venv} is not built: run "
                    "scripts/setup.sh --test (or scripts/sglang-router-env.sh)")
    return str(venv / "bin" / "python")


@dataclass
class Front:
    """Three sim servers and the router on one site, with what the test needs to poke them."""

    config: Config
    site: Site
    events: EventRecorder
    routing: Routing
    sups: dict[str, ServerSupervisor]
    metrics: Metrics
    transport: Transport

    async def status(self) -> dict[str, Any]:
        """What `launcher status` shows of the router."""
        return await router_status(self.config, self.config.router("front"), self.transport)

    def gauge(self, server: str) -> float | None:
        return self.metrics.registry.get_sample_value(
            "launcher_router_worker_registered", {"router": "front", "server": server})

    @property
    def router_url(self) -> str:
        return f"http://127.0.0.1:{self.config.router('front').port}"

    def port_of(self, server: str) -> int:
        return self.config.server(server).port

    def registered(self, server: str) -> int:
        return sum(1 for e in self.events.named("router.worker_registered", "front")
                   if e.data["server"] == server)

    def deregistered(self, server: str) -> list[Any]:
        return [e for e in self.events.named("router.worker_deregistered", "front")
                if e.data["server"] == server]

    def router_pid(self, attempt: int) -> int:
        return int((self.site.run_dir / "front" / str(attempt) / "pid").read_text())

    async def listed(self) -> dict[str, bool]:
        """The router's own listing: worker URL -> healthy."""
        async with httpx.AsyncClient(trust_env=False, timeout=5) as client:
            body = (await client.get(self.router_url + "/workers")).json()
        return {w["url"]: w["is_healthy"] for w in body["workers"]}

    async def served_by(self, n: int, path: str = "/generate") -> list[int]:
        """Send ``n`` real requests through the router; the server port each answer names."""
        ports = []
        async with httpx.AsyncClient(trust_env=False, timeout=30) as client:
            for i in range(n):
                if path == "/generate":
                    resp = await client.post(self.router_url + path, json={
                        "text": f"question {i}", "sampling_params": {"max_new_tokens": 2}})
                    resp.raise_for_status()
                    where = resp.json()["meta_info"]["sim_served_by"]
                else:
                    resp = await client.post(self.router_url + path, json={
                        "model": "tiny-1b-sim", "max_tokens": 2,
                        "messages": [{"role": "user", "content": f"question {i}"}]})
                    resp.raise_for_status()
                    body = resp.json()
                    assert body["object"] == "chat.completion"
                    where = body["metadata"]["sim_served_by"]
                ports.append(int(where.rsplit(":", 1)[1]))
        return ports


@pytest.fixture
def site(tmp_path: Path, sshd_host: Sshd) -> Iterator[Site]:
    made = Site.create(tmp_path, "gpu1", sshd_host, gpu_count=3)
    yield made
    kill_leftovers([made.run_dir])


def front_config(tmp_path: Path, site: Site, python: str) -> Config:
    return config_from_dict({
        "state_dir": str(tmp_path / "state"),
        "policy": {**FAST_POLICY, "probe_failures": 2},
        "hosts": [site.host_entry()],
        "servers": [server_entry(name, site, gpus=(i,), port=free_port())
                    for i, name in enumerate(SERVERS)],
        "routers": [{
            "name": "front", "host": site.name, "port": free_port(), "listen": "127.0.0.1",
            "servers": list(SERVERS),
            "command": [python, "-m", "sglang_router.launch_router"],
            # Its own Prometheus port (29000 by default) would clash between test runs.
            "args": ["--policy", "round_robin", "--prometheus-port", str(free_port()),
                     "--prometheus-host", "127.0.0.1"],
        }],
    }, environ={})


@asynccontextmanager
async def running_front(tmp_path: Path, site: Site) -> AsyncIterator[Front]:
    """Supervise the three servers and the router as ``launcher up`` does, for the body."""
    config = front_config(tmp_path, site, router_python())
    transport = transport_for(config, site.name)
    events = EventRecorder()
    metrics = Metrics()
    try:
        routing = wire(config, config.servers, {site.name: transport}, [events, metrics])
        sups = {s.name: ServerSupervisor(config, s, transport, sglang_version=SIM_VERSION,
                                         hooks=[events, routing.registrar],
                                         before_stop=routing.before_stop)
                for s in config.servers}
        async with anyio.create_task_group() as tg:
            for sup in sups.values():
                await tg.start(sup.run)
            for rsup in routing.supervisors:
                await tg.start(rsup.run)
            yield Front(config, site, events, routing, sups, metrics, transport)
            tg.cancel_scope.cancel()
    finally:
        with anyio.CancelScope(shield=True):
            await transport.aclose()


async def wait_for(predicate: Callable[[], bool], events: EventRecorder, what: str,
                   timeout: float = 120.0) -> None:
    try:
        with anyio.fail_after(timeout):
            while True:
                if predicate():
                    return
                await anyio.sleep(0.02)
    except TimeoutError:
        raise AssertionError(f"{what} not within {timeout}s; events: {events.names()}") from None


async def all_registered(front: Front) -> None:
    await wait_for(lambda: all(front.registered(s) >= 1 for s in SERVERS), front.events,
                   "all three registered")


async def test_dead_servers_leave_the_router_and_a_dead_router_gets_every_ready_worker_back(
    tmp_path: Path, site: Site,
) -> None:
    """One story, so the three servers and the router start once (the slow part)."""
    async with running_front(tmp_path, site) as front:
        await all_registered(front)
        # Registered only once ready: each server's ready event comes before its registration.
        order = [(e.name, e.server if e.name == "server.ready" else e.data.get("server"))
                 for e in front.events.events
                 if e.name in ("server.ready", "router.worker_registered")]
        for s in SERVERS:
            assert order.index(("server.ready", s)) < order.index(
                ("router.worker_registered", s))
        urls = {f"http://127.0.0.1:{front.port_of(s)}" for s in SERVERS}
        assert set(await front.listed()) == urls
        status = await front.status()
        assert (status["running"], status["healthy"], status["attempt"]) == (True, True, 1)
        assert status["workers"] == dict.fromkeys(SERVERS, "registered")
        ports = {front.port_of(s) for s in SERVERS}
        assert set(await front.served_by(6)) == ports
        assert set(await front.served_by(6, "/v1/chat/completions")) == ports

        # Kill r2: it is deregistered (its death is seen by the follower, not by probes).
        killed_at = time.monotonic()
        os.kill(site.server_pid("r2", 1), signal.SIGKILL)
        await wait_for(lambda: bool(front.deregistered("r2")), front.events, "r2 deregistered")
        gone = front.deregistered("r2")[0]
        print(f"death -> deregistration confirmed: {gone.at - killed_at:.3f}s "
              f"(trigger -> confirmed {gone.data['after_s']}s)")
        assert gone.data["reason"] == "not ready"
        assert front.gauge("r2") == 0 and front.gauge("r1") == 1
        assert (await front.status())["workers"]["r2"] == "not registered"
        assert f"http://127.0.0.1:{front.port_of('r2')}" not in await front.listed()
        live = {front.port_of("r1"), front.port_of("r3")}
        assert set(await front.served_by(6)) == live
        assert set(await front.served_by(4, "/v1/chat/completions")) == live
        # Driven by the death, not by failed probes, and before launcher's cleanup and relaunch.
        assert not [e for e in front.events.named("probe.failed", "r2") if e.at < gone.at]
        await wait_for(lambda: bool(front.events.named("process.stopped", "r2")), front.events,
                       "r2 cleaned up")
        assert front.events.named("process.stopped", "r2")[0].at > gone.at

        # It recovers (attempt 2) and is registered again.
        await wait_for(lambda: front.registered("r2") >= 2, front.events, "r2 re-registered")
        assert [e.data["attempt"] for e in front.events.named("server.ready", "r2")] == [1, 2]
        assert front.gauge("r2") == 1
        assert set(await front.listed()) == urls
        assert set(await front.served_by(6)) == ports

        # Kill the router: it is relaunched and every ready worker is registered with it again.
        before = {s: front.registered(s) for s in SERVERS}
        attempts = {name: sup.machine.attempt for name, sup in front.sups.items()}
        os.kill(front.router_pid(1), signal.SIGKILL)
        await wait_for(lambda: bool(front.events.named("router.died", "front")), front.events,
                       "the router's death noticed")
        await wait_for(lambda: all(front.registered(s) > before[s] for s in SERVERS),
                       front.events, "every worker registered with the new router")
        ready = front.events.named("router.ready", "front")
        assert [e.data["attempt"] for e in ready] == [1, 2]
        assert front.events.named("router.died", "front")[0].data["exit_status"] == 137
        urls = {f"http://127.0.0.1:{front.port_of(s)}" for s in SERVERS}
        assert set(await front.listed()) == urls
        assert set(await front.served_by(6)) == {front.port_of(s) for s in SERVERS}
        # The servers were never touched.
        assert {name: sup.machine.attempt for name, sup in front.sups.items()} == attempts

        # launcher stops r1: it leaves the router before its processes are signalled.
        front.sups["r1"].request_stop(kill=True)
        await wait_for(lambda: bool(front.events.named("process.stopped", "r1")), front.events,
                       "r1 stopped")
        left = front.deregistered("r1")[-1]
        assert left.at < front.events.named("process.stopped", "r1")[0].at
        assert f"http://127.0.0.1:{front.port_of('r1')}" not in await front.listed()


def test_up_until_ready_registers_status_shows_it_and_down_stops_the_router(
    sim: SimSetup,
) -> None:
    """`launcher up` wires the router in (daemon.py); --until-ready waits for the router and
    the registration; `status` reads the router's listing; `down` stops the router too."""
    data = sim.data(mem_fraction_static=0.8, cuda_graph_max_bs=8)
    server = data["servers"][0]
    data["routers"] = [{
        "name": "front", "host": server["host"], "port": free_port(), "listen": "127.0.0.1",
        "servers": [server["name"]], "command": [router_python(), "-m",
                                                 "sglang_router.launch_router"],
        "args": ["--prometheus-port", str(free_port()), "--prometheus-host", "127.0.0.1"],
    }]
    config = sim.write_toml(data)
    try:
        up = run_cli("up", str(config), "--until-ready", "--log-format", "json", timeout=120)
        assert 0 == up.returncode, up.stderr[-2000:]
        # the router is left running too, and its exit line says so
        assert ("launcher exited; left running: sim0, router front (stop them with "
                "`launcher down`)") in up.stderr, up.stderr[-2000:]
        names = [e["event"] for e in json_lines(up.stdout + up.stderr) if "event" in e]
        assert names.index("server.ready") < names.index("router.worker_registered")
        assert "router.ready" in names

        status = run_cli("status", str(config), "--json")
        assert 0 == status.returncode, status.stderr
        [router] = [row for row in json.loads(status.stdout) if "router" in row]
        assert (router["running"], router["healthy"]) == (True, True)
        assert router["workers"] == {server["name"]: "registered"}

        down = run_cli("down", str(config))
        assert 0 == down.returncode, down.stderr
        assert "front: stopped (pid" in down.stdout
        assert not kill_leftovers([sim.run_dir])  # nothing left to kill
    finally:
        kill_leftovers([sim.run_dir])
