"""The router's config rules, its plan, and the worker API client and registrar against a fake
router over real HTTP (the real router is exercised end to end in
tests/supervision/test_router_e2e.py).

``FakeRouter`` speaks either dialect of the worker API the way sglang-router 0.3.2 does
(checked by hand against the wheel: POST /workers answers 202 with the worker's id and the
worker shows in GET /workers only once its background job ran; DELETE /workers/{id} 202) or
the legacy one (/add_worker, /remove_worker, /list_workers; /workers 404).
"""

from __future__ import annotations

import json
import socket
import sys
import threading
import uuid
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any
from urllib.parse import parse_qs, urlsplit

import anyio
import anyio.lowlevel
import httpx
import pytest
from structlog.testing import capture_logs

from launcher.config.load import config_from_dict
from launcher.config.schema import Config
from launcher.errors import ConfigError, HostUnreachable
from launcher.hooks.metrics import Metrics
from launcher.hooks.slack import SlackNotifier
from launcher.host.router_api import RouterApiError, RouterClient
from launcher.host.transport.base import CommandResult
from launcher.params import LaunchParams
from launcher.supervise import events as ev
from launcher.supervise.router import Registrar, RouterSupervisor, plan_rows
from tests.faketime import FakeTime
from tests.simhost import free_port
from tests.supervise import SimSetup, run_cli


def base_config(**router: Any) -> dict[str, Any]:
    entry = {"name": "front", "host": "a", "port": 31000, "servers": ["r1", "r2"], **router}
    return {
        "hosts": [{"name": "a", "address": "10.0.0.1"}, {"name": "b", "address": "10.0.0.2"}],
        "servers": [
            {"name": "r1", "host": "a", "model_path": "/m", "gpus": [0], "port": 30001},
            {"name": "r2", "host": "b", "model_path": "/m", "gpus": [0], "port": 30002,
             "listen": "0.0.0.0"},
        ],
        "routers": [entry],
    }


def problems(data: dict[str, Any]) -> list[str]:
    with pytest.raises(ConfigError) as info:
        config_from_dict(data, environ={})
    return info.value.problems


# -- config ----------------------------------------------------------------------------------


def test_a_router_config_gives_its_command_line_and_the_workers_urls() -> None:
    config = config_from_dict(base_config(args=["--policy", "cache_aware"]), environ={})
    router = config.router("front")
    assert router.argv() == ["python3", "-m", "sglang_router.launch_router", "--host",
                             "127.0.0.1", "--port", "31000", "--policy", "cache_aware"]
    [row] = plan_rows(config)
    # r1 is on the router's host (loopback); r2 elsewhere, at its host's address.
    assert row["workers"] == {"r1": "http://127.0.0.1:30001", "r2": "http://10.0.0.2:30002"}
    assert row["run_dir"] == "~/.launcher/runs/front/<attempt>"


def test_the_router_command_is_configurable_for_the_smg_gateway() -> None:
    config = config_from_dict(base_config(command="smg launch"), environ={})
    assert config.router("front").argv()[:4] == ["smg", "launch", "--host", "127.0.0.1"]


@pytest.mark.parametrize(("change", "expected"), [
    ({"servers": ["r1", "r9"]}, "routers[0].servers[1]: unknown server 'r9'"),
    ({"host": "c"}, "routers[0].host: unknown host 'c'"),
    ({"port": 30001}, "routers[0].port: port 30001 on host 'a' is also used by server 'r1'"),
    ({"name": "r1"}, "routers[0].name: 'r1' is also the name of a server"),
    ({"args": ["--port", "1"]},
     "routers[0].args: launcher sets --port (from this router's port): remove it from args"),
    ({"args": ["--worker-urls=http://x"]}, "launcher sets --worker-urls=http://x"),
    ({"servers": ["r1", "r1"]}, "routers[0].servers[1]: 'r1' is listed twice"),
    ({"worker_urls": {"r3": "http://x:1"}}, "routers[0].worker_urls.r3: 'r3' is not in"),
    ({"servers": []}, "routers[0].servers: "),
])
def test_bad_router_entries_are_named_by_their_field(change: dict[str, Any],
                                                      expected: str) -> None:
    found = problems(base_config(**change))
    assert any(expected in p for p in found), found


