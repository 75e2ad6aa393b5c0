"""systemd integration: sd_notify over real sockets, the watchdog task, the status line, the
unit file (checked by systemd-analyze), the env example and the install script."""

from __future__ import annotations

import itertools
import os
import pwd
import re
import shutil
import signal
import socket
import struct
import subprocess
import sys
import tempfile
import threading
import time
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import anyio
import pytest
from structlog.testing import capture_logs

from launcher.config.load import config_from_dict
from launcher.config.schema import SlackConfig
from launcher.hooks.systemd import (
    STATUS_MAX_CHARS,
    SdNotifier,
    run_watchdog,
    status_summary,
    watchdog_interval,
)
from tests.supervise import SimSetup, cli_argv, cli_env

ROOT = Path(__file__).resolve().parents[2]
UNIT = ROOT / "systemd" / "launcher@.service"
ENV_EXAMPLE = ROOT / "systemd" / "launcher.env.example"
INSTALL = ROOT / "scripts" / "install-systemd.sh"
SHIPPED_EXEC = "/opt/launcher/.venv/bin/launcher"
DROPIN = ROOT / "systemd" / "launcher@.service.d" / "restart-steps.conf"


# --- a real NOTIFY_SOCKET ----------------------------------------------------------------


# Python does not export SO_TIMESTAMPNS; 35 is its value in Linux's asm-generic socket.h.
SO_TIMESTAMPNS = getattr(socket, "SO_TIMESTAMPNS", 35)


class Receiver:
    """A bound AF_UNIX datagram socket, like systemd's, read by a thread. Each datagram comes
    with the kernel's arrival time (SO_TIMESTAMPNS, wall clock: compare with ``time.time()``),
    so tests see when pings stopped however late the thread gets to read them."""

    def __init__(self, address: str | bytes) -> None:
        self.sock = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
        self.sock.setsockopt(socket.SOL_SOCKET, SO_TIMESTAMPNS, 1)
        self.sock.bind(address)
        self.sock.settimeout(0.02)
        self.got: list[tuple[float, bytes]] = []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._read, daemon=True)
        self._thread.start()

    def _read(self) -> None:
        while not self._stop.is_set():
            try:
                data, ancillary, _, _ = self.sock.recvmsg(4096, 256)
            except TimeoutError:
                continue
            arrived = time.time()
            for level, kind, payload in ancillary:
                if (level, kind) == (socket.SOL_SOCKET, SO_TIMESTAMPNS):
                    seconds, nanoseconds = struct.unpack("qq", payload[:16])
                    arrived = seconds + nanoseconds / 1e9
            self.got.append((arrived, data))

    def messages(self, count: int, timeout: float = 2.0) -> list[bytes]:
        """The first ``count`` datagrams, waiting up to ``timeout`` for them to arrive."""
        deadline = time.monotonic() + timeout
        while len(self.got) < count and time.monotonic() < deadline:
            time.sleep(0.005)
        return [data for _, data in self.got]

    def close(self) -> None:
        self._stop.set()
        self._thread.join()
        self.sock.close()


@pytest.fixture
def short_dir() -> Iterator[Path]:
    """A temp dir with a short path: AF_UNIX paths are limited to 107 bytes."""
    with tempfile.TemporaryDirectory(prefix="sd", dir="/tmp") as name:
        yield Path(name)


@pytest.fixture
def notify_socket(short_dir: Path) -> Iterator[tuple[str, Receiver]]:
    """``$NOTIFY_SOCKET`` value of a real path socket, and its receiver."""
    path = str(short_dir / "notify")
    receiver = Receiver(path)
    yield path, receiver
    receiver.close()


def test_path_socket_receives_every_message(notify_socket: tuple[str, Receiver]) -> None:
    """READY=1, STATUS=..., WATCHDOG=1 and STOPPING=1 arrive as separate datagrams, in order."""
    address, receiver = notify_socket
    notifier = SdNotifier.from_env({"NOTIFY_SOCKET": address})
    assert notifier is not None
    with notifier:
        sent = [
            notifier.ready(),
            notifier.status("1/2 ready"),
            notifier.watchdog(),
            notifier.stopping(),
        ]
    assert [True, True, True, True] == sent
    assert [b"READY=1", b"STATUS=1/2 ready", b"WATCHDOG=1", b"STOPPING=1"] == receiver.messages(4)


