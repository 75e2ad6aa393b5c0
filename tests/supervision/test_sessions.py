"""Sessions per host: a stock sshd (MaxSessions 10) serves more long-lived streams than that.

The transport caps the exec sessions of each connection and opens more connections; a host
whose MaxSessions is lower than the cap is learnt from its refusals. Real sshd, no mocks.
"""

from __future__ import annotations

import os
import signal
import time
from collections.abc import AsyncIterator, Iterator
from contextlib import AsyncExitStack
from pathlib import Path
from typing import Any

import anyio
import pytest
from structlog.testing import capture_logs

from launcher.host.transport.ssh import SESSIONS_PER_CONNECTION, SSHTransport
from launcher.supervise.lifecycle import State
from tests.simhost import free_ports
from tests.sshd import Sshd
from tests.sshsim import EventRecorder, Site, kill_leftovers, server_entry, ssh_config
from tests.test_ssh_e2e import ssh_transports, supervising, supervisor, wait_until

pytestmark = pytest.mark.ssh

# Waits until its gate file exists, after saying it started: a follower's long-lived session.
_HOLD = 'echo "up $1"; while [ ! -e "$2" ]; do sleep 0.05; done; echo "done $1"'


@pytest.fixture
def stock_sshd(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Sshd]:
    """A real sshd whose sshd_config leaves MaxSessions at OpenSSH's default."""
    daemon = Sshd(tmp_path_factory.mktemp("stock-sshd"), max_sessions=None)
    daemon.start()
    yield daemon
    daemon.stop()


@pytest.fixture
def tight_sshd(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Sshd]:
    """A real sshd that allows only 3 sessions per connection (below our cap of 8)."""
    daemon = Sshd(tmp_path_factory.mktemp("tight-sshd"), max_sessions=3)
    daemon.start()
    yield daemon
    daemon.stop()


def _transport(daemon: Sshd, **overrides: Any) -> SSHTransport:
    return SSHTransport("gpu1", **{**daemon.transport_kwargs(), **overrides})


async def _first_chunk(stream: AsyncIterator[bytes]) -> bytes:
    return await stream.__anext__()


async def _hold_streams(t: SSHTransport, count: int, gate: Path, stack: AsyncExitStack) -> list[
    bytes
]:
    """Open ``count`` streams at once that stay open until ``gate`` exists; their first
    lines, in stream order."""
    firsts: dict[int, bytes] = {}

    async def one(i: int) -> None:
        stream = t.stream(["sh", "-c", _HOLD, "sh", str(i), str(gate)])
        stack.push_async_callback(stream.aclose)  # type: ignore[attr-defined]
        firsts[i] = await _first_chunk(stream)

    with anyio.fail_after(30):
        async with anyio.create_task_group() as tg:
            for i in range(count):
                tg.start_soon(one, i)
    return [firsts[i] for i in range(count)]


def test_sshd_fixture_leaves_max_sessions_at_the_default(stock_sshd: Sshd) -> None:
    """The stock fixture really is stock: no MaxSessions line in its sshd_config."""
    assert "MaxSessions" not in stock_sshd.config_file.read_text()


async def test_sixteen_streams_and_commands_on_a_stock_sshd(
    stock_sshd: Sshd, tmp_path: Path
) -> None:
    """16 long-lived streams (one per server's follower) plus 8 concurrent commands all run
    behind MaxSessions 10: the pool opens connections of at most 8 sessions, none refused."""
    gate = tmp_path / "gate"
    t = _transport(stock_sshd)
    results: list[bytes] = []
    try:
        with capture_logs() as logs:
            async with AsyncExitStack() as stack:
                firsts = await _hold_streams(t, 16, gate, stack)
                held = (t.sessions_open, t.connections_open)

                async def call(i: int) -> None:
                    results.append((await t.run(["echo", str(i)], timeout=20)).stdout)

                async with anyio.create_task_group() as tg:
                    for i in range(8):
                        tg.start_soon(call, i)
                gate.touch()
            after = t.sessions_open
    finally:
        await t.aclose()
    assert [f"up {i}\n".encode() for i in range(16)] == firsts
    assert (16, 2) == held
    assert sorted(f"{i}\n".encode() for i in range(8)) == sorted(results)
    assert 0 == after
    assert [] == [e for e in logs if e["event"] == "ssh.session_refused"]
    assert 16 // SESSIONS_PER_CONNECTION + 1 <= stock_sshd.accepted_logins() <= 4