@pytest.mark.parametrize(("listen", "url"), [
    ("0.0.0.0", "http://127.0.0.1:30001"),
    ("::", "http://[::1]:30001"),  # uvicorn binds :: IPv6-only
    ("10.0.0.1", "http://10.0.0.1:30001"),  # one interface: not on 127.0.0.1
])
def test_a_server_on_the_routers_host_is_registered_where_it_listens(listen: str,
                                                                      url: str) -> None:
    data = base_config()
    data["servers"][0]["listen"] = listen
    config = config_from_dict(data, environ={})
    assert url == plan_rows(config)[0]["workers"]["r1"]


def test_a_loopback_server_on_another_host_is_refused_unless_its_url_is_given() -> None:
    data = base_config()
    data["servers"][1]["listen"] = "127.0.0.1"
    [problem] = problems(data)
    assert problem.startswith("routers[0].servers[1]: server 'r2' listens on 127.0.0.1")
    data["routers"][0]["worker_urls"] = {"r2": "http://gpu-b.internal:30002"}
    config = config_from_dict(data, environ={})
    assert plan_rows(config)[0]["workers"]["r2"] == "http://gpu-b.internal:30002"


def test_two_routers_on_one_host_need_their_own_prometheus_ports() -> None:
    data = base_config()
    data["routers"].append({"name": "back", "host": "a", "port": 31001, "servers": ["r1"]})
    [problem] = problems(data)
    assert problem.startswith("routers[1].args: routers[0] on host 'a' already uses the "
                              "router's default Prometheus port 29000")
    data["routers"][1]["args"] = ["--prometheus-port", "29001"]
    config_from_dict(data, environ={})


def test_plan_shows_the_routers_command_line(sim: SimSetup) -> None:
    data = sim.data()
    server = data["servers"][0]
    data["routers"] = [{"name": "front", "host": server["host"], "port": 31999,
                        "servers": [server["name"]], "args": ["--policy", "round_robin"]}]
    result = run_cli("plan", str(sim.write_toml(data)))
    assert 0 == result.returncode, result.stderr
    assert ("  command  python3 -m sglang_router.launch_router --host 127.0.0.1 --port 31999 "
            "--policy round_robin") in result.stdout
    assert f"  worker   {server['name']} = http://127.0.0.1:{server['port']}" in result.stdout


def test_check_lists_each_router_its_port_and_its_program(sim: SimSetup) -> None:
    """`check` gives each router a line like a server's: ok with its port free and its
    command's program found; problems (exit 1) for a port something else holds and a
    program the host does not have."""
    data = sim.data()
    server = data["servers"][0]
    free, taken = free_port(), free_port()
    data["routers"] = [
        {"name": "front", "host": server["host"], "port": free, "servers": [server["name"]],
         "command": [sys.executable, "-m", "sglang_router.launch_router"]},
        {"name": "back", "host": server["host"], "port": taken, "servers": [server["name"]],
         "command": ["no-such-router-program", "--flag"],
         "args": ["--prometheus-port", str(free_port())]},
    ]
    with socket.socket() as holder:
        holder.bind(("127.0.0.1", taken))
        holder.listen()
        result = run_cli("check", str(sim.write_toml(data)))

    assert 1 == result.returncode, result.stdout + result.stderr
    lines = result.stdout.splitlines()
    host = server["host"]
    assert f"router front on {host}: ok  port {free} free, {sys.executable} found" in lines
    at = lines.index(f"router back on {host}: problems  port {taken}")
    assert lines[at + 1].startswith(f"  - port {taken} is already in use on {host}")
    assert (f"  - no-such-router-program (the router's command) not found on {host}"
            == lines[at + 2])


# -- a fake router over real HTTP ------------------------------------------------------------


