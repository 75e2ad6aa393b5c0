"""The coordination lease in PostgreSQL: who of several `launcher up` is active (docs/ha.md).

One row per lease in ``launcher_lease`` (holder, box, fencing token, ``expires_at``); every
launcher also keeps a row in ``launcher_members`` (its heartbeat), which ``status`` reads to
name the standbys. ``launcher_shared`` holds the attempt ledger's shared parts (last good
params, the Slack notifier's memory, the newest observed start-up figures), written by the
active launcher under its token (``PgEngine.store_shared``) and read by the next one at its
takeover. Every time
comparison is the database's (``now()``), never this machine's wall clock; this process
measures only durations, on its monotonic clock (``Fence``).

- :meth:`Coordinator.wait_active` (a standby): tries to take the lease until it is free,
  polling just after the holder's expiry (at most every ttl/3). Taking it bumps the token.
- :meth:`Coordinator.keep` (the active): renews every ttl/3; each success moves the fence's
  deadline (``LeaseTiming.deadline``). When the deadline passes without a success, or the
  row shows another holder, it revokes the fence and raises LeaseLost.
- :meth:`Coordinator.release`: on a clean stop, expires the lease at once (a standby takes
  over without waiting for the TTL).

Resource handling: one database connection, opened lazily and dropped (``terminate``) after
any error; the next try opens a new one. Error handling: the engine's errors (unreachable,
restarting, timeouts) never escape: a standby keeps polling, the active keeps renewing
until its deadline. Only LeaseLost leaves ``keep``.
"""

from __future__ import annotations

import contextlib
import math
import os
import time
import urllib.parse
import uuid
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, NoReturn, Protocol

import anyio
import anyio.abc
import structlog

from launcher.errors import LeaseLost
from launcher.store.fence import Fence, LeaseTiming
from launcher.store.ledger import SHARED_OBSERVATIONS, SharedRow
from launcher.untrusted import Redactor

if TYPE_CHECKING:
    import asyncpg

__all__ = [
    "CLIENT_REMEDY",
    "Acquired",
    "Coordinator",
    "Engine",
    "EngineUnavailable",
    "LeaseView",
    "Member",
    "Membership",
    "PgEngine",
    "client_missing",
    "ping",
]

log = structlog.get_logger(__name__)

Clock = Callable[[], float]
Sleep = Callable[[float], Awaitable[None]]


class EngineUnavailable(Exception):
    """The database could not be asked (refused, restarting, timed out); ``cause`` says how."""


CLIENT_REMEDY = ("pip install 'launcher[ha]' in launcher's environment (the `ha` extra: the "
                 "PostgreSQL client asyncpg)")


def client_missing() -> str | None:
    """Why the PostgreSQL client (asyncpg, the ``ha`` extra) cannot be imported here (the
    import's own error); None when it can. ``PgEngine`` imports it at first use, so a
    ``[coordination]`` config asks this before anything starts."""
    try:
        import asyncpg  # noqa: F401
    except ImportError as exc:
        return f"{type(exc).__name__}: {exc}"
    return None


async def ping(dsn: str, timeout: float = 5.0) -> str:
    """Connect to ``dsn`` once and ask the server's version, all within ``timeout``; creates
    nothing (no table, no member row). Returns ``PostgreSQL 15.8``-like text.

    Error handling: EngineUnavailable naming the cause (refused, timed out, a bad login, a
    malformed DSN) when the one try fails; its text never holds the DSN or its password."""
    import asyncpg

    secrets = [dsn]
    with contextlib.suppress(ValueError):
        password = urllib.parse.urlsplit(dsn).password
        if password:
            secrets.append(urllib.parse.unquote(password))
            secrets.append(password)
    redact = Redactor(secrets)
    conn = None
    try:
        with anyio.fail_after(timeout):
            conn = await asyncpg.connect(dsn, timeout=timeout)
            version = await conn.fetchval("SHOW server_version")
    except (OSError, TimeoutError, ValueError, asyncpg.PostgresError, asyncpg.InterfaceError,
            asyncpg.InternalClientError) as exc:
        why = str(exc) or f"no answer within {timeout:g}s"
        raise EngineUnavailable(redact.text(f"{type(exc).__name__}: {why}")) from None
    finally:
        if conn is not None:
            conn.terminate()
    return f"PostgreSQL {version}"


