"""Slack notifications for the person on call: ready, gave up, unhealthy, relaunched, resolved.

``SlackNotifier`` is a supervisor event hook. Calling it (``notifier(server, event)``)
only turns the event into messages and puts them on a bounded queue; a worker task
(``await tg.start(notifier.run)``) posts the queue to a Slack incoming webhook, one message at
a time, in order, and posts reminders. Without a webhook the messages go to the log
(``notify.message``) instead.

The messages themselves (``Message``, ``Kind``, the ``*_message`` builders, Slack's block
limits) live in ``launcher.hooks.messages``, which is pure; this module holds the hook, its
memory and the delivery (secrets are masked by ``launcher.untrusted.Redactor``).

Alerts, as Alertmanager pairs them: ``server.gave_up``, ``server.unhealthy`` and
``restart.scheduled`` (relaunched after ready) each fire an alert of that (server, kind). Its
message is titled ``[FIRING] <title>`` (``llama gave up``); when the server is ready again a
``[RESOLVED] <title>`` message with the same title follows, one per alert that fired, saying
how long it fired. While an alert fires it is posted again every ``remind_every_s`` (a
reminder, same title). A ``server.ready`` with nothing firing is a "ready" message (params that
worked, attempts, time to ready, what each failed attempt hit); an adopted attempt's ready
posts nothing (``announce_adoption``: ``server.adopted`` posts an "adopted" message).

Every message carries the server, host, endpoint, GPUs, SGLang version, model name, params in
numbers (a param left to SGLang shows the value SGLang printed, marked ``(auto)``), the attempt
and a copyable ``launcher logs CONFIG SERVER --attempt N`` line, and ends with the operator
box (host name) and config that sent it. Relaunch messages show the restart budget left and
the failure's decisive log line; no log line appears twice in one message.

Flapping does not flood the channel: a message of the same (server, kind) as one sent less
than ``dedupe_window_s`` ago is suppressed and counted (an alert fired that way is not
announced, so neither is its resolution), and the next message sent for that server ends
with "(N similar suppressed)". This memory (when each kind was last sent, the counts, the
firing alerts and their last message for reminders) lives in the ledger (``bind_store``), so a
restarted launcher neither repeats what it just posted nor forgets what still fires; a
notifier without a webhook (messages only logged) keeps it in the process, never in the ledger.

Resource handling: the queue holds at most ``max_queue`` messages; when full the oldest is
dropped (``notify.dropped``). Each POST is bounded by ``post_timeout_s``; each message by
``max_tries`` and ``max_total_s``. ``aclose(timeout_s)`` lets the worker drain for at most
``timeout_s`` and then cancels it; whatever is left is logged as ``notify.unsent``. An
``httpx.AsyncClient`` created here is closed here; one passed in belongs to the caller.

Error handling: nothing reaches the supervisor. The hook catches everything
(``notify.error``); a store that cannot be written is logged (``notify.state_not_saved``) and
the memory stays in this process. Delivery retries 5xx, 408, connection errors and timeouts
with jittered exponential backoff, waits what a 429's ``Retry-After`` says, and gives up after
the bounds (``notify.abandoned``); other 4xx answers are not retried (``notify.rejected``).

Why not all of ``slack_sdk``: its Block Kit models check every payload against Slack's limits
before it is posted (``checked_blocks``: a header over 150 characters, a section over 3000,
more than 10 fields, an unknown block type); one that fails is logged
(``notify.invalid_blocks``) and its text alone is posted, instead of Slack's 400. They raise
rather than shorten, so the clipping to fit stays here; and the blocks are built as plain dicts
because the models' ``to_dict`` costs milliseconds, too much for a hook that runs in the
supervisor's task (the check runs in the worker). Its transport is not used:
``WebhookClient`` is synchronous (urllib) and ``AsyncWebhookClient`` needs aiohttp;
``RateLimitErrorRetryHandler`` sleeps ``int(Retry-After)`` seconds in ``time.sleep``
(unbounded, not cancellable, and an HTTP-date ``Retry-After`` raises), and no handler bounds
a message's total time or takes an injected clock. The httpx + anyio delivery
below does all of that and keeps the webhook URL out of httpx's logs.

Secrets: every outgoing payload and every logged string is redacted against ``secrets`` and
the webhook URL (and its path), each occurrence replaced with ``***``. While the worker runs,
records of the ``httpx``/``httpcore`` loggers are redacted too, as httpx logs request URLs.
"""

