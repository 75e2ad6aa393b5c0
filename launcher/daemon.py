"""The composition root of `launcher up`: config → transports → supervisors → hooks → signals.

:func:`run` wires the pieces together and supervises until the servers are done (or ready, with
``until_ready``), a stop is asked for (SIGINT/SIGTERM), or every server gave up. It prints
nothing and exits nothing: it returns a :class:`Result` that the CLI renders and turns into an
exit code, and it raises :class:`~launcher.errors.LauncherError` for what stops it early. A live
view, if any, is a :class:`View` the CLI supplies.
"""

from __future__ import annotations

import signal
import time
from dataclasses import dataclass, field
from typing import Protocol

import anyio
import structlog

from launcher.config.schema import Config, ServerConfig
from launcher.errors import LauncherError, LeaseLost, WontFit
from launcher.hooks import standby
from launcher.hooks.identity import ServerFacts
from launcher.hooks.metrics import Metrics, MetricsServer
from launcher.hooks.recorder import LedgerRecorder
from launcher.hooks.slack import SlackNotifier
from launcher.hooks.systemd import SdNotifier, run_watchdog, status_summary, watchdog_interval
from launcher.host import run as remote
from launcher.host.facts import GpuReadsOnce
from launcher.host.preflight import detect_sglang_version
from launcher.host.transport import make_transport
from launcher.host.transport.base import Transport
from launcher.host.transport.local import install_pidfd_child_watcher
from launcher.memory.estimate import Estimate
from launcher.params import LaunchParams
from launcher.plan.first_attempt import Planned, plan_first_attempt, warm_start
from launcher.plan.fleet import context_of
from launcher.sglang.classify import classify
from launcher.sglang.outcome import Outcome
from launcher.store.ledger import (
    Ledger,
    ObservationContext,
    fingerprint,
    ledger_path,
)
from launcher.store.lock import StateLock
from launcher.supervise import events
from launcher.supervise.lifecycle import State
from launcher.supervise.ranks import MultiNodeSupervisor
from launcher.supervise.router import routers_for, wire
from launcher.supervise.supervisor import ServerSupervisor, Snapshot, supervise_all
from launcher.untrusted import Redactor

