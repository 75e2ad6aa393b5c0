"""Slack notifications for what a person needs to know: ready, gave up, unhealthy, relaunched,
recovered.

``SlackNotifier`` is a supervisor event hook. Calling it (``notifier(server, event, data)``)
only turns the event into a message and puts it on a bounded queue; a worker task
(``await tg.start(notifier.run)``) posts the queue to a Slack incoming webhook, one message at
a time, in order. Without a webhook the messages go to the log (``notify.message``) instead.

Which events become messages:

- ``server.ready``: params that worked, attempts, time to ready, what each failed attempt hit
  (from ``data["history"]``). A ``server.ready`` after ``server.unhealthy`` or
  ``restart.scheduled`` for the same server is a "recovered" message instead.
- ``server.adopted``: nothing, unless ``announce_adoption``: then an "adopted" message. The
  adopted attempt's later ``server.ready`` (``adopted`` true) posts nothing: it is no fresh
  ready. Every message numbers attempts as the host does (``#N``: run directory, ledger).
- ``server.gave_up``: the reason, the attempt ledger, and the evidence lines and advice of
  that server's last ``attempt.failed`` (kept per server for this purpose).
- ``server.unhealthy`` and ``restart.scheduled`` ("relaunched after ready").

Every other event is ignored (``attempt.failed`` is only remembered).

Flapping does not flood the channel: a message of the same (server, kind) as one sent less
than ``dedupe_window_s`` ago is suppressed and counted, and the next message sent for that
server ends with "(N similar suppressed)".

Resource handling: the queue holds at most ``max_queue`` messages; when full the oldest is
dropped (``notify.dropped``). Each POST is bounded by ``post_timeout_s``; each message by
``max_tries`` and ``max_total_s``. ``aclose(timeout_s)`` lets the worker drain for at most
``timeout_s`` and then cancels it; whatever is left is logged as ``notify.unsent``. An
``httpx.AsyncClient`` created here is closed here; one passed in belongs to the caller.

Error handling: nothing reaches the supervisor. The hook catches everything
(``notify.error``). Delivery retries 5xx, 408, connection errors and timeouts with jittered
exponential backoff, waits what a 429's ``Retry-After`` says, and gives up after the bounds
(``notify.abandoned``); other 4xx answers are not retried (``notify.rejected``).

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
import random
import re
import time
from collections import deque
from collections.abc import Awaitable, Callable, Collection, Iterator, Mapping, Sequence
from dataclasses import dataclass, field, replace
from typing import Any, TypeVar

import anyio
import httpx
import structlog
from anyio.abc import TaskStatus

from launcher.durations import format_duration
from launcher.errors import ConfigError, LauncherError
from launcher.params import LaunchParams

__all__ = [
    "Kind",
    "Message",
    "Redactor",
    "ServerInfo",
    "SlackNotifier",
    "adopted_message",
    "gave_up_message",
    "ready_message",
    "restart_message",
    "unhealthy_message",
]

_T = TypeVar("_T")

MASK = "***"
# Shorter values would mask ordinary words in every message and protect nothing.
MIN_SECRET_LEN = 4
_EVIDENCE_LINE_MAX = 300
_LEDGER_MAX = 15
_SECTION_MAX = 2900  # Slack rejects a section text over 3000 characters
_TEXT_MAX = 3000  # the notification text; Slack truncates far later, people read far less
_HEADER_MAX = 150  # Slack's limit for a header block
_FAILURES_KEPT = 50
_OBSERVED = frozenset(
    {
        "attempt.failed",
        "server.ready",
        "server.adopted",
        "server.gave_up",
        "server.unhealthy",
        "restart.scheduled",
        "router.ready",
    }
)


# --- pure parts: redaction and messages ---------------------------------------------------


class Redactor:
    """Replaces every occurrence of any secret with ``***`` in strings, deep in containers.

    Values shorter than ``MIN_SECRET_LEN`` are ignored. Longer secrets are matched first, so a
    secret that contains another is masked whole. A secret's Slack-escaped form (``&`` as
    ``&amp;``, ...) is masked too, so text escaped for Slack before masking cannot leak it.
    """

    def __init__(self, secrets: Collection[str]) -> None:
        kept = {s for s in secrets if len(s) >= MIN_SECRET_LEN}
        values = sorted(kept | {_esc(s) for s in kept}, key=len, reverse=True)
        self._pattern = re.compile("|".join(map(re.escape, values))) if values else None

    def text(self, value: str) -> str:
        """``value`` with every secret masked."""
        if self._pattern is None:
            return value
        return self._pattern.sub(MASK, value)

    def __call__(self, value: _T) -> _T:
        """A copy of ``value`` with every string in it (dict keys included) masked."""
        return self._walk(value)  # type: ignore[no-any-return]

    def _walk(self, value: Any) -> Any:
        if isinstance(value, str):
            return self.text(value)
        if isinstance(value, Mapping):
            return {self._walk(k): self._walk(v) for k, v in value.items()}
        if isinstance(value, list | tuple):
            return [self._walk(v) for v in value]
        return value


@dataclass(frozen=True)
class ServerInfo:
    """Context shown with a server's messages."""

    host: str
    model: str


