"""The launch claim (launcher.host.run): a launch left half-way can never start a second copy.

Local transport and real processes: the shim script is run as on a host, attempt directories
are made as a launch cut off at that step would leave them.
"""

from __future__ import annotations

import subprocess
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from launcher.host import run
from launcher.host.transport.local import LocalTransport


@pytest.fixture
def sleeper() -> Iterator[subprocess.Popen[bytes]]:
    """A live process to stand in for a server whose shim has claimed its attempt."""
    proc = subprocess.Popen(["sleep", "60"])
    yield proc
    proc.kill()
    proc.wait()


def run_shim(attempt: Path) -> subprocess.CompletedProcess[bytes]:
    """The launch's shim, as the wrapper runs it, for a server that would just exit 0."""
    return subprocess.run(["sh", "-c", run._SHIM, "sh", str(attempt), "", "", "true"],
                          capture_output=True, timeout=30)


async def test_listing_without_adopting_claims_nothing(tmp_path: Path) -> None:
    """status / logs / down list attempts without touching a launch that is in flight."""
    attempt = tmp_path / "runs" / "llm" / "1"
    attempt.mkdir(parents=True)
    (attempt / "env").touch()  # the launch writes it before it starts the wrapper
    found = await run.find_running(LocalTransport("h"), str(tmp_path / "runs"), "llm")
    assert (None, False) == (found, (attempt / "claim").exists())
    assert 0 == run_shim(attempt).returncode  # the launch still goes ahead
    assert (attempt / "pid").exists()


async def test_adopting_claims_a_launch_cut_off_before_its_shim_ran(tmp_path: Path) -> None:
    """Adopting claims an attempt with neither pid nor exit status: its shim, running later,
    exits 125 without writing a pid or starting the server."""
    attempt = tmp_path / "runs" / "llm" / "1"
    attempt.mkdir(parents=True)
    found = await run.find_running(LocalTransport("h"), str(tmp_path / "runs"), "llm",
                                      adopting=True)
    shim = run_shim(attempt)
    assert (None, True) == (found, (attempt / "claim").is_dir())
    assert 125 == shim.returncode
    assert not (attempt / "pid").exists()


async def test_adopting_waits_for_the_pid_of_a_shim_that_claimed_first(
    tmp_path: Path, sleeper: subprocess.Popen[bytes]
) -> None:
    """An attempt its shim claimed but whose pid file is not written yet is waited for and
    adopted (not launched again)."""
    attempt = tmp_path / "runs" / "llm" / "1"
    attempt.mkdir(parents=True)
    (attempt / "claim").mkdir()

    def write_pid_soon() -> None:
        time.sleep(0.5)
        # As the shim does: pid_start (boot id and start time) first, so the pid is trusted.
        stat = Path(f"/proc/{sleeper.pid}/stat").read_text().rpartition(") ")[2].split()
        boot_id = Path("/proc/sys/kernel/random/boot_id").read_text().strip()
        (attempt / "pid_start").write_text(f"{boot_id} {stat[19]}")
        (attempt / "pid.tmp").write_text(f"{sleeper.pid}\n")
        (attempt / "pid.tmp").rename(attempt / "pid")

    writer = threading.Thread(target=write_pid_soon)
    writer.start()
    try:
        found = await run.find_running(LocalTransport("h"), str(tmp_path / "runs"), "llm",
                                          adopting=True)
    finally:
        writer.join()
    assert found is not None
    assert (1, sleeper.pid) == (found.attempt, found.pid)
