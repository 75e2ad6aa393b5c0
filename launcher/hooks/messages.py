"""The Slack messages for the person on call, built from typed events: ready, resolved,
gave up, unhealthy, relaunched, adopted, reminders, router ready. Pure: each ``*_message``
function returns a ``Message`` (the notification text and Block Kit blocks, clipped to
Slack's limits) and nothing here touches the network, the clock or the store.

``notify.SlackNotifier`` decides which messages to send and when, and delivers them;
``notify`` re-exports every name here that it exported before.
"""

from __future__ import annotations

import enum
import math
import re
import shlex
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, replace
from typing import Any, TypeGuard

from launcher.durations import format_duration
from launcher.hooks.identity import ServerFacts
from launcher.params import LaunchParams
from launcher.supervise import events
from launcher.untrusted import slack_escape

_EVIDENCE_LINE_MAX = 300
_LEDGER_MAX = 15
_TRACEBACK_LINES = 12  # of an internal error's traceback in its message
# Slack's limits (slack_sdk's HeaderBlock / SectionBlock check them: ``checked_blocks``);
# clipped to fit, with room.
_SECTION_MAX = 2900
_HEADER_MAX = 150
_FIELD_MAX = 1900  # a field's text: Slack allows 2000
_TEXT_MAX = 3000  # the notification text; Slack truncates far later, people read far less


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
    INTERNAL_ERROR = "internal_error"
    TAKEOVER = "takeover"


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
        block = _context(slack_escape(note))
        blocks = [*self.blocks[:-1], block, *self.blocks[-1:]] if self.blocks else [block]
        return replace(self, text=f"{self.text} {slack_escape(note)}", blocks=blocks)


_NOWHERE = Origin()


def ready_message(
    server: str,
    info: ServerInfo,
    event: events.ServerReady,
    *,
    failures: Sequence[events.AttemptFailed] = (),
    origin: Origin = _NOWHERE,
) -> Message:
    """The message for ``server.ready`` with nothing firing.

    ``failures`` are the server's ``attempt.failed`` events in order, used to fill the "auto"
    params of each failed attempt in the history with what SGLang printed.
    """
    params = _params(event.params, event.resolved)
    attempt = _attempt_no(event.attempt)
    seconds = _duration(event.seconds)
    ledger = _ledger(event.history, failures)
    text = f"{server} is ready on {info.host} ({info.model}) with {params}, attempt {attempt}, "
    text += f"{seconds} to ready"
    if ledger:
        text += f". Failed attempts: {'; '.join(ledger)}"
    blocks = [
        _header(f":white_check_mark: {server} is ready"),
        _facts(info, params, attempt, ("Time to ready", seconds)),
    ]
    if ledger:
        blocks.append(_section(
            "*Failed attempts*\n" + "\n".join(f"• {slack_escape(x)}" for x in ledger)))
    return _message(server, Kind.READY, text, blocks, origin, event.attempt)


def resolved_message(
    server: str,
    alert: Kind,
    info: ServerInfo,
    event: events.ServerReady,
    *,
    firing_s: float | None,
    origin: Origin = _NOWHERE,
) -> Message:
    """``[RESOLVED] <title>``: the alert ``alert`` of ``server`` ends, as ``server.ready``
    (``event``) came; ``firing_s`` how long it fired (None: unknown)."""
    title = alert_title(server, alert)
    params = _params(event.params, event.resolved)
    attempt = _attempt_no(event.attempt)
    seconds = _duration(event.seconds)
    fired = _duration(firing_s)
    text = (f"[RESOLVED] {title}: ready again on {info.host} ({info.model}) with {params}, "
            f"attempt {attempt}")
    text += f", {seconds} to ready" if seconds != "?" else ""
    text += f"; fired for {fired}" if fired != "?" else ""
    blocks = [
        _header(f":large_green_circle: [RESOLVED] {title}"),
        _facts(info, params, attempt, ("Time to ready", seconds), ("Fired for", fired)),
    ]
    return _message(server, Kind.RESOLVED, text, blocks, origin, event.attempt, alert=alert)