class Kind(enum.StrEnum):
    """What a message is about. Dedupe works per (server, kind)."""

    READY = "ready"
    RECOVERED = "recovered"
    GAVE_UP = "gave_up"
    UNHEALTHY = "unhealthy"
    RESTART = "restart"
    ADOPTED = "adopted"


@dataclass(frozen=True)
class Message:
    """One Slack message: Block Kit ``blocks`` plus the plain ``text`` notifications show."""

    server: str
    kind: Kind
    text: str
    blocks: list[dict[str, Any]] = field(default_factory=list)

    def payload(self) -> dict[str, Any]:
        """The JSON body for an incoming webhook."""
        return {"text": self.text, "blocks": self.blocks}

    def with_note(self, note: str) -> Message:
        """This message with ``note`` appended to the text and as a closing context block."""
        block = {"type": "context", "elements": [{"type": "mrkdwn", "text": _esc(note)}]}
        return replace(self, text=f"{self.text} {_esc(note)}", blocks=[*self.blocks, block])


_UNKNOWN = ServerInfo(host="?", model="?")


def ready_message(
    server: str,
    info: ServerInfo,
    data: Mapping[str, Any],
    *,
    failures: Sequence[Mapping[str, Any]] = (),
    recovered_from: str | None = None,
) -> Message:
    """The message for ``server.ready``; a "recovered" one when ``recovered_from`` is set.

    ``data`` is the event's data (attempt, seconds, params, history); ``failures`` the
    server's ``attempt.failed`` data in order, used to number failed attempts whose history
    entry has no number.
    """
    params = _params(data.get("params"))
    attempt = _attempt_no(data)
    seconds = _duration(data.get("seconds"))
    ledger = _ledger(data.get("history"), failures)
    if recovered_from is None:
        kind, title = Kind.READY, f":white_check_mark: {server} is ready"
        text = f"{server} is ready on {info.host} ({info.model})"
    else:
        kind, title = Kind.RECOVERED, f":large_green_circle: {server} recovered"
        text = f"{server} recovered on {info.host} ({info.model}) after {recovered_from}"
    text += f" with {params}, attempt {attempt}, {seconds} to ready"
    if ledger:
        text += f". Failed attempts: {'; '.join(ledger)}"
    blocks = [
        _header(title),
        _fields(
            ("Host", info.host),
            ("Model", info.model),
            ("Params", f"`{params}`"),
            ("Attempt", attempt),
            ("Time to ready", seconds),
        ),
    ]
    if recovered_from is not None:
        blocks.append(_section(f"*After*\n{_esc(recovered_from)}"))
    if ledger:
        blocks.append(_section("*Failed attempts*\n" + "\n".join(f"• {_esc(x)}" for x in ledger)))
    return Message(server, kind, _esc(_clip(text, _TEXT_MAX)), blocks)


def _attempt_no(data: Mapping[str, Any]) -> str:
    """"#N": the host's attempt number, as in the run directory, the ledger and status."""
    number = data.get("attempt")
    if isinstance(number, int) and not isinstance(number, bool):
        return f"#{number}"
    return "?"


