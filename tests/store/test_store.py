"""The state lock, the attempt ledger (real SQLite files), fingerprints, warm start and the
event recorder."""

from __future__ import annotations

import json
import os
import signal
import sqlite3
import stat
import subprocess
import sys
import textwrap
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import anyio
import pytest
from structlog.testing import capture_logs

from launcher.config.schema import HostConfig, ServerConfig
from launcher.errors import StateError
from launcher.hooks.recorder import LedgerRecorder
from launcher.params import LaunchParams
from launcher.sglang.outcome import Confidence, Outcome
from launcher.sglang.phases import Phase
from launcher.store.ledger import (
    _MIGRATIONS,
    LOG_TAIL_LIMIT,
    SCHEMA_VERSION,
    AttemptRow,
    GiveUp,
    Ledger,
    NotifyState,
    fingerprint,
    ledger_path,
)
from launcher.store.lock import LOCK_FILENAME, StateLock
from launcher.supervise import events as ev

REPO = Path(__file__).resolve().parents[2]
P1 = LaunchParams(0.88, 256)
P2 = LaunchParams(0.80, 128)


@pytest.fixture
def ledger(tmp_path: Path) -> Iterator[Ledger]:
    """A fresh ledger in a state directory under tmp_path, closed after the test."""
    with Ledger(ledger_path(tmp_path / "state")) as opened:
        yield opened


def _raw(path: Path) -> sqlite3.Connection:
    return sqlite3.connect(path, isolation_level=None)


# --- schema ------------------------------------------------------------------------------


def test_new_ledger_is_created_at_the_current_schema(tmp_path: Path) -> None:
    """Opening a new file creates the tables and sets user_version, logging one
    ``ledger.created`` line (not ``ledger.migrated``: nothing was migrated)."""
    path = tmp_path / "ledger.sqlite3"
    with capture_logs() as logs, Ledger(path) as ledger:
        assert SCHEMA_VERSION == ledger.schema_version
    created = [e for e in logs if e["event"] == "ledger.created"]
    assert [SCHEMA_VERSION] == [e["schema_version"] for e in created]
    assert [] == [e for e in logs if e["event"] == "ledger.migrated"]
    conn = _raw(path)
    tables = {r[0] for r in conn.execute("SELECT name FROM sqlite_master WHERE type='table'")}
    assert {"attempts", "last_good", "notify_state", "observations", "ledger_meta",
            "shared_observations", "give_ups"} == tables
    assert SCHEMA_VERSION == conn.execute("PRAGMA user_version").fetchone()[0]
    assert "wal" == conn.execute("PRAGMA journal_mode").fetchone()[0]


def test_reopening_runs_no_migration_and_keeps_rows(tmp_path: Path) -> None:
    """A second and third open of the same file migrate nothing and lose nothing."""
    path = tmp_path / "ledger.sqlite3"
    with Ledger(path) as ledger:
        ledger.attempt_started("a", "fp", 1, P1, 100.0)
    for _ in range(2):
        with capture_logs() as logs, Ledger(path) as ledger:
            assert SCHEMA_VERSION == ledger.schema_version
            assert [1] == [row.attempt for row in ledger.history()]
        assert [] == [e for e in logs if e["event"] == "ledger.migrated"]


def test_a_ledger_keeps_its_origin_across_opens(tmp_path: Path) -> None:
    """The name a ledger shares its observations under (docs/ha.md) is made once, with the
    file: reopening keeps it, another file gets another."""
    with Ledger(tmp_path / "a.sqlite3") as ledger:
        origin = ledger.origin()
    with Ledger(tmp_path / "a.sqlite3") as ledger:
        assert origin == ledger.origin()
    with Ledger(tmp_path / "b.sqlite3") as other:
        assert origin != other.origin()
    assert 16 == len(origin)


def test_a_version_2_ledger_opens_and_gains_the_notify_state(tmp_path: Path) -> None:
    """A ledger of the schema before notify_state (version 2, as launchers before it wrote it)
    is migrated in place: its attempts stay, and notifier state then survives a reopen."""
    path = tmp_path / "ledger.sqlite3"
    conn = _raw(path)
    for statement in (*_MIGRATIONS[0], *_MIGRATIONS[1]):
        conn.execute(statement)
    conn.execute("PRAGMA user_version = 2")
    conn.execute("INSERT INTO attempts (server, fingerprint, attempt, mem_fraction_static, "
                 "started_at) VALUES ('llama', 'fp', 1, 0.8, 100.0)")
    conn.close()
    state = NotifyState("llama", "gave_up", last_sent=5.0, suppressed=2, firing_since=4.0,
                        announced=True, payload={"text": "x", "blocks": [{"type": "header"}]})
    with capture_logs() as logs, Ledger(path) as ledger:
        assert 3 <= ledger.schema_version
        assert [(1, 0.8)] == [(r.attempt, r.params.mem_fraction_static)
                              for r in ledger.history()]
        assert [] == ledger.notify_states()
        ledger.save_notify_state(state)
        ledger.save_notify_state(NotifyState("llama", "ready", last_sent=6.0))
    migrated = [e for e in logs if e["event"] in ("ledger.migrated", "ledger.created")]
    assert [("ledger.migrated", 2, SCHEMA_VERSION)] == [
        (e["event"], e["from_version"], e["to_version"]) for e in migrated]
    with Ledger(path) as ledger:
        assert [state, NotifyState("llama", "ready", last_sent=6.0)] == ledger.notify_states()
        ledger.save_notify_state(NotifyState("llama", "gave_up", last_sent=9.0))  # replaces
        assert NotifyState("llama", "gave_up", last_sent=9.0) == ledger.notify_states()[0]


