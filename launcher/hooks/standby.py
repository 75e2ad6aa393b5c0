"""`launcher up` with ``[coordination]``: stand by, take the lease, supervise fenced, and
stop everything at once when the lease is lost (docs/ha.md).

:func:`run_coordinated` wraps the active daemon (``daemon._run_active``): it waits as a
standby (no supervision, no host command) until this launcher holds the lease, then runs the
active daemon with every transport behind the lease's fence (``FencedTransport``) beside the
renewal task (``Coordinator.keep``). The daemon's first step is the existing adoption path:
each server's listing adopts a running attempt and relaunches a dead one once.

Error handling: when the lease is lost, ``keep`` revokes the fence (from then on every host
command raises LeaseLost) and raises; the task group cancels the whole supervision at once,
the ``lease.lost`` event is emitted and LeaseLost propagates: the CLI exits 6 and systemd
(``Restart=on-failure``) starts the launcher again, as a standby. A stop asked for while
standing by returns None; a stop while active releases the lease (a standby takes over at
its next poll instead of after the TTL).
"""

from __future__ import annotations

import os
import signal
from collections.abc import Awaitable, Callable
from typing import TypeVar

import anyio
import structlog

from launcher.config.schema import CoordinationConfig
from launcher.errors import StateError, lease_lost_in
from launcher.host.transport.base import Transport
from launcher.host.transport.fenced import FencedTransport
from launcher.store.coordination import Coordinator, EngineUnavailable, LeaseView, PgEngine
from launcher.store.fence import LeaseTiming
from launcher.store.ledger import Ledger
from launcher.supervise import events

__all__ = ["SharedLedger", "run_coordinated"]

T = TypeVar("T")
log = structlog.get_logger("launcher")


class SharedLedger:
    """The attempt ledger's shared parts (``Ledger.shared_rows``: last good params, the
    Slack notifier's memory, the newest observations) in the coordination database, so that
    the next active box starts where this one left off (docs/ha.md).

    ``take_over`` merges the database's rows into the local ledger when this launcher has
    just taken the lease; ``run`` then writes the rows that changed every ``every`` seconds
    (ttl/3) under the lease's token, and ``flush`` once more on a clean stop. A SIGKILLed
    active box so loses at most its last ``every`` seconds of changes.

    Error handling: the ledger is advice, so nothing here raises (cancellation aside) or
    touches the lease: a database that cannot be asked is logged
    (``ledger.shared_unavailable``, ``ledger.share_failed``) and tried again at the next
    tick; a write refused because the token no longer holds the lease is logged
    (``ledger.share_refused``) and the renewal task ends the active period.
    """

    def __init__(self, ledger: Ledger, engine: PgEngine, every: float) -> None:
        self.ledger = ledger
        self.engine = engine
        self.every = every
        self._sent: dict[tuple[str, str], str] = {}  # what the database holds, as we know it

    async def _bounded(self, call: Callable[[], Awaitable[T]]) -> T:
        with anyio.move_on_after(self.every):
            return await call()
        self.engine.drop()  # an answer may still arrive on it: never read it
        raise EngineUnavailable(f"no answer within {self.every:.1f}s")

    async def take_over(self) -> bool:
        """Merge the shared rows into the local ledger; False when they could not be read."""
        try:
            rows = await self._bounded(self.engine.load_shared)
            taken = await anyio.to_thread.run_sync(self.ledger.merge_shared, rows)
        except (EngineUnavailable, StateError) as exc:
            log.warning("ledger.shared_unavailable", error=str(exc)[:300])
            return False
        self._sent = {(r.kind, r.key): r.body for r in rows}
        log.info("ledger.shared_loaded", rows=len(rows), taken=taken)
        return True

    async def flush(self, token: int) -> None:
        """Write the rows that changed since the last write (or the takeover)."""
        try:
            rows = await anyio.to_thread.run_sync(self.ledger.shared_rows)
            changed = [r for r in rows if self._sent.get((r.kind, r.key)) != r.body]
            if not changed:
                return
            written = await self._bounded(lambda: self.engine.store_shared(token, changed))
        except (EngineUnavailable, StateError) as exc:
            log.warning("ledger.share_failed", token=token, error=str(exc)[:300])
            return
        if not written:
            log.warning("ledger.share_refused", token=token, rows=len(changed))
            return
        self._sent.update({(r.kind, r.key): r.body for r in changed})
        log.info("ledger.shared_written", token=token, rows=len(changed))

    async def run(self, token: int) -> None:
        """``flush`` every ``every`` seconds until cancelled."""
        while True:
            await anyio.sleep(self.every)
            await self.flush(token)


