"""The host-side follow agent: one process per host follows every server's log over one stream.

This file is shipped to the host as it is, on the stdin of a short ``python3 -I -c`` stub that
checks its sha256 and runs it (see :func:`launcher.host.follower.agent_start`), so it must
stay self-contained: Python 3.6+ standard library only, no import of launcher, no f-string
tricks newer than 3.6. launcher also imports it for the frame format (:func:`encode_frame`,
the constants).

Protocol. The agent reads JSON commands, one per line, on stdin (the rest of it, after the
bytes the stub read: the stub reads exactly those, with ``os.read``, so none is lost):

- ``{"op": "add", "key": K, "dir": D, "offset": O, "pid": P}``: follow the attempt in run
  directory D (see launcher.host.run) from log byte O; its server's pid is P. K is a number the
  launcher never reuses in one agent's life.
- ``{"op": "del", "key": K}``: stop following K (unknown keys are ignored).
- ``{"op": "probes", "key": K, "items": [[K1, P1, T1, A1], [K2, P2, T2, A2], ...]}``: ``GET
  /health`` on A1:P1, A2:P2... (An: the address the server listens on, or the loopback for a
  wildcard one; one plain HTTP/1.1 request each, only the status line read), all at once in
  one thread of their own (non-blocking sockets, one ``poll``), Kn
  answered within about Tn seconds, by ``P`` frames that each carry every answer ready at
  that moment (one frame for the whole batch when the servers answer promptly). K names
  the batch and is otherwise unused.

and writes frames on stdout, each ``MAGIC kind key offset length`` (``>BBIQI``, 18 bytes)
followed by ``length`` payload bytes:

- ``R`` (hello, key 0): the payload is the protocol version; the first frame of every agent.
- ``D`` (data): log bytes of K that start at byte ``offset`` of its log.
- ``X`` (exit): K's server is gone; ``offset`` is the log's final size (every byte before it
  was sent in D frames first) and the payload its exit status, or ``-`` when nobody recorded
  one. Nothing more comes for K.
- ``E`` (error): K cannot be followed (the payload says why, UTF-8); nothing more comes for K.
- ``H`` (heartbeat, key 0): sent every HEARTBEAT_S; ``offset`` is the host's clock in ms.
- ``P`` (probe answers, key 0): one line per probe, ``Kn answer\n``, the answer being the
  HTTP status code (digits), ``timeout``, or the error's type and message.

Files. The agent opens an attempt's directory once, one component at a time from / with
O_NOFOLLOW, each checked as launcher.host.shell's ``safe`` checks it (:func:`open_run_dir`),
and then opens ``log``, ``pid_start`` and ``exit_status`` relative to that descriptor with
O_NOFOLLOW, reading at most SMALL_FILE bytes of the small ones: another user can neither
swap the directory under it nor make it read a file of his choice or a huge one. A directory
that fails the check is answered with ``E`` (its payload starts "unsafe run directory").

A server is gone when its ``exit_status`` file exists, or its pid no longer runs our process
(the start time recorded in ``pid_start`` no longer matches), exactly as the shell helpers of
launcher.host.run decide. Once gone, the agent waits up to SETTLE_S for ``exit_status`` (the
wrapper writes it right after reaping the server), sends the rest of the log, then ``X``.

Cost per round (one every POLL_S, hundreds of servers per agent): a round must stay cheap so
that an exit is seen within a round even on a loaded host. Every round, each live server's
pid is checked with ``kill(pid, 0)`` (one syscall; a server that exited is reaped by its
wrapper at once, so this is what sees almost every death). ``exit_status`` and the pid's
start time (a reused pid) are looked at every PID_CHECK_S; ``pid_start`` is read once (the
wrapper writes it before the launch returns, and it never changes). A log is read every round
while it grows; after a round that found nothing new its next read waits twice as long as
the last one, up to QUIET_MAX_S, and it is read every round again as soon as a read finds
bytes. A gone server's log is always read to its end before ``X``.

Resource handling: the agent exits when its stdin closes or its stdout breaks (the channel
was closed or lost), so a reconnect never leaves one behind; it holds two file descriptors
per followed attempt (its directory and its log) and reads at most CHUNK bytes per log per
round, so a host with one flooding server still serves the others every round.
"""

