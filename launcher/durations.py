"""Human durations in config files: ``"500ms"``, ``"90s"``, ``"20m"``, ``"1h30m"``, ``"2d"``.

Every duration inside launcher is a ``float`` of seconds; this module is the one place that reads
the text form.
"""

from __future__ import annotations

import math
import re

ACCEPTED_FORMS = (
    "a number of seconds (90, 2.5) or amounts with units in the order d, h, m, s, ms, "
    "e.g. '500ms', '90s', '20m', '1h', '1h30m', '1.5h', '2d'"
)

_NUMBER = r"(\d+(?:\.\d+)?)"
# Units must come largest first and at most once each: "1h30m" reads unambiguously, "30m1h"
# is more likely a typo than intent. "m(?!s)" keeps "500ms" from being read as minutes.
_DURATION_RE = re.compile(
    rf"^(?:{_NUMBER}d)?(?:{_NUMBER}h)?(?:{_NUMBER}m(?!s))?(?:{_NUMBER}s)?(?:{_NUMBER}ms)?$"
)
_UNIT_SECONDS = (86400.0, 3600.0, 60.0, 1.0, 0.001)


def parse_duration(value: str | float) -> float:
    """Return ``value`` in seconds (a float >= 0).

    Accepts an int or float (already seconds), a string holding a bare number (seconds), or
    unit amounts such as ``"1h30m"`` (units d, h, m, s, ms, largest first, each at most once;
    surrounding whitespace ignored).

    Raises ``ValueError`` naming the accepted forms for anything else: negative, NaN or
    infinite numbers, booleans, empty text, unknown units.
    """
    if isinstance(value, bool):
        # bool is an int subclass; "true" seconds is never what someone meant.
        raise ValueError(f"invalid duration {value!r}: use {ACCEPTED_FORMS}")
    if isinstance(value, int | float):
        return _check_number(float(value), value)
    if not isinstance(value, str):
        raise ValueError(f"invalid duration {value!r}: use {ACCEPTED_FORMS}")
    text = value.strip()
    try:
        return _check_number(float(text), value)
    except ValueError:
        pass
    match = _DURATION_RE.match(text)
    if not text or match is None:
        raise ValueError(f"invalid duration {value!r}: use {ACCEPTED_FORMS}")
    return sum(
        float(amount) * unit
        for amount, unit in zip(match.groups(), _UNIT_SECONDS, strict=True)
        if amount is not None
    )


def _check_number(seconds: float, original: object) -> float:
    if math.isnan(seconds) or math.isinf(seconds) or seconds < 0:
        raise ValueError(f"invalid duration {original!r}: use {ACCEPTED_FORMS}")
    return seconds


def format_duration(seconds: float) -> str:
    """Render ``seconds`` in the text form ``parse_duration`` reads back (e.g. ``"1h30m"``)."""
    if seconds < 1:
        return f"{round(seconds * 1000)}ms"
    parts: list[str] = []
    remaining = seconds
    for suffix, unit in (("d", 86400), ("h", 3600), ("m", 60)):
        whole = int(remaining // unit)
        if whole:
            parts.append(f"{whole}{suffix}")
            remaining -= whole * unit
    if remaining or not parts:
        parts.append(f"{remaining:g}s")
    return "".join(parts)