def test_newer_schema_is_refused(tmp_path: Path) -> None:
    """A ledger written by a newer launcher is refused, naming both versions and a fix."""
    path = tmp_path / "ledger.sqlite3"
    conn = _raw(path)
    conn.execute(f"PRAGMA user_version = {SCHEMA_VERSION + 1}")
    conn.close()
    with pytest.raises(StateError) as caught:
        Ledger(path)
    assert f"schema version {SCHEMA_VERSION + 1}" in str(caught.value)
    assert "move the file aside" in caught.value.remedy


def test_a_file_that_is_not_a_database_is_refused(tmp_path: Path) -> None:
    """Garbage in the ledger's place raises StateError naming the file and telling what to do."""
    path = tmp_path / "ledger.sqlite3"
    path.write_bytes(b"this is not sqlite\n" * 200)
    with pytest.raises(StateError) as caught:
        Ledger(path)
    assert str(path) in str(caught.value)
    assert f"move {path} aside" in caught.value.remedy


def test_ledger_files_are_private(tmp_path: Path) -> None:
    """The state directory the ledger creates is 0700 and the database file 0600."""
    state = tmp_path / "state"
    Ledger(ledger_path(state)).close()
    assert 0o700 == stat.S_IMODE(state.stat().st_mode)
    assert 0o600 == stat.S_IMODE(ledger_path(state).stat().st_mode)


def test_closed_ledger_raises_state_error(tmp_path: Path) -> None:
    """Using a ledger after close() raises StateError, and close() may be repeated."""
    ledger = Ledger(tmp_path / "ledger.sqlite3")
    ledger.close()
    ledger.close()
    with pytest.raises(StateError, match="is closed"):
        ledger.history()


# --- attempts ----------------------------------------------------------------------------


def test_attempt_round_trips_with_numbers_evidence_and_tail(ledger: Ledger) -> None:
    """A started then finished attempt reads back exactly, numbers JSON included."""
    numbers = {"tried_gib": 2.5, "free_gib": 0.31, "graph_last_bs": 160, "gpu": 0}
    ledger.attempt_started("llama", "fp1", 1, P1, 1000.0)
    ledger.attempt_finished(
        "llama", 1, outcome="oom_graph_capture", phase="cuda_graph", numbers=numbers,
        evidence=["torch.OutOfMemoryError: CUDA out of memory."], log_tail="a\nb\n",
        ended_at=1060.5,
    )
    expected = AttemptRow(
        id=1, server="llama", fingerprint="fp1", attempt=1, params=P1, started_at=1000.0,
        ended_at=1060.5, outcome="oom_graph_capture", phase="cuda_graph", numbers=numbers,
        evidence=["torch.OutOfMemoryError: CUDA out of memory."], log_tail="a\nb\n",
        seconds_to_ready=None,
    )
    assert [expected] == ledger.history()
    assert json.loads(json.dumps(expected.as_dict())) == ledger.history()[0].as_dict()
    assert {"mem_fraction_static": 0.88, "cuda_graph_max_bs": 256} == expected.as_dict()["params"]


def test_running_attempt_has_no_result(ledger: Ledger) -> None:
    """An attempt that only started reads back with no end, outcome or numbers."""
    ledger.attempt_started("llama", "fp1", 1, LaunchParams(), 5.0)
    [row] = ledger.history()
    assert (LaunchParams(), None, None, None, {}, [], "") == (
        row.params, row.ended_at, row.outcome, row.phase, row.numbers, row.evidence,
        row.log_tail,
    )


def test_repeated_attempt_start_is_an_upsert_that_starts_afresh(ledger: Ledger) -> None:
    """Starting (server, attempt) again after a daemon restart replaces it instead of crashing."""
    ledger.attempt_started("llama", "fp1", 3, P1, 10.0)
    ledger.attempt_finished("llama", 3, outcome="other", phase="init", numbers={"gpu": 1},
                            evidence=["x"], log_tail="t", ended_at=11.0)
    ledger.attempt_started("llama", "fp2", 3, P2, 20.0)
    [row] = ledger.history()
    assert ("fp2", P2, 20.0, None, None, {}, []) == (
        row.fingerprint, row.params, row.started_at, row.ended_at, row.outcome, row.numbers,
        row.evidence,
    )