def test_status_if_changed_sends_each_new_line_once(
    notify_socket: tuple[str, Receiver],
) -> None:
    """status_if_changed skips the line systemd already has (also one sent with READY=1) and
    sends every other; a later WATCHDOG=1+STATUS= counts as the line systemd has."""
    address, receiver = notify_socket
    notifier = SdNotifier.from_env({"NOTIFY_SOCKET": address})
    assert notifier is not None
    with notifier:
        sent = [
            notifier.ready("0/1 ready; a: idle"),
            notifier.status_if_changed("0/1 ready; a: idle"),
            notifier.status_if_changed("0/1 ready; a: weights, attempt 1"),
            notifier.status_if_changed("0/1 ready; a: weights, attempt 1"),
            notifier.send(WATCHDOG=1, STATUS="1/1 ready"),
            notifier.status_if_changed("1/1 ready"),
            notifier.status_if_changed("0/1 ready; a: unhealthy, attempt 1"),
        ]
    assert [True, False, True, False, True, False, True] == sent
    assert [
        b"READY=1\nSTATUS=0/1 ready; a: idle",
        b"STATUS=0/1 ready; a: weights, attempt 1",
        b"WATCHDOG=1\nSTATUS=1/1 ready",
        b"STATUS=0/1 ready; a: unhealthy, attempt 1",
    ] == receiver.messages(4)


def test_status_if_changed_retries_a_line_that_failed_to_send(short_dir: Path) -> None:
    """A line whose datagram failed is not remembered: the next call sends it again."""
    path = str(short_dir / "notify")
    notifier = SdNotifier(path)  # nobody listens yet
    with notifier, capture_logs():
        assert not notifier.status_if_changed("0/1 ready")
        receiver = Receiver(path)
        try:
            assert notifier.status_if_changed("0/1 ready")
            assert [b"STATUS=0/1 ready"] == receiver.messages(1)
        finally:
            receiver.close()


@pytest.fixture
def slow_sim(tmp_path: Path) -> Iterator[SimSetup]:
    """A simulated host whose phases last long enough to be seen between two status ticks
    (0.2 s): at the default time scale the weight load lasts 0.225 s, and on a loaded CI
    machine a tick could fall on each side of it."""
    setup = SimSetup.create(tmp_path, time_scale=0.02)
    try:
        yield setup
    finally:
        setup.cleanup()


def test_up_sends_status_as_phases_change_not_only_with_pings(
    slow_sim: SimSetup, notify_socket: tuple[str, Receiver]
) -> None:
    """A real `launcher up` (as the unit runs it) under a NOTIFY_SOCKET whose watchdog pings
    only every 5 minutes: READY=1 comes with the first line, then a STATUS= for each phase
    the server goes through up to "1/1 ready", each line once (systemctl status is never a
    ping interval stale); SIGTERM then sends STOPPING=1."""
    sim = slow_sim
    address, receiver = notify_socket
    config = sim.write_toml(sim.data(mem_fraction_static=0.8, cuda_graph_max_bs=8))
    env = {"NOTIFY_SOCKET": address, "WATCHDOG_USEC": str(600 * 1_000_000)}
    with subprocess.Popen(
        cli_argv("up", str(config), "--log-format", "json"), cwd=ROOT, env=cli_env(env),
        stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True,
    ) as up:
        try:
            deadline = time.monotonic() + 60
            while (b"STATUS=1/1 ready" not in receiver.messages(1)
                   and up.poll() is None and time.monotonic() < deadline):
                time.sleep(0.05)
        finally:
            up.send_signal(signal.SIGTERM)
            _, stderr = up.communicate(timeout=30)
    assert 0 == up.returncode, stderr
    deadline = time.monotonic() + 5  # the reader thread may lag behind the socket
    while b"STOPPING=1" not in receiver.messages(1) and time.monotonic() < deadline:
        time.sleep(0.01)
    msgs = [m.decode() for m in receiver.messages(1)]
    statuses = [
        line.removeprefix("STATUS=")
        for m in msgs if not m.startswith("WATCHDOG=1")
        for line in m.split("\n") if line.startswith("STATUS=")
    ]
    assert msgs[0].startswith("READY=1\nSTATUS=0/1 ready"), msgs
    assert "1/1 ready" in statuses, statuses
    before = statuses[: statuses.index("1/1 ready")]
    assert any("weights" in s for s in before), statuses
    assert any("cuda_graph" in s for s in before), statuses
    repeats = [a for a, b in itertools.pairwise(statuses) if a == b]
    assert [] == repeats, statuses
    assert 1 == sum(m.startswith("WATCHDOG=1") for m in msgs), msgs  # one ping, at start
    assert "STOPPING=1" == msgs[-1], msgs


