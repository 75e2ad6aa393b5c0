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
from launcher.errors import lease_lost_in
from launcher.host.transport.base import Transport
from launcher.host.transport.fenced import FencedTransport
from launcher.store.coordination import Coordinator, LeaseView, PgEngine
from launcher.store.fence import LeaseTiming
from launcher.supervise import events

__all__ = ["run_coordinated"]

T = TypeVar("T")
log = structlog.get_logger("launcher")


def _emit(hooks: list[events.Hook], event: events.Event) -> None:
    log.log(event.level, event.name, **event.to_dict())
    for hook in hooks:
        hook("", event)


async def run_coordinated(
    settings: CoordinationConfig, transports: dict[str, Transport], hooks: list[events.Hook],
    active: Callable[[dict[str, Transport]], Awaitable[T]],
    *, environ: dict[str, str] | None = None,
) -> T | None:
    """Stand by until this launcher holds the lease, then ``active(fenced_transports)``
    while renewing it. None when a stop (SIGINT/SIGTERM) came while standing by.

    Raises LeaseLost (after the ``lease.lost`` event) when the lease was lost while active;
    ConfigError when the DSN reference cannot be read (before anything starts)."""
    dsn = settings.resolve_dsn(environ)
    box = settings.box
    engine = PgEngine(dsn, lease=settings.lease, holder=Coordinator.new_holder(), box=box,
                      ttl=settings.ttl)
    coord = Coordinator(engine, LeaseTiming.for_ttl(settings.ttl), box=box)
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
        try:
            async with anyio.create_task_group() as tg:
                await tg.start(coord.keep)
                result = await active(fenced)
                tg.cancel_scope.cancel()
        except BaseException as exc:
            lost = lease_lost_in(exc)
            if lost is None:
                await coord.release()
                raise
            coord.fence.revoke()
            _emit(hooks, events.LeaseEnded(box=box, token=lost.token,
                                           reason=str(lost.args[0] if lost.args else lost)))
            raise lost from None
        await coord.release()
        return result
    finally:
        coord.aclose()