import errno
import json
import os
import select
import socket
import struct
import sys
import threading
import time
from typing import Any, Callable, Dict, List, Optional, Tuple

VERSION = 3
MAGIC = 0xA5
HEADER = struct.Struct(">BBIQI")
CHUNK = 256 * 1024  # log bytes per D frame (and per log per round)
MAX_PAYLOAD = 1 << 20  # the largest payload a frame may announce (the reader's sanity check)
POLL_S = 0.1  # how often the agent looks at its servers while nothing arrives on stdin
PID_CHECK_S = 0.5  # how often a live server's exit_status and pid start time are checked
QUIET_MAX_S = 0.8  # the longest a quiet log goes unread (its reads back off up to this)
SETTLE_S = 2.0  # how long a gone server's exit_status is waited for
HEARTBEAT_S = 2.0
KINDS = b"RDXEHP"
PROBE_REQUEST = (b"GET /health HTTP/1.1\r\nHost: 127.0.0.1\r\nUser-Agent: launcher\r\n"
                 b"Accept: */*\r\nConnection: close\r\n\r\n")


def encode_frame(kind: bytes, key: int, offset: int, payload: bytes) -> bytes:
    """One frame (bytes): ``kind`` is one byte of KINDS (as bytes), ``payload`` bytes."""
    return HEADER.pack(MAGIC, kind[0], key, offset, len(payload)) + payload


def _ident(pid: int, boot_id: str) -> Optional[str]:
    """'<boot id> <start time>' of ``pid``, as launcher.host.run's ``ident``; None if gone."""
    try:
        with open("/proc/%d/stat" % pid, "rb") as fh:
            stat = fh.read().decode("ascii", "replace")
    except OSError:
        return None
    fields = stat[stat.rfind(")") + 2:].split()
    if len(fields) < 20:
        return None
    return "%s %s" % (boot_id, fields[19])


def _error(exc: OSError) -> bytes:
    return ("%s: %s" % (type(exc).__name__, exc)).replace("\n", " ").encode("utf-8", "replace")


def _status(head: bytes) -> bytes:
    """The answer for what a server sent back: its status code, or what was wrong."""
    fields = head.split(b"\r\n", 1)[0].split()
    if len(fields) >= 2 and fields[0].startswith(b"HTTP/") and fields[1].isdigit():
        return fields[1]
    if not head:
        return b"RemoteProtocolError: Server disconnected without sending a response."
    return ("RemoteProtocolError: not an HTTP answer: %r" % head[:60]).encode("utf-8")


def _connect(address: str, port: int) -> socket.socket:
    """A non-blocking socket connecting to ``address``:``port`` (an IPv4 or IPv6 literal, or
    a name this host resolves: its first address); OSError when it cannot even start."""
    family, kind, proto, _, sockaddr = socket.getaddrinfo(address, port, 0,
                                                          socket.SOCK_STREAM)[0]
    sock = socket.socket(family, kind, proto)
    sock.setblocking(False)
    err = sock.connect_ex(sockaddr)
    if err not in (0, errno.EINPROGRESS):
        sock.close()
        raise OSError(err, os.strerror(err))
    return sock


