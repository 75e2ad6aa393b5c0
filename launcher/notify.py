"""Slack notifications for the person on call: ready, gave up, unhealthy, relaunched, resolved.

``SlackNotifier`` is a supervisor event hook. Calling it (``notifier(server, event)``)
only turns the event into messages and puts them on a bounded queue; a worker task
(``await tg.start(notifier.run)``) posts the queue to a Slack incoming webhook, one message at
a time, in order, and posts reminders. Without a webhook the messages go to the log
(``notify.message``) instead.

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
restarted launcher neither repeats what it just posted nor forgets what still fires.

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
import re
import shlex
import time
from collections import deque
from collections.abc import Awaitable, Callable, Collection, Iterator, Mapping, Sequence
from dataclasses import dataclass, field, fields, is_dataclass, replace
from typing import Any, Protocol, TypeGuard, TypeVar

import anyio
import httpx
import structlog
from anyio.abc import TaskStatus

from launcher import events
from launcher.durations import format_duration
from launcher.errors import ConfigError, LauncherError
from launcher.facts import ServerFacts, operator_box
from launcher.params import LaunchParams
from launcher.store import NotifyState

__all__ = [
    "Kind",
    "Message",
    "Origin",
    "Redactor",
    "ServerInfo",
    "SlackNotifier",
    "adopted_message",
    "gave_up_message",
    "ready_message",
    "resolved_message",
    "restart_message",
    "unhealthy_message",
    "webhook_url_ok",
]

_T = TypeVar("_T")

MASK = "***"
# Shorter values would mask ordinary words in every message and protect nothing.
MIN_SECRET_LEN = 4
_EVIDENCE_LINE_MAX = 300
_LEDGER_MAX = 15
# Slack's limits (slack_sdk's HeaderBlock / SectionBlock check them: ``checked_blocks``);
# clipped to fit, with room.
_SECTION_MAX = 2900
_HEADER_MAX = 150
_FIELD_MAX = 1900  # a field's text: Slack allows 2000
_TEXT_MAX = 3000  # the notification text; Slack truncates far later, people read far less
_FAILURES_KEPT = 50
_OBSERVED = (
    events.AttemptFailed,
    events.ServerReady,
    events.ServerAdopted,
    events.ServerGaveUp,
    events.ServerUnhealthy,
    events.RestartScheduled,
    events.RouterReady,
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

    def _walk(self, value: Any, in_record: bool = False) -> Any:
        if isinstance(value, enum.Enum):
            return value  # a fixed value, never a secret (and a StrEnum must stay one)
        if isinstance(value, str):
            return self.text(value)
        if is_dataclass(value) and not isinstance(value, type):
            # A typed event (or a record in one, LaunchParams): the same type, its strings
            # masked, its tuples kept tuples.
            return replace(value, **{f.name: self._walk(getattr(value, f.name), True)
                                     for f in fields(value) if f.init})
        if in_record and isinstance(value, tuple):
            return tuple(self._walk(v, True) for v in value)
        if isinstance(value, Mapping):
            return {self._walk(k): self._walk(v) for k, v in value.items()}
        if isinstance(value, list | tuple):
            return [self._walk(v) for v in value]
        return value


# What a message says about its server: host, model name, endpoint, GPUs, SGLang version.
ServerInfo = ServerFacts


@dataclass(frozen=True)
class Origin:
    """Who sent a message: the operator box (host name) and the config file (absolute path)."""

    box: str = "?"
    config: str = "CONFIG"


class Kind(enum.StrEnum):
    """What a message is about. Dedupe works per (server, kind); gave_up, unhealthy and restart
    are alerts (they fire until the server is ready again)."""

    READY = "ready"
    RESOLVED = "resolved"
    GAVE_UP = "gave_up"
    UNHEALTHY = "unhealthy"
    RESTART = "restart"
    ADOPTED = "adopted"


ALERTS = (Kind.GAVE_UP, Kind.UNHEALTHY, Kind.RESTART)
_TITLES = {
    Kind.GAVE_UP: "{server} gave up",
    Kind.UNHEALTHY: "{server} is unhealthy",
    Kind.RESTART: "{server} relaunched after ready",
}
_EMOJI = {Kind.GAVE_UP: ":x:", Kind.UNHEALTHY: ":warning:", Kind.RESTART: ":repeat:"}


def alert_title(server: str, kind: Kind) -> str:
    """The title an alert's firing, reminder and resolved messages share."""
    return _TITLES[kind].format(server=server)


