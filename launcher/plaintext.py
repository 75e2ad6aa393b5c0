"""Text from outside launcher made safe for a terminal: control characters shown, not sent.

A leaf module (stdlib only) so that both the CLI's rich output (``cli``) and the console log
format (``eventlog``) apply the same rule.
"""

from __future__ import annotations

import re

__all__ = ["plain"]

# C0 controls except TAB and LF, DEL, and the C1 controls (U+0080-U+009F: a terminal may read
# U+009B as CSI, the same as ESC [).
_CONTROL = re.compile(r"[\x00-\x08\x0b-\x1f\x7f-\x9f]")


def plain(text: str) -> str:
    """``text`` with control characters shown as ``\\xNN``: an ESC from a server's log or a
    host's file must not reach the terminal (it could clear it, retitle it or make a
    hyperlink)."""
    return _CONTROL.sub(lambda m: f"\\x{ord(m.group()):02x}", text)