def router_ready_message(router: str, data: Mapping[str, Any]) -> Message:
    """The message for ``router.ready`` (``[[routers]]``): it names the router, where it
    listens and the servers behind it (registered as each one is ready)."""
    where = f"{data.get('host', '?')}:{data.get('port', '?')}"
    servers = data.get("servers")
    behind = ", ".join(str(s) for s in servers) if isinstance(servers, list) else "?"
    seconds = _duration(data.get("seconds"))
    attempt = _attempt_no(data)
    text = (f"router {router} is ready on {where} (attempt {attempt}, {seconds} to ready); "
            f"its workers: {behind}, each registered once ready")
    blocks = [
        _header(f":white_check_mark: router {router} is ready"),
        _fields(("Listens on", where), ("Workers", behind), ("Attempt", attempt),
                ("Time to ready", seconds)),
    ]
    return Message(router, Kind.READY, _esc(_clip(text, _TEXT_MAX)), blocks)


def adopted_message(server: str, info: ServerInfo, data: Mapping[str, Any]) -> Message:
    """The message for ``server.adopted`` (only sent when ``announce_adoption``): a restarted
    launcher found the server running and supervises it again; nothing was relaunched."""
    params = _params(data.get("params"))
    attempt = _attempt_no(data)
    pid = data.get("pid", "?")
    text = (f"{server} adopted on {info.host} ({info.model}): attempt {attempt} (pid {pid}) "
            f"is still running with {params}; supervising it again, nothing relaunched")
    blocks = [
        _header(f":link: {server} adopted"),
        _fields(
            ("Host", info.host),
            ("Model", info.model),
            ("Params", f"`{params}`"),
            ("Attempt", attempt),
        ),
    ]
    return Message(server, Kind.ADOPTED, _esc(_clip(text, _TEXT_MAX)), blocks)


def gave_up_message(
    server: str,
    info: ServerInfo,
    data: Mapping[str, Any],
    *,
    failures: Sequence[Mapping[str, Any]] = (),
) -> Message:
    """The message for ``server.gave_up``: reason, ledger, and the last failure's evidence
    lines and advice (from ``failures[-1]``, the server's last ``attempt.failed`` data)."""
    reason = str(data.get("reason") or "unknown reason")
    attempts = data.get("attempts", "?")
    ledger = _ledger(data.get("history"), failures)
    last = failures[-1] if failures else {}
    evidence = [_clip(str(line), _EVIDENCE_LINE_MAX) for line in last.get("evidence") or []]
    advice = str(last.get("advice") or data.get("advice") or "")
    last_no = _attempt_no(data)
    text = f"{server} gave up on {info.host} ({info.model}) after {attempts} attempt(s)"
    text += f" (last {last_no})" if last_no != "?" else ""
    text += f": {reason}"
    if evidence:
        text += f". Last evidence: {evidence[-1]}"
    blocks = [
        _header(f":x: {server} gave up"),
        _fields(("Host", info.host), ("Model", info.model), ("Attempts", str(attempts))),
        _section(f"*Reason*\n{_esc(reason)}"),
    ]
    if ledger:
        blocks.append(_section("*Attempts*\n" + "\n".join(f"• {_esc(x)}" for x in ledger)))
    if evidence:
        what = f"{last.get('outcome', '?')} in {last.get('phase', '?')}"
        if "attempt" in last:
            what = f"attempt #{last['attempt']}: {what}"
        lines = "\n".join(_esc(line).replace("```", "'''") for line in evidence)
        blocks.append(_section(f"*Evidence* ({_esc(what)})\n```{lines}```"))
    if advice:
        # A fix SGLang's error prescribes ends the advice as a config snippet: a code block.
        advice, _, snippet = advice.partition(_CONFIG_CHANGE)
        blocks.append(_section(f"*Advice*\n{_esc(advice)}"))
        if snippet:
            code = _esc(snippet).replace("```", "'''")
            blocks.append(_section(f"*Config change*\n```{code}```"))
    return Message(server, Kind.GAVE_UP, _esc(_clip(text, _TEXT_MAX)), blocks)