@dataclass(frozen=True)
class Message:
    """One Slack message: Block Kit ``blocks`` plus the plain ``text`` notifications show.

    ``alert`` is the alert kind a RESOLVED message resolves (else None)."""

    server: str
    kind: Kind
    text: str
    blocks: list[dict[str, Any]] = field(default_factory=list)
    alert: Kind | None = None

    def payload(self) -> dict[str, Any]:
        """The JSON body for an incoming webhook."""
        return {"text": self.text, "blocks": self.blocks}

    def with_note(self, note: str) -> Message:
        """This message with ``note`` appended to the text and as a context block before the
        closing one (who sent it)."""
        block = _context(_esc(note))
        blocks = [*self.blocks[:-1], block, *self.blocks[-1:]] if self.blocks else [block]
        return replace(self, text=f"{self.text} {_esc(note)}", blocks=blocks)


_UNKNOWN = ServerInfo(host="?", model="?")
_NOWHERE = Origin()


def ready_message(
    server: str,
    info: ServerInfo,
    data: Mapping[str, Any],
    *,
    failures: Sequence[Mapping[str, Any]] = (),
    origin: Origin = _NOWHERE,
) -> Message:
    """The message for ``server.ready`` with nothing firing.

    ``data`` is the event's data (attempt, seconds, params, resolved, history); ``failures``
    the server's ``attempt.failed`` data in order, used to number failed attempts whose
    history entry has no number and to fill their "auto" params with what SGLang printed.
    """
    params = _params(data.get("params"), data.get("resolved"))
    attempt = _attempt_no(data)
    seconds = _duration(data.get("seconds"))
    ledger = _ledger(data.get("history"), failures)
    text = f"{server} is ready on {info.host} ({info.model}) with {params}, attempt {attempt}, "
    text += f"{seconds} to ready"
    if ledger:
        text += f". Failed attempts: {'; '.join(ledger)}"
    blocks = [
        _header(f":white_check_mark: {server} is ready"),
        _facts(info, params, attempt, ("Time to ready", seconds)),
    ]
    if ledger:
        blocks.append(_section("*Failed attempts*\n" + "\n".join(f"• {_esc(x)}" for x in ledger)))
    return _message(server, Kind.READY, text, blocks, origin, data.get("attempt"))


def resolved_message(
    server: str,
    alert: Kind,
    info: ServerInfo,
    data: Mapping[str, Any],
    *,
    firing_s: float | None,
    origin: Origin = _NOWHERE,
) -> Message:
    """``[RESOLVED] <title>``: the alert ``alert`` of ``server`` ends, as ``server.ready``
    (``data``) came; ``firing_s`` how long it fired (None: unknown)."""
    title = alert_title(server, alert)
    params = _params(data.get("params"), data.get("resolved"))
    attempt = _attempt_no(data)
    seconds = _duration(data.get("seconds"))
    fired = _duration(firing_s)
    text = (f"[RESOLVED] {title}: ready again on {info.host} ({info.model}) with {params}, "
            f"attempt {attempt}")
    text += f", {seconds} to ready" if seconds != "?" else ""
    text += f"; fired for {fired}" if fired != "?" else ""
    blocks = [
        _header(f":large_green_circle: [RESOLVED] {title}"),
        _facts(info, params, attempt, ("Time to ready", seconds), ("Fired for", fired)),
    ]
    return _message(server, Kind.RESOLVED, text, blocks, origin, data.get("attempt"),
                    alert=alert)


def _attempt_no(data: Mapping[str, Any]) -> str:
    """"#N": the host's attempt number, as in the run directory, the ledger and status."""
    number = data.get("attempt")
    if isinstance(number, int) and not isinstance(number, bool):
        return f"#{number}"
    return "?"


