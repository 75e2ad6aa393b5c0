"""`launcher up`'s live view through a real pseudo-terminal (pexpect), read as a screen (pyte,
a VT100 emulator): the table stays one table, events are whole lines above it, the notes and
the give-up reason read as written."""

from __future__ import annotations

import io
import json
import re
import time
from pathlib import Path
from typing import Any

import pexpect
import pyte
import pytest
from rich.console import Console

from launcher.cli import up
from launcher.memory.policy import AttemptRecord
from launcher.params import LaunchParams
from launcher.sglang.logparse import LogFollower
from launcher.sglang.outcome import Numbers, Outcome
from launcher.sglang.phases import Phase
from launcher.supervise.supervisor import Snapshot, failure_note
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
        self.rows: list[dict[str, str]] = []  # every table row shown, as {column: cell}

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
            self.rows += table_rows(self.lines())
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


def table_rows(lines: list[str]) -> list[dict[str, str]]:
    """The live table's rows on a screen, cut at the header's column starts."""
    header = next((line for line in lines if line.startswith("SERVER ")), None)
    if header is None:
        return []
    starts = [m.start() for m in re.finditer(r"(?<!\S)\S+(?: \S+)?", header)]
    names = [header[a:b].strip() for a, b in zip(starts, [*starts[1:], None], strict=True)]
    rows = []
    for line in lines[lines.index(header) + 1:]:
        if not line.startswith(f"{SERVER} "):
            continue
        cells = [line[a:b].strip() for a, b in zip(starts, [*starts[1:], None], strict=True)]
        rows.append(dict(zip(names, cells, strict=True)))
    return rows


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
    two simulated 80 GB GPUs at fraction 0.99 with graph bs 256)."""
    data = sim.data(model="llama-70b-sim", tp=2, mem_fraction_static=0.99,
                    cuda_graph_max_bs=256, policy=policy)
    data["servers"][0]["model_path"] = str(model_dir("llama-70b-sim"))
    return data


def test_live_view_keeps_one_table_with_events_above_it(sim: SimSetup) -> None:
    """Up to ready after a capture OOM: the screen holds the table's header once, every event
    as one whole line above it (none glued onto a row), the failed attempt as a short note,
    and the file where every event is in full."""
    data = capture_oom(sim)
    # Slower weights and capture, so that the screen (redrawn 4 times a second) shows them.
    slow = [{"kind": "slow", "phase": p, "factor": 4} for p in ("weights", "cuda_graph")]
    data["servers"][0]["env"]["SGLANG_SIM_FAULTS"] = str(sim.host.write_faults(slow))
    config = sim.write_toml(data)

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
    assert "#1 OOM in target decode capture, bs 256" in row, row
    assert " stopped (left running) " in row, row  # --until-ready: supervision ended, not it
    # While attempt 2 ran, its row said what changed and how far it got.
    rows = [line for line in screen.seen if line.startswith(f"{SERVER} ")]
    assert any(f"{SERVER} server.ready attempt=2 " in line for line in screen.seen)
    assert any("#1 OOM in target decode capture, bs 256 → 0.95" in r for r in rows), rows
    assert "Traceback" not in text and "torch.OutOfMemoryError" not in text
    # Progress in numbers, the stall budget left (30s in this config) and the server's time.
    weights = [r for r in screen.rows if r["STATE"].startswith("weights ")]
    assert any(re.fullmatch(r"shards \d+/\d+", r["PROGRESS"]) for r in weights), weights
    graphs = [r for r in screen.rows if r["STATE"].startswith("cuda graph ")]
    # Which frames the screen catches depends on the machine's speed: any capture pass will
    # do (`at bs N` shows for the passes whose bar names a bs: test_progress_reads_as_numbers).
    assert any(re.fullmatch(r"graphs \d+/\d+( at bs \d+)? \(target (prefill|decode)\)",
                            r["PROGRESS"]) for r in graphs), graphs
    for r in weights + graphs:
        assert re.fullmatch(r"(\d+)s", r["STALL LEFT"]) and int(r["STALL LEFT"][:-1]) <= 30, r
        assert re.fullmatch(r"\d+s", r["ELAPSED"]), r
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


# -- the pieces, without a terminal -----------------------------------------------------------


def test_a_new_capture_pass_starts_without_the_last_ones_full_bar() -> None:
    """A finished bar (36/36) of one pass is not the next pass's progress: between a
    ``Capture ... begin`` line and its own first bar there is none (no 100% flash); the next
    bar's numbers are its own. Line shapes of SGLang 0.5.23 (cuda_graph_setup.py)."""
    follower = LogFollower()
    for line in [
        "[2026-01-01 00:00:00 TP0] Capture target decode CUDA graph begin. backend=full, "
        "num_tokens_per_req=1, avail mem=20.00 GB",
        "Capturing batches (bs=32 avail_mem=19.80 GB): 100%|██████████| 36/36 [00:09<00:00]",
    ]:
        follower.feed_line(line)
    assert ((36, 36), 1.0) == (follower.steps, follower.progress)

    follower.feed_line("[2026-01-01 00:00:10 TP0] Capture draft extend CUDA graph begin. "
                       "backend=full, num_tokens_per_req=4, bs=[1, 2], avail mem=9.00 GB")
    assert (None, None) == (follower.steps, follower.progress)

    follower.feed_line("Capturing batches (bs=2 avail_mem=8.80 GB):  25%|██▌ | 1/4 [00:01<00:03]")
    assert ((1, 4), 0.25) == (follower.steps, follower.progress)


