"""Bounded HTTP health checks: the whole request has a deadline and the body a size cap.

Two ways. :func:`check` / :func:`client_for` use httpx (the CLI's one-off checks).
:func:`probe_health` / :func:`prober_for` (the supervisor's probes, one every few seconds per
server) send one plain ``GET /health HTTP/1.1`` with ``Connection: close`` and read only the
status line: no client object, TLS context or connection pool per server, and over SSH no
local socket at all (a direct-tcpip channel on the transport's connection).

httpx's ``timeout`` applies to each read, so a server that trickles its body one byte at a
time would hold a plain ``client.get`` for ever, and ``get`` reads a body of any size into
memory. ``check`` reads at most MAX_BODY bytes of the body, raw (never decompressed: a small
gzip body cannot expand), and gives up at the deadline whatever the server is doing.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import asynccontextmanager

import anyio
import httpx

from launcher.errors import HostKeyError, LauncherError
from launcher.host.transport.base import Transport
from launcher.host.transport.fenced import fence_of
from launcher.untrusted import bounded_int

MAX_BODY = 4096  # bytes of a /health body read; the rest is dropped with the connection


async def check(client: httpx.AsyncClient, url: str, deadline_s: float) -> tuple[bool, str]:
    """GET ``url``: (whether it answered 200, a short detail such as ``HTTP 200``).

    Never raises for the server's sake: a connection error, a timeout or a body cut at
    MAX_BODY is a detail, not an exception.
    """
    try:
        with anyio.fail_after(deadline_s):
            async with client.stream("GET", url) as resp:
                got = 0
                async for chunk in resp.aiter_raw():
                    got += len(chunk)
                    if got >= MAX_BODY:
                        break
                return resp.status_code == 200, f"HTTP {resp.status_code}"
    except TimeoutError:
        return False, f"no complete answer within {deadline_s:g}s"
    except httpx.HTTPError as exc:
        return False, f"{type(exc).__name__}: {exc}"


@asynccontextmanager
async def client_for(
    transport: Transport, remote_port: int, address: str, timeout_s: float,
) -> AsyncIterator[tuple[httpx.AsyncClient, str]]:
    """An HTTP client reaching ``address``:``remote_port`` on the host, and its /health URL.
    ``address`` is the one the server listens on, or the loopback for a wildcard
    (launcher.config.schema.probe_address).

    A transport that can forward to a Unix socket (SSH: ``forward_unix``, in a 0700
    directory) is used that way, so no local TCP port exposes the server to the other users
    of this machine; otherwise ``forward_port`` (the local transport: the address itself).
    """
    # Behind a fence ([coordination]), every request checks it: a router's worker
    # registration over this long-lived client is a host action too (docs/ha.md).
    fence = fence_of(transport)
    hooks: dict[str, list[Callable[[httpx.Request], Awaitable[None]]]] = {}
    if fence is not None:
        async def fenced(request: httpx.Request) -> None:
            fence.check(f"{request.method} {request.url.path} on {transport.host_name}")
        hooks["request"] = [fenced]
    forward_unix = getattr(transport, "forward_unix", None)
    if forward_unix is not None:
        async with forward_unix(remote_port, address) as path, httpx.AsyncClient(
            transport=httpx.AsyncHTTPTransport(uds=path), timeout=timeout_s, trust_env=False,
            event_hooks=hooks,
        ) as client:
            yield client, "http://localhost/health"
        return
    async with transport.forward_port(remote_port, address) as (here, port), httpx.AsyncClient(
        timeout=timeout_s, trust_env=False, event_hooks=hooks,
    ) as client:
        host = f"[{here}]" if ":" in here else here
        yield client, f"http://{host}:{port}/health"


_REQUEST = (b"GET /health HTTP/1.1\r\nHost: 127.0.0.1\r\nUser-Agent: launcher\r\n"
            b"Accept: */*\r\nConnection: close\r\n\r\n")

Connect = Callable[[], Awaitable[anyio.abc.ByteStream]]


def status_code(text: bytes) -> int | None:
    """An HTTP status code: exactly three ASCII digits (RFC 9110 section 15), else None."""
    return bounded_int(text, max_digits=3) if len(text) == 3 else None


async def probe_health(connect: Connect, deadline_s: float) -> tuple[bool, str]:
    """GET /health on a fresh stream from ``connect``: (whether it answered 200, a detail:
    ``HTTP 503``, ``no complete answer within 5s``, or the error's type and message).

    Only the status line is read (at most MAX_BODY bytes): the verdict is the status code.
    Never raises for the server's sake; HostKeyError propagates (that host must not be
    asked anything).
    """
    try:
        with anyio.fail_after(deadline_s):
            stream = await connect()
            try:
                await stream.send(_REQUEST)
                head = b""
                # at most MAX_BODY bytes in total, not per read
                while b"\r\n" not in head and len(head) < MAX_BODY:
                    try:
                        head += await stream.receive(MAX_BODY - len(head))
                    except anyio.EndOfStream:
                        break
                head = head[:MAX_BODY]
            finally:
                with anyio.CancelScope(shield=True):
                    await stream.aclose()
    except TimeoutError:
        return False, f"no complete answer within {deadline_s:g}s"
    except HostKeyError:
        raise
    except (OSError, LauncherError, anyio.BrokenResourceError, anyio.ClosedResourceError) as exc:
        return False, f"{type(exc).__name__}: {exc}"
    line = head.partition(b"\r\n")[0].split()
    code = status_code(line[1]) if len(line) >= 2 and line[0].startswith(b"HTTP/") else None
    if code is None:
        if not head:
            return False, "RemoteProtocolError: Server disconnected without sending a response."
        return False, f"RemoteProtocolError: not an HTTP answer: {head[:60]!r}"
    return code == 200, f"HTTP {code}"


def prober_for(transport: Transport, remote_port: int, address: str) -> Connect:
    """How to reach ``address``:``remote_port`` on the host for one probe (``address`` as in
    client_for): a direct channel on the transport's connection when it has them (SSH
    ``connect_port``: the host dials it), else TCP to it from here (the local transport)."""
    connect_port = getattr(transport, "connect_port", None)
    if connect_port is not None:
        port_connect: Callable[[int, str], Awaitable[anyio.abc.ByteStream]] = connect_port
        return lambda: port_connect(remote_port, address)
    return lambda: anyio.connect_tcp(address, remote_port)
