"""Security review 2026-12-05, findings M9, L4 and L5: a port another user takes during a
restart is waited for, not a reason to give up at once (M9); terminal escapes from run-dir
files never reach the terminal through the console log (L4); idle connections to the metrics
endpoint cost neither a thread nor a descriptor for long (L5).

Each test reproduces the attack of the review with the real parts: the simulated GPU host and
its real servers, the real CLI as a subprocess, real sockets and HTTP; "another local user" is
``nobody`` through ``setpriv``.
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path
from typing import Any

import httpx
import pytest
from prometheus_client import CollectorRegistry, start_http_server

from launcher.errors import RemoteCommandError
from launcher.hooks.metrics import Metrics
from launcher.host.preflight import PortHolder as Holder
from launcher.host.preflight import port_holder
from launcher.host.transport.base import CommandResult
from launcher.host.transport.local import LocalTransport
from launcher.supervise.lifecycle import State
from tests.simhost import REPO
from tests.supervise import Recorded, Recorder, SimSetup, run_cli, supervise

pytestmark = pytest.mark.timeout(90)


# --- M9: a port taken by another user during a restart -------------------------------------

# Binds 127.0.0.1:PORT the way the review's attacker did (SO_REUSEADDR, listening), says so,
# and holds it until killed.
HOLD = """
import socket, sys, time
s = socket.socket()
s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
s.bind(("127.0.0.1", int(sys.argv[1])))
s.listen()
print("listening", flush=True)
time.sleep(600)
"""

NOBODY = 65534


def as_another_user() -> list[str]:
    """The argv prefix that runs a command as ``nobody`` (the test runs as root, as in CI);
    as this same user where that is impossible."""
    if os.geteuid() == 0 and shutil.which("setpriv"):
        return ["setpriv", "--reuid=nobody", "--regid=nogroup", "--clear-groups"]
    return []


def holder_uid() -> int:
    return NOBODY if as_another_user() else os.getuid()


class PortHolder:
    """A process of another user that listens on ``port`` until ``release()``."""

    def __init__(self, port: int) -> None:
        # The system's python: nobody may not be able to read the test's venv.
        python = "/usr/bin/python3" if as_another_user() else sys.executable
        self.proc = subprocess.Popen([*as_another_user(), python, "-c", HOLD, str(port)],
                                     stdout=subprocess.PIPE, text=True, start_new_session=True)
        assert self.proc.stdout is not None
        assert "listening" == self.proc.stdout.readline().strip(), "the holder did not bind"
        self.pid = self.proc.pid

    def release(self) -> None:
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGKILL)  # our own child: Popen knows it
        self.proc.wait()
        if self.proc.stdout is not None:
            self.proc.stdout.close()


@contextlib.contextmanager
def holders() -> Iterator[list[PortHolder]]:
    started: list[PortHolder] = []
    try:
        yield started
    finally:
        for h in started:
            h.release()


def kill_when_ready(sim: SimSetup) -> Callable[[Recorded], None]:
    """SIGKILL attempt 1's server once it was reported ready: a death while serving."""

    def kill(e: Recorded) -> None:
        if e.name == "server.ready" and e.data["attempts"] == 1:
            os.kill(sim.pid(1), signal.SIGKILL)  # sim.pid checks it is the server we started

    return kill


def take_port_in_backoff(sim: SimSetup, held: list[PortHolder]) -> Callable[[Recorded], None]:
    """On the restart's backoff (``restart.scheduled``), another user binds the port."""

    def take(e: Recorded) -> None:
        if e.name == "restart.scheduled" and not held:
            held.append(PortHolder(sim.port))

    return take


