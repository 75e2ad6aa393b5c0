"""A lean stand-in for the sim server: it replays one recorded run of the real one.

For load generation only (``scripts/bench/bench_scale.py --sim replay``): a thousand real sim
servers need ~28 GiB (each is three Python interpreters that import argparse, http.server,
dataclasses, the SGLang memory model...), so a scale run would measure the machine's memory
instead of the launcher. This stand-in is one small Python process per server (``python -S``,
this file run directly, no package import, only C modules and ``os``: ~3.7 MiB private
memory against the sim's ~30) that:

- writes, byte for byte and with the recorded delays, what the real sim wrote for the same
  SGLang flags and environment, its own pid and port substituted, the leading
  ``[YYYY-MM-DD HH:MM:SS(.mmm)]`` of each line re-stamped with the present time;
- serves ``GET /health`` on ``--host``:``--port`` (503 while starting and shutting down, 200
  once the recorded ready line is written; any other path 404) and writes uvicorn's access
  line for every request, as the sim does;
- on SIGTERM after ready replays the recorded shutdown and ends as the recording did
  (SGLang's ``kill_process_tree``: SIGKILL); SIGTERM before ready kills it at once (SGLang
  has no handler while loading). A recording that failed during start-up is replayed up to
  its exit status.

What it does not do: GPU memory accounting (nothing is registered with the sim host, so its
nvidia-smi shows the GPUs free), scheduler / detokenizer child processes, faults
(``SGLANG_SIM_FAULTS`` is refused), and any API but /health.

Recording. ``SGLANG_SIM_REPLAY_DIR`` names a directory of recordings, keyed by the flags
(``--port``'s value left out) and the sim's environment (SGLANG_SIM_VERSION, SGLANG_SIM_HOST,
SGLANG_LOG_MS, SGLANG_SIM_TIME_SCALE; not CUDA_VISIBLE_DEVICES: the recording is made on the
first server's GPUs and assumes the others' are alike). The first server whose key has no
recording runs the real sim (``python -m launcher.sim.server`` with its flags on a free port)
under a lock, records its output until the ready line and then its SIGTERM shutdown, and
saves it; the servers queued on the lock then read it. The flags it replays are checked
against the recording's (exit 2 naming the difference).

Exit statuses: 2 bad usage (no ``SGLANG_SIM_REPLAY_DIR``, no ``--port``, faults set); 3 the
port is taken; otherwise the recording's.
"""

from __future__ import annotations  # annotations stay text: no typing import at run time

import fcntl
import marshal
import os
import select
import sys
import time
import zlib

TYPE_CHECKING = False  # typing is not imported at run time (memory); mypy takes it as True
if TYPE_CHECKING:
    import signal
    import socket
    from collections.abc import Mapping
    from typing import Any, NoReturn
else:  # not ``signal`` / ``socket``: their enums cost ~1 MiB per process
    import _signal as signal
    import _socket as socket

ENV_DIR = "SGLANG_SIM_REPLAY_DIR"
KEY_ENV = ("SGLANG_SIM_VERSION", "SGLANG_SIM_HOST", "SGLANG_LOG_MS", "SGLANG_SIM_TIME_SCALE")
READY_TEXT = b"The server is fired up and ready to roll!"
PID_MARK = "\x00pid\x00"
PORT_MARK = "\x00port\x00"
FORMAT = 1
SETTLE_S = 0.3  # output after the ready line that still belongs to the start-up
RECORD_TIMEOUT_S = 300.0
MAX_REQUEST = 16384
_REASONS = {200: "OK", 404: "Not Found", 503: "Service Unavailable"}


class UsageError(Exception):
    """Bad usage: the message is printed and the process exits 2."""


def flag_value(flags: list[str], name: str) -> str | None:
    """The value of ``--name VALUE`` or ``--name=VALUE`` in ``flags``; None if absent."""
    for i, word in enumerate(flags):
        if word == name and i + 1 < len(flags):
            return flags[i + 1]
        if word.startswith(name + "="):
            return word[len(name) + 1:]
    return None


def normalized(flags: list[str]) -> list[str]:
    """``flags`` with the value of ``--port`` replaced by PORT_MARK."""
    out = list(flags)
    for i, word in enumerate(out):
        if word == "--port" and i + 1 < len(out):
            out[i + 1] = PORT_MARK
        elif word.startswith("--port="):
            out[i] = "--port=" + PORT_MARK
    return out


