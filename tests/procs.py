"""Which processes a test may signal: only those it started.

A test reads server pids from a run directory that launcher (or a forged attempt) wrote.
Before a test signals such a pid, the pid must be a plain number above 1 and at most
``pid_max``, and the attempt's ``pid_start`` ("<boot id> <start time>", written by the launch
shim) must match the live process, so that a forged ``pid`` of ``1`` never becomes
``kill(-1, SIGKILL)`` and a recycled pid is never hit.
"""

from __future__ import annotations

import contextlib
import os
import signal
from pathlib import Path

_PID_MAX_FILE = Path("/proc/sys/kernel/pid_max")


def pid_max() -> int:
    """The kernel's largest pid (4194304 where it cannot be read)."""
    try:
        return int(_PID_MAX_FILE.read_text().strip()[:9])
    except (OSError, ValueError):
        return 4_194_304


def stat_fields(pid: int) -> list[str] | None:
    """Fields 3.. of ``/proc/PID/stat`` (state first), or None when there is no such process."""
    try:
        text = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    # Field 2 (comm) may hold spaces and parentheses; everything after the last ')' is plain.
    return text.rsplit(")", 1)[1].split()


def ident(pid: int) -> str | None:
    """``"<boot id> <start time>"`` of ``pid``, as the launch shim writes ``pid_start``."""
    fields = stat_fields(pid)
    if fields is None:
        return None
    boot_id = Path("/proc/sys/kernel/random/boot_id").read_text().strip()
    return f"{boot_id} {fields[19]}"


def parse_pid(text: str) -> int | None:
    """``text`` as a pid a test may signal: ASCII digits, above 1, at most ``pid_max``."""
    text = text.strip()
    if not (0 < len(text) <= 9 and text.isascii() and text.isdigit()):
        return None
    pid = int(text)
    return pid if 1 < pid <= pid_max() else None


def recorded_pid(attempt_dir: Path) -> int | None:
    """The server pid of ``attempt_dir`` if it is still the process the launch recorded.

    None for a missing, non-numeric, out-of-range (0, 1, above pid_max) pid, for a missing
    ``pid_start``, and for a live process whose start does not match ``pid_start``.
    """
    try:
        pid = parse_pid((attempt_dir / "pid").read_text())
        recorded = (attempt_dir / "pid_start").read_text(errors="replace").strip()
    except OSError:
        return None
    if pid is None or ident(pid) != recorded:
        return None
    return pid


def started_pid(attempt_dir: Path) -> int:
    """The pid ``attempt_dir`` records, for a test to assert on or signal.

    Raises AssertionError for a pid that is not a number above 1, and for a live process
    with that pid that is not the one the launch recorded. A pid whose process is gone is
    returned as it is (a test may assert on a dead server's pid; signalling it is harmless).
    """
    raw = (attempt_dir / "pid").read_text()
    pid = parse_pid(raw)
    assert pid is not None, f"{attempt_dir}/pid holds {raw[:40]!r}, not a pid a test may use"
    if stat_fields(pid) is not None:
        assert recorded_pid(attempt_dir) == pid, (
            f"pid {pid} of {attempt_dir} is a live process the launch did not record"
        )
    return pid


def signal_group(pgid: int, sig: signal.Signals) -> bool:
    """``killpg(pgid, sig)`` for a pgid above 1 only; False where nothing was signalled."""
    if pgid <= 1:
        raise ValueError(f"refusing to signal process group {pgid}")
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(pgid, sig)
        return True
    return False