async def test_port_taken_by_another_user_in_the_backoff_is_waited_for_then_relaunched(
    sim: SimSetup,
) -> None:
    """The review's repro: the server ready, SIGKILLed, and another user binds its port during
    the restart backoff. The preflight reports ``port.waiting`` naming the holder's uid and
    pid and waits; once the holder is gone the server is relaunched and ready again. Before
    the fix: ``server.gave_up`` at once, "preflight: port ... is already in use"."""
    with holders() as held:

        def release_when_reported(e: Recorded) -> None:
            if e.name == "port.waiting" and held:
                held[0].release()

        rec = Recorder(on=[kill_when_ready(sim), take_port_in_backoff(sim, held),
                           release_when_reported])
        config = sim.config(mem_fraction_static=0.8, cuda_graph_max_bs=8)
        result = await supervise(config, until=lambda r: r.has("server.ready", 2), recorder=rec)

    assert State.READY == result.supervisor.state, rec.summary()
    assert not rec.has("server.gave_up")
    [waiting] = rec.of("port.waiting")
    assert (sim.port, holder_uid(), held[0].pid) == (
        waiting["port"], waiting["uid"], waiting["pid"]), waiting
    assert f"uid {holder_uid()}" in waiting["holder"] and f"pid {held[0].pid}" in waiting["holder"]
    names = rec.names()
    assert names.index("restart.scheduled") < names.index("port.waiting")
    assert names.index("port.waiting") < names.index("attempt.started", 1)
    assert [1, 2] == [s["attempt"] for s in rec.of("attempt.started")]


async def test_port_held_past_gpu_free_timeout_gives_up_naming_the_holder(
    sim: SimSetup,
) -> None:
    """The holder never lets go: launcher gives up, naming the holder, only once the wait's
    bound (``gpu_free_timeout``, 30 s) has passed on its clock. The clock is moved 31 s on
    when the wait is first reported, so no real 30 s pass; a give-up before the move would
    be a give-up within the bound."""
    skew = [0.0]
    clock_at: dict[str, float] = {}

    def jump_the_clock(e: Recorded) -> None:
        if e.name == "port.waiting" and not skew[0]:
            skew[0] = 31.0
        if e.name == "server.gave_up":
            clock_at["gave_up_skew"] = skew[0]

    with holders() as held:
        rec = Recorder(on=[kill_when_ready(sim), take_port_in_backoff(sim, held),
                           jump_the_clock])
        config = sim.config(mem_fraction_static=0.8, cuda_graph_max_bs=8,
                            policy={"gpu_free_timeout": "30s"})
        result = await supervise(config, recorder=rec,
                                 clock=lambda: time.monotonic() + skew[0])
        holder_pid = held[0].pid

    assert State.GAVE_UP == result.state, rec.summary()
    assert 31.0 == clock_at["gave_up_skew"], "gave up within the bound"
    [waiting] = rec.of("port.waiting")
    assert (holder_uid(), holder_pid, 30.0) == (waiting["uid"], waiting["pid"], waiting["wait_s"])
    reason = rec.of("server.gave_up")[0]["reason"]
    assert reason.startswith(f"preflight: port {sim.port} is already in use on simhost"), reason
    assert f"uid {holder_uid()}" in reason and f"pid {holder_pid}" in reason, reason
    assert "(gpu_free_timeout)" in reason, reason
    assert [1] == [s["attempt"] for s in rec.of("attempt.started")]


@pytest.mark.skipif(not as_another_user(), reason="needs root and setpriv to be another user")
async def test_port_held_by_another_user_at_the_first_start_is_waited_for(
    sim: SimSetup,
) -> None:
    """Before the server was ever ready, a port held by *another* user is waited for too (the
    attacker can bind before launcher starts as well as during a restart); a holder of
    launcher's own user is a setup mistake and refused at once
    (test_supervisor.py::test_port_taken_before_start_is_refused_by_preflight)."""
    with holders() as held:
        held.append(PortHolder(sim.port))

        def release_when_reported(e: Recorded) -> None:
            if e.name == "port.waiting":
                held[0].release()

        rec = Recorder(on=[release_when_reported])
        config = sim.config(mem_fraction_static=0.8, cuda_graph_max_bs=8)
        result = await supervise(config, until=lambda r: r.has("server.ready"), recorder=rec)

    assert State.READY == result.supervisor.state, rec.summary()
    assert NOBODY == rec.of("port.waiting")[0]["uid"]
    assert [1] == [s["attempt"] for s in rec.of("attempt.started")]