def test_abstract_socket_receives_messages() -> None:
    """A NOTIFY_SOCKET starting with '@' names an abstract socket ('\\0' + rest)."""
    name = f"launcher-test-{uuid.uuid4().hex}"
    receiver = Receiver(b"\0" + name.encode())
    try:
        notifier = SdNotifier.from_env({"NOTIFY_SOCKET": "@" + name})
        assert notifier is not None
        with notifier:
            notifier.ready(status="supervising")
            notifier.stopping()
        assert [b"READY=1\nSTATUS=supervising", b"STOPPING=1"] == receiver.messages(2)
    finally:
        receiver.close()


def test_send_joins_fields_and_flattens_newlines(notify_socket: tuple[str, Receiver]) -> None:
    """send() writes one KEY=VALUE line per field, upper-cased, with newlines in values made
    spaces so a value cannot inject another field."""
    address, receiver = notify_socket
    with SdNotifier(address) as notifier:
        notifier.send(WATCHDOG=1, status="a\nREADY=1\r")
    assert [b"WATCHDOG=1\nSTATUS=a READY=1 "] == receiver.messages(1)


def test_from_env_is_none_outside_systemd() -> None:
    """No, empty or non-AF_UNIX NOTIFY_SOCKET gives no notifier (vsock is logged)."""
    with capture_logs() as logs:
        found = [
            SdNotifier.from_env({}),
            SdNotifier.from_env({"NOTIFY_SOCKET": ""}),
            SdNotifier.from_env({"NOTIFY_SOCKET": "vsock:2:1234"}),
        ]
    assert [None, None, None] == found
    assert ["systemd.notify_unsupported"] == [entry["event"] for entry in logs]


def test_send_to_a_missing_socket_logs_and_returns_false(short_dir: Path) -> None:
    """A vanished NOTIFY_SOCKET is logged as systemd.notify_failed, never raised."""
    with SdNotifier(str(short_dir / "gone")) as notifier, capture_logs() as logs:
        sent = notifier.watchdog()
    assert sent is False
    assert 1 == len(logs)
    assert "systemd.notify_failed" == logs[0]["event"]
    assert ["WATCHDOG"] == logs[0]["fields"]


def test_full_queue_never_blocks_the_sender(short_dir: Path) -> None:
    """When nobody reads the socket, sends fail at once (non-blocking) instead of hanging."""
    address = str(short_dir / "stuck")
    with socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM) as stuck:
        stuck.bind(address)  # bound, never read: the kernel queue fills up
        with SdNotifier(address) as notifier, capture_logs():
            results = [notifier.watchdog() for _ in range(500)]
    # Reaching this line at all shows no send blocked (a blocking send would wait forever).
    assert True in results
    assert False in results


# --- watchdog ----------------------------------------------------------------------------


