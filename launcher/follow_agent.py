"""The host-side follow agent: one process per host follows every server's log over one stream.

This file is shipped to the host as it is (``python3 -c <this source>``, see
:mod:`launcher.hostfollow`) and must stay self-contained: Python 3.6+ standard library only,
no import of launcher, no f-string tricks newer than 3.6. launcher also imports it for the
frame format (:func:`encode_frame`, the constants).

Protocol. The agent reads JSON commands, one per line, on stdin:

- ``{"op": "add", "key": K, "dir": D, "offset": O, "pid": P}``: follow the attempt in run
  directory D (see launcher.remote) from log byte O; its server's pid is P. K is a number the
  launcher never reuses in one agent's life.
- ``{"op": "del", "key": K}``: stop following K (unknown keys are ignored).
- ``{"op": "probe", "key": K, "port": P, "timeout": T}``: ``GET /health`` on 127.0.0.1:P
  (one plain HTTP/1.1 request, only the status line read), in a thread of its own, answered
  by one ``P`` frame for K within about T seconds.

and writes frames on stdout, each ``MAGIC kind key offset length`` (``>BBIQI``, 18 bytes)
followed by ``length`` payload bytes:

- ``R`` (hello, key 0): the payload is the protocol version; the first frame of every agent.
- ``D`` (data): log bytes of K that start at byte ``offset`` of its log.
- ``X`` (exit): K's server is gone; ``offset`` is the log's final size (every byte before it
  was sent in D frames first) and the payload its exit status, or ``-`` when nobody recorded
  one. Nothing more comes for K.
- ``E`` (error): K cannot be followed (the payload says why, UTF-8); nothing more comes for K.
- ``H`` (heartbeat, key 0): sent every HEARTBEAT_S; ``offset`` is the host's clock in ms.
- ``P`` (probe answer): the HTTP status code (digits), ``timeout``, or the error's type
  and message.

A server is gone when its ``exit_status`` file exists, or its pid no longer runs our process
(the start time recorded in ``pid_start`` no longer matches), exactly as the shell helpers of
launcher.remote decide. Once gone, the agent waits up to SETTLE_S for ``exit_status`` (the
wrapper writes it right after reaping the server), sends the rest of the log, then ``X``.

Resource handling: the agent exits when its stdin closes or its stdout breaks (the channel
was closed or lost), so a reconnect never leaves one behind; it opens one file descriptor per
followed log and reads at most CHUNK bytes per log per round, so a host with one flooding
server still serves the others every round.
"""

import json
import os
import select
import socket
import struct
import sys
import threading
import time
from typing import Callable, Dict, Optional

VERSION = 1
MAGIC = 0xA5
HEADER = struct.Struct(">BBIQI")
CHUNK = 256 * 1024  # log bytes per D frame (and per log per round)
MAX_PAYLOAD = 1 << 20  # the largest payload a frame may announce (the reader's sanity check)
POLL_S = 0.1  # how often logs are looked at while nothing arrives on stdin
PID_CHECK_S = 0.5  # how often a live server's pid is checked (exit_status is checked each poll)
SETTLE_S = 2.0  # how long a gone server's exit_status is waited for
HEARTBEAT_S = 2.0
KINDS = b"RDXEHP"
PROBE_REQUEST = (b"GET /health HTTP/1.1\r\nHost: 127.0.0.1\r\nUser-Agent: launcher\r\n"
                 b"Accept: */*\r\nConnection: close\r\n\r\n")


def encode_frame(kind: bytes, key: int, offset: int, payload: bytes) -> bytes:
    """One frame (bytes): ``kind`` is one byte of KINDS (as bytes), ``payload`` bytes."""
    return HEADER.pack(MAGIC, kind[0], key, offset, len(payload)) + payload


