"""A real HTTP server on 127.0.0.1 that records every request and answers as it is told.

Use it wherever code under test talks HTTP (Slack webhooks, health probes, ...)::

    with HttpSink() as sink:
        sink.script(Reply.too_many(retry_after=7), Reply.error(500))  # the first two answers
        ... post to sink.url("/hook") ...
        requests = sink.wait_for(3, timeout=2.0)

Answers are taken from the script in order, one per request, then ``default`` (200 "ok")
for every request after that. ``HANG`` holds the request open without answering until
``release()`` or ``stop()``; the client's timeout is what ends it.

The server runs on its own threads, so it keeps answering while the test's event loop is
busy or blocked. ``stop()`` releases hung requests first and then joins every thread, so
nothing outlives the test.
"""

from __future__ import annotations

import contextlib
import http.server
import json
import socket
import threading
import time
from collections import deque
from dataclasses import dataclass, field
from types import TracebackType
from typing import Any

import anyio


@dataclass(frozen=True)
class Request:
    """One request as the server received it. Header names are lower-cased."""

    method: str
    path: str
    headers: dict[str, str]
    body: bytes

    def json(self) -> Any:
        """The body parsed as JSON."""
        return json.loads(self.body)


@dataclass(frozen=True)
class Reply:
    """Answer with ``status``, ``headers`` and ``body``."""

    status: int = 200
    body: bytes = b"ok"
    headers: dict[str, str] = field(default_factory=dict)

    @classmethod
    def ok(cls) -> Reply:
        """200 "ok", as Slack's incoming webhooks answer."""
        return cls()

    @classmethod
    def too_many(cls, retry_after: float | str) -> Reply:
        """429 with a ``Retry-After`` header (seconds, or any text to test bad values)."""
        value = retry_after if isinstance(retry_after, str) else f"{retry_after:g}"
        return cls(429, b"rate_limited", {"Retry-After": value})

    @classmethod
    def error(cls, status: int = 500, body: bytes = b"internal_error") -> Reply:
        """An error status (5xx for server trouble, 4xx for a rejected request)."""
        return cls(status, body)


@dataclass(frozen=True)
class Hang:
    """Hold the request open without answering until released (or the server stops)."""


HANG = Hang()
Behaviour = Reply | Hang


class HttpSink:
    """The server. ``start()``/``stop()`` or use it as a context manager."""

    def __init__(self, default: Behaviour = Reply()) -> None:
        self.default = default
        self._script: deque[Behaviour] = deque()
        self._requests: list[Request] = []
        self._cond = threading.Condition()
        self._released = threading.Event()
        self._open: set[socket.socket] = set()
        self._server: http.server.ThreadingHTTPServer | None = None
        self._thread: threading.Thread | None = None

    # -- control ---------------------------------------------------------------------------

    def script(self, *behaviours: Behaviour) -> None:
        """Queue answers for the next requests, in order; ``default`` answers after them."""
        with self._cond:
            self._script.extend(behaviours)

    def release(self) -> None:
        """Let every hung request (and any later ``HANG``) finish with ``default`` or 200."""
        self._released.set()

    @property
    def port(self) -> int:
        assert self._server is not None, "start the sink first"
        return int(self._server.server_address[1])

    def url(self, path: str = "/") -> str:
        """The full URL of ``path`` on this server."""
        return f"http://127.0.0.1:{self.port}{path}"

    @property
    def requests(self) -> list[Request]:
        """A copy of every request received so far, in arrival order."""
        with self._cond:
            return list(self._requests)

    def wait_for(self, count: int, timeout: float = 5.0) -> list[Request]:
        """Block until ``count`` requests have arrived; return them. Fails on timeout."""
        with self._cond:
            if not self._cond.wait_for(lambda: len(self._requests) >= count, timeout):
                raise AssertionError(
                    f"expected {count} request(s) within {timeout}s, got {len(self._requests)}"
                )
            return list(self._requests)

    async def wait_for_async(self, count: int, timeout: float = 5.0) -> list[Request]:
        """``wait_for`` for async tests: polls without blocking the event loop."""
        deadline = time.monotonic() + timeout
        while True:
            got = self.requests
            if len(got) >= count:
                return got
            if time.monotonic() > deadline:
                raise AssertionError(
                    f"expected {count} request(s) within {timeout}s, got {len(got)}"
                )
            await anyio.sleep(0.01)

    # -- lifecycle -------------------------------------------------------------------------

    def start(self) -> HttpSink:
        sink = self

        class Handler(http.server.BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def do_POST(self) -> None:
                sink._handle(self)

            def do_GET(self) -> None:
                sink._handle(self)

            def log_message(self, format: str, *args: Any) -> None:
                pass  # keep test output clean

        class Server(http.server.ThreadingHTTPServer):
            daemon_threads = False
            block_on_close = True  # stop() joins every handler thread

            def process_request(self, request: Any, client_address: Any) -> None:
                with sink._cond:
                    sink._open.add(request)
                super().process_request(request, client_address)

            def shutdown_request(self, request: Any) -> None:
                with sink._cond:
                    sink._open.discard(request)
                super().shutdown_request(request)

            def handle_error(self, request: Any, client_address: Any) -> None:
                pass  # a client that hung up on a held request is expected, not an error

        self._server = Server(("127.0.0.1", 0), Handler)
        self._thread = threading.Thread(
            target=self._server.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True
        )
        self._thread.start()
        return self

    def stop(self) -> None:
        """Release hung requests, stop serving and join every thread."""
        self._released.set()
        if self._server is not None:
            self._server.shutdown()
            # Idle keep-alive connections would hold their handler threads (and the join in
            # server_close) until the client closes; end them from this side.
            with self._cond:
                open_now = list(self._open)
            for conn in open_now:
                with contextlib.suppress(OSError):
                    conn.shutdown(socket.SHUT_RDWR)
            self._server.server_close()
        if self._thread is not None:
            self._thread.join(timeout=5.0)

    def __enter__(self) -> HttpSink:
        return self.start()

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.stop()

    # -- serving ---------------------------------------------------------------------------

    def _handle(self, handler: http.server.BaseHTTPRequestHandler) -> None:
        length = int(handler.headers.get("Content-Length") or 0)
        body = handler.rfile.read(length) if length else b""
        request = Request(
            method=handler.command,
            path=handler.path,
            headers={k.lower(): v for k, v in handler.headers.items()},
            body=body,
        )
        with self._cond:
            self._requests.append(request)
            behaviour = self._script.popleft() if self._script else self.default
            self._cond.notify_all()
        if isinstance(behaviour, Hang):
            self._released.wait()
            behaviour = self.default if isinstance(self.default, Reply) else Reply()
        try:
            handler.send_response(behaviour.status)
            for name, value in behaviour.headers.items():
                handler.send_header(name, value)
            handler.send_header("Content-Type", "text/plain")
            handler.send_header("Content-Length", str(len(behaviour.body)))
            handler.end_headers()
            handler.wfile.write(behaviour.body)
        except OSError:
            handler.close_connection = True  # the client gave up on a held request