def test_watchdog_interval_is_half_of_watchdog_usec() -> None:
    """WATCHDOG_USEC=60 s gives pings every 30 s; WATCHDOG_PID must be ours if set."""
    mine = os.getpid()
    assert 30.0 == watchdog_interval({"WATCHDOG_USEC": "60000000"})
    assert 0.1 == watchdog_interval({"WATCHDOG_USEC": "200000", "WATCHDOG_PID": str(mine)})
    assert 15.0 == watchdog_interval({"WATCHDOG_USEC": "30000000", "WATCHDOG_PID": "7"}, pid=7)


def test_watchdog_interval_none_when_not_ours_or_invalid() -> None:
    """No watchdog, another process's watchdog, or a nonsense value gives no pings."""
    with capture_logs() as logs:
        found = [
            watchdog_interval({}),
            watchdog_interval({"WATCHDOG_USEC": "60000000", "WATCHDOG_PID": "1"}, pid=2),
            watchdog_interval({"WATCHDOG_USEC": "60000000", "WATCHDOG_PID": "x"}),
            watchdog_interval({"WATCHDOG_USEC": "0"}),
            watchdog_interval({"WATCHDOG_USEC": "-5"}),
        ]
    assert [None, None, None, None, None] == found
    assert ["systemd.watchdog_invalid", "systemd.watchdog_invalid"] == [e["event"] for e in logs]


class _Stop(Exception):
    """Ends a watchdog loop driven by a fake sleep."""


async def test_run_watchdog_pings_at_half_watchdog_usec(
    notify_socket: tuple[str, Receiver],
) -> None:
    """Each round sends WATCHDOG=1 with the current summary, then sleeps WATCHDOG_USEC/2."""
    address, receiver = notify_socket
    interval = watchdog_interval({"WATCHDOG_USEC": "1000000"})
    assert interval is not None
    slept: list[float] = []
    statuses = iter(["0/1 ready; llama: weights 10%, attempt 1", "0/1 ready", "1/1 ready"])

    async def fake_sleep(seconds: float) -> None:
        slept.append(seconds)
        if len(slept) == 3:
            raise _Stop

    with SdNotifier(address) as notifier, pytest.raises(_Stop):
        await run_watchdog(notifier, interval, lambda: next(statuses), sleep=fake_sleep)
    assert [0.5, 0.5, 0.5] == slept
    assert [
        b"WATCHDOG=1\nSTATUS=0/1 ready; llama: weights 10%, attempt 1",
        b"WATCHDOG=1\nSTATUS=0/1 ready",
        b"WATCHDOG=1\nSTATUS=1/1 ready",
    ] == receiver.messages(3)


async def test_run_watchdog_keeps_pinging_when_summary_fails(
    notify_socket: tuple[str, Receiver],
) -> None:
    """A broken status line is logged and the ping still goes out, without STATUS."""
    address, receiver = notify_socket

    def broken() -> str:
        raise RuntimeError("boom")

    async def one_round(seconds: float) -> None:
        raise _Stop

    with SdNotifier(address) as notifier, capture_logs() as logs, pytest.raises(_Stop):
        await run_watchdog(notifier, 1.0, broken, sleep=one_round)
    assert [b"WATCHDOG=1"] == receiver.messages(1)
    assert ["systemd.status_failed"] == [e["event"] for e in logs]


async def test_run_watchdog_keeps_pinging_with_the_real_sleep(
    notify_socket: tuple[str, Receiver],
) -> None:
    """With the default (real) sleep the pings keep coming; their spacing is pinned by the
    fake-sleep test above, not by wall-clock bounds here."""
    address, receiver = notify_socket
    interval = watchdog_interval({"WATCHDOG_USEC": "200000"})
    assert interval is not None
    with SdNotifier(address) as notifier:
        async with anyio.create_task_group() as tg:
            await tg.start(run_watchdog, notifier, interval, lambda: "ok")
            await anyio.to_thread.run_sync(receiver.messages, 3)  # blocking: off the loop
            tg.cancel_scope.cancel()
    assert 3 <= len([d for _, d in receiver.got if d == b"WATCHDOG=1\nSTATUS=ok"])