def router_ready_message(router: str, data: Mapping[str, Any], *,
                         origin: Origin = _NOWHERE) -> Message:
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
    # No logs line: `launcher logs` reads servers' attempts, not the router's.
    return _message(router, Kind.READY, text, blocks, origin, None)


def adopted_message(
    server: str, info: ServerInfo, data: Mapping[str, Any], *, origin: Origin = _NOWHERE
) -> Message:
    """The message for ``server.adopted`` (only sent when ``announce_adoption``): a restarted
    launcher found the server running and supervises it again; nothing was relaunched."""
    params = _params(data.get("params"))
    attempt = _attempt_no(data)
    pid = data.get("pid", "?")
    text = (f"{server} adopted on {info.host} ({info.model}): attempt {attempt} (pid {pid}) "
            f"is still running with {params}; supervising it again, nothing relaunched")
    blocks = [_header(f":link: {server} adopted"), _facts(info, params, attempt)]
    return _message(server, Kind.ADOPTED, text, blocks, origin, data.get("attempt"))


def gave_up_message(
    server: str,
    info: ServerInfo,
    data: Mapping[str, Any],
    *,
    failures: Sequence[Mapping[str, Any]] = (),
    origin: Origin = _NOWHERE,
) -> Message:
    """``[FIRING] <server> gave up``: reason, ledger, and the last failure's evidence lines and
    advice (from ``failures[-1]``, the server's last ``attempt.failed`` data)."""
    title = alert_title(server, Kind.GAVE_UP)
    attempts = data.get("attempts", "?")
    ledger = _ledger(data.get("history"), failures)
    last = failures[-1] if failures else {}
    evidence = _evidence(last)
    reason = str(data.get("reason") or "unknown reason")
    if evidence:
        # The reason quotes the decisive line ("… (log: LINE)"); the evidence shows it already.
        reason = _unquoted(reason, evidence)
    advice = str(last.get("advice") or data.get("advice") or "")
    if advice and advice in reason:
        advice = ""  # the reason already says it (a fatal verdict's reason is its advice)
    params = _params(last.get("params") or _last_params(data.get("history")),
                     last.get("numbers"))
    last_no = _attempt_no(data)
    text = f"[FIRING] {title} on {info.host} ({info.model}) after {attempts} attempt(s)"
    text += f" (last {last_no})" if last_no != "?" else ""
    text += f": {reason}"
    if evidence:
        text += f". Last evidence: {evidence[-1]}"
    blocks = [
        _header(f"{_EMOJI[Kind.GAVE_UP]} [FIRING] {title}"),
        _facts(info, params, last_no, ("Attempts", str(attempts))),
        _section(f"*Reason*\n{_esc(reason)}"),
    ]
    if ledger:
        blocks.append(_section("*Attempts*\n" + "\n".join(f"• {_esc(x)}" for x in ledger)))
    if evidence:
        what = f"{last.get('outcome', '?')} in {last.get('phase', '?')}"
        if "attempt" in last:
            what = f"attempt #{last['attempt']}: {what}"
        blocks.append(_section(f"*Evidence* ({_esc(what)})\n{_code(evidence)}"))
    if advice:
        # A fix SGLang's error prescribes ends the advice as a config snippet: a code block.
        advice, _, snippet = advice.partition(_CONFIG_CHANGE)
        blocks.append(_section(f"*Advice*\n{_esc(advice)}"))
        if snippet:
            code = _esc(snippet).replace("```", "'''")
            blocks.append(_section(f"*Config change*\n```{code}```"))
    return _message(server, Kind.GAVE_UP, text, blocks, origin, data.get("attempt"))


_CONFIG_CHANGE = " Config change:\n"  # sglang.classify puts a prescribed fix's TOML after it


