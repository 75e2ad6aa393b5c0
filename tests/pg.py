"""A real PostgreSQL server for the coordination tests, and a TCP proxy that can cut a client
off from it.

``Postgres`` runs the Debian package's server (``/usr/lib/postgresql/<v>/bin``): initdb into
a fresh directory, ``pg_ctl start`` on a free loopback port, ``stop`` at teardown. The server
refuses to run as root, so under root (CI) it runs as ``nobody`` through ``setpriv`` in a
directory that user owns. Fails (never skips) when PostgreSQL is not installed:
``scripts/setup.sh --test`` installs it.

``CutProxy`` forwards 127.0.0.1:<port> to the server; ``cut()`` turns it into a black hole
(bytes are held, new connections hang, nothing is closed: what a network partition looks
like to a client), ``restore()`` forwards again.
"""

from __future__ import annotations

import contextlib
import glob
import os
import shutil
import socket
import subprocess
import tempfile
import threading
import time
from pathlib import Path

from tests.simhost import free_port


def pg_bin() -> Path:
    """The newest installed PostgreSQL's bin directory."""
    found = sorted(glob.glob("/usr/lib/postgresql/*/bin/pg_ctl"),
                   key=lambda p: int(Path(p).parent.parent.name))
    if not found:
        raise AssertionError("PostgreSQL is not installed: run scripts/setup.sh --test "
                             "(apt-get install postgresql)")
    return Path(found[-1]).parent


def _as_db_user() -> list[str]:
    if os.geteuid() == 0:
        if not shutil.which("setpriv"):
            raise AssertionError("running as root needs setpriv (util-linux) for PostgreSQL")
        return ["setpriv", "--reuid=nobody", "--regid=nogroup", "--clear-groups"]
    return []


class Postgres:
    """One throw-away PostgreSQL server on 127.0.0.1 (trust authentication, user
    ``launcher``, database ``postgres``)."""

    def __init__(self) -> None:
        self.bin = pg_bin()
        self.root = Path(tempfile.mkdtemp(prefix="launcher-pg-"))
        self.data = self.root / "data"
        self.port = free_port()
        self.prefix = _as_db_user()
        if self.prefix:
            os.chown(self.root, 65534, 65534)
        self.root.chmod(0o755)

    @property
    def dsn(self) -> str:
        return self.dsn_at(self.port)

    @staticmethod
    def dsn_at(port: int) -> str:
        return f"postgresql://launcher@127.0.0.1:{port}/postgres"

    def _run(self, *argv: str, timeout: float = 60.0) -> None:
        subprocess.run([*self.prefix, *argv], cwd=self.root, check=True, timeout=timeout,
                       stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)

    def start(self) -> None:
        if not self.data.exists():
            self._run(str(self.bin / "initdb"), "-D", str(self.data), "-U", "launcher",
                      "--auth=trust", "-E", "UTF8", "--no-sync")
        options = (f"-p {self.port} -k {self.root} -c listen_addresses=127.0.0.1 "
                   "-c fsync=off -c synchronous_commit=off -c full_page_writes=off")
        self._run(str(self.bin / "pg_ctl"), "-D", str(self.data), "-l",
                  str(self.root / "log"), "-o", options, "-w", "-t", "60", "start")

    def stop(self, mode: str = "fast") -> None:
        subprocess.run([*self.prefix, str(self.bin / "pg_ctl"), "-D", str(self.data), "-m",
                        mode, "-w", "-t", "60", "stop"], cwd=self.root, timeout=90,
                       stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)

    def restart(self) -> None:
        """Stop (fast: sessions are ended) and start again on the same port."""
        self.stop("fast")
        self.start()

    def cleanup(self) -> None:
        self.stop("immediate")
        shutil.rmtree(self.root, ignore_errors=True)


class CutProxy:
    """A TCP forwarder 127.0.0.1:``port`` → 127.0.0.1:``target`` that a test can cut."""

    def __init__(self, target: int) -> None:
        self.target = target
        self._open = threading.Event()
        self._open.set()
        self._closing = False
        self._listener = socket.create_server(("127.0.0.1", 0))
        self.port: int = self._listener.getsockname()[1]
        self._sockets: list[socket.socket] = []
        self._lock = threading.Lock()
        threading.Thread(target=self._accept, daemon=True, name="cutproxy-accept").start()

    def cut(self) -> None:
        """From now on nothing goes through in either direction; nothing is closed."""
        self._open.clear()

    def restore(self) -> None:
        self._open.set()

    def close(self) -> None:
        self._closing = True
        self._open.set()
        with self._lock:
            for s in [self._listener, *self._sockets]:
                with contextlib.suppress(OSError):
                    s.close()

    def _accept(self) -> None:
        while not self._closing:
            try:
                client, _ = self._listener.accept()
            except OSError:
                return
            threading.Thread(target=self._serve, args=(client,), daemon=True).start()

    def _serve(self, client: socket.socket) -> None:
        with self._lock:
            self._sockets.append(client)
        self._open.wait()  # a new connection hangs while cut
        try:
            upstream = socket.create_connection(("127.0.0.1", self.target), timeout=10)
        except OSError:
            client.close()
            return
        upstream.settimeout(None)
        with self._lock:
            self._sockets.append(upstream)
        for a, b in ((client, upstream), (upstream, client)):
            threading.Thread(target=self._pump, args=(a, b), daemon=True).start()

    def _pump(self, src: socket.socket, dst: socket.socket) -> None:
        while True:
            try:
                data = src.recv(65536)
            except OSError:
                data = b""
            while not self._open.is_set() and not self._closing:
                time.sleep(0.05)  # held: a partition loses nothing, it only delays
            if not data or self._closing:
                for s in (src, dst):
                    with contextlib.suppress(OSError):
                        s.shutdown(socket.SHUT_RDWR)
                return
            try:
                dst.sendall(data)
            except OSError:
                return
