"""The simulated cluster fabric of a multi-node server (``--nnodes N --node-rank R``).

SGLang's ranks rendezvous through torch's TCPStore on ``--dist-init-addr`` and then talk over
gloo (CPU groups) and NCCL. The simulator models both by one TCP connection from each node
R >= 1 to node 0, on the very address ``--dist-init-addr`` names, so that the failure modes are
the real ones:

- node 0 waits in "Init parallel" until every node has connected (a peer that never comes is a
  silent wait, as torch's rendezvous is);
- a node whose process dies closes its socket, and every surviving node sees it at once and
  dies with gloo's ``Connection closed by peer`` (SGLang ``request_receiver.py`` broadcasts over
  the gloo CPU group every scheduler iteration, idle or not);
- a stopped node (SIGSTOP) closes nothing: the others wait, silent, as in a real collective;
- node 0 waits for every node's "joined" (their schedulers are ready) before it serves, and
  on a graceful shutdown broadcasts the ShutdownReq that stops the other nodes.

Ranks >= 1 serve SGLang's dummy health server (``utils/common.py``
``launch_dummy_health_check_server``): ``/health``, ``/health_generate`` and ``/ping`` always
answer 200.
"""

from __future__ import annotations

import contextlib
import socket
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

JOINED = b"J"
SHUTDOWN = b"S"
GATE = b"G"

# torch prints this (no SGLang prefix) once every rank has joined the gloo group.
GLOO_CONNECTED = ("[Gloo] Rank {rank} is connected to {peers} peer ranks. Expected number of "
                  "connected peer ranks is : {peers}")
CROSS_NODE_ALLREDUCE = ("Custom allreduce is disabled because this process group spans across "
                        "nodes.")
GLOO_PEER_CLOSED = ("RuntimeError: [../third_party/gloo/gloo/transport/tcp/pair.cc:534] "
                    "Connection closed by peer [{address}]:{port}")
DUMMY_STARTED = "Dummy health check server started in background thread at {host}:{port}"
DUMMY_STOPPED = "Dummy health check server stopped at {host}:{port}"
SIGTERM_IGNORED = ("SIGTERM received on node_rank {rank}; waiting for the rank-0 ShutdownReq "
                   "broadcast to stop the schedulers.")
TCPSTORE_IN_USE = ("torch.distributed.DistNetworkError: The server socket has failed to listen "
                   "on any local network address. port: {port}, useIpv6: false, code: -98, "
                   "name: EADDRINUSE, message: address already in use")


def split_addr(addr: str) -> tuple[str, int]:
    """``host:port`` (``[v6]:port``) → (host, port)."""
    host, _, port = addr.rpartition(":")
    return host.strip("[]"), int(port)


