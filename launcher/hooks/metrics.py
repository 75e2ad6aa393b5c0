"""Prometheus metrics: an event hook that keeps them, and the HTTP endpoint that serves them.

``Metrics`` is a supervisor event hook (``metrics(server, event)``,
``launcher.supervise.events``; see the event list) plus ``update_states(snapshots)`` for the
state gauges. ``Metrics.serve(host, port)`` starts the exposition endpoint (``GET /metrics``)
in a daemon thread.

The endpoint is prometheus-client's WSGI app (the same exposition, content negotiation and
compression as its ``start_http_server``) on a server that bounds what a client can hold (any
local user can connect to 127.0.0.1): each read and write of a connection times out after
``read_timeout``, and at most ``max_connections`` are open at once, a new one closing the
oldest. Idle connections so cost neither a thread nor a descriptor for long, and a scrape is
answered while they are open (docs/security.md, finding L5).

Exported series (labels ``server`` and ``host``, the GPU host it runs on, on every per-server
series; ``describe`` tells the host, model, version and endpoint of each server):

=============================================  ===========================================
``launcher_build_info{version,python_version}``  1: this launcher's version
``launcher_server_info{model,sglang_version,endpoint,gpus}``  1: what the server runs
``launcher_server_state{state}``                1 for the current state, 0 for every other
``launcher_server_ready``                       1 while ready (and probed healthy), else 0
``launcher_server_attempt``                     the current attempt number
``launcher_attempts_total``                     attempts started
``launcher_attempt_failures_total{outcome}``    failed attempts by outcome (``oom_kv_cache``)
``launcher_restarts_total``                     relaunches scheduled after having been ready
``launcher_time_to_ready_seconds``              start-up time of the last time it became ready
``launcher_startup_duration_seconds``           histogram of those start-up times
``launcher_probe_latency_seconds``              histogram of ``/health`` probe latencies
``launcher_probes_total{result}``               probes by result (``ok`` / ``failed``)
``launcher_host_unreachable``                   1 while the server's host cannot be reached
``launcher_host_unreachable_seconds_total``     time the host was unreachable (ended outages)
``launcher_attempt_mem_fraction_static``        the current attempt's ``--mem-fraction-static``
``launcher_attempt_cuda_graph_max_bs``          the current attempt's ``--cuda-graph-max-bs``
``launcher_stall_silence_seconds{phase}``       histogram: log silence when a stall was detected
``launcher_follow_failures_total``              times following the server's log failed
=============================================  ===========================================

The two ``launcher_attempt_*`` gauges are the OOM back-off's steps (the policy lowers them
after an out-of-memory failure); a series is absent while launcher leaves SGLang its default.
``launcher_stall_silence_seconds`` is the phase's stall budget plus the time launcher took to
notice (its detection latency for hangs).

``launcher_restarts_total``, ``launcher_follow_failures_total``,
``launcher_host_unreachable_seconds_total`` and ``launcher_host_unreachable`` exist at 0 from a
server's first attempt, so ``increase()`` counts their first event.

``launcher_leader{lease}`` is 1 while this launcher is the active one that supervises its
servers, else 0. ``lease`` is the ``[coordination]`` lease name, the fleet the launcher
belongs to (``""`` without ``[coordination]``: such a launcher always supervises and reads
1). With ``[coordination]`` the endpoint is served from the start, while standing by too:
0 until ``lease.acquired``, 1 while active, 0 after ``lease.lost`` (docs/ha.md). The alert
rules expect exactly one launcher reading 1 per lease.

No ``*_created`` series: prometheus-client's are disabled (``disable_created_metrics``), as
Prometheus ignores them in the text format and they double every counter's output.

Routers (``[[routers]]``, label ``router``):

==================================================  ==================================
``launcher_router_up``                              1 while the router answers /health
``launcher_router_worker_registered{server}``       1 while the server is its worker
==================================================  ==================================

State values are ``launcher.supervise.lifecycle.State`` values (``cuda_graph``, ``gave_up``, ...).
"""