@dataclass(frozen=True)
class LeaseView:
    """The lease as the engine saw it: who holds it and for how much longer (None when no
    launcher ever held it)."""

    box: str | None
    holder: str | None
    token: int | None
    remaining_s: float | None


@dataclass(frozen=True)
class Acquired:
    """This launcher took the lease: its token, the box that held it before (None the first
    time), and how long it stood by."""

    token: int
    previous_box: str | None
    waited_s: float


@dataclass(frozen=True)
class Member:
    """One launcher that heartbeats this lease: ``age_s`` since its last heartbeat."""

    box: str
    holder: str
    pid: int
    age_s: float


@dataclass(frozen=True)
class Membership:
    """What `launcher status` shows: the lease and the launchers heartbeating it."""

    lease: LeaseView
    members: list[Member]
    ttl: float

    @property
    def active(self) -> Member | None:
        """The member that holds an unexpired lease, if any."""
        if self.lease.remaining_s is None or self.lease.remaining_s <= 0:
            return None
        return next((m for m in self.members if m.holder == self.lease.holder), None)

    @property
    def standbys(self) -> list[Member]:
        """The other members heard from within three TTLs."""
        active = self.active
        return [m for m in self.members if m.age_s <= 3 * self.ttl
                and (active is None or m.holder != active.holder)]


class Engine(Protocol):
    """The lease's storage: one atomic statement per operation, the engine's clock."""

    async def try_acquire(self) -> tuple[int | None, LeaseView]:
        """(the new token, or None when the lease is held and unexpired; the lease before)."""
        ...

    async def renew(self, token: int) -> bool:
        """Extend our lease; False when the row shows another holder or token."""
        ...

    async def release(self, token: int) -> None: ...

    async def membership(self) -> Membership: ...

    def drop(self) -> None:
        """Forget the connection (after an error or a cancelled try)."""
        ...


_SCHEMA = """
CREATE TABLE IF NOT EXISTS launcher_lease (
  name text PRIMARY KEY,
  holder text NOT NULL,
  box text NOT NULL,
  token bigint NOT NULL,
  expires_at timestamptz NOT NULL,
  acquired_at timestamptz NOT NULL
);
CREATE TABLE IF NOT EXISTS launcher_members (
  name text NOT NULL,
  holder text NOT NULL,
  box text NOT NULL,
  pid integer NOT NULL,
  started_at timestamptz NOT NULL,
  heartbeat_at timestamptz NOT NULL,
  PRIMARY KEY (name, holder)
);
CREATE TABLE IF NOT EXISTS launcher_shared (
  name text NOT NULL,
  kind text NOT NULL,
  key text NOT NULL,
  body text NOT NULL,
  token bigint NOT NULL,
  written_at timestamptz NOT NULL,
  PRIMARY KEY (name, kind, key)
);
"""

# $1 lease, $2 holder, $3 box, $4 ttl seconds, $5 pid. Takes the lease when it has expired
# (by the engine's clock) or never existed, bumping the token; one statement, so two
# standbys racing get one winner (the loser's re-check sees the winner's expires_at).
_ACQUIRE = """
WITH prev AS (SELECT box, holder, token, expires_at FROM launcher_lease WHERE name = $1),
won AS (
  INSERT INTO launcher_lease AS l (name, holder, box, token, expires_at, acquired_at)
  VALUES ($1, $2, $3, 1, now() + make_interval(secs => $4::float8), now())
  ON CONFLICT (name) DO UPDATE SET holder = EXCLUDED.holder, box = EXCLUDED.box,
    token = l.token + 1, expires_at = EXCLUDED.expires_at, acquired_at = now()
  WHERE l.expires_at <= now()
  RETURNING token),
beat AS (
  INSERT INTO launcher_members AS m (name, holder, box, pid, started_at, heartbeat_at)
  VALUES ($1, $2, $3, $5, now(), now())
  ON CONFLICT (name, holder) DO UPDATE SET heartbeat_at = now(), box = EXCLUDED.box)
SELECT (SELECT token FROM won) AS won,
       (SELECT box FROM prev) AS box, (SELECT holder FROM prev) AS holder,
       (SELECT token FROM prev) AS token,
       (SELECT extract(epoch FROM expires_at - now())::float8 FROM prev) AS remaining
"""