def test_finishing_an_unrecorded_attempt_creates_it(ledger: Ledger) -> None:
    """attempt_finished for an attempt never started here inserts it with the given facts."""
    ledger.attempt_finished("llama", 7, outcome="stopped", phase=None, numbers={},
                            evidence=[], log_tail="", ended_at=50.0, fingerprint="fp1",
                            params=P2, started_at=40.0)
    [row] = ledger.history()
    assert (7, "fp1", P2, 40.0, 50.0, "stopped", None) == (
        row.attempt, row.fingerprint, row.params, row.started_at, row.ended_at, row.outcome,
        row.phase,
    )


def test_adoption_keeps_the_row_of_the_daemon_that_launched(ledger: Ledger) -> None:
    """Adopting an attempt already recorded keeps that row; an unknown one gets a new row."""
    ledger.attempt_started("llama", "fp1", 4, P1, 100.0)
    ledger.attempt_adopted("llama", "fp1", 4, P2, 500.0)
    ledger.attempt_adopted("qwen", "fp9", 2, P2, 600.0)
    rows = {(r.server, r.attempt): (r.params, r.started_at) for r in ledger.history()}
    assert {("llama", 4): (P1, 100.0), ("qwen", 2): (P2, 600.0)} == rows


def test_history_is_newest_first_filtered_and_limited(ledger: Ledger) -> None:
    """history() orders by start time (newest first), filters by server and honours limit."""
    for server, attempt, started in [("a", 1, 10.0), ("b", 1, 15.0), ("a", 2, 20.0),
                                     ("a", 3, 30.0), ("b", 2, 25.0)]:
        ledger.attempt_started(server, "fp", attempt, P1, started)
    assert [("a", 3), ("b", 2), ("a", 2), ("b", 1), ("a", 1)] == [
        (r.server, r.attempt) for r in ledger.history()
    ]
    assert [3, 2, 1] == [r.attempt for r in ledger.history("a")]
    assert [3, 2] == [r.attempt for r in ledger.history("a", limit=2)]
    assert [] == ledger.history("nobody")
    assert [] == ledger.history(limit=0)


def test_log_tail_is_bounded_to_its_last_whole_lines(ledger: Ledger) -> None:
    """A long tail keeps at most LOG_TAIL_LIMIT bytes: its end, starting at a line start."""
    lines = [f"line {i:06d} ünïcode" for i in range(20_000)]
    tail = "\n".join(lines) + "\n"
    ledger.attempt_finished("a", 1, outcome="other", phase="init", numbers={}, evidence=[],
                            log_tail=tail, ended_at=1.0)
    stored = ledger.history()[0].log_tail
    assert len(stored.encode()) <= LOG_TAIL_LIMIT
    assert len(stored.encode()) > LOG_TAIL_LIMIT - 100
    assert tail.endswith(stored)
    assert stored.split("\n")[0] in lines


# --- ready and last good -----------------------------------------------------------------


def test_server_ready_marks_the_attempt_and_remembers_params(ledger: Ledger) -> None:
    """server_ready sets the attempt's outcome and time to ready and stores last good params."""
    ledger.attempt_started("llama", "fp1", 2, P2, 100.0)
    ledger.server_ready("llama", "fp1", P2, 95.5, 2, at=200.0)
    [row] = ledger.history()
    assert ("ready", "ready", 95.5, 200.0) == (
        row.outcome, row.phase, row.seconds_to_ready, row.ended_at
    )
    assert P2 == ledger.last_good("fp1")
    entry = ledger.last_good_entry("fp1")
    assert entry is not None
    assert ("llama", 200.0, 2) == (entry.server, entry.updated_at, entry.attempts)
    assert None is ledger.last_good("fp-other")


def test_last_good_is_an_upsert_per_fingerprint(ledger: Ledger) -> None:
    """A later ready replaces the fingerprint's last good params; other fingerprints stay."""
    ledger.server_ready("llama", "fp1", P1, 10.0, 1, at=100.0)
    ledger.server_ready("qwen", "fp2", P1, 10.0, 1, at=110.0)
    ledger.server_ready("llama", "fp1", P2, 30.0, 4, at=300.0)
    assert (P2, P1) == (ledger.last_good("fp1"), ledger.last_good("fp2"))
    entry = ledger.last_good_entry("fp1")
    assert entry is not None
    assert (300.0, 4) == (entry.updated_at, entry.attempts)


def test_failure_after_ready_keeps_time_to_ready(ledger: Ledger) -> None:
    """An attempt that was ready and later died shows the failure and still its time to ready."""
    ledger.attempt_started("llama", "fp1", 1, P1, 0.0)
    ledger.server_ready("llama", "fp1", P1, 60.0, 1, at=60.0)
    ledger.attempt_finished("llama", 1, outcome="oom_runtime", phase="ready", numbers={},
                            evidence=["OOM"], log_tail="", ended_at=900.0)
    [row] = ledger.history()
    assert ("oom_runtime", 60.0, 900.0) == (row.outcome, row.seconds_to_ready, row.ended_at)