def host_without_python3(tmp_path: Path) -> LocalTransport:
    """The local host with a PATH of only the tools the port check's fallback uses."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    for tool in ("sh", "ss", "head", "sed", "stat", "id"):
        found = shutil.which(tool)
        assert found is not None, f"{tool} is not installed"
        (bin_dir / tool).symlink_to(found)
    return LocalTransport("bare", env={"PATH": str(bin_dir)})


async def test_port_holder_without_python3_reads_ss(tmp_path: Path) -> None:
    """A host without python3: the holder comes from ``ss -ltnp`` (here root sees the pid)."""
    host = host_without_python3(tmp_path)
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        sock.listen()
        port = sock.getsockname()[1]
        held = await port_holder(host, port)
    assert Holder(uid=os.getuid(), pid=os.getpid(), ours=True) == held
    assert await port_holder(host, port) is None


class Answers(LocalTransport):
    """A host whose port check prints ``stdout``."""

    def __init__(self, stdout: bytes) -> None:
        super().__init__("odd")
        self.stdout = stdout

    async def run(self, argv: Sequence[str], **kwargs: Any) -> CommandResult:
        return CommandResult(0, self.stdout, b"")


@pytest.mark.parametrize("stdout", [b"", b"garbage", b"[1]", b"1x"])
async def test_a_port_check_answer_that_is_not_one_is_an_error_naming_it(stdout: bytes) -> None:
    with pytest.raises(RemoteCommandError, match="port check on odd printed"):
        await port_holder(Answers(stdout), 30000)


async def test_a_hosts_port_holder_fields_are_bounded() -> None:
    """Fields of the wrong type or size from a host are dropped or cut, never trusted."""
    answer = {"busy": True, "me": 0, "uid": True, "pid": -5, "user": "x" * 500, "command": 7}
    held = await port_holder(Answers(json.dumps(answer).encode()), 30000)
    assert Holder(user="x" * 64) == held


# --- L4: terminal escapes from run-dir files ------------------------------------------------

ESCAPES = "\x1b]0;PWNED-title\x07\x1b[2J\x9b31m"


def test_status_console_log_shows_escapes_from_a_forged_pid_file(sim: SimSetup) -> None:
    """The review's repro: an attempt whose ``pid`` holds an OSC title, a clear-screen and a
    C1 CSI. ``launcher status``'s console warning (``remote.attempt_corrupt``) shows them as
    ``\\xNN``; no raw ESC, BEL or C1 control reaches stderr."""
    d = sim.attempt_dir(1)
    d.mkdir(parents=True)
    (d / "pid").write_text(ESCAPES + "\n")  # no space: structlog would repr() the value
    config = sim.write_toml(sim.data(mem_fraction_static=0.8, cuda_graph_max_bs=8))

    status = run_cli("status", str(config))

    assert "remote.attempt_corrupt" in status.stderr, status.stderr
    raw = status.stderr
    assert "\x1b" not in raw and "\x07" not in raw and "\x9b" not in raw, repr(raw)
    assert "PWNED-title" in raw and "\\x1b]0;" in raw, raw


# --- L5: idle connections to the metrics endpoint ---------------------------------------------

# The real endpoint (``Metrics.serve``) in a process of its own, so that its threads and
# descriptors can be counted apart from the test's; argv: read_timeout, max_connections.
SERVE = """
import sys, time
from launcher.hooks.metrics import Metrics
server = Metrics().serve("127.0.0.1", 0, read_timeout=float(sys.argv[1]),
                         max_connections=int(sys.argv[2]))
