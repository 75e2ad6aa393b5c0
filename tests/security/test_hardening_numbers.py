"""Numbers from text launcher does not control, and one server's failure kept to that server
(security review 2026-12-05, findings H1, M1, M2, M3 and L3).

Python refuses ``int()`` of more than 4300 digits (ValueError), ``float()`` makes a long
number ``inf``, ``json`` reads ``1e400`` as ``inf``, ``"²".isdigit()`` is true: each of those,
read from a server's log, a /health answer, an attempt file, a model's config.json or the
agent's frames, once stopped `up` for every server. Every such number now goes through
``launcher.untrusted``, and a supervision that raises anyway is given up alone.
"""

from __future__ import annotations

import json
import math
import queue
import re
import shutil
import signal
import socket
import subprocess
import sys
import textwrap
import threading
import time
from collections.abc import AsyncIterator, Callable, Iterator, Mapping, Sequence
from contextlib import aclosing, asynccontextmanager
from pathlib import Path
from typing import Any

import anyio
import pytest
from structlog.testing import capture_logs

from launcher.cli.app import EXIT_NOT_READY, EXIT_OK
from launcher.config.load import config_from_dict
from launcher.errors import RemoteCommandError
from launcher.hooks.metrics import Metrics
from launcher.hooks.slack import SlackNotifier
from launcher.host import agent as follow_agent
from launcher.host import health
from launcher.host import run as remote
from launcher.host.follower import Frame, FrameDecoder, HostFollower
from launcher.host.transport import make_transport
from launcher.host.transport.base import CommandResult, Duplex
from launcher.host.transport.local import LocalTransport
from launcher.sglang import logparse
from launcher.sglang.modelfacts import ModelFacts, NoEstimate
from launcher.sglang.outcome import Numbers
from launcher.sglang.versions import version_tuple
from launcher.supervise import events as ev
from launcher.supervise.lifecycle import State
from launcher.supervise.router import Registrar, RouterSupervisor
from launcher.supervise.supervisor import ServerSupervisor, supervise_all
from launcher.untrusted import bounded_float, bounded_int, finite_number, parse_stamp
from tests.simhost import free_port, model_dir
from tests.supervise import SimSetup, cli_argv, cli_env, json_lines, run_cli

pytestmark = pytest.mark.timeout(120)

HUGE = "9" * 5000  # past Python's 4300-digit int() limit


# --- the helpers ------------------------------------------------------------------------------


def test_bounded_int_takes_at_most_18_ascii_digits_and_never_raises() -> None:
    assert 42 == bounded_int("42") == bounded_int(b"42")
    assert 10**17 == bounded_int("1" + "0" * 17)
    assert -3 == bounded_int("-3", signed=True)
    for bad in ["", " 1", "1 ", "+1", "1_000", "-1", "²", "٣", "1e3", "9" * 19, HUGE]:
        assert bounded_int(bad) is None, bad
    assert bounded_int(b"\xff") is None
    assert bounded_int("1234", max_digits=3) is None


def test_bounded_float_and_finite_number_are_finite_or_none() -> None:
    assert 12.5 == bounded_float("12.5")
    for bad in ["inf", "nan", "1e400", HUGE, "1." + HUGE, "-1", "1.", ".5", "²"]:
        assert bounded_float(bad) is None, bad
    assert 4096 == finite_number(4096) == finite_number(4096.0)
    for bad_value in [math.inf, math.nan, -1, 2**41, True, "7", None]:
        assert finite_number(bad_value) is None, bad_value


@pytest.mark.parametrize("text", [
    "0001-01-01T00:00:00", "0001-01-01T00:00:00+01:00", "9999-12-31T23:59:59-01:00",
    "2026-12-05T06:00:00", "1999-12-31T23:00:00+00:00", "garbage", HUGE, "",
])
def test_a_started_at_launcher_cannot_have_written_is_no_time(text: str) -> None:
    assert parse_stamp(text) is None


def test_a_started_at_launcher_writes_is_read() -> None:
    stamp = parse_stamp("2026-12-05T06:00:00+00:00\n")
    assert stamp is not None and 1796450400.0 == stamp.timestamp()


# --- H1: every regex of the log parser, fed a 5000-digit number -------------------------------