class FakeRouter:
    """A router's worker API. ``legacy``: only /add_worker, /remove_worker, /list_workers.
    ``lag``: how many listings a queued add or removal stays invisible (the real one runs it in
    the background). ``busy``: how many next requests answer 503."""

    def __init__(self, *, legacy: bool = False, lag: int = 1, busy: int = 0) -> None:
        self.legacy, self.lag, self.busy = legacy, lag, busy
        self.never: set[str] = set()  # URLs whose add job never finishes (unreachable worker)
        self.workers: dict[str, str] = {}  # url -> id
        self.pending: list[list[Any]] = []  # [listings left, "add"|"remove", url]
        self.requests: list[str] = []
        self.posted: list[str] = []  # the URLs of POST /workers, in order
        self.lock = threading.Lock()
        fake = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, format: str, *args: Any) -> None:
                return

            def do_GET(self) -> None:
                self._answer(*fake.handle("GET", self.path, b""))

            def do_POST(self) -> None:
                body = self.rfile.read(int(self.headers.get("Content-Length") or 0))
                self._answer(*fake.handle("POST", self.path, body))

            def do_DELETE(self) -> None:
                self._answer(*fake.handle("DELETE", self.path, b""))

            def _answer(self, code: int, body: dict[str, Any]) -> None:
                data = json.dumps(body).encode()
                self.send_response(code)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

        self.httpd = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.thread = threading.Thread(target=self.httpd.serve_forever, daemon=True)
        self.thread.start()

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.httpd.server_address[1]}"

    def close(self) -> None:
        self.httpd.shutdown()
        self.httpd.server_close()
        self.thread.join()

    def _tick(self) -> None:
        for job in self.pending:
            job[0] -= 1
        for job in [j for j in self.pending if j[0] < 0 and j[2] not in self.never]:
            self.pending.remove(job)
            if job[1] == "add":
                self.workers.setdefault(job[2], str(uuid.uuid5(uuid.NAMESPACE_URL, job[2])))
            else:
                self.workers.pop(job[2], None)

    def handle(self, method: str, raw_path: str, body: bytes) -> tuple[int, dict[str, Any]]:
        with self.lock:
            self.requests.append(f"{method} {raw_path}")
            if self.busy:
                self.busy -= 1
                return 503, {"error": "busy"}
            parts = urlsplit(raw_path)
            path, query = parts.path, parse_qs(parts.query)
            if self.legacy:
                if path == "/list_workers":
                    return 200, {"urls": list(self.workers)}
                if path == "/add_worker" and method == "POST":
                    self.workers[query["url"][0]] = ""
                    return 200, {"message": "added"}
                if path == "/remove_worker" and method == "POST":
                    self.workers.pop(query["url"][0], None)
                    return 200, {"message": "removed"}
                return 404, {}
            if path == "/workers" and method == "GET":
                self._tick()
                return 200, {"workers": [{"id": i, "url": u, "is_healthy": True}
                                         for u, i in self.workers.items()]}
            if path == "/workers" and method == "POST":
                url = json.loads(body)["url"]
                self.posted.append(url)
                self.pending.append([self.lag, "add", url])
                return 202, {"status": "accepted", "url": url}
            if path.startswith("/workers/") and method == "DELETE":
                wid = path.removeprefix("/workers/")
                url = next((u for u, i in self.workers.items() if i == wid), None)
                if url is None:
                    return 404, {"code": "WORKER_NOT_FOUND"}
                self.pending.append([self.lag, "remove", url])
                return 202, {"status": "accepted"}
            return 404, {}


@pytest.fixture
def fake() -> Iterator[FakeRouter]:
    router = FakeRouter()
    yield router
    router.close()


async def no_wait(_: float) -> None:
    await anyio.lowlevel.checkpoint()


async def test_register_waits_for_the_asynchronous_job_then_deregister_by_id(
    fake: FakeRouter,
) -> None:
    fake.lag = 3
    async with httpx.AsyncClient(trust_env=False) as http:
        client = RouterClient(http, fake.url, sleep=no_wait)
        worker = await client.register("http://10.0.0.2:30002/")
        assert worker.url == "http://10.0.0.2:30002"
        assert worker.id == str(uuid.uuid5(uuid.NAMESPACE_URL, "http://10.0.0.2:30002"))
        assert "http://10.0.0.2:30002" in fake.workers
        assert await client.register("http://10.0.0.2:30002") == worker  # no second POST
        assert sum(r.startswith("POST /workers") for r in fake.requests) == 1
        assert await client.deregister("http://10.0.0.2:30002")
        assert f"DELETE /workers/{worker.id}" in fake.requests
        assert fake.workers == {}
        assert not await client.deregister("http://10.0.0.2:30002")  # not there: no call


async def test_a_legacy_router_is_driven_through_add_worker_and_remove_worker() -> None:
    fake = FakeRouter(legacy=True)
    try:
        async with httpx.AsyncClient(trust_env=False) as http:
            client = RouterClient(http, fake.url, sleep=no_wait)
            await client.register("http://10.0.0.2:30002")
            assert client.legacy is True
            assert fake.requests[:2] == ["GET /workers", "GET /list_workers"]
            assert "POST /add_worker?url=http%3A%2F%2F10.0.0.2%3A30002" in fake.requests
            assert await client.deregister("http://10.0.0.2:30002")
            assert "POST /remove_worker?url=http%3A%2F%2F10.0.0.2%3A30002" in fake.requests
            assert fake.workers == {}
    finally:
        fake.close()


