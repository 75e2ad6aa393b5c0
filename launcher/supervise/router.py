"""The SGLang router in front of servers: its supervision and the registration of its workers.

:class:`RouterSupervisor` runs one configured router (``[[routers]]``) like a server: launched
detached with the run protocol of ``remote`` (``<run_dir>/<router>/<attempt>/``), followed
(death is noticed by the follower within about ``remote.FOLLOW_POLL_S``), probed on ``/health``
through the host's transport, relaunched after a death, a start-up past ``start_deadline`` or
``probe_failures`` failed probes in a row, within the restart budget of ``[policy]``
(``backoff.RestartBackoff``). A running router left by an earlier launcher is adopted.
Cancelling ``run`` leaves the router running, unless ``stop_on_exit``.

:class:`Registrar` keeps each router's workers equal to its servers that are ready:

- a server is registered once it is ready (``server.ready``, adopted ones too);
- it is deregistered as soon as it dies or turns unhealthy (``process.died``,
  ``attempt.failed``, ``server.unhealthy``, ``server.gave_up``), and *before* launcher stops
  or relaunches it (``before_stop``, awaited by the server's supervisor before its stop);
- it is registered again once it is ready again;
- a router that (re)starts is reconciled from its own listing: every ready server missing
  from it is registered (so a router restart re-registers every ready worker), and a
  configured server listed but not ready is deregistered.

Hooks receive the router's events with the router's name in the ``server`` slot:
``router.launched``, ``router.adopted``, ``router.ready``, ``router.died``,
``router.unhealthy``, ``router.restart_scheduled``, ``router.gave_up``,
``router.worker_registered``, ``router.worker_deregistered`` (with ``after_s``: seconds from
the trigger to the router confirming the removal), ``router.registration_failed``.
"""

from __future__ import annotations

import shlex
import time
from collections.abc import Awaitable, Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import anyio
import anyio.abc
import structlog

from launcher.config.schema import Config, RouterConfig, ServerConfig, worker_url
from launcher.errors import (
    HostUnreachable,
    LauncherError,
    LeaseLost,
    describe_exception,
    format_traceback,
    is_transient,
    reraise_lease_lost,
)
from launcher.host import health
from launcher.host import run as remote
from launcher.host.router_api import RouterClient, normalize
from launcher.host.transport.base import Transport
from launcher.sglang.flags import SECRET_ARG_ENV, mask_secret_flags
from launcher.supervise import events
from launcher.supervise.backoff import Doubling, RestartBackoff, Sleeper, sleep_or

# Server events after which a server must not be a worker any more.
LEAVE_EVENTS = (
    events.ProcessDied, events.AttemptFailed, events.ServerUnhealthy, events.ServerGaveUp,
    events.StallDetected, events.ServerInternalError,
)
_BEFORE_STOP_WAIT_S = 10.0  # a stop waits at most this long for the deregistration
_RETRY_S = 1.0  # the next reconcile after a failed call
_RESYNC_S = 5.0  # compare with the router's own listing at least this often
_RETRY_MAX_S = 10.0  # the longest wait of a listing or a follow tried again until it works

log = structlog.get_logger("launcher.router")


def server_host(server: ServerConfig) -> str:
    """The host a server answers on: its ``host`` (node 0 of a multi-node server)."""
    nodes = getattr(server, "nodes", None)
    if isinstance(nodes, list | tuple) and nodes:
        return str(nodes[0])
    return str(server.host)


def worker_urls(config: Config, router: RouterConfig) -> dict[str, str]:
    """The URL the router reaches each of its servers at, by server name."""
    urls = {}
    for name in router.servers:
        s = config.server(name)
        host = server_host(s)
        urls[name] = normalize(worker_url(router, name, host, s.port, s.listen,
                                          config.host(host).address))
    return urls


def plan_rows(config: Config) -> list[dict[str, Any]]:
    """What ``launcher plan`` shows of each router: its command line, run dir and workers."""
    rows = []
    for r in config.routers:
        argv = mask_secret_flags(r.argv())
        rows.append({
            "router": r.name, "host": r.host, "argv": argv,
            "command": " ".join(_quote(a) for a in argv), "env": dict(r.env),
            "run_dir": f"{config.run_dir_of(r)}/{r.name}/<attempt>",
            "workers": worker_urls(config, r),
        })
    return rows


def _quote(arg: str) -> str:
    return shlex.quote(arg)