def test_a_stop_closes_the_row_as_stopped_and_keeps_what_it_knew(ledger: Ledger) -> None:
    """attempt_stopped (`launcher down`) closes a ready attempt as "stopped", ended at the
    stop, with its phase and time to ready kept; an attempt the ledger never saw is left."""
    ledger.attempt_started("llama", "fp1", 1, P1, 0.0)
    ledger.server_ready("llama", "fp1", P1, 60.0, 1, at=60.0)
    assert ledger.attempt_stopped("llama", 1, ended_at=500.0)
    assert not ledger.attempt_stopped("llama", 9, ended_at=500.0)
    [row] = ledger.history()
    assert ("stopped", "ready", 60.0, 500.0) == (
        row.outcome, row.phase, row.seconds_to_ready, row.ended_at)


def test_a_give_up_is_kept_per_server_the_newest_winning(tmp_path: Path) -> None:
    """server_gave_up keeps each server's last give-up (a later one replaces it), across a
    reopen; a server that never gave up has none. The recorder files ``server.gave_up``."""
    path = tmp_path / "ledger.sqlite3"
    with Ledger(path) as ledger:
        ledger.server_gave_up(GiveUp("llama", 3, 3, "gave up after 3 attempts", 10.0))
        ledger.server_gave_up(GiveUp("llama", 3, 0, "preflight: port 30000 taken", 20.0))

        async def record() -> None:
            async with LedgerRecorder(ledger, {"qwen": "fp"}, clock=lambda: 30.0) as recorder:
                recorder("qwen", ev.ServerGaveUp(reason="why", attempt=7, attempts=0,
                                                 history=()))

        anyio.run(record)
    with Ledger(path) as ledger:
        assert GiveUp("llama", 3, 0, "preflight: port 30000 taken", 20.0) == (
            ledger.last_give_up("llama"))
        assert GiveUp("qwen", 7, 0, "why", 30.0) == ledger.last_give_up("qwen")
        assert None is ledger.last_give_up("other")


# --- fingerprint -------------------------------------------------------------------------


def _server(**changes: Any) -> ServerConfig:
    base: dict[str, Any] = {"name": "llama", "host": "gpu1", "model_path": "/m/llama-8b",
                            "gpus": [0, 1], "tp": 2, "extra_args": ["--trust-remote-code"]}
    return ServerConfig.model_validate({**base, **changes})


def _host(**changes: Any) -> HostConfig:
    return HostConfig.model_validate({"name": "gpu1", "address": "10.0.0.5", **changes})


def test_fingerprint_is_stable() -> None:
    """The same launch always gives the same 16-hex-digit value (recipe unchanged)."""
    value = fingerprint(_server(), _host(), "0.4.6.post1")
    assert "8480ebb3021f6a98" == value
    assert value == fingerprint(_server(gpus=[1, 0]), _host(), "0.4.6.post1")


@pytest.mark.parametrize(
    ("server", "host", "version"),
    [
        (_server(gpus=[2, 3]), _host(), "0.4.6.post1"),
        (_server(model_path="/m/llama-70b"), _host(), "0.4.6.post1"),
        (_server(), _host(), "0.4.7"),
        (_server(tp=1, dp=2), _host(), "0.4.6.post1"),
        (_server(extra_args=["--trust-remote-code", "--kv-cache-dtype", "fp8_e5m2"]), _host(),
         "0.4.6.post1"),
        (_server(env={"PYTORCH_CUDA_ALLOC_CONF": "expandable_segments:True"}), _host(),
         "0.4.6.post1"),
        (_server(), _host(address="10.0.0.6"), "0.4.6.post1"),
        (_server(), _host(port=2222), "0.4.6.post1"),
        (_server(), _host(name="gpu2"), "0.4.6.post1"),
        (_server(mamba_strategy="extra_buffer"), _host(), "0.4.6.post1"),
        (_server(max_running_requests=24), _host(), "0.4.6.post1"),
    ],
    ids=["gpus", "model", "version", "tp-dp", "extra-args", "env", "address", "ssh-port",
         "host-name", "mamba-strategy", "running-requests"],
)
def test_fingerprint_changes_with_what_changes_memory(
    server: ServerConfig, host: HostConfig, version: str
) -> None:
    """Changing GPUs, model, version, parallelism, args, env or host changes the fingerprint."""
    assert fingerprint(_server(), _host(), "0.4.6.post1") != fingerprint(server, host, version)


