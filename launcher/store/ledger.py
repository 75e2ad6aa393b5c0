"""The attempt ledger (SQLite), for warm starts: ``Ledger(path)`` records every start-up attempt
(params, outcome, phase, the log's numbers, evidence, a bounded log tail), per fingerprint the
last params that reached ready, the Slack notifier's memory (``notify_states``) and, per
attempt, the observed cost figures under their key (table ``observations``; those other
boxes' ledgers shared in ``shared_observations``, docs/ha.md).
``fingerprint(server, host, sglang_version)`` names "the same launch" across restarts; the
warm start (``launcher.plan.first_attempt.warm_start``) reads ``last_good_entry`` by it.

Resource handling: ``Ledger`` holds one SQLite connection until ``close()``, shared by threads
under a lock. Error handling: what goes wrong with the database raises ``StateError`` naming
the path and a fix.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import sqlite3
import threading
import time
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from types import TracebackType
from typing import Any

import structlog

from launcher.config.schema import HostConfig, ServerConfig
from launcher.errors import StateError
from launcher.memory.calibration import CostGuess, KeyedObservation, ObservationKey
from launcher.memory.estimate import Estimate
from launcher.params import LaunchParams
from launcher.sglang.observed import Observed
from launcher.store.lock import make_private_dir

log = structlog.get_logger("launcher")


LEDGER_FILENAME = "ledger.sqlite3"
LOG_TAIL_LIMIT = 64 * 1024  # bytes of UTF-8 kept per attempt; the full tail is in state_dir/logs


def ledger_path(state_dir: Path) -> Path:
    """Where the ledger of ``state_dir`` lives."""
    return state_dir / LEDGER_FILENAME


# --- fingerprint -------------------------------------------------------------------------


def fingerprint(server: ServerConfig, host: HostConfig, sglang_version: str) -> str:
    """A stable name (sha256 hex, 16 digits) for "this launch" across daemon restarts.

    Contract: anything that changes how much GPU memory the server needs or has changes the
    fingerprint: the host's identity (name, address, ssh port), the GPUs (as a set), the
    model path, tp, dp, the SGLang version, the extra arguments (in order), the server's
    environment and its configured running-request / Mamba knobs. Things launcher decides or
    that do not touch memory do not: the mem_fraction_static / cuda_graph_max_bs being
    remembered, port, listen address, served name, probes and policy. The same inputs give the
    same value in every process and version of Python (canonical JSON, no ``hash()``);
    changing this recipe would only cost one cold start per server.
    """
    identity = {
        "host": {"name": host.name, "address": host.address, "port": host.port},
        "gpus": sorted(server.gpus),
        "model_path": server.model_path,
        "tp": server.tp,
        "dp": server.dp,
        "sglang_version": sglang_version,
        "extra_args": list(server.extra_args),
        "env": dict(sorted(server.env.items())),
    }
    # Configured relaunch knobs other than the two remembered ones (only when set, so older
    # fingerprints stay): a config change there must not be overridden by warm-start params.
    knobs = server.launch_params().extras()
    if knobs:
        identity["knobs"] = knobs
    canonical = json.dumps(identity, sort_keys=True, separators=(",", ":"))
    return hashlib.sha256(canonical.encode()).hexdigest()[:16]


# --- rows --------------------------------------------------------------------------------


@dataclass(frozen=True)
class AttemptRow:
    """One attempt as stored. ``outcome`` is an ``Outcome`` value, or another word the
    supervisor used ("stopped"); ``None`` (with ``ended_at``) while the attempt runs."""

    id: int
    server: str
    fingerprint: str
    attempt: int
    params: LaunchParams
    started_at: float
    ended_at: float | None
    outcome: str | None
    phase: str | None
    numbers: dict[str, Any] = field(default_factory=dict)
    evidence: list[str] = field(default_factory=list)
    log_tail: str = ""
    seconds_to_ready: float | None = None

    def as_dict(self) -> dict[str, Any]:
        """JSON-ready; ``params`` as in the supervisor's events."""
        return {
            "id": self.id,
            "server": self.server,
            "fingerprint": self.fingerprint,
            "attempt": self.attempt,
            "params": self.params.as_dict(),
            "started_at": self.started_at,
            "ended_at": self.ended_at,
            "outcome": self.outcome,
            "phase": self.phase,
            "numbers": dict(self.numbers),
            "evidence": list(self.evidence),
            "log_tail": self.log_tail,
            "seconds_to_ready": self.seconds_to_ready,
        }


@dataclass(frozen=True)
class LastGood:
    """The last params that brought a fingerprint to ready, when, and in how many attempts."""

    fingerprint: str
    server: str
    params: LaunchParams
    updated_at: float
    attempts: int


@dataclass(frozen=True)
class NotifyState:
    """The Slack notifier's memory of one (server, kind) of message (``launcher.hooks.slack``).

    ``last_sent``: wall-clock time it was last posted (None: never); ``suppressed``: repeats
    held back since then; ``firing_since``: when its alert began firing (None: not firing);
    ``announced``: the firing alert was posted (a resolution is posted only then);
    ``payload``: the last posted message (``text``, ``blocks``), repeated by reminders.
    """

    server: str
    kind: str
    last_sent: float | None = None
    suppressed: int = 0
    firing_since: float | None = None
    announced: bool = False
    payload: dict[str, Any] = field(default_factory=dict)


@dataclass(frozen=True)
class GiveUp:
    """A server's last give-up: the newest attempt number it had then (``attempt``; a later
    attempt makes it old news), how many attempts that supervision made (0: it gave up
    before launching, in preflight), why, and when."""

    server: str
    attempt: int
    attempts: int
    reason: str
    at: float


