"""Text launcher does not control: bounded numbers and terminal-safe text.

Server logs, ``/health`` answers, attempt files on a host (``exit_status``, ``pid``,
``started_at``), the follow agent's frames, a model's ``config.json`` and the host's SGLang
version string can all say anything.

Numbers: Python's ``int()`` refuses more than 4300 digits with a ValueError, accepts non-ASCII
digits, signs, underscores and spaces; ``float()`` turns a long number into ``inf``. Every number
read from such text goes through one of these helpers, which return None (never raise) for
anything out of bounds, so that one bad line or file is "no figure", not a crash of the
supervision of every server (security review 2026-12-05, findings H1, M1, M2, M3, L3).

Text: ``plain`` shows control characters instead of sending them, so that both the CLI's rich
output and the console log format apply the same rule.

A leaf module: no launcher imports.
"""


from __future__ import annotations

import math
import re
from datetime import UTC, datetime

__all__ = [
    "MAX_DIGITS",
    "MAX_FLOAT_CHARS",
    "bounded_float",
    "bounded_int",
    "finite_number",
    "parse_stamp",
    "plain",
]

MAX_DIGITS = 18  # < 2**63: fits every counter, pid, byte count and exit status
MAX_FLOAT_CHARS = 32  # "123456.789" with room; log figures are a few digits each side
_DIGITS = frozenset("0123456789")
# started_at must fall in these years; outside, datetime arithmetic and fromtimestamp fail
# (year 0/10000) or the figure is nonsense anyway.
_MIN_YEAR, _MAX_YEAR = 2000, 2100


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
