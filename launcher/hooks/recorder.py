"""The ledger recorder: a supervisor event hook that writes attempts to the attempt ledger.

``LedgerRecorder`` translates the supervisor's events (``launcher.supervise.events``) into
``launcher.store.ledger.Ledger`` writes, applied in order by its own writer thread.

Resource handling: ``LedgerRecorder`` owns one writer thread until ``close()``; the ledger stays
open (the caller owns it). Error handling: never raises into its caller and logs
``ledger.write_failed`` instead.
"""

from __future__ import annotations

import queue
import threading
import time
from collections.abc import Callable, Mapping
from dataclasses import replace
from types import TracebackType
from typing import Any

import structlog

from launcher.errors import StateError
from launcher.memory.calibration import CostGuess, ObservationKey, guess_of
from launcher.params import LaunchParams
from launcher.sglang.observed import Observed, speculative_key
from launcher.store.ledger import Ledger, ObservationContext
from launcher.supervise import events

__all__ = ["LedgerRecorder"]

log = structlog.get_logger("launcher")


# --- the event hook ----------------------------------------------------------------------

_Write = Callable[[Ledger], None]
_RECORDED = (
    events.AttemptStarted, events.AttemptFailed, events.AttemptEnded, events.ServerReady,
    events.ServerAdopted,
)


class LedgerRecorder:
    """A supervisor event hook (``events.Hook``) that records attempts.

    Mapping: ``attempt.started`` → ``attempt_started``; ``server.adopted`` →
    ``attempt_adopted``; ``attempt.failed`` → ``attempt_finished`` at once (so a daemon that
    dies while cleaning up still has the outcome); ``attempt.ended`` → ``attempt_finished``
    with the log tail (evidence from the event, else from its ``attempt.failed``);
    ``server.ready`` → ``server_ready`` (its ``attempt``, its ``attempt_seconds``). Other
    events are ignored. Timestamps the events do not carry come from ``clock`` at the call.

    Observations: an ``attempt.ended`` whose ``numbers`` show any cost figure also records
    them (``record_observation``) under the server's ``ObservationContext`` (``contexts``
    or ``set_context``; a server without one is filed under an empty key, which calibration
    ignores), with the ``estimate`` (a ``CostGuess`` dict) its ``attempt.started`` carried.

    Resource handling: the call only translates the event and queues the write; one writer
    thread, started here, applies them in order. ``flush()`` waits for the queue, ``close()``
    drains it and stops the thread; the ledger stays open (the caller owns it).

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
    ) -> None:
        self.ledger = ledger
        self.fingerprints = dict(fingerprints)
        self.clock = clock
        self.contexts: dict[str, ObservationContext] = dict(contexts or {})
        self._estimates: dict[tuple[str, int], CostGuess] = {}
        self._queue: queue.Queue[tuple[str, str, _Write] | threading.Event | None] = (
            queue.Queue(max_queued)
        )
        self._evidence: dict[tuple[str, int], list[str]] = {}
        self._closed = False
        self._thread = threading.Thread(target=self._run, name="ledger-writer", daemon=True)
        self._thread.start()

    def __call__(self, server: str, event: events.Event) -> None:
        if not isinstance(event, _RECORDED):
            return
        try:
            if self._closed:
                raise StateError("the ledger recorder is closed")
            write = self._translate(server, event)
            self._queue.put_nowait((server, event.name, write))
        except queue.Full:
            log.error("ledger.write_failed", server=server, hook_event=event.name,
                      error="queue full")
        except Exception as exc:  # a hook must not break the supervisor
            log.error("ledger.write_failed", server=server, hook_event=event.name,
                      error=repr(exc))

    def set_context(self, server: str, context: ObservationContext) -> None:
        """File ``server``'s next observations under ``context``."""
        self.contexts[server] = context

    def flush(self, timeout: float = 5.0) -> bool:
        """Wait until every write queued so far is applied; False on timeout or if closed."""
        if self._closed:
            return not self._thread.is_alive()
        done = threading.Event()
        try:
            self._queue.put(done, timeout=timeout)
        except queue.Full:
            return False
        return done.wait(timeout)

    def close(self, timeout: float = 5.0) -> None:
        """Apply what is queued, then stop the writer thread (idempotent)."""
        if not self._closed:
            self._closed = True
            self._queue.put(None)
        self._thread.join(timeout)

    def __enter__(self) -> LedgerRecorder:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.close()

    def _run(self) -> None:
        while True:
            item = self._queue.get()
            if item is None:
                return
            if isinstance(item, threading.Event):
                item.set()
                continue
            server, event, write = item
            try:
                write(self.ledger)
            except Exception as exc:
                log.error(
                    "ledger.write_failed", server=server, hook_event=event, error=repr(exc)
                )

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