def key_of(flags: list[str], environ: Mapping[str, str]) -> str:
    """The recording's key: normalized flags plus the sim environment (text)."""
    return repr([normalized(flags), [environ.get(k) for k in KEY_ENV]])


def swap_number(text: str, old: str, new: str) -> str:
    """``text`` with every occurrence of the decimal ``old`` that is not part of a longer
    number replaced by ``new``."""
    out = []
    start = 0
    while True:
        at = text.find(old, start)
        if at < 0:
            out.append(text[start:])
            return "".join(out)
        end = at + len(old)
        if (at > 0 and text[at - 1].isdigit()) or (end < len(text) and text[end].isdigit()):
            out.append(text[start:end])
        else:
            out.append(text[start:at])
            out.append(new)
        start = end


def _is_stamp(line: str) -> int:
    """Whether ``line`` starts with ``[YYYY-MM-DD HH:MM:SS`` (length of the stamp or 0)."""
    if len(line) < 21 or line[0] != "[" or line[5] != "-" or line[8] != "-" or line[11] != " ":
        return 0
    if line[14] != ":" or line[17] != ":" or not line[1:5].isdigit():
        return 0
    if len(line) >= 25 and line[20] == "." and line[21:24].isdigit():
        return 24
    return 20


def restamp(text: str, at_line_start: bool, now: float) -> tuple[str, bool]:
    """``text`` with the stamp at each line start set to ``now`` (epoch seconds); returns
    (text, whether the text ended at a line start)."""
    pieces = text.split("\n")
    for i, piece in enumerate(pieces):
        if i == 0 and not at_line_start:
            continue
        size = _is_stamp(piece)
        if size:
            stamp = time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(now))
            if size == 24:
                stamp += f".{int(now * 1000) % 1000:03d}"
            pieces[i] = "[" + stamp + piece[size:]
    return "\n".join(pieces), text.endswith("\n")


# -- recording ---------------------------------------------------------------------------


def recorded_text(chunks: list[list[Any]], pid: int, port: int, whole: int | None = None,
                  ) -> list[list[Any]]:
    """The recorded ``[at, bytes]`` chunks as ``[at, text]`` (as many, in order: ``ready``
    indexes them) with ``pid`` and ``port`` marked for the replays. Pipe reads split lines
    anywhere (a loaded machine splits "127.0.0.1:33" | "109 "), and a number cut in two would
    not be swapped: each chunk is cut back to its last whole line, the rest carried into the
    next one; chunk ``whole`` (the one that showed the ready line) and the last are not cut."""
    out = []
    pending = b""
    for i, (at, data) in enumerate(chunks):
        data = pending + data
        last = i == len(chunks) - 1 or i == whole
        cut = len(data) if last else data.rfind(b"\n") + 1
        data, pending = data[:cut], data[cut:]
        s = data.decode("utf-8", "surrogateescape")
        s = swap_number(swap_number(s, str(pid), PID_MARK), str(port), PORT_MARK)
        out.append([round(at, 4), s])
    return out


def _free_port() -> int:
    s = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    try:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])
    finally:
        s.close()


def record(flags: list[str], environ: Mapping[str, str],
           timeout_s: float = RECORD_TIMEOUT_S) -> dict[str, Any]:
    """Run the real sim server with ``flags`` (its port replaced by a free one) and
    ``environ``; return the recording (a dict, see ``replay``)."""
    import subprocess  # the recorder only: the replaying servers stay lean

    port = _free_port()
    real = [w.replace(PORT_MARK, str(port)) for w in normalized(flags)]
    root = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    env = dict(environ)
    env["PYTHONPATH"] = os.pathsep.join(p for p in (root, env.get("PYTHONPATH")) if p)
    proc = subprocess.Popen([sys.executable, "-m", "launcher.sim.server", *real], env=env,
                            stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT)
    assert proc.stdout is not None
    fd = proc.stdout.fileno()
    t0 = time.monotonic()
    deadline = t0 + timeout_s
    startup, shutdown = [], []
    seen = b""
    ready = None
    eof = False
    try:
        while not eof:
            now = time.monotonic()
            if ready is not None:
                wait = SETTLE_S
            else:
                wait = deadline - now
                if wait <= 0:
                    raise RuntimeError(f"the sim did not get ready within {timeout_s:g} s")
            readable, _, _ = select.select([fd], [], [], wait)
            if not readable:
                break  # settled after the ready line
            data = os.read(fd, 65536)
            if not data:
                eof = True
                break
            startup.append([time.monotonic() - t0, data])
            if ready is None:
                seen = (seen + data)[-4096:]
                if READY_TEXT in seen:
                    ready = len(startup)
        if not eof:
            t1 = time.monotonic()
            proc.send_signal(signal.SIGTERM)
            while True:
                readable, _, _ = select.select([fd], [], [], max(0.0, deadline - time.monotonic()))
                if not readable:
                    raise RuntimeError("the sim did not exit after SIGTERM")
                data = os.read(fd, 65536)
                if not data:
                    break
                shutdown.append([time.monotonic() - t1, data])
            code = proc.wait(timeout=max(1.0, deadline - time.monotonic()))
            stop = [time.monotonic() - t1, code]
            start_exit = None
        else:
            code = proc.wait(timeout=max(1.0, deadline - time.monotonic()))
            start_exit = [time.monotonic() - t0, code]
            stop = None
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
        proc.stdout.close()


    return {
        "format": FORMAT, "key": key_of(flags, environ),
        "startup": recorded_text(startup, proc.pid, port,
                                 whole=None if ready is None else ready - 1),
        "ready": ready,
        "start_exit": start_exit, "shutdown": recorded_text(shutdown, proc.pid, port),
        "stop": stop,
    }


