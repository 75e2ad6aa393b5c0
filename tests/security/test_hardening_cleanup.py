"""L7: test teardown signals only processes the test started.

Before the fix ``SimSetup.cleanup`` called ``os.killpg(pid)`` for any pid read from the run
directory: a forged ``pid`` file holding ``1`` became ``kill(-1, SIGKILL)`` (every process on
the machine, as root) and a forged stranger's pid killed the stranger. ``os.killpg`` is
replaced by a recorder in the tests that forge ``1`` so that a regression fails the test
instead of killing the machine.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests import procs
from tests.sshsim import kill_leftovers
from tests.supervise import SimSetup, pid_alive


@pytest.fixture
def stranger() -> Iterator[subprocess.Popen[bytes]]:
    """A process in a session of its own that no launch recorded."""
    proc = subprocess.Popen(
        [sys.executable, "-c", "import time; time.sleep(60)"], start_new_session=True
    )
    try:
        yield proc
    finally:
        proc.kill()
        proc.wait()


@pytest.fixture
def killpg_calls(monkeypatch: pytest.MonkeyPatch) -> list[tuple[int, int]]:
    """Every ``os.killpg`` call, recorded and not made."""
    calls: list[tuple[int, int]] = []
    monkeypatch.setattr(os, "killpg", lambda pgid, sig: calls.append((pgid, sig)))
    return calls


def forge(attempt: Path, pid: str, pid_start: str | None) -> None:
    attempt.mkdir(parents=True)
    (attempt / "pid").write_text(pid + "\n")
    if pid_start is not None:
        (attempt / "pid_start").write_text(pid_start)


@pytest.mark.parametrize("pid", ["1", "0", "-1", "abc", "9" * 40, "\u00b2", ""])
def test_cleanup_never_signals_a_forged_pid_out_of_range(
    tmp_path: Path, killpg_calls: list[tuple[int, int]], pid: str
) -> None:
    sim = SimSetup.create(tmp_path)
    # pid_start copied from pid 1 itself: even a "matching" start time does not make 1 ours.
    forge(sim.attempt_dir(1), pid, procs.ident(1))
    sim.cleanup()
    assert killpg_calls == []
    assert sim.server_pids() == []


def test_signal_group_refuses_pgid_1_and_0() -> None:
    for pgid in (1, 0, -1):
        with pytest.raises(ValueError, match="refusing"):
            procs.signal_group(pgid, signal.SIGKILL)


def test_cleanup_leaves_a_stranger_whose_start_time_does_not_match(
    tmp_path: Path, stranger: subprocess.Popen[bytes]
) -> None:
    sim = SimSetup.create(tmp_path)
    forge(sim.attempt_dir(1), str(stranger.pid), "not-a-boot-id 12345")
    forge(sim.attempt_dir(2), str(stranger.pid), None)  # no pid_start: trusted never
    sim.cleanup()
    assert pid_alive(stranger.pid)
    with pytest.raises(AssertionError, match="did not record"):
        sim.pid(1)


def test_cleanup_kills_the_group_the_launch_recorded(
    tmp_path: Path, stranger: subprocess.Popen[bytes]
) -> None:
    """The other side: a process whose pid_start matches is killed (the check is not a no-op)."""
    sim = SimSetup.create(tmp_path)
    forge(sim.attempt_dir(1), str(stranger.pid), procs.ident(stranger.pid))
    assert sim.server_pids() == [stranger.pid]
    sim.cleanup()
    stranger.wait(timeout=5)
    assert stranger.returncode == -signal.SIGKILL


def test_ssh_site_leftovers_skip_pid_1_and_strangers(
    tmp_path: Path, stranger: subprocess.Popen[bytes]
) -> None:
    run_dir = tmp_path / "run"
    forge(run_dir / "llm" / "1", "1", procs.ident(1))
    forge(run_dir / "llm" / "2", str(stranger.pid), "forged 1")
    assert kill_leftovers([run_dir], timeout=0.1) == []
    assert pid_alive(stranger.pid)
