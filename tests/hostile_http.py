"""A real HTTP server on 127.0.0.1 that answers every request badly, for bound tests.

    with HostileHttp("trickle", body_len=1000, every_s=0.2) as srv:   # 1 byte per 0.2 s
        ... GET http://127.0.0.1:{srv.port}/health ...
    with HostileHttp("huge", body_len=800 << 20) as srv:               # as fast as it can
        ... srv.sent: body bytes the client took before it hung up
    with HostileHttp("gzip", body_len=1 << 30, status=500) as srv:      # a gzip bomb
        ... 1 GiB of spaces then "{}" inflated from about 1 MiB sent (Content-Encoding: gzip)

Also runnable as ``python -m tests.hostile_http MODE BODY_LEN PORT`` (scripts/measure_bounds.py):
it then prints SGLang's ready line, so launcher probes it.
"""

from __future__ import annotations

import socket
import sys
import threading
import time
import zlib
from types import TracebackType


class HostileHttp:
    """Serves ``mode`` ("huge", "trickle" or "gzip") until closed; ``sent`` counts body bytes
    (for "gzip": compressed bytes sent; ``body_len`` is then the inflated size). ``host`` is
    the address it listens on (an IPv6 one too)."""

    def __init__(self, mode: str, body_len: int, every_s: float = 5.0, port: int = 0,
                 status: int = 200, host: str = "127.0.0.1") -> None:
        self.mode, self.body_len, self.every_s, self.status = mode, body_len, every_s, status
        self.sent = 0
        self.bomb = gzip_bomb(body_len) if mode == "gzip" else b""
        family = socket.AF_INET6 if ":" in host else socket.AF_INET
        self.listener = socket.create_server((host, port), family=family)
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
                if self.mode == "gzip":
                    conn.sendall(b"HTTP/1.1 %d Bad\r\nContent-Type: application/json\r\n"
                                 b"Content-Encoding: gzip\r\nContent-Length: %d\r\n\r\n"
                                 % (self.status, len(self.bomb)))
                    for at in range(0, len(self.bomb), 1 << 16):
                        conn.sendall(self.bomb[at:at + (1 << 16)])
                        self.sent += min(1 << 16, len(self.bomb) - at)
                    return
                conn.sendall(b"HTTP/1.1 %d OK\r\nContent-Type: text/plain\r\n"
                             b"Content-Length: %d\r\n\r\n" % (self.status, self.body_len))
                chunk = b"x" * (min(1 << 20, self.body_len) if self.mode == "huge" else 1)
                while self.sent < self.body_len and not self._stop.is_set():
                    conn.sendall(chunk)
                    self.sent += len(chunk)
                    if self.mode == "trickle":
                        time.sleep(self.every_s)
            except OSError:
                return


_BOMBS: dict[int, bytes] = {}


def gzip_bomb(inflated: int) -> bytes:
    """A gzip body of ``inflated`` bytes of spaces then ``{}`` (about 1 KiB sent per MiB)."""
    if inflated not in _BOMBS:
        packer = zlib.compressobj(9, zlib.DEFLATED, 31)  # 31: gzip framing
        block = b" " * (1 << 20)
        out = [packer.compress(block) for _ in range(inflated >> 20)]
        out += [packer.compress(b" " * (inflated % (1 << 20)) + b"{}"), packer.flush()]
        _BOMBS[inflated] = b"".join(out)
    return _BOMBS[inflated]


if __name__ == "__main__":
    # As a server command: MODE BODY_LEN PORT, then whatever flags launcher adds (ignored).
    mode, body_len, port = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
    with HostileHttp(mode, body_len, port=port) as server:
        print(f"listening on {server.port}", flush=True)
        print("[2026-01-01 00:00:00] The server is fired up and ready to roll!", flush=True)
        threading.Event().wait()