def probe_many(items: List[Tuple[int, int, float, str]],
               emit: Callable[[List[Tuple[int, bytes]]], object]) -> None:
    """``GET /health`` on address:port for every (key, port, timeout, address) of ``items``,
    all at once in the calling thread: ``emit`` gets each wave of (key, answer) as they come,
    every key exactly once, within about its ``timeout`` seconds. An answer is the status
    code, ``timeout``, or the error's type and message (as launcher.host.health.probe_health
    words it).
    """
    start = time.monotonic()
    poller = select.poll()
    # fd -> [key, socket, bytes so far, request sent, deadline]
    pending: Dict[int, List[Any]] = {}
    done: List[Tuple[int, bytes]] = []

    def finish(fd: int, answer: bytes) -> None:
        state = pending.pop(fd)
        poller.unregister(fd)
        state[1].close()
        done.append((state[0], answer))

    for key, port, timeout, address in items:
        try:
            sock = _connect(address, port)
        except OSError as exc:  # socket.gaierror too: a name the host cannot resolve
            done.append((key, _error(exc)))
            continue
        pending[sock.fileno()] = [key, sock, b"", False, start + timeout]
        poller.register(sock.fileno(), select.POLLOUT)
    while pending:
        if done:
            emit(done)
            done = []
        now = time.monotonic()
        for fd in [fd for fd, state in pending.items() if state[4] <= now]:
            finish(fd, b"timeout")
        if not pending:
            break
        left = min(state[4] for state in pending.values()) - now
        for fd, _ in poller.poll(max(1, int(left * 1000 + 1))):
            state = pending.get(fd)
            if state is None:
                continue
            sock = state[1]
            if not state[3]:
                err = sock.getsockopt(socket.SOL_SOCKET, socket.SO_ERROR)
                if err:
                    finish(fd, _error(OSError(err, os.strerror(err))))
                    continue
                try:
                    sock.send(PROBE_REQUEST)  # ~100 bytes: fits a fresh socket's buffer
                except OSError as exc:
                    finish(fd, _error(exc))
                    continue
                state[3] = True
                poller.modify(fd, select.POLLIN)
                continue
            try:
                data = sock.recv(4096)
            except (BlockingIOError, InterruptedError):
                continue
            except OSError as exc:
                finish(fd, _error(exc))
                continue
            state[2] += data
            if not data or b"\r\n" in state[2] or len(state[2]) >= 4096:
                finish(fd, _status(state[2]))
    if done:
        emit(done)


SMALL_FILE = 256  # bytes read of pid_start, exit_status, boot_id: all far shorter
STRICT_LEVELS = 3  # an attempt directory, its server directory and run_dir: the user's own
_DIR_FLAGS = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW


class UnsafeRunDir(OSError):
    """A run directory that another user could have swapped (see :func:`open_run_dir`)."""


def _read_text(path: str) -> Optional[str]:
    try:
        with open(path, "rb") as fh:
            return fh.read(SMALL_FILE).decode("utf-8", "replace").strip()
    except OSError:
        return None


def open_run_dir(path: str) -> int:
    """A descriptor of the attempt directory ``path``, opened one component at a time from /
    with O_NOFOLLOW, each checked with ``fstat`` as launcher.host.shell's ``safe`` checks
    it: the last STRICT_LEVELS owned by us and not group/other-writable, every one above owned
    by root or us and not group/other-writable unless sticky and root's (like /tmp).

    Whatever the agent reads of the attempt is opened relative to this descriptor, so a
    directory renamed after the check changes nothing. Raises UnsafeRunDir (naming the
    component) or the OSError of a component that cannot be opened (a symlink: ELOOP).
    """
    parts = [p for p in path.split("/") if p]
    if not path.startswith("/") or len(parts) < STRICT_LEVELS or "." in parts or ".." in parts:
        raise UnsafeRunDir("unsafe run directory %s: not an absolute path" % path)
    uid = os.geteuid()
    fd = os.open("/", _DIR_FLAGS)
    try:
        for i in range(len(parts) + 1):
            if i:
                nfd = os.open(parts[i - 1], _DIR_FLAGS, dir_fd=fd)
                os.close(fd)
                fd = nfd
            st = os.fstat(fd)
            writable = st.st_mode & 0o022
            if i > len(parts) - STRICT_LEVELS:
                bad = st.st_uid != uid or writable
            else:
                bad = st.st_uid not in (0, uid) or (
                    writable and not (st.st_mode & 0o1000 and st.st_uid == 0))
            if bad:
                raise UnsafeRunDir(
                    "unsafe run directory /%s: owned by uid %d, mode %o"
                    % ("/".join(parts[:i]), st.st_uid, st.st_mode & 0o7777))
        return fd
    except BaseException:
        os.close(fd)
        raise


def _read_small(dir_fd: int, name: str) -> Optional[str]:
    """At most SMALL_FILE bytes of the file ``name`` in ``dir_fd``, stripped; None when it
    does not exist. A symlink raises (ELOOP): only its owner could have put it there."""
    try:
        fd = os.open(name, os.O_RDONLY | os.O_NOFOLLOW, dir_fd=dir_fd)
    except FileNotFoundError:
        return None
    try:
        return os.read(fd, SMALL_FILE).decode("utf-8", "replace").strip()
    finally:
        os.close(fd)