# One line (a message, or a whole bare line) for each compiled pattern of logparse; the test
# below fails for a pattern none of these lines matches, so a new regex needs a line here.
MESSAGES = [
    "Capture cuda graph bs [1, 2, 4]",
    "Capture target decode CUDA graph end. bs=[1, 2]",
    "Capture cuda graph begin. This can take up to several minutes. avail mem=12.00 GB",
    "Capture cuda graph end. Time elapsed: 1.00 s. mem usage=0.50 GB. avail mem=10.00 GB.",
    "Init torch distributed ends. mem usage=0.10 GB",
    "Memory baseline taken. mem usage=0.20 GB",
    "Load weight begin. avail mem=78.00 GB",
    "Load weight end. type=LlamaForCausalLM, avail mem=60.00 GB, mem usage=18.00 GB.",
    "Load weight end. avail mem=59.00 GB, mem usage=1.00 GB. type=LlamaForCausalLMEagle3",
    "KV Cache is allocated. #tokens: 1000, K size: 1.00 GB, V size: 1.00 GB",
    "KV Cache is allocated. dtype: torch.bfloat16, #tokens: 1000, KV size: 2.00 GB",
    "Mamba Cache is allocated. max_mamba_cache_size: 10, conv_state size: 0.10 GB, "
    "ssm_state size: 1.00 GB",
    "Memory pool end. avail mem=20.00 GB",
    "Max running requests is reset to 48 for speculative decoding",
    "max_total_num_tokens=1000, chunked_prefill_size=8192, max_running_requests=48, "
    "available_gpu_mem=10.00 GB",
    "server_args=ServerArgs(model_path='m', mem_fraction_static=0.88, cuda_graph_max_bs=8, "
    "speculative_algorithm='EAGLE', speculative_num_steps=3, speculative_eagle_topk=1, "
    "speculative_num_draft_tokens=4, max_running_requests=48, "
    "mamba_scheduler_strategy='no_buffer')",
    "The server is fired up and ready to roll!",
    "INFO:     Uvicorn running on http://127.0.0.1:30000",
    'INFO:     127.0.0.1:45678 - "GET /health HTTP/1.1" 200 OK',
    "Decode batch. #running-req: 1, #token: 12, gen throughput (token/s): 3.00",
]
BARE = [
    "Loading safetensors checkpoint shards:  50% Completed | 1/2 [00:01<00:01,  1.00it/s]",
    "Capturing batches (bs=8 avail_mem=10.00 GB):  50%|#####     | 2/4 [00:01<00:01,  1.50it/s]"
    "[2026-12-05 06:00:00 TP0] Load weight begin. avail mem=78.00 GB",
    "Traceback (most recent call last):",
    '  File "x.py", line 12, in f',
    "torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 7.50 GiB. GPU 1 has a total "
    "capacity of 94.97 GiB of which 2.30 GiB is free.",
    "",
    "The above exception was the direct cause of the following exception:",
    "",
    "Traceback (most recent call last):",
    '  File "y.py", line 3, in g',
    "RuntimeError: CUDA out of memory. Tried to allocate 20.00 MiB (GPU 0; 79.35 GiB total "
    "capacity; 77.80 GiB already allocated; 3.06 MiB free; 78.00 GiB reserved)",
    "RuntimeError: Not enough memory. Please try to increase --mem-fraction-static. "
    "KV pool <= 0 (mem_fraction_static=0.80, minimum viable = 0.85). Raise "
    "--mem-fraction-static above 0.85.",
    "ValueError: Not enough GPU memory for hybrid (mamba/linear-attention) state cache: "
    "max_mamba_cache_size=-3, mamba_cache_per_req=12.5 MB; use --mamba-scheduler-strategy "
    "extra_buffer; set SGLANG_ENABLE_SPEC_V2=1. Try to set disable_overlap_schedule=True. "
    "Hybrid (mamba/linear-attention) state cache is too small",
    "Possible solutions:",
    "NCCL WARN Failed to CUDA calloc 10 bytes; NCCL error; Cuda failure 2 'out of memory'",
    "Capture cuda graph failed: Fail when using backend: flashinfer for decode runner",
    "OSError: [Errno 98] Address already in use; EADDRINUSE; port 30000 is not available in "
    "30 seconds; Port is already in use",
    "error: unrecognized arguments: --x; User-specified context_length (9000) is greater than "
    "the derived context_length",
    "Repo id must be in the form; RepositoryNotFoundError",
    "CUDA error: an illegal memory access was encountered",
    "[Errno 12] Cannot allocate memory",
    "The memory capacity is unbalanced. Health check failed. Watchdog timeout "
    "(self.watchdog_timeout=300)",
    "Initialization failed. warmup error: boom. Received sigquit from a child process",
    "Exit code: -9",
    "Killed",
    "Uvicorn running on http://127.0.0.1:30000",
    "a bar redrawn 10/20\r",  # a record's end inside (LineSplitter's terminators)
]
STAMP = "[2026-12-05 06:00:00] "
RANKED = "[2026-12-05 06:00:00.123 DP0 TP1] "


