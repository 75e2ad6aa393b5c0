"""Text launcher does not control, and secrets it must not show: bounded numbers, terminal-safe
and Slack-safe text, redaction.

Server logs, ``/health`` answers, attempt files on a host (``exit_status``, ``pid``,
``started_at``), the follow agent's frames, a model's ``config.json`` and the host's SGLang
version string can all say anything.

Numbers: Python's ``int()`` refuses more than 4300 digits with a ValueError, accepts non-ASCII
digits, signs, underscores and spaces; ``float()`` turns a long number into ``inf``. Every number
read from such text goes through one of these helpers, which return None (never raise) for
anything out of bounds, so that one bad line or file is "no figure", not a crash of the
supervision of every server (docs/security.md, findings H1, M1, M2, M3, L3).

Text: ``plain`` shows control characters instead of sending them, so that both the CLI's rich
output and the console log format apply the same rule; ``slack_escape`` escapes the characters
Slack's formatting reserves.

Secrets: ``Redactor`` masks the configured secret values in any text or record launcher shows
(the supervisor's events and log lines, Slack messages), cut pieces at a text's edges too.

A leaf module: no launcher imports.
"""


from __future__ import annotations

import enum
import math
import re
from collections.abc import Collection, Mapping
from dataclasses import fields, is_dataclass, replace
from datetime import UTC, datetime
from typing import Any, TypeVar

__all__ = [
    "MASK",
    "MAX_DIGITS",
    "MAX_FLOAT_CHARS",
    "MIN_EDGE_LEN",
    "MIN_SECRET_LEN",
    "Redactor",
    "bounded_float",
    "bounded_int",
    "finite_number",
    "parse_stamp",
    "plain",
    "slack_escape",
]

MAX_DIGITS = 18  # < 2**63: fits every counter, pid, byte count and exit status
MAX_FLOAT_CHARS = 32  # "123456.789" with room; log figures are a few digits each side
_DIGITS = frozenset("0123456789")
# started_at must fall in these years; outside, datetime arithmetic and fromtimestamp fail
# (year 0/10000) or the figure is nonsense anyway.
_MIN_YEAR, _MAX_YEAR = 2000, 2100

MASK = "***"
# Shorter values would mask ordinary words in every message and protect nothing.
MIN_SECRET_LEN = 4
# A cut secret's piece this long or longer at a text's edge is masked (shorter ones are too
# likely to be ordinary text, and too short to guess the rest from).
MIN_EDGE_LEN = 8

_T = TypeVar("_T")


def _ascii_digits(text: str) -> bool:
    return bool(text) and all(c in _DIGITS for c in text)


def bounded_int(
    text: str | bytes | None, *, max_digits: int = MAX_DIGITS, signed: bool = False
) -> int | None:
    """``text`` as an int when it is 1..``max_digits`` ASCII digits (after an optional ``-``
    when ``signed``), else None. No whitespace, ``+``, ``_`` or non-ASCII digits ("²", "٣")."""
    if text is None:
        return None
    if isinstance(text, bytes):
        try:
            text = text.decode("ascii")
        except UnicodeDecodeError:
            return None
    sign = 1
    if signed and text.startswith("-"):
        sign, text = -1, text[1:]
    if len(text) > max_digits or not _ascii_digits(text):
        return None
    return sign * int(text)


def bounded_float(
    text: str | None, *, max_chars: int = MAX_FLOAT_CHARS, limit: float = 2.0**53
) -> float | None:
    """``text`` as a float when it reads ``digits[.digits]`` (ASCII, at most ``max_chars``
    characters) and its value is at most ``limit``; else None. Never ``inf`` or ``nan``."""
    if text is None or len(text) > max_chars:
        return None
    whole, dot, frac = text.partition(".")
    if not _ascii_digits(whole) or (dot and not _ascii_digits(frac)):
        return None
    value = float(text)
    return value if value <= limit else None


