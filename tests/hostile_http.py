"""A real HTTP server on 127.0.0.1 that answers every request badly, for bound tests.

    with HostileHttp("trickle", body_len=1000, every_s=0.2) as srv:   # 1 byte per 0.2 s
        ... GET http://127.0.0.1:{srv.port}/health ...
    with HostileHttp("huge", body_len=800 << 20) as srv:               # as fast as it can
        ... srv.sent: body bytes the client took before it hung up

Also runnable as ``python -m tests.hostile_http MODE BODY_LEN PORT`` (scripts/measure_bounds.py):
it then prints SGLang's ready line, so launcher probes it.
"""

from __future__ import annotations

import socket
import sys
import threading
import time
from types import TracebackType


class HostileHttp:
    """Serves ``mode`` ("huge" or "trickle") until closed; ``sent`` counts body bytes."""

    def __init__(self, mode: str, body_len: int, every_s: float = 5.0, port: int = 0) -> None:
        self.mode, self.body_len, self.every_s = mode, body_len, every_s
        self.sent = 0
        self.listener = socket.create_server(("127.0.0.1", port))
        self.listener.settimeout(0.1)  # so that closing is noticed (accept is not woken)
        self.port = int(self.listener.getsockname()[1])
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._serve, daemon=True)

    def __enter__(self) -> HostileHttp:
        self._thread.start()
        return self

    def __exit__(self, t: type[BaseException] | None, e: BaseException | None,
                 tb: TracebackType | None) -> None:
        self._stop.set()
        self._thread.join(10)
        self.listener.close()

    def _serve(self) -> None:
        while not self._stop.is_set():
            try:
                conn, _ = self.listener.accept()
            except TimeoutError:
                continue
            except OSError:
                return
            conn.settimeout(None)
            threading.Thread(target=self._answer, args=(conn,), daemon=True).start()

    def _answer(self, conn: socket.socket) -> None:
        with conn:
            try:
                conn.recv(65536)
                conn.sendall(b"HTTP/1.1 200 OK\r\nContent-Type: text/plain\r\n"
                             b"Content-Length: %d\r\n\r\n" % self.body_len)
                chunk = b"x" * (min(1 << 20, self.body_len) if self.mode == "huge" else 1)
                while self.sent < self.body_len and not self._stop.is_set():
                    conn.sendall(chunk)
                    self.sent += len(chunk)
                    if self.mode == "trickle":
                        time.sleep(self.every_s)
            except OSError:
                return


if __name__ == "__main__":
    # As a server command: MODE BODY_LEN PORT, then whatever flags launcher adds (ignored).
    mode, body_len, port = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
    with HostileHttp(mode, body_len, port=port) as server:
        print(f"listening on {server.port}", flush=True)
        print("[2026-01-01 00:00:00] The server is fired up and ready to roll!", flush=True)
        threading.Event().wait()