def _patterns() -> Iterator[tuple[str, re.Pattern[str]]]:
    """Every compiled pattern logparse holds, by name: module attributes, and those inside
    its tuples, lists and dicts (one level of tuples within them too)."""
    def inside(name: str, value: Any) -> Iterator[tuple[str, re.Pattern[str]]]:
        if isinstance(value, re.Pattern):
            yield name, value
        elif isinstance(value, tuple | list):
            for i, item in enumerate(value):
                yield from inside(f"{name}[{i}]", item)
        elif isinstance(value, dict):
            for key, item in value.items():
                yield from inside(f"{name}[{key}]", item)

    for name, value in vars(logparse).items():
        yield from inside(name, value)


PATTERNS = sorted(_patterns(), key=lambda item: item[0])


def _lines() -> list[str]:
    return ([STAMP + m for m in MESSAGES] + [RANKED + m for m in MESSAGES] + BARE
            + [STAMP + line for line in BARE])


def _matching(pattern: re.Pattern[str]) -> list[str]:
    """The lines ``pattern`` finds something in, whole or in their message."""
    return [line for line in _lines()
            if pattern.search(line) or pattern.search(line.partition("] ")[2])]


def _inflated(line: str) -> str:
    """``line`` with every run of digits after its prefix made 5000 digits long; the prefix's
    rank numbers too."""
    prefix = ""
    if line.startswith((STAMP, RANKED)):
        prefix, line = line[: line.index("] ") + 2], line[line.index("] ") + 2:]
        prefix = re.sub(r"([A-Z]+)\d+", lambda m: m.group(1) + HUGE, prefix)
    return prefix + re.sub(r"\d+", HUGE, line)


def test_every_pattern_of_the_log_parser_has_a_line_here() -> None:
    """So that a new regex in logparse cannot escape the 5000-digit test below."""
    assert len(PATTERNS) >= 50
    missing = [name for name, pattern in PATTERNS if not _matching(pattern)]
    assert [] == missing


def _finite(numbers: Numbers) -> None:
    for key, value in numbers.as_dict().items():
        for v in value.values() if isinstance(value, dict) else [value]:
            if isinstance(v, float):
                assert math.isfinite(v), (key, v)
            if isinstance(v, int) and not isinstance(v, bool):
                assert abs(v) < 2**63, key


@pytest.mark.parametrize("name,pattern", PATTERNS, ids=[n for n, _ in PATTERNS])
def test_every_pattern_of_the_log_parser_takes_a_5000_digit_number(
    name: str, pattern: re.Pattern[str],
) -> None:
    """H1: each line this pattern matches, every number in it made 5000 digits long, goes
    through every entry point of logparse (the follower, line by line and as one record;
    parse_line with its ranks and time; the OOM and error figures; the signatures) without
    an exception, and the figures read stay finite."""
    lines = _matching(pattern)
    assert lines, name
    follower = logparse.LogFollower()
    for line in [*_lines(), *lines]:  # the context a line needs (a traceback, a phase) first
        big = _inflated(line)
        follower.feed_line(big)
        parsed = logparse.parse_line(big)
        assert isinstance(parsed.ranks, dict)
        parsed.when  # noqa: B018  (a property that parses)
        logparse.parse_oom(big)
        numbers = Numbers()
        logparse.fill_error_figures(numbers, big, overwrite=True)
        _finite(numbers)
        logparse.match_signatures(big)
        logparse.is_routine(big)
        logparse.graph_pass_of(big, speculative=True)
    follower.finish()
    follower.failures()
    _finite(follower.numbers)
    splitter = logparse.LineSplitter()
    for line in splitter.feed("\n".join(_inflated(x) for x in lines).encode() + b"\r\n"):
        logparse.LogFollower().feed_line(line)


# --- H1 end to end, and the isolation of one server's supervision -----------------------------


