"""The remote-run protocol (launcher.host.run) over the local transport, with real processes."""

from __future__ import annotations

import hashlib
import json
import os
import re
import signal
import socket
import subprocess
import sys
import threading
import time
from collections.abc import AsyncGenerator, AsyncIterator, Mapping, Sequence
from contextlib import AbstractAsyncContextManager, aclosing, asynccontextmanager
from pathlib import Path

import anyio
import pytest

from launcher.errors import ConfigError, HostUnreachable, RemoteCommandError, StateError
from launcher.host import preflight
from launcher.host import run as remote
from launcher.host.run import AttemptSpec, LogChunk, RunExited, RunHandle
from launcher.host.transport.base import CommandResult, Transport
from launcher.host.transport.local import LocalTransport
from launcher.host.transport.ssh import SSHTransport
from tests.sshd import Sshd

REPO = Path(__file__).resolve().parents[2]
DUMP = (
    "import json, os, sys; "
    "print(json.dumps({'argv': sys.argv[1:], 'env': dict(os.environ), 'cwd': os.getcwd()}))"
)
# Writes 300 numbered lines of varying length in small pieces, so chunk borders fall anywhere.
WRITER = (
    "import sys, time\n"
    "for i in range(300):\n"
    "    sys.stdout.write(f'{i:04d}:' + 'x' * (i % 37) + '\\n')\n"
    "    sys.stdout.flush()\n"
    "    time.sleep(0.002)\n"
)
HOSTILE = ["a b", "'", '"', "x;y", "$(touch /tmp/pwned)", "`id`", "l1\nl2", "ünï ✓", "", "\\", "-"]


def pid_alive(pid: int) -> bool:
    """Whether ``pid`` runs (a zombie counts as gone)."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rpartition(")")[2].split()[0] != "Z"
    except FileNotFoundError:
        return False


def proc_ids(pid: int) -> tuple[int, int]:
    """(process group id, session id) of ``pid`` from /proc."""
    with open(f"/proc/{pid}/stat") as f:
        fields = f.read().rpartition(")")[2].split()
    return int(fields[2]), int(fields[3])


async def wait_until_gone(pid: int, seconds: float = 3.0) -> bool:
    """Poll until ``pid`` is gone; whether it went within ``seconds``."""
    for _ in range(int(seconds / 0.02)):
        if not pid_alive(pid):
            return True
        await anyio.sleep(0.02)
    return not pid_alive(pid)


async def wait_for_text(path: Path, needle: str, seconds: float = 5.0) -> str:
    """Poll until ``path`` contains ``needle``; its content then."""
    apath = anyio.Path(path)
    text = ""
    for _ in range(int(seconds / 0.02)):
        text = await apath.read_text() if await apath.exists() else ""
        if needle in text:
            break
        await anyio.sleep(0.02)
    return text


async def collect(transport: Transport, handle: RunHandle, offset: int = 0,
                  ) -> tuple[bytes, list[int], int | None]:
    """Follow to the end: the bytes, the end offsets seen, and the exit status."""
    data = b""
    offsets: list[int] = []
    async with aclosing(remote.follow(transport, handle, offset)) as events:
        async for event in events:
            if isinstance(event, RunExited):
                return data, offsets, event.status
            data += event.data
            offsets.append(event.end_offset)
    raise AssertionError("follow ended without RunExited")


class Host:
    """A LocalTransport plus a run directory; stops whatever a test launched at teardown."""

    def __init__(self, run_dir: Path, env: Mapping[str, str] | None = None) -> None:
        self.transport = LocalTransport("local", env)
        self.run_dir = run_dir
        self.handles: list[RunHandle] = []

    async def launch(self, argv: list[str], *, attempt: int = 1, server: str = "srv",
                     env: dict[str, str] | None = None, secret_env: dict[str, str] | None = None,
                     cwd: str | None = None, run_dir: str | None = None) -> RunHandle:
        spec = AttemptSpec(server, attempt, run_dir or str(self.run_dir), argv, env or {},
                           secret_env or {}, cwd)
        handle = await remote.launch(self.transport, spec)
        self.handles.append(handle)
        return handle


@pytest.fixture
async def host(tmp_path: Path) -> AsyncIterator[Host]:
    """A local host whose launched servers are all killed after the test."""
    h = Host(tmp_path / "run")
    yield h
    for handle in h.handles:
        await remote.stop(h.transport, handle, grace=0.1, kill_wait=2.0)


# -- launch ----------------------------------------------------------------------------------


async def test_launch_writes_the_run_directory(host: Host) -> None:
    """The attempt directory holds cmd, log, pid, pid_start and started_at; the env file
    (secrets) is gone once the pid is there."""
    handle = await host.launch(["sleep", "30"], attempt=3, env={"A": "1"})
    d = Path(handle.dir)
    assert host.run_dir / "srv" / "3" == d
    assert "sleep 30\n" == (d / "cmd").read_text()
    assert not (d / "env").exists()
    assert str(handle.pid) == (d / "pid").read_text().strip()
    assert (d / "started_at").read_text().startswith(time.strftime("%Y", time.gmtime()))
    assert not (d / "exit_status").exists()


async def test_server_leads_its_own_session_and_group(host: Host) -> None:
    """The server's pid is its process-group id and its session id."""
    handle = await host.launch(["sleep", "30"])
    assert (handle.pid, handle.pid) == proc_ids(handle.pid)
    assert os.getsid(0) != handle.pid