from __future__ import annotations

import contextlib
import email.utils
import enum
import logging
import math
import os
import random
import time
from collections import deque
from collections.abc import Awaitable, Callable, Collection, Iterator, Mapping
from dataclasses import dataclass, replace
from typing import Any, Protocol

import anyio
import httpx
import structlog
from anyio.abc import TaskStatus
from tenacity import AsyncRetrying, RetryCallState, retry_if_result

from launcher.errors import ConfigError, LauncherError
from launcher.hooks.identity import operator_box
from launcher.hooks.messages import (
    ALERTS,
    Kind,
    Message,
    Origin,
    ServerInfo,
    adopted_message,
    blocks_text,
    checked_blocks,
    clip,
    gave_up_message,
    internal_error_message,
    ready_message,
    reminder,
    resolved_message,
    restart_message,
    router_ready_message,
    takeover_message,
    unhealthy_message,
)
from launcher.store.ledger import NotifyState
from launcher.supervise import events
from launcher.supervise.backoff import Jitter, capped_exponential, jittered
from launcher.untrusted import Redactor

__all__ = ["SlackNotifier", "webhook_url_ok"]

MAX_ANSWER = 64 * 1024  # raw bytes of Slack's answer read (it answers "ok" or an error word)
_FAILURES_KEPT = 50
_UNKNOWN_SERVER = ServerInfo(host="?", model="?")  # a server the notifier was not told of
_OBSERVED = (
    events.LeaseAcquired,
    events.AttemptFailed,
    events.ServerReady,
    events.ServerAdopted,
    events.ServerGaveUp,
    events.ServerInternalError,
    events.RouterInternalError,
    events.ServerUnhealthy,
    events.RestartScheduled,
    events.RouterReady,
)


# --- the notifier -----------------------------------------------------------------------


class _State(enum.Enum):
    IDLE = "idle"  # constructed; the worker has not started
    RUNNING = "running"  # the worker is delivering
    CLOSING = "closing"  # aclose() asked the worker to drain and stop
    CLOSED = "closed"  # the worker is gone; new messages go to the log


@dataclass
class _Result:
    ok: bool
    retry: bool = False
    cause: str = ""
    status: int | None = None
    retry_after: float | None = None


class _RedactingFilter(logging.Filter):
    """Masks secrets in records of a stdlib logger (httpx logs every request's URL)."""

    def __init__(self, redact: Redactor) -> None:
        super().__init__()
        self._redact = redact

    def filter(self, record: logging.LogRecord) -> bool:
        message = record.getMessage()
        masked = self._redact.text(message)
        if masked != message:
            record.msg, record.args = masked, None
        return True


class StateStore(Protocol):
    """Where the notifier keeps its memory across restarts (``launcher.store.ledger.Ledger``)."""

    def notify_states(self) -> list[NotifyState]: ...

    def save_notify_state(self, state: NotifyState) -> None: ...