def quick(sim: SimSetup, **kwargs: Any) -> dict[str, Any]:
    return sim.data(mem_fraction_static=0.8, cuda_graph_max_bs=8, **kwargs)


def with_second_server(data: dict[str, Any], **changes: Any) -> dict[str, Any]:
    """``data`` plus a healthy second server ``sim1`` on GPU 1 and its own port."""
    second = dict(data["servers"][0], name="sim1", gpus=[1], port=free_port(), **changes)
    data["servers"].append(second)
    return data


class Up:
    """`launcher up CONFIG --log-format json` in the background; its JSON lines read (by a
    thread) as they come."""

    def __init__(self, config: Path, *args: str) -> None:
        self.proc = subprocess.Popen(
            cli_argv("up", str(config), "--log-format", "json", *args), env=cli_env(),
            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, start_new_session=True,
        )
        self.seen: list[dict[str, Any]] = []
        self.stderr = ""
        self._lines: queue.Queue[str | None] = queue.Queue()
        self._reader = threading.Thread(target=self._read, daemon=True)
        self._reader.start()

    def _read(self) -> None:
        assert self.proc.stdout is not None
        for line in self.proc.stdout:
            self._lines.put(line)
        self._lines.put(None)

    def _drain(self, wait_s: float) -> bool:
        """Take the lines read so far (waiting up to ``wait_s`` for one); False at the end."""
        try:
            line = self._lines.get(timeout=wait_s)
            while True:
                if line is None:
                    return False
                self.seen.extend(json_lines(line))
                line = self._lines.get_nowait()
        except queue.Empty:
            return True

    def has(self, server: str, event: str, **fields: Any) -> bool:
        return any(e.get("server") == server and e.get("event") == event
                   and all(e.get(k) == v for k, v in fields.items()) for e in self.seen)

    def wait(self, done: Callable[[], bool], timeout: float = 60.0) -> None:
        """Read events until ``done()``; fails when `up` ended first or at the timeout."""
        deadline = time.monotonic() + timeout
        while not done():
            assert time.monotonic() < deadline, f"timed out: {self.summary()}"
            if not self._drain(0.2):
                self.stop()
                raise AssertionError(f"up ended with {self.proc.returncode}: {self.summary()}")

    def summary(self) -> str:
        names = [(e.get("server"), e.get("event")) for e in self.seen]
        return f"{names[-40:]}\n{self.stderr[-3000:]}"

    def stop(self) -> int:
        """SIGTERM (as systemd stops it); the exit code."""
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
        try:
            self.proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()
        self._reader.join(10)
        self._drain(0)  # what the reader put there before its end
        if self.proc.stdout is not None and not self._reader.is_alive():
            self.proc.stdout.close()
        if self.proc.stderr is not None and not self.proc.stderr.closed:
            self.stderr += self.proc.stderr.read()
            self.proc.stderr.close()
        return self.proc.returncode


@pytest.fixture
def ups() -> Iterator[list[Up]]:
    started: list[Up] = []
    try:
        yield started
    finally:
        for up in started:
            up.stop()


def printer(*lines: str, then: str = "time.sleep(120)") -> list[str]:
    """A server command that prints ``lines`` (stamped as SGLang stamps them), then ``then``."""
    code = "import sys, time\n" + "".join(
        f"print({(STAMP + line)!r}, flush=True)\n" for line in lines) + then
    return [sys.executable, "-c", code]


