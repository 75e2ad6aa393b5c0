"""The scale bench's lean sim stand-in (launcher/sim/replay.py): pure helpers, then one real
recording of the sim replayed by real processes (real pid, real log, real HTTP)."""

from __future__ import annotations

import functools
import marshal
import os
import signal
import subprocess
import sys
import time
import urllib.error
import urllib.request
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from launcher.sglang.logparse import LineSplitter, LogFollower
from launcher.sim import replay
from tests.simhost import READY_LINE, free_port, make_sim_host, model_dir

REPLAY = Path(replay.__file__)


# -- pure ---------------------------------------------------------------------------------


def test_numbers_are_swapped_only_whole() -> None:
    assert "pid=<P> [<P>] 12345 123456 x<P>" == replay.swap_number(
        "pid=1234 [1234] 12345 123456 x1234", "1234", "<P>")


def test_a_number_split_across_pipe_reads_is_still_marked() -> None:
    """A loaded machine splits the sim's output anywhere; the recording cuts each read back to
    its last whole line, so a port cut in two ("...:33" | "109 ...") is still marked, and the
    last chunk keeps an unfinished line; every chunk keeps its place (``ready`` indexes them)."""
    chunks = [[0.1, b"Uvicorn running on http://127.0.0.1:33"],
              [0.2, b"109 (Press CTRL+C to quit)\nStarted server process [4242]\nta"],
              [0.3, b"il"]]
    text = replay.recorded_text(chunks, pid=4242, port=33109)
    assert "".join(s for _, s in text) == (
        f"Uvicorn running on http://127.0.0.1:{replay.PORT_MARK} (Press CTRL+C to quit)\n"
        f"Started server process [{replay.PID_MARK}]\ntail")
    assert [0.1, 0.2, 0.3] == [at for at, _ in text]
    assert "" == text[0][1]


def test_stamps_at_line_starts_are_renewed_and_nothing_else() -> None:
    now = time.mktime((2030, 1, 2, 3, 4, 5, 0, 0, -1)) + 0.25
    text = ("[2026-12-01 21:00:31] Load weight begin.\n"
            "\rLoading: 50%| [2026-12-01 21:00:31]\n"
            "[2026-12-01 21:00:31.123] ms stamp\n[2026-12-01 21:0")
    out, at_start = replay.restamp(text, True, now)
    assert ("[2030-01-02 03:04:05] Load weight begin.\n"
            "\rLoading: 50%| [2026-12-01 21:00:31]\n"
            "[2030-01-02 03:04:05.250] ms stamp\n[2026-12-01 21:0") == out
    assert not at_start
    assert ("[2026-12-01 21:00:31] x\n", True) == replay.restamp(
        "[2026-12-01 21:00:31] x\n", False, now)  # mid-line: the stamp is not at a start


def test_the_key_ignores_the_port_value_only() -> None:
    env = {"SGLANG_SIM_HOST": "/h.json"}
    assert replay.key_of(["--port", "1", "--tp-size", "1"], env) == replay.key_of(
        ["--port", "2", "--tp-size", "1"], env)
    assert replay.key_of(["--port", "1", "--tp-size", "1"], env) != replay.key_of(
        ["--port", "1", "--tp-size", "2"], env)
    assert replay.key_of(["--port=1"], env) != replay.key_of(["--port=1"], {})


# -- real processes ---------------------------------------------------------------------------


def _wait(pred: Callable[[], bool], timeout: float) -> None:
    deadline = time.monotonic() + timeout
    while not pred():
        if time.monotonic() > deadline:
            raise TimeoutError("condition not met")
        time.sleep(0.05)


def _has(log: Path, text: str) -> bool:
    return text in log.read_text(errors="replace")


def _health(port: int) -> int:
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/health", timeout=5) as resp:
            return int(resp.status)
    except urllib.error.HTTPError as exc:
        return int(exc.code)


def _normalized(text: str) -> list[str]:
    """Lines with their leading stamps blanked (the replay renews them)."""
    out, _ = replay.restamp(text, True, 0.0)
    return out.replace(time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(0.0)),
                       "STAMP").split("\n")


Start = Callable[[int, Path], "subprocess.Popen[bytes]"]