async def test_server_gets_its_env_and_the_mandatory_variables(host: Host) -> None:
    """Plain, secret and host env reach the server, plus SGL_FORCE_SHUTDOWN and no_proxy."""
    host.transport = LocalTransport("local", {"HOSTWIDE": "yes", "no_proxy": "corp.example"})
    handle = await host.launch([sys.executable, "-c", DUMP], env={"PLAIN": "p"},
                               secret_env={"TOKEN": "s3cr3t"})
    _, _, status = await collect(host.transport, handle)
    env = json.loads(await anyio.Path(handle.log_path).read_text())["env"]
    assert 0 == status
    assert ("p", "s3cr3t", "yes", "1") == (
        env["PLAIN"], env["TOKEN"], env["HOSTWIDE"], env["SGL_FORCE_SHUTDOWN"])
    assert "127.0.0.1,localhost,corp.example" == env["no_proxy"]


async def test_hostile_strings_arrive_byte_for_byte(host: Host, tmp_path: Path) -> None:
    """Quotes, $(), backticks, newlines and non-ASCII in argv, env and paths are not mangled."""
    weird = tmp_path / "dir with 'quotes' $(x) `y`"
    weird.mkdir()
    env = {f"V{i}": value for i, value in enumerate(HOSTILE)}
    secrets = {f"S{i}": value for i, value in enumerate(HOSTILE)}
    handle = await host.launch([sys.executable, "-c", DUMP, *HOSTILE], env=env,
                               secret_env=secrets, cwd=str(weird),
                               run_dir=str(tmp_path / "run dir; $(rm -rf x) ✓"))
    _, _, status = await collect(host.transport, handle)
    dumped = json.loads(await anyio.Path(handle.log_path).read_text())
    assert 0 == status
    assert HOSTILE == dumped["argv"]
    assert env == {k: v for k, v in dumped["env"].items() if k in env}
    assert secrets == {k: v for k, v in dumped["env"].items() if k in secrets}
    assert str(weird) == dumped["cwd"]
    assert not await anyio.Path("/tmp/pwned").exists()


@asynccontextmanager
async def cmdline_watch(secret: str) -> AsyncIterator[list[str]]:
    """Scan every /proc/*/cmdline in a thread for ``secret`` while the block runs; pids seen."""
    seen: list[str] = []
    done = threading.Event()

    def scan() -> None:
        while not done.is_set():
            for entry in os.listdir("/proc"):
                try:
                    with open(f"/proc/{entry}/cmdline", "rb") as f:
                        if secret.encode() in f.read():
                            seen.append(entry)
                except OSError:
                    pass

    async with anyio.create_task_group() as tg:
        tg.start_soon(anyio.to_thread.run_sync, scan)
        try:
            yield seen
        finally:
            done.set()