async def test_a_lower_max_sessions_is_learnt_from_refusals(
    tight_sshd: Sshd, tmp_path: Path
) -> None:
    """Against MaxSessions 3 with the default cap of 8, ten streams still all open: each
    refusal lowers that connection's cap and the session goes to another connection."""
    gate = tmp_path / "gate"
    t = _transport(tight_sshd)
    try:
        with capture_logs() as logs:
            async with AsyncExitStack() as stack:
                firsts = await _hold_streams(t, 10, gate, stack)
                connections = t.connections_open
                gate.touch()
    finally:
        await t.aclose()
    refused = [e for e in logs if e["event"] == "ssh.session_refused"]
    assert [f"up {i}\n".encode() for i in range(10)] == firsts
    assert 4 == connections  # ceil(10 / 3)
    # Streams opened concurrently count in-flight opens too, so a cap may first drop to
    # something above 3, never below what the host accepted.
    assert refused and all(e["cap"] >= 3 for e in refused)


async def test_sessions_per_connection_is_honoured(stock_sshd: Sshd, tmp_path: Path) -> None:
    """An explicit cap of 2 puts 5 streams on 3 connections."""
    gate = tmp_path / "gate"
    t = _transport(stock_sshd, sessions_per_connection=2)
    try:
        async with AsyncExitStack() as stack:
            await _hold_streams(t, 5, gate, stack)
            counts = (t.sessions_open, t.connections_open)
            gate.touch()
    finally:
        await t.aclose()
    assert (5, 3) == counts


class _Relay:
    """A TCP relay to an sshd whose client-to-server direction can be held: what the client
    sends meanwhile is kept and then written in one piece, so sshd reads it in one go."""

    def __init__(self, target: int) -> None:
        self.target = target
        self.flowing = anyio.Event()
        self.flowing.set()
        self.held = 0  # bytes kept while held

    def hold(self) -> None:
        self.flowing = anyio.Event()

    async def serve(self, listener: anyio.abc.SocketListener) -> None:
        async def pump_up(client: anyio.abc.SocketStream, server: anyio.abc.SocketStream,
                          ) -> None:
            kept = bytearray()
            while True:
                with anyio.move_on_after(0.01):  # wake now and then to see a release
                    kept += await client.receive()
                if not self.flowing.is_set():
                    self.held = len(kept)
                    continue
                if kept:
                    await server.send(bytes(kept))
                    kept.clear()

        async def pump_down(server: anyio.abc.SocketStream, client: anyio.abc.SocketStream,
                            ) -> None:
            async for chunk in server:
                await client.send(chunk)

        async def handle(client: anyio.abc.SocketStream) -> None:
            server = await anyio.connect_tcp("127.0.0.1", self.target)
            async with client, server, anyio.create_task_group() as tg:
                tg.start_soon(pump_up, client, server)
                tg.start_soon(pump_down, server, client)

        async with listener:
            await listener.serve(handle)


