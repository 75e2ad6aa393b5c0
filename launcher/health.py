"""One bounded HTTP health check: the whole request has a deadline and the body a size cap.

httpx's ``timeout`` applies to each read, so a server that trickles its body one byte at a
time would hold a plain ``client.get`` for ever, and ``get`` reads a body of any size into
memory. ``check`` reads at most MAX_BODY bytes of the body, raw (never decompressed: a small
gzip body cannot expand), and gives up at the deadline whatever the server is doing.
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from contextlib import asynccontextmanager

import anyio
import httpx

from launcher.transport.base import Transport

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
    transport: Transport, remote_port: int, timeout_s: float,
) -> AsyncIterator[tuple[httpx.AsyncClient, str]]:
    """An HTTP client reaching ``remote_port`` on the host's loopback, and its /health URL.

    A transport that can forward to a Unix socket (SSH: ``forward_unix``, in a 0700
    directory) is used that way, so no local TCP port exposes the server to the other users
    of this machine; otherwise ``forward_port`` (the local transport: the port itself).
    """
    forward_unix = getattr(transport, "forward_unix", None)
    if forward_unix is not None:
        async with forward_unix(remote_port) as path, httpx.AsyncClient(
            transport=httpx.AsyncHTTPTransport(uds=path), timeout=timeout_s, trust_env=False,
        ) as client:
            yield client, "http://localhost/health"
        return
    async with transport.forward_port(remote_port) as port, httpx.AsyncClient(
        timeout=timeout_s, trust_env=False,
    ) as client:
        yield client, f"http://127.0.0.1:{port}/health"