async def test_secrets_never_appear_in_any_command_line(host: Host) -> None:
    """While launching and running, no process on the machine has the secret in its argv."""
    secret = "hunter2-" + os.urandom(8).hex()
    async with cmdline_watch(secret) as seen:
        handle = await host.launch(["sleep", "30"], secret_env={"API_KEY": secret})
        await anyio.sleep(0.2)
    environ = (await anyio.Path(f"/proc/{handle.pid}/environ").read_bytes()).split(b"\0")
    assert [] == seen
    assert f"API_KEY={secret}".encode() in environ


async def test_launch_survives_the_death_of_the_launching_process(tmp_path: Path) -> None:
    """A server launched by a process that is then SIGKILLed (with its group) keeps running."""
    child_code = (
        "import sys, anyio\n"
        "from launcher.host.run import AttemptSpec, launch\n"
        "from launcher.host.transport.local import LocalTransport\n"
        "async def main():\n"
        "    spec = AttemptSpec('srv', 1, sys.argv[1], ['sleep', '30'], {}, {})\n"
        "    handle = await launch(LocalTransport('here'), spec)\n"
        "    print('PID', handle.pid, flush=True)\n"
        "    await anyio.sleep(30)\n"
        "anyio.run(main)\n"
    )
    run_dir = tmp_path / "run"
    transport = LocalTransport("here")
    child = await anyio.open_process(
        [sys.executable, "-c", child_code, str(run_dir)], stderr=subprocess.DEVNULL, cwd=REPO,
        start_new_session=True, env={**os.environ, "PYTHONPATH": str(REPO)},
    )
    try:
        assert child.stdout is not None
        output = b""
        with anyio.fail_after(20):
            while not (marker := re.search(rb"^PID (\d+)\n", output, re.MULTILINE)):
                output += await child.stdout.receive()  # structlog writes there too
        server_pid = int(marker[1])
        os.killpg(child.pid, signal.SIGKILL)
        await child.wait()
        await anyio.sleep(0.3)
        handle = await remote.find_running(transport, str(run_dir), "srv")
        assert handle is not None
        assert server_pid == handle.pid
        assert pid_alive(server_pid)
        assert (await remote.probe(transport, handle)).alive
    finally:
        if child.returncode is None:
            os.killpg(child.pid, signal.SIGKILL)
        await child.wait()
        await child.aclose()
        found = await remote.find_running(transport, str(run_dir), "srv")
        if found is not None:
            await remote.stop(transport, found, grace=0.1)


async def test_launch_refuses_an_existing_attempt(host: Host) -> None:
    """Launching an attempt number twice raises StateError instead of mixing two runs."""
    await host.launch(["true"], attempt=1)
    with pytest.raises(StateError):
        await host.launch(["true"], attempt=1)


async def test_launch_rejects_bad_names(host: Host) -> None:
    """A server name that is not a directory name, or an invalid env name, is a ConfigError."""
    with pytest.raises(ConfigError):
        await host.launch(["true"], server="../etc")
    with pytest.raises(ConfigError):
        await host.launch(["true"], env={"NOT-VALID": "x"})


async def test_run_dir_tilde_is_expanded_on_the_host(tmp_path: Path) -> None:
    """`~` in run_dir means the host's $HOME, and the handle holds the absolute path."""
    host = Host(tmp_path, env={"HOME": str(tmp_path / "home")})
    handle = await host.launch(["true"], run_dir="~/runs")
    assert str(tmp_path / "home" / "runs" / "srv" / "1") == handle.dir
    assert 0 == (await collect(host.transport, handle))[2]


# -- exit status and follow ------------------------------------------------------------------


@pytest.mark.parametrize(
    ("script", "expected"),
    [("echo done", 0), ("echo failing; exit 3", 3), ("echo dying; kill -9 $$", 137)],
)
async def test_exit_status_is_recorded(host: Host, script: str, expected: int) -> None:
    """A normal exit, a non-zero exit and a SIGKILL are written as 0, 3 and 137."""
    handle = await host.launch(["sh", "-c", script])
    data, _, status = await collect(host.transport, handle)
    recorded = int(await anyio.Path(handle.dir, "exit_status").read_text())
    assert (expected, expected) == (status, recorded)
    assert script.split(";")[0].removeprefix("echo ").encode() + b"\n" == data
    assert remote.RunStatus(False, expected, len(data)) == await remote.probe(
        host.transport, handle)