@dataclass(frozen=True)
class SharedRow:
    """One row of the ledger's shared parts (``Ledger.shared_rows``): what a new active box
    needs of the old one's ledger (docs/ha.md). ``kind`` is ``last_good`` (``key``: the
    fingerprint) or ``notify_state`` (``key``: ``server/kind``); ``body`` is the row as
    canonical JSON, so equal rows compare equal as text."""

    kind: str
    key: str
    body: str


SHARED_KINDS = ("last_good", "notify_state", "observation")
# The newest observations a ledger shares: what calibration reads (``Ledger.observations``'
# default limit), so a new active box calibrates from what the old one would have.
SHARED_OBSERVATIONS = 500


@dataclass(frozen=True)
class ObservationContext:
    """What the recorder files a server's observations under: its key (the speculative
    settings are taken from the attempt's log when it shows them), the model and tp, and the
    server's *uncorrected* estimate: each attempt is stored with that estimate's guess at
    the graph bs it ran with (``launcher.memory.calibration.guess_of``), unless its
    ``attempt.started`` event carried a guess of its own."""

    key: ObservationKey
    model: str = ""
    tp: int = 1
    estimate: Estimate | None = None


@dataclass(frozen=True)
class ObservationRow:
    """One attempt's observed costs as stored (table ``observations``), keyed to its row of
    ``attempts`` by ``attempt_id``. ``estimate`` is the estimator's guess the attempt started
    from (None when it was recorded without one)."""

    attempt_id: int
    server: str
    attempt: int
    key: ObservationKey
    model: str
    tp: int
    outcome: str | None
    params: LaunchParams
    observed: Observed
    estimate: CostGuess | None
    recorded_at: float
    origin: str = ""  # "" for this box's own; else the ledger that observed it (shared)

    @property
    def keyed(self) -> KeyedObservation:
        """The row as ``launcher.memory.calibration`` takes it."""
        return KeyedObservation(self.key, self.observed, self.estimate, self.outcome,
                                self.recorded_at)


# --- the ledger --------------------------------------------------------------------------

# Step i takes a database from user_version i to i + 1, in one transaction. Never edit a
# released step: append a new one.
_MIGRATIONS: tuple[tuple[str, ...], ...] = (
    (
        """CREATE TABLE attempts (
            id INTEGER PRIMARY KEY,
            server TEXT NOT NULL,
            fingerprint TEXT NOT NULL,
            attempt INTEGER NOT NULL,
            mem_fraction_static REAL,
            cuda_graph_max_bs INTEGER,
            started_at REAL NOT NULL,
            ended_at REAL,
            outcome TEXT,
            phase TEXT,
            numbers TEXT NOT NULL DEFAULT '{}',
            evidence TEXT NOT NULL DEFAULT '[]',
            log_tail TEXT NOT NULL DEFAULT '',
            seconds_to_ready REAL,
            UNIQUE (server, attempt)
        )""",
        "CREATE INDEX attempts_by_time ON attempts (started_at, id)",
        """CREATE TABLE last_good (
            fingerprint TEXT PRIMARY KEY,
            server TEXT NOT NULL,
            mem_fraction_static REAL,
            cuda_graph_max_bs INTEGER,
            updated_at REAL NOT NULL,
            attempts INTEGER NOT NULL
        )""",
    ),
    (
        # LaunchParams beyond the fraction and graph bs (running requests, Mamba knobs, env a
        # relaunch set), as the JSON of ``LaunchParams.extras()``.
        "ALTER TABLE attempts ADD COLUMN params_extra TEXT NOT NULL DEFAULT '{}'",
        "ALTER TABLE last_good ADD COLUMN params_extra TEXT NOT NULL DEFAULT '{}'",
    ),
    (
        # The Slack notifier's dedupe and alert state (NotifyState), so a restarted launcher
        # neither repeats what it just posted nor forgets what still fires.
        """CREATE TABLE notify_state (
            server TEXT NOT NULL,
            kind TEXT NOT NULL,
            last_sent REAL,
            suppressed INTEGER NOT NULL DEFAULT 0,
            firing_since REAL,
            announced INTEGER NOT NULL DEFAULT 0,
            payload TEXT NOT NULL DEFAULT '{}',
            PRIMARY KEY (server, kind)
        )""",
    ),
    (
        # Observed cost figures per attempt (launcher.sglang.observed.Observed as JSON) under
        # the key calibration groups them by; ``estimate`` is a CostGuess as JSON ('{}': none).
        # Empty strings mean "not known" so that the key columns compare with '='.
        """CREATE TABLE observations (
            attempt_id INTEGER PRIMARY KEY REFERENCES attempts (id),
            server TEXT NOT NULL,
            attempt INTEGER NOT NULL,
            architecture TEXT NOT NULL DEFAULT '',
            gpu_model TEXT NOT NULL DEFAULT '',
            sglang_version TEXT NOT NULL DEFAULT '',
            speculative TEXT NOT NULL DEFAULT '',
            model TEXT NOT NULL DEFAULT '',
            tp INTEGER NOT NULL DEFAULT 1,
            outcome TEXT,
            mem_fraction_static REAL,
            cuda_graph_max_bs INTEGER,
            params_extra TEXT NOT NULL DEFAULT '{}',
            figures TEXT NOT NULL DEFAULT '{}',
            estimate TEXT NOT NULL DEFAULT '{}',
            recorded_at REAL NOT NULL
        )""",
        """CREATE INDEX observations_by_key ON observations
            (architecture, gpu_model, sglang_version, speculative, recorded_at)""",
    ),
    (
        # This ledger's name among the boxes that share a coordination database, and the
        # observations other boxes' ledgers shared (docs/ha.md), keyed by their ledger and
        # their attempt_id there: they have no row in this ledger's attempts.
        "CREATE TABLE ledger_meta (name TEXT PRIMARY KEY, value TEXT NOT NULL)",
        "INSERT INTO ledger_meta (name, value) VALUES ('origin', lower(hex(randomblob(8))))",
        """CREATE TABLE shared_observations (
            origin TEXT NOT NULL,
            origin_id INTEGER NOT NULL,
            server TEXT NOT NULL,
            attempt INTEGER NOT NULL,
            architecture TEXT NOT NULL DEFAULT '',
            gpu_model TEXT NOT NULL DEFAULT '',
            sglang_version TEXT NOT NULL DEFAULT '',
            speculative TEXT NOT NULL DEFAULT '',
            model TEXT NOT NULL DEFAULT '',
            tp INTEGER NOT NULL DEFAULT 1,
            outcome TEXT,
            mem_fraction_static REAL,
            cuda_graph_max_bs INTEGER,
            params_extra TEXT NOT NULL DEFAULT '{}',
            figures TEXT NOT NULL DEFAULT '{}',
            estimate TEXT NOT NULL DEFAULT '{}',
            recorded_at REAL NOT NULL,
            PRIMARY KEY (origin, origin_id)
        )""",
        """CREATE INDEX shared_observations_by_key ON shared_observations
            (architecture, gpu_model, sglang_version, speculative, recorded_at)""",
        # One start-up seen by two boxes (the new active adopted it) counts once: by attempt.
        "CREATE INDEX shared_observations_by_attempt ON shared_observations (server, attempt)",
        "CREATE INDEX observations_by_attempt ON observations (server, attempt)",
    ),
    (
        # Each server's last give-up (GiveUp): one in preflight leaves no attempt behind, so
        # `launcher status` reads it here.
        """CREATE TABLE give_ups (
            server TEXT PRIMARY KEY,
            attempt INTEGER NOT NULL,
            attempts INTEGER NOT NULL,
            reason TEXT NOT NULL,
            at REAL NOT NULL
        )""",
    ),
)
SCHEMA_VERSION = len(_MIGRATIONS)