def routers_for(config: Config, servers: Sequence[ServerConfig]) -> list[RouterConfig]:
    """The routers in front of any of ``servers`` (all of them without ``--server``)."""
    names = {s.name for s in servers}
    return [r for r in config.routers if names & set(r.servers)]


@dataclass
class Routing:
    """The routers of one ``launcher up`` and their registrar, as the daemon wires them: add
    ``registrar`` to the servers' hooks, pass ``before_stop`` to their supervisors, run each
    of ``supervisors``."""

    registrar: Registrar
    supervisors: list[RouterSupervisor]

    @property
    def before_stop(self) -> Callable[[str, str], Awaitable[None]] | None:
        return self.registrar.before_stop if self.supervisors else None

    async def settled(self) -> None:
        """Return once every router is ready (or gave up) and every ready server is
        registered with each live router in front of it (``launcher up --until-ready``)."""
        while True:
            done = all(
                sup.state == "gave_up" or (sup.state == "ready" and all(
                    state != "pending" and not state.startswith("failed")
                    for state in self.registrar.registration(sup.router.name).values()))
                for sup in self.supervisors
            )
            if done:
                return
            await self.registrar.changed()


def wire(config: Config, servers: Sequence[ServerConfig], transports: dict[str, Transport],
         hooks: Sequence[events.Hook], *, stop_on_exit: bool = False,
         api_keys: Mapping[str, str | None] | None = None) -> Routing:
    """The routers in front of ``servers`` with their supervisors (on ``transports``, which
    must hold the routers' hosts) and one registrar managing only ``servers``. ``api_keys``
    holds the resolved ``api_key`` of each router that has one (``resolve_router_api_key``)."""
    keys = api_keys or {}
    routers = routers_for(config, servers)
    registrar = Registrar(config, routers, hooks, managed={s.name for s in servers})
    return Routing(registrar, [
        RouterSupervisor(config, r, transports[r.host], registrar, hooks=hooks,
                         stop_on_exit=stop_on_exit, api_key=keys.get(r.name))
        for r in routers
    ])


# --- registration ---------------------------------------------------------------------------


@dataclass
class _RouterState:
    router: RouterConfig
    urls: dict[str, str]
    attached: bool = False
    registered: dict[str, str] = field(default_factory=dict)  # server -> url
    wake: anyio.Event = field(default_factory=anyio.Event)
    adding: set[str] = field(default_factory=set)  # registrations in flight
    leave_asked: dict[str, float] = field(default_factory=dict)  # server -> when it had to go
    last_error: dict[str, str] = field(default_factory=dict)