from __future__ import annotations

import contextlib
import math
import platform
import socket
import threading
from collections.abc import Iterable, Mapping
from typing import Any, Protocol, cast
from wsgiref.simple_server import WSGIRequestHandler, WSGIServer

import structlog
from prometheus_client import (
    PLATFORM_COLLECTOR,
    PROCESS_COLLECTOR,
    CollectorRegistry,
    Counter,
    Gauge,
    Histogram,
    Info,
    disable_created_metrics,
    make_wsgi_app,
)

from launcher import __version__
from launcher.errors import ConfigError
from launcher.hooks.identity import ServerFacts
from launcher.supervise import events
from launcher.supervise.lifecycle import State

__all__ = ["Metrics", "MetricsServer", "ServerState"]

log = structlog.get_logger(__name__)

# Start-up takes from seconds (small model, warm cache) to the better part of an hour
# (70B weights from network storage plus CUDA graph capture).
STARTUP_BUCKETS = (10.0, 30.0, 60.0, 120.0, 300.0, 600.0, 900.0, 1200.0, 1800.0, 3600.0)

# A /health probe answers in milliseconds; seconds mean trouble (the probe's own timeout is
# 5 s by default: docs/config.md).
PROBE_BUCKETS = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0)

# A stall is detected after its phase's budget (defaults 300-1200 s, the demo's 20 s) plus a
# poll: the buckets span small budgets to past the longest default.
STALL_BUCKETS = (5.0, 10.0, 20.0, 30.0, 60.0, 120.0, 300.0, 600.0, 1200.0, 1800.0)

_STATES = [state.value for state in State]


class ServerState(Protocol):
    """What ``update_states`` reads from each server
    (``launcher.supervise.supervisor.Snapshot``)."""

    @property
    def server(self) -> str: ...

    @property
    def state(self) -> str: ...

    @property
    def attempt(self) -> int: ...


# A connection's reads and writes each time out after this; a scrape sends its request at once.
READ_TIMEOUT_S = 10.0
# Connections open at once; Prometheus scrapes over one at a time per scraper.
MAX_CONNECTIONS = 16


class _Handler(WSGIRequestHandler):
    """prometheus-client's handler (logs nothing), with the server's per-connection timeout."""

    def setup(self) -> None:
        super().setup()
        self.connection.settimeout(cast(_BoundedWSGIServer, self.server).read_timeout)

    def log_message(self, format: str, *args: Any) -> None:
        """Log nothing: a request per scrape would drown the event log."""


class _BoundedWSGIServer(WSGIServer):
    """A WSGI server with one daemon thread per connection, at most ``max_connections`` of
    them: a new connection beyond that closes the oldest (an idle one, unless the client
    opened ``max_connections`` more within one scrape). Threads are not joined on close:
    each ends by its connection's ``read_timeout``."""

    request_queue_size = 64

    def __init__(self, host: str, port: int, *, read_timeout: float,
                 max_connections: int) -> None:
        infos = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM, flags=socket.AI_PASSIVE)
        family, _, _, _, sockaddr = infos[0]
        self.address_family = family
        self.read_timeout = read_timeout
        self.max_connections = max_connections
        self._open: dict[socket.socket, None] = {}  # insertion order: oldest first
        self._open_lock = threading.Lock()
        super().__init__((str(sockaddr[0]), port), _Handler)

    def process_request(self, request: Any, client_address: Any) -> None:
        with self._open_lock:
            while len(self._open) >= self.max_connections:
                oldest = next(iter(self._open))
                del self._open[oldest]
                # Its thread's read returns at once; the thread closes the socket.
                with contextlib.suppress(OSError):
                    oldest.shutdown(socket.SHUT_RDWR)
            self._open[request] = None
        thread = threading.Thread(target=self._serve_one, args=(request, client_address),
                                  daemon=True, name="launcher-metrics-conn")
        thread.start()

    def _serve_one(self, request: Any, client_address: Any) -> None:
        try:
            self.finish_request(request, client_address)
        except Exception as exc:  # a timed-out or closed connection: nothing to report
            log.debug("metrics.connection_ended", error=repr(exc))
        finally:
            self.shutdown_request(request)

    def shutdown_request(self, request: Any) -> None:
        # Under the lock: an eviction never shuts down a descriptor number reused meanwhile.
        with self._open_lock:
            self._open.pop(request, None)
            super().shutdown_request(request)