_CONFIG_CHANGE = " Config change:\n"  # sglang.classify puts a prescribed fix's TOML after it


def unhealthy_message(server: str, info: ServerInfo, data: Mapping[str, Any]) -> Message:
    """The message for ``server.unhealthy`` (failed /health probes after ready)."""
    count = data.get("consecutive_failures", "?")
    detail = str(data.get("detail") or "")
    what = f"{count} failed health probes in a row" + (f" (last: {detail})" if detail else "")
    text = f"{server} is unhealthy on {info.host} ({info.model}): {what}"
    blocks = [
        _header(f":warning: {server} is unhealthy"),
        _fields(("Host", info.host), ("Model", info.model)),
        _section(_esc(what)),
    ]
    return Message(server, Kind.UNHEALTHY, _esc(_clip(text, _TEXT_MAX)), blocks)


def restart_message(
    server: str,
    info: ServerInfo,
    data: Mapping[str, Any],
    *,
    last_failure: Mapping[str, Any] | None = None,
) -> Message:
    """The message for ``restart.scheduled``: the server failed after ready and is relaunched
    with the last good params; ``last_failure`` (its ``attempt.failed`` data) says why."""
    params = _params(data.get("params"))
    delay = _duration(data.get("delay_s"))
    why = ""
    if last_failure:
        why = f"{last_failure.get('outcome', '?')} in {last_failure.get('phase', '?')}"
    text = f"{server} relaunched after ready on {info.host} ({info.model})"
    text += f" after {why}" if why else ""
    text += f": relaunching in {delay} with {params}"
    blocks = [
        _header(f":repeat: {server} relaunched after ready"),
        _fields(
            ("Host", info.host),
            ("Model", info.model),
            ("Params", f"`{params}`"),
            ("Relaunch in", delay),
        ),
    ]
    if why:
        blocks.append(_section(f"*Failure*\n{_esc(why)}"))
    return Message(server, Kind.RESTART, _esc(_clip(text, _TEXT_MAX)), blocks)


def _params(value: Any) -> str:
    if not isinstance(value, Mapping):
        return "unknown params"
    mfs, bs = value.get("mem_fraction_static"), value.get("cuda_graph_max_bs")
    try:
        return LaunchParams.from_extras(
            None if mfs is None else float(mfs), None if bs is None else int(bs), dict(value)
        ).describe()
    except (TypeError, ValueError):
        return f"mem_fraction_static={mfs} cuda_graph_max_bs={bs}"


def _duration(value: Any) -> str:
    if isinstance(value, bool) or not isinstance(value, int | float) or not math.isfinite(value):
        return "?"
    seconds = max(0.0, float(value))
    # Whole seconds read better ("7m12s" rather than "7m12.38s"); sub-second stays in ms.
    return format_duration(float(round(seconds)) if seconds >= 1 else seconds)


def _ledger(history: Any, failures: Sequence[Mapping[str, Any]]) -> list[str]:
    """One line per failed attempt of ``history``, numbered when ``failures`` lines up."""
    if not isinstance(history, Sequence) or isinstance(history, str):
        return []
    entries = [h for h in history if isinstance(h, Mapping)]
    # Every history record comes with one attempt.failed, so the last len(history) failures
    # are the same attempts; number them only when outcome and phase agree pairwise.
    # Entries carry their attempt number (the supervisor's history does); older data did not.
    numbers: list[Any] = [h.get("attempt") for h in entries]
    if entries and None in numbers and len(failures) >= len(entries):
        tail = failures[len(failures) - len(entries) :]
        if all(
            f.get("outcome") == h.get("outcome") and f.get("phase") == h.get("phase")
            for f, h in zip(tail, entries, strict=True)
        ):
            numbers = [f.get("attempt") for f in tail]
    lines = []
    for number, entry in zip(numbers, entries, strict=True):
        prefix = f"#{number} " if number is not None else ""
        lines.append(
            f"{prefix}{_params(entry.get('params'))} → {entry.get('outcome', '?')}"
            f" in {entry.get('phase', '?')}"
        )
    if len(lines) > _LEDGER_MAX:
        earlier = len(lines) - _LEDGER_MAX
        lines = [f"… {earlier} earlier attempt(s)", *lines[-_LEDGER_MAX:]]
    return lines