async def test_follow_yields_every_byte_once_across_cancel_and_resume(host: Host) -> None:
    """Closing a follow, cancelling another, then resuming from end_offset loses nothing."""
    handle = await host.launch([sys.executable, "-c", WRITER])
    received = b""
    position = 0
    async with aclosing(remote.follow(host.transport, handle)) as events:
        async for event in events:
            assert isinstance(event, LogChunk)
            received += event.data
            position = event.end_offset
            if position > 1500:
                break
    with anyio.move_on_after(0.15):
        async with aclosing(remote.follow(host.transport, handle, position)) as events:
            async for event in events:
                assert isinstance(event, LogChunk)
                received += event.data
                position = event.end_offset
    assert len(received) == position
    rest, offsets, status = await collect(host.transport, handle, position)
    received += rest
    log = await anyio.Path(handle.log_path).read_bytes()
    assert 0 == status
    assert log == received
    assert len(log) == offsets[-1]
    assert 300 == len(log.splitlines())


async def test_follow_starts_at_an_arbitrary_offset(host: Host) -> None:
    """follow(offset=k) yields exactly log[k:], even in the middle of a line."""
    handle = await host.launch([sys.executable, "-c", WRITER])
    await collect(host.transport, handle)
    log = await anyio.Path(handle.log_path).read_bytes()
    data, offsets, status = await collect(host.transport, handle, 777)
    assert (log[777:], len(log), 0) == (data, offsets[-1], status)


class FlakyTransport:
    """A LocalTransport whose streams drop like a lost connection after ``chunks`` chunks."""

    def __init__(self, chunks: int) -> None:
        self.inner = LocalTransport("flaky")
        self.chunks = chunks
        self.host_name = "flaky"

    async def run(self, argv: Sequence[str], *, stdin: bytes | None = None,
                  env: Mapping[str, str] | None = None,
                  timeout: float | None = 30.0,
                  check: bool = False) -> CommandResult:
        return await self.inner.run(argv, stdin=stdin, env=env, timeout=timeout, check=check)

    async def stream(self, argv: Sequence[str], *, env: Mapping[str, str] | None = None,
                     ) -> AsyncGenerator[bytes, None]:
        async with aclosing(self.inner.stream(argv, env=env)) as chunks:
            count = 0
            async for chunk in chunks:
                yield chunk
                count += 1
                if count >= self.chunks:
                    raise HostUnreachable("connection lost", host=self.host_name)

    def forward_port(self, remote_port: int, address: str,
                     ) -> AbstractAsyncContextManager[tuple[str, int]]:
        return self.inner.forward_port(remote_port, address)

    async def aclose(self) -> None:
        await self.inner.aclose()


async def test_follow_reraises_host_unreachable_and_resumes_exactly(host: Host) -> None:
    """A dropped stream raises HostUnreachable; following again from end_offset loses nothing."""
    handle = await host.launch([sys.executable, "-c", WRITER])
    received = b""
    position = 0
    with pytest.raises(HostUnreachable):
        async with aclosing(remote.follow(FlakyTransport(3), handle)) as events:
            async for event in events:
                assert isinstance(event, LogChunk)
                received += event.data
                position = event.end_offset
    rest, _, status = await collect(host.transport, handle, position)
    assert 0 < position
    assert (await anyio.Path(handle.log_path).read_bytes(), 0) == (received + rest, status)


class CountingStreams(LocalTransport):
    """The local transport, counting the streams (log followers) opened on it."""

    streams = 0

    def stream(self, argv: Sequence[str], *, env: Mapping[str, str] | None = None,
               ) -> AsyncGenerator[bytes, None]:
        self.streams += 1
        return super().stream(argv, env=env)