# $1 lease, $2 holder, $3 token, $4 ttl seconds, $5 box, $6 pid.
_RENEW = """
WITH r AS (
  UPDATE launcher_lease SET expires_at = now() + make_interval(secs => $4::float8)
  WHERE name = $1 AND holder = $2 AND token = $3
  RETURNING token),
beat AS (
  INSERT INTO launcher_members AS m (name, holder, box, pid, started_at, heartbeat_at)
  VALUES ($1, $2, $5, $6, now(), now())
  ON CONFLICT (name, holder) DO UPDATE SET heartbeat_at = now())
SELECT (SELECT token FROM r) AS token
"""

# $1 lease, $2 holder, $3 token. The lease ends now; our member row goes.
_RELEASE = """
WITH r AS (
  UPDATE launcher_lease SET expires_at = now()
  WHERE name = $1 AND holder = $2 AND token = $3 AND expires_at > now())
DELETE FROM launcher_members WHERE name = $1 AND holder = $2
"""

_LEASE = """
SELECT box, holder, token, extract(epoch FROM expires_at - now())::float8 AS remaining
FROM launcher_lease WHERE name = $1
"""
_MEMBERS = """
SELECT box, holder, pid, extract(epoch FROM now() - heartbeat_at)::float8 AS age
FROM launcher_members WHERE name = $1 ORDER BY box, started_at
"""
# $1 lease, $2 token, $3 kinds, $4 keys, $5 bodies, $6 observations kept. The ledger's
# shared rows, written only while $2 is the lease's current, unexpired token (the fence, in
# the same statement). Observations accumulate (every box passes on its newest), so the
# same statement drops all but the $6 last written, never one it writes.
_STORE_SHARED = """
WITH fence AS (SELECT 1 FROM launcher_lease
               WHERE name = $1 AND token = $2 AND expires_at > now()),
written AS (
  INSERT INTO launcher_shared AS s (name, kind, key, body, token, written_at)
  SELECT $1, r.kind, r.key, r.body, $2, now()
  FROM unnest($3::text[], $4::text[], $5::text[]) AS r(kind, key, body)
  WHERE EXISTS (SELECT 1 FROM fence)
  ON CONFLICT (name, kind, key) DO UPDATE SET body = EXCLUDED.body, token = EXCLUDED.token,
    written_at = now()
  RETURNING 1),
pruned AS (
  DELETE FROM launcher_shared
  WHERE name = $1 AND kind = 'observation' AND EXISTS (SELECT 1 FROM fence)
    AND NOT (key = ANY($4::text[]))
    AND key IN (SELECT key FROM launcher_shared WHERE name = $1 AND kind = 'observation'
                ORDER BY written_at DESC, key DESC OFFSET $6))
SELECT 1 FROM written
"""
_LOAD_SHARED = "SELECT kind, key, body FROM launcher_shared WHERE name = $1"

# Members silent for a day are forgotten (a box that died and never came back).
_FORGET = "DELETE FROM launcher_members WHERE name = $1 AND heartbeat_at < now() - interval '1 day'"