def load_or_record(directory: str, flags: list[str], environ: Mapping[str, str],
                   ) -> dict[str, Any]:
    """The recording for ``flags`` and ``environ`` in ``directory``, made now (under a lock,
    so one server records and the others wait for it) when there is none."""
    key = key_of(flags, environ)
    name = f"replay-{zlib.crc32(key.encode('utf-8', 'surrogateescape')) & 0xFFFFFFFF:08x}"
    path = os.path.join(directory, name + ".marshal")
    for attempt in (0, 1):
        try:
            with open(path, "rb") as fh:
                script: dict[str, Any] = marshal.load(fh)
        except FileNotFoundError:
            if attempt:
                raise
        else:
            if script.get("format") != FORMAT or script.get("key") != key:
                raise UsageError(f"{path}: a recording for other flags ({script.get('key')}); "
                                 f"use another {ENV_DIR}")
            return script
        os.makedirs(directory, exist_ok=True)
        with open(os.path.join(directory, name + ".lock"), "a") as lock:
            fcntl.flock(lock.fileno(), fcntl.LOCK_EX)
            if not os.path.exists(path):
                script = record(flags, environ)
                tmp = f"{path}.{os.getpid()}.tmp"
                with open(tmp, "wb") as fh:
                    marshal.dump(script, fh)
                os.replace(tmp, path)
    raise AssertionError("unreachable")


# -- replaying ---------------------------------------------------------------------------


class Replay:
    """One replaying server: its listening socket, log output and state."""

    def __init__(self, script: dict[str, Any], out_fd: int, port: int, pid: int) -> None:
        self.script = script
        self.out_fd = out_fd
        self.subs = ((PID_MARK, str(pid)), (PORT_MARK, str(port)))
        self.at_line_start = True
        self.state = "starting"  # then "up", "stopping"

    def write(self, text: str, now: float | None = None) -> None:
        """Write recorded ``text`` (marks substituted, stamps renewed), or with ``now`` a
        line of our own stamped ``now``."""
        if now is None:
            for mark, value in self.subs:
                text = text.replace(mark, value)
            text, self.at_line_start = restamp(text, self.at_line_start, time.time())
        else:
            text, _ = restamp(text, True, now)
        data = text.encode("utf-8", "surrogateescape")
        while data:
            data = data[os.write(self.out_fd, data):]

    def health(self) -> int:
        return 200 if self.state == "up" else 503

    def answer(self, conn: socket.socket, request: bytes, peer: tuple[str, int]) -> None:
        """Answer one request (bytes up to the blank line) and write its access line."""
        line = request.split(b"\r\n", 1)[0].decode("latin-1")
        parts = line.split()
        path = parts[1].split("?", 1)[0] if len(parts) >= 2 else ""
        code = self.health() if path in ("/health", "/health_generate") else 404
        body = b"" if code != 404 else b'{"detail":"Not Found"}'
        ctype = b"text/plain" if code != 404 else b"application/json"
        head = (b"HTTP/1.1 %d %s\r\nContent-Type: %s\r\nContent-Length: %d\r\n"
                b"Connection: close\r\n\r\n" % (code, _REASONS[code].encode(), ctype, len(body)))
        try:
            conn.settimeout(1.0)
            conn.sendall(head + body)
        except OSError:
            pass
        self.write(f'[0000-00-00 00:00:00] INFO:     {peer[0]}:{peer[1]} - "{line}" {code} '
                   f"{_REASONS[code]}\n", now=time.time())