class MetricsServer:
    """A running exposition endpoint; ``close()`` (or ``shutdown()``) stops it.

    ``host`` / ``port`` are the address actually bound (so port 0 reports the chosen one).

    Resource handling: owns a listening socket and one daemon thread, plus one per open
    connection (at most ``max_connections``, each ending by its ``read_timeout``); ``close``
    stops the loop, closes the socket and joins the loop's thread. ``close`` blocks for up to
    about half a second (the server's poll interval): from async code call it with
    ``anyio.to_thread.run_sync(server.close)``.
    """

    def __init__(self, httpd: WSGIServer, thread: threading.Thread) -> None:
        self._httpd = httpd
        self._thread = thread
        self._closed = False
        address = httpd.socket.getsockname()
        self.host: str = address[0]
        self.port: int = address[1]

    @property
    def url(self) -> str:
        """``http://HOST:PORT/metrics`` (IPv6 hosts in brackets)."""
        host = f"[{self.host}]" if ":" in self.host else self.host
        return f"http://{host}:{self.port}/metrics"

    def close(self) -> None:
        """Stop serving and release the socket. Idempotent."""
        if self._closed:
            return
        self._closed = True
        self._httpd.shutdown()
        self._httpd.server_close()
        self._thread.join(timeout=5)

    shutdown = close

    def __enter__(self) -> MetricsServer:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