class SlackNotifier:
    """A supervisor event hook that posts what matters to a Slack incoming webhook.

    ``webhook_url`` ``None`` sends nothing over HTTP: each message is logged as
    ``notify.message``. Otherwise start the worker once in the daemon's task group with
    ``await tg.start(notifier.run)`` and call ``await notifier.aclose()`` before leaving it.
    Call the hook from the event loop's thread (the supervisor does).

    ``config_path`` is the config that sent the messages (shown, and used in the logs
    command line); ``box`` this machine's name (default: its host name). ``clock`` is wall
    time (the memory outlives the process); ``remind_every_s`` 0 turns reminders off.
    ``describe`` and ``bind_store`` complete the set-up once the daemon knows the SGLang
    versions and has the ledger open.

    Raises ConfigError at construction when ``webhook_url`` is not an http(s) URL (the value
    is not shown: it is a secret).
    """

    def __init__(
        self,
        webhook_url: str | None,
        *,
        servers_info: Mapping[str, ServerInfo],
        secrets: Collection[str] = (),
        client: httpx.AsyncClient | None = None,
        sleep: Callable[[float], Awaitable[None]] = anyio.sleep,
        clock: Callable[[], float] = time.time,
        max_queue: int = 100,
        max_tries: int = 5,
        max_total_s: float = 120.0,
        dedupe_window_s: float = 600.0,
        remind_every_s: float = 4 * 3600.0,
        reminder_poll_s: float = 30.0,
        post_timeout_s: float = 10.0,
        backoff_initial_s: float = 1.0,
        backoff_max_s: float = 30.0,
        rng: random.Random | None = None,
        announce_adoption: bool = False,
        config_path: str | os.PathLike[str] | None = None,
        box: str | None = None,
    ) -> None:
        if max_queue < 1 or max_tries < 1:
            raise ConfigError(["notify: max_queue and max_tries must be at least 1"])
        if remind_every_s < 0 or reminder_poll_s <= 0:
            raise ConfigError(["notify: remind_every_s must be >= 0, reminder_poll_s > 0"])
        secret_values = [*secrets]
        if webhook_url is not None:
            url = _check_url(webhook_url)
            secret_values.append(webhook_url)
            # The path is the secret part of a Slack webhook (services/T…/B…/token); a short
            # path ("/hook") is a local test endpoint and would mask ordinary words.
            if len(url.path.strip("/")) >= 16:
                secret_values.append(url.path.strip("/"))
        self.webhook_url = webhook_url
        self.announce_adoption = announce_adoption
        self.servers_info = dict(servers_info)
        self.origin = Origin(
            box=box if box is not None else operator_box(),
            config=os.path.abspath(config_path) if config_path is not None else "CONFIG",
        )
        self.redact = Redactor(secret_values)
        self.max_queue = max_queue
        self.max_tries = max_tries
        self.max_total_s = max_total_s
        self.dedupe_window_s = dedupe_window_s
        self.remind_every_s = remind_every_s
        self.reminder_poll_s = reminder_poll_s
        self.post_timeout_s = post_timeout_s
        self.backoff_initial_s = backoff_initial_s
        self.backoff_max_s = backoff_max_s
        # Counters (for metrics and tests): messages dropped on overflow, suppressed as
        # duplicates, delivered, abandoned after retries, rejected by Slack, reminders queued.
        self.dropped = 0
        self.suppressed = 0
        self.sent = 0
        self.abandoned = 0
        self.rejected = 0
        self.reminded = 0
        self._client = client
        self._owns_client = client is None
        self._sleep = sleep
        self._clock = clock
        self._rng = rng if rng is not None else random.Random()
        self._log = structlog.get_logger("launcher.notify")
        self._queue: deque[Message] = deque()
        self._state = _State.IDLE
        self._wake: anyio.Event | None = None
        self._done: anyio.Event | None = None
        self._scope: anyio.CancelScope | None = None
        # Per server: its last attempt.failed events (at most _FAILURES_KEPT), its last ready.
        self._failures: dict[str, list[events.AttemptFailed]] = {}
        self._ready: dict[str, events.ServerReady] = {}
        self._memory: dict[tuple[str, Kind], NotifyState] = {}
        self._store: StateStore | None = None

    @property
    def pending(self) -> int:
        """Messages waiting in the queue (not counting one being delivered)."""
        return len(self._queue)

    # -- set-up ---------------------------------------------------------------------------

    def describe(self, server: str, info: ServerInfo) -> None:
        """What ``server``'s messages say about it from now on (the daemon calls it once the
        SGLang version is detected)."""
        self.servers_info[server] = info

    def bind_store(self, store: StateStore) -> None:
        """Keep the dedupe and alert memory in ``store`` (the ledger): load what a previous
        launcher left there, and save every change from now on. Never raises: a store that
        cannot be read is logged (``notify.state_not_loaded``) and the memory starts empty."""
        self._store = store
        try:
            states = store.notify_states()
        except Exception as exc:
            self._emit("warning", "notify.state_not_loaded", error=repr(exc))
            return
        for state in states:
            with contextlib.suppress(ValueError):  # a kind this launcher does not know
                self._memory[(state.server, Kind(state.kind))] = state

    def firing(self) -> list[tuple[str, Kind]]:
        """The (server, kind) of every alert firing now, oldest first (stable: at the same
        time, in the order they first fired)."""
        return [key for key, m in sorted(self._memory.items(),
                                         key=lambda item: item[1].firing_since or 0.0)
                if m.firing_since is not None]

    # -- the hook ------------------------------------------------------------------------

    def __call__(self, server: str, event: events.Event) -> None:
        """Turn ``event`` into messages and queue them. Never raises and never waits on the
        network; with a store, a change of memory is one small SQLite write (WAL)."""
        if not isinstance(event, _OBSERVED):
            return
        try:
            for message in self._observe(server, self.redact(event)):
                self._submit(message)
        except Exception as exc:  # a hook must never raise into the supervisor
            # Not even when logging fails: a notification is never worth a supervisor.
            with contextlib.suppress(Exception):
                self._emit(
                    "error", "notify.error", server=server, hook_event=event.name,
                    error=repr(exc),
                )

    def _observe(self, server: str, event: events.Event) -> list[Message]:
        if isinstance(event, events.LeaseAcquired):  # ``server`` is "": the whole fleet
            return ([takeover_message(event, origin=self.origin)]
                    if event.previous_box is not None else [])
        if isinstance(event, events.RouterReady):  # ``server`` is the router's name
            return [router_ready_message(server, event, origin=self.origin)]
        info = self.servers_info.get(server, _UNKNOWN_SERVER)
        failures = self._failures.setdefault(server, [])
        origin = self.origin
        ready = self._ready.get(server)
        match event:
            case events.AttemptFailed():
                failures.append(event)
                del failures[:-_FAILURES_KEPT]
                return []
            case events.ServerAdopted():
                return [adopted_message(server, info, event, origin=origin)] if (
                    self.announce_adoption) else []
            case events.ServerReady():
                self._ready[server] = event
                resolved = self._resolve(server, info, event)
                if resolved is not None:
                    return resolved
                if event.adopted:
                    return []  # found running by a restarted launcher: not a fresh "ready"
                return [ready_message(server, info, event, failures=failures, origin=origin)]
            case events.ServerGaveUp():
                return [gave_up_message(server, info, event, failures=failures, origin=origin)]
            case events.ServerInternalError() | events.RouterInternalError():
                return [internal_error_message(server, info, event, origin=origin)]
            case events.ServerUnhealthy():
                return [unhealthy_message(server, info, event, ready=ready, origin=origin)]
            case events.RestartScheduled():
                last = failures[-1] if failures else None
                return [restart_message(server, info, event, last_failure=last, ready=ready,
                                        origin=origin)]
        return []

    def _resolve(self, server: str, info: ServerInfo, event: events.ServerReady
                 ) -> list[Message] | None:
        """The RESOLVED messages for ``server``'s firing alerts (ending them), or None when
        none fires. An alert that was never announced (suppressed) resolves silently."""
        firing = [(m.firing_since, kind) for kind in ALERTS
                  if (m := self._memory.get((server, kind))) is not None
                  and m.firing_since is not None]
        kinds = [kind for _, kind in sorted(firing, key=lambda item: item[0] or 0.0)]
        if not kinds:
            return None
        now = self._clock()
        out = []
        for kind in kinds:
            memory = self._memory[(server, kind)]
            since, announced = memory.firing_since, memory.announced
            self._remember(replace(memory, firing_since=None, announced=False, payload={}))
            if announced:
                firing_s = None if since is None else now - since
                out.append(resolved_message(server, kind, info, event, firing_s=firing_s,
                                            origin=self.origin))
            else:
                self._count_suppressed(server, kind, Kind.RESOLVED)
        return out

    def _submit(self, message: Message) -> None:
        key = (message.server, message.kind)
        now = self._clock()
        memory = self._memory.get(key, NotifyState(message.server, message.kind.value))
        alert = message.kind in ALERTS
        # Resolutions are never held back: the alert they end was announced.
        if (message.kind is not Kind.RESOLVED and memory.last_sent is not None
                and now - memory.last_sent < self.dedupe_window_s):
            if alert and memory.firing_since is None:
                memory = replace(memory, firing_since=now, announced=False)
            self._remember(memory)
            self._count_suppressed(message.server, message.kind, message.kind)
            return
        count = 0
        for kind in Kind:
            other = self._memory.get((message.server, kind))
            if other is not None and other.suppressed:
                count += other.suppressed
                self._remember(replace(other, suppressed=0))
        if count:
            message = message.with_note(f"({count} similar suppressed)")
        message = _redacted(message, self.redact)
        memory = self._memory.get(key, memory)
        memory = replace(memory, last_sent=now)
        if alert:
            memory = replace(memory, firing_since=memory.firing_since or now, announced=True,
                             payload=message.payload())
        if message.kind is not Kind.RESOLVED:
            self._remember(memory)
        self._enqueue(message)

    def _count_suppressed(self, server: str, kind: Kind, what: Kind) -> None:
        memory = self._memory.get((server, kind), NotifyState(server, kind.value))
        memory = replace(memory, suppressed=memory.suppressed + 1)
        self._remember(memory)
        self.suppressed += 1
        total = sum(m.suppressed for kind in Kind
                    if (m := self._memory.get((server, kind))) is not None)
        self._emit("info", "notify.suppressed", server=server, kind=what.value,
                   suppressed=total)

    def _remember(self, state: NotifyState) -> None:
        """Keep ``state`` here and in the store (a store failure is logged, not raised).
        Without a webhook the memory stays in this process: a message that was only logged
        must not hold back the first one a later launcher with a webhook delivers."""
        self._memory[(state.server, Kind(state.kind))] = state
        if self._store is None or self.webhook_url is None:
            return
        try:
            self._store.save_notify_state(state)
        except Exception as exc:
            self._emit("warning", "notify.state_not_saved", server=state.server,
                       kind=state.kind, error=repr(exc))

    def remind_due(self) -> int:
        """Queue a reminder for every announced alert of a server this launcher supervises
        that has not been posted for ``remind_every_s``; returns how many. The worker calls
        it every ``reminder_poll_s``."""
        if self.remind_every_s <= 0:
            return 0
        now = self._clock()
        due = 0
        for (server, kind), memory in sorted(self._memory.items()):
            if (server not in self.servers_info or memory.firing_since is None
                    or not memory.announced or memory.last_sent is None or not memory.payload
                    or now - memory.last_sent < self.remind_every_s):
                continue
            last = Message(server, kind, str(memory.payload.get("text", "")),
                           list(memory.payload.get("blocks") or []))
            self._remember(replace(memory, last_sent=now))
            self._enqueue(_redacted(reminder(last, now - memory.firing_since), self.redact))
            self.reminded += 1
            due += 1
        return due

    def _enqueue(self, message: Message) -> None:
        """Queue ``message`` (already redacted) for the worker, or log it without a webhook."""
        if self.webhook_url is None or self._state is _State.CLOSED:
            self._emit(
                "info",
                "notify.message",
                server=message.server,
                kind=message.kind.value,
                text=message.text,
                details=blocks_text(message.blocks),
            )
            return
        if len(self._queue) >= self.max_queue:
            oldest = self._queue.popleft()
            self.dropped += 1
            self._emit(
                "warning",
                "notify.dropped",
                server=oldest.server,
                kind=oldest.kind.value,
                dropped_total=self.dropped,
            )
        self._queue.append(message)
        if self._wake is not None:
            self._wake.set()

    # -- the worker ----------------------------------------------------------------------

    async def run(self, *, task_status: TaskStatus[None] = anyio.TASK_STATUS_IGNORED) -> None:
        """Deliver queued messages until ``aclose()`` (or cancellation). Start it once.

        Error handling: a failure delivering one message is logged and the next one is
        tried; only cancellation ends the loop early.
        """
        if self._state is not _State.IDLE:
            raise LauncherError(f"notify: the worker cannot start when {self._state.value}")
        self._state = _State.RUNNING
        self._wake = anyio.Event()
        self._done = anyio.Event()
        try:
            with anyio.CancelScope() as self._scope, self._redacting_http_logs():
                task_status.started()
                await self._work()
        finally:
            with anyio.CancelScope(shield=True):
                await self._finish()
            self._done.set()

    async def aclose(self, timeout_s: float = 5.0) -> None:
        """Let the queue drain for at most ``timeout_s``, then stop the worker.

        Without a running worker the drain happens here, with the same bound. Afterwards the
        hook logs messages instead of queueing them. Safe to call more than once.
        """
        if self._state is _State.CLOSED:
            return
        if self._state is _State.IDLE:
            self._state = _State.CLOSING
            try:
                with anyio.move_on_after(timeout_s), self._redacting_http_logs():
                    await self._work()
            finally:
                with anyio.CancelScope(shield=True):
                    await self._finish()
            return
        self._state = _State.CLOSING
        assert self._wake is not None and self._done is not None and self._scope is not None
        self._wake.set()
        with anyio.move_on_after(timeout_s):
            await self._done.wait()
        if not self._done.is_set():
            self._scope.cancel()
            await self._done.wait()

    async def _work(self) -> None:
        self.remind_due()  # what fell due while no launcher ran
        while True:
            if self._queue:
                message = self._queue.popleft()
                try:
                    await self._deliver(message)
                except Exception as exc:  # one bad message must not stop the others
                    self._emit(
                        "error",
                        "notify.error",
                        server=message.server,
                        kind=message.kind.value,
                        error=repr(exc),
                    )
                continue
            if self._state is _State.CLOSING:
                return
            assert self._wake is not None  # only run() gets here, and it sets _wake
            # Wake for a new message, or to look for reminders that fell due.
            with anyio.move_on_after(self.reminder_poll_s):
                await self._wake.wait()
            self._wake = anyio.Event()
            self.remind_due()

    async def _finish(self) -> None:
        self._state = _State.CLOSED
        if self._queue:
            self._emit(
                "warning",
                "notify.unsent",
                count=len(self._queue),
                kinds=[f"{m.server}:{m.kind.value}" for m in self._queue],
            )
            self._queue.clear()
        if self._owns_client and self._client is not None:
            await self._client.aclose()
            self._client = None

    async def _deliver(self, message: Message) -> None:
        """Post ``message`` with retries inside ``max_tries`` and ``max_total_s``: tenacity
        tries a retryable answer again after what a 429's ``Retry-After`` says, else after
        ``_backoff``, sleeping the injected sleep; the total is measured on the injected
        clock, and no wait is begun that would take it past ``max_total_s``."""
        started = self._clock()
        payload = message.payload()
        try:
            payload["blocks"] = checked_blocks(payload["blocks"])
        except ValueError as exc:
            # Slack would answer 400 invalid_blocks: the text alone still reaches the channel.
            self._emit("error", "notify.invalid_blocks", server=message.server,
                       kind=message.kind.value, error=str(exc))
            payload = {"text": message.text}
        tries = 0

        async def post() -> _Result:
            nonlocal tries
            tries += 1
            return await self._post(payload)

        def last(rs: RetryCallState) -> _Result:
            assert rs.outcome is not None  # set before wait, stop and before_sleep run
            result: _Result = rs.outcome.result()
            return result

        def wait(rs: RetryCallState) -> float:
            after = last(rs).retry_after
            return after if after is not None else self._backoff(rs.attempt_number)

        def stop(rs: RetryCallState) -> bool:
            return rs.attempt_number >= self.max_tries or (
                self._clock() - started + rs.upcoming_sleep > self.max_total_s)

        def retrying_note(rs: RetryCallState) -> None:
            self._emit("warning", "notify.retry", server=message.server,
                       kind=message.kind.value, attempt=rs.attempt_number,
                       wait_s=round(rs.upcoming_sleep, 3), cause=last(rs).cause)

        result: _Result = await AsyncRetrying(
            retry=retry_if_result(lambda r: r.retry),
            wait=wait,
            stop=stop,
            before_sleep=retrying_note,
            sleep=self._sleep,
            retry_error_callback=last,  # the bounds are spent: the last answer, not an error
        )(post)
        ids = {"server": message.server, "kind": message.kind.value, "attempt": tries}
        if result.ok:
            self.sent += 1
            self._emit("info", "notify.sent", **ids, status=result.status)
        elif not result.retry:
            self.rejected += 1
            self._emit(
                "error", "notify.rejected", **ids, status=result.status, cause=result.cause
            )
        else:
            bound = "max_tries" if tries >= self.max_tries else "max_total_s"
            self._abandon(message, tries, result.cause, self._clock() - started, bound=bound)

    def _abandon(
        self, message: Message, tries: int, cause: str, elapsed: float, bound: str
    ) -> None:
        self.abandoned += 1
        self._emit(
            "error",
            "notify.abandoned",
            server=message.server,
            kind=message.kind.value,
            attempts=tries,
            cause=cause,
            bound=bound,
            elapsed_s=round(elapsed, 3),
        )

    async def _post(self, payload: dict[str, Any]) -> _Result:
        assert self.webhook_url is not None
        if self._client is None:
            self._client = httpx.AsyncClient()
        response: httpx.Response | None = None
        body = b""
        try:
            # httpx's timeout bounds each read/write; the scope bounds the whole request, so a
            # server that trickles bytes cannot hold the worker either. The answer is read raw
            # (identity asked for, nothing inflated) and only its first MAX_ANSWER bytes.
            with anyio.move_on_after(self.post_timeout_s):
                async with self._client.stream(
                    "POST", self.webhook_url, json=payload, timeout=self.post_timeout_s,
                    headers={"Accept-Encoding": "identity"},
                ) as streamed:
                    async for chunk in streamed.aiter_raw():
                        body += chunk
                        if len(body) >= MAX_ANSWER:
                            body = body[:MAX_ANSWER]
                            break
                    response = streamed
        except httpx.TimeoutException as exc:
            return _Result(ok=False, retry=True, cause=f"timeout: {type(exc).__name__}")
        except httpx.UnsupportedProtocol as exc:
            return _Result(ok=False, cause=f"{type(exc).__name__}: {exc}")
        except httpx.TransportError as exc:
            return _Result(ok=False, retry=True, cause=f"{type(exc).__name__}: {exc}")
        if response is None:
            return _Result(
                ok=False, retry=True, cause=f"timeout: no answer in {self.post_timeout_s}s"
            )
        status = response.status_code
        if 200 <= status < 300:
            return _Result(ok=True, status=status)
        cause = f"HTTP {status}: {clip(_shown(body, response), 200)}"
        if status == 429:
            after = _retry_after(response.headers.get("Retry-After"))
            return _Result(ok=False, retry=True, cause=cause, status=status, retry_after=after)
        retry = status >= 500 or status == 408
        return _Result(ok=False, retry=retry, cause=cause, status=status)

    def _backoff(self, tries: int) -> float:
        """Equal jitter: half the capped exponential delay, plus up to the other half."""
        delay = capped_exponential(tries, self.backoff_initial_s, self.backoff_max_s)
        return jittered(delay, Jitter.EQUAL, self._rng)

    @contextlib.contextmanager
    def _redacting_http_logs(self) -> Iterator[None]:
        filt = _RedactingFilter(self.redact)
        loggers = [logging.getLogger("httpx"), logging.getLogger("httpcore")]
        for logger in loggers:
            logger.addFilter(filt)
        try:
            yield
        finally:
            for logger in loggers:
                logger.removeFilter(filt)

    def _emit(self, level: str, name: str, /, **values: Any) -> None:
        getattr(self._log, level)(name, **self.redact(values))