def test_a_5000_digit_batch_size_in_one_log_leaves_up_status_and_diagnose_working(
    sim: SimSetup, ups: list[Up],
) -> None:
    """H1, the review's repro: sim0 prints ``Capture cuda graph bs [1, 2, 9…9]`` (then a
    weights line, to show it was read past). `up` keeps supervising both: sim1 becomes
    ready, sim0 is followed on, nothing is an internal error (the number is simply not a
    figure); `status --json` and `diagnose` on that log exit normally."""
    data = with_second_server(quick(sim))
    data["servers"][0]["command"] = printer(f"Capture cuda graph bs [1, 2, {HUGE}]",
                                            "Load weight begin. avail mem=78.00 GB")
    config = sim.write_toml(data)
    up = Up(config)
    ups.append(up)

    up.wait(lambda: up.has("sim1", "server.ready")
            and up.has("sim0", "phase.entered", phase="weights"))

    status = run_cli("status", str(config), "--json")
    assert EXIT_NOT_READY == status.returncode, status.stderr
    rows = {r["server"]: r for r in json.loads(status.stdout)}
    assert (True, False, True) == (rows["sim0"]["running"], rows["sim0"]["ready"],
                                   rows["sim1"]["ready"])
    log = sim.attempt_dir(1) / "log"
    assert HUGE in log.read_text()
    diagnose = run_cli("diagnose", str(log), "--json")  # not ready: "problems found" (1)
    assert 1 == diagnose.returncode and "Traceback" not in diagnose.stderr, diagnose.stderr
    assert "incomplete" == json.loads(diagnose.stdout)["outcome"]
    ready = sim.root / "ready.log"  # the same start-up, then ready: 0
    ready.write_text(log.read_text() + STAMP + logparse.READY_TEXT + "\n")
    diagnose = run_cli("diagnose", str(ready), "--json")
    assert EXIT_OK == diagnose.returncode, diagnose.stderr
    assert "ready" == json.loads(diagnose.stdout)["outcome"]
    assert up.proc.poll() is None
    assert EXIT_OK == up.stop(), up.stderr
    assert not [e for e in up.seen if e.get("event") == "server.internal_error"]
    assert "Traceback" not in up.stderr


class Bomb:
    """A hook with a bug: it raises on ``phase.entered`` (what a bug anywhere in one
    server's supervision does: an exception that is not a LauncherError)."""

    def __call__(self, server: str, event: ev.Event) -> None:
        if isinstance(event, ev.PhaseEntered):
            raise RuntimeError("bug in a hook")


async def test_an_unexpected_exception_gives_that_server_up_and_keeps_the_others(
    sim: SimSetup,
) -> None:
    """Isolation (H1's first fix): sim0's supervision raises a RuntimeError; sim0 is given up
    with ``server.internal_error`` (its traceback logged, an ERROR), metrics and Slack say
    so, its attempt is marked given up for `status`; sim1 becomes ready all the same."""
    config = config_from_dict(with_second_server(quick(sim)), environ={})
    transport = make_transport(config.hosts[0])
    seen: list[tuple[str, ev.Event]] = []
    metrics = Metrics()
    slack = SlackNotifier(None, servers_info={})

    def record(server: str, event: ev.Event) -> None:
        seen.append((server, event))

    sups = [ServerSupervisor(config, s, transport, sglang_version="0.5.23",
                             hooks=[record, metrics, slack, *([Bomb()] if s.name == "sim0"
                                                              else [])])
            for s in config.servers]
    with capture_logs() as logs:
        with anyio.fail_after(90):
            results = await supervise_all(sups, until_ready=True)

    assert State.GAVE_UP == results["sim0"]
    assert ("sim1", "server.ready") in [(s, e.name) for s, e in seen]
    [(_, internal)] = [(s, e) for s, e in seen if isinstance(e, ev.ServerInternalError)]
    assert isinstance(internal, ev.ServerInternalError)
    assert "RuntimeError: bug in a hook" == internal.error
    assert 'raise RuntimeError("bug in a hook")' in internal.traceback
    assert 1 == internal.attempt
    assert [("sim0", "server.internal_error")] == [
        (s, e.name) for s, e in seen if e.name == "server.internal_error"]
    logged = [x for x in logs if x["event"] == "server.internal_error"]
    assert 1 == len(logged) and "error" == logged[0]["log_level"]
    assert "bug in a hook" in logged[0]["traceback"]
    assert 1.0 == metrics.registry.get_sample_value(
        "launcher_server_state", {"server": "sim0", "host": "", "state": "gave_up"})
    [message] = [x for x in logs if x["event"] == "notify.message" and x["server"] == "sim0"]
    assert "internal_error" == message["kind"] and "bug in a hook" in message["text"]
    assert "launcher internal error" in sups[0].machine.reason
    gave_up = sim.attempt_dir(1) / "gave_up"
    assert "RuntimeError: bug in a hook" in gave_up.read_text()


class Buggy:
    """A router host whose transport has a bug: every command raises a TypeError."""

    host_name = "a"

    async def run(self, argv: Any, **kwargs: Any) -> CommandResult:
        raise TypeError("bug in a transport")


