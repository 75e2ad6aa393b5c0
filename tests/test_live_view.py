"""`launcher up`'s live view through a real pseudo-terminal (pexpect), read as a screen (pyte,
a VT100 emulator): the table stays one table, events are whole lines above it, the notes and
the give-up reason read as written."""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import Any

import pexpect
import pyte
import pytest

from tests.simhost import model_dir
from tests.supervise import REPO, SERVER, SimSetup, cli_argv, cli_env

pytestmark = pytest.mark.timeout(120)

ROWS, COLS = 50, 200


class Screen:
    """A terminal of ROWS × COLS fed with everything a pexpect child writes."""

    def __init__(self, child: pexpect.spawn) -> None:  # type: ignore[type-arg]
        self.child = child
        self.screen = pyte.Screen(COLS, ROWS)
        self.stream = pyte.ByteStream(self.screen)
        self.raw = b""
        self.seen: set[str] = set()  # every line the screen showed at some point

    def pump(self, seconds: float) -> bool:
        """Read for up to ``seconds``; False once the child has ended."""
        deadline = time.monotonic() + seconds
        while time.monotonic() < deadline:
            try:
                data = self.child.read_nonblocking(65536, timeout=0.1)
            except pexpect.TIMEOUT:
                continue
            except pexpect.EOF:
                return False
            self.raw += data
            self.stream.feed(data)
            self.seen.update(self.lines())
        return True

    def run_to_end(self, timeout: float) -> int:
        deadline = time.monotonic() + timeout
        while self.pump(0.5):
            assert time.monotonic() < deadline, "\n".join(self.lines())
        self.child.close()
        status: int = self.child.exitstatus
        return status

    def lines(self) -> list[str]:
        return [line.rstrip() for line in self.screen.display if line.strip()]


def spawn_up(config: Path, *args: str) -> Screen:
    env = cli_env()
    env.pop("NO_COLOR", None)
    env.update(COLUMNS=str(COLS), LINES=str(ROWS), TERM="xterm-256color")
    argv = cli_argv("up", str(config), *args)
    child = pexpect.spawn(argv[0], argv[1:], cwd=str(REPO), env=env,
                          dimensions=(ROWS, COLS))
    return Screen(child)


def capture_oom(sim: SimSetup, **policy: Any) -> dict[str, Any]:
    """A server whose first attempt runs out of memory capturing CUDA graphs (a 70B model on
    two simulated 80 GB GPUs at fraction 0.88 with graph bs 256)."""
    data = sim.data(model="llama-70b-sim", tp=2, mem_fraction_static=0.88,
                    cuda_graph_max_bs=256, policy=policy)
    data["servers"][0]["model_path"] = str(model_dir("llama-70b-sim"))
    return data


def test_live_view_keeps_one_table_with_events_above_it(sim: SimSetup) -> None:
    """Up to ready after a capture OOM: the screen holds the table's header once, every event
    as one whole line above it (none glued onto a row), the failed attempt as a short note,
    and the file where every event is in full."""
    config = sim.write_toml(capture_oom(sim))

    screen = spawn_up(config, "--until-ready")
    code = screen.run_to_end(90)

    lines = screen.lines()
    text = "\n".join(lines)
    assert 0 == code, text
    headers = [i for i, line in enumerate(lines) if line.startswith("SERVER ")]
    assert 1 == len(headers), text
    header = headers[0]
    for line in lines[:header]:  # events: "HH:MM:SS server event fields", one per line
        assert line[2] == ":" and line[5] == ":", line
        assert "SERVER " not in line and "mfs=" not in line.split("params=")[0], line
    assert any(f"{SERVER} attempt.failed attempt=1 outcome=oom_graph_capture" in line
               for line in lines[:header])
    row = next(line for line in lines[header + 1:] if line.startswith(f"{SERVER} "))
    assert "#1 OOM in target decode capture, bs 96" in row, row
    # While attempt 2 ran, its row said what changed and how far it got.
    rows = [line for line in screen.seen if line.startswith(f"{SERVER} ")]
    assert any(" ready " in r for r in rows), rows
    assert any("#1 OOM in target decode capture, bs 96 → 0.844" in r for r in rows), rows
    assert "Traceback" not in text and "torch.OutOfMemoryError" not in text
    log_path = sim.state_dir / "up.log"
    assert f"events in full: {log_path}" in text
    events = [json.loads(line) for line in log_path.read_text().splitlines()]
    failed = next(e for e in events if e["event"] == "attempt.failed")
    assert failed["evidence"], failed  # the full evidence is in the file, not on screen


def test_give_up_reason_shows_policy_brackets(sim: SimSetup) -> None:
    """Giving up after max_attempts: the reason, which names ``[policy] max_attempts``,
    reaches the screen with its brackets, in the table's note and in the last message."""
    config = sim.write_toml(capture_oom(sim, max_attempts=1))

    screen = spawn_up(config, "--until-ready")
    code = screen.run_to_end(90)

    text = "\n".join(screen.lines())
    assert 4 == code, text
    assert "[policy] max_attempts" in text, text
    assert b"raise  max_attempts" not in screen.raw
    assert f"{SERVER} gave up: " in text