def _exit_as(code: int) -> NoReturn:
    sys.stdout.flush()
    if code < 0:
        if -code != signal.SIGKILL:
            signal.signal(-code, signal.SIG_DFL)
        os.kill(os.getpid(), -code)
        time.sleep(10)
    os._exit(code if code >= 0 else 128 - code)


def serve(script: dict[str, Any], listener: socket.socket, out_fd: int = 1) -> NoReturn:
    """Replay ``script`` on ``out_fd`` while answering on ``listener``; never returns."""
    pid = os.getpid()
    port = listener.getsockname()[1]
    r = Replay(script, out_fd, port, pid)
    wake_r, wake_w = os.pipe()
    os.set_blocking(wake_r, False)
    os.set_blocking(wake_w, False)
    signal.set_wakeup_fd(wake_w)
    listener.setblocking(False)
    chunks = script["startup"]
    ready_at = script["ready"]
    end = script["start_exit"]
    t0 = time.monotonic()
    i = 0
    conns: dict[Any, list[Any]] = {}  # socket -> [bytes so far, peer, accepted at]
    while True:
        now = time.monotonic()
        while i < len(chunks) and t0 + chunks[i][0] <= now:
            r.write(chunks[i][1])
            i += 1
            if r.state == "starting" and ready_at is not None and i >= ready_at:
                r.state = "up"
                signal.signal(signal.SIGTERM, lambda signum, frame: None)
        if i >= len(chunks) and end is not None and t0 + end[0] <= now:
            _exit_as(int(end[1]))
        if i < len(chunks):
            timeout = max(0.0, t0 + chunks[i][0] - now)
        elif end is not None:
            timeout = max(0.0, t0 + end[0] - now)
        else:
            timeout = 30.0 if conns else None
        waiting: list[Any] = [listener, wake_r, *conns]
        readable, _, _ = select.select(waiting, [], [], timeout)
        for sock in readable:
            if sock is wake_r:
                try:
                    got = os.read(wake_r, 64)
                except BlockingIOError:
                    got = b""
                if signal.SIGTERM in got and r.state == "up":
                    r.state = "stopping"
                    chunks, i, t0 = script["shutdown"], 0, time.monotonic()
                    end = script["stop"]
            elif sock is listener:
                try:
                    fd, peer = listener._accept()
                except (BlockingIOError, InterruptedError):
                    continue
                conn = socket.socket(listener.family, socket.SOCK_STREAM, 0, fd)
                conn.setblocking(False)
                conns[conn] = [b"", peer[:2], time.monotonic()]
            else:
                entry = conns[sock]
                try:
                    data = sock.recv(4096)
                except (BlockingIOError, InterruptedError):
                    continue
                except OSError:
                    data = b""
                entry[0] += data
                if data and b"\r\n\r\n" not in entry[0] and len(entry[0]) < MAX_REQUEST:
                    continue
                del conns[sock]
                if entry[0].strip():
                    r.answer(sock, entry[0], entry[1])
                sock.close()
        now = time.monotonic()
        for sock in [s for s, e in conns.items() if now - e[2] > 30.0]:
            del conns[sock]
            sock.close()


def main(argv: list[str] | None = None) -> int:
    flags = sys.argv[1:] if argv is None else list(argv)
    try:
        directory = os.environ.get(ENV_DIR)
        if not directory:
            raise UsageError(f"{ENV_DIR} is not set (the directory of recordings)")
        if os.environ.get("SGLANG_SIM_FAULTS"):
            raise UsageError("SGLANG_SIM_FAULTS is set: faults are not replayed; run "
                             "launcher.sim.server")
        port_text = flag_value(flags, "--port")
        if port_text is None or not port_text.isdigit():
            raise UsageError("--port PORT is required")
        host = flag_value(flags, "--host") or "127.0.0.1"
        script = load_or_record(directory, flags, os.environ)
    except UsageError as exc:
        sys.stderr.write(f"launcher.sim.replay: {exc}\n")
        return 2
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    listener = socket.socket(family, socket.SOCK_STREAM)
    try:
        listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        listener.bind((host, int(port_text)))
        listener.listen(128)
    except OSError as exc:
        sys.stderr.write(f"ERROR:    [Errno {exc.errno}] error while attempting to bind on "
                         f"address ({host!r}, {port_text}): {exc.strerror}\n")
        return 3
    serve(script, listener)
    return 0


if __name__ == "__main__":
    sys.exit(main())
