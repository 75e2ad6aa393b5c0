"""What `launcher status`, `describe` and `logs --since` learn about servers, from the host's
run directory (launcher.host.run) and the attempt ledger (launcher.store.ledger). Nothing here
prints or exits: the CLI renders what these functions return.

Reading is bounded whatever a log's size: a status reads a log's first ``STATUS_HEAD`` and
last ``STATUS_TAIL`` bytes; ``since_offset`` reads backwards ``remote.READ_CHUNK`` bytes at a
time and keeps at most one line's first ``_STAMP_BYTES`` bytes between reads.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

from launcher.config.schema import Config, ServerConfig
from launcher.errors import AuthenticationFailed, HostUnreachable, LauncherError
from launcher.hooks import identity
from launcher.host import health, run
from launcher.host.transport.base import Transport
from launcher.sglang.flags import mask_secret_flags_text
from launcher.sglang.logparse import LineSplitter, LogFollower
from launcher.store.ledger import AttemptRow, GiveUp, Ledger, ledger_path
from launcher.untrusted import parse_stamp

__all__ = [
    "STATUS_HEAD",
    "STATUS_TAIL",
    "Description",
    "ServerStatus",
    "describe",
    "endpoint",
    "host_now",
    "ledger_give_up",
    "ledger_rows",
    "restarts",
    "server_status",
    "since_offset",
    "unreachable_status",
]

STATUS_HEAD = 2 << 20  # bytes of a log's start `status` reads (start-up, args, ready)
STATUS_TAIL = 512 << 10  # and of its end (the latest phase or failure)
HEALTH_DEADLINE_S = 25.0  # the whole /health request of `status`, body included
LEDGER_ROWS = 500  # attempts of one server read from the ledger (restarts, describe)
_STAMP_BYTES = 64  # of a line's start, enough for SGLang's "[2025-10-16 09:06:10.123 TP0] "
_NEWLINE = re.compile(rb"\n")
_STAMP = re.compile(rb"^\[(\d{4}-\d\d-\d\d \d\d:\d\d:\d\d)")


def iso(ts: float | None) -> str | None:
    """``ts`` (seconds since the epoch) as ISO 8601 in UTC, ``2026-12-01T17:02:03Z``."""
    if ts is None:
        return None
    try:  # a figure read from a file or the ledger may be out of datetime's range
        return datetime.fromtimestamp(ts, UTC).strftime("%Y-%m-%dT%H:%M:%SZ")
    except (ValueError, OverflowError, OSError):
        return None


def endpoint(config: Config, s: ServerConfig) -> str:
    """``host:port`` where clients reach the server: ``facts.endpoint``, the same answer
    Slack and metrics give."""
    return identity.endpoint(s, config.host(s.host))


@dataclass
class ServerStatus:
    """One row of `launcher status`.

    ``state``: "not started" (no attempt on the host), "starting", "ready", "unhealthy"
    (ready once, failing /health now), "stopped" (the ledger says it was stopped on request:
    `launcher down`, `up --stop-on-exit`; ``ended_at`` says when, and ``age_s`` stays how
    long it ran), "exited (N)" / "exited" (status not recorded), "gave up" (supervision gave
    up on its newest attempt), "unreachable" or "unknown" (the host could not be asked;
    ``error`` says why). ``restarts``: failed attempts before the newest one, from the
    ledger (None without one).
    """

    server: str
    host: str
    endpoint: str
    state: str
    running: bool = False
    pid: int | None = None
    attempt: int | None = None
    restarts: int | None = None
    params: dict[str, Any] | None = None
    phase: str | None = None
    ready: bool = False
    healthy: bool | None = None
    started_at: float | None = None
    ended_at: float | None = None
    age_s: float | None = None
    uptime_s: float | None = None
    exit_status: int | None = None
    gave_up: str | None = None
    gave_up_before_launch: bool = False  # the give-up came in preflight: nothing launched
    run_dir: str | None = None
    error: str | None = None

    def as_dict(self) -> dict[str, Any]:
        """JSON-ready; times as ISO 8601."""
        return {
            "server": self.server, "host": self.host, "endpoint": self.endpoint,
            "state": self.state, "running": self.running, "pid": self.pid,
            "attempt": self.attempt, "restarts": self.restarts, "params": self.params,
            "phase": self.phase, "ready": self.ready, "healthy": self.healthy,
            "started_at": iso(self.started_at), "ended_at": iso(self.ended_at),
            "age_s": self.age_s,
            "uptime_s": self.uptime_s, "exit_status": self.exit_status,
            "gave_up": self.gave_up, "gave_up_before_launch": self.gave_up_before_launch,
            "run_dir": self.run_dir, "error": self.error,
        }


def unreachable_status(config: Config, s: ServerConfig, exc: LauncherError, *,
                       now: float | None = None) -> ServerStatus:
    """The row of a server whose host could not be asked: its newest attempt, params and age
    as the ledger last knew them (the host may still run it), with the error."""
    unreachable = isinstance(exc, HostUnreachable | AuthenticationFailed)
    st = ServerStatus(s.name, s.host, endpoint(config, s),
                      "unreachable" if unreachable else "unknown", error=str(exc))
    rows = ledger_rows(config, s.name)
    if rows:
        newest = max(rows, key=lambda r: r.attempt)
        st.attempt, st.restarts = newest.attempt, restarts(rows, newest.attempt)
        st.params = {"mem_fraction_static": newest.params.mem_fraction_static,
                     "cuda_graph_max_bs": newest.params.cuda_graph_max_bs}
        st.started_at = newest.started_at
        if now is not None:
            st.age_s = round(max(0.0, now - newest.started_at), 1)
    return st


def ledger_rows(config: Config, server: str) -> list[AttemptRow] | None:
    """The server's attempts in the ledger, newest first; None when there is no ledger."""
    path = ledger_path(config.state_dir)
    if not path.exists():
        return None
    with Ledger(path) as ledger:
        return ledger.history(server, limit=LEDGER_ROWS)