def unhealthy_message(
    server: str,
    info: ServerInfo,
    data: Mapping[str, Any],
    *,
    params: Mapping[str, Any] | None = None,
    resolved: Mapping[str, Any] | None = None,
    attempt: int | None = None,
    origin: Origin = _NOWHERE,
) -> Message:
    """``[FIRING] <server> is unhealthy``: failed /health probes after ready. ``params``,
    ``resolved`` and ``attempt`` are those of the server's last ready (None: unknown)."""
    title = alert_title(server, Kind.UNHEALTHY)
    count = data.get("consecutive_failures", "?")
    detail = str(data.get("detail") or "")
    what = f"{count} failed health probes in a row" + (f" (last: {detail})" if detail else "")
    text = f"[FIRING] {title} on {info.host} ({info.model}): {what}"
    number = _attempt_no({"attempt": attempt})
    blocks = [
        _header(f"{_EMOJI[Kind.UNHEALTHY]} [FIRING] {title}"),
        _facts(info, _params(params, resolved), number),
        _section(_esc(what)),
    ]
    return _message(server, Kind.UNHEALTHY, text, blocks, origin, attempt)


def restart_message(
    server: str,
    info: ServerInfo,
    data: Mapping[str, Any],
    *,
    last_failure: Mapping[str, Any] | None = None,
    resolved: Mapping[str, Any] | None = None,
    origin: Origin = _NOWHERE,
) -> Message:
    """``[FIRING] <server> relaunched after ready``: the server failed after ready and is
    relaunched with the last good params; ``last_failure`` (its ``attempt.failed`` data) says
    why, with the decisive log line; the event's ``restarts_left`` what the budget allows."""
    title = alert_title(server, Kind.RESTART)
    params = _params(data.get("params"), resolved)
    delay = _duration(data.get("delay_s"))
    failed = data.get("attempt", (last_failure or {}).get("attempt"))
    budget = _budget(data)
    why = ""
    error = ""
    if last_failure:
        why = f"{last_failure.get('outcome', '?')} in {last_failure.get('phase', '?')}"
        lines = _evidence(last_failure)
        error = lines[-1] if lines else ""
    text = f"[FIRING] {title} on {info.host} ({info.model})"
    text += f" after {why}" if why else ""
    text += f": relaunching in {delay} with {params}"
    text += f"; {budget}" if budget != "?" else ""
    if error:
        text += f". Error: {error}"
    blocks = [
        _header(f"{_EMOJI[Kind.RESTART]} [FIRING] {title}"),
        _facts(info, params, _attempt_no({"attempt": failed}), ("Relaunch in", delay),
               ("Restart budget", budget)),
    ]
    if why:
        blocks.append(_section(f"*Failure*\n{_esc(why)}"))
    if error:
        blocks.append(_section(f"*Error*\n{_code([error])}"))
    return _message(server, Kind.RESTART, text, blocks, origin, failed)


def reminder(message: Message, firing_s: float) -> Message:
    """``message`` (an alert's last firing message) again, as a reminder: same title, a note
    saying how long it has fired."""
    note = f"Reminder: still firing after {_duration(firing_s)}."
    blocks = [dict(b) for b in message.blocks]
    if blocks and blocks[0].get("type") == "header":
        header = dict(blocks[0]["text"])
        header["text"] = _clip(f":bell: {header['text']}", _HEADER_MAX)
        blocks[0] = {**blocks[0], "text": header}
    return replace(message, blocks=blocks).with_note(note)


def _budget(data: Mapping[str, Any]) -> str:
    left, budget, window = (data.get("restarts_left"), data.get("restart_budget"),
                            data.get("restart_window_s"))
    if not isinstance(left, int) or not isinstance(budget, int):
        return "?"
    per = f" per {_duration(window)}" if _duration(window) != "?" else ""
    return f"{left} of {budget} restarts{per} left"


def _message(server: str, kind: Kind, text: str, blocks: list[dict[str, Any]], origin: Origin,
             attempt: Any, *, alert: Kind | None = None) -> Message:
    """The message with the logs line (when the attempt is known) and who sent it."""
    if isinstance(attempt, int) and not isinstance(attempt, bool):
        command = shlex.join(["launcher", "logs", origin.config, server, "--attempt",
                              str(attempt)])
        blocks.append(_section(f"*Logs*\n{_code([command])}"))
    blocks.append(_context(f"sent by launcher on {_esc(origin.box)} · "
                           f"config `{_esc(origin.config)}`"))
    return Message(server, kind, _esc(_clip(text, _TEXT_MAX)), blocks, alert)


