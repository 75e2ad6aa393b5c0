"""structlog set-up: JSON lines for machines, a compact console format for people.

Events are stable dotted names with their data in keys (``attempt.failed outcome=...``);
context (server, host) is bound by each supervisor.
"""

from __future__ import annotations

import logging
import sys
from typing import Literal, TextIO

import structlog

Format = Literal["json", "console"]


def configure(fmt: Format, stream: TextIO | None = None, level: int = logging.INFO) -> None:
    """Route every launcher event to ``stream`` (default stderr) in ``fmt``."""
    out = stream or sys.stderr
    renderer: structlog.typing.Processor
    if fmt == "json":
        renderer = structlog.processors.JSONRenderer(sort_keys=False)
    else:
        renderer = structlog.dev.ConsoleRenderer(colors=out.isatty(), pad_event_to=18)
    structlog.configure(
        processors=[
            structlog.contextvars.merge_contextvars,
            structlog.processors.add_log_level,
            structlog.processors.TimeStamper(fmt="iso", utc=True),
            renderer,
        ],
        wrapper_class=structlog.make_filtering_bound_logger(level),
        logger_factory=structlog.PrintLoggerFactory(out),
        cache_logger_on_first_use=False,
    )