async def test_busy_answers_are_retried_a_bounded_number_of_times(fake: FakeRouter) -> None:
    fake.busy = 2
    async with httpx.AsyncClient(trust_env=False) as http:
        assert await RouterClient(http, fake.url, sleep=no_wait).workers() == {}
        fake.busy = 10
        with pytest.raises(RouterApiError, match="503"):
            await RouterClient(http, fake.url, sleep=no_wait, tries=3).workers()
        assert fake.busy == 7  # three tries, no more


async def test_a_registration_never_listed_is_reported_not_waited_for_forever(
    fake: FakeRouter,
) -> None:
    fake.lag = 10**6
    async with httpx.AsyncClient(trust_env=False) as http:
        client = RouterClient(http, fake.url, sleep=no_wait, confirm_s=1.0, poll_s=0.25)
        with pytest.raises(RouterApiError, match="did not list it as added within 1s"):
            await client.register("http://10.0.0.2:30002")


# -- the registrar ---------------------------------------------------------------------------


def two_server_config() -> Config:
    return config_from_dict(base_config(), environ={})


def ready(attempt: int = 1) -> ev.ServerReady:
    """A server's server.ready (the registrar only looks at its type)."""
    return ev.ServerReady(attempt=attempt, attempts=1, seconds=30.0, attempt_seconds=30.0,
                          adopted=False, params=LaunchParams(), history=())


async def test_the_registrar_follows_server_events_and_deregisters_before_a_stop(
    fake: FakeRouter,
) -> None:
    config = two_server_config()
    seen: list[tuple[str, ev.Event]] = []
    registrar = Registrar(config, config.routers, [lambda *e: seen.append(e)], resync_s=0.2)
    r1, r2 = "http://127.0.0.1:30001", "http://10.0.0.2:30002"

    async def until(predicate: Any) -> None:
        with anyio.fail_after(10):
            while True:
                if predicate():
                    return
                await anyio.sleep(0.01)

    async with httpx.AsyncClient(trust_env=False) as http, anyio.create_task_group() as tg:
        tg.start_soon(registrar.serve, config.router("front"),
                      RouterClient(http, fake.url, sleep=no_wait))
        await until(lambda: registrar.registration("front") == {
            "r1": "not ready", "r2": "not ready"})
        registrar("r1", ready(1))
        registrar("r2", ev.ProbeFailed(consecutive=1, detail="x"))  # not ready: nothing to do
        await until(lambda: registrar.registration("front")["r1"] == "registered")
        assert set(fake.workers) == {r1}
        registrar("r2", ready(1))
        await until(lambda: registrar.registration("front")["r2"] == "registered")
        assert set(fake.workers) == {r1, r2}

        registrar("r2", ev.ProcessDied(exit_status=1, phase="ready", attempt=1))
        await until(lambda: any(isinstance(e, ev.RouterWorkerDeregistered) for _, e in seen))
        assert set(fake.workers) == {r1}
        gone = [e for _, e in seen if isinstance(e, ev.RouterWorkerDeregistered)]
        assert gone[0].server == "r2" and gone[0].after_s is not None

        # A stop returns only once the router no longer lists the server.
        await registrar.before_stop("r1", "stall")
        assert fake.workers == {}
        assert registrar.registration("front") == {"r1": "not ready", "r2": "not ready"}

        # An operator's removal (or a router restart) is noticed at the next resync.
        registrar("r2", ready(2))
        await until(lambda: registrar.registration("front")["r2"] == "registered")
        assert set(fake.workers) == {r2}
        with fake.lock:
            fake.workers.clear()
        await until(lambda: set(fake.workers) == {r2})
        tg.cancel_scope.cancel()
    assert registrar.registration("front") == {"r1": "router down", "r2": "router down"}


class Unreachable:
    """A transport to a host that cannot be reached: every command fails as a lost
    connection would (a transient error)."""

    host_name = "a"

    async def run(self, argv: Any, **kwargs: Any) -> CommandResult:
        raise HostUnreachable("connection refused", host=self.host_name)