def _attempt_no(number: int | None) -> str:
    """"#N": the host's attempt number, as in the run directory, the ledger and status."""
    return "?" if number is None else f"#{number}"


def router_ready_message(router: str, event: events.RouterReady, *,
                         origin: Origin = _NOWHERE) -> Message:
    """The message for ``router.ready`` (``[[routers]]``): it names the router, where it
    listens and the servers behind it (registered as each one is ready)."""
    where = f"{event.host}:{event.port}"
    behind = ", ".join(event.servers)
    seconds = _duration(event.seconds)
    attempt = _attempt_no(event.attempt)
    text = (f"router {router} is ready on {where} (attempt {attempt}, {seconds} to ready); "
            f"its workers: {behind}, each registered once ready")
    blocks = [
        _header(f":white_check_mark: router {router} is ready"),
        _fields(("Listens on", where), ("Workers", behind), ("Attempt", attempt),
                ("Time to ready", seconds)),
    ]
    # No logs line: `launcher logs` reads servers' attempts, not the router's.
    return _message(router, Kind.READY, text, blocks, origin, None)


def takeover_message(event: events.LeaseAcquired, *, origin: Origin = _NOWHERE) -> Message:
    """The message for ``lease.acquired`` after another box held the lease: this box is the
    active launcher now and adopts every running server (docs/ha.md)."""
    before = event.previous_box or "?"
    text = (f"launcher on {event.box} took over from {before} (lease token {event.token}, "
            f"after {_duration(event.waited_s)} standing by): it adopts the running servers "
            "and relaunches the dead ones")
    blocks = [
        _header(f":twisted_rightwards_arrows: launcher took over on {event.box}"),
        _fields(("Active now", event.box), ("Was active", before),
                ("Lease token", str(event.token)), ("Stood by", _duration(event.waited_s))),
    ]
    return _message("", Kind.TAKEOVER, text, blocks, origin, None)


def adopted_message(
    server: str, info: ServerInfo, event: events.ServerAdopted, *, origin: Origin = _NOWHERE
) -> Message:
    """The message for ``server.adopted`` (only sent when ``announce_adoption``): a restarted
    launcher found the server running and supervises it again; nothing was relaunched."""
    params = _params(event.params)
    attempt = _attempt_no(event.attempt)
    text = (f"{server} adopted on {info.host} ({info.model}): attempt {attempt} "
            f"(pid {event.pid}) is still running with {params}; supervising it again, "
            "nothing relaunched")
    blocks = [_header(f":link: {server} adopted"), _facts(info, params, attempt)]
    return _message(server, Kind.ADOPTED, text, blocks, origin, event.attempt)


def internal_error_message(
    server: str, info: ServerInfo,
    event: events.ServerInternalError | events.RouterInternalError, *,
    origin: Origin = _NOWHERE,
) -> Message:
    """The message for ``server.internal_error`` (and ``router.internal_error``: ``server``
    is the router's name): supervising ``server`` failed with an exception launcher did not
    expect (a bug). Its supervision ended, given up; every other server's goes on. The
    server itself may still run on its host, unsupervised."""
    lines = event.traceback.splitlines()[-_TRACEBACK_LINES:]
    text = (f"[FIRING] {server} on {info.host} ({info.model}): launcher's supervision of it "
            f"failed with an internal error and ended: {event.error}. Other servers are still "
            "supervised; the server may still run unsupervised: restart launcher (or the "
            "service) to supervise it again, and report the error")
    blocks = [
        _header(f":boom: [FIRING] {server}: launcher internal error"),
        _facts(info, "?", _attempt_no(event.attempt)),
        _section(f"*Error*\n{slack_escape(event.error)}\n\nSupervision of this server ended (given "
                 "up); the others go on. The server may still run on its host, unsupervised: "
                 "restart launcher to supervise it again, and report the error."),
    ]
    if lines:
        blocks.append(_section(f"*Traceback* (end)\n{_code(lines)}"))
    return _message(server, Kind.INTERNAL_ERROR, text, blocks, origin, event.attempt)