class Fabric:
    """This node's side of the rendezvous and of the peer connections.

    ``lost`` is set (with the peer's address) once a peer's connection closes without a
    shutdown; ``shutdown`` once node 0 broadcast its ShutdownReq. The main thread polls both.
    """

    def __init__(self, nnodes: int, rank: int, addr: str) -> None:
        self.nnodes, self.rank = nnodes, rank
        self.host, self.port = split_addr(addr)
        self.lost: tuple[str, int] | None = None
        self.shutdown = threading.Event()
        self.gate = threading.Event()  # node 0 broadcast "activated" (gated launch)
        self._joined: set[int] = set()
        self._peers: list[socket.socket] = []
        self._lock = threading.Lock()
        self._listener: socket.socket | None = None

    # -- rendezvous --------------------------------------------------------------------------

    def listen(self) -> None:
        """Node 0: open the store's port (raises OSError when it is taken)."""
        sock = socket.socket(socket.AF_INET6 if ":" in self.host else socket.AF_INET)
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.bind((self.host, self.port))
        sock.listen(16)
        self._listener = sock

    def rendezvous(self, alive: threading.Event | None = None) -> None:
        """Block until every node is connected (node 0) or this node reached node 0 (others,
        retrying the connection as torch's store client does)."""
        if self.rank == 0:
            assert self._listener is not None
            while len(self._peers) < self.nnodes - 1:
                conn, _ = self._listener.accept()
                conn.recv(1)  # the peer's hello
                with self._lock:
                    self._peers.append(conn)
                threading.Thread(target=self._watch, args=(conn,), daemon=True).start()
            return
        while True:
            try:
                conn = socket.create_connection((self.host, self.port), timeout=5.0)
                break
            except OSError:
                time.sleep(0.05)
        conn.settimeout(None)
        conn.sendall(b"H")
        with self._lock:
            self._peers.append(conn)
        threading.Thread(target=self._watch, args=(conn,), daemon=True).start()

    def _watch(self, conn: socket.socket) -> None:
        peer = conn.getpeername()[:2]
        while True:
            try:
                data = conn.recv(64)
            except OSError:
                data = b""
            if not data:
                if not self.shutdown.is_set():
                    self.lost = (str(peer[0]), int(peer[1]))
                return
            if SHUTDOWN in data:
                self.shutdown.set()
            if GATE in data:
                self.gate.set()
            if JOINED in data:
                with self._lock:
                    self._joined.add(id(conn))

    # -- after start-up ----------------------------------------------------------------------

    def join(self) -> None:
        """Nodes >= 1: tell node 0 this node's schedulers are ready."""
        for conn in self._peers:
            with contextlib.suppress(OSError):
                conn.sendall(JOINED)

    def all_joined(self) -> bool:
        """Node 0: whether every other node said it joined."""
        with self._lock:
            return len(self._joined) >= self.nnodes - 1

    def open_gate(self) -> None:
        """Node 0: the gated launch's "activated" broadcast (once)."""
        if self.gate.is_set():
            return
        self.gate.set()
        for conn in self._peers:
            with contextlib.suppress(OSError):
                conn.sendall(GATE)

    def broadcast_shutdown(self) -> None:
        """Node 0: the ShutdownReq broadcast that stops every other node."""
        self.shutdown.set()
        for conn in self._peers:
            with contextlib.suppress(OSError):
                conn.sendall(SHUTDOWN)
                conn.shutdown(socket.SHUT_WR)


class _DummyHandler(BaseHTTPRequestHandler):
    def do_GET(self) -> None:
        code = 200 if self.path.split("?")[0] in ("/health", "/health_generate", "/ping") else 404
        self.send_response(code)
        self.send_header("Content-Length", "0")
        self.end_headers()

    def log_message(self, format: str, *args: object) -> None:
        pass  # uvicorn runs it with log_level="warning": no access lines


def serve_dummy_health(host: str, port: int) -> ThreadingHTTPServer:
    """SGLang's dummy health server of a node >= 1, serving in a daemon thread."""
    httpd = ThreadingHTTPServer((host, port), _DummyHandler)
    httpd.daemon_threads = True
    threading.Thread(target=httpd.serve_forever, name="health-check-server", daemon=True).start()
    return httpd


class _GateHandler(BaseHTTPRequestHandler):
    opened: threading.Event

    def do_GET(self) -> None:
        self._answer(200 if self.path == "/health" else 404)

    def do_POST(self) -> None:
        if self.path == "/gate/activate":
            self.opened.set()
            self._answer(200)
        else:
            self._answer(404)

    def _answer(self, code: int) -> None:
        body = b"OK" if code == 200 else b""
        self.send_response(code)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, format: str, *args: object) -> None:
        pass


def serve_gate(address: tuple[str, int], opened: threading.Event) -> ThreadingHTTPServer:
    """0.5.23's gated-launch control server (``GET /health``, ``POST /gate/activate``) in a
    daemon thread; ``opened`` is set on activation."""
    handler = type("GateHandler", (_GateHandler,), {"opened": opened})
    httpd = ThreadingHTTPServer(address, handler)
    httpd.daemon_threads = True
    threading.Thread(target=httpd.serve_forever, name="gated-launch", daemon=True).start()
    return httpd