async def test_follow_notices_sigkill_from_the_one_follower(host: Host) -> None:
    """A SIGKILLed server is reported as RunExited(137) by the follower that was running when
    it died (``tail --pid`` polls for the death on the host), not by following again. How
    soon is printed, not asserted: the benchmarks measure it."""
    handle = await host.launch(["sh", "-c", "echo ready; exec sleep 30"])
    transport = CountingStreams("local")
    killed_at = 0.0
    exited = RunExited(-2)
    async with aclosing(remote.follow(transport, handle)) as events:
        async for event in events:
            if isinstance(event, LogChunk) and b"ready" in event.data:
                os.kill(handle.pid, signal.SIGKILL)
                killed_at = time.monotonic()
            elif isinstance(event, RunExited):
                noticed = time.monotonic() - killed_at
                exited = event
                break
    print(f"RunExited {noticed:.3f} s after SIGKILL")
    assert RunExited(137) == exited
    assert 1 == transport.streams


async def test_unrecorded_exit_is_reported_as_none(host: Host) -> None:
    """When the wrapper dies before the server, the server's end is RunExited(None), not a guess."""
    handle = await host.launch(["sleep", "30"])
    stat_fields = (await anyio.Path(f"/proc/{handle.pid}/stat").read_text()).rpartition(")")[2]
    wrapper = int(stat_fields.split()[1])
    assert handle.pid != proc_ids(wrapper)[1]
    os.kill(wrapper, signal.SIGKILL)
    os.kill(handle.pid, signal.SIGKILL)
    assert await wait_until_gone(handle.pid)
    with anyio.fail_after(5):
        assert (b"", None) == (await collect(host.transport, handle))[0::2]
    assert await remote.find_running(host.transport, str(host.run_dir), "srv") is None


async def test_follow_of_a_finished_server_ends_at_once(host: Host) -> None:
    """Following a server that exited long ago yields its log and its status."""
    handle = await host.launch(["sh", "-c", "printf 'a\\nb'; exit 5"])
    await collect(host.transport, handle)
    with anyio.fail_after(3):
        assert (b"a\nb", 5) == (await collect(host.transport, handle))[0::2]


async def test_read_log_and_tail_log(host: Host) -> None:
    """read_log honours offset and max_bytes; tail_log returns the last bytes."""
    handle = await host.launch(["sh", "-c", "printf 0123456789"])
    await collect(host.transport, handle)
    assert b"3456" == await remote.read_log(host.transport, handle, 3, 4)
    assert b"789" == await remote.read_log(host.transport, handle, 7)
    assert b"" == await remote.read_log(host.transport, handle, 50)
    assert b"6789" == await remote.tail_log(host.transport, handle, 4)


# -- stop ------------------------------------------------------------------------------------


async def test_stop_terminates_gracefully_when_the_server_obeys(host: Host) -> None:
    """A server that exits on SIGTERM gets only SIGTERM and reports its own status."""
    code = ("import signal, sys, time\n"
            "signal.signal(signal.SIGTERM, lambda *a: sys.exit(0))\n"
            "print('up', flush=True)\n"
            "time.sleep(30)\n")
    handle = await host.launch([sys.executable, "-c", code])
    await wait_for_text(Path(handle.log_path), "up")
    report = await remote.stop(host.transport, handle, grace=5.0)
    assert remote.StopReport(["SIGTERM"], 0, []) == report


async def test_stop_kills_a_term_ignoring_group_including_children(host: Host) -> None:
    """SIGTERM-ignoring server, child and own-group grandchild all die by SIGKILL."""
    code = ("import os, signal, subprocess, sys, time\n"
            "signal.signal(signal.SIGTERM, signal.SIG_IGN)\n"
            "a = subprocess.Popen(['sleep', '30'])\n"
            "b = subprocess.Popen([sys.executable, '-c', 'import os, time; os.setpgid(0, 0); "
            "time.sleep(30)'])\n"
            "print(a.pid, b.pid, flush=True)\n"
            "time.sleep(30)\n")
    handle = await host.launch([sys.executable, "-c", code])
    text = await wait_for_text(Path(handle.log_path), "\n")
    children = [int(p) for p in text.split()]
    await anyio.sleep(0.2)  # let the grandchild leave the group
    assert handle.pid != proc_ids(children[1])[0]
    report = await remote.stop(host.transport, handle, grace=0.5, kill_wait=3.0)
    assert remote.StopReport(["SIGTERM", "SIGKILL"], 137, []) == report
    assert [False, False, False] == [pid_alive(p) for p in (handle.pid, *children)]