class Metrics:
    """launcher's Prometheus metrics, fed by supervisor events and state snapshots.

    ``registry`` None makes a private registry with the process and platform collectors (so
    several ``Metrics`` can coexist, e.g. in tests); pass one to add the series elsewhere.
    ``lease`` labels ``launcher_leader`` (the ``[coordination]`` lease, ``""`` without);
    ``leader`` is its first value: True without ``[coordination]``, False for a launcher that
    starts as a standby (the lease events set it from then on).

    Error handling: the hook never raises into the supervisor. Missing or mistyped event
    data skips that figure; anything unexpected is logged as ``metrics.hook_failed``.
    Updates are in-memory under prometheus-client's locks, so the hook does not block.
    """

    def __init__(
        self,
        registry: CollectorRegistry | None = None,
        *,
        facts: Mapping[str, ServerFacts] | None = None,
        lease: str = "",
        leader: bool = True,
    ) -> None:
        # Process-wide in prometheus-client (there is no per-metric switch); launcher never
        # wants the *_created series, so turning them off for every registry is what we mean.
        disable_created_metrics()  # type: ignore[no-untyped-call]
        if registry is None:
            registry = CollectorRegistry()
            registry.register(PROCESS_COLLECTOR)
            registry.register(PLATFORM_COLLECTOR)
        self.registry = registry
        self._current: dict[str, str] = {}
        self._lock = threading.Lock()  # _current is read-modify-write from hook and updates
        self._hosts: dict[str, str] = {}
        self.build_info = Info(
            "launcher_build", "The launcher that serves these metrics.", registry=registry
        )
        self.build_info.info({"version": __version__,
                              "python_version": platform.python_version()})
        self.server_info = Info(
            "launcher_server",
            "What each server runs: model name, SGLang version, endpoint, GPUs.",
            ["server", "host"],
            registry=registry,
        )
        self.server_state = Gauge(
            "launcher_server_state",
            "1 for the server's current supervision state, 0 for the others.",
            ["server", "host", "state"],
            registry=registry,
        )
        self.server_ready = Gauge(
            "launcher_server_ready",
            "1 while the server is ready and answering /health, else 0.",
            ["server", "host"],
            registry=registry,
        )
        self.server_attempt = Gauge(
            "launcher_server_attempt",
            "The server's current attempt number (0 before the first launch).",
            ["server", "host"],
            registry=registry,
        )
        self.attempts = Counter(
            "launcher_attempts",
            "Launch attempts started.",
            ["server", "host"],
            registry=registry,
        )
        self.attempt_failures = Counter(
            "launcher_attempt_failures",
            "Attempts that failed, by classified outcome.",
            ["server", "host", "outcome"],
            registry=registry,
        )
        self.restarts = Counter(
            "launcher_restarts",
            "Relaunches scheduled after the server had been ready.",
            ["server", "host"],
            registry=registry,
        )
        self.time_to_ready = Gauge(
            "launcher_time_to_ready_seconds",
            "Seconds from start to ready, the last time the server became ready.",
            ["server", "host"],
            registry=registry,
        )
        self.startup_duration = Histogram(
            "launcher_startup_duration_seconds",
            "Seconds from start to ready, every time a server became ready.",
            ["server", "host"],
            buckets=STARTUP_BUCKETS,
            registry=registry,
        )
        self.probe_latency = Histogram(
            "launcher_probe_latency_seconds",
            "Latency of /health probes.",
            ["server", "host"],
            buckets=PROBE_BUCKETS,
            registry=registry,
        )
        self.probes = Counter(
            "launcher_probes",
            "/health probes, by result.",
            ["server", "host", "result"],
            registry=registry,
        )
        self.host_unreachable = Gauge(
            "launcher_host_unreachable",
            "1 while the server's host cannot be reached over its transport, else 0.",
            ["server", "host"],
            registry=registry,
        )
        self.router_up = Gauge(
            "launcher_router_up",
            "1 while the router is up (answering /health), else 0.",
            ["router"],
            registry=registry,
        )
        self.router_worker = Gauge(
            "launcher_router_worker_registered",
            "1 while the server is registered as a worker of the router, else 0.",
            ["router", "server"],
            registry=registry,
        )
        self.host_unreachable_seconds = Counter(
            "launcher_host_unreachable_seconds",
            "Seconds the server's host was unreachable, counted when each outage ends.",
            ["server", "host"],
            registry=registry,
        )
        self.attempt_mem_fraction = Gauge(
            "launcher_attempt_mem_fraction_static",
            "--mem-fraction-static of the current attempt (absent: SGLang's default).",
            ["server", "host"],
            registry=registry,
        )
        self.attempt_graph_bs = Gauge(
            "launcher_attempt_cuda_graph_max_bs",
            "--cuda-graph-max-bs of the current attempt (absent: SGLang's default).",
            ["server", "host"],
            registry=registry,
        )
        self.stall_silence = Histogram(
            "launcher_stall_silence_seconds",
            "Seconds of log silence when a stall was detected: the budget plus detection delay.",
            ["server", "host", "phase"],
            buckets=STALL_BUCKETS,
            registry=registry,
        )
        self.follow_failures = Counter(
            "launcher_follow_failures",
            "Times following the server's log and exit on its host failed (retried).",
            ["server", "host"],
            registry=registry,
        )
        self.leader = Gauge(
            "launcher_leader",
            "1 while this launcher is the active one supervising its servers, else 0.",
            ["lease"],
            registry=registry,
        )
        # Without [coordination] a running launcher is the one that supervises; with it, the
        # lease events set it (docs/ha.md).
        self._leader = self.leader.labels(lease)
        self._leader.set(1 if leader else 0)
        for server, server_facts in (facts or {}).items():
            self.describe(server, server_facts)

    # -- what each server is -------------------------------------------------------------

    def describe(self, server: str, facts: ServerFacts) -> None:
        """Set ``server``'s host label and its ``launcher_server_info`` series. Call it before
        the server's first event (the daemon does, once the SGLang version is known); a
        later call with another host leaves the earlier series under the old host."""
        with self._lock:
            old = self._hosts.get(server)
            self._hosts[server] = facts.host
        if old is not None and old != facts.host:
            self.server_info.remove(server, old)
        self.server_info.labels(server, facts.host).info({
            "model": facts.model,
            "sglang_version": facts.sglang_version,
            "endpoint": facts.endpoint,
            "gpus": facts.gpus,
        })

    def _host(self, server: str) -> str:
        """The host label of ``server``: its described host, "" before ``describe``."""
        return self._hosts.get(server, "")

    # -- the event hook -------------------------------------------------------------------

    def __call__(self, server: str, event: events.Event) -> None:
        """Record one supervisor event. Never raises."""
        try:
            self._record(server, event)
        except Exception:  # a hook must not break supervision; the metric is only skipped
            log.exception("metrics.hook_failed", server=server, hook_event=event.name)

    def _record(self, server: str, event: events.Event) -> None:
        if isinstance(event, events.LeaseAcquired | events.LeaseStandby | events.LeaseEnded):
            self._leader.set(1 if isinstance(event, events.LeaseAcquired) else 0)
            return
        host = self._host(server)
        match event:
            case events.AttemptStarted():
                self.attempts.labels(server, host).inc()
                self.server_ready.labels(server, host).set(0)
                self.server_attempt.labels(server, host).set(event.attempt)
                _set_or_remove(self.attempt_mem_fraction, (server, host),
                               _number(event.params.mem_fraction_static))
                _set_or_remove(self.attempt_graph_bs, (server, host),
                               _number(event.params.cuda_graph_max_bs))
                # Rare events' series exist at 0 from the first attempt on: one born at its
                # first event shows no increase() in a window holding its first sample, so
                # an alert on restarts would miss the first.
                for rare in (self.restarts, self.follow_failures, self.host_unreachable_seconds,
                             self.host_unreachable):
                    rare.labels(server, host)
            case events.StallDetected():
                silent = _number(event.silent_s)
                if silent is not None and silent >= 0:
                    self.stall_silence.labels(server, host, event.phase.value).observe(silent)
            case events.FollowFailed():
                self.follow_failures.labels(server, host).inc()
            case events.AttemptFailed():
                self.attempt_failures.labels(server, host, event.outcome.value).inc()
                self.server_ready.labels(server, host).set(0)
            case events.ServerReady():
                seconds = _number(event.seconds)
                if seconds is not None and seconds >= 0:
                    self.time_to_ready.labels(server, host).set(seconds)
                    self.startup_duration.labels(server, host).observe(seconds)
                self._set_state(server, State.READY.value)
            case events.Probed():
                latency = _number(event.latency_s)
                if latency is not None and latency >= 0:
                    self.probe_latency.labels(server, host).observe(latency)
                self.probes.labels(server, host, "ok" if event.ok else "failed").inc()
            case events.RestartScheduled():
                self.restarts.labels(server, host).inc()
            case events.ServerUnhealthy():
                self.server_ready.labels(server, host).set(0)
            case events.ServerGaveUp() | events.ServerInternalError():
                self._set_state(server, State.GAVE_UP.value)
            case events.ServerStopped():
                self._set_state(server, State.STOPPED.value)
            # A multi-node server's event names the node that is out of reach: that host is
            # the one to page (node 0's host may be fine). A node's series are born at 0 when
            # its first outage begins, so its seconds' first increase is seen.
            case events.HostLost():
                where = event.node or host
                self.host_unreachable.labels(server, where).set(1)
                self.host_unreachable_seconds.labels(server, where)
            case events.HostReachable():
                where = event.node or host
                self.host_unreachable.labels(server, where).set(0)
                seconds = _number(event.unreachable_s)
                if seconds is not None and seconds >= 0:
                    self.host_unreachable_seconds.labels(server, where).inc(seconds)
            # The router's events (``server`` is the router's name).
            case events.RouterReady():
                self.router_up.labels(server).set(1)
                for worker in event.servers:  # every server gets a series from the start
                    self.router_worker.labels(server, worker).set(0)
            case events.RouterDied() | events.RouterUnhealthy():
                self.router_up.labels(server).set(0)
                for worker in event.servers:  # a dead router has no workers
                    self.router_worker.labels(server, worker).set(0)
            case events.RouterGaveUp() | events.RouterInternalError():
                self.router_up.labels(server).set(0)
            case events.RouterWorkerRegistered():
                self.router_worker.labels(server, event.server).set(1)
            case events.RouterWorkerDeregistered():
                self.router_worker.labels(server, event.server).set(0)

    # -- state snapshots ------------------------------------------------------------------

    def update_states(self, snapshots: Iterable[ServerState]) -> None:
        """Set the state, ready and attempt gauges from the supervisors' snapshots."""
        for snap in snapshots:
            self._set_state(snap.server, str(snap.state))
            attempt = _number(snap.attempt)
            if attempt is not None:
                self.server_attempt.labels(snap.server, self._host(snap.server)).set(attempt)

    def _set_state(self, server: str, state: str) -> None:
        host = self._host(server)
        with self._lock:
            previous = self._current.get(server)
            if previous is None:
                # Every state gets a series, so `launcher_server_state{state="ready"} == 0`
                # is queryable before a server ever was ready.
                for name in _STATES:
                    self.server_state.labels(server, host, name).set(0)
            elif previous != state:
                self.server_state.labels(server, host, previous).set(0)
            self.server_state.labels(server, host, state).set(1)
            self._current[server] = state
        self.server_ready.labels(server, host).set(1 if state == State.READY.value else 0)

    # -- the endpoint ---------------------------------------------------------------------

    def serve(self, host: str, port: int, *, read_timeout: float = READ_TIMEOUT_S,
              max_connections: int = MAX_CONNECTIONS) -> MetricsServer:
        """Serve ``GET /metrics`` on ``host:port`` (port 0: any free port) in a daemon thread,
        each connection's reads and writes bounded by ``read_timeout`` and at most
        ``max_connections`` open at once (the oldest closed for a new one).

        Error handling: an address that cannot be bound (in use, not local, unresolvable)
        raises ConfigError naming ``metrics.listen``.
        """
        try:
            httpd = _BoundedWSGIServer(host, port, read_timeout=read_timeout,
                                       max_connections=max_connections)
        except OSError as exc:
            raise ConfigError(
                [
                    f"metrics.listen: cannot listen on {host}:{port}: "
                    f"{exc.strerror or exc}; pick a free local address"
                ],
                source="metrics",
            ) from None
        httpd.set_app(make_wsgi_app(self.registry))
        thread = threading.Thread(target=httpd.serve_forever, daemon=True,
                                  name="launcher-metrics")
        thread.start()
        server = MetricsServer(httpd, thread)
        log.info("metrics.serving", host=server.host, port=server.port)
        return server


def _set_or_remove(gauge: Gauge, labels: tuple[str, str], value: float | None) -> None:
    """Set ``gauge{labels}`` to ``value``, or remove that series when ``value`` is None."""
    if value is not None:
        gauge.labels(*labels).set(value)
    else:
        with contextlib.suppress(KeyError):  # never set: nothing to remove
            gauge.remove(*labels)


def _number(value: object) -> float | None:
    """``value`` as a finite float, or None for anything else (bools included)."""
    if isinstance(value, int | float) and not isinstance(value, bool) and math.isfinite(value):
        return float(value)
    return None