@pytest.fixture
def replaying(tmp_path: Path) -> Iterator[Start]:
    sim = make_sim_host(tmp_path, gpu_count=2, gpu_total_gib=8.0)
    env = dict(sim.env, CUDA_VISIBLE_DEVICES="0",
               SGLANG_SIM_REPLAY_DIR=str(tmp_path / "recordings"))
    procs: list[subprocess.Popen[bytes]] = []

    def start(port: int, log: Path) -> subprocess.Popen[bytes]:
        flags = ["--model-path", str(model_dir("tiny-1b-sim")), "--tp-size", "1",
                 "--host", "127.0.0.1", "--port", str(port), "--log-level", "info",
                 "--skip-server-warmup"]
        with log.open("wb") as out:
            proc = subprocess.Popen([sys.executable, "-S", str(REPLAY), *flags],
                                    env=env, stdout=out,
                                    stderr=subprocess.STDOUT, start_new_session=True)
        procs.append(proc)
        return proc

    yield start
    for proc in procs:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()


def test_a_replay_writes_the_recorded_run_serves_health_and_shuts_down_as_sglang(
    replaying: Start, tmp_path: Path,
) -> None:
    """Two servers with the same flags: the first records the real sim once, both replay
    it byte for byte (own pid and port, renewed stamps), the launcher's log reader sees
    every phase and the ready line, /health is 200 once ready with uvicorn's access line,
    and SIGTERM after ready ends the way the sim did (SIGTERM lines, then SIGKILL)."""
    ports = [free_port(), free_port()]
    logs = [tmp_path / "a.log", tmp_path / "b.log"]
    procs = [replaying(ports[i], logs[i]) for i in range(2)]
    for log in logs:
        _wait(functools.partial(_has, log, READY_LINE), 120)
    recordings = list((tmp_path / "recordings").glob("replay-*.marshal"))
    assert 1 == len(recordings)
    for proc, port, log in zip(procs, ports, logs, strict=True):
        # The recorded lines after the ready line (uvicorn's) come at their recorded offsets,
        # a few ms later: wait for them before the access line is to be the last one.
        _wait(functools.partial(_has, log, f"Uvicorn running on http://127.0.0.1:{port} "), 10)
        assert 200 == _health(port)
        _wait(functools.partial(_has, log, "GET /health HTTP/1.1"), 10)
        text = log.read_text(errors="replace")
        assert f"Started server process [{proc.pid}]" in text
        assert '"GET /health HTTP/1.1" 200 OK' in text.splitlines()[-1]
        follower = LogFollower()
        for line in LineSplitter().feed(text.encode()):
            follower.feed_line(line)
        assert follower.ready_line_no is not None
        assert follower.phase is not None
    # Byte for byte: the first server's log is the recording with its own pid and port.
    recorded = marshal.loads(recordings[0].read_bytes())
    expected = "".join(text for _, text in recorded["startup"])
    expected = expected.replace(replay.PID_MARK, str(procs[0].pid))
    expected = expected.replace(replay.PORT_MARK, str(ports[0]))
    got = logs[0].read_bytes().decode("utf-8", "surrogateescape")  # \r frames kept
    want = "\n".join(_normalized(expected))
    assert want == "\n".join(_normalized(got))[:len(want)]
    procs[0].send_signal(signal.SIGTERM)
    assert -signal.SIGKILL == procs[0].wait(30)
    tail = logs[0].read_text()
    assert "SIGTERM received." in tail
    assert f"kill_process_tree called: parent_pid={procs[0].pid}" in tail


def test_bad_usage_exits_2_naming_the_problem(tmp_path: Path) -> None:
    base = {k: v for k, v in os.environ.items() if not k.startswith("SGLANG_SIM")}
    no_dir = subprocess.run([sys.executable, "-S", str(REPLAY), "--port", "1"], env=base,
                            capture_output=True, text=True, timeout=30)
    assert (2, f"launcher.sim.replay: {replay.ENV_DIR} is not set (the directory of "
               "recordings)\n") == (no_dir.returncode, no_dir.stderr)
    faults = subprocess.run(
        [sys.executable, "-S", str(REPLAY), "--port", "1"],
        env={**base, replay.ENV_DIR: str(tmp_path), "SGLANG_SIM_FAULTS": "/f.json"},
        capture_output=True, text=True, timeout=30)
    assert 2 == faults.returncode
    assert "faults are not replayed" in faults.stderr