def _ident(pid: int, boot_id: str) -> Optional[str]:
    """'<boot id> <start time>' of ``pid``, as launcher.remote's ``ident``; None if gone."""
    try:
        with open("/proc/%d/stat" % pid, "rb") as fh:
            stat = fh.read().decode("ascii", "replace")
    except OSError:
        return None
    fields = stat[stat.rfind(")") + 2:].split()
    if len(fields) < 20:
        return None
    return "%s %s" % (boot_id, fields[19])


def probe(port: int, timeout: float) -> bytes:
    """GET /health on 127.0.0.1:``port``: the status code, ``timeout``, or the error."""
    deadline = time.monotonic() + timeout
    try:
        sock = socket.create_connection(("127.0.0.1", port), timeout=timeout)
        try:
            sock.sendall(PROBE_REQUEST)
            head = b""
            while b"\r\n" not in head and len(head) < 4096:
                left = deadline - time.monotonic()
                if left <= 0:
                    return b"timeout"
                sock.settimeout(left)
                data = sock.recv(4096)
                if not data:
                    break
                head += data
        finally:
            sock.close()
    except socket.timeout:
        return b"timeout"
    except OSError as exc:
        return ("%s: %s" % (type(exc).__name__, exc)).encode("utf-8", "replace")
    fields = head.split(b"\r\n", 1)[0].split()
    if len(fields) >= 2 and fields[0].startswith(b"HTTP/") and fields[1].isdigit():
        return fields[1]
    if not head:
        return b"RemoteProtocolError: Server disconnected without sending a response."
    return ("RemoteProtocolError: not an HTTP answer: %r" % head[:60]).encode("utf-8")


def _read_text(path: str) -> Optional[str]:
    try:
        with open(path, "rb") as fh:
            return fh.read().decode("utf-8", "replace").strip()
    except OSError:
        return None


class Followed(object):
    """One followed attempt."""

    def __init__(self, key: int, directory: str, offset: int, pid: int) -> None:
        self.key = key
        self.dir = directory
        self.offset = offset
        self.pid = pid
        self.fd: Optional[int] = None
        self.gone_at: Optional[float] = None  # monotonic time the server was seen gone
        self.next_pid_check = 0.0

    def close(self) -> None:
        if self.fd is not None:
            os.close(self.fd)
            self.fd = None