def ledger_give_up(config: Config, server: str) -> GiveUp | None:
    """The server's last give-up in the ledger; None when there is none (or no ledger)."""
    path = ledger_path(config.state_dir)
    if not path.exists():
        return None
    with Ledger(path) as ledger:
        return ledger.last_give_up(server)


def restarts(rows: list[AttemptRow] | None, newest: int | None) -> int | None:
    """Failed attempts before attempt ``newest`` (each made launcher relaunch)."""
    if rows is None:
        return None
    return sum(1 for r in rows if r.outcome not in (None, "ready", "stopped")
               and (newest is None or r.attempt < newest))


def _parse_time(text: str | None) -> float | None:
    """``started_at`` as seconds since the epoch; None when it is not a time launcher could
    have written (``numbers.parse_stamp``: no zone, a year outside 2000..2100, garbage)."""
    when = parse_stamp(text)
    return None if when is None else when.timestamp()


async def _log_follower(t: Transport, handle: run.RunHandle, size: int) -> LogFollower:
    """A follower fed the log's start-up (its first STATUS_HEAD bytes) and its last
    STATUS_TAIL bytes (their first, partial line dropped), whatever the log's size."""
    head = await run.read_log(t, handle, 0, STATUS_HEAD)
    parts = [head]
    if size > len(head):
        start = max(len(head), size - STATUS_TAIL)
        tail = await run.read_log(t, handle, start, STATUS_TAIL)
        parts = [head + tail] if start == len(head) else [head, tail.partition(b"\n")[2]]
    follower = LogFollower()
    for part in parts:
        splitter = LineSplitter()
        for line in [*splitter.feed(part), *splitter.flush()]:
            follower.feed_line(line)
    return follower


async def _healthy(t: Transport, port: int, address: str) -> bool:
    try:
        async with health.client_for(t, port, address, HEALTH_DEADLINE_S) as (client, url):
            ok, _ = await health.check(client, url, HEALTH_DEADLINE_S)
            return ok
    except LauncherError:
        return False


@dataclass
class _Look:
    status: ServerStatus
    handle: run.RunHandle | None = None
    files: dict[str, str] = field(default_factory=dict)
    follower: LogFollower | None = None


def _gave_up(st: ServerStatus, give_up: GiveUp | None, newest: int) -> bool:
    """Take the ledger's last give-up into ``st`` when it is the news about a server that
    does not run: none of its attempts on the host is newer (one in preflight launched
    none). The newest give-up wins over an attempt's ``gave_up`` file."""
    if give_up is None or give_up.attempt < newest:
        return False
    st.state, st.gave_up = "gave up", give_up.reason
    st.gave_up_before_launch = give_up.attempts == 0
    return True


