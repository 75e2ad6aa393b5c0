"""The supervisor's probe (launcher.host.health.probe_health): one plain HTTP/1.1 GET against real
sockets, locally and over a real sshd's direct channel."""

from __future__ import annotations

import socket
import threading
from collections.abc import Iterator
from contextlib import contextmanager

import anyio
import pytest

from launcher.host import health
from launcher.host.transport.local import LocalTransport
from launcher.host.transport.ssh import SSHTransport
from tests.hostile_http import HostileHttp
from tests.sshd import Sshd


@contextmanager
def answering(reply: bytes) -> Iterator[int]:
    """A server on 127.0.0.1 that answers every connection with ``reply`` and hangs up; its
    port. The requests it read are not kept."""
    listener = socket.create_server(("127.0.0.1", 0))
    listener.settimeout(0.1)
    stop = threading.Event()

    def serve() -> None:
        while not stop.is_set():
            try:
                conn, _ = listener.accept()
            except TimeoutError:
                continue
            with conn:
                conn.recv(65536)
                conn.sendall(reply)

    thread = threading.Thread(target=serve, daemon=True)
    thread.start()
    try:
        yield int(listener.getsockname()[1])
    finally:
        stop.set()
        thread.join(5)
        listener.close()


async def probe(port: int, deadline: float = 5.0) -> tuple[bool, str]:
    connect = health.prober_for(LocalTransport("here"), port, "127.0.0.1")
    return await health.probe_health(connect, deadline)


async def test_a_200_is_healthy_and_a_huge_body_is_not_read() -> None:
    with HostileHttp("huge", body_len=800 << 20) as srv:
        result = await probe(srv.port)
        await anyio.sleep(0.2)
    assert (True, "HTTP 200") == result
    assert srv.sent < 64 << 20, srv.sent


async def test_a_503_is_unhealthy_with_its_code() -> None:
    with answering(b"HTTP/1.1 503 Service Unavailable\r\nContent-Length: 0\r\n\r\n") as port:
        assert (False, "HTTP 503") == await probe(port)


async def test_a_status_line_in_pieces_is_still_read() -> None:
    with HostileHttp("trickle", body_len=1000, every_s=0.2) as srv:
        assert (True, "HTTP 200") == await probe(srv.port, 2.0)


async def test_an_answer_that_is_not_http_is_a_protocol_error() -> None:
    with answering(b"SSH-2.0-OpenSSH_9.6\r\n") as port:
        ok, detail = await probe(port)
    assert not ok
    assert detail.startswith("RemoteProtocolError: not an HTTP answer: b'SSH-2.0"), detail


async def test_silence_ends_at_the_deadline() -> None:
    listener = socket.create_server(("127.0.0.1", 0))  # accepts (backlog), never answers
    try:
        result = await probe(int(listener.getsockname()[1]), 0.3)
    finally:
        listener.close()
    assert (False, "no complete answer within 0.3s") == result


async def test_nothing_listening_is_a_connection_error() -> None:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = int(s.getsockname()[1])
    ok, detail = await probe(port)
    assert not ok
    assert detail.startswith("OSError: "), detail


@pytest.mark.parametrize("address", ["127.0.0.2", "::1"])
async def test_a_local_probe_dials_the_address_the_server_listens_on(address: str) -> None:
    """The local transport probes ``address`` itself: a server bound only there is healthy,
    and would be refused at 127.0.0.1."""
    with HostileHttp("huge", body_len=2, host=address) as srv:
        connect = health.prober_for(LocalTransport("here"), srv.port, address)
        at_listen = await health.probe_health(connect, 5.0)
        at_loopback = await probe(srv.port)
    assert (True, "HTTP 200") == at_listen
    assert (False, "OSError: All connection attempts failed") == at_loopback


@pytest.mark.ssh
async def test_over_ssh_the_probe_rides_a_channel_without_any_local_socket(
    sshd_host: Sshd,
) -> None:
    t = SSHTransport("gpu1", **sshd_host.transport_kwargs())  # type: ignore[arg-type]
    try:
        with HostileHttp("huge", body_len=2) as srv:
            connect = health.prober_for(t, srv.port, "127.0.0.1")
            first = await health.probe_health(connect, 10.0)
            second = await health.probe_health(connect, 10.0)
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            closed = int(s.getsockname()[1])
        refused = await health.probe_health(health.prober_for(t, closed, "127.0.0.1"), 10.0)
        with HostileHttp("huge", body_len=2, host="127.0.0.2") as srv:
            specific = await health.probe_health(health.prober_for(t, srv.port, "127.0.0.2"),
                                                 10.0)
        connections = t.connections_open
    finally:
        await t.aclose()
    assert [(True, "HTTP 200")] * 2 == [first, second]
    assert not refused[0]
    assert refused[1].startswith("TransportError: gpu1 refused a channel to port"), refused
    assert (True, "HTTP 200") == specific  # sshd dialled the address the server listens on
    assert 1 == connections