__all__ = [
    "Options",
    "Result",
    "View",
    "close_ended",
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
    force: bool = False  # launch even when the memory estimate says nothing fits


@dataclass(frozen=True)
class Result:
    """How supervision ended. ``gave_up`` holds (server, reason) for each server that gave up;
    ``left_running`` the servers still running that launcher leaves behind (a stop was asked
    for, or ``until_ready``, without ``stop_on_exit``), ``routers_left_running`` the routers
    likewise; ``ready`` one flag per server: it reached ready at some point."""

    interrupted: bool
    until_ready: bool
    gave_up: list[tuple[str, str]]
    left_running: list[str]
    ready: list[bool]
    routers_left_running: list[str] = field(default_factory=list)


class View(Protocol):
    """A live picture of the servers (the CLI's terminal table)."""

    def start(self) -> None: ...

    def update(self, snapshots: list[Snapshot]) -> None: ...

    def stop(self) -> None: ...


def transports_for(config: Config, servers: list[ServerConfig]) -> dict[str, Transport]:
    """One transport per host the servers (every node of a multi-node server included) and
    their routers use (commands share its connections)."""
    transports = {h: make_transport(config.host(h)) for s in servers for h in s.node_hosts}
    for r in routers_for(config, servers):
        if r.host not in transports:
            transports[r.host] = make_transport(config.host(r.host))
    return transports


async def close_transports(transports: dict[str, Transport]) -> None:
    """Close every transport, shielded from cancellation (cleanup must finish)."""
    with anyio.CancelScope(shield=True):
        for t in transports.values():
            await t.aclose()


async def sglang_version_of(server: ServerConfig, transport: Transport) -> str:
    """The configured SGLang version, or the one installed on the server's host."""
    if server.sglang_version:
        return server.sglang_version
    return await detect_sglang_version(transport, server.command)


async def _already_running(config: Config, server: ServerConfig, transport: Transport) -> bool:
    """Whether an attempt of ``server`` runs on its host (to be adopted); False when the
    listing fails (the refusal stands)."""
    run_dir = config.run_dir_of(server)
    try:
        return await remote.find_running(transport, run_dir, server.name) is not None
    except LauncherError:
        return False


async def run(config: Config, servers: list[ServerConfig], secrets: dict[str, dict[str, str]],
              notifier: SlackNotifier, opts: Options, view: View | None = None,
              router_keys: dict[str, str | None] | None = None) -> Result:
    """Supervise ``servers`` under the state directory's lock until supervision ends.

    ``secrets`` maps each server to its resolved secret environment, ``router_keys`` each
    router to its resolved ``api_key`` (``resolve_router_api_key``); ``notifier`` is built by
    the caller (a malformed webhook is a config error before anything starts) and is drained,
    bounded, on the way out whatever happens.
    """
    install_pidfd_child_watcher()  # no thread per child process (local transport)
    transports = transports_for(config, servers)
    coordination = config.coordination
    try:
        with StateLock(config.state_dir), Ledger(ledger_path(config.state_dir)) as ledger:
            notifier.bind_store(ledger)  # dedupe and firing alerts survive a restart
            # Served from the start, while standing by too: launcher_leader reads 0 on a
            # standby rather than being absent (docs/ha.md).
            metrics, metrics_server = _serve_metrics(config)
            try:
                if coordination is not None:
                    hooks: list[events.Hook] = [notifier]
                    if metrics is not None:
                        hooks.append(metrics)
                    result = await standby.run_coordinated(
                        coordination, transports, hooks,
                        lambda fenced: _run_active(config, servers, secrets, notifier, opts,
                                                   view, router_keys, fenced, ledger,
                                                   metrics),
                        # the old active box's last good params and Slack memory
                        ledger=ledger, on_shared_loaded=lambda: notifier.bind_store(ledger))
                    if result is None:  # stopped while standing by: nothing was supervised
                        with anyio.CancelScope(shield=True):
                            await notifier.aclose(10.0)
                        return Result(interrupted=True, until_ready=opts.until_ready,
                                      gave_up=[], left_running=[],
                                      ready=[False] * len(servers))
                    return result
                return await _run_active(config, servers, secrets, notifier, opts, view,
                                         router_keys, transports, ledger, metrics)
            finally:
                if metrics_server is not None:
                    await anyio.to_thread.run_sync(metrics_server.close)
    finally:
        await close_transports(transports)


def _serve_metrics(config: Config) -> tuple[Metrics | None, MetricsServer | None]:
    """The metrics hook and its endpoint when ``[metrics]`` is set (ConfigError when its
    address cannot be bound). With ``[coordination]`` ``launcher_leader`` starts at 0 and the
    lease events move it."""
    if config.metrics is None:
        return None, None
    coordination = config.coordination
    metrics = Metrics(lease=coordination.lease if coordination is not None else "",
                      leader=coordination is None)
    server = metrics.serve(config.metrics.host, config.metrics.port)
    structlog.get_logger("launcher").info("metrics.listening", url=server.url)
    return metrics, server


async def _run_active(config: Config, servers: list[ServerConfig],
                      secrets: dict[str, dict[str, str]], notifier: SlackNotifier,
                      opts: Options, view: View | None,
                      router_keys: dict[str, str | None] | None,
                      transports: dict[str, Transport], ledger: Ledger,
                      metrics: Metrics | None) -> Result:
    """Supervise as the one active launcher (``run`` without ``[coordination]``, or once
    this launcher holds the lease: then ``transports`` are fenced). ``metrics`` is the
    served metrics hook, if any."""
    # before any task group: WontFit reaches the CLI as itself, and nothing started
    try:
        plans, fingerprints, keys = await _first_attempts(config, servers,
                                                          transports, ledger, opts)
    except BaseException:
        with anyio.CancelScope(shield=True):
            await notifier.aclose(10.0)
        raise
    for s, version, _, _, _ in plans:
        await close_ended(ledger, s, transports[s.host], config.run_dir_of(s), version,
                          secrets.get(s.name, {}))
    recorder = LedgerRecorder(ledger, fingerprints, contexts=keys.contexts)
    async with anyio.create_task_group() as tg:
        await tg.start(notifier.run)
        await tg.start(recorder.run)
        try:
            result = await _supervise(config, plans, recorder, keys, secrets,
                                      transports, notifier, opts, view, metrics, router_keys)
        finally:
            # Every attempt row written before the ledger closes (shielded, bounded;
            # a cancelled recorder drains what is queued too).
            await recorder.aclose(10.0)
            with anyio.CancelScope(shield=True):
                await notifier.aclose(10.0)
            tg.cancel_scope.cancel()
    return result


# What an attempt that ended while no launcher supervised it is closed as when its log gives
# no verdict of a failure (it reads as ready, or cannot be read).
ENDED_UNSUPERVISED = "ended_unsupervised"
CLOSED_TAIL = 64 * 1024  # bytes of such an attempt's log end read for the verdict


async def close_ended(ledger: Ledger, s: ServerConfig, transport: Transport, run_dir: str,
                      version: str, secret_env: dict[str, str]) -> int:
    """Close the ledger's open rows of ``s`` (an attempt it holds as running: the launcher
    that supervised it left it running, or died) whose server has ended since, as the host's
    run directory shows (a recorded exit status): with the classifier's verdict on the end of
    its log, else ``ENDED_UNSUPERVISED``. RESTARTS and `history` then count them as what they
    were. One listing, only when the ledger has such rows; what cannot be asked now is left
    for the next `up` (logged). Returns how many rows were closed."""
    log = structlog.get_logger("launcher").bind(server=s.name, host=s.host)
    open_rows = {r.attempt for r in ledger.history(s.name) if r.outcome is None}
    if not open_rows or s.nnodes > 1:  # a multi-node server's ranks run under other names
        return 0
    try:
        ended = await remote.ended_attempts(transport, run_dir, s.name, open_rows)
    except LauncherError as exc:
        log.warning("ledger.open_attempts_unchecked", error=str(exc)[:200])
        return 0
    redact = Redactor(list(secret_env.values()))
    for handle, status in ended:
        try:
            raw = await remote.tail_log(transport, handle, CLOSED_TAIL)
        except LauncherError:
            raw = b""
        tail = redact.text(raw.decode("utf-8", errors="replace"))
        lines = tail.splitlines()[1 if len(raw) >= CLOSED_TAIL else 0:]  # a cut first line
        diag = classify(lines, status, sglang_version=version) if lines else None
        outcome = (diag.outcome.value if diag is not None and diag.outcome is not Outcome.READY
                   else ENDED_UNSUPERVISED)
        ledger.attempt_finished(
            s.name, handle.attempt, outcome=outcome,
            phase=diag.phase.value if diag is not None else None,
            numbers=diag.numbers.as_dict() if diag is not None else {},
            evidence=redact(list(diag.evidence)) if diag is not None else [],
            log_tail=tail, ended_at=time.time())
        log.info("ledger.attempt_closed", attempt=handle.attempt, outcome=outcome,
                 exit_status=status)
    return len(ended)


# (server, version, first params, why, the first attempt's memory estimate)
_Plan = tuple[ServerConfig, str, LaunchParams, str, Estimate | None]


@dataclass
class _Keys:
    """What each server's observations are filed under (``launcher.plan.fleet``): the contexts the
    first attempts' estimates gave, and the servers whose key is still to be read."""

    contexts: dict[str, ObservationContext] = field(default_factory=dict)
    unkeyed: list[tuple[ServerConfig, str]] = field(default_factory=list)


# First-attempt estimates run at once for different servers, at most this many per host:
# each holds one exec session at a time, and the SSH transport keeps 8 per connection, so
# the estimates fit one connection with room for the host's other commands.
FIRST_ATTEMPTS_PER_HOST = 4


async def _first_attempt(config: Config, s: ServerConfig, transport: Transport,
                         ledger: Ledger, opts: Options) -> tuple[str, str, Planned]:
    """One server's SGLang version, fingerprint and first attempt."""
    version = await sglang_version_of(s, transport)
    fp = fingerprint(s, config.host(s.host), version)
    configured = s.launch_params()
    start = warm_start(ledger, config, s, [version], fresh=opts.fresh)
    first = await plan_first_attempt(config, s, transport, version, configured,
                                     warm=start.warm, configured_reason=start.reason,
                                     ledger=ledger)
    return version, fp, first


async def _first_attempts(config: Config, servers: list[ServerConfig],
                          transports: dict[str, Transport], ledger: Ledger, opts: Options,
                          ) -> tuple[list[_Plan], dict[str, str], _Keys]:
    """Per server: (server, version, first params, why) and its fingerprint. Raises WontFit
    for the servers the estimate refuses (unless ``opts.force`` or already running).

    The servers are estimated concurrently (FIRST_ATTEMPTS_PER_HOST at a time per host), and
    each distinct nvidia-smi query runs once per host (``GpuReadsOnce``): the GPUs do not
    change before the first launch. The results, their order and the errors are those of
    estimating one server after the other: when some servers' estimates raise, the first
    such server's exception (in ``servers`` order) is raised once all have finished."""
    log = structlog.get_logger("launcher")
    fingerprints: dict[str, str] = {}
    keys = _Keys()
    plans: list[_Plan] = []
    refused: list[tuple[str, str]] = []
    reads = {s.host: GpuReadsOnce(transports[s.host], config.host(s.host).nvidia_smi)
             for s in servers}
    limiters = {host: anyio.CapacityLimiter(FIRST_ATTEMPTS_PER_HOST) for host in reads}
    outcomes: list[tuple[str, str, Planned] | Exception | None] = [None] * len(servers)

    async def one(i: int, s: ServerConfig) -> None:
        try:
            async with limiters[s.host]:
                outcomes[i] = await _first_attempt(config, s, reads[s.host], ledger, opts)
        except LeaseLost:
            raise  # not a failure: the lease is gone (docs/ha.md)
        except Exception as exc:  # raised below, in server order; cancellation goes through
            outcomes[i] = exc

    async with anyio.create_task_group() as tg:
        for i, s in enumerate(servers):
            tg.start_soon(one, i, s)
    for outcome in outcomes:
        if isinstance(outcome, Exception):
            raise outcome
    for s, outcome in zip(servers, outcomes, strict=True):
        assert outcome is not None and not isinstance(outcome, Exception)
        version, fp, first = outcome
        fingerprints[s.name] = fp
        if first.observation is not None:
            keys.contexts[s.name] = first.observation
        else:  # its key is read beside the supervision (launch not delayed)
            keys.unkeyed.append((s, version))
        if first.refused:
            if await _already_running(config, s, transports[s.host]):
                # a running server (launched with --force, or before this estimate) is
                # adopted, not refused; a relaunch would be refused again
                log.warning("estimate.refused_but_running", server=s.name, reason=first.reason)
            elif not opts.force:
                refused.append((s.name, first.reason))
                continue
            else:
                log.warning("estimate.forced", server=s.name, reason=first.reason)
        initial, why = first.params, first.reason
        log.info("params.initial", server=s.name, params=initial.describe(), reason=why,
                 source=first.source, sglang_version=version)
        plans.append((s, version, initial, why, first.estimate))
    if refused:
        raise WontFit(
            "the memory estimate says nothing fits; nothing was launched:\n" + "\n".join(
                f"  {name}: {reason}" for name, reason in refused),
            servers=[name for name, _ in refused],
            remedy="follow the fix above, or `launcher up --force` to launch anyway")
    return plans, fingerprints, keys


async def _supervise(config: Config, plans: list[_Plan], recorder: LedgerRecorder,
                     keys: _Keys, secrets: dict[str, dict[str, str]],
                     transports: dict[str, Transport],
                     notifier: SlackNotifier, opts: Options, view: View | None,
                     metrics: Metrics | None,
                     router_keys: dict[str, str | None] | None = None) -> Result:
    log = structlog.get_logger("launcher")
    servers = [s for s, _, _, _, _ in plans]
    facts: dict[str, ServerFacts] = {}
    for s, version, _, _, _ in plans:
        facts[s.name] = ServerFacts.of(s, config.host(s.host), version)
        notifier.describe(s.name, facts[s.name])
    hooks: list[events.Hook] = [recorder, notifier]
    if metrics is not None:
        for name, server_facts in facts.items():
            metrics.describe(name, server_facts)
        hooks.append(metrics)
    sd = SdNotifier.from_env()
    # The routers get the hooks so far (ledger, Slack, metrics); the servers also the
    # registrar, which registers them with their routers.
    routing = wire(config, servers, transports, list(hooks), stop_on_exit=opts.stop_on_exit,
                   api_keys=router_keys)
    if routing.supervisors:
        hooks.append(routing.registrar)
    sups = [
        MultiNodeSupervisor(config, s, transports, sglang_version=version,
                            secret_env=secrets[s.name], stop_on_exit=opts.stop_on_exit,
                            initial=initial, initial_reason=why, hooks=hooks,
                            before_stop=routing.before_stop, estimate=estimate)
        if s.nnodes > 1 else
        ServerSupervisor(config, s, transports[s.host], sglang_version=version,
                         secret_env=secrets[s.name], stop_on_exit=opts.stop_on_exit,
                         initial=initial, initial_reason=why, hooks=hooks,
                         before_stop=routing.before_stop, estimate=estimate)
        for s, version, initial, why, estimate in plans
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
        if sd is not None:
            # systemctl status follows the phases as they change, not only at the watchdog's
            # pings (every 30 s); a broken line is logged by run_watchdog, never fatal here.
            try:
                sd.status_if_changed(status_summary(snapshots()))
            except Exception:
                log.exception("systemd.status_failed")

    async def file_keys() -> None:
        """The observation key of servers the first attempt's choice read no facts for,
        FIRST_ATTEMPTS_PER_HOST at a time per host."""
        limiters = {s.host: anyio.CapacityLimiter(FIRST_ATTEMPTS_PER_HOST)
                    for s, _ in keys.unkeyed}

        async def file_key(s: ServerConfig, version: str) -> None:
            try:
                async with limiters[s.host]:
                    context = await context_of(transports[s.host], config.host(s.host), s,
                                               version)
            except LauncherError as exc:  # HostKeyError: the supervisor reports it
                log.info("fleet.key_unknown", server=s.name, error=str(exc)[:200])
                return
            if context is not None:
                recorder.set_context(s.name, context)

        async with anyio.create_task_group() as tg:
            for s, version in keys.unkeyed:
                tg.start_soon(file_key, s, version)

    try:
        async with anyio.create_task_group() as tg:
            tg.start_soon(watch_signals)
            for rsup in routing.supervisors:
                tg.start_soon(rsup.run)
            tg.start_soon(file_keys)
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
                if opts.until_ready and routing.supervisors and not interrupted:
                    # Ready includes the routers and the registration of the ready servers.
                    with anyio.move_on_after(config.policy.start_deadline):
                        await routing.settled()
            finally:
                if view is not None:
                    view.update(snapshots())  # the final states, whatever the last tick saw
                    view.stop()
            tg.cancel_scope.cancel()
    finally:
        if sd is not None:
            sd.stopping()
            sd.close()
    gave_up = [sup for sup in sups if sup.state is State.GAVE_UP]
    left: list[str] = []
    routers_left: list[str] = []
    if interrupted or opts.until_ready:
        left = [sup.server.name for sup in sups if sup.machine.pid and not opts.stop_on_exit
                and sup.state is not State.GAVE_UP]
        routers_left = [r.router.name for r in routing.supervisors
                        if r.handle is not None and not opts.stop_on_exit]
    return Result(
        interrupted=interrupted, until_ready=opts.until_ready,
        gave_up=[(sup.server.name, sup.snapshot().reason) for sup in gave_up],
        left_running=left,
        routers_left_running=routers_left,
        ready=[sup.machine.ready_at is not None for sup in sups],
    )