async def _look(config: Config, s: ServerConfig, t: Transport,
                rows: list[AttemptRow] | None, *, now: float,
                give_up: GiveUp | None = None) -> _Look:
    rd = config.run_dir_of(s)
    handle = await run.find_running(t, rd, s.name)
    running = handle is not None
    if handle is None:
        handle = await run.latest_handle(t, rd, s.name)
    st = ServerStatus(s.name, s.host, endpoint(config, s), "not started",
                      restarts=restarts(rows, None))
    if handle is None:
        _gave_up(st, give_up, 0)
        return _Look(st)
    files = await run.attempt_files(t, handle)
    probe = await run.probe(t, handle)
    follower = await _log_follower(t, handle, probe.log_size)
    st.running, st.attempt, st.run_dir = running, handle.attempt, handle.dir
    st.pid = handle.pid if running else None
    st.restarts = restarts(rows, handle.attempt)
    st.exit_status = probe.exit_status
    st.phase = follower.phase.value if follower.phase else None
    st.ready = follower.ready_line is not None
    rp = follower.resolved_params
    st.params = {"mem_fraction_static": rp.mem_fraction_static,
                 "cuda_graph_max_bs": rp.cuda_graph_max_bs}
    st.started_at = _parse_time(files.get("started_at"))
    if st.started_at is not None:
        st.age_s = round(max(0.0, now - st.started_at), 1)
        st.uptime_s = st.age_s if running else None
    st.gave_up = files.get("gave_up") or None
    row = next((r for r in rows or [] if r.attempt == handle.attempt), None)
    if running:
        st.healthy = await _healthy(t, s.port, s.probe_address) if st.ready else None
        st.state = ("ready" if st.healthy else "unhealthy") if st.ready else "starting"
    elif _gave_up(st, give_up, handle.attempt):
        pass
    elif st.gave_up is not None:
        st.state = "gave up"
    elif row is not None and row.outcome == "stopped":
        # stopped on request (`down`, `up --stop-on-exit`): not a crash, whatever its status
        st.state = "stopped"
        st.ended_at = row.ended_at
        if st.started_at is not None and row.ended_at is not None:
            st.age_s = round(max(0.0, row.ended_at - st.started_at), 1)  # how long it ran
    else:
        st.state = "exited" if st.exit_status is None else f"exited ({st.exit_status})"
    return _Look(st, handle, files, follower)


async def server_status(config: Config, s: ServerConfig, t: Transport, *,
                        now: float) -> ServerStatus:
    """``s``'s row of `launcher status` (``now``: seconds since the epoch, for AGE)."""
    return (await _look(config, s, t, ledger_rows(config, s.name), now=now,
                        give_up=ledger_give_up(config, s.name))).status


@dataclass
class Description:
    """What `launcher describe` shows of one server (see ``as_dict``)."""

    config_path: str
    server: ServerConfig
    status: ServerStatus
    command: str | None
    numbers: dict[str, Any]
    ready_s: float | None
    attempts: list[AttemptRow]
    events: list[tuple[float, str]]

    def as_dict(self) -> dict[str, Any]:
        return {
            "config": self.config_path,
            "server": self.server.name,
            "host": self.server.host,
            "model_path": self.server.model_path,
            "gpus": list(self.server.gpus),
            "status": self.status.as_dict(),
            "command": self.command,
            "memory": self.numbers,
            "seconds_to_ready": self.ready_s,
            "attempts": [r.as_dict() | {"started_at": iso(r.started_at),
                                        "ended_at": iso(r.ended_at)}
                         for r in self.attempts],
            "events": [{"at": iso(at), "event": text} for at, text in self.events],
        }


MEMORY_KEYS = (
    "total_gib", "pre_load_avail_gib", "weights_gib", "post_weights_avail_gib",
    "kv_tokens", "pool_end_avail_gib", "max_total_num_tokens", "graph_first_begin_avail_gib",
    "graph_last_avail_gib", "draft_weights_gib", "mamba_state_gib", "tried_gib", "free_gib",
)