def gave_up_message(
    server: str,
    info: ServerInfo,
    event: events.ServerGaveUp,
    *,
    failures: Sequence[events.AttemptFailed] = (),
    origin: Origin = _NOWHERE,
) -> Message:
    """``[FIRING] <server> gave up``: reason, ledger, and the last failure's evidence lines and
    advice (from ``failures[-1]``, the server's last ``attempt.failed``)."""
    title = alert_title(server, Kind.GAVE_UP)
    ledger = _ledger(event.history, failures)
    last = failures[-1] if failures else None
    evidence = _evidence(last)
    reason = event.reason or "unknown reason"
    if evidence:
        # The reason quotes the decisive line ("… (log: LINE)"); the evidence shows it already.
        reason = _unquoted(reason, evidence)
    advice = last.advice if last is not None else ""
    if advice and advice in reason:
        advice = ""  # the reason already says it (a fatal verdict's reason is its advice)
    # The params of the last attempt in the history, "auto" filled from its failure's numbers.
    params = _params(event.history[-1].params if event.history else None,
                     last.numbers if last is not None else None)
    text = f"[FIRING] {title} on {info.host} ({info.model})"
    if event.attempts:
        last_no = _attempt_no(event.attempt)
        text += f" after {event.attempts} attempt(s) (last {last_no})"
    else:  # in preflight: ``attempt`` is an earlier run's, not one this give-up launched
        last_no = "none (gave up before launching)"
        text += " before launching"
    text += f": {reason}"
    if evidence:
        text += f". Last evidence: {evidence[-1]}"
    blocks = [
        _header(f"{_EMOJI[Kind.GAVE_UP]} [FIRING] {title}"),
        _facts(info, params, last_no, ("Attempts", str(event.attempts))),
        _section(f"*Reason*\n{slack_escape(reason)}"),
    ]
    if ledger:
        blocks.append(_section("*Attempts*\n" + "\n".join(f"• {slack_escape(x)}" for x in ledger)))
    if evidence and last is not None:
        what = f"attempt #{last.attempt}: {last.outcome.value} in {last.phase.value}"
        blocks.append(_section(f"*Evidence* ({slack_escape(what)})\n{_code(evidence)}"))
    if advice:
        # A fix SGLang's error prescribes ends the advice as a config snippet: a code block.
        advice, _, snippet = advice.partition(_CONFIG_CHANGE)
        blocks.append(_section(f"*Advice*\n{slack_escape(advice)}"))
        if snippet:
            code = slack_escape(snippet).replace("```", "'''")
            blocks.append(_section(f"*Config change*\n```{code}```"))
    return _message(server, Kind.GAVE_UP, text, blocks, origin,
                    event.attempt if event.attempts else None)  # no log of its own: none


_CONFIG_CHANGE = " Config change:\n"  # sglang.classify puts a prescribed fix's TOML after it


def unhealthy_message(
    server: str,
    info: ServerInfo,
    event: events.ServerUnhealthy,
    *,
    ready: events.ServerReady | None = None,
    origin: Origin = _NOWHERE,
) -> Message:
    """``[FIRING] <server> is unhealthy``: failed /health probes after ready. ``ready`` is the
    server's last ``server.ready`` (what was serving: params, resolved, attempt; None:
    unknown)."""
    title = alert_title(server, Kind.UNHEALTHY)
    detail = event.detail
    what = (f"{event.consecutive_failures} failed health probes in a row"
            + (f" (last: {detail})" if detail else ""))
    text = f"[FIRING] {title} on {info.host} ({info.model}): {what}"
    attempt = ready.attempt if ready is not None else None
    params = _params(ready.params, ready.resolved) if ready is not None else _params(None)
    blocks = [
        _header(f"{_EMOJI[Kind.UNHEALTHY]} [FIRING] {title}"),
        _facts(info, params, _attempt_no(attempt)),
        _section(slack_escape(what)),
    ]
    return _message(server, Kind.UNHEALTHY, text, blocks, origin, attempt)


_NODE = re.compile(r"(node \d+ \([^)]*\)): ")