async def test_stop_is_idempotent_on_a_dead_server(host: Host) -> None:
    """Stopping a server that has exited sends nothing and reports its status."""
    handle = await host.launch(["sh", "-c", "exit 7"])
    await collect(host.transport, handle)
    assert remote.StopReport([], 7, []) == await remote.stop(host.transport, handle)
    assert remote.StopReport([], 7, []) == await remote.stop(host.transport, handle)


async def test_stop_and_adoption_ignore_a_recycled_pid(host: Host) -> None:
    """If the recorded pid now belongs to another process, it is neither adopted nor killed."""
    handle = await host.launch(["sh", "-c", "exit 0"])
    await collect(host.transport, handle)
    stranger = await anyio.open_process(["sleep", "30"], start_new_session=True)
    directory = anyio.Path(handle.dir)
    try:
        await (directory / "exit_status").unlink()
        await (directory / "pid").write_text(f"{stranger.pid}\n")
        recycled = RunHandle(handle.server, handle.attempt, handle.dir, stranger.pid)
        assert not (await remote.probe(host.transport, recycled)).alive
        assert await remote.find_running(host.transport, str(host.run_dir), "srv") is None
        report = await remote.stop(host.transport, recycled, grace=0.1, kill_wait=0.1)
        assert ([], True) == (report.signals_sent, pid_alive(stranger.pid))
    finally:
        stranger.kill()
        await stranger.wait()
        await stranger.aclose()
        await (directory / "exit_status").write_text("0\n")


# -- adoption --------------------------------------------------------------------------------


async def test_find_running_adopts_the_live_attempt(host: Host) -> None:
    """The newest live attempt is adopted; finished ones before and after it are not."""
    first = await host.launch(["sh", "-c", "exit 0"], attempt=1)
    live = await host.launch(["sleep", "30"], attempt=2)
    last = await host.launch(["sh", "-c", "exit 1"], attempt=10)
    for handle in (first, last):
        await collect(host.transport, handle)
    assert live == await remote.find_running(host.transport, str(host.run_dir), "srv")
    assert 10 == await remote.latest_attempt(host.transport, str(host.run_dir), "srv")
    await remote.stop(host.transport, live, grace=1.0)
    assert await remote.find_running(host.transport, str(host.run_dir), "srv") is None


async def test_nothing_to_adopt_for_an_unknown_server(host: Host) -> None:
    """A server that never ran has no running attempt and latest attempt 0."""
    assert await remote.find_running(host.transport, str(host.run_dir), "nope") is None
    assert 0 == await remote.latest_attempt(host.transport, str(host.run_dir), "nope")


# -- host checks -----------------------------------------------------------------------------


async def test_port_in_use_sees_a_listener() -> None:
    """A listening socket on 127.0.0.1 makes the port busy; once closed it is free."""
    transport = LocalTransport("here")
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        s.listen()
        port = s.getsockname()[1]
        assert await preflight.port_in_use(transport, port)
    assert not await preflight.port_in_use(transport, port)


async def test_path_exists_expands_tilde(tmp_path: Path) -> None:
    """path_exists checks the host's filesystem with ~ meaning the host's $HOME."""
    (tmp_path / "model dir").mkdir()
    transport = LocalTransport("here", {"HOME": str(tmp_path)})
    assert await preflight.path_exists(transport, "~/model dir")
    assert not await preflight.path_exists(transport, "~/missing")


# -- sglang version --------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("command", "expected"),
    [
        (["python3", "-m", "sglang.launch_server", "--port", "1"], ["python3"]),
        (["/venv/bin/python", "-u", "-m", "sglang.launch_server"], ["/venv/bin/python", "-u"]),
        (["docker", "exec", "c", "python3", "-m", "sglang.launch_server"],
         ["docker", "exec", "c", "python3"]),
        (["sglang", "serve", "--model-path", "m"], ["python3"]),
        (["/opt/venv/bin/sglang", "serve"], ["/opt/venv/bin/python3"]),
        (["env", "A=1", "sglang", "serve"], ["env", "A=1", "python3"]),
    ],
)
def test_version_probe_uses_the_commands_python(command: list[str], expected: list[str]) -> None:
    """The probe runs `-c <importlib.metadata code>` with the command's interpreter prefix."""
    argv = preflight.version_probe_argv(command)
    assert expected == argv[:-2]
    assert "-c" == argv[-2]
    assert "torch" not in argv[-1]