# An observation's columns after its id, in the order of both observation tables (and of the
# body of a shared "observation" row).
_OBSERVATION_COLUMNS = (
    "server", "attempt", "architecture", "gpu_model", "sglang_version", "speculative", "model",
    "tp", "outcome", "mem_fraction_static", "cuda_graph_max_bs", "params_extra", "figures",
    "estimate", "recorded_at",
)
_JSON_COLUMNS = ("params_extra", "figures", "estimate")
# Every observation this ledger knows, as (origin, id, *_OBSERVATION_COLUMNS); origin '' is
# this ledger's own. A server's attempt number names one start-up across the boxes of a lease
# (the run directory numbers them), so a start-up two boxes observed (one launched it, the
# next adopted it) counts once: this box's own copy, else the copy recorded last.
_ALL_OBSERVATIONS = f"""
SELECT '' AS origin, attempt_id AS id, {", ".join(_OBSERVATION_COLUMNS)} FROM observations
UNION ALL
SELECT s.origin, s.origin_id, {", ".join("s." + n for n in _OBSERVATION_COLUMNS)}
FROM shared_observations AS s
WHERE NOT EXISTS (SELECT 1 FROM observations AS o
                  WHERE o.server = s.server AND o.attempt = s.attempt)
  AND NOT EXISTS (SELECT 1 FROM shared_observations AS t
                  WHERE t.server = s.server AND t.attempt = s.attempt
                    AND (t.recorded_at > s.recorded_at
                         OR (t.recorded_at = s.recorded_at AND t.origin > s.origin)))
"""

_ROW_COLUMNS = (
    "id, server, fingerprint, attempt, mem_fraction_static, cuda_graph_max_bs, started_at, "
    "ended_at, outcome, phase, numbers, evidence, log_tail, seconds_to_ready, params_extra"
)


