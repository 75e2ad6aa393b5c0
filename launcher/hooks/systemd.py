"""systemd integration: readiness, status and watchdog notifications (``sd_notify``).

The protocol (``man sd_notify``) is a datagram of ``KEY=VALUE`` lines sent to the
``AF_UNIX`` socket named by ``$NOTIFY_SOCKET``: a path, or with a leading ``@`` an abstract
socket. It is implemented here directly (a dozen lines) instead of depending on libsystemd.

- ``SdNotifier.from_env()`` is None outside systemd (no ``$NOTIFY_SOCKET``), so callers write
  ``if notifier: notifier.ready()``.
- ``watchdog_interval()`` is half of ``$WATCHDOG_USEC`` (systemd's own advice), or None when
  the unit has no ``WatchdogSec=`` or the watchdog belongs to another process.
- ``run_watchdog()`` is a task for the supervision task group: it pings ``WATCHDOG=1`` with
  the current ``STATUS=`` line. It shares the event loop with supervision, so a loop wedged by
  blocking code stops the pings and systemd restarts the daemon (``WatchdogSec=`` in
  ``systemd/launcher@.service``).
- ``status_summary()`` is that status line, e.g. ``1/2 ready; llama: cuda_graph 34%, attempt 2``.

Wiring in ``launcher up`` (sketch)::

    notifier = SdNotifier.from_env()
    async with anyio.create_task_group() as tg:
        ...  # start the supervisors
        if notifier:
            notifier.ready()  # "launcher is supervising", not "every server is ready"
            interval = watchdog_interval()
            if interval:
                tg.start_soon(run_watchdog, notifier, interval, summary)
    if notifier:
        notifier.stopping()
"""

from __future__ import annotations

import math
import os
import socket
from collections.abc import Awaitable, Callable, Iterable, Mapping
from typing import NoReturn, Protocol

import anyio
import anyio.abc
import structlog

__all__ = [
    "SdNotifier",
    "ServerStatus",
    "run_watchdog",
    "status_summary",
    "watchdog_interval",
]

log = structlog.get_logger(__name__)

# systemd shows STATUS= in `systemctl status`; keep it one readable line.
STATUS_MAX_CHARS = 200


class SdNotifier:
    """Sends ``sd_notify`` datagrams to one socket.

    Resource handling: owns one non-blocking ``AF_UNIX``/``SOCK_DGRAM`` socket, opened in the
    constructor and released by ``close()`` (also a context manager).

    Error handling: sending never raises. A failed send (socket gone, queue full: the socket
    is non-blocking so a stuck systemd cannot stall the event loop) is logged as
    ``systemd.notify_failed`` and reported by ``send`` returning False.
    """

    def __init__(self, address: str) -> None:
        """``address`` is ``$NOTIFY_SOCKET`` as systemd sets it: a path or ``@abstract``."""
        self.address = address
        # An abstract socket's name starts with a NUL byte; systemd writes it as '@'.
        raw = os.fsencode(address)
        self._target: bytes = b"\0" + raw[1:] if raw.startswith(b"@") else raw
        self._sock = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM | socket.SOCK_CLOEXEC)
        self._sock.setblocking(False)
        self._status: str | None = None  # the last STATUS= sent (for status_if_changed)

    @classmethod
    def from_env(cls, environ: Mapping[str, str] = os.environ) -> SdNotifier | None:
        """A notifier for ``$NOTIFY_SOCKET``, or None when it is unset, empty or not an
        ``AF_UNIX`` address (``vsock:`` addresses of systemd >= 253 are not supported);
        unsupported or unusable addresses are logged as ``systemd.notify_unsupported``."""
        address = environ.get("NOTIFY_SOCKET", "")
        if not address:
            return None
        if not address.startswith(("/", "@")):
            log.warning("systemd.notify_unsupported", address=address)
            return None
        try:
            return cls(address)
        except OSError as exc:  # out of file descriptors, AF_UNIX unavailable
            log.warning("systemd.notify_unsupported", address=address, error=str(exc))
            return None

    def send(self, **fields: object) -> bool:
        """Send one datagram with a ``KEY=VALUE`` line per field, in the order given.

        Keys are upper-cased (``send(status="x")`` sends ``STATUS=x``); newlines in values
        become spaces, since a newline would start a new field. True if the datagram went out.
        """
        lines = []
        for key, value in fields.items():
            text = str(value).replace("\r", " ").replace("\n", " ")
            lines.append(f"{key.upper()}={text}")
        message = "\n".join(lines).encode("utf-8", "replace")
        try:
            self._sock.sendto(message, self._target)
        except OSError as exc:
            log.warning(
                "systemd.notify_failed",
                address=self.address,
                fields=sorted(k.upper() for k in fields),
                error=str(exc),
            )
            return False
        for key, value in fields.items():
            if key.upper() == "STATUS":
                self._status = str(value)
        return True

    def ready(self, status: str | None = None) -> bool:
        """``READY=1``: start-up finished (for launcher: supervision is running)."""
        if status is None:
            return self.send(READY=1)
        return self.send(READY=1, STATUS=status)

    def status(self, text: str) -> bool:
        """``STATUS=text``: the one-line status ``systemctl status`` shows."""
        return self.send(STATUS=text)

    def status_if_changed(self, text: str) -> bool:
        """``STATUS=text`` unless that is the line systemd already has; True if sent.

        For callers that recompute the line often (the supervision tick, 5 times a second):
        ``systemctl status`` follows phase changes at once instead of at the next watchdog
        ping (30 s), and an unchanged line costs no datagram. A failed send is retried on the
        next call (the last line sent is only remembered on success)."""
        if text == self._status:
            return False
        return self.status(text)

    def watchdog(self) -> bool:
        """``WATCHDOG=1``: the keep-alive ping ``WatchdogSec=`` expects."""
        return self.send(WATCHDOG=1)

    def stopping(self) -> bool:
        """``STOPPING=1``: shutdown has begun."""
        return self.send(STOPPING=1)

    def close(self) -> None:
        """Release the socket. Idempotent."""
        self._sock.close()

    def __enter__(self) -> SdNotifier:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def watchdog_interval(
    environ: Mapping[str, str] = os.environ, *, pid: int | None = None
) -> float | None:
    """Seconds between watchdog pings: half of ``$WATCHDOG_USEC``, or None for no pings.

    None when ``$WATCHDOG_USEC`` is unset or not a positive integer (logged as
    ``systemd.watchdog_invalid``), or when ``$WATCHDOG_PID`` is set and is not ``pid``
    (default ``os.getpid()``): the variables were inherited from a parent the watchdog is for.
    """
    usec = environ.get("WATCHDOG_USEC", "")
    if not usec:
        return None
    owner = environ.get("WATCHDOG_PID", "")
    if owner:
        mine = os.getpid() if pid is None else pid
        if not owner.isdigit() or int(owner) != mine:
            return None
    if not usec.isdigit() or int(usec) == 0:
        log.warning("systemd.watchdog_invalid", watchdog_usec=usec)
        return None
    return int(usec) / 2 / 1_000_000