def restart_message(
    server: str,
    info: ServerInfo,
    event: events.RestartScheduled,
    *,
    last_failure: events.AttemptFailed | None = None,
    ready: events.ServerReady | None = None,
    origin: Origin = _NOWHERE,
) -> Message:
    """``[FIRING] <server> relaunched after ready``: the server failed after ready and is
    relaunched with the last good params; ``last_failure`` (its ``attempt.failed``) says why,
    with the decisive log line; the event's ``restarts_left`` what the budget allows. ``ready``
    (the server's last ``server.ready``) gives the values SGLang resolved for "auto" params."""
    title = alert_title(server, Kind.RESTART)
    params = _params(event.params, ready.resolved if ready is not None else None)
    delay = _duration(event.delay_s)
    budget = _budget(event)
    why = ""
    error = ""
    if last_failure is not None:
        why = f"{last_failure.outcome.value} in {last_failure.phase.value}"
        # A multi-node server's cause names its node ("node 1 (gpu-b): ..."): the host to
        # look at, where info.host is node 0's.
        node = _NODE.match(last_failure.advice)
        why += f" on {node[1]}" if node else ""
        lines = _evidence(last_failure)
        error = lines[-1] if lines else ""
    text = f"[FIRING] {title} on {info.host} ({info.model})"
    text += f" after {why}" if why else ""
    text += f": relaunching in {delay} with {params}"
    text += f"; {budget}"
    if error:
        text += f". Error: {error}"
    blocks = [
        _header(f"{_EMOJI[Kind.RESTART]} [FIRING] {title}"),
        _facts(info, params, _attempt_no(event.attempt), ("Relaunch in", delay),
               ("Restart budget", budget)),
    ]
    if why:
        blocks.append(_section(f"*Failure*\n{slack_escape(why)}"))
    if error:
        blocks.append(_section(f"*Error*\n{_code([error])}"))
    return _message(server, Kind.RESTART, text, blocks, origin, event.attempt)


def reminder(message: Message, firing_s: float) -> Message:
    """``message`` (an alert's last firing message) again, as a reminder: same title, a note
    saying how long it has fired."""
    note = f"Reminder: still firing after {_duration(firing_s)}."
    blocks = [dict(b) for b in message.blocks]
    if blocks and blocks[0].get("type") == "header":
        header = dict(blocks[0]["text"])
        header["text"] = clip(f":bell: {header['text']}", _HEADER_MAX)
        blocks[0] = {**blocks[0], "text": header}
    return replace(message, blocks=blocks).with_note(note)


def _budget(event: events.RestartScheduled) -> str:
    window = _duration(event.restart_window_s)
    per = f" per {window}" if window != "?" else ""
    return f"{event.restarts_left} of {event.restart_budget} restarts{per} left"


def _message(server: str, kind: Kind, text: str, blocks: list[dict[str, Any]], origin: Origin,
             attempt: int | None, *, alert: Kind | None = None) -> Message:
    """The message with the logs line (when the attempt is known) and who sent it."""
    if attempt is not None:
        command = shlex.join(["launcher", "logs", origin.config, server, "--attempt",
                              str(attempt)])
        blocks.append(_section(f"*Logs*\n{_code([command])}"))
    blocks.append(_context(f"sent by launcher on {slack_escape(origin.box)} · "
                           f"config `{slack_escape(origin.config)}`"))
    return Message(server, kind, slack_escape(clip(text, _TEXT_MAX)), blocks, alert)


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


def _evidence(failure: events.AttemptFailed | None) -> list[str]:
    """A failure's evidence lines, clipped, each once (TP ranks print the same error)."""
    lines: list[str] = []
    for line in failure.evidence if failure is not None else ():
        clipped = clip(str(line).strip(), _EVIDENCE_LINE_MAX)
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