print(server.port, flush=True)
time.sleep(600)
"""


def threads_and_fds(pid: int) -> tuple[int, int]:
    return len(os.listdir(f"/proc/{pid}/task")), len(os.listdir(f"/proc/{pid}/fd"))


@pytest.fixture
def metrics_endpoint() -> Iterator[tuple[subprocess.Popen[str], int]]:
    """The endpoint with a 3 s read timeout and at most 16 connections: (process, port)."""
    proc = subprocess.Popen([sys.executable, "-c", SERVE, "3", "16"], cwd=REPO,
                            stdout=subprocess.PIPE, text=True)
    try:
        assert proc.stdout is not None
        line = ""
        while not line.strip().isdigit():  # past structlog's metrics.serving line
            line = proc.stdout.readline()
            assert line, "the endpoint did not start"
        yield proc, int(line)
    finally:
        proc.kill()  # our own child
        proc.wait()
        if proc.stdout is not None:
            proc.stdout.close()


def scrape(port: int) -> httpx.Response:
    return httpx.get(f"http://127.0.0.1:{port}/metrics", timeout=30.0)


def test_idle_metrics_connections_are_capped_and_closed_and_scrapes_still_answer(
    metrics_endpoint: tuple[subprocess.Popen[str], int],
) -> None:
    """The review's repro, from one process: 200 idle connections. The endpoint's threads and
    descriptors stay within the cap (16) of where they were, a scrape made while the idle
    connections are open answers 200 with the metrics, and every idle connection is closed by
    the endpoint (the oldest when newer ones come, the rest after the read timeout). Before
    the fix (prometheus-client's ``start_http_server``): one thread and one descriptor per idle
    connection, for as long as the client keeps it."""
    proc, port = metrics_endpoint
    assert 200 == scrape(port).status_code
    threads0, fds0 = threads_and_fds(proc.pid)

    idle = [socket.create_connection(("127.0.0.1", port), timeout=30.0) for _ in range(200)]
    try:
        # Connections are accepted in order: once this scrape is answered, all 200 were.
        answer = scrape(port)
        threads, fds = threads_and_fds(proc.pid)
        print(f"endpoint with 200 idle connections: threads {threads0} -> {threads}, "
              f"descriptors {fds0} -> {fds}")
        assert 200 == answer.status_code
        assert "launcher_build_info" in answer.text
        assert threads <= threads0 + 16 and fds <= fds0 + 16, (threads0, threads, fds0, fds)

        for conn in idle:  # the endpoint closes each one (EOF, or a reset)
            with contextlib.suppress(ConnectionResetError):
                assert b"" == conn.recv(1)
    finally:
        for conn in idle:
            conn.close()
    assert 200 == scrape(port).status_code


@pytest.mark.parametrize("headers, query", [
    ({}, ""),
    ({"Accept": "application/openmetrics-text; version=1.0.0"}, ""),
    ({"Accept-Encoding": "gzip"}, ""),
    ({}, "?name[]=launcher_build_info"),
])
def test_the_bounded_endpoint_exposes_what_prometheus_client_does(
    headers: dict[str, str], query: str,
) -> None:
    """Same registry, prometheus-client's own ``start_http_server`` beside ``Metrics.serve``:
    status, content type and encoding, and body are the same."""
    metrics = Metrics(registry=CollectorRegistry())  # no process collector: values stay put
    theirs, thread = start_http_server(0, addr="127.0.0.1", registry=metrics.registry)
    try:
        with metrics.serve("127.0.0.1", 0) as ours:
            answers = [
                httpx.get(f"http://127.0.0.1:{port}/metrics{query}", headers=headers)
                for port in (theirs.server_port, ours.port)
            ]
    finally:
        theirs.shutdown()
        theirs.server_close()
        thread.join()
    expected, got = answers
    assert 200 == got.status_code
    for name in ("content-type", "content-encoding"):
        assert expected.headers.get(name) == got.headers.get(name), name
    assert expected.content == got.content