class Registrar:
    """Registers ready servers with their routers (an ``events.Hook`` plus one ``serve`` task per
    live router). The hook never blocks: it records the change and wakes the router's task."""

    def __init__(self, config: Config, routers: Sequence[RouterConfig],
                 hooks: Sequence[events.Hook] = (), *,
                 clock: Callable[[], float] = time.monotonic,
                 sleep: Sleeper = anyio.sleep, resync_s: float = _RESYNC_S,
                 managed: set[str] | None = None) -> None:
        """``managed``: the servers this launcher supervises (default: all); a router's
        other servers are left as the router has them. Its waits (the resync, a retry)
        are ``sleep``."""
        self.hooks = list(hooks)
        self.clock = clock
        self.sleep = sleep
        self.resync_s = resync_s
        self.ready: set[str] = set()
        self._changed = anyio.Event()  # set (and replaced) when a registration comes or goes
        self._routers = {
            r.name: _RouterState(r, {name: url for name, url in worker_urls(config, r).items()
                                     if managed is None or name in managed})
            for r in routers
        }

    # -- the hook (server events) ------------------------------------------------------

    def __call__(self, server: str, event: events.Event) -> None:
        if isinstance(event, events.ServerReady):
            self.ready.add(server)
            self._wake(server)
        elif isinstance(event, LEAVE_EVENTS) or (
                isinstance(event, events.ServerStopped) and not event.left_running):
            self._leave(server)

    async def before_stop(self, server: str, reason: str) -> None:
        """Deregister ``server`` from every live router before it is stopped; returns once
        no live router lists it, or after a bounded wait (a router that cannot be reached
        must never keep a server from being stopped)."""
        self._leave(server)
        with anyio.move_on_after(_BEFORE_STOP_WAIT_S):
            while any(st.attached and (server in st.registered or server in st.adding)
                      for st in self._routers.values()):
                await self._changed.wait()

    def _registrations_changed(self) -> None:
        self._changed.set()
        self._changed = anyio.Event()

    async def changed(self) -> None:
        """Return at the next change of registrations (or after at most a second, for changes
        made elsewhere, such as a router becoming ready)."""
        await sleep_or(self.sleep, 1.0, self._changed)

    def _leave(self, server: str) -> None:
        self.ready.discard(server)
        now = self.clock()
        for st in self._routers.values():
            if server in st.registered:
                st.leave_asked.setdefault(server, now)
        self._wake(server)

    def _wake(self, server: str) -> None:
        for st in self._routers.values():
            if server in st.urls:
                st.wake.set()

    # -- what status and metrics show --------------------------------------------------

    def registration(self, router: str) -> dict[str, str]:
        """Each server of ``router``: ``registered``, ``not ready``, ``pending`` (ready, not
        yet listed), ``failed: ...`` or ``router down``."""
        st = self._routers[router]
        out = {}
        for s in st.urls:
            if not st.attached:
                out[s] = "router down"
            elif s in st.registered:
                out[s] = "registered"
            elif s in st.last_error and s in self.ready:
                out[s] = f"failed: {st.last_error[s]}"
            elif s in self.ready:
                out[s] = "pending"
            else:
                out[s] = "not ready"
        return out

    # -- one live router -----------------------------------------------------------------

    async def serve(self, router: RouterConfig, client: RouterClient) -> None:
        """Keep ``router``'s workers in step with the ready servers until cancelled (the
        router died, or supervision ends). The router's own listing is the truth at start
        and at least every ``resync_s``.

        Removals are made in this loop, one after the other; each addition runs in a task of
        its own, so a worker the router is slow to accept (it checks the worker first) never
        delays the removal of a dead one."""
        st = self._routers[router.name]
        st.attached, st.registered = True, {}
        try:
            async with anyio.create_task_group() as tg:
                synced = -float("inf")
                while True:
                    st.wake = anyio.Event()
                    if self.clock() - synced >= self.resync_s and await self._sync(st, client):
                        synced = self.clock()
                    ok = await self._remove_leavers(st, client)
                    for server in st.urls:
                        if (server in self.ready and server not in st.registered
                                and server not in st.adding):
                            st.adding.add(server)
                            tg.start_soon(self._add, st, client, server)
                    await sleep_or(self.sleep, self.resync_s if ok else _RETRY_S, st.wake)
        finally:
            # Whatever the router had is its own business now (it died, or launcher leaves
            # it running): nothing is known to be registered until it is listed again.
            st.attached = False
            st.registered.clear()
            st.adding.clear()
            st.leave_asked.clear()
            self._registrations_changed()

    async def _sync(self, st: _RouterState, client: RouterClient) -> bool:
        """Take the router's listing as the truth about which servers it has."""
        try:
            listed = await client.workers()
        except LeaseLost:
            raise  # not a failure: the lease is gone (docs/ha.md)
        except Exception as exc:  # LauncherError, or httpx errors past their retries
            self._failed(st, "", exc)
            return False
        for server, url in st.urls.items():
            if url in listed and server not in st.registered and server not in st.adding:
                st.registered[server] = url
                self._emit(st.router.name, events.RouterWorkerRegistered(
                    server=server, url=url, found=True))
            elif url not in listed and server in st.registered:
                del st.registered[server]  # the router lost it (a restart): add it again
                self._registrations_changed()
                self._emit(st.router.name, events.RouterWorkerDeregistered(
                    server=server, url=url, reason="not listed by the router", after_s=None))
        return True

    async def _remove_leavers(self, st: _RouterState, client: RouterClient) -> bool:
        ok = True
        for server in [s for s in st.registered if s not in self.ready]:
            url = st.registered[server]
            try:
                await client.deregister(url)
            except LeaseLost:
                raise  # not a failure: the lease is gone (docs/ha.md)
            except Exception as exc:
                self._failed(st, server, exc)
                ok = False
                continue
            del st.registered[server]
            self._registrations_changed()
            asked = st.leave_asked.pop(server, None)
            after = None if asked is None else round(self.clock() - asked, 3)
            self._emit(st.router.name, events.RouterWorkerDeregistered(
                server=server, url=url, reason="not ready", after_s=after))
        return ok

    async def _add(self, st: _RouterState, client: RouterClient, server: str) -> None:
        url = st.urls[server]
        try:
            worker = await client.register(url)
        except LeaseLost:
            raise  # not a failure: the lease is gone (docs/ha.md)
        except Exception as exc:
            self._failed(st, server, exc)
            await self.sleep(_RETRY_S)  # then the next round tries again
            return
        else:
            if server not in self.ready:  # it left while being added: remove it again
                st.leave_asked.setdefault(server, self.clock())
            st.registered[server] = url
            st.last_error.pop(server, None)
            self._emit(st.router.name, events.RouterWorkerRegistered(
                server=server, url=url, worker_id=worker.id,
                api="legacy" if client.legacy else "workers"))
        finally:
            st.adding.discard(server)
            self._registrations_changed()
            st.wake.set()

    def _failed(self, st: _RouterState, server: str, exc: BaseException) -> None:
        error = str(exc).splitlines()[0] if str(exc) else type(exc).__name__
        if server:
            st.last_error[server] = error
        self._emit(st.router.name, events.RouterRegistrationFailed(
            server=server or None, error=error))

    def _emit(self, router: str, event: events.Event) -> None:
        log.info(event.name, router=router, **event.to_dict())
        for hook in self.hooks:
            hook(router, event)