def _redacted(message: Message, redact: Redactor) -> Message:
    return replace(message, text=redact.text(message.text), blocks=redact(message.blocks))


def webhook_url_ok(url: str) -> bool:
    """Whether ``url`` is usable as a webhook: an http(s) URL with a host."""
    try:
        _check_url(url)
    except ConfigError:
        return False
    return True


def _check_url(url: str) -> httpx.URL:
    problem = ConfigError(
        ["slack.webhook_url: not an http(s) URL with a host (value not shown: it is a secret)"],
        source="slack",
    )
    try:
        parsed = httpx.URL(url)
    except (httpx.InvalidURL, TypeError):
        raise problem from None
    if parsed.scheme not in ("http", "https") or not parsed.host:
        raise problem
    return parsed


def _shown(body: bytes, response: httpx.Response) -> str:
    """The start of an answer's raw ``body`` as text for an error; a compressed body (sent
    although launcher asked for identity) is named, never inflated."""
    encoding = response.headers.get("Content-Encoding", "identity").strip().lower()
    if encoding not in ("", "identity"):
        return f"({encoding}-encoded body, {len(body)} bytes read)"
    return body[:1024].decode("utf-8", "replace").strip()


def _retry_after(value: str | None) -> float | None:
    """Seconds from a ``Retry-After`` header (a number, or an HTTP date); None if unusable."""
    if value is None:
        return None
    try:
        seconds = float(value)
    except ValueError:
        try:
            when = email.utils.parsedate_to_datetime(value)
        except (TypeError, ValueError):
            return None
        seconds = when.timestamp() - time.time()
    if not math.isfinite(seconds):
        return None
    return max(0.0, seconds)