class Ledger:
    """The attempt ledger: one SQLite file, safe to share between this process's threads.

    Durability: WAL journal, ``synchronous=NORMAL``. A committed write survives the process
    being killed at any point (it is in the WAL, which the next open replays); an OS crash
    or power loss can lose the last few commits but never corrupts the file. That is the
    right trade here: the ledger is advice (history, warm-start params), losing its last
    second costs at most one extra attempt, and FULL would fsync on every event.
    Every write is one ``BEGIN IMMEDIATE`` transaction.

    Schema: versioned by ``PRAGMA user_version``; opening migrates an older file step by step
    and refuses a newer one. Writes are keyed by (server, attempt) and are upserts, so a
    restarted daemon that repeats or continues an attempt number never crashes.

    Error handling: StateError (naming the file and a fix) for a file that is not a
    database, a schema from a newer launcher, any SQLite failure, and use after ``close()``.
    """

    def __init__(self, path: Path) -> None:
        self.path = path
        self._lock = threading.RLock()
        make_private_dir(path.parent)
        try:
            # Created 0600 before SQLite opens it: log tails may hold paths and user names.
            # SQLite gives the -wal and -shm files the database's permissions.
            os.close(os.open(path, os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW, 0o600))
            conn = sqlite3.connect(
                path, timeout=5.0, isolation_level=None, check_same_thread=False
            )
        except (OSError, sqlite3.Error) as exc:
            raise StateError(
                f"cannot open the attempt ledger {path}: {exc}",
                remedy="fix the permissions of the state directory or use another state_dir",
            ) from exc
        self._conn: sqlite3.Connection | None = conn
        try:
            mode = conn.execute("PRAGMA journal_mode=WAL").fetchone()[0]
            conn.execute("PRAGMA synchronous=NORMAL")
            if str(mode).lower() != "wal":  # e.g. a file system without shared memory
                log.warning("ledger.wal_unavailable", path=str(path), journal_mode=mode)
            self._migrate(conn)
        except sqlite3.DatabaseError as exc:
            conn.close()
            self._conn = None
            raise StateError(
                f"the attempt ledger {path} cannot be read: {exc}",
                remedy=f"move {path} aside; launcher then starts a new, empty ledger",
            ) from exc
        except BaseException:
            conn.close()
            self._conn = None
            raise

    # -- lifecycle ----------------------------------------------------------------------

    def close(self) -> None:
        """Close the connection (idempotent). Later calls raise StateError."""
        with self._lock:
            conn, self._conn = self._conn, None
            if conn is not None:
                conn.close()

    def __enter__(self) -> Ledger:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.close()

    @property
    def schema_version(self) -> int:
        with self._reading() as conn:
            version: int = conn.execute("PRAGMA user_version").fetchone()[0]
            return version

    # -- writes -------------------------------------------------------------------------

    def attempt_started(
        self, server: str, fingerprint: str, attempt: int, params: LaunchParams,
        started_at: float,
    ) -> None:
        """Record that ``attempt`` of ``server`` started. Repeating an attempt number (a
        restarted daemon relaunching it) starts that row afresh: its result is cleared."""
        with self._writing("attempt_started") as conn:
            conn.execute(
                """INSERT INTO attempts (server, fingerprint, attempt, mem_fraction_static,
                       cuda_graph_max_bs, started_at, params_extra)
                   VALUES (?, ?, ?, ?, ?, ?, ?)
                   ON CONFLICT (server, attempt) DO UPDATE SET
                       fingerprint = excluded.fingerprint,
                       mem_fraction_static = excluded.mem_fraction_static,
                       cuda_graph_max_bs = excluded.cuda_graph_max_bs,
                       params_extra = excluded.params_extra,
                       started_at = excluded.started_at,
                       ended_at = NULL, outcome = NULL, phase = NULL, numbers = '{}',
                       evidence = '[]', log_tail = '', seconds_to_ready = NULL""",
                (server, fingerprint, attempt, params.mem_fraction_static,
                 params.cuda_graph_max_bs, started_at, _to_json(params.extras())),
            )
            # The row starts afresh: so does what it observed.
            conn.execute(
                """DELETE FROM observations WHERE attempt_id =
                       (SELECT id FROM attempts WHERE server = ? AND attempt = ?)""",
                (server, attempt),
            )

    def attempt_adopted(
        self, server: str, fingerprint: str, attempt: int, params: LaunchParams, at: float
    ) -> None:
        """Record that a running ``attempt`` was adopted: keep its row if we have one (the
        daemon that launched it wrote it), else create one starting ``at``."""
        with self._writing("attempt_adopted") as conn:
            conn.execute(
                """INSERT INTO attempts (server, fingerprint, attempt, mem_fraction_static,
                       cuda_graph_max_bs, started_at, params_extra)
                   VALUES (?, ?, ?, ?, ?, ?, ?)
                   ON CONFLICT (server, attempt) DO NOTHING""",
                (server, fingerprint, attempt, params.mem_fraction_static,
                 params.cuda_graph_max_bs, at, _to_json(params.extras())),
            )

    def attempt_finished(
        self,
        server: str,
        attempt: int,
        *,
        outcome: str,
        phase: str | None,
        numbers: Mapping[str, Any],
        evidence: Sequence[str],
        log_tail: str,
        ended_at: float,
        fingerprint: str = "",
        params: LaunchParams | None = None,
        started_at: float | None = None,
    ) -> None:
        """Record how ``attempt`` of ``server`` ended (again if it ends twice, e.g. ready and
        later failed: the newest result wins, ``seconds_to_ready`` stays).

        ``log_tail`` keeps its last ``LOG_TAIL_LIMIT`` bytes, from a line start.
        ``fingerprint``/``params``/``started_at`` are only used when no row exists yet
        (an attempt whose start was never recorded).
        """
        p = params or LaunchParams()
        with self._writing("attempt_finished") as conn:
            conn.execute(
                """INSERT INTO attempts (server, fingerprint, attempt, mem_fraction_static,
                       cuda_graph_max_bs, started_at, ended_at, outcome, phase, numbers,
                       evidence, log_tail, params_extra)
                   VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)
                   ON CONFLICT (server, attempt) DO UPDATE SET
                       ended_at = excluded.ended_at, outcome = excluded.outcome,
                       phase = excluded.phase, numbers = excluded.numbers,
                       evidence = excluded.evidence, log_tail = excluded.log_tail""",
                (server, fingerprint, attempt, p.mem_fraction_static, p.cuda_graph_max_bs,
                 ended_at if started_at is None else started_at, ended_at, str(outcome),
                 None if phase is None else str(phase), _to_json(dict(numbers)),
                 _to_json([str(line) for line in evidence]), _bound_tail(log_tail),
                 _to_json(p.extras())),
            )

    def attempt_stopped(self, server: str, attempt: int, *, ended_at: float) -> bool:
        """Record that ``attempt`` of ``server`` was stopped on request (`launcher down`):
        its row's outcome becomes ``stopped`` (the word ``up --stop-on-exit`` records), ended
        at ``ended_at``; what the row knew of the attempt (phase, numbers, evidence, time to
        ready) stays. Returns False, recording nothing, when the ledger has no such row."""
        with self._writing("attempt_stopped") as conn:
            return conn.execute(
                """UPDATE attempts SET outcome = 'stopped', ended_at = ?
                   WHERE server = ? AND attempt = ?""",
                (ended_at, server, attempt),
            ).rowcount > 0

    def server_ready(
        self, server: str, fingerprint: str, params: LaunchParams, seconds: float | None,
        attempt: int, *, at: float | None = None, attempts: int | None = None,
    ) -> None:
        """Record that attempt number ``attempt`` of ``server`` (the host's number, as in
        ``attempt_started``) became ready with ``params`` after ``seconds``: that attempt's
        row is marked ready and ``params`` become the last good params of ``fingerprint``
        (reached in ``attempts`` attempts, default ``attempt``). Both in one transaction.

        ``seconds`` None means "not measured by us" (an adopted attempt): a time to ready the
        row already has is kept, else it is taken from the row's own start (the daemon that
        launched it wrote that), else it stays unknown. A row that is already ready keeps
        when it became ready.
        """
        now = time.time() if at is None else at
        with self._writing("server_ready") as conn:
            conn.execute(
                """INSERT INTO attempts (server, fingerprint, attempt, mem_fraction_static,
                       cuda_graph_max_bs, started_at, ended_at, outcome, phase,
                       seconds_to_ready, params_extra)
                   VALUES (?, ?, ?, ?, ?, ?, ?, 'ready', 'ready', ?, ?)
                   ON CONFLICT (server, attempt) DO UPDATE SET
                       ended_at = CASE
                           WHEN excluded.seconds_to_ready IS NULL AND attempts.outcome = 'ready'
                           THEN attempts.ended_at ELSE excluded.ended_at END,
                       outcome = 'ready', phase = 'ready',
                       seconds_to_ready = COALESCE(
                           excluded.seconds_to_ready, attempts.seconds_to_ready,
                           excluded.ended_at - attempts.started_at),
                       params_extra = excluded.params_extra""",
                (server, fingerprint, attempt, params.mem_fraction_static,
                 params.cuda_graph_max_bs, now - (seconds or 0.0), now, seconds,
                 _to_json(params.extras())),
            )
            conn.execute(
                """INSERT INTO last_good (fingerprint, server, mem_fraction_static,
                       cuda_graph_max_bs, updated_at, attempts, params_extra)
                   VALUES (?, ?, ?, ?, ?, ?, ?)
                   ON CONFLICT (fingerprint) DO UPDATE SET
                       server = excluded.server,
                       mem_fraction_static = excluded.mem_fraction_static,
                       cuda_graph_max_bs = excluded.cuda_graph_max_bs,
                       params_extra = excluded.params_extra,
                       updated_at = excluded.updated_at, attempts = excluded.attempts""",
                (fingerprint, server, params.mem_fraction_static, params.cuda_graph_max_bs,
                 now, attempt if attempts is None else attempts, _to_json(params.extras())),
            )

    def server_gave_up(self, give_up: GiveUp) -> None:
        """Record ``give_up`` as its server's last give-up (replacing the one before)."""
        with self._writing("server_gave_up") as conn:
            conn.execute(
                """INSERT INTO give_ups (server, attempt, attempts, reason, at)
                   VALUES (?, ?, ?, ?, ?)
                   ON CONFLICT (server) DO UPDATE SET attempt = excluded.attempt,
                       attempts = excluded.attempts, reason = excluded.reason,
                       at = excluded.at""",
                (give_up.server, give_up.attempt, give_up.attempts, give_up.reason,
                 give_up.at),
            )

    def last_give_up(self, server: str) -> GiveUp | None:
        """``server``'s last give-up, or None."""
        with self._reading() as conn:
            row = conn.execute(
                "SELECT server, attempt, attempts, reason, at FROM give_ups WHERE server = ?",
                (server,)).fetchone()
        return None if row is None else GiveUp(*row)

    def save_notify_state(self, state: NotifyState) -> None:
        """Insert or replace the notifier's state of (``state.server``, ``state.kind``)."""
        with self._writing("save_notify_state") as conn:
            conn.execute(
                """INSERT INTO notify_state (server, kind, last_sent, suppressed, firing_since,
                       announced, payload) VALUES (?, ?, ?, ?, ?, ?, ?)
                   ON CONFLICT (server, kind) DO UPDATE SET
                       last_sent = excluded.last_sent, suppressed = excluded.suppressed,
                       firing_since = excluded.firing_since, announced = excluded.announced,
                       payload = excluded.payload""",
                (state.server, state.kind, state.last_sent, state.suppressed,
                 state.firing_since, int(state.announced), _to_json(state.payload)),
            )

    def record_observation(
        self,
        server: str,
        attempt: int,
        key: ObservationKey,
        observed: Observed,
        *,
        outcome: str | None,
        params: LaunchParams,
        estimate: CostGuess | None = None,
        model: str = "",
        tp: int = 1,
        at: float,
    ) -> bool:
        """Record (or replace) what ``attempt`` of ``server`` observed, under ``key``.

        The attempt's row must exist (``attempt_started`` / ``attempt_finished`` first): the
        observation is keyed to it and goes with it. Returns False, recording nothing, when
        there is no such row.
        """
        with self._writing("record_observation") as conn:
            row = conn.execute(
                "SELECT id FROM attempts WHERE server = ? AND attempt = ?", (server, attempt)
            ).fetchone()
            if row is None:
                return False
            conn.execute(
                """INSERT INTO observations (attempt_id, server, attempt, architecture,
                       gpu_model, sglang_version, speculative, model, tp, outcome,
                       mem_fraction_static, cuda_graph_max_bs, params_extra, figures,
                       estimate, recorded_at)
                   VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)
                   ON CONFLICT (attempt_id) DO UPDATE SET
                       architecture = excluded.architecture, gpu_model = excluded.gpu_model,
                       sglang_version = excluded.sglang_version,
                       speculative = excluded.speculative, model = excluded.model,
                       tp = excluded.tp, outcome = excluded.outcome,
                       mem_fraction_static = excluded.mem_fraction_static,
                       cuda_graph_max_bs = excluded.cuda_graph_max_bs,
                       params_extra = excluded.params_extra, figures = excluded.figures,
                       estimate = CASE WHEN excluded.estimate = '{}'
                           THEN observations.estimate ELSE excluded.estimate END,
                       recorded_at = excluded.recorded_at""",
                (row[0], server, attempt, key.architecture, key.gpu_model, key.sglang_version,
                 key.speculative, model, tp, outcome, params.mem_fraction_static,
                 params.cuda_graph_max_bs, _to_json(params.extras()),
                 _to_json(observed.as_dict()),
                 _to_json(estimate.as_dict() if estimate is not None else {}), at),
            )
            return True

    # -- reads --------------------------------------------------------------------------

    def notify_states(self) -> list[NotifyState]:
        """Every (server, kind) the notifier has saved, in server and kind order."""
        with self._reading() as conn:
            rows = conn.execute(
                """SELECT server, kind, last_sent, suppressed, firing_since, announced, payload
                   FROM notify_state ORDER BY server, kind"""
            ).fetchall()
        out = []
        for row in rows:
            try:
                payload = json.loads(row[6])
            except ValueError:
                payload = {}
            out.append(NotifyState(row[0], row[1], row[2], int(row[3]), row[4], bool(row[5]),
                                   payload if isinstance(payload, dict) else {}))
        return out


    def observations(
        self,
        *,
        architecture: str | None = None,
        gpu_model: str | None = None,
        limit: int = 500,
    ) -> list[ObservationRow]:
        """Up to ``limit`` observations, newest first; only those of ``architecture`` and
        ``gpu_model`` when given (``launcher.memory.calibration.select`` narrows further)."""
        where, args = [], []
        if architecture is not None:
            where.append("architecture = ?")
            args.append(architecture)
        if gpu_model is not None:
            where.append("gpu_model = ?")
            args.append(gpu_model)
        clause = f"WHERE {' AND '.join(where)} " if where else ""
        with self._reading() as conn:
            rows = conn.execute(
                f"SELECT * FROM ({_ALL_OBSERVATIONS}) {clause}"
                "ORDER BY recorded_at DESC, origin, id DESC LIMIT ?",
                (*args, max(0, limit)),
            ).fetchall()
        return [
            ObservationRow(
                attempt_id=r[1], server=r[2], attempt=r[3],
                key=ObservationKey(r[4], r[5], r[6], r[7]), model=r[8], tp=r[9], outcome=r[10],
                params=LaunchParams.from_extras(r[11], r[12], json.loads(r[13])),
                observed=Observed.from_dict(json.loads(r[14])),
                estimate=CostGuess.from_dict(json.loads(r[15])), recorded_at=r[16],
                origin=r[0],
            )
            for r in rows
        ]

    def origin(self) -> str:
        """This ledger's name in the keys of the observations it shares (random, made with
        the ledger)."""
        with self._reading() as conn:
            return str(conn.execute(
                "SELECT value FROM ledger_meta WHERE name = 'origin'").fetchone()[0])

    # -- the shared parts (docs/ha.md) ---------------------------------------------------

    def shared_rows(self) -> list[SharedRow]:
        """Every ``last_good`` and ``notify_state`` row and the newest
        ``SHARED_OBSERVATIONS`` observations (this box's and those it was given), as
        ``SharedRow``: what the active box mirrors into the coordination database. An
        observation's key is ``<ledger origin>/<attempt_id there>``, so it stays one row
        however many boxes pass it on."""
        origin = self.origin()
        with self._reading() as conn:
            observed = [
                (r[0] or origin, *r[1:]) for r in conn.execute(
                    f"SELECT * FROM ({_ALL_OBSERVATIONS}) "
                    "ORDER BY recorded_at DESC, origin, id DESC LIMIT ?",
                    (SHARED_OBSERVATIONS,)).fetchall()]
            good = conn.execute(
                """SELECT fingerprint, server, mem_fraction_static, cuda_graph_max_bs,
                          updated_at, attempts, params_extra FROM last_good""").fetchall()
            notify = conn.execute(
                """SELECT server, kind, last_sent, suppressed, firing_since, announced, payload
                   FROM notify_state""").fetchall()
        rows = [SharedRow("last_good", r[0], _to_json({
            "server": r[1], "mem_fraction_static": r[2], "cuda_graph_max_bs": r[3],
            "updated_at": r[4], "attempts": r[5], "params_extra": json.loads(r[6])}))
            for r in good]
        rows += [SharedRow("notify_state", f"{r[0]}/{r[1]}", _to_json({
            "server": r[0], "kind": r[1], "last_sent": r[2], "suppressed": r[3],
            "firing_since": r[4], "announced": bool(r[5]), "payload": json.loads(r[6])}))
            for r in notify]
        rows += [SharedRow("observation", f"{r[0]}/{r[1]}", _to_json({
            name: json.loads(value) if name in _JSON_COLUMNS else value
            for name, value in zip(_OBSERVATION_COLUMNS, r[2:], strict=True)}))
            for r in observed]
        return rows

    def merge_shared(self, rows: Sequence[SharedRow]) -> int:
        """Take ``rows`` (read from the coordination database at a takeover) into this
        ledger, in one transaction: a ``last_good`` row replaces this ledger's when it is
        newer (``updated_at``), a ``notify_state`` row replaces this ledger's (the last active
        box's memory is the newest), an ``observation`` of another ledger is added (or
        replaces that ledger's earlier copy of it; this ledger's own come back unchanged and
        are left alone). Rows that cannot be read (another launcher's newer format) are
        skipped. Returns how many rows changed this ledger."""
        taken = 0
        origin = self.origin()
        with self._writing("merge_shared") as conn:
            for row in rows:
                try:
                    body = json.loads(row.body)
                    if row.kind == "observation":
                        source, _, number = row.key.rpartition("/")
                        if not source or source == origin:
                            continue
                        args: tuple[Any, ...] = (
                            source, int(number), *_shared_observation(body))
                        statement = _MERGE_OBSERVATION
                    elif row.kind == "last_good":
                        args = (
                            row.key, str(body["server"]), body["mem_fraction_static"],
                            body["cuda_graph_max_bs"], float(body["updated_at"]),
                            int(body["attempts"]), _to_json(dict(body["params_extra"])))
                        statement = """INSERT INTO last_good (fingerprint, server,
                                mem_fraction_static, cuda_graph_max_bs, updated_at, attempts,
                                params_extra) VALUES (?, ?, ?, ?, ?, ?, ?)
                            ON CONFLICT (fingerprint) DO UPDATE SET
                                server = excluded.server,
                                mem_fraction_static = excluded.mem_fraction_static,
                                cuda_graph_max_bs = excluded.cuda_graph_max_bs,
                                updated_at = excluded.updated_at,
                                attempts = excluded.attempts,
                                params_extra = excluded.params_extra
                            WHERE excluded.updated_at > last_good.updated_at"""
                    elif row.kind == "notify_state":
                        args = (str(body["server"]), str(body["kind"]), body["last_sent"],
                                int(body["suppressed"]), body["firing_since"],
                                int(bool(body["announced"])), _to_json(dict(body["payload"])))
                        statement = """INSERT INTO notify_state (server, kind, last_sent,
                                suppressed, firing_since, announced, payload)
                            VALUES (?, ?, ?, ?, ?, ?, ?)
                            ON CONFLICT (server, kind) DO UPDATE SET
                                last_sent = excluded.last_sent,
                                suppressed = excluded.suppressed,
                                firing_since = excluded.firing_since,
                                announced = excluded.announced, payload = excluded.payload"""
                    else:
                        continue
                except (ValueError, KeyError, TypeError) as exc:
                    log.warning("ledger.shared_row_skipped", kind=row.kind, key=row.key[:80],
                                error=repr(exc)[:200])
                    continue
                taken += max(0, conn.execute(statement, args).rowcount)
        return taken

    # -- reads of attempts ---------------------------------------------------------------

    def last_good(self, fingerprint: str) -> LaunchParams | None:
        """The last params that reached ready for ``fingerprint``, or None."""
        entry = self.last_good_entry(fingerprint)
        return None if entry is None else entry.params

    def last_good_entry(self, fingerprint: str) -> LastGood | None:
        """``last_good`` with when it was recorded and by which server."""
        with self._reading() as conn:
            row = conn.execute(
                """SELECT fingerprint, server, mem_fraction_static, cuda_graph_max_bs,
                          updated_at, attempts, params_extra
                   FROM last_good WHERE fingerprint = ?""",
                (fingerprint,),
            ).fetchone()
        if row is None:
            return None
        params = LaunchParams.from_extras(row[2], row[3], json.loads(row[6]))
        return LastGood(row[0], row[1], params, row[4], row[5])

    def history(self, server: str | None = None, limit: int = 100) -> list[AttemptRow]:
        """Up to ``limit`` attempts (of ``server``, or of all servers), newest start first."""
        where, args = ("WHERE server = ?", (server,)) if server is not None else ("", ())
        with self._reading() as conn:
            rows = conn.execute(
                f"SELECT {_ROW_COLUMNS} FROM attempts {where} "
                "ORDER BY started_at DESC, id DESC LIMIT ?",
                (*args, max(0, limit)),
            ).fetchall()
        return [_attempt_row(row) for row in rows]

    # -- internals ----------------------------------------------------------------------

    def _migrate(self, conn: sqlite3.Connection) -> None:
        found: int = conn.execute("PRAGMA user_version").fetchone()[0]
        if found > SCHEMA_VERSION:
            raise StateError(
                f"the attempt ledger {self.path} has schema version {found}, newer than this "
                f"launcher's {SCHEMA_VERSION}",
                remedy="run the newer launcher, or move the file aside to start a new ledger",
            )
        migrated_from: int | None = None  # the version this process found, if it migrated
        while found < SCHEMA_VERSION:
            # IMMEDIATE takes the write lock first, so two processes never run one step twice.
            conn.execute("BEGIN IMMEDIATE")
            try:
                version: int = conn.execute("PRAGMA user_version").fetchone()[0]
                if version < SCHEMA_VERSION:
                    for statement in _MIGRATIONS[version]:
                        conn.execute(statement)
                    conn.execute(f"PRAGMA user_version = {version + 1}")
                conn.execute("COMMIT")
            except BaseException:
                if conn.in_transaction:
                    conn.execute("ROLLBACK")
                raise
            if version < SCHEMA_VERSION and migrated_from is None:
                migrated_from = version
            found = conn.execute("PRAGMA user_version").fetchone()[0]
        if migrated_from == 0:  # a new file: created, nothing was migrated
            log.info("ledger.created", path=str(self.path), schema_version=found)
        elif migrated_from is not None:  # one line for all the steps, not one per step
            log.info("ledger.migrated", path=str(self.path), from_version=migrated_from,
                     to_version=found)

    @contextlib.contextmanager
    def _reading(self) -> Iterator[sqlite3.Connection]:
        with self._lock:
            conn = self._open_connection()
            try:
                yield conn
            except sqlite3.Error as exc:
                raise self._failure("reading", exc) from exc

    @contextlib.contextmanager
    def _writing(self, what: str) -> Iterator[sqlite3.Connection]:
        with self._lock:
            conn = self._open_connection()
            try:
                conn.execute("BEGIN IMMEDIATE")
                try:
                    yield conn
                    conn.execute("COMMIT")
                except BaseException:
                    # SQLite rolls some failures back itself (SQLITE_FULL, ...).
                    if conn.in_transaction:
                        conn.execute("ROLLBACK")
                    raise
            except sqlite3.Error as exc:
                raise self._failure(what, exc) from exc

    def _open_connection(self) -> sqlite3.Connection:
        if self._conn is None:
            raise StateError(f"the attempt ledger {self.path} is closed")
        return self._conn

    def _failure(self, what: str, exc: sqlite3.Error) -> StateError:
        return StateError(
            f"attempt ledger {self.path}: {what} failed: {exc}",
            remedy="check the disk space and permissions of the state directory; move the "
            "file aside to start a new ledger",
        )


