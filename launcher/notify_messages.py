"""The Slack messages for the person on call, built from an event's data: ready, resolved,
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
from launcher.facts import ServerFacts
from launcher.params import LaunchParams

_EVIDENCE_LINE_MAX = 300
_LEDGER_MAX = 15
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