def _facts(info: ServerInfo, params: str, attempt: str, *more: tuple[str, str]
           ) -> dict[str, Any]:
    """The fields every message shows (server facts, params, attempt), then ``more``."""
    pairs = [
        ("Host", info.host),
        ("Endpoint", info.endpoint),
        ("GPUs", info.gpus),
        ("Model", info.model),
        ("SGLang", info.sglang_version),
        ("Attempt", attempt),
        ("Params", f"`{params}`"),
        *more,
    ]
    return _fields(*pairs)


def _evidence(failure: Mapping[str, Any]) -> list[str]:
    """A failure's evidence lines, clipped, each once (TP ranks print the same error)."""
    lines = []
    for line in failure.get("evidence") or []:
        clipped = _clip(str(line).strip(), _EVIDENCE_LINE_MAX)
        if clipped and clipped not in lines:
            lines.append(clipped)
    return lines


def _unquoted(reason: str, evidence: Sequence[str]) -> str:
    """``reason`` without its trailing ``(log: LINE)`` quote when LINE is among ``evidence``."""
    head, sep, quoted = reason.rpartition(" (log: ")
    if not sep or not quoted.endswith(")"):
        return reason
    line = quoted[:-1].removesuffix("...")
    return head if any(e.startswith(line) for e in evidence) else reason


def _last_params(history: Any) -> Any:
    if isinstance(history, Sequence) and history and isinstance(history[-1], Mapping):
        return history[-1].get("params")
    return None


def _params(value: Any, resolved: Any = None) -> str:
    """``value`` (event params) described; a param left to SGLang (None) shows the value
    ``resolved`` (what SGLang printed: ``resolved`` or ``numbers`` data) marked "(auto)"."""
    if not isinstance(value, Mapping):
        return "unknown params"
    mfs, bs = value.get("mem_fraction_static"), value.get("cuda_graph_max_bs")
    try:
        params = LaunchParams.from_extras(
            None if mfs is None else float(mfs), None if bs is None else int(bs), dict(value)
        )
    except (TypeError, ValueError):
        return f"mem_fraction_static={mfs} cuda_graph_max_bs={bs}"
    auto = []
    if isinstance(resolved, Mapping):
        r_mfs, r_bs = resolved.get("mem_fraction_static"), resolved.get("cuda_graph_max_bs")
        if params.mem_fraction_static is None and _number(r_mfs):
            params = replace(params, mem_fraction_static=float(r_mfs))
            auto.append("mem_fraction_static")
        if params.cuda_graph_max_bs is None and _number(r_bs):
            params = replace(params, cuda_graph_max_bs=int(r_bs))
            auto.append("cuda_graph_max_bs")
    text = params.describe()
    for name in auto:
        text = re.sub(rf"\b{name}=(\S+)", rf"{name}=\1 (auto)", text, count=1)
    return text


def _number(value: Any) -> TypeGuard[int | float]:
    return (isinstance(value, int | float) and not isinstance(value, bool)
            and math.isfinite(value))


def _duration(value: Any) -> str:
    if not _number(value):
        return "?"
    seconds = max(0.0, float(value))
    # Whole seconds read better ("7m12s" rather than "7m12.38s"); sub-second stays in ms.
    return format_duration(float(round(seconds)) if seconds >= 1 else seconds)


