"""One bounded HTTP health check: the whole request has a deadline and the body a size cap.

httpx's ``timeout`` applies to each read, so a server that trickles its body one byte at a
time would hold a plain ``client.get`` for ever, and ``get`` reads a body of any size into
memory. ``check`` reads at most MAX_BODY bytes of the body, raw (never decompressed: a small
gzip body cannot expand), and gives up at the deadline whatever the server is doing.
"""

from __future__ import annotations

import anyio
import httpx

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