def _esc(text: str) -> str:
    """Escape the three characters Slack's text formatting reserves."""
    return text.replace("&", "&amp;").replace("<", "&lt;").replace(">", "&gt;")


def _clip(text: str, limit: int) -> str:
    return text if len(text) <= limit else text[: limit - 1] + "…"


def _header(title: str) -> dict[str, Any]:
    return {
        "type": "header",
        "text": {"type": "plain_text", "text": _clip(title, _HEADER_MAX), "emoji": True},
    }


def _section(mrkdwn: str) -> dict[str, Any]:
    return {"type": "section", "text": {"type": "mrkdwn", "text": _clip(mrkdwn, _SECTION_MAX)}}


def _fields(*pairs: tuple[str, str]) -> dict[str, Any]:
    return {
        "type": "section",
        "fields": [
            {"type": "mrkdwn", "text": _clip(f"*{name}*\n{_esc(value)}", 1900)}
            for name, value in pairs
        ],
    }


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


class SlackNotifier:
    """A supervisor event hook that posts what matters to a Slack incoming webhook.

    ``webhook_url`` ``None`` sends nothing over HTTP: each message is logged as
    ``notify.message``. Otherwise start the worker once in the daemon's task group with
    ``await tg.start(notifier.run)`` and call ``await notifier.aclose()`` before leaving it.
    Call the hook from the event loop's thread (the supervisor does).

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
        clock: Callable[[], float] = time.monotonic,
        max_queue: int = 100,
        max_tries: int = 5,
        max_total_s: float = 120.0,
        dedupe_window_s: float = 600.0,
        post_timeout_s: float = 10.0,
        backoff_initial_s: float = 1.0,
        backoff_max_s: float = 30.0,
        rng: random.Random | None = None,
        announce_adoption: bool = False,
    ) -> None:
        if max_queue < 1 or max_tries < 1:
            raise ConfigError(["notify: max_queue and max_tries must be at least 1"])
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
        self.redact = Redactor(secret_values)
        self.max_queue = max_queue
        self.max_tries = max_tries
        self.max_total_s = max_total_s
        self.dedupe_window_s = dedupe_window_s
        self.post_timeout_s = post_timeout_s
        self.backoff_initial_s = backoff_initial_s
        self.backoff_max_s = backoff_max_s
        # Counters (for metrics and tests): messages dropped on overflow, suppressed as
        # duplicates, delivered, abandoned after retries, rejected by Slack.
        self.dropped = 0
        self.suppressed = 0
        self.sent = 0
        self.abandoned = 0
        self.rejected = 0
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
        self._failures: dict[str, list[dict[str, Any]]] = {}
        self._trouble: dict[str, str] = {}
        self._last_sent: dict[tuple[str, Kind], float] = {}
        self._suppressed_for: dict[str, int] = {}

    @property
    def pending(self) -> int:
        """Messages waiting in the queue (not counting one being delivered)."""
        return len(self._queue)

    # -- the hook ------------------------------------------------------------------------

    def __call__(self, server: str, event: str, data: dict[str, Any]) -> None:
        """Turn ``event`` into a message and queue it. Never blocks, never raises."""
        if event not in _OBSERVED:
            return
        try:
            message = self._observe(server, event, self.redact(data))
            if message is not None:
                self._submit(message)
        except Exception as exc:  # a hook must never raise into the supervisor
            # Not even when logging fails: a notification is never worth a supervisor.
            with contextlib.suppress(Exception):
                self._emit(
                    "error", "notify.error", server=server, hook_event=event, error=repr(exc)
                )

    def _observe(self, server: str, event: str, data: dict[str, Any]) -> Message | None:
        if event == "router.ready":  # ``server`` is the router's name
            return router_ready_message(server, data)
        info = self.servers_info.get(server, _UNKNOWN)
        failures = self._failures.setdefault(server, [])
        if event == "attempt.failed":
            failures.append(data)
            del failures[:-_FAILURES_KEPT]
            return None
        if event == "server.adopted":
            return adopted_message(server, info, data) if self.announce_adoption else None
        if event == "server.ready":
            if data.get("adopted"):
                return None  # found running by a restarted launcher: not a fresh "ready"
            recovered_from = self._trouble.pop(server, None)
            return ready_message(
                server, info, data, failures=failures, recovered_from=recovered_from
            )
        if event == "server.gave_up":
            return gave_up_message(server, info, data, failures=failures)
        if event == "server.unhealthy":
            count = data.get("consecutive_failures", "?")
            self._trouble[server] = f"{count} failed health probes"
            return unhealthy_message(server, info, data)
        if event == "restart.scheduled":
            last = failures[-1] if failures else None
            if server not in self._trouble:
                why = f": {last.get('outcome', '?')}" if last else ""
                self._trouble[server] = f"a relaunch after ready{why}"
            return restart_message(server, info, data, last_failure=last)
        return None

    def _submit(self, message: Message) -> None:
        key = (message.server, message.kind)
        now = self._clock()
        last = self._last_sent.get(key)
        if last is not None and now - last < self.dedupe_window_s:
            count = self._suppressed_for.get(message.server, 0) + 1
            self._suppressed_for[message.server] = count
            self.suppressed += 1
            self._emit(
                "info",
                "notify.suppressed",
                server=message.server,
                kind=message.kind.value,
                suppressed=count,
            )
            return
        self._last_sent[key] = now
        count = self._suppressed_for.pop(message.server, 0)
        if count:
            message = message.with_note(f"({count} similar suppressed)")
        message = _redacted(message, self.redact)
        if self.webhook_url is None or self._state is _State.CLOSED:
            self._emit(
                "info",
                "notify.message",
                server=message.server,
                kind=message.kind.value,
                text=message.text,
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
            await self._wake.wait()
            self._wake = anyio.Event()

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
        """Post ``message`` with retries inside ``max_tries`` and ``max_total_s``."""
        started = self._clock()
        payload = message.payload()
        tries = 0
        result = _Result(ok=False)
        while tries < self.max_tries:
            tries += 1
            result = await self._post(payload)
            ids = {"server": message.server, "kind": message.kind.value, "attempt": tries}
            if result.ok:
                self.sent += 1
                self._emit("info", "notify.sent", **ids, status=result.status)
                return
            if not result.retry:
                self.rejected += 1
                self._emit(
                    "error", "notify.rejected", **ids, status=result.status, cause=result.cause
                )
                return
            if tries >= self.max_tries:
                break
            wait = result.retry_after if result.retry_after is not None else self._backoff(tries)
            elapsed = self._clock() - started
            if elapsed + wait > self.max_total_s:
                self._abandon(message, tries, result.cause, elapsed, bound="max_total_s")
                return
            self._emit("warning", "notify.retry", **ids, wait_s=round(wait, 3), cause=result.cause)
            await self._sleep(wait)
        self._abandon(message, tries, result.cause, self._clock() - started, bound="max_tries")

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
        try:
            # httpx's timeout bounds each read/write; the scope bounds the whole request, so a
            # server that trickles bytes cannot hold the worker either.
            with anyio.move_on_after(self.post_timeout_s):
                response = await self._client.post(
                    self.webhook_url, json=payload, timeout=self.post_timeout_s
                )
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
        cause = f"HTTP {status}: {_clip(response.text.strip(), 200)}"
        if status == 429:
            after = _retry_after(response.headers.get("Retry-After"))
            return _Result(ok=False, retry=True, cause=cause, status=status, retry_after=after)
        retry = status >= 500 or status == 408
        return _Result(ok=False, retry=retry, cause=cause, status=status)

    def _backoff(self, tries: int) -> float:
        """Equal jitter: half the capped exponential delay, plus up to the other half."""
        delay = min(self.backoff_max_s, self.backoff_initial_s * 2.0 ** (tries - 1))
        return delay / 2 + self._rng.uniform(0, delay / 2)

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