async def test_a_router_host_that_cannot_be_listed_is_asked_again_after_doubling_waits(
) -> None:
    """The router's listing keeps failing: asked again after 0.5 s, 1 s, 2 s, ... up to 10 s,
    exactly those sleeps, each announced as router.listing_failed's retry_in_s (on a fake
    clock and sleep: no time passes)."""
    config = two_server_config()
    time = FakeTime()
    seen: list[tuple[str, dict[str, Any]]] = []

    with anyio.CancelScope() as scope:

        def hook(router: str, event: ev.Event) -> None:
            seen.append((event.name, event.to_dict()))
            if sum(n == "router.listing_failed" for n, _ in seen) == 7:
                scope.cancel()

        sup = RouterSupervisor(config, config.router("front"), Unreachable(),
                               Registrar(config, config.routers), hooks=[hook], clock=time,
                               sleep=time.sleep)
        await sup.run()
    announced = [d["retry_in_s"] for n, d in seen if n == "router.listing_failed"]
    assert [0.5, 1.0, 2.0, 4.0, 8.0, 10.0, 10.0] == announced == time.sleeps
    assert ["router.listing_failed"] == sorted({n for n, _ in seen})  # nothing launched


# -- what the hooks make of the router's events ----------------------------------------------


def test_metrics_show_the_router_and_each_workers_registration() -> None:
    metrics = Metrics()

    def value(name: str, **labels: str) -> float | None:
        return metrics.registry.get_sample_value(name, labels)

    metrics("front", ev.RouterReady(attempt=1, host="gpu-a", port=30000, seconds=3.0,
                                    servers=("r1", "r2")))
    assert value("launcher_router_up", router="front") == 1
    assert value("launcher_router_worker_registered", router="front", server="r2") == 0
    metrics("front", ev.RouterWorkerRegistered(server="r2", url="http://x:1"))
    assert value("launcher_router_worker_registered", router="front", server="r2") == 1
    metrics("front", ev.RouterWorkerDeregistered(server="r2", url="http://x:1",
                                                 reason="not ready", after_s=None))
    assert value("launcher_router_worker_registered", router="front", server="r2") == 0
    metrics("front", ev.RouterWorkerRegistered(server="r1", url="http://x:2"))
    metrics("front", ev.RouterDied(attempt=1, exit_status=137, servers=("r1", "r2")))
    assert value("launcher_router_up", router="front") == 0
    assert value("launcher_router_worker_registered", router="front", server="r1") == 0
    assert value("launcher_server_ready", server="front") is None  # not mistaken for a server


async def test_slack_names_the_router_when_it_is_ready() -> None:
    notifier = SlackNotifier(None, servers_info={})
    with capture_logs() as logs:
        notifier("front", ev.RouterReady(attempt=2, host="gpu-a", port=30000,
                                         seconds=3.9, servers=("r1", "r2", "r3")))
        notifier("front", ev.RouterWorkerRegistered(server="r1", url="http://x:1"))
    [message] = logs
    assert message["event"] == "notify.message"
    assert message["text"] == ("router front is ready on gpu-a:30000 (attempt #2, 4s to ready); "
                               "its workers: r1, r2, r3, each registered once ready")


async def test_a_worker_the_router_is_slow_to_accept_never_delays_a_removal(
    fake: FakeRouter,
) -> None:
    config = two_server_config()
    registrar = Registrar(config, config.routers, resync_s=0.2)
    r2 = "http://10.0.0.2:30002"
    fake.never.add(r2)

    async def until(predicate: Any) -> None:
        with anyio.fail_after(10):
            while True:
                if predicate():
                    return
                await anyio.sleep(0.01)

    async with httpx.AsyncClient(trust_env=False) as http, anyio.create_task_group() as tg:
        client = RouterClient(http, fake.url, sleep=anyio.sleep, confirm_s=60.0, poll_s=0.05)
        tg.start_soon(registrar.serve, config.router("front"), client)
        registrar("r1", ready())
        await until(lambda: registrar.registration("front")["r1"] == "registered")
        registrar("r2", ready())  # its registration now waits on the router
        await until(lambda: r2 in fake.posted)
        registrar("r1", ev.ServerUnhealthy(consecutive_failures=3, detail="x"))
        await until(lambda: registrar.registration("front") == {
            "r1": "not ready", "r2": "pending"})
        assert fake.workers == {}
        tg.cancel_scope.cancel()
