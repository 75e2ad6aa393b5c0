"""Security review 2026-12-05, findings M9, L4 and L5: a port another user takes during a
restart is waited for, not a reason to give up at once (M9); terminal escapes from run-dir
files never reach the terminal through the console log (L4); idle connections to the metrics
endpoint cost neither a thread nor a descriptor for long (L5).

Each test reproduces the attack of the review with the real parts: the simulated GPU host and
its real servers, the real CLI as a subprocess, real sockets and HTTP; "another local user" is
``nobody`` through ``setpriv``.
"""

from __future__ import annotations

import pytest

from tests.supervise import SimSetup, run_cli

pytestmark = pytest.mark.timeout(90)


# --- L4: terminal escapes from run-dir files ------------------------------------------------

ESCAPES = "\x1b]0;PWNED-title\x07\x1b[2J\x9b31m"


def test_status_console_log_shows_escapes_from_a_forged_pid_file(sim: SimSetup) -> None:
    """The review's repro: an attempt whose ``pid`` holds an OSC title, a clear-screen and a
    C1 CSI. ``launcher status``'s console warning (``remote.attempt_corrupt``) shows them as
    ``\\xNN``; no raw ESC, BEL or C1 control reaches stderr."""
    d = sim.attempt_dir(1)
    d.mkdir(parents=True)
    (d / "pid").write_text(ESCAPES + "\n")  # no space: structlog would repr() the value
    config = sim.write_toml(sim.data(mem_fraction_static=0.8, cuda_graph_max_bs=8))

    status = run_cli("status", str(config))

    assert "remote.attempt_corrupt" in status.stderr, status.stderr
    raw = status.stderr
    assert "\x1b" not in raw and "\x07" not in raw and "\x9b" not in raw, repr(raw)
    assert "PWNED-title" in raw and "\\x1b]0;" in raw, raw