async def test_an_unexpected_exception_in_a_routers_supervision_gives_the_router_up() -> None:
    """The same for a router: ``router.internal_error`` (with its traceback), state gave_up,
    and ``run`` returns instead of raising into every server's task group."""
    from tests.supervision.test_router import two_server_config

    config = two_server_config()
    seen: list[ev.Event] = []
    sup = RouterSupervisor(config, config.router("front"), Buggy(),  # type: ignore[arg-type]
                           Registrar(config, config.routers),
                           hooks=[lambda _, e: seen.append(e)])
    with anyio.fail_after(10):
        assert "gave_up" == await sup.run()
    [internal] = seen
    assert isinstance(internal, ev.RouterInternalError)
    assert "TypeError: bug in a transport" == internal.error
    assert "bug in a transport" in internal.traceback


# --- M1: a /health status code of thousands of digits -----------------------------------------

HEALTH_SERVER = textwrap.dedent('''
    import socket, sys, time
    port = int(sys.argv[sys.argv.index("--port") + 1])
    print("[2026-12-05 06:00:00] The server is fired up and ready to roll!", flush=True)
    srv = socket.create_server(("127.0.0.1", port))
    while True:
        conn, _ = srv.accept()
        with conn:
            conn.recv(65536)
            conn.sendall(b"HTTP/1.1 " + b"9" * 4086)
            time.sleep(0.3)
            conn.sendall(b"9" * 4096 + b" OK\\r\\n\\r\\n")
        with open(sys.argv[1], "a") as fh:
            fh.write("answered\\n")
''')


def test_a_health_answer_of_thousands_of_digits_fails_that_probe_only(
    sim: SimSetup, ups: list[Up],
) -> None:
    """M1: sim0 answers every /health with ``HTTP/1.1 9…9`` (8182 digits, in two writes).
    `up` probes it through the host's agent again and again without an exception, and
    keeps sim1 (ready) supervised."""
    answered = sim.root / "answered"
    data = with_second_server(quick(sim))
    data["servers"][0]["command"] = [sys.executable, "-c", HEALTH_SERVER, str(answered)]
    config = sim.write_toml(data)
    up = Up(config)
    ups.append(up)

    up.wait(lambda: up.has("sim1", "server.ready") and answered.exists()
            and answered.read_text().count("answered") >= 3)
    time.sleep(0.5)  # the third answer is read

    assert up.proc.poll() is None, up.summary()
    assert not up.has("sim0", "server.ready")
    assert EXIT_OK == up.stop(), up.stderr
    assert "Traceback" not in up.stderr
    assert not [e for e in up.seen if e.get("event") == "server.internal_error"]


def _answering(*pieces: bytes) -> tuple[socket.socket, threading.Thread]:
    """A TCP server on 127.0.0.1 that answers one connection with ``pieces``, 0.3 s apart."""
    srv = socket.create_server(("127.0.0.1", 0))

    def serve() -> None:
        conn, _ = srv.accept()
        with conn:
            conn.recv(65536)
            for piece in pieces:
                conn.sendall(piece)
                time.sleep(0.3)

    thread = threading.Thread(target=serve, daemon=True)
    thread.start()
    return srv, thread


async def test_probe_health_reads_at_most_4_kib_in_all_and_takes_only_3_digits() -> None:
    """M1 in launcher.host.health: a status line of 8191 digits sent in two pieces is read to
    4 KiB in total and is not an HTTP answer (no ValueError); only 3 digits are a status."""
    srv, thread = _answering(b"HTTP/1.1 " + b"9" * 4086, b"9" * 4096 + b" OK\r\n\r\n")
    try:
        port = int(srv.getsockname()[1])
        ok, detail = await health.probe_health(
            lambda: anyio.connect_tcp("127.0.0.1", port), 5.0)
    finally:
        thread.join(5)
        srv.close()
    assert not ok and detail.startswith("RemoteProtocolError: not an HTTP answer"), detail
    assert 200 == health.status_code(b"200")
    assert health.status_code(b"2000") is None and health.status_code("²".encode()) is None


# --- M2: forged exit_status and started_at in a live attempt ----------------------------------


FORGER = textwrap.dedent('''
    import os, pathlib, signal, sys, time
    attempt = pathlib.Path(sys.argv[1]) / "sim0" / os.environ["LAUNCHER_ATTEMPT"]
    trigger = pathlib.Path(sys.argv[2])
    print("[2026-12-05 06:00:00] Load weight begin. avail mem=78.00 GB", flush=True)
    while not trigger.exists():
        time.sleep(0.1)
    # Server code forging its own exit status: the wrapper (its parent) is killed first,
    # so nobody writes the real one.
    (attempt / "exit_status").write_text(trigger.read_text())
    os.kill(os.getppid(), signal.SIGKILL)
    sys.exit(3)
''')