class PgEngine:
    """:class:`Engine` on PostgreSQL through asyncpg (imported at first use: the default
    single-box mode needs neither the engine nor the package)."""

    def __init__(self, dsn: str, *, lease: str, holder: str, box: str, ttl: float,
                 connect_timeout: float = 5.0,
                 observations_kept: int = 2 * SHARED_OBSERVATIONS) -> None:
        self._dsn = dsn
        self._lease = lease
        self._holder = holder
        self._box = box
        self._ttl = ttl
        self._connect_timeout = connect_timeout
        self._observations_kept = observations_kept
        self._conn: asyncpg.Connection | None = None
        self._pid = os.getpid()

    @property
    def holder(self) -> str:
        return self._holder

    async def _connection(self) -> asyncpg.Connection:
        if self._conn is not None and not self._conn.is_closed():
            return self._conn
        import asyncpg

        conn = await asyncpg.connect(self._dsn, timeout=self._connect_timeout)
        try:
            async with conn.transaction():
                # One creator at a time: CREATE ... IF NOT EXISTS races on the catalog.
                await conn.execute("SELECT pg_advisory_xact_lock(4242424242)")
                await conn.execute(_SCHEMA)
            await conn.execute(_FORGET, self._lease)
        except BaseException:
            conn.terminate()
            raise
        self._conn = conn
        return conn

    async def _fetch(self, query: str, *args: Any, many: bool = False) -> Any:
        """One statement's row (``many``: rows). The errors of a database that cannot be
        asked now (refused, restarting, a dropped connection, a timeout, a bad login) become
        EngineUnavailable, and the connection is dropped; anything else is a bug."""
        import asyncpg

        try:
            conn = await self._connection()
            return await (conn.fetch(query, *args) if many else conn.fetchrow(query, *args))
        except (OSError, TimeoutError, asyncpg.PostgresError, asyncpg.InterfaceError,
                asyncpg.InternalClientError) as exc:
            self.drop()
            raise EngineUnavailable(f"{type(exc).__name__}: {exc}") from exc

    async def try_acquire(self) -> tuple[int | None, LeaseView]:
        row = await self._fetch(_ACQUIRE, self._lease, self._holder, self._box,
                                   self._ttl, self._pid)
        view = LeaseView(row["box"], row["holder"], row["token"], row["remaining"])
        return row["won"], view

    async def renew(self, token: int) -> bool:
        row = await self._fetch(_RENEW, self._lease, self._holder, token, self._ttl,
                                   self._box, self._pid)
        return row is not None and row["token"] == token

    async def release(self, token: int) -> None:
        await self._fetch(_RELEASE, self._lease, self._holder, token)

    async def membership(self) -> Membership:
        lease = await self._fetch(_LEASE, self._lease)
        rows = await self._fetch(_MEMBERS, self._lease, many=True)
        view = (LeaseView(None, None, None, None) if lease is None else
                LeaseView(lease["box"], lease["holder"], lease["token"], lease["remaining"]))
        return Membership(view, [Member(r["box"], r["holder"], r["pid"], r["age"])
                                 for r in rows], self._ttl)

    async def load_shared(self) -> list[SharedRow]:
        """The ledger's shared rows of this lease (``launcher.store.ledger.SharedRow``)."""
        rows = await self._fetch(_LOAD_SHARED, self._lease, many=True)
        return [SharedRow(r["kind"], r["key"], r["body"]) for r in rows]

    async def store_shared(self, token: int, rows: list[SharedRow]) -> bool:
        """Write ``rows`` (insert or replace) while ``token`` holds the lease; False, and
        nothing written, when it no longer does. Of the observations, the
        ``observations_kept`` written last stay (a ledger shares its newest
        ``SHARED_OBSERVATIONS``: twice that leaves room for boxes that saw different ones)."""
        if not rows:
            return True
        written = await self._fetch(_STORE_SHARED, self._lease, token,
                                    [r.kind for r in rows], [r.key for r in rows],
                                    [r.body for r in rows], self._observations_kept,
                                    many=True)
        return len(written) == len(rows)

    def drop(self) -> None:
        if self._conn is not None:
            self._conn.terminate()
            self._conn = None


