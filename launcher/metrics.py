"""Prometheus metrics: an event hook that keeps them, and the HTTP endpoint that serves them.

``Metrics`` is a supervisor event hook (``metrics(server, event)``, ``launcher.events``; see the
event list) plus ``update_states(snapshots)`` for the state gauges. ``Metrics.serve(host,
port)`` starts the exposition endpoint (``GET /metrics``) in a daemon thread.

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
=============================================  ===========================================

No ``*_created`` series: prometheus-client's are disabled (``disable_created_metrics``), as
Prometheus ignores them in the text format and they double every counter's output.

Routers (``[[routers]]``, label ``router``):

==================================================  ==================================
``launcher_router_up``                              1 while the router answers /health
``launcher_router_worker_registered{server}``       1 while the server is its worker
==================================================  ==================================

State values are ``launcher.lifecycle.State`` values (``cuda_graph``, ``gave_up``, ...).
"""

from __future__ import annotations

import math
import platform
import threading
from collections.abc import Iterable, Mapping
from typing import Protocol
from wsgiref.simple_server import WSGIServer

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
    start_http_server,
)

from launcher import __version__, events
from launcher.errors import ConfigError
from launcher.facts import ServerFacts
from launcher.lifecycle import State

__all__ = ["Metrics", "MetricsServer", "ServerState"]

log = structlog.get_logger(__name__)

# Start-up takes from seconds (small model, warm cache) to the better part of an hour
# (70B weights from network storage plus CUDA graph capture).
STARTUP_BUCKETS = (10.0, 30.0, 60.0, 120.0, 300.0, 600.0, 900.0, 1200.0, 1800.0, 3600.0)

# A /health probe answers in milliseconds; seconds mean trouble (the probe's own timeout is
# 5 s by default: docs/config.md).
PROBE_BUCKETS = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0)

_STATES = [state.value for state in State]


class ServerState(Protocol):
    """What ``update_states`` reads from each server (``launcher.supervisor.Snapshot``)."""

    @property
    def server(self) -> str: ...

    @property
    def state(self) -> str: ...

    @property
    def attempt(self) -> int: ...


class MetricsServer:
    """A running exposition endpoint; ``close()`` (or ``shutdown()``) stops it.

    ``host`` / ``port`` are the address actually bound (so port 0 reports the chosen one).

    Resource handling: owns a listening socket and one daemon thread (plus one per request);
    ``close`` stops the loop, closes the socket and joins the thread. ``close`` blocks for up
    to about half a second (the server's poll interval): from async code call it with
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

    Error handling: the hook never raises into the supervisor. Missing or mistyped event
    data skips that figure; anything unexpected is logged as ``metrics.hook_failed``.
    Updates are in-memory under prometheus-client's locks, so the hook does not block.
    """

    def __init__(
        self,
        registry: CollectorRegistry | None = None,
        *,
        facts: Mapping[str, ServerFacts] | None = None,
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
        host = self._host(server)
        match event:
            case events.AttemptStarted():
                self.attempts.labels(server, host).inc()
                self.server_ready.labels(server, host).set(0)
                self.server_attempt.labels(server, host).set(event.attempt)
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
            case events.HostUnreachable():
                self.host_unreachable.labels(server, host).set(1)
            case events.HostReachable():
                self.host_unreachable.labels(server, host).set(0)
                seconds = _number(event.unreachable_s)
                if seconds is not None and seconds >= 0:
                    self.host_unreachable_seconds.labels(server, host).inc(seconds)
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

    def serve(self, host: str, port: int) -> MetricsServer:
        """Serve ``GET /metrics`` on ``host:port`` (port 0: any free port) in a daemon thread.

        Error handling: an address that cannot be bound (in use, not local, unresolvable)
        raises ConfigError naming ``metrics.listen``.
        """
        try:
            httpd, thread = start_http_server(port, addr=host, registry=self.registry)
        except OSError as exc:
            raise ConfigError(
                [
                    f"metrics.listen: cannot listen on {host}:{port}: "
                    f"{exc.strerror or exc}; pick a free local address"
                ],
                source="metrics",
            ) from None
        server = MetricsServer(httpd, thread)
        log.info("metrics.serving", host=server.host, port=server.port)
        return server


def _number(value: object) -> float | None:
    """``value`` as a finite float, or None for anything else (bools included)."""
    if isinstance(value, int | float) and not isinstance(value, bool) and math.isfinite(value):
        return float(value)
    return None