async def test_a_session_refused_while_our_closes_wait_in_sshd_is_asked_again(
    stock_sshd: Sshd, tmp_path: Path
) -> None:
    """sshd frees a finished session only once it has read our close of its channel; an open
    read together with such closes is refused ("no more sessions") though those sessions are
    over. The transport asks again on the same connection and gets it: no session_refused
    warning, the connection's cap stays. (On a busy host sshd reads in bigger batches: this
    made the 16-server test below flaky.) Staged through a relay holding our bytes."""
    listener = await anyio.create_tcp_listener(local_host="127.0.0.1", local_port=0)
    relay = _Relay(stock_sshd.port)
    relay_port = listener.extra(anyio.abc.SocketAttribute.local_port)
    known_hosts = tmp_path / "known_hosts"
    known_hosts.write_text(f"[{stock_sshd.host}]:{relay_port} {stock_sshd.host_public_key}\n")
    # One connection of 10 sessions: exactly what a stock sshd (MaxSessions 10) allows.
    t = _transport(stock_sshd, port=relay_port, known_hosts=known_hosts,
                   sessions_per_connection=10)
    gate, done = tmp_path / "gate", tmp_path / "done"
    try:
        async with anyio.create_task_group() as tg:
            tg.start_soon(relay.serve, listener)
            with capture_logs() as logs:
                async with AsyncExitStack() as stack:
                    await _hold_streams(t, 7, gate, stack)
                    short = [t.stream(["sh", "-c", _HOLD, "sh", str(i), str(done)])
                             for i in range(3)]
                    for stream in short:
                        await _first_chunk(stream)
                    assert (10, 1) == (t.sessions_open, t.connections_open)
                    relay.hold()
                    done.touch()  # the 3 commands end; our closes of them wait in the relay
                    with anyio.fail_after(30):
                        for stream in short:
                            async for _ in stream:
                                pass
                    assert 7 == t.sessions_open

                    async def echo() -> bytes:
                        return (await t.run(["echo", "again"], timeout=20)).stdout

                    async with anyio.create_task_group() as inner:
                        result: list[bytes] = []
                        inner.start_soon(lambda: _append(result, echo()))
                        await wait_until(lambda: relay.held > 0 and t.sessions_open == 8, 10,
                                         EventRecorder(), "the open held behind the closes")
                        relay.flowing.set()
                    connections = t.connections_open
                    gate.touch()
            tg.cancel_scope.cancel()
    finally:
        await t.aclose()
    assert [b"again\n"] == result
    assert 1 == connections
    assert [] == [e for e in logs if e["event"] == "ssh.session_refused"]
    asked = [e for e in logs if e["event"] == "ssh.session_asked_again"]
    assert len(asked) <= 1


async def _append(into: list[bytes], value: Any) -> None:
    into.append(await value)


# -- 16 servers on one stock sshd, end to end ------------------------------------------------


@pytest.mark.slow
@pytest.mark.timeout(300)  # 16 sim servers starting at once on a loaded 2-core box
async def test_sixteen_servers_on_one_stock_sshd_become_ready_and_stay_supervised(
    stock_sshd: Sshd, tmp_path: Path
) -> None:
    """16 simulated servers on one host behind an unmodified sshd_config (MaxSessions 10) all
    become ready with one attempt each and no refused session, all 16 followers holding a
    session at once; afterwards SIGKILLs of two of them are each noticed by that server's own
    follower and relaunched to ready."""
    site = Site.create(tmp_path, "gpu1", stock_sshd, gpu_count=16)
    names = [f"llm{i:02d}" for i in range(16)]
    # Ports no other test worker can be given before these servers bind them (free_ports).
    ports = free_ports(16)
    config = ssh_config(tmp_path, [site.host_entry()], [
        server_entry(name, site, gpus=[i], port=ports[i]) for i, name in enumerate(names)
    ])
    events = EventRecorder()
    victims = [names[0], names[15]]
    try:
        async with ssh_transports(config) as transports:
            sups = [supervisor(config, name, transports, events) for name in names]
            with capture_logs() as logs:
                async with supervising(*sups):
                    started = time.monotonic()
                    await wait_until(lambda: all(s.state is State.READY for s in sups), 120,
                                     events, "all 16 ready")
                    print(f"16 servers ready in {time.monotonic() - started:.1f} s")
                    pool = (transports["gpu1"].sessions_open,
                            transports["gpu1"].connections_open)
                    for name in victims:
                        os.kill(site.server_pid(name, 1), signal.SIGKILL)
                    await wait_until(
                        lambda: all(len(events.named("server.ready", n)) == 2 for n in victims)
                        and all(s.state is State.READY for s in sups),
                        120, events, "the killed two ready again",
                    )
    finally:
        kill_leftovers([site.run_dir])
    assert set(names) == {e.server for e in events.named("server.ready")}
    assert sorted(victims) == sorted(e.server for e in events.named("process.died"))
    assert {n: (2 if n in victims else 1) for n in names} == {
        n: len(events.named("attempt.started", n)) for n in names
    }
    assert [] == [e for e in logs if e["event"] == "ssh.session_refused"]
    assert sorted(victims) == sorted(e.server for e in events.named("attempt.failed"))
    assert [] == events.named("adopt.failed") + events.named("host.unreachable")
    assert pool[0] >= 16 and pool[1] >= 2  # 16 followers: more than one connection