def test_version_probe_rejects_an_unknown_command() -> None:
    """A command without a recognisable python asks for sglang_version in the config."""
    with pytest.raises(ConfigError, match="sglang_version"):
        preflight.version_probe_argv(["./start.sh"])


async def test_detect_version_reads_package_metadata(tmp_path: Path) -> None:
    """The installed distribution's version is reported, via the command's own interpreter."""
    dist = tmp_path / "sglang-0.5.6.post2.dist-info"
    dist.mkdir()
    (dist / "METADATA").write_text("Metadata-Version: 2.1\nName: sglang\nVersion: 0.5.6.post2\n")
    transport = LocalTransport("here", {"PYTHONPATH": str(tmp_path)})
    command = [sys.executable, "-m", "sglang.launch_server", "--model-path", "m"]
    assert "0.5.6.post2" == await preflight.detect_sglang_version(transport, command)


async def test_detect_version_failure_names_the_remedy(tmp_path: Path) -> None:
    """Without sglang installed the error carries the stderr tail and the config remedy."""
    transport = LocalTransport("here", {"PYTHONPATH": str(tmp_path)})
    with pytest.raises(RemoteCommandError) as caught:
        await preflight.detect_sglang_version(transport, [sys.executable, "-m", "sglang.x"])
    assert "PackageNotFoundError" in caught.value.stderr
    assert "set sglang_version in the config" == caught.value.remedy


async def test_detect_version_of_the_simulator() -> None:
    """The simulator reports SGLANG_SIM_VERSION from the host env, else 0.5.23."""
    command = ["python3", "-m", "launcher.sim.server", "--port", "1"]
    plain = LocalTransport("here", {"SGLANG_SIM_VERSION": ""})
    assert "0.5.23" == await preflight.detect_sglang_version(plain, command)
    pinned = LocalTransport("here", {"SGLANG_SIM_VERSION": "0.5.6"})
    assert "0.5.6" == await preflight.detect_sglang_version(pinned, command)


# -- over a real sshd ------------------------------------------------------------------------


@pytest.mark.ssh
async def test_protocol_over_real_ssh(sshd_host: Sshd, tmp_path: Path) -> None:
    """Over real SSH: secret kept off argv, server outlives the connection, adopt, follow, stop."""
    secret = "s3cr3t-" + os.urandom(8).hex()
    code = ("import hashlib, os, signal, sys, time\n"
            "signal.signal(signal.SIGTERM, lambda *a: (print('bye', flush=True), sys.exit(0)))\n"
            "token = os.environ['TOKEN'].encode()\n"
            "print('ready', hashlib.sha256(token).hexdigest(), flush=True)\n"
            "time.sleep(30)\n")
    run_dir = str(tmp_path / "run")
    spec = AttemptSpec("srv", 1, run_dir, [sys.executable, "-c", code], {}, {"TOKEN": secret})
    first = SSHTransport("gpu1", **sshd_host.transport_kwargs())  # type: ignore[arg-type]
    async with cmdline_watch(secret) as seen:
        launched = await remote.launch(first, spec)
        await first.aclose()
    second = SSHTransport("gpu1", **sshd_host.transport_kwargs())  # type: ignore[arg-type]
    try:
        assert launched == await remote.find_running(second, run_dir, "srv")
        position = 0
        async with aclosing(remote.follow(second, launched)) as events:
            async for event in events:
                assert isinstance(event, LogChunk)
                position = event.end_offset
                if b"\n" in event.data:
                    break
        report = await remote.stop(second, launched, grace=5.0)
        rest, _, status = await collect(second, launched, position)
    finally:  # the sshd host is this machine: clean up locally even if SSH broke
        await remote.stop(LocalTransport("here"), launched, grace=0.1)
        await second.aclose()
    assert [] == seen
    assert remote.StopReport(["SIGTERM"], 0, []) == report
    digest = hashlib.sha256(secret.encode()).hexdigest()
    assert (f"ready {digest}\nbye\n".encode(), 0) == (
        await anyio.Path(launched.log_path).read_bytes(), status)
    assert b"bye\n" == rest
