"""structlog set-up: JSON lines for machines, a compact console format for people.

Events are stable dotted names with their data in keys (``attempt.failed outcome=...``);
context (server, host) is bound by each supervisor.

Levels: a supervision event is logged at its class's ``level`` (``launcher.supervise.events``):
the one place that says which events a person should look at.

Libraries that log through the standard ``logging`` module (asyncssh, httpx) reach the same
output: their warnings and errors become ``log.record`` events (keys ``logger``, ``message``)
at the record's level, instead of bare lines on stderr without a priority.

journald: when the output stream is the journal's (``$JOURNAL_STREAM`` names its device and
inode, as systemd sets it for ``StandardOutput=journal``), every line starts with the
sd-daemon priority prefix (``<3>`` error, ``<4>`` warning, ``<6>`` info, ``<7>`` debug;
``man sd-daemon``). journald strips it and stores it as the entry's ``PRIORITY``, so
``journalctl -p warning`` shows exactly the warnings and errors.

Terminal safety: the console format shows control characters in string values as ``\\xNN``
(``plaintext.plain``, the CLI's rule): values come from hosts' files and servers' logs, and
``ConsoleRenderer`` prints strings raw, so an ESC there could retitle or clear the terminal.
JSON escapes them itself.
"""

from __future__ import annotations

import logging
import os
import sys
from collections.abc import Mapping
from typing import Literal, TextIO

import structlog
from structlog.typing import EventDict, Processor, WrappedLogger

from launcher.untrusted import plain

__all__ = ["Format", "configure", "on_journal", "syslog_priority"]

Format = Literal["json", "console"]

# sd-daemon(3) / syslog priorities of the stdlib level names structlog passes as method name.
_PRIORITY = {
    "critical": 2,
    "exception": 3,
    "error": 3,
    "warning": 4,
    "warn": 4,
    "info": 6,
    "debug": 7,
}


def syslog_priority(method_name: str) -> int:
    """The syslog priority (0-7) for a structlog method name such as ``warning``; 6 (info)
    for names it does not know."""
    return _PRIORITY.get(method_name.lower(), 6)


def on_journal(stream: TextIO, environ: Mapping[str, str] | None = None) -> bool:
    """True when ``stream`` is connected to journald: ``$JOURNAL_STREAM`` is ``DEVICE:INODE``
    of the stream's file descriptor (systemd.exec(5) says to compare both, as a child process
    may have redirected the stream it inherited)."""
    env = os.environ if environ is None else environ
    device, sep, inode = env.get("JOURNAL_STREAM", "").partition(":")
    if not sep:
        return False
    try:
        st = os.fstat(stream.fileno())
    except (OSError, ValueError, AttributeError):  # no descriptor (StringIO) or closed
        return False
    return f"{st.st_dev}:{st.st_ino}" == f"{device}:{inode}"


class _PriorityPrefix:
    """Wraps the final renderer: its line gets the sd-daemon ``<N>`` prefix of the level."""

    def __init__(self, renderer: Processor) -> None:
        self._renderer = renderer

    def __call__(self, logger: WrappedLogger, method_name: str, event_dict: EventDict) -> str:
        line = self._renderer(logger, method_name, event_dict)
        text = line.decode() if isinstance(line, bytes) else str(line)
        return f"<{syslog_priority(method_name)}>{text}"


def _plain_strings(logger: WrappedLogger, method_name: str, event_dict: EventDict) -> EventDict:
    """Every string value (and string key) with its control characters shown, not sent.
    Other values are rendered with ``repr``, which escapes them already."""
    return {plain(k) if isinstance(k, str) else k: plain(v) if isinstance(v, str) else v
            for k, v in event_dict.items()}


class _Drop:
    """Drops the events whose name is in ``names``."""

    def __init__(self, names: frozenset[str]) -> None:
        self._names = names

    def __call__(self, logger: WrappedLogger, method_name: str, event_dict: EventDict) -> EventDict:
        if event_dict.get("event") in self._names:
            raise structlog.DropEvent
        return event_dict


class _ToStructlog(logging.Handler):
    """Forwards stdlib ``logging`` records to structlog as ``log.record`` at their level."""

    def emit(self, record: logging.LogRecord) -> None:
        try:
            structlog.get_logger(record.name).log(
                record.levelno, "log.record", logger=record.name, message=record.getMessage()
            )
        except Exception:
            self.handleError(record)


def _bridge_stdlib_logging(level: int) -> None:
    """Route stdlib records of ``level`` and above through structlog (one handler, however
    often ``configure`` runs)."""
    root = logging.getLogger()
    for handler in list(root.handlers):
        if isinstance(handler, _ToStructlog):
            root.removeHandler(handler)
    root.addHandler(_ToStructlog(level))


def configure(
    fmt: Format,
    stream: TextIO | None = None,
    level: int = logging.INFO,
    environ: Mapping[str, str] | None = None,
    drop: frozenset[str] = frozenset(),
) -> None:
    """Route every launcher event to ``stream`` (default stderr) in ``fmt``; with the
    sd-daemon priority prefix on each line when ``stream`` is journald's (``on_journal``).
    Events named in ``drop`` are not written (a command that reports their outcome itself)."""
    out = stream or sys.stderr
    renderer: Processor
    escape: list[Processor] = []
    if fmt == "json":
        renderer = structlog.processors.JSONRenderer(sort_keys=False)
    else:
        renderer = structlog.dev.ConsoleRenderer(colors=out.isatty(), pad_event_to=18)
        escape = [_plain_strings]
    if on_journal(out, environ):
        renderer = _PriorityPrefix(renderer)
    dropping: list[Processor] = [_Drop(drop)] if drop else []
    structlog.configure(
        processors=[
            *dropping,
            structlog.contextvars.merge_contextvars,
            structlog.processors.add_log_level,
            structlog.processors.TimeStamper(fmt="iso", utc=True),
            *escape,
            renderer,
        ],
        wrapper_class=structlog.make_filtering_bound_logger(level),
        logger_factory=structlog.PrintLoggerFactory(out),
        cache_logger_on_first_use=False,
    )
    # Only warnings and errors of libraries: their info is noise next to launcher's events.
    _bridge_stdlib_logging(max(level, logging.WARNING))