async def test_blocked_event_loop_sends_no_pings(notify_socket: tuple[str, Receiver]) -> None:
    """While blocking code holds the event loop the watchdog task cannot run, so no pings
    arrive (systemd would restart us); they resume once the loop runs again."""
    address, receiver = notify_socket
    with SdNotifier(address) as notifier:
        async with anyio.create_task_group() as tg:
            await tg.start(run_watchdog, notifier, 0.02, lambda: "ok")
            await anyio.sleep(0.1)
            blocked_at = time.time()
            time.sleep(0.4)  # noqa: ASYNC251 - the point: a wedged loop
            unblocked_at = time.time()
            await anyio.sleep(0.1)
            tg.cancel_scope.cancel()
    receiver.messages(4)
    times = [t for t, _ in receiver.got]
    before = [t for t in times if t < blocked_at]
    during = [t for t in times if blocked_at < t < unblocked_at]
    after = [t for t in times if t > unblocked_at]
    assert len(before) >= 2
    assert [] == during
    assert len(after) >= 2


# --- the status line ---------------------------------------------------------------------


@dataclass
class Snap:
    """The attributes status_summary reads (launcher.supervise.supervisor.Snapshot has them)."""

    server: str
    state: str
    phase: str | None = None
    progress: float | None = None
    attempt: int = 1


def test_status_summary_counts_ready_and_details_the_rest() -> None:
    """Ready servers are counted; the others show state, progress and attempt."""
    line = status_summary(
        [
            Snap("qwen", "ready", "ready", None, 1),
            Snap("llama", "cuda_graph", "cuda_graph", 12 / 35, 2),
            Snap("mistral", "waiting_for_gpus", None, None, 1),
        ]
    )
    assert "1/3 ready; llama: cuda_graph 34%, attempt 2; mistral: waiting_for_gpus, attempt 1" == (
        line
    )


def test_status_summary_edge_cases() -> None:
    """All ready, nothing configured, not started yet, a phase that differs from the state."""
    assert "2/2 ready" == status_summary([Snap("a", "ready"), Snap("b", "ready")])
    assert "no servers" == status_summary([])
    assert "0/1 ready; a: idle" == status_summary([Snap("a", "idle", attempt=0)])
    assert "0/1 ready; a: cleaning_up (weights) 100%, attempt 3" == status_summary(
        [Snap("a", "cleaning_up", "weights", 1.2, 3)]
    )


@dataclass
class UnreachableSnap(Snap):
    """A snapshot whose host is unreachable
    (launcher.supervise.supervisor.Snapshot.unreachable_s)."""

    unreachable_s: float | None = None


def test_status_summary_names_servers_whose_host_is_unreachable() -> None:
    """A server whose host cannot be reached is listed with how long, even while ready."""
    line = status_summary([
        UnreachableSnap("qwen", "ready", "ready", None, 1, unreachable_s=12.4),
        UnreachableSnap("llama", "ready", "ready", None, 1, unreachable_s=None),
        UnreachableSnap("mistral", "weights", "weights", 0.5, 2, unreachable_s=3.0),
    ])
    assert ("2/3 ready; qwen: ready, attempt 1, host unreachable for 12s; "
            "mistral: weights 50%, attempt 2, host unreachable for 3s") == line


def test_status_summary_is_cut_to_one_short_line() -> None:
    """Many servers still give one line of at most STATUS_MAX_CHARS, ending in an ellipsis."""
    line = status_summary([Snap(f"server-{i}", "weights", "weights", 0.5, 1) for i in range(40)])
    assert STATUS_MAX_CHARS == len(line)
    assert line.startswith("0/40 ready; server-0: weights 50%, attempt 1; ")
    assert line.endswith("…")
    assert "\n" not in line


# --- the unit file -----------------------------------------------------------------------


def _systemd_analyze() -> str:
    found = shutil.which("systemd-analyze")
    assert found, "systemd-analyze is missing: install the Debian package 'systemd'"
    return found


def _systemd_version(analyze: str) -> int:
    out = subprocess.run([analyze, "--version"], capture_output=True, text=True, check=True)
    match = re.match(r"systemd (\d+)", out.stdout)
    assert match, out.stdout
    return int(match.group(1))