# --- supervision ----------------------------------------------------------------------------


@dataclass
class RouterSnapshot:
    """What status and the live view show of a router."""

    router: str
    host: str
    port: int
    state: str  # starting, ready, restarting, gave_up, stopped
    attempt: int
    pid: int | None
    workers: dict[str, str]  # server -> registration state


class RouterSupervisor:
    """Brings one router up and keeps it there; its workers are the registrar's business."""

    def __init__(self, config: Config, router: RouterConfig, transport: Transport,
                 registrar: Registrar, *, hooks: Sequence[events.Hook] = (),
                 stop_on_exit: bool = False, clock: Callable[[], float] = time.monotonic,
                 sleep: Sleeper = anyio.sleep, api_key: str | None = None) -> None:
        if router.api_key is not None and not api_key:
            raise ValueError(f"router {router.name!r} has an api_key reference: resolve it "
                             "(resolve_router_api_key) and pass its value")
        self.config = config
        self.api_key = api_key  # secret: only in the env file and the Authorization header
        self.router = router
        self.transport = transport
        self.registrar = registrar
        self.hooks = list(hooks)
        self.stop_on_exit = stop_on_exit
        self.clock = clock
        self.sleep = sleep  # every wait: the restart delay, retries, the probe interval
        self.policy = config.policy
        p = self.policy
        self.backoff = RestartBackoff(p.restart_backoff_initial, p.restart_backoff_max,
                                      p.healthy_reset, p.restart_budget, p.restart_window)
        self.state = "starting"
        self.attempt = 0
        self.handle: remote.RunHandle | None = None
        self.log = log.bind(router=router.name, host=router.host)

    @property
    def run_dir(self) -> str:
        return self.config.run_dir_of(self.router)

    def snapshot(self) -> RouterSnapshot:
        return RouterSnapshot(
            router=self.router.name, host=self.router.host, port=self.router.port,
            state=self.state, attempt=self.attempt,
            pid=self.handle.pid if self.handle else None,
            workers=self.registrar.registration(self.router.name),
        )

    async def run(self, *, task_status: anyio.abc.TaskStatus[None] = anyio.TASK_STATUS_IGNORED,
                  ) -> str:
        """Supervise until the restart budget is spent (returns ``gave_up``) or cancelled."""
        task_status.started()
        try:
            try:
                found = await self._survey()
            except LauncherError as exc:  # a refused host key or login: asking again won't do
                self.state = "gave_up"
                self._emit(events.RouterGaveUp(attempt=self.attempt, reason=str(exc)))
                return self.state
            self.attempt = found.latest
            self.handle = found.running
            if self.handle is not None:
                self.attempt = self.handle.attempt
                self._emit(events.RouterAdopted(attempt=self.attempt, pid=self.handle.pid))
            while True:
                detail: Any  # the exit status ("exited"), else a text
                if self.handle is None:
                    self.handle = await self._launch()
                    if self.handle is None:
                        why, detail = "launch_failed", "the launch failed"
                    else:
                        why, detail = await self._watch(self.handle)
                else:
                    why, detail = await self._watch(self.handle)
                servers = tuple(self.router.servers)  # none is its worker any more
                if why == "exited":
                    self._emit(events.RouterDied(attempt=self.attempt, exit_status=detail,
                                                 servers=servers))
                elif self.handle is not None:
                    self._emit(events.RouterUnhealthy(attempt=self.attempt, reason=why,
                                                      detail=detail, servers=servers))
                    await self._stop(self.handle, why)
                self.handle = None
                delay = self.backoff.on_failure(self.clock())
                if delay is None:
                    self.state = "gave_up"
                    self._emit(events.RouterGaveUp(attempt=self.attempt,
                                                   reason=f"{why}: {detail}"))
                    return self.state
                self.state = "restarting"
                self._emit(events.RouterRestartScheduled(delay_s=round(delay, 2)))
                await self.sleep(delay)
        except anyio.get_cancelled_exc_class():
            if self.stop_on_exit and self.handle is not None:
                with anyio.CancelScope(shield=True):
                    await self._stop(self.handle, "launcher stopping")
                self.state = "stopped"
            raise
        except Exception as exc:  # never cancellation (BaseException), handled above
            reraise_lease_lost(exc)  # the lease is lost: no failure, end it all
            # A bug in the router's supervision: give the router up, keep the servers
            # (docs/security.md, finding H1). The router keeps running, unsupervised.
            self.state = "gave_up"
            self._emit(events.RouterInternalError(
                error=describe_exception(exc), traceback=format_traceback(exc),
                attempt=self.attempt or None))
            return self.state

    async def _survey(self) -> remote.Survey:
        waits = Doubling(0.5, _RETRY_MAX_S)
        while True:
            try:
                return await remote.survey(self.transport, self.run_dir, self.router.name,
                                           adopting=True)
            except LauncherError as exc:
                if not is_transient(exc):
                    raise
                wait = waits.next()
                self._emit(events.RouterListingFailed(error=str(exc), retry_in_s=wait))
                await self.sleep(wait)

    async def _launch(self) -> remote.RunHandle | None:
        self.attempt += 1
        self.state = "starting"
        spec = remote.AttemptSpec(
            server=self.router.name, attempt=self.attempt, run_dir=self.run_dir,
            argv=self.router.argv(),
            env={**self.router.env, "LAUNCHER_ROUTER": self.router.name,
                 "LAUNCHER_ATTEMPT": str(self.attempt)},
            # argv() appends --api-key from this variable inside the router's process
            secret_env={SECRET_ARG_ENV.format(0): self.api_key} if self.api_key else {},
        )
        try:
            handle = await remote.launch(self.transport, spec)
        except LauncherError as exc:
            self._emit(events.RouterLaunchFailed(attempt=self.attempt, error=str(exc)))
            return None
        self._emit(events.RouterLaunched(attempt=self.attempt, pid=handle.pid,
                                         command=tuple(mask_secret_flags(spec.argv))))
        return handle

    async def _stop(self, handle: remote.RunHandle, reason: str) -> None:
        with anyio.CancelScope(shield=True):
            try:
                await remote.stop(self.transport, handle, grace=5.0, kill_wait=5.0)
            except LauncherError as exc:
                self._emit(events.RouterStopFailed(reason=reason, error=str(exc)))

    async def _watch(self, handle: remote.RunHandle) -> tuple[str, Any]:
        """Follow and probe one attempt until it exits, stays unhealthy or misses its start
        deadline: ("exited", exit status), ("unhealthy", detail) or ("deadline", detail)."""
        ended: list[tuple[str, Any]] = []
        async with anyio.create_task_group() as tg:

            def end(why: str, detail: Any) -> None:
                if not ended:
                    ended.append((why, detail))
                tg.cancel_scope.cancel()

            tg.start_soon(self._follow, handle, end)
            tg.start_soon(self._probing, handle, end)
        if self.state == "ready":
            self.state = "restarting"
        return ended[0] if ended else ("exited", None)

    async def _follow(self, handle: remote.RunHandle, end: Callable[[str, Any], None]) -> None:
        offset, waits = 0, Doubling(0.5, _RETRY_MAX_S)
        while True:
            try:
                async for item in remote.follow(self.transport, handle, offset):
                    if isinstance(item, remote.LogChunk):
                        offset = item.end_offset
                        waits.reset()  # following works again: the next failure starts small
                    else:
                        end("exited", item.status)
                        return
                return
            except LauncherError as exc:  # unreachable or a failed read: follow again
                wait = waits.next()
                self._emit(events.RouterFollowFailed(error=str(exc), retry_in_s=wait))
                await self.sleep(wait)

    async def _probing(self, handle: remote.RunHandle, end: Callable[[str, Any], None]) -> None:
        """``_probe``; a host that refuses the port forward (its key, the login) ends the
        attempt as unhealthy instead of ending ``launcher up`` (the restart budget bounds
        the retries)."""
        try:
            await self._probe(handle, end)
        except* LeaseLost:
            raise  # not a failure: the lease is gone (docs/ha.md)
        except* LauncherError as group:
            end("unhealthy", str(group.exceptions[0]))

    async def _probe(self, handle: remote.RunHandle, end: Callable[[str, Any], None]) -> None:
        p = self.policy
        started = self.clock()
        ready = False
        failures = 0
        async with health.client_for(self.transport, self.router.port,
                                     self.router.probe_address, p.probe_timeout) as (
            client, url,
        ), anyio.create_task_group() as tg:
            while True:
                ok, detail = await health.check(client, url, p.probe_timeout)
                now = self.clock()
                if ok:
                    failures = 0
                    self.backoff.on_healthy(now)
                    if not ready:
                        ready = True
                        self.state = "ready"
                        self._emit(events.RouterReady(
                            attempt=self.attempt, host=self.router.host,
                            port=self.router.port, seconds=round(now - started, 2),
                            servers=tuple(self.router.servers),
                        ))
                        api = RouterClient(client, url.removesuffix("/health"),
                                           api_key=self.api_key)
                        tg.start_soon(self.registrar.serve, self.router, api)
                elif ready:
                    if await self._alive(handle):
                        failures += 1
                        if failures >= p.probe_failures:
                            end("unhealthy", f"{failures} failed /health probes: {detail}")
                            return
                elif now - started > p.start_deadline:
                    end("deadline", f"no /health answer within {p.start_deadline:g}s")
                    return
                await self.sleep(p.probe_interval if ready else min(0.25, p.probe_interval))

    async def _alive(self, handle: remote.RunHandle) -> bool:
        """Whether a failed probe counts: the router lives and its host answers."""
        try:
            return (await remote.probe(self.transport, handle)).alive
        except HostUnreachable:
            return False
        except LauncherError:
            return True

    def _emit(self, event: events.Event) -> None:
        self.log.log(event.level, event.name, **event.to_dict())
        for hook in self.hooks:
            hook(self.router.name, event)