def test_fingerprint_ignores_the_remembered_params_and_serving_details() -> None:
    """mem_fraction_static, cuda_graph_max_bs, port and served name leave it unchanged."""
    other = _server(mem_fraction_static=0.7, cuda_graph_max_bs=64, port=31000,
                    served_model_name="llama")
    assert fingerprint(_server(), _host(), "0.4.6") == fingerprint(other, _host(), "0.4.6")


# --- the state lock ----------------------------------------------------------------------

# Children log to stderr so that their stdout carries only what the test reads.
_HOLD_LOCK = """
    import sys
    from pathlib import Path
    import structlog
    structlog.configure(logger_factory=structlog.PrintLoggerFactory(sys.stderr))
    from launcher.store.lock import StateLock
    with StateLock(Path(sys.argv[1])):
        print("locked", flush=True)
        sys.stdin.read()
"""


def _hold_lock_in_child(state: Path) -> subprocess.Popen[str]:
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    child = subprocess.Popen(
        [sys.executable, "-c", textwrap.dedent(_HOLD_LOCK), str(state)], cwd=REPO, env=env,
        text=True, stdin=subprocess.PIPE, stdout=subprocess.PIPE,
    )
    assert child.stdout is not None
    line = child.stdout.readline()
    if "locked\n" != line:
        child.kill()
        child.communicate(timeout=10)
        raise AssertionError(f"the child did not take the lock: {line!r}")
    return child


def test_state_lock_creates_a_private_dir_and_writes_our_pid(tmp_path: Path) -> None:
    """Entering creates state_dir 0700 and puts our pid in the lock file; exit empties it."""
    state = tmp_path / "a" / "state"
    with StateLock(state) as lock:
        assert lock.held
        assert 0o700 == stat.S_IMODE(state.stat().st_mode)
        assert f"{os.getpid()}\nlauncher up\n" == (state / LOCK_FILENAME).read_text()
    assert not lock.held
    assert "" == (state / LOCK_FILENAME).read_text()


def test_state_lock_refused_while_another_process_holds_it(tmp_path: Path) -> None:
    """A second `launcher up` gets StateError naming the holder's pid and the fix; after the
    holder exits the lock can be taken."""
    state = tmp_path / "state"
    child = _hold_lock_in_child(state)
    try:
        with pytest.raises(StateError) as caught, StateLock(state):
            pass
        message = str(caught.value)
        assert f"another `launcher up` is running on this state directory (pid {child.pid})" in (
            message
        )
        assert "stop it or use another state_dir" == caught.value.remedy
    finally:
        child.communicate("", timeout=10)
    assert 0 == child.returncode
    with StateLock(state) as lock:
        assert lock.held


def test_state_lock_is_freed_when_its_holder_is_killed(tmp_path: Path) -> None:
    """A SIGKILLed holder leaves no stale lock: the next StateLock succeeds at once."""
    state = tmp_path / "state"
    child = _hold_lock_in_child(state)
    child.kill()
    child.communicate(timeout=10)
    assert -signal.SIGKILL == child.returncode
    with StateLock(state):
        assert f"{os.getpid()}\nlauncher up\n" == (state / LOCK_FILENAME).read_text()


def test_state_lock_refuses_a_second_holder_in_the_same_process(tmp_path: Path) -> None:
    """Two StateLocks on one directory in one process also exclude each other."""
    with StateLock(tmp_path) as first, pytest.raises(StateError, match=f"pid {os.getpid()}"):
        StateLock(tmp_path).acquire()
    assert not first.held


# --- crash safety ------------------------------------------------------------------------

_CRASH = """
    import os, signal, sqlite3, sys
    from pathlib import Path
    import structlog
    structlog.configure(logger_factory=structlog.PrintLoggerFactory(sys.stderr))
    from launcher.params import LaunchParams
    from launcher.store.ledger import Ledger
    path = Path(sys.argv[1])
    ledger = Ledger(path)
    ledger.attempt_started("llama", "fp1", 1, LaunchParams(0.85, 160), 100.0)
    ledger.attempt_finished("llama", 1, outcome="oom_kv_cache", phase="kv_cache",
                            numbers={"free_gib": 1.5}, evidence=["OOM"], log_tail="tail",
                            ended_at=130.0)
    # A second, big transaction: with a tiny page cache SQLite spills its uncommitted pages
    # into the WAL file before the kill.
    raw = sqlite3.connect(path, isolation_level=None)
    raw.execute("PRAGMA cache_size = -64")
    raw.execute("BEGIN IMMEDIATE")
    for i in range(2, 2000):
        raw.execute("INSERT INTO attempts (server, fingerprint, attempt, started_at, log_tail)"
                    " VALUES ('llama', 'fp1', ?, 200.0, ?)", (i, "x" * 4000))
    print(os.path.getsize(str(path) + "-wal"), flush=True)
    os.kill(os.getpid(), signal.SIGKILL)
"""