async def run_watchdog(
    notifier: SdNotifier,
    interval: float,
    summary: Callable[[], str],
    *,
    sleep: Callable[[float], Awaitable[None]] = anyio.sleep,
    task_status: anyio.abc.TaskStatus[None] = anyio.TASK_STATUS_IGNORED,
) -> NoReturn:
    """Ping ``WATCHDOG=1`` with ``STATUS=<summary()>`` now and then every ``interval`` s.

    Run it in the same task group (so on the same event loop) as supervision: the pings prove
    the loop still runs, which is the point of the watchdog. ``task_status.started()`` is
    called after the first ping. Runs until cancelled. ``interval`` must be > 0
    (``watchdog_interval`` never returns anything else).

    Error handling: send failures are logged by the notifier and the loop goes on. An
    exception from ``summary`` is logged as ``systemd.status_failed`` and that ping goes out
    without a status: a broken status line must not get a healthy daemon restarted.
    """
    started = False
    while True:
        try:
            text = summary()
        except Exception:
            log.exception("systemd.status_failed")
            notifier.watchdog()
        else:
            notifier.send(WATCHDOG=1, STATUS=text)
        if not started:
            task_status.started()
            started = True
        await sleep(interval)


class ServerStatus(Protocol):
    """What ``status_summary`` reads from each server
    (``launcher.supervise.supervisor.Snapshot``)."""

    @property
    def server(self) -> str: ...

    @property
    def state(self) -> str: ...

    @property
    def phase(self) -> str | None: ...

    @property
    def progress(self) -> float | None: ...

    @property
    def attempt(self) -> int: ...


def status_summary(snapshots: Iterable[ServerStatus]) -> str:
    """One line for ``STATUS=``: how many servers are ready, then each one that is not.

    ``"2/3 ready; llama: cuda_graph 34%, attempt 2"``. A server's part is its state (with
    the phase in brackets when the two differ), the current phase's progress when known, and
    its attempt number once one was made, and how long its host has been unreachable when it
    is (a ready server is then listed too). The line is cut to ``STATUS_MAX_CHARS`` with a
    trailing ``…``.
    """
    snaps = list(snapshots)
    if not snaps:
        return "no servers"
    ready = sum(1 for s in snaps if str(s.state) == "ready")
    parts = [f"{ready}/{len(snaps)} ready"]
    for s in snaps:
        # Snapshots say how long their host has been unreachable (None: it is not).
        unreachable = getattr(s, "unreachable_s", None)
        if str(s.state) == "ready" and unreachable is None:
            continue
        part = f"{s.server}: {s.state}"
        if s.phase and s.phase != s.state:  # states name their phase; show it if not
            part += f" ({s.phase})"
        if s.progress is not None and math.isfinite(s.progress):
            part += f" {round(min(max(s.progress, 0.0), 1.0) * 100)}%"
        if s.attempt > 0:
            part += f", attempt {s.attempt}"
        if unreachable is not None:
            part += f", host unreachable for {unreachable:.0f}s"
        parts.append(part)
    line = "; ".join(parts)
    if len(line) > STATUS_MAX_CHARS:
        line = line[: STATUS_MAX_CHARS - 1] + "…"
    return line