_MERGE_OBSERVATION = (
    f"INSERT INTO shared_observations (origin, origin_id, {', '.join(_OBSERVATION_COLUMNS)}) "
    f"VALUES ({', '.join('?' * (len(_OBSERVATION_COLUMNS) + 2))}) "
    "ON CONFLICT (origin, origin_id) DO UPDATE SET "
    + ", ".join(f"{n} = excluded.{n}" for n in _OBSERVATION_COLUMNS)
    + " WHERE "
    + " OR ".join(f"excluded.{n} IS NOT shared_observations.{n}" for n in _OBSERVATION_COLUMNS)
)


def _number(value: object, *, whole: bool = False, none: bool = False) -> object:
    if value is None and none:
        return None
    if isinstance(value, bool) or not isinstance(value, int | float) or (
            whole and not isinstance(value, int)):
        raise TypeError(f"not a {'whole ' if whole else ''}number: {value!r}")
    return value


def _shared_observation(body: Mapping[str, Any]) -> tuple[Any, ...]:
    """An ``observation`` row's body as the values of ``_OBSERVATION_COLUMNS``, each checked
    for the type the ledger stores (another box's row feeds calibration's arithmetic).
    Raises ValueError, KeyError or TypeError for a body that is not one."""
    text = {n: body[n] for n in ("server", "architecture", "gpu_model", "sglang_version",
                                 "speculative", "model")}
    if not all(isinstance(v, str) for v in text.values()) or not isinstance(
            body["outcome"], str | None):
        raise TypeError("a text column is not text")
    extra, figures, estimate = (dict(body[n]) for n in _JSON_COLUMNS)
    for name, value in figures.items():
        if name == "graph_mem_gib":
            for passed in dict(value).values():
                _number(passed)
        else:
            _number(value, none=True)
    LaunchParams.from_extras(body["mem_fraction_static"], body["cuda_graph_max_bs"], extra)
    CostGuess.from_dict(estimate)
    return (
        text["server"], _number(body["attempt"], whole=True), text["architecture"],
        text["gpu_model"], text["sglang_version"], text["speculative"], text["model"],
        _number(body["tp"], whole=True), body["outcome"],
        _number(body["mem_fraction_static"], none=True),
        _number(body["cuda_graph_max_bs"], whole=True, none=True),
        _to_json(extra), _to_json(figures), _to_json(estimate),
        _number(body["recorded_at"]),
    )


def _to_json(value: object) -> str:
    # default=str: a stray non-JSON value (a Path, an enum) must not lose the whole record.
    return json.dumps(value, sort_keys=True, default=str)


def _bound_tail(text: str) -> str:
    data = text.encode("utf-8", errors="replace")
    if len(data) <= LOG_TAIL_LIMIT:
        return text
    cut = data[-LOG_TAIL_LIMIT:]
    newline = cut.find(b"\n")
    if 0 <= newline < len(cut) - 1:
        cut = cut[newline + 1 :]  # start at a whole line
    return cut.decode("utf-8", errors="ignore")  # "ignore": the cut may split a character


def _attempt_row(row: tuple[Any, ...]) -> AttemptRow:
    return AttemptRow(
        id=row[0],
        server=row[1],
        fingerprint=row[2],
        attempt=row[3],
        params=LaunchParams.from_extras(row[4], row[5], json.loads(row[14])),
        started_at=row[6],
        ended_at=row[7],
        outcome=row[8],
        phase=row[9],
        numbers=json.loads(row[10]),
        evidence=json.loads(row[11]),
        log_tail=row[12],
        seconds_to_ready=row[13],
    )