def test_committed_attempt_survives_sigkill_mid_transaction(tmp_path: Path) -> None:
    """A process killed inside an uncommitted write leaves the committed attempt intact and a
    database that opens cleanly with integrity_check ok."""
    path = tmp_path / "ledger.sqlite3"
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    done = subprocess.run(
        [sys.executable, "-c", textwrap.dedent(_CRASH), str(path)], cwd=REPO, env=env,
        capture_output=True, text=True, timeout=60,
    )
    assert -signal.SIGKILL == done.returncode, done.stderr
    assert int(done.stdout) > 4_000_000  # the uncommitted transaction really reached disk
    with Ledger(path) as ledger:
        rows = [r.as_dict() for r in ledger.history()]
    assert [(1, "oom_kv_cache", {"free_gib": 1.5}, ["OOM"], "tail")] == [
        (r["attempt"], r["outcome"], r["numbers"], r["evidence"], r["log_tail"]) for r in rows
    ]
    assert [("ok",)] == _raw(path).execute("PRAGMA integrity_check").fetchall()


# --- the recorder ------------------------------------------------------------------------


class FakeClock:
    """A clock that returns what the test sets."""

    def __init__(self, now: float) -> None:
        self.now = now

    def __call__(self) -> float:
        return self.now


async def test_recorder_maps_supervisor_events_onto_the_ledger(ledger: Ledger) -> None:
    """A failed attempt then a ready one, as the supervisor reports them, become two rows
    and last good params."""
    clock = FakeClock(1000.0)
    p1 = LaunchParams(0.88, 256)
    p2 = LaunchParams(0.85, 160)
    async with LedgerRecorder(ledger, {"llama": "fp1"}, clock) as hook:
        hook("llama", ev.AttemptStarted(attempt=1, params=p1))
        hook("llama", ev.PhaseEntered(phase=Phase.INIT, attempt=1))
        clock.now = 1050.0
        hook("llama", ev.AttemptFailed(
            attempt=1, outcome=Outcome.OOM_GRAPH_CAPTURE, confidence=Confidence.DECISIVE,
            phase=Phase.CUDA_GRAPH, numbers={"free_gib": 0.4}, retryable=True,
            after_ready=False, evidence=("torch.OutOfMemoryError: CUDA out of memory.",),
            advice="",
        ))
        hook("llama", ev.AttemptEnded(
            attempt=1, params=p1, outcome="oom_graph_capture", phase="cuda_graph",
            numbers={"free_gib": 0.4, "graph_last_bs": 200}, evidence=(), advice="",
            started_at=999.0, ended_at=1055.0, log_tail="...\nOOM\n", tail_path=None,
        ))
        clock.now = 1060.0
        hook("llama", ev.AttemptStarted(attempt=2, params=p2))
        clock.now = 1150.0
        hook("llama", ev.ServerReady(attempt=2, attempts=2, seconds=150.0,
                                     attempt_seconds=90.0, adopted=False, params=p2,
                                     history=()))
        assert await hook.flush()
    rows = ledger.history()
    assert [
        (2, LaunchParams(0.85, 160), 1060.0, 1150.0, "ready", "ready", {}, [], 90.0),
        (1, LaunchParams(0.88, 256), 1000.0, 1055.0, "oom_graph_capture", "cuda_graph",
         {"free_gib": 0.4, "graph_last_bs": 200},
         ["torch.OutOfMemoryError: CUDA out of memory."], None),
    ] == [
        (r.attempt, r.params, r.started_at, r.ended_at, r.outcome, r.phase, r.numbers,
         r.evidence, r.seconds_to_ready)
        for r in rows
    ]
    assert "...\nOOM\n" == rows[1].log_tail
    assert LaunchParams(0.85, 160) == ledger.last_good("fp1")


async def test_recorder_records_an_adopted_server(ledger: Ledger) -> None:
    """An adopted attempt gets a row, and its later ready marks that row."""
    clock = FakeClock(500.0)
    params = LaunchParams(0.8, 128)
    async with LedgerRecorder(ledger, {"llama": "fp1"}, clock) as hook:
        hook("llama", ev.ServerAdopted(pid=4242, attempt=5, params=params, started_at=470.0))
        clock.now = 530.0
        hook("llama", ev.ServerReady(attempt=5, attempts=1, seconds=None,
                                     attempt_seconds=None, adopted=True,
                                     params=params, history=()))
    [row] = ledger.history()
    # Launched at 470 (the run directory says so), ready when seen at 530.
    assert (5, 470.0, "ready", 60.0) == (row.attempt, row.started_at, row.outcome,
                                         row.seconds_to_ready)
    assert LaunchParams(0.8, 128) == ledger.last_good("fp1")