class Coordinator:
    """This launcher's side of the lease: stand by until it is free, then keep it.

    ``fence`` is what the host layer checks (``FencedTransport``). ``holder`` identifies
    this process (a random id: a restarted launcher is a new holder and waits for the old
    lease to expire). ``clock`` and ``sleep`` are injected (tests: ``FakeTime``); the bound
    of one engine call is on anyio's clock.
    """

    def __init__(self, engine: Engine, timing: LeaseTiming, *, box: str,
                 clock: Clock = time.monotonic, sleep: Sleep = anyio.sleep) -> None:
        self.engine = engine
        self.timing = timing
        self.box = box
        self.clock = clock
        self.sleep = sleep
        self.fence = Fence(clock)
        self.token: int | None = None

    @staticmethod
    def new_holder() -> str:
        return uuid.uuid4().hex

    async def _bounded(self, call: Callable[[], Awaitable[Any]], budget: float) -> Any:
        """``call()`` within ``budget`` seconds: EngineUnavailable when it takes longer."""
        result: Any = None
        with anyio.move_on_after(budget) as scope:
            result = await call()
        if scope.cancelled_caught:
            self.engine.drop()  # an answer may still arrive on it: never read it
            raise EngineUnavailable(f"no answer within {budget:.1f}s")
        return result

    async def wait_active(self, on_standby: Callable[[LeaseView], None],
                          on_unreachable: Callable[[str], None]) -> Acquired:
        """Stand by until this launcher holds the lease; then the fence is granted.

        ``on_standby(view)`` is called when the holder seen changes (the first time too);
        ``on_unreachable(cause)`` when the engine cannot be asked (then again every poll)."""
        began = self.clock()
        seen: str | None = "\0"  # nobody yet: the first answer is announced
        every = self.timing.renew_every
        while True:
            sent = self.clock()
            try:
                token, view = await self._bounded(self.engine.try_acquire, every)
            except EngineUnavailable as exc:
                on_unreachable(str(exc))
                await self.sleep(every)
                continue
            if token is not None:
                self.token = token
                self.fence.grant(token, self.timing.deadline(sent))
                return Acquired(token, view.box, self.clock() - began)
            if view.holder != seen:
                seen = view.holder
                on_standby(view)
            remaining = view.remaining_s if view.remaining_s is not None else 0.0
            # Just after the holder's expiry (the engine's clock counted it; ours only
            # measures the wait), and at least every ttl/3.
            await self.sleep(min(every, max(0.05, remaining + 0.05)))

    async def keep(self, *, task_status: anyio.abc.TaskStatus[None] = anyio.TASK_STATUS_IGNORED
                   ) -> NoReturn:
        """Renew the lease every ttl/3 until it is lost; then revoke the fence and raise
        LeaseLost. A try is bounded by the time to the next one and by the deadline, so the
        loss is declared at the deadline even when the engine hangs."""
        token = self.token
        if token is None:
            raise LeaseLost("keep() before the lease was acquired")
        task_status.started()
        every = self.timing.renew_every
        next_at = self.fence.deadline - self.timing.ttl + self.timing.margin + every
        while True:
            await self.sleep(max(0.0, min(next_at, self.fence.deadline) - self.clock()))
            started = self.clock()
            if not self.fence.valid():
                self._lose(token, "no renewal succeeded before the deadline")
            budget = self.timing.try_budget(started, self.fence.deadline)
            try:
                ours = await self._bounded(lambda: self.engine.renew(token), budget)
            except EngineUnavailable as exc:
                log.warning("lease.renew_failed", token=token, error=str(exc)[:300],
                            left_s=round(self.fence.deadline - self.clock(), 3))
                next_at = started + min(1.0, every)
                continue
            if self.clock() >= self.fence.deadline:
                self._lose(token, "the renewal answered after the deadline")
            if not ours:
                self._lose(token, "the lease row shows another holder")
            self.fence.extend(self.timing.deadline(started))
            next_at = started + every

    def _lose(self, token: int, reason: str) -> NoReturn:
        self.fence.revoke()
        raise LeaseLost(f"lease lost: {reason}", token=token)

    async def release(self) -> None:
        """End the lease now (a clean stop: a standby takes over at its next poll); best
        effort, bounded, shielded. The fence is revoked first."""
        self.fence.revoke()
        if self.token is None:
            return
        with anyio.CancelScope(shield=True):
            try:
                await self._bounded(lambda: self.engine.release(self.token or 0), 5.0)
            except EngineUnavailable as exc:
                log.warning("lease.release_failed", error=str(exc)[:300])

    def aclose(self) -> None:
        self.engine.drop()


def remaining_text(seconds: float | None) -> str:
    """``7.2s`` (``expired`` when not positive, ``-`` when unknown)."""
    if seconds is None or math.isnan(seconds):
        return "-"
    return f"{seconds:.1f}s" if seconds > 0 else "expired"