def _verifiable_copy(unit_text: str, directory: Path, dropin: str | None = None) -> Path:
    """The unit in ``directory`` with ExecStart's program replaced by one that exists here
    (verify checks that it does), and ``dropin`` as ``launcher@.service.d/restart-steps.conf``
    if given (verify reads drop-ins next to the unit); returns the path of ``launcher@prod``."""
    launcher = Path(sys.executable).parent / "launcher"
    assert launcher.exists(), f"{launcher} missing: install the package (scripts/setup.sh)"
    assert 1 == unit_text.count(SHIPPED_EXEC)
    (directory / "launcher@.service").write_text(unit_text.replace(SHIPPED_EXEC, str(launcher)))
    if dropin is not None:
        (directory / "launcher@.service.d").mkdir()
        (directory / "launcher@.service.d" / "restart-steps.conf").write_text(dropin)
    return directory / "launcher@prod.service"


def _verify_problems(unit_text: str, directory: Path, dropin: str | None = None) -> list[str]:
    """Every line systemd-analyze verify prints about the unit (and ``dropin``), plus its exit
    status if non-zero."""
    analyze = _systemd_analyze()
    instance = _verifiable_copy(unit_text, directory, dropin)
    env = {**os.environ, "SYSTEMD_LOG_COLOR": "0", "SYSTEMD_PAGER": ""}
    result = subprocess.run(
        [analyze, "verify", str(instance)], capture_output=True, text=True, env=env, timeout=60
    )
    problems = [line for line in (result.stdout + result.stderr).splitlines() if line.strip()]
    if result.returncode != 0:
        problems.append(f"exit status {result.returncode}")
    return problems


def test_unit_passes_systemd_analyze_verify(tmp_path: Path) -> None:
    """systemd-analyze verify accepts the shipped unit (ExecStart pointed at this venv) without
    a single message: no "Unknown key" on this systemd (252 on Debian 12, as on RHEL 9)."""
    assert [] == _verify_problems(UNIT.read_text(), tmp_path)


def test_newer_keys_live_only_in_the_drop_in(tmp_path: Path) -> None:
    """RestartSteps=/RestartMaxDelaySec= are in the drop-in only: systemd >= 254 verifies unit
    and drop-in cleanly; older systemd flags exactly those two keys, which is why the install
    script leaves the drop-in out there."""
    analyze = _systemd_analyze()
    assert "RestartSteps" not in _unit_settings()
    problems = _verify_problems(UNIT.read_text(), tmp_path, DROPIN.read_text())
    if _systemd_version(analyze) >= 254:
        assert [] == problems
    else:
        unknown = re.compile(r"Unknown key '(RestartSteps|RestartMaxDelaySec)' in section")
        assert 2 == len(problems) and all(unknown.search(line) for line in problems), problems


def test_verify_check_catches_a_broken_unit(tmp_path: Path) -> None:
    """The verify check is not vacuous: a misspelt key and a missing program are reported."""
    broken = UNIT.read_text().replace("KillMode=process", "KillMod=process")
    assert any("KillMod" in line for line in _verify_problems(broken, tmp_path))
    # The program becomes /nonexistent/bin/x (the shipped path is left as its argument).
    missing = UNIT.read_text().replace("ExecStart=", "ExecStart=/nonexistent/bin/x ", 1)
    (tmp_path / "b").mkdir()
    problems = _verify_problems(missing, tmp_path / "b")
    assert any("/nonexistent/bin/x" in line for line in problems)