def test_forged_started_at_and_exit_status_in_a_live_attempt_are_skipped(
    sim: SimSetup, ups: list[Up],
) -> None:
    """M2: while `up` supervises sim0 and sim1, sim0's live attempt gets ``started_at`` =
    ``0001-01-01T00:00:00+01:00``: `status --json`, `describe` and `describe --json` still
    answer (started_at unknown); then a naive ``0001-01-01T00:00:00``, and a restarted
    `up` adopts both servers; then sim0 writes 5000 digits into its ``exit_status`` and
    dies: `up` relaunches sim0 and keeps sim1, with no internal error."""
    trigger = sim.root / "trigger"
    data = with_second_server(quick(sim))
    data["servers"][0]["command"] = [sys.executable, "-c", FORGER, str(sim.run_dir),
                                     str(trigger)]
    config = sim.write_toml(data)
    up = Up(config)
    ups.append(up)
    up.wait(lambda: up.has("sim0", "phase.entered", phase="weights")
            and up.has("sim1", "server.ready"))
    live = sim.attempt_dir(1)

    (live / "started_at").write_text("0001-01-01T00:00:00+01:00\n")
    status = run_cli("status", str(config), "--json")
    assert EXIT_NOT_READY == status.returncode, status.stderr
    rows = {r["server"]: r for r in json.loads(status.stdout)}
    assert (True, None) == (rows["sim0"]["running"], rows["sim0"]["started_at"])
    assert rows["sim1"]["started_at"] is not None
    for args in (["describe", str(config), "sim0"], ["describe", str(config), "sim0", "--json"]):
        described = run_cli(*args)
        assert EXIT_OK == described.returncode, described.stderr

    (live / "started_at").write_text("0001-01-01T00:00:00\n")
    assert EXIT_OK == up.stop(), up.stderr
    again = Up(config)
    ups.append(again)
    again.wait(lambda: again.has("sim0", "server.adopted") and again.has("sim1", "server.adopted"))

    trigger.write_text(HUGE)
    again.wait(lambda: again.has("sim0", "attempt.started", attempt=2))
    assert HUGE == (live / "exit_status").read_text()
    assert again.proc.poll() is None
    assert EXIT_OK == again.stop(), again.stderr
    assert not [e for e in again.seen if e.get("event") == "server.internal_error"]
    assert "Traceback" not in again.stderr


def test_the_follow_trailer_and_exit_status_files_take_no_5000_digit_number() -> None:
    """M2 in launcher.host.run: a trailer with a 5000-digit exit status or log size is
    incomplete (the host is asked again), not a ValueError."""
    assert (False, 3, 10) == remote._parse_trailer(b"0 3 10\n")
    assert remote._parse_trailer(b"0 " + HUGE.encode() + b" 10\n") is None
    assert remote._parse_trailer(b"1 - " + HUGE.encode() + b"\n") is None


# --- M3: a model config.json with 1e400 -------------------------------------------------------


def test_a_config_json_figure_that_is_not_finite_is_no_estimate() -> None:
    with pytest.raises(NoEstimate, match="hidden_size"):
        ModelFacts.from_config(json.loads('{"architectures": ["LlamaForCausalLM"], '
                                           '"num_hidden_layers": 2, "hidden_size": 1e400}'))
    assert () == version_tuple(HUGE + ".1")
    assert (0, 5) == version_tuple("0.5." + HUGE)


def test_a_model_whose_config_json_says_1e400_is_reported_and_the_other_comes_up(
    sim: SimSetup,
) -> None:
    """M3: sim0's model says ``"hidden_size": 1e400`` (JSON's infinity), neither server has
    configured params: `plan` shows both (sim0 without an estimate, naming the field), and
    `up --until-ready` brings sim1 up."""
    bad = sim.root / "bad-model"
    shutil.copytree(model_dir("tiny-1b-sim"), bad)
    cfg = (bad / "config.json").read_text()
    cfg = re.sub(r'"hidden_size":\s*\d+', '"hidden_size": 1e400', cfg)
    assert "1e400" in cfg
    (bad / "config.json").write_text(cfg)
    data = with_second_server(sim.data())
    data["servers"][0]["model_path"] = str(bad)
    config = sim.write_toml(data)

    plan = run_cli("plan", str(config), "--json")
    assert EXIT_OK == plan.returncode, plan.stderr
    assert "hidden_size" in plan.stdout + plan.stderr
    assert "OverflowError" not in plan.stderr

    up = run_cli("up", str(config), "--until-ready", "--log-format", "json", timeout=110)
    events = json_lines(up.stdout)
    assert ("sim1", "server.ready") in {(e.get("server"), e.get("event")) for e in events}, (
        up.stderr[-3000:])
    assert "OverflowError" not in up.stderr
    unavailable = [e for e in events
                   if e.get("event") == "estimate.unavailable" and e.get("server") == "sim0"]
    assert unavailable and "hidden_size" in unavailable[0]["why"]