def _emit(hooks: list[events.Hook], event: events.Event) -> None:
    log.log(event.level, event.name, **event.to_dict())
    for hook in hooks:
        hook("", event)


async def run_coordinated(
    settings: CoordinationConfig, transports: dict[str, Transport], hooks: list[events.Hook],
    active: Callable[[dict[str, Transport]], Awaitable[T]],
    *, environ: dict[str, str] | None = None, ledger: Ledger | None = None,
    on_shared_loaded: Callable[[], None] | None = None,
) -> T | None:
    """Stand by until this launcher holds the lease, then ``active(fenced_transports)``
    while renewing it. None when a stop (SIGINT/SIGTERM) came while standing by.

    With ``ledger``, its shared parts go through the database (``SharedLedger``): merged in
    once the lease is taken (then ``on_shared_loaded()``, before ``active``), written while
    active, and once more before a clean stop releases the lease.

    Raises LeaseLost (after the ``lease.lost`` event) when the lease was lost while active;
    ConfigError when the DSN reference cannot be read (before anything starts)."""
    dsn = settings.resolve_dsn(environ)
    box = settings.box
    engine = PgEngine(dsn, lease=settings.lease, holder=Coordinator.new_holder(), box=box,
                      ttl=settings.ttl)
    coord = Coordinator(engine, LeaseTiming.for_ttl(settings.ttl), box=box)
    # Its own connection: the renewals never wait behind a ledger write.
    shared = None if ledger is None else SharedLedger(
        ledger, PgEngine(dsn, lease=settings.lease, holder=engine.holder, box=box,
                         ttl=settings.ttl), coord.timing.renew_every)
    log.info("lease.joining", box=box, lease=settings.lease, ttl_s=settings.ttl,
             pid=os.getpid())
    try:
        acquired = None
        async with anyio.create_task_group() as tg:
            async def stop_on_signal() -> None:
                with anyio.open_signal_receiver(signal.SIGINT, signal.SIGTERM) as signals:
                    async for _ in signals:
                        tg.cancel_scope.cancel()
                        return

            def standing_by(view: LeaseView) -> None:
                _emit(hooks, events.LeaseStandby(box=box, active_box=view.box,
                                                 remaining_s=view.remaining_s))

            def unreachable(cause: str) -> None:
                log.warning("lease.engine_unreachable", box=box, error=cause[:300])

            tg.start_soon(stop_on_signal)
            acquired = await coord.wait_active(standing_by, unreachable)
            tg.cancel_scope.cancel()
        if acquired is None:
            return None
        _emit(hooks, events.LeaseAcquired(box=box, token=acquired.token,
                                          previous_box=acquired.previous_box,
                                          waited_s=round(acquired.waited_s, 3)))
        fenced: dict[str, Transport] = {h: FencedTransport(t, coord.fence)
                                        for h, t in transports.items()}
        token = acquired.token
        try:
            async with anyio.create_task_group() as tg:
                await tg.start(coord.keep)
                if shared is not None:
                    if await shared.take_over() and on_shared_loaded is not None:
                        on_shared_loaded()
                    tg.start_soon(shared.run, token)
                result = await active(fenced)
                tg.cancel_scope.cancel()
        except BaseException as exc:
            lost = lease_lost_in(exc)
            if lost is None:
                await _stand_down(coord, shared, token)
                raise
            coord.fence.revoke()
            _emit(hooks, events.LeaseEnded(box=box, token=lost.token,
                                           reason=str(lost.args[0] if lost.args else lost)))
            raise lost from None
        await _stand_down(coord, shared, token)
        return result
    finally:
        coord.aclose()
        if shared is not None:
            shared.engine.drop()


async def _stand_down(coord: Coordinator, shared: SharedLedger | None, token: int) -> None:
    """A clean end while active: the ledger's last changes written (while the token still
    holds the lease), then the lease released. Shielded and bounded."""
    if shared is not None:
        with anyio.CancelScope(shield=True):
            await shared.flush(token)
    await coord.release()