class Agent(object):
    """The agent's state; ``write`` sends bytes to the launcher (stdout)."""

    def __init__(self, write: Callable[[bytes], object],
                 clock: Callable[[], float] = time.monotonic,
                 boot_id: Optional[str] = None) -> None:
        self.write = write
        self.clock = clock
        self.boot_id = boot_id if boot_id is not None else (
            _read_text("/proc/sys/kernel/random/boot_id") or "")
        self.followed: Dict[int, Followed] = {}
        self.pending = b""

    def command(self, line: bytes) -> None:
        """Apply one command line (bytes); malformed lines are ignored (the launcher's bug,
        and the other servers must go on)."""
        try:
            cmd = json.loads(line.decode("utf-8", "surrogateescape"))
            op, key = cmd["op"], int(cmd["key"])
        except (ValueError, KeyError, TypeError):
            return
        old = self.followed.pop(key, None)
        if old is not None:
            old.close()
        if op == "probe":
            try:
                port, timeout = int(cmd["port"]), float(cmd["timeout"])
            except (ValueError, KeyError, TypeError):
                self.write(encode_frame(b"P", key, 0, b"malformed probe command"))
                return
            thread = threading.Thread(target=self._probe, args=(key, port, timeout))
            thread.daemon = True
            thread.start()
            return
        if op == "add":
            try:
                self.followed[key] = Followed(key, str(cmd["dir"]), int(cmd["offset"]),
                                              int(cmd["pid"]))
            except (ValueError, KeyError, TypeError):
                self.write(encode_frame(b"E", key, 0, b"malformed add command"))

    def feed(self, data: bytes) -> None:
        """Commands arriving on stdin, in pieces."""
        self.pending += data
        while b"\n" in self.pending:
            line, self.pending = self.pending.split(b"\n", 1)
            if line.strip():
                self.command(line)

    def _probe(self, key: int, port: int, timeout: float) -> None:
        self.write(encode_frame(b"P", key, 0, probe(port, timeout)))

    def _alive(self, f: Followed, now: float) -> bool:
        """Whether f's server still runs (see the module docstring)."""
        if os.path.exists(os.path.join(f.dir, "exit_status")):
            return False
        if now < f.next_pid_check:
            return True
        f.next_pid_check = now + PID_CHECK_S
        if f.pid <= 1:
            return False
        try:
            os.kill(f.pid, 0)
        except ProcessLookupError:
            return False
        except PermissionError:
            pass
        recorded = _read_text(os.path.join(f.dir, "pid_start"))
        if recorded is None:
            return False
        ident = _ident(f.pid, self.boot_id)
        return ident is None or ident == recorded

    def _send_log(self, f: Followed, limit: int) -> int:
        """Send up to ``limit`` bytes of f's log from its offset; how many were sent."""
        if f.fd is None:
            try:
                f.fd = os.open(os.path.join(f.dir, "log"), os.O_RDONLY)
            except FileNotFoundError:
                return 0
        sent = 0
        while sent < limit:
            data = os.pread(f.fd, min(CHUNK, limit - sent), f.offset)
            if not data:
                break
            self.write(encode_frame(b"D", f.key, f.offset, data))
            f.offset += len(data)
            sent += len(data)
        return sent

    def round(self) -> bool:
        """Look at every followed log once; True when some log had more than one chunk
        waiting (the caller should come back at once)."""
        busy = False
        now = self.clock()
        for key in list(self.followed):
            f = self.followed[key]
            try:
                if f.gone_at is None and not self._alive(f, now):
                    f.gone_at = now
                if f.gone_at is None:
                    busy = self._send_log(f, CHUNK) == CHUNK or busy
                    continue
                status = _read_text(os.path.join(f.dir, "exit_status"))
                if status is None and now - f.gone_at < SETTLE_S:
                    continue  # the wrapper is about to record it
                while self._send_log(f, 1 << 30) > 0:
                    pass
                if status is None or not status.isdigit():
                    status = "-"
                self.write(encode_frame(b"X", key, f.offset, status.encode("ascii")))
            except OSError as exc:
                self.write(encode_frame(b"E", key, f.offset,
                                        ("%s: %s" % (type(exc).__name__, exc)).encode(
                                            "utf-8", "replace")))
            f.close()
            del self.followed[key]
        return busy


def _widen_pipe(fd: int) -> None:
    """Ask for a 1 MiB pipe on ``fd`` (Linux F_SETPIPE_SZ) when it is one: a 64 KiB pipe
    makes a flooding log a ping-pong of context switches with the reader."""
    try:
        import fcntl
        fcntl.fcntl(fd, getattr(fcntl, "F_SETPIPE_SZ", 1031), 1 << 20)
    except (ImportError, OSError):
        pass


def main() -> int:
    out = sys.stdout.buffer
    _widen_pipe(sys.stdout.fileno())
    lock = threading.Lock()  # probe threads write too: one frame at a time

    def write(data: bytes) -> None:
        with lock:
            out.write(data)
            out.flush()

    agent = Agent(write)
    write(encode_frame(b"R", 0, 0, str(VERSION).encode("ascii")))
    out.flush()
    stdin = sys.stdin.buffer.fileno()
    next_beat = time.monotonic() + HEARTBEAT_S
    busy = False
    while True:
        ready, _, _ = select.select([stdin], [], [], 0 if busy else POLL_S)
        if ready:
            data = os.read(stdin, 65536)
            if not data:
                return 0  # the launcher closed the channel
            agent.feed(data)
        busy = agent.round()
        now = time.monotonic()
        if now >= next_beat:
            write(encode_frame(b"H", 0, int(time.time() * 1000), b""))
            next_beat = now + HEARTBEAT_S


if __name__ == "__main__":
    try:
        sys.exit(main())
    except (BrokenPipeError, KeyboardInterrupt):
        sys.exit(0)