def _params(value: LaunchParams | None,
            resolved: LaunchParams | Mapping[str, Any] | None = None) -> str:
    """``value`` (event params) described; a param left to SGLang (None) shows the value
    ``resolved`` holds (what SGLang printed: a ready's ``resolved``, or a failure's
    ``numbers``) marked "(auto)"."""
    if value is None:
        return "unknown params"
    if isinstance(resolved, LaunchParams):
        r_mfs: Any = resolved.mem_fraction_static
        r_bs: Any = resolved.cuda_graph_max_bs
    elif resolved is not None:
        r_mfs, r_bs = resolved.get("mem_fraction_static"), resolved.get("cuda_graph_max_bs")
    else:
        r_mfs = r_bs = None
    params = value
    auto = []
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


def _ledger(history: Sequence[events.HistoryEntry],
            failures: Sequence[events.AttemptFailed]) -> list[str]:
    """One line per failed attempt of ``history``, numbered as the host numbers attempts,
    with "auto" params filled from what that attempt's log showed (its failure's numbers)."""
    seen = {f.attempt: f.numbers for f in failures}
    lines = [
        f"#{entry.attempt} {_params(entry.params, seen.get(entry.attempt))} → "
        f"{entry.outcome.value} in {entry.phase.value}"
        for entry in history
    ]
    if len(lines) > _LEDGER_MAX:
        earlier = len(lines) - _LEDGER_MAX
        lines = [f"… {earlier} earlier attempt(s)", *lines[-_LEDGER_MAX:]]
    return lines


def clip(text: str, limit: int) -> str:
    """``text`` when it has at most ``limit`` characters, else its first ``limit - 1`` and
    an ellipsis: never longer than ``limit`` (Slack refuses a block over its limit)."""
    return text if len(text) <= limit else text[: limit - 1] + "…"


def _code(lines: Sequence[str]) -> str:
    """``lines`` as one code block (escaped; a ``` inside cannot end it early)."""
    return "```" + "\n".join(slack_escape(line).replace("```", "'''") for line in lines) + "```"


# Blocks are built as plain dicts (cheap: the hook runs in the supervisor's task) and clipped
# to fit here; slack_sdk's models check them against Slack's limits in the worker
# (``checked_blocks``), where a violation cannot cost the supervisor anything.


def _header(title: str) -> dict[str, Any]:
    return {
        "type": "header",
        "text": {"type": "plain_text", "text": clip(title, _HEADER_MAX), "emoji": True},
    }


def _section(mrkdwn: str) -> dict[str, Any]:
    return {"type": "section", "text": {"type": "mrkdwn", "text": clip(mrkdwn, _SECTION_MAX)}}


def _context(mrkdwn: str) -> dict[str, Any]:
    return {"type": "context",
            "elements": [{"type": "mrkdwn", "text": clip(mrkdwn, _SECTION_MAX)}]}


def _fields(*pairs: tuple[str, str]) -> dict[str, Any]:
    return {
        "type": "section",
        "fields": [
            {"type": "mrkdwn", "text": clip(f"*{name}*\n{slack_escape(value)}", _FIELD_MAX)}
            for name, value in pairs
        ],
    }


_BOLD_LINE = re.compile(r"^\*([^*\n]+)\*$", re.MULTILINE)


def blocks_text(blocks: Sequence[Mapping[str, Any]]) -> list[str]:
    """``blocks`` as plain lines (``Name: value`` for fields, Slack's escapes and markup
    undone): what a message says beyond its one-line ``text``, for the log when there is no
    webhook (``notify.message``'s ``details``)."""
    lines: list[str] = []

    def plain(mrkdwn: str) -> str:
        # the markup these messages use: *Name* on a line of its own, `params`, ```code```
        # (never a bare "*": a masked secret reads "***")
        text = _BOLD_LINE.sub(r"\1", mrkdwn.replace("```", "").replace("`", ""))
        return text.replace("&lt;", "<").replace("&gt;", ">").replace("&amp;", "&")

    for block in blocks:
        text = block.get("text")
        if isinstance(text, Mapping) and isinstance(text.get("text"), str):
            lines += plain(text["text"]).splitlines()
        for part in [*block.get("fields", ()), *block.get("elements", ())]:
            if isinstance(part, Mapping) and isinstance(part.get("text"), str):
                name, _, value = plain(part["text"]).partition("\n")
                lines.append(f"{name}: {value}" if value else name)
    return [line for line in lines if line.strip()]


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