# --- status (a one-off look, for `launcher status`) -----------------------------------------


async def router_status(config: Config, router: RouterConfig, transport: Transport,
                        api_key: str | None = None) -> dict[str, Any]:
    """One router as ``launcher status`` shows it: running, pid, attempt, healthy, and per
    configured server ``registered`` / ``registered, unhealthy`` (the router's own verdict)
    / ``not registered``; ``workers_error`` when the router could not be asked."""
    run_dir = config.run_dir_of(router)
    handle = await remote.find_running(transport, run_dir, router.name)
    latest = handle or await remote.latest_handle(transport, run_dir, router.name)
    row: dict[str, Any] = {
        "router": router.name, "host": router.host, "port": router.port,
        "running": handle is not None, "pid": handle.pid if handle else None,
        "attempt": latest.attempt if latest else None, "healthy": None, "workers": {},
        "workers_error": None,
    }
    if handle is None:
        return row
    timeout = config.policy.probe_timeout
    async with health.client_for(transport, router.port, router.probe_address,
                                 timeout) as (client, url):
        row["healthy"], _ = await health.check(client, url, timeout)
        if not row["healthy"]:
            return row
        try:
            listed = await RouterClient(client, url.removesuffix("/health"), tries=2,
                                        api_key=api_key).workers()
        except LeaseLost:
            raise  # not a failure: the lease is gone (docs/ha.md)
        except Exception as exc:  # shown, never raised: status reports what it can
            row["workers_error"] = str(exc).splitlines()[0] if str(exc) else repr(exc)
            return row
    for name, url in worker_urls(config, router).items():
        worker = listed.get(url)
        row["workers"][name] = ("not registered" if worker is None else
                                "registered, unhealthy" if worker.healthy is False else
                                "registered")
    return row


async def stop_router(config: Config, router: RouterConfig, transport: Transport) -> str:
    """What ``launcher down`` does to a router: TERM, bounded wait, KILL; a line saying so."""
    run_dir = config.run_dir_of(router)
    handle = await remote.find_running(transport, run_dir, router.name)
    if handle is None:
        return "not running"
    report = await remote.stop(transport, handle, grace=10.0, kill_wait=5.0)
    signals = "+".join(report.signals_sent) or "none needed"
    return f"stopped (pid {handle.pid}, {signals})"