def finite_number(value: object, *, limit: float = 2.0**40) -> int | None:
    """A JSON value (int or float, not bool) as a non-negative int when it is finite and at
    most ``limit``; else None. ``json.loads`` reads ``1e400`` as ``inf``, and ``int(inf)``
    raises OverflowError."""
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return None
    if isinstance(value, float) and not math.isfinite(value):
        return None
    if not 0 <= value <= limit:
        return None
    return int(value)


def parse_stamp(text: str | bytes | None) -> datetime | None:
    """An ISO 8601 time with a zone (``started_at``: ``2026-12-05T06:00:00+00:00``) as an
    aware datetime, or None when it is not one: unparsable, naive (no zone: its instant is
    unknown), or a year outside 2000..2100. Its ``timestamp()`` is then safe to take."""
    if text is None:
        return None
    if isinstance(text, bytes):
        text = text.decode("utf-8", "replace")
    text = text.strip()
    if not text or len(text) > 64:
        return None
    try:
        stamp = datetime.fromisoformat(text)
        if stamp.tzinfo is None or stamp.utcoffset() is None:
            return None
        if not _MIN_YEAR <= stamp.astimezone(UTC).year <= _MAX_YEAR:
            return None
        stamp.timestamp()
    except (ValueError, OverflowError, OSError):
        return None
    return stamp


# --- terminal-safe text --------------------------------------------------------------------

# C0 controls except TAB and LF, DEL, and the C1 controls (U+0080-U+009F: a terminal may read
# U+009B as CSI, the same as ESC [).
_CONTROL = re.compile(r"[\x00-\x08\x0b-\x1f\x7f-\x9f]")


def plain(text: str) -> str:
    """``text`` with control characters shown as ``\\xNN``: an ESC from a server's log or a
    host's file must not reach the terminal (it could clear it, retitle it or make a
    hyperlink)."""
    return _CONTROL.sub(lambda m: f"\\x{ord(m.group()):02x}", text)


def slack_escape(text: str) -> str:
    """``text`` with the three characters Slack's text formatting reserves (``&``, ``<``,
    ``>``) escaped as Slack asks (https://api.slack.com/reference/surfaces/formatting)."""
    return text.replace("&", "&amp;").replace("<", "&lt;").replace(">", "&gt;")


# --- secrets --------------------------------------------------------------------------


class Redactor:
    """Replaces every occurrence of any secret with ``***`` in strings, deep in containers.

    Values shorter than ``MIN_SECRET_LEN`` are ignored. Longer secrets are matched first, so a
    secret that contains another is masked whole. A secret's Slack-escaped form (``&`` as
    ``&amp;``, ...) is masked too, so text escaped for Slack before masking cannot leak it.
    """

    def __init__(self, secrets: Collection[str]) -> None:
        kept = {s for s in secrets if len(s) >= MIN_SECRET_LEN}
        values = sorted(kept | {slack_escape(s) for s in kept}, key=len, reverse=True)
        self._pattern = re.compile("|".join(map(re.escape, values))) if values else None
        self._edged = [v for v in values if len(v) > MIN_EDGE_LEN]

    def text(self, value: str) -> str:
        """``value`` with every secret masked, and a secret cut at either end of it (a text
        cut at a size limit: a line's 16 KiB, a log tail's first bytes): a secret's first
        MIN_EDGE_LEN or more characters ending ``value``, or its last ones starting it."""
        if self._pattern is None:
            return value
        return self._edges(self._pattern.sub(MASK, value))

    def _edges(self, value: str) -> str:
        for secret in self._edged:
            for k in range(len(secret) - 1, MIN_EDGE_LEN - 1, -1):
                if value.endswith(secret[:k]):
                    value = value[:-k] + MASK
                    break
            for k in range(len(secret) - 1, MIN_EDGE_LEN - 1, -1):
                if value.startswith(secret[-k:]):
                    value = MASK + value[k:]
                    break
        return value

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