async def test_recorder_never_raises_and_logs_write_failures(ledger: Ledger) -> None:
    """Unknown servers and failing writes are logged, never raised."""
    with capture_logs() as logs:
        async with LedgerRecorder(ledger, {"llama": "fp1"}, FakeClock(1.0)) as hook:
            hook("ghost", ev.AttemptStarted(attempt=1, params=LaunchParams()))
            ledger.close()
            hook("llama", ev.AttemptStarted(attempt=1, params=LaunchParams()))
            assert await hook.flush()
        hook("llama", ev.AttemptStarted(attempt=2, params=LaunchParams()))
    failed = [e for e in logs if e["event"] == "ledger.write_failed"]
    assert [("ghost", "KeyError"), ("llama", "StateError"), ("llama", "StateError")] == [
        (e["server"], e["error"].split("(")[0]) for e in failed
    ]
    assert {"attempt.started"} == {e["hook_event"] for e in failed}
    assert "is closed" in failed[1]["error"]


async def test_events_sent_just_before_cancellation_are_all_recorded(ledger: Ledger) -> None:
    """The worker is cancelled (the daemon's task group on shutdown) right after the last
    events were queued: its shielded drain still writes every attempt row."""
    hook = LedgerRecorder(ledger, {"llama": "fp1"}, FakeClock(5.0))
    async with anyio.create_task_group() as tg:
        await tg.start(hook.run)
        for n in range(1, 41):
            hook("llama", ev.AttemptStarted(attempt=n, params=P1))
        tg.cancel_scope.cancel()
    assert list(range(40, 0, -1)) == [r.attempt for r in ledger.history(limit=100)]
    assert await hook.flush()  # nothing is left in the queue
    with capture_logs() as logs:
        hook("llama", ev.AttemptStarted(attempt=41, params=P1))  # no worker: dropped, logged
    assert ["ledger.write_failed"] == [e["event"] for e in logs]


async def test_recorder_does_not_block_its_caller_while_the_database_is_busy(
        ledger: Ledger) -> None:
    """While another connection holds the write lock the hook returns at once; the write
    lands once the lock is released."""
    other = _raw(ledger.path)
    other.execute("BEGIN IMMEDIATE")
    async with LedgerRecorder(ledger, {"llama": "fp1"}, FakeClock(7.0)) as hook:
        hook("llama", ev.AttemptStarted(attempt=1, params=LaunchParams()))
        assert [] == [r[0] for r in other.execute("SELECT attempt FROM attempts")]
        other.execute("COMMIT")
        assert await hook.flush()
    assert [(1, 7.0)] == [(r.attempt, r.started_at) for r in ledger.history()]
    other.close()


def test_params_beyond_fraction_and_bs_round_trip(tmp_path: Path) -> None:
    """Running requests, Mamba knobs and env a relaunch set (a prescribed fix) are recorded
    with the attempt and come back in history and as last good params."""
    p = LaunchParams(0.8, 32, max_running_requests=24, mamba_strategy="extra_buffer",
                     env=(("SGLANG_ENABLE_SPEC_V2", "1"),))
    with Ledger(tmp_path / "l.sqlite3") as ledger:
        ledger.attempt_started("s", "fp", 2, p, 10.0)
        assert p == ledger.history("s")[0].params
        assert {"SGLANG_ENABLE_SPEC_V2": "1"} == ledger.history("s")[0].as_dict()["params"]["env"]
        ledger.server_ready("s", "fp", p, 5.0, 2, at=20.0)
        assert p == ledger.last_good("fp")


async def test_recorder_keeps_a_relaunchs_extra_params(ledger: Ledger) -> None:
    """A prescribed fix's params (strategy, env) as the supervisor reports them are recorded
    with the attempt and as last good params."""
    clock = FakeClock(100.0)
    p = LaunchParams(0.8, 32, mamba_strategy="extra_buffer",
                     env=(("SGLANG_ENABLE_SPEC_V2", "1"),))
    async with LedgerRecorder(ledger, {"llama": "fp1"}, clock) as hook:
        hook("llama", ev.AttemptStarted(attempt=2, params=p))
        clock.now = 130.0
        hook("llama", ev.ServerReady(attempt=2, attempts=1, seconds=30.0, attempt_seconds=30.0,
                                     adopted=False, params=p, history=()))
    assert p == ledger.history()[0].params == ledger.last_good("fp1")
# --- one attempt numbering: the machine's events onto the ledger ----------------------------


def _machine(base: int) -> Any:
    from launcher.memory.policy import Bounds
    from launcher.supervise.backoff import RestartBackoff
    from launcher.supervise.lifecycle import Limits, ServerMachine

    m = ServerMachine(
        initial=P1, limits=Limits(bounds=Bounds(0.5, 0.95, 1, 6)),
        restart=RestartBackoff(initial=10, maximum=600, healthy_reset=1800, budget=3,
                               window=3600),
    )
    m.attempt = m.attempt_base = base  # what the supervisor does: number on from the host
    return m


def _feed(m: Any, hook: LedgerRecorder, clock: FakeClock, event: object, now: float) -> None:
    """Apply ``event`` to the machine at ``now`` and pass its emits to the recorder."""
    from launcher.supervise.lifecycle import Emit

    clock.now = now
    for action in m.handle(event, now):
        if isinstance(action, Emit):
            hook("llama", action.event)