def _ledger(history: Any, failures: Sequence[Mapping[str, Any]]) -> list[str]:
    """One line per failed attempt of ``history``, numbered when ``failures`` lines up, with
    "auto" params filled from what that attempt's log showed (its failure's numbers)."""
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
    seen = {f.get("attempt"): f.get("numbers") for f in failures if f.get("attempt") is not None}
    lines = []
    for number, entry in zip(numbers, entries, strict=True):
        prefix = f"#{number} " if number is not None else ""
        resolved = seen.get(number) if number is not None else None
        lines.append(
            f"{prefix}{_params(entry.get('params'), resolved)} → {entry.get('outcome', '?')}"
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


def _code(lines: Sequence[str]) -> str:
    """``lines`` as one code block (escaped; a ``` inside cannot end it early)."""
    return "```" + "\n".join(_esc(line).replace("```", "'''") for line in lines) + "```"


# Blocks are built as plain dicts (cheap: the hook runs in the supervisor's task) and clipped
# to fit here; slack_sdk's models check them against Slack's limits in the worker
# (``checked_blocks``), where a violation cannot cost the supervisor anything.


def _header(title: str) -> dict[str, Any]:
    return {
        "type": "header",
        "text": {"type": "plain_text", "text": _clip(title, _HEADER_MAX), "emoji": True},
    }


def _section(mrkdwn: str) -> dict[str, Any]:
    return {"type": "section", "text": {"type": "mrkdwn", "text": _clip(mrkdwn, _SECTION_MAX)}}


def _context(mrkdwn: str) -> dict[str, Any]:
    return {"type": "context",
            "elements": [{"type": "mrkdwn", "text": _clip(mrkdwn, _SECTION_MAX)}]}


def _fields(*pairs: tuple[str, str]) -> dict[str, Any]:
    return {
        "type": "section",
        "fields": [
            {"type": "mrkdwn", "text": _clip(f"*{name}*\n{_esc(value)}", _FIELD_MAX)}
            for name, value in pairs
        ],
    }


def checked_blocks(blocks: Sequence[Mapping[str, Any]]) -> list[dict[str, Any]]:
    """``blocks`` as slack_sdk's Block Kit models render them, after their checks of Slack's
    limits (header ≤ 150 characters, section text ≤ 3000, ≤ 10 fields, known block types).

    Raises ValueError naming the first block that fails (Slack would reject the message).
    """
    # Imported here: the slack_sdk package imports its whole Web API client (a third of a
    # second), which no command but a posting `launcher up` needs.
    from slack_sdk.errors import SlackObjectFormationError
    from slack_sdk.models.blocks import Block

    out = []
    for i, block in enumerate(blocks):
        model = Block.parse(dict(block))
        if model is None:
            raise ValueError(f"block {i}: unknown block type {block.get('type')!r}")
        try:
            out.append(model.to_dict())
        except SlackObjectFormationError as exc:
            raise ValueError(f"block {i} ({block.get('type')}): {exc}") from None
    return out


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
    """Where the notifier keeps its memory across restarts (``launcher.store.Ledger``)."""

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
        self._failures: dict[str, list[dict[str, Any]]] = {}
        self._ready: dict[str, dict[str, Any]] = {}  # the last server.ready data per server
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
        # The messages are built from (and remembered as) the events' plain data.
        data = event.to_dict()
        if isinstance(event, events.RouterReady):  # ``server`` is the router's name
            return [router_ready_message(server, data, origin=self.origin)]
        info = self.servers_info.get(server, _UNKNOWN)
        failures = self._failures.setdefault(server, [])
        origin = self.origin
        ready = self._ready.get(server, {})
        match event:
            case events.AttemptFailed():
                failures.append(data)
                del failures[:-_FAILURES_KEPT]
                return []
            case events.ServerAdopted():
                return [adopted_message(server, info, data, origin=origin)] if (
                    self.announce_adoption) else []
            case events.ServerReady():
                self._ready[server] = data
                resolved = self._resolve(server, info, data)
                if resolved is not None:
                    return resolved
                if event.adopted:
                    return []  # found running by a restarted launcher: not a fresh "ready"
                return [ready_message(server, info, data, failures=failures, origin=origin)]
            case events.ServerGaveUp():
                return [gave_up_message(server, info, data, failures=failures, origin=origin)]
            case events.ServerUnhealthy():
                attempt = ready.get("attempt")
                return [unhealthy_message(
                    server, info, data, params=ready.get("params"),
                    resolved=ready.get("resolved"),
                    attempt=attempt if isinstance(attempt, int) else None, origin=origin)]
            case events.RestartScheduled():
                last = failures[-1] if failures else None
                return [restart_message(server, info, data, last_failure=last,
                                        resolved=ready.get("resolved"), origin=origin)]
        return []

    def _resolve(self, server: str, info: ServerInfo, data: Mapping[str, Any]
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
                out.append(resolved_message(server, kind, info, data, firing_s=firing_s,
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
        """Keep ``state`` here and in the store (a store failure is logged, not raised)."""
        self._memory[(state.server, Kind(state.kind))] = state
        if self._store is None:
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
        """Post ``message`` with retries inside ``max_tries`` and ``max_total_s``."""
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