def test_unit_sandbox_exposure_stays_low(tmp_path: Path) -> None:
    """systemd-analyze security rates the unit's sandbox at most 3.0 (of 10)."""
    analyze = _systemd_analyze()
    instance = _verifiable_copy(UNIT.read_text(), tmp_path)
    result = subprocess.run(
        [analyze, "security", "--offline=yes", "--threshold=30", "--no-pager", str(instance)],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert 0 == result.returncode, result.stdout[-2000:]


def _unit_settings() -> dict[str, list[str]]:
    settings: dict[str, list[str]] = {}
    for raw in UNIT.read_text().splitlines():
        line = raw.strip()
        if not line or line.startswith(("#", ";", "[")):
            continue
        key, _, value = line.partition("=")
        settings.setdefault(key, []).append(value)
    return settings


def test_unit_leaves_servers_running_and_uses_notify_and_watchdog() -> None:
    """Stopping the unit signals launcher only, readiness and watchdog come from launcher,
    and each instance reads its own config, env file and state directory."""
    s = _unit_settings()
    assert ["process"] == s["KillMode"]
    assert ["notify"] == s["Type"]
    assert ["main"] == s["NotifyAccess"]
    assert ["60"] == s["WatchdogSec"]
    assert ["on-failure"] == s["Restart"]
    assert [f"{SHIPPED_EXEC} up /etc/launcher/%i.toml --log-format json"] == s["ExecStart"]
    assert ["-/etc/launcher/%i.env"] == s["EnvironmentFile"]
    assert ["LAUNCHER_SLACK__WEBHOOK:/etc/launcher/%i.slack-webhook"] == s["LoadCredential"]
    assert ["launcher/%i"] == s["StateDirectory"]
    assert (["launcher"], ["launcher"]) == (s["User"], s["Group"])
    assert (["strict"], ["tmpfs"]) == (s["ProtectSystem"], s["ProtectHome"])
    # the service user's real ~/.ssh, the home the install script creates: %h would be the
    # system manager's home (/root), not User='s (systemd.unit(5), "Specifiers")
    [home] = re.findall(r"^home=(\S+)$", INSTALL.read_text(), re.MULTILINE)
    assert ([f"-{home}/.ssh"], ["invisible"]) == (s["BindReadOnlyPaths"], s["ProtectProc"])
    assert not [v for values in s.values() for v in values if "%h" in v]
    assert ["4G"] == s["MemoryMax"]


def test_unit_command_line_is_accepted_by_the_cli() -> None:
    """The options ExecStart passes exist on `launcher up`."""
    launcher = Path(sys.executable).parent / "launcher"
    result = subprocess.run(
        [str(launcher), "up", "--help"],
        capture_output=True,
        text=True,
        timeout=60,
        env={**os.environ, "COLUMNS": "200", "NO_COLOR": "1"},
    )
    assert 0 == result.returncode, result.stderr
    assert "--log-format" in result.stdout


# --- the env example ---------------------------------------------------------------------


def test_env_example_names_variables_launcher_reads() -> None:
    """The example's variables, uncommented, are the ones the config reads (Slack webhook
    variable, LAUNCHER_* overrides); as shipped it sets nothing."""
    lines = [line.strip() for line in ENV_EXAMPLE.read_text().splitlines() if line.strip()]
    assert [] == [line for line in lines if not line.startswith("#")]
    assignments = dict(
        line[1:].split("=", 1) for line in lines if re.match(r"#[A-Z_][A-Z0-9_]*=", line)
    )
    assert SlackConfig().webhook_url_env in assignments
    assert "HF_TOKEN" in assignments
    config = config_from_dict({}, environ=assignments)
    assert config.metrics is not None
    assert assignments["LAUNCHER_METRICS__LISTEN"] == config.metrics.listen
    assert int(assignments["LAUNCHER_POLICY__MAX_ATTEMPTS"]) == config.policy.max_attempts


# --- the install script ------------------------------------------------------------------


def _install(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(["bash", str(INSTALL), *args], capture_output=True, text=True, timeout=60)


def _exists(user: str) -> bool:
    try:
        pwd.getpwnam(user)
    except KeyError:
        return False
    return True


def test_install_dry_run_prints_the_steps_and_changes_nothing(tmp_path: Path) -> None:
    """--dry-run lists user, venv, config, env, unit and systemctl steps in order, and leaves
    the system as it was."""
    config = tmp_path / "my.toml"
    config.write_text("")
    watched = [
        Path("/etc/launcher"),
        Path("/opt/launcher"),
        Path("/var/lib/launcher-home"),
        Path("/etc/systemd/system/launcher@.service"),
    ]
    before = [p.exists() for p in watched]
    result = _install("--dry-run", "--systemd-version", "252", "--python", sys.executable,
                      "prod", str(config))
    newer = _install("--dry-run", "--systemd-version", "254", "--python", sys.executable,
                     "prod", str(config))
    assert 0 == result.returncode == newer.returncode, result.stderr + newer.stderr
    steps = [line[2:] for line in result.stdout.splitlines() if line.startswith("+ ")]
    newer_steps = [line[2:] for line in newer.stdout.splitlines() if line.startswith("+ ")]
    dropin_step = (f"install -D -m 0644 {DROPIN} "
                   "/etc/systemd/system/launcher@.service.d/restart-steps.conf")
    expected_prefixes = [
        *(["useradd --system"] if not _exists("launcher") else []),
        "install -d -m 0750 -o launcher -g launcher /var/lib/launcher-home",
        "install -d -m 0700 -o launcher -g launcher /var/lib/launcher-home/.ssh",
        *(
            [f"{sys.executable} -m venv /opt/launcher/.venv"]
            if not Path("/opt/launcher/.venv/bin/python").exists()
            else []
        ),
        # with the `ha` extra: [coordination] needs asyncpg
        f"/opt/launcher/.venv/bin/pip install --quiet --disable-pip-version-check "
        f"{ROOT}\\[ha\\]",
        "/opt/launcher/.venv/bin/pip install --quiet --disable-pip-version-check --no-deps",
        "runuser -u launcher -- /opt/launcher/.venv/bin/python -I -c "
        "import\\ launcher.cli.main\\,\\ asyncpg",
        "install -D -m 0644",
        "install -d -m 0750 -o root -g launcher /etc/launcher",
        f"install -m 0640 -o root -g launcher {config} /etc/launcher/prod.toml",
        *(
            ["install -m 0600 -o root -g root"]
            if not Path("/etc/launcher/prod.env").exists()
            else []
        ),
        *(
            ["install -m 0600 -o root -g root /dev/null /etc/launcher/prod.slack-webhook"]
            if not Path("/etc/launcher/prod.slack-webhook").exists()
            else []
        ),
        f"install -m 0644 {UNIT} /etc/systemd/system/launcher@.service",
        "systemctl daemon-reload",
        "systemctl enable launcher@prod.service",
        "systemctl restart launcher@prod.service",
    ]
    assert len(expected_prefixes) == len(steps), steps
    for prefix, step in zip(expected_prefixes, steps, strict=True):
        assert step.startswith(prefix), (prefix, step)
    # Only on systemd >= 254 does the drop-in with the newer keys get installed.
    unit_at = steps.index(expected_prefixes[-4])
    assert [*steps[: unit_at + 1], dropin_step, *steps[unit_at + 1 :]] == newer_steps
    assert "systemd 252 < 254" in result.stdout
    assert "install-systemd: dry run, nothing changed" == result.stdout.splitlines()[-1]
    assert before == [p.exists() for p in watched]


def test_install_rejects_bad_input_before_changing_anything(tmp_path: Path) -> None:
    """A bad instance name, a missing config file, an unknown option or a Python that is not
    Python exit 2 with a reason."""
    bad_name = _install("--dry-run", "a/b")
    missing = _install("--dry-run", "prod", str(tmp_path / "nope.toml"))
    unknown = _install("--frobnicate", "prod")
    not_python = _install("--dry-run", "--python", "/bin/false", "prod")
    codes = (bad_name.returncode, missing.returncode, unknown.returncode, not_python.returncode)
    assert (2, 2, 2, 2) == codes
    assert "NAME 'a/b'" in bad_name.stderr
    assert "nope.toml is not a file" in missing.stderr
    assert "unknown option --frobnicate" in unknown.stderr
    assert "/bin/false is not a Python >= 3.11" in not_python.stderr