# --- L3: a non-ASCII digit in exit_status -----------------------------------------------------


@pytest.mark.parametrize("status", ["²", HUGE])
def test_the_agent_sends_no_exit_status_for_a_forged_one_and_lives_on(
    tmp_path: Path, status: str,
) -> None:
    """L3 (and M2 for the agent): a followed server is gone and its exit_status says ``²``
    (a digit to ``str.isdigit``, not ASCII) or 5000 digits: the agent sends ``X`` with
    ``-`` (unknown) and keeps going, instead of dying on a UnicodeEncodeError."""
    child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    try:
        (tmp_path / "pid_start").write_text(follow_agent._ident(child.pid, "b") or "")
        (tmp_path / "log").write_bytes(b"")
        sent: list[bytes] = []
        now = [0.0]
        agent = follow_agent.Agent(sent.append, clock=lambda: now[0], boot_id="b")
        agent.feed(json.dumps({"op": "add", "key": 1, "dir": str(tmp_path), "offset": 0,
                               "pid": child.pid}).encode() + b"\n")
        child.kill()
        child.wait()
        (tmp_path / "exit_status").write_text(status)
        for _ in range(3):
            now[0] += follow_agent.SETTLE_S
            agent.round()
        assert [Frame("X", 1, 0, b"-")] == FrameDecoder().feed(b"".join(sent))
        assert {} == agent.followed
    finally:
        child.kill()
        child.wait()


# --- the host's follower: a bug in its channel's reader ---------------------------------------


class _BuggyDuplex:
    """The agent's channel with a bug in its reading: after the hello, ``receive`` raises a
    RuntimeError (not a LauncherError)."""

    def __init__(self, inner: Duplex) -> None:
        self.inner, self.reads = inner, 0

    async def send(self, data: bytes) -> None:
        await self.inner.send(data)

    async def receive(self) -> bytes:
        self.reads += 1
        if self.reads > 1:
            raise RuntimeError("bug in a frame")
        return await self.inner.receive()


class BuggyLocal(LocalTransport):
    @asynccontextmanager
    async def duplex(self, argv: Sequence[str], *, env: Mapping[str, str] | None = None,
                     ) -> AsyncIterator[Duplex]:
        async with super().duplex(argv, env=env) as inner:
            yield _BuggyDuplex(inner)


async def test_a_bug_in_the_agent_channel_ends_that_channel_not_the_followers_task_group(
    tmp_path: Path,
) -> None:
    """Isolation around ``HostFollower._serve``: its reader raising a RuntimeError ends the
    channel with a RemoteCommandError its followers handle (logged ``follow.internal_error``
    with the traceback); the follower's task group, which every server of the host shares,
    goes on (a second follow opens a new channel)."""
    transport = BuggyLocal("local")
    handle = await remote.launch(transport, remote.AttemptSpec(
        "s", 1, str(tmp_path / "run"), ["sh", "-c", "echo up; exec sleep 60"], {}))
    follower = HostFollower(transport)
    try:
        with capture_logs() as logs, anyio.fail_after(30):
            async with anyio.create_task_group() as tg:
                await tg.start(follower.run)
                for _ in range(2):
                    with pytest.raises(RemoteCommandError, match="RuntimeError: bug in a frame"):
                        async with aclosing(follower.follow(handle)) as items:
                            async for _item in items:
                                pass
                tg.cancel_scope.cancel()
        assert 2 == follower.channels_opened
        logged = [x for x in logs if x["event"] == "follow.internal_error"]
        assert 2 == len(logged) and "error" == logged[0]["log_level"]
        assert 'raise RuntimeError("bug in a frame")' in logged[0]["traceback"]
    finally:
        await remote.stop(transport, handle)
