"""The ledger recorder: a supervisor event hook that writes attempts to the attempt ledger.

``LedgerRecorder`` translates the supervisor's events (``launcher.supervise.events``) into
``launcher.store.ledger.Ledger`` writes, queued on an anyio memory object stream and applied in
order by its worker (``run``, a task in the daemon's task group; each SQLite write in a worker
thread through ``anyio.to_thread.run_sync``, so the event loop never waits on the database).

Resource handling: the worker runs until ``close()`` and the queue is drained; cancelled, it
first drains what is queued, shielded and bounded, so no attempt row is lost on shutdown. The
ledger stays open (the caller owns it). Error handling: never raises into its caller and logs
``ledger.write_failed`` instead.
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import Callable, Mapping
from dataclasses import replace
from types import TracebackType
from typing import Any

import anyio
import structlog
from anyio.abc import TaskStatus

from launcher.errors import StateError
from launcher.memory.calibration import CostGuess, ObservationKey, guess_of
from launcher.params import LaunchParams
from launcher.sglang.observed import Observed, speculative_key
from launcher.store.ledger import GiveUp, Ledger, ObservationContext
from launcher.supervise import events

__all__ = ["LedgerRecorder"]

log = structlog.get_logger("launcher")


# --- the event hook ----------------------------------------------------------------------

_Write = Callable[[Ledger], None]
_Item = tuple[str, str, _Write] | anyio.Event  # (server, hook event, write), or a flush mark
_RECORDED = (
    events.AttemptStarted, events.AttemptFailed, events.AttemptEnded, events.ServerReady,
    events.ServerAdopted, events.ServerGaveUp,
)


class LedgerRecorder:
    """A supervisor event hook (``events.Hook``) that records attempts.

    Mapping: ``attempt.started`` → ``attempt_started``; ``server.adopted`` →
    ``attempt_adopted``; ``attempt.failed`` → ``attempt_finished`` at once (so a daemon that
    dies while cleaning up still has the outcome); ``attempt.ended`` → ``attempt_finished``
    with the log tail (evidence from the event, else from its ``attempt.failed``);
    ``server.ready`` → ``server_ready`` (its ``attempt``, its ``attempt_seconds``);
    ``server.gave_up`` → ``server_gave_up`` (`status` shows a give-up in preflight). Other
    events are ignored. Timestamps the events do not carry come from ``clock`` at the call.

    Observations: an ``attempt.ended`` whose ``numbers`` show any cost figure also records
    them (``record_observation``) under the server's ``ObservationContext`` (``contexts``
    or ``set_context``; a server without one is filed under an empty key, which calibration
    ignores), with the ``estimate`` (a ``CostGuess`` dict) its ``attempt.started`` carried.

    Resource handling: the call only translates the event and queues the write (at most
    ``max_queued``); ``run`` (started with ``await tg.start(recorder.run)``, or ``async with
    recorder``) applies them in order, each in a worker thread. ``flush()`` waits for what is
    queued so far; ``close()`` ends the queue, and ``run`` returns once it is drained
    (``aclose()`` also waits for that, bounded). Cancelled, ``run`` drains the queue shielded,
    within ``drain_timeout`` seconds, then re-raises. The ledger stays open (the caller owns
    it).

    Error handling: never raises into the caller. An event it cannot translate, a server
    without a fingerprint, a full queue or a failed write logs ``ledger.write_failed``
    (server, hook_event, error) and is dropped.
    """

    def __init__(
        self,
        ledger: Ledger,
        fingerprints: Mapping[str, str],
        clock: Callable[[], float] = time.time,
        *,
        max_queued: int = 10_000,
        contexts: Mapping[str, ObservationContext] | None = None,
        drain_timeout: float = 10.0,
    ) -> None:
        self.ledger = ledger
        self.fingerprints = dict(fingerprints)
        self.clock = clock
        self.contexts: dict[str, ObservationContext] = dict(contexts or {})
        self.drain_timeout = drain_timeout
        self._estimates: dict[tuple[str, int], CostGuess] = {}
        self._send, self._receive = anyio.create_memory_object_stream[_Item](max_queued)
        self._evidence: dict[tuple[str, int], list[str]] = {}
        self._closed = False
        self._done = anyio.Event()  # run returned: everything queued was applied (or dropped)
        self._stack: contextlib.AsyncExitStack | None = None

    def __call__(self, server: str, event: events.Event) -> None:
        if not isinstance(event, _RECORDED):
            return
        try:
            if self._closed:
                raise StateError("the ledger recorder is closed")
            write = self._translate(server, event)
            self._send.send_nowait((server, event.name, write))
        except anyio.WouldBlock:
            log.error("ledger.write_failed", server=server, hook_event=event.name,
                      error="queue full")
        except Exception as exc:  # a hook must not break the supervisor
            log.error("ledger.write_failed", server=server, hook_event=event.name,
                      error=repr(exc))

    def set_context(self, server: str, context: ObservationContext) -> None:
        """File ``server``'s next observations under ``context``."""
        self.contexts[server] = context

    async def run(self, *, task_status: TaskStatus[None] = anyio.TASK_STATUS_IGNORED) -> None:
        """Apply the queued writes in order until ``close()`` and the queue is drained.

        Cancelled, it applies what is still queued first (shielded, at most
        ``drain_timeout`` seconds), then re-raises the cancellation.
        """
        task_status.started()
        try:
            while True:
                try:
                    item = await self._receive.receive()
                except anyio.EndOfStream:
                    return
                await self._apply(item)
        except anyio.get_cancelled_exc_class():
            with anyio.move_on_after(self.drain_timeout, shield=True):
                await self._drain()
            raise
        finally:
            self.close()  # later events are dropped and logged
            self._receive.close()
            self._done.set()

    async def _drain(self) -> None:
        while True:
            try:
                item = self._receive.receive_nowait()
            except (anyio.WouldBlock, anyio.EndOfStream):
                return
            await self._apply(item)

    async def _apply(self, item: _Item) -> None:
        if isinstance(item, anyio.Event):
            item.set()
            return
        server, event, write = item
        try:
            await anyio.to_thread.run_sync(write, self.ledger)
        except Exception as exc:
            log.error("ledger.write_failed", server=server, hook_event=event, error=repr(exc))

    async def flush(self, timeout: float = 5.0) -> bool:
        """Wait until every write queued so far is applied; False on timeout. Once closed:
        whether ``run`` has returned (the queue is drained)."""
        if self._closed:
            return self._done.is_set()
        mark = anyio.Event()
        with anyio.move_on_after(timeout):
            await self._send.send(mark)
            await mark.wait()
        return mark.is_set()

    def close(self) -> None:
        """End the queue: later events are dropped (and logged); ``run`` returns once what is
        queued is applied (idempotent)."""
        self._closed = True
        self._send.close()

    async def aclose(self, timeout: float = 10.0) -> bool:
        """``close()``, then wait (shielded, at most ``timeout`` s) for ``run`` to apply what
        is queued; whether it did."""
        self.close()
        with anyio.move_on_after(timeout, shield=True):
            await self._done.wait()
        return self._done.is_set()

    async def __aenter__(self) -> LedgerRecorder:
        """Run the worker in a task group of its own until the block ends."""
        async with contextlib.AsyncExitStack() as stack:
            tg = await stack.enter_async_context(anyio.create_task_group())
            await tg.start(self.run)
            self._stack = stack.pop_all()
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.close()  # the worker drains the queue and returns; its task group then exits
        assert self._stack is not None
        await self._stack.__aexit__(exc_type, exc, tb)

    def _translate(self, server: str, event: events.Event) -> _Write:
        fp = self.fingerprints[server]  # KeyError: a server we were not told about
        now = self.clock()
        match event:
            case events.ServerAdopted(attempt=attempt, params=params, started_at=launched):
                # ``started_at``: the launch time on the host, when known.
                at = now if launched is None else launched
                return lambda ledger: ledger.attempt_adopted(server, fp, attempt, params, at)
            case events.ServerReady(attempt=attempt, params=params, attempts=count,
                                    attempt_seconds=seconds):
                # "attempt" is the attempt's number; "attempts" only counts this
                # supervision's attempts (taking it for the number rewrote an older attempt's
                # row as ready). Per-row time to ready is the attempt's own; None when it
                # was adopted.
                return lambda ledger: ledger.server_ready(
                    server, fp, params, seconds, attempt, at=now, attempts=count,
                )
            case events.ServerGaveUp(attempt=attempt, attempts=count, reason=reason):
                give_up = GiveUp(server, attempt, count, reason, now)
                return lambda ledger: ledger.server_gave_up(give_up)
            case events.AttemptStarted(attempt=attempt, params=params):
                if event.estimate is not None:
                    self._estimates[(server, attempt)] = event.estimate
                return lambda ledger: ledger.attempt_started(server, fp, attempt, params, now)
            case events.AttemptFailed():
                attempt, evidence = event.attempt, list(event.evidence)
                self._evidence[(server, attempt)] = evidence
                params, outcome = LaunchParams(), event.outcome.value
                phase: str | None = event.phase.value
                numbers, log_tail, ended_at, started_at = dict(event.numbers), "", now, None
            case events.AttemptEnded():
                attempt = event.attempt
                evidence = list(event.evidence) or self._evidence.pop((server, attempt), [])
                params, outcome, phase = event.params or LaunchParams(), event.outcome, event.phase
                numbers, log_tail = dict(event.numbers), event.log_tail
                ended_at, started_at = event.ended_at or now, event.started_at
            case _:
                raise AssertionError(f"not recorded: {event.name}")
        observe = (self._observation(server, attempt, outcome, params, numbers, now)
                   if isinstance(event, events.AttemptEnded) else None)

        def write(ledger: Ledger) -> None:
            ledger.attempt_finished(
                server, attempt, outcome=outcome, phase=phase,
                numbers=numbers, evidence=evidence, log_tail=log_tail, ended_at=ended_at,
                fingerprint=fp, params=params, started_at=started_at,
            )
            if observe is not None:
                observe(ledger)

        return write

    def _observation(
        self, server: str, attempt: int, outcome: str, params: LaunchParams,
        numbers: Mapping[str, Any], now: float,
    ) -> _Write | None:
        """The observation write of an ``attempt.ended``; None when there is nothing to
        record (a log that showed no cost figure)."""
        observed = Observed.from_numbers(numbers)
        if observed.empty:
            return None
        context = self.contexts.get(server, ObservationContext(ObservationKey()))
        spec = speculative_key(numbers)
        key = replace(context.key, speculative=spec) if spec else context.key
        estimate = self._estimates.pop((server, attempt), None)
        if estimate is None and context.estimate is not None:
            bs = numbers.get("cuda_graph_max_bs") or params.cuda_graph_max_bs
            estimate = guess_of(context.estimate, int(bs or context.estimate.auto_bs()))

        def write(ledger: Ledger) -> None:
            ledger.record_observation(
                server, attempt, key, observed, outcome=outcome, params=params,
                estimate=estimate, model=context.model, tp=context.tp, at=now,
            )

        return write