def snapshot(**fields: Any) -> Snapshot:
    base: dict[str, Any] = dict(server="s", host="h", state="cuda_graph", phase="cuda_graph",
                                progress=None, attempt=2, params="", elapsed_s=10.0, pid=1)
    return Snapshot(**(base | fields))


@pytest.mark.parametrize(("fields", "text"), [
    ({"steps": (28, 36), "graph_bs": 32, "graph_pass": "target_decode"},
     "graphs 28/36 at bs 32 (target decode)"),
    ({"steps": None, "graph_pass": "draft_extend", "progress": None},
     "capture starting (draft extend)"),
    ({"phase": "weights", "state": "weights", "steps": (12, 40)}, "shards 12/40"),
    ({"phase": "init", "state": "init"}, ""),
])
def test_progress_reads_as_numbers(fields: dict[str, Any], text: str) -> None:
    assert text == up._progress_text(snapshot(**fields))


def test_the_last_failure_in_a_few_words() -> None:
    """The note of a failed attempt: where it ran out of memory, at which bs, and the
    fraction (and bs) the next attempt uses."""
    numbers = Numbers(graph_pass="draft_extend", graph_last_bs=32)
    oom = AttemptRecord(LaunchParams(0.7, 32), Outcome.OOM_GRAPH_CAPTURE, Phase.CUDA_GRAPH,
                        numbers)
    assert "#2 OOM in draft extend capture, bs 32 → 0.644" == failure_note(
        2, oom, LaunchParams(0.644, 32))
    assert "#2 OOM in draft extend capture, bs 32 → 0.644, bs 16" == failure_note(
        2, oom, LaunchParams(0.644, 16))
    assert "#2 OOM in draft extend capture, bs 32" == failure_note(2, oom, None)
    hang = AttemptRecord(LaunchParams(0.7, 32), Outcome.HANG, Phase.WEIGHTS, Numbers())
    assert "#1 hang in weights" == failure_note(1, hang, LaunchParams(0.7, 32))


def test_the_note_stays_on_one_line_cut_with_an_ellipsis() -> None:
    """A long note does not fold onto several lines of the live table: it is one line, cut
    with an ellipsis, and the other columns keep their text."""
    note = ("attempt 1: oom_graph_capture in cuda_graph: torch.OutOfMemoryError: CUDA out of "
            "memory. Tried to allocate 2.00 GiB. GPU 0 has a total capacity of 79.19 GiB")
    snap = Snapshot(server="sim0", host="simhost", state="starting", phase=None, progress=None,
                    attempt=2, params="mem_fraction_static=0.844 cuda_graph_max_bs=256",
                    elapsed_s=61.0, pid=None, last_failure=note)
    console = Console(record=True, width=120, file=io.StringIO())
    console.print(up._view([snap]))
    _header, row = console.export_text().splitlines()  # one row: one line
    assert row.split()[:6] == ["sim0", "simhost", "starting", "2", "mfs=0.844", "bs=256"]
    assert row.rstrip().endswith("…") and "attempt 1: oom_graph_capture" in row


def test_a_narrow_terminal_leaves_columns_out_rather_than_cut_the_state() -> None:
    """At 80 columns the last screen (supervision ended, the server left running) shows the
    state whole: columns go, empty ones first, until the rest fits; at 160 all are there."""
    snap = Snapshot(server="demo", host="sim", state="stopped", phase="ready", progress=None,
                    attempt=2, params="mem_fraction_static=0.95 cuda_graph_max_bs=256",
                    elapsed_s=75.0, pid=4242,
                    last_failure="#1 OOM in target decode capture, bs 256 → 0.95")

    def screen(width: int) -> list[str]:
        console = Console(record=True, width=width, file=io.StringIO())
        console.print(up._view([snap], width))
        return console.export_text().splitlines()

    header, line = screen(80)
    assert len(line.rstrip()) <= 80 and "…" not in line.split("#1")[0], line
    assert line.split()[:4] == ["demo", "sim", "stopped", "(left"], line
    assert "stopped (left running)" in line and "mfs=0.95 bs=256" in line, line
    assert "STALL LEFT" not in header and "PROGRESS" not in header, header
    header, line = screen(160)
    assert header.split() == ["SERVER", "HOST", "STATE", "PROGRESS", "STALL", "LEFT",
                              "ATTEMPT", "PARAMS", "ELAPSED", "NOTE"], header
    assert line.rstrip().endswith("#1 OOM in target decode capture, bs 256 → 0.95"), line


def test_held_back_slack_messages_stay_out_of_the_live_view() -> None:
    """``notify.suppressed`` (info, no kind shown) stays out of the live view; it goes to
    up.log only, like the messages themselves."""
    assert up._event_line({"event": "notify.suppressed", "server": "sim0", "kind": "restart",
                            "suppressed": 2, "level": "info"}) is None
    assert up._event_line({"event": "notify.dropped", "server": "sim0", "level": "warning"})
