"""The composition root of `launcher up`: config → transports → supervisors → hooks → signals.

:func:`run` wires the pieces together and supervises until the servers are done (or ready, with
``until_ready``), a stop is asked for (SIGINT/SIGTERM), or every server gave up. It prints
nothing and exits nothing: it returns a :class:`Result` that the CLI renders and turns into an
exit code, and it raises :class:`~launcher.errors.LauncherError` for what stops it early. A live
view, if any, is a :class:`View` the CLI supplies.
"""

from __future__ import annotations

import signal
from dataclasses import dataclass
from typing import Protocol

import anyio
import structlog

from launcher import remote
from launcher.config import Config, ServerConfig
from launcher.lifecycle import State
from launcher.metrics import Metrics
from launcher.notify import SlackNotifier
from launcher.params import LaunchParams
from launcher.store import (
    Ledger,
    LedgerRecorder,
    StateLock,
    fingerprint,
    initial_params,
    ledger_path,
)
from launcher.supervisor import EventHook, ServerSupervisor, Snapshot, supervise_all
from launcher.systemd import SdNotifier, run_watchdog, status_summary, watchdog_interval
from launcher.transport import make_transport
from launcher.transport.base import Transport
from launcher.transport.local import install_pidfd_child_watcher

__all__ = [
    "Options",
    "Result",
    "View",
    "close_transports",
    "run",
    "sglang_version_of",
    "transports_for",
]


@dataclass(frozen=True)
class Options:
    """The flags of `launcher up` that shape supervision."""

    until_ready: bool = False
    stop_on_exit: bool = False
    fresh: bool = False


@dataclass(frozen=True)
class Result:
    """How supervision ended. ``gave_up`` holds (server, reason) for each server that gave up;
    ``left_running`` the servers still running that launcher leaves behind (a stop was asked
    for, or ``until_ready``, without ``stop_on_exit``); ``ready`` one flag per server: it
    reached ready at some point."""

    interrupted: bool
    until_ready: bool
    gave_up: list[tuple[str, str]]
    left_running: list[str]
    ready: list[bool]


class View(Protocol):
    """A live picture of the servers (the CLI's terminal table)."""

    def start(self) -> None: ...

    def update(self, snapshots: list[Snapshot]) -> None: ...

    def stop(self) -> None: ...


def transports_for(config: Config, servers: list[ServerConfig]) -> dict[str, Transport]:
    """One transport per host the servers use (their commands share its connections)."""
    return {s.host: make_transport(config.host(s.host)) for s in servers}


async def close_transports(transports: dict[str, Transport]) -> None:
    """Close every transport, shielded from cancellation (cleanup must finish)."""
    with anyio.CancelScope(shield=True):
        for t in transports.values():
            await t.aclose()


async def sglang_version_of(server: ServerConfig, transport: Transport) -> str:
    """The configured SGLang version, or the one installed on the server's host."""
    if server.sglang_version:
        return server.sglang_version
    return await remote.detect_sglang_version(transport, server.command)


async def run(config: Config, servers: list[ServerConfig], secrets: dict[str, dict[str, str]],
              notifier: SlackNotifier, opts: Options, view: View | None = None) -> Result:
    """Supervise ``servers`` under the state directory's lock until supervision ends.

    ``secrets`` maps each server to its resolved secret environment; ``notifier`` is built by
    the caller (a malformed webhook is a config error before anything starts) and is drained,
    bounded, on the way out whatever happens.
    """
    install_pidfd_child_watcher()  # no thread per child process (local transport)
    transports = transports_for(config, servers)
    try:
        with StateLock(config.state_dir), Ledger(ledger_path(config.state_dir)) as ledger:
            async with anyio.create_task_group() as tg:
                await tg.start(notifier.run)
                try:
                    result = await _supervise(config, servers, secrets, transports, ledger,
                                              notifier, opts, view)
                finally:
                    with anyio.CancelScope(shield=True):
                        await notifier.aclose(10.0)
                    tg.cancel_scope.cancel()
        return result
    finally:
        await close_transports(transports)


async def _supervise(config: Config, servers: list[ServerConfig],
                     secrets: dict[str, dict[str, str]], transports: dict[str, Transport],
                     ledger: Ledger, notifier: SlackNotifier, opts: Options,
                     view: View | None) -> Result:
    log = structlog.get_logger("launcher")
    fingerprints: dict[str, str] = {}
    plans: list[tuple[ServerConfig, str, LaunchParams]] = []
    for s in servers:
        version = await sglang_version_of(s, transports[s.host])
        fp = fingerprint(s, config.host(s.host), version)
        fingerprints[s.name] = fp
        initial, why = initial_params(ledger, fp, s.launch_params(), opts.fresh)
        log.info("params.initial", server=s.name, params=initial.describe(), reason=why,
                 sglang_version=version)
        plans.append((s, version, initial))
    recorder = LedgerRecorder(ledger, fingerprints)
    hooks: list[EventHook] = [recorder, notifier]
    metrics = Metrics() if config.metrics else None
    metrics_server = None
    if metrics is not None and config.metrics is not None:
        hooks.append(metrics)
        metrics_server = metrics.serve(config.metrics.host, config.metrics.port)
        log.info("metrics.listening", url=metrics_server.url)
    sd = SdNotifier.from_env()
    sups = [
        ServerSupervisor(config, s, transports[s.host], sglang_version=version,
                         secret_env=secrets[s.name], stop_on_exit=opts.stop_on_exit,
                         initial=initial, hooks=hooks)
        for s, version, initial in plans
    ]
    interrupted = False

    async def watch_signals() -> None:
        nonlocal interrupted
        with anyio.open_signal_receiver(signal.SIGINT, signal.SIGTERM) as signals:
            async for _ in signals:
                interrupted = True
                for sup in sups:
                    sup.request_stop(kill=opts.stop_on_exit)
                return

    def snapshots() -> list[Snapshot]:
        return [s.snapshot() for s in sups]

    async def tick() -> None:
        if view is not None:
            view.update(snapshots())
        if metrics is not None:
            metrics.update_states(snapshots())

    try:
        async with anyio.create_task_group() as tg:
            tg.start_soon(watch_signals)
            if sd is not None:
                # READY=1 means "supervising", not "every server is ready" (that can take an
                # hour); the watchdog pings from this loop so a wedged loop gets restarted.
                sd.ready(status_summary(snapshots()))
                interval = watchdog_interval()
                if interval is not None:
                    await tg.start(run_watchdog, sd, interval,
                                   lambda: status_summary(snapshots()))
            if view is not None:
                view.update(snapshots())
                view.start()
            try:
                await supervise_all(sups, until_ready=opts.until_ready, on_tick=tick)
            finally:
                if view is not None:
                    view.stop()
            tg.cancel_scope.cancel()
    finally:
        if sd is not None:
            sd.stopping()
            sd.close()
        if metrics_server is not None:
            await anyio.to_thread.run_sync(metrics_server.close)
        recorder.close()
    gave_up = [sup for sup in sups if sup.state is State.GAVE_UP]
    left: list[str] = []
    if interrupted or opts.until_ready:
        left = [sup.server.name for sup in sups if sup.machine.pid and not opts.stop_on_exit
                and sup.state is not State.GAVE_UP]
    return Result(
        interrupted=interrupted, until_ready=opts.until_ready,
        gave_up=[(sup.server.name, sup.snapshot().reason) for sup in gave_up],
        left_running=left,
        ready=[sup.machine.ready_at is not None for sup in sups],
    )