def _exists(dir_fd: int, name: str) -> bool:
    try:
        os.stat(name, dir_fd=dir_fd, follow_symlinks=False)
    except FileNotFoundError:
        return False
    return True


class Followed(object):
    """One followed attempt."""

    def __init__(self, key: int, directory: str, offset: int, pid: int) -> None:
        self.key = key
        self.dir = directory
        self.offset = offset
        self.pid = pid
        self.fd: Optional[int] = None
        self.dir_fd: Optional[int] = None  # see open_run_dir; every file is opened under it
        self.gone_at: Optional[float] = None  # monotonic time the server was seen gone
        self.next_pid_check = 0.0
        self.recorded: Optional[str] = None  # pid_start, once read
        self.next_read = 0.0  # when the log is read next (reads back off while it is quiet)
        self.quiet_s = 0.0  # the wait before the next read of a quiet log

    def directory(self) -> int:
        """The attempt directory's descriptor (opened and checked on first use)."""
        if self.dir_fd is None:
            self.dir_fd = open_run_dir(self.dir)
        return self.dir_fd

    def close(self) -> None:
        for fd in (self.fd, self.dir_fd):
            if fd is not None:
                os.close(fd)
        self.fd = self.dir_fd = None


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
        if op == "probes":
            try:
                items = [(int(k), int(p), float(t), str(a)) for k, p, t, a in cmd["items"]]
            except (ValueError, KeyError, TypeError):
                return  # the launcher's bug: its probes time out
            thread = threading.Thread(target=probe_many, args=(items, self._answers))
            thread.daemon = True
            thread.start()
            return
        old = self.followed.pop(key, None)
        if old is not None:
            old.close()
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

    def _answers(self, answers: List[Tuple[int, bytes]]) -> None:
        self.write(encode_frame(b"P", 0, 0, b"".join(
            b"%d %s\n" % (key, answer) for key, answer in answers)))

    def _alive(self, f: Followed, now: float) -> bool:
        """Whether f's server still runs (see the module docstring: the pid every round, the
        rest every PID_CHECK_S)."""
        if f.pid <= 1:
            return False
        try:
            os.kill(f.pid, 0)
        except ProcessLookupError:
            return False
        except PermissionError:
            pass
        if now < f.next_pid_check:
            return True
        f.next_pid_check = now + PID_CHECK_S
        if _exists(f.directory(), "exit_status"):
            return False
        if f.recorded is None:
            f.recorded = _read_small(f.directory(), "pid_start")
            if f.recorded is None:
                return False
        ident = _ident(f.pid, self.boot_id)
        return ident is None or ident == f.recorded

    def _send_log(self, f: Followed, limit: int) -> int:
        """Send up to ``limit`` bytes of f's log from its offset; how many were sent."""
        if f.fd is None:
            try:
                f.fd = os.open("log", os.O_RDONLY | os.O_NOFOLLOW, dir_fd=f.directory())
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
                    if now >= f.next_read:
                        sent = self._send_log(f, CHUNK)
                        busy = sent == CHUNK or busy
                        # read every round while it grows; back off while it is quiet
                        f.quiet_s = 0.0 if sent else min(QUIET_MAX_S,
                                                         max(POLL_S, 2 * f.quiet_s))
                        f.next_read = now + f.quiet_s
                    continue
                status = _read_small(f.directory(), "exit_status")
                if status is None and now - f.gone_at < SETTLE_S:
                    continue  # the wrapper is about to record it
                while self._send_log(f, 1 << 30) > 0:
                    pass
                # ASCII digits only ("²".isdigit() is true and cannot be sent as ASCII), at
                # most 18 of them (str.isascii is 3.7+; this file runs on 3.6)
                if status is None or not (0 < len(status) <= 18
                                          and all("0" <= c <= "9" for c in status)):
                    status = "-"
                self.write(encode_frame(b"X", key, f.offset, status.encode("ascii")))
            except OSError as exc:
                if isinstance(exc, UnsafeRunDir):
                    why = str(exc)
                elif exc.errno == errno.ELOOP:  # O_NOFOLLOW met a symlink
                    why = "unsafe run directory %s: a symlink in it" % f.dir
                else:
                    why = "%s: %s" % (type(exc).__name__, exc)
                self.write(encode_frame(b"E", key, f.offset, why.encode("utf-8", "replace")))
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