def events_of(rows: list[AttemptRow], limit: int) -> list[tuple[float, str]]:
    """The ledger's rows as events, oldest first: the ``limit`` most recent."""
    out: list[tuple[float, str]] = []
    for r in rows:
        out.append((r.started_at, f"attempt {r.attempt} started ({r.params.describe()})"))
        if r.outcome == "ready" and r.ended_at is not None:
            took = "" if r.seconds_to_ready is None else f" in {r.seconds_to_ready:.0f}s"
            out.append((r.ended_at, f"attempt {r.attempt} ready{took}"))
        elif r.outcome == "stopped" and r.ended_at is not None:
            out.append((r.ended_at, f"attempt {r.attempt} stopped"))
        elif r.outcome is not None and r.ended_at is not None:
            where = f" in {r.phase}" if r.phase else ""
            out.append((r.ended_at, f"attempt {r.attempt} ended: {r.outcome}{where}"))
    out.sort(key=lambda e: e[0])
    return out[-limit:]


async def describe(config: Config, config_path: Path, s: ServerConfig, t: Transport, *,
                   now: float, attempts: int = 5, events: int = 12) -> Description:
    """Everything `launcher describe` shows of ``s``: its status, the newest attempt's
    command line and memory figures (from its log), and the ledger's last ``attempts``
    attempts and ``events`` events."""
    rows = ledger_rows(config, s.name) or []
    look = await _look(config, s, t, rows, now=now, give_up=ledger_give_up(config, s.name))
    st = look.status
    newest = next((r for r in rows if r.attempt == st.attempt), None)
    numbers: dict[str, Any] = {}
    if look.follower is not None:
        numbers = look.follower.numbers.as_dict()
    elif newest is not None:
        numbers = dict(newest.numbers)
    memory = {k: numbers[k] for k in MEMORY_KEYS if numbers.get(k) is not None}
    ready_s = newest.seconds_to_ready if newest is not None else None
    cmd = look.files.get("cmd")  # an attempt launched with a secret flag in argv: masked
    cmd = mask_secret_flags_text(cmd) if cmd is not None else None
    return Description(str(config_path), s, st, cmd, memory, ready_s,
                       rows[:attempts], events_of(rows, events))


async def host_now(t: Transport) -> datetime:
    """The host's local time now, as a naive datetime (SGLang stamps its lines with it)."""
    result = await t.run(["date", "+%Y-%m-%d %H:%M:%S"], timeout=30.0)
    if not result.ok:
        raise LauncherError(f"`date` failed on {t.host_name}")
    return datetime.strptime(result.stdout.decode().strip(), "%Y-%m-%d %H:%M:%S")


def since_cutoff(since: str, host_now: datetime) -> datetime:
    """``--since``'s cut-off in the host's local time: a duration back from ``host_now``
    (``90s``, ``10m``, ``2h``, ``1d``) or a time as the log writes it (``2026-12-01 17:02:03``,
    ``T`` allowed, seconds optional). ValueError when it is neither."""
    m = re.fullmatch(r"(\d+(?:\.\d+)?)([smhd])", since.strip())
    if m:
        unit = {"s": 1, "m": 60, "h": 3600, "d": 86400}[m.group(2)]
        return host_now - timedelta(seconds=float(m.group(1)) * unit)
    when = datetime.fromisoformat(since.strip())
    if when.tzinfo is not None:
        raise ValueError("a time with a zone: give the host's local time, as its log writes it")
    return when


async def since_offset(t: Transport, handle: run.RunHandle, cutoff: datetime) -> int:
    """The log offset of the first line stamped at or after ``cutoff``, the log's size when
    none is. Lines without a stamp (a traceback's, a progress bar's) go with the stamped line
    before them. Reads backwards, READ_CHUNK bytes at a time, stopping at the first stamped
    line older than ``cutoff``; between reads it keeps only the first bytes of a line."""
    want = cutoff.strftime("%Y-%m-%d %H:%M:%S").encode()
    size = (await run.probe(t, handle)).log_size
    found = size
    end = size
    later = b""  # the first bytes of the log from ``end`` on (already read)
    while end > 0:
        start = max(0, end - run.READ_CHUNK)
        chunk = await run.read_log(t, handle, start, end - start)
        if not chunk:
            break  # the log shrank under us: what was found stands
        starts = [m.end() for m in _NEWLINE.finditer(chunk)]
        if start == 0:
            starts.insert(0, 0)
        for i in reversed(starts):
            m = _STAMP.match((chunk[i:i + _STAMP_BYTES] + later)[:_STAMP_BYTES])
            if m is None:
                continue
            if m.group(1) < want:
                return found
            found = start + i
        later = (chunk + later)[:_STAMP_BYTES]
        end = start
    return found