def _to_ready(m: Any, hook: LedgerRecorder, clock: FakeClock, t: float) -> None:
    from launcher.supervise.lifecycle import Launched, ProbeResult, ReadyLineSeen

    _feed(m, hook, clock, Launched(pid=100), t + 1)
    _feed(m, hook, clock, ReadyLineSeen(), t + 30)
    _feed(m, hook, clock, ProbeResult(ok=True), t + 40)


def _rows(ledger: Ledger) -> dict[int, tuple[str | None, float | None]]:
    return {r.attempt: (r.outcome, r.seconds_to_ready) for r in ledger.history()}


async def test_ready_after_a_restart_marks_its_own_attempt_not_the_first(ledger: Ledger) -> None:
    """Three attempts are on the host (1, 2 OOM; 3 ready); a restarted daemon launches
    attempt 4, which gets ready: row 4 is ready with its own time to ready and rows 1-3 keep
    what they were (the bug: the per-run count 1 was taken for the number, so attempt #1,
    an OOM, was rewritten as ready and #4 never got a time to ready)."""
    from launcher.supervise.lifecycle import PreflightPassed, Start

    for n, outcome in [(1, "oom_graph_capture"), (2, "oom_graph_capture"), (3, "ready")]:
        ledger.attempt_started("llama", "fp1", n, P1, 10.0 * n)
        if outcome == "ready":
            ledger.server_ready("llama", "fp1", P1, 7.0, n, at=10.0 * n + 7)
        else:
            ledger.attempt_finished("llama", n, outcome=outcome, phase="cuda_graph",
                                    numbers={}, evidence=[], log_tail="", ended_at=10.0 * n + 5)
    clock = FakeClock(1000.0)
    m = _machine(base=3)
    async with LedgerRecorder(ledger, {"llama": "fp1"}, clock) as hook:
        _feed(m, hook, clock, Start(), 1000.0)
        _feed(m, hook, clock, PreflightPassed(), 1000.0)
        _to_ready(m, hook, clock, 1000.0)
        assert await hook.flush()
    assert {1: ("oom_graph_capture", None), 2: ("oom_graph_capture", None), 3: ("ready", 7.0),
            4: ("ready", 40.0)} == _rows(ledger)
    entry = ledger.last_good_entry("fp1")
    assert entry is not None and 1 == entry.attempts  # this start-up took one attempt


async def test_adopting_a_ready_attempt_is_not_a_fresh_ready(ledger: Ledger) -> None:
    """A restarted daemon adopts attempt 3 (ready in 42 s under the daemon that launched it)
    and sees it ready again at once: row 3 keeps 42 s, row 1 stays an OOM."""
    from launcher.supervise.lifecycle import Adopted, ProbeResult, ReadyLineSeen

    ledger.attempt_started("llama", "fp1", 1, P1, 10.0)
    ledger.attempt_finished("llama", 1, outcome="oom_kv_cache", phase="kv_cache", numbers={},
                            evidence=[], log_tail="", ended_at=15.0)
    ledger.attempt_started("llama", "fp1", 3, P2, 30.0)
    ledger.server_ready("llama", "fp1", P2, 42.0, 3, at=72.0)
    clock = FakeClock(5000.0)
    m = _machine(base=0)
    async with LedgerRecorder(ledger, {"llama": "fp1"}, clock) as hook:
        _feed(m, hook, clock, Adopted(pid=77, attempt=3, params=P2, started_wall=30.0), 5000.0)
        _feed(m, hook, clock, ReadyLineSeen(), 5000.02)
        _feed(m, hook, clock, ProbeResult(ok=True), 5000.04)
        assert await hook.flush()
    assert {1: ("oom_kv_cache", None), 3: ("ready", 42.0)} == _rows(ledger)
    [ready] = [r for r in ledger.history() if r.attempt == 3]
    assert 72.0 == ready.ended_at  # when it became ready, not when it was adopted


async def test_adopting_an_attempt_mid_load_times_it_from_its_launch(ledger: Ledger) -> None:
    """The daemon that launched attempt 2 died while it loaded; the adopting daemon sees it
    ready at t=130: its time to ready is counted from its launch at t=100."""
    from launcher.supervise.lifecycle import Adopted, ProbeResult, ReadyLineSeen

    ledger.attempt_started("llama", "fp1", 2, P1, 100.0)
    clock = FakeClock(110.0)
    m = _machine(base=0)
    async with LedgerRecorder(ledger, {"llama": "fp1"}, clock) as hook:
        _feed(m, hook, clock, Adopted(pid=77, attempt=2, params=P1, started_wall=100.0), 110.0)
        _feed(m, hook, clock, ReadyLineSeen(), 125.0)
        _feed(m, hook, clock, ProbeResult(ok=True), 130.0)
        assert await hook.flush()
    assert {2: ("ready", 30.0)} == _rows(ledger)
