"""One session per host (launcher.host.follower + launcher.host.agent): the frame format as
pure unit tests, then the agent following real processes on the local transport and over a
real sshd (a cut connection, more servers than MaxSessions)."""

from __future__ import annotations

import contextlib
import json
import math
import os
import signal
import socket
import subprocess
import sys
from collections.abc import AsyncIterator, Callable, Mapping, Sequence
from contextlib import AbstractAsyncContextManager, aclosing, asynccontextmanager
from pathlib import Path

import anyio
import pytest
from structlog.testing import capture_logs

from launcher.errors import HostUnreachable, LeaseLost
from launcher.host import agent as follow_agent
from launcher.host import run
from launcher.host.follower import (
    AGENT_REFUSED,
    Frame,
    FrameDecoder,
    FrameError,
    HostFollower,
    agent_source,
    agent_start,
)
from launcher.host.run import AttemptSpec, LogChunk, RunExited, RunHandle
from launcher.host.transport.base import Duplex, DuplexTransport
from launcher.host.transport.fenced import FencedTransport
from launcher.host.transport.local import LocalTransport
from launcher.host.transport.ssh import SSHTransport
from launcher.store.fence import Fence
from launcher.supervise import events
from launcher.supervise.lifecycle import State
from launcher.supervise.supervisor import ServerSupervisor, supervise_all
from tests.hostile_http import HostileHttp
from tests.procs import stat_fields
from tests.simhost import free_port
from tests.sshd import Sshd
from tests.sshsim import SIM_VERSION, EventRecorder, Site, kill_leftovers, server_entry, ssh_config
from tests.supervise import Recorder, SimSetup

# Writes 300 numbered lines of varying length in small pieces (chunk borders fall anywhere).
WRITER = (
    "import sys, time\n"
    "for i in range(300):\n"
    "    sys.stdout.write(f'{i:04d}:' + 'x' * (i % 37) + '\\n')\n"
    "    sys.stdout.flush()\n"
    "    time.sleep(0.004)\n"
)


def frame(kind: str, key: int, offset: int, payload: bytes) -> bytes:
    return follow_agent.encode_frame(kind.encode(), key, offset, payload)


# -- framing (pure) --------------------------------------------------------------------------


def test_frames_fed_byte_by_byte_come_out_whole_and_in_order() -> None:
    stream = (frame("R", 0, 0, b"1") + frame("D", 7, 0, b"hello\n")
              + frame("D", 7, 6, b"") + frame("X", 7, 6, b"137"))
    decoder = FrameDecoder()
    got: list[Frame] = []
    for i in range(len(stream)):
        got += decoder.feed(stream[i:i + 1])
    assert [Frame("R", 0, 0, b"1"), Frame("D", 7, 0, b"hello\n"), Frame("D", 7, 6, b""),
            Frame("X", 7, 6, b"137")] == got
    assert 0 == decoder.pending


def test_a_partial_frame_waits_for_the_rest() -> None:
    whole = frame("D", 3, 100, b"x" * 1000)
    decoder = FrameDecoder()
    assert [] == decoder.feed(whole[:10])  # inside the header
    assert [] == decoder.feed(whole[10:500])  # inside the payload
    assert 500 == decoder.pending
    assert [Frame("D", 3, 100, b"x" * 1000)] == decoder.feed(whole[500:])


def test_interleaved_servers_keep_their_own_order() -> None:
    stream = b"".join([
        frame("D", 1, 0, b"a1"), frame("D", 2, 0, b"b1"), frame("H", 0, 123, b""),
        frame("D", 1, 2, b"a2"), frame("X", 2, 2, b"-"), frame("D", 1, 4, b"a3"),
    ])
    got = FrameDecoder().feed(stream)
    assert [b"a1", b"a2", b"a3"] == [f.payload for f in got if f.key == 1]
    assert [("D", 0), ("X", 2)] == [(f.kind, f.offset) for f in got if f.key == 2]
    assert [123] == [f.offset for f in got if f.kind == "H"]


@pytest.mark.parametrize("garbage", [
    b"hello world, this is not a frame",  # wrong magic
    bytes([follow_agent.MAGIC]) + b"Z" + bytes(16),  # unknown kind
    follow_agent.HEADER.pack(follow_agent.MAGIC, ord("D"), 1, 0, follow_agent.MAX_PAYLOAD + 1),
])
def test_garbage_breaks_the_stream_for_good(garbage: bytes) -> None:
    decoder = FrameDecoder()
    good = frame("D", 1, 0, b"ok")
    with pytest.raises(FrameError):
        decoder.feed(good + garbage)
    with pytest.raises(FrameError):  # no resynchronising on a stream that lost its framing
        decoder.feed(good)


def test_the_agent_applies_commands_in_pieces_and_ignores_malformed_ones(tmp_path: Path) -> None:
    sent: list[bytes] = []
    agent = follow_agent.Agent(sent.append, boot_id="b")
    agent.feed(b'{"op": "add", "key": 5, "dir": "' + str(tmp_path).encode() + b'", "off')
    assert {} == agent.followed
    agent.feed(b'set": 3, "pid": 1}\nnot json\n{"op": "add", "key": 6}\n')
    assert [5] == list(agent.followed)
    assert 3 == agent.followed[5].offset
    assert [Frame("E", 6, 0, b"malformed add command")] == FrameDecoder().feed(b"".join(sent))
    agent.feed(b'{"op": "del", "key": 5}\n')
    assert {} == agent.followed


def test_a_quiet_log_is_read_less_often_and_an_exit_is_seen_in_the_next_round(
        tmp_path: Path) -> None:
    """The agent's rounds stay cheap with many servers: a log that stopped growing is read on
    a backoff (at most QUIET_MAX_S apart, every byte still sent once and in order, and every
    round again once it grows), while the pid is checked every round: a dead server is seen
    in the round after its death, whatever the backoffs."""
    child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    try:
        (tmp_path / "pid_start").write_text(follow_agent._ident(child.pid, "b") or "")
        log = tmp_path / "log"
        log.write_bytes(b"a\n")
        sent: list[bytes] = []
        now = [0.0]
        agent = follow_agent.Agent(sent.append, clock=lambda: now[0], boot_id="b")
        agent.feed(json.dumps({"op": "add", "key": 1, "dir": str(tmp_path), "offset": 0,
                               "pid": child.pid}).encode() + b"\n")

        def rounds_until_sent(step: float, limit: float) -> float:
            """Run a round every ``step`` s of the clock until a frame goes out."""
            start = now[0]
            while not sent and now[0] - start < limit:
                now[0] += step
                agent.round()
            return now[0] - start

        agent.round()
        assert [Frame("D", 1, 0, b"a\n")] == FrameDecoder().feed(b"".join(sent))
        for _ in range(40):  # four quiet seconds: the reads back off
            now[0] += follow_agent.POLL_S
            agent.round()
        assert agent.followed[1].quiet_s == follow_agent.QUIET_MAX_S
        sent.clear()
        with log.open("ab") as fh:
            fh.write(b"b\n")
        waited = rounds_until_sent(follow_agent.POLL_S, 5.0)
        assert waited <= follow_agent.QUIET_MAX_S + 1e-9
        assert [Frame("D", 1, 2, b"b\n")] == FrameDecoder().feed(b"".join(sent))
        sent.clear()
        with log.open("ab") as fh:
            fh.write(b"c\n")
        now[0] += follow_agent.POLL_S
        assert agent.followed[1].quiet_s == 0.0
        agent.round()  # it grew last time: read in the very next round
        assert [Frame("D", 1, 4, b"c\n")] == FrameDecoder().feed(b"".join(sent))
        for _ in range(40):
            now[0] += follow_agent.POLL_S
            agent.round()
        sent.clear()
        with log.open("ab") as fh:
            fh.write(b"d\n")
        child.kill()
        child.wait()
        now[0] += follow_agent.POLL_S
        agent.round()  # gone in this round; exit_status is waited for up to SETTLE_S
        assert 1 in agent.followed and agent.followed[1].gone_at == now[0]
        assert [] == sent
        now[0] += follow_agent.SETTLE_S
        agent.round()
        assert [Frame("D", 1, 6, b"d\n"), Frame("X", 1, 8, b"-")] == FrameDecoder().feed(
            b"".join(sent))
        assert {} == agent.followed
    finally:
        child.kill()
        child.wait()


# -- the agent on real processes ---------------------------------------------------------------


@asynccontextmanager
async def running(transport: DuplexTransport) -> AsyncIterator[HostFollower]:
    follower = HostFollower(transport)
    async with anyio.create_task_group() as tg:
        await tg.start(follower.run)
        yield follower
        tg.cancel_scope.cancel()


async def launch(transport: DuplexTransport, run_dir: Path, server: str, argv: list[str],
                 ) -> RunHandle:
    return await run.launch(transport, AttemptSpec(server, 1, str(run_dir), argv, {}))


async def collect(follower: HostFollower, handle: RunHandle, offset: int = 0,
                  ) -> tuple[bytes, int | None]:
    data = b""
    async with aclosing(follower.follow(handle, offset)) as items:
        async for item in items:
            if isinstance(item, RunExited):
                return data, item.status
            assert item.end_offset == offset + len(data) + len(item.data)
            data += item.data
    raise AssertionError("follow ended without RunExited")


async def test_one_agent_follows_many_servers_to_their_exits(tmp_path: Path) -> None:
    """Five servers on one host: every byte once, in order, each exit status, one agent."""
    transport = LocalTransport("local")
    codes = [0, 3, 0, 7, 0]
    handles = [await launch(transport, tmp_path / "run", f"s{i}",
                            ["sh", "-c", f'{sys.executable} -c "$0"; exit {code}', WRITER])
               for i, code in enumerate(codes)]
    results: dict[int, tuple[bytes, int | None]] = {}
    async with running(transport) as follower:

        async def one(i: int) -> None:
            results[i] = await collect(follower, handles[i])

        async with anyio.create_task_group() as tg:
            for i in range(len(handles)):
                tg.start_soon(one, i)
        assert 1 == follower.channels_opened
    for i, handle in enumerate(handles):
        log = await anyio.Path(handle.log_path).read_bytes()
        assert (log, codes[i]) == results[i]
        assert log.count(b"\n") == 300


async def test_a_lost_lease_at_the_agents_start_reaches_the_follower_as_itself(
    tmp_path: Path,
) -> None:
    """Opening the agent behind a revoked fence raises LeaseLost to the follower: it is not
    turned into a channel error, which supervision would judge as a failure (docs/ha.md)."""
    handle = await launch(LocalTransport("local"), tmp_path / "run", "s0",
                          ["sh", "-c", f'{sys.executable} -c "$0"', WRITER])
    fence = Fence()
    fence.grant(3, math.inf)
    fence.revoke()
    with capture_logs() as logs:
        async with running(FencedTransport(LocalTransport("local"), fence)) as follower:
            with pytest.raises(LeaseLost):
                await collect(follower, handle)
    assert not [e for e in logs if e["event"] == "follow.internal_error"]


async def test_sigkill_is_reported_with_its_status_and_the_rest_of_the_log(
    tmp_path: Path,
) -> None:
    transport = LocalTransport("local")
    handle = await launch(transport, tmp_path / "run", "s", ["sh", "-c", "echo up; exec sleep 60"])
    got = b""
    async with running(transport) as follower, aclosing(follower.follow(handle)) as items:
        async for item in items:
            if isinstance(item, LogChunk):
                got += item.data
                os.kill(handle.pid, signal.SIGKILL)
            else:
                assert RunExited(137) == item
                break
    assert b"up\n" == got


async def test_following_resumes_at_an_offset_after_leaving(tmp_path: Path) -> None:
    """Leaving a follow mid-log and following again from end_offset loses and repeats
    nothing (the agent is told to drop the first key and take the second)."""
    transport = LocalTransport("local")
    handle = await launch(transport, tmp_path / "run", "s", [sys.executable, "-c", WRITER])
    first = b""
    async with running(transport) as follower:
        async with aclosing(follower.follow(handle)) as items:
            async for item in items:
                assert isinstance(item, LogChunk)
                first += item.data
                if len(first) > 2000:
                    break
        rest, status = await collect(follower, handle, len(first))
        assert 1 == follower.channels_opened
    assert (await anyio.Path(handle.log_path).read_bytes(), 0) == (first + rest, status)


class NoPython(LocalTransport):
    """A host whose agent command finds ``sh`` but no python3 on its PATH."""

    def __init__(self, name: str, bin_dir: Path) -> None:
        super().__init__(name)
        bin_dir.mkdir()
        (bin_dir / "sh").symlink_to("/bin/sh")
        self.bin_dir = bin_dir

    def duplex(self, argv: Sequence[str], *, env: Mapping[str, str] | None = None,
               ) -> AbstractAsyncContextManager[Duplex]:
        return super().duplex(argv, env={"PATH": str(self.bin_dir)})


async def test_a_host_without_python_falls_back_to_one_stream_per_server(tmp_path: Path) -> None:
    transport = LocalTransport("local")
    handle = await launch(transport, tmp_path / "run", "s", ["sh", "-c", "echo one; echo two"])
    async with running(NoPython("local", tmp_path / "bin")) as follower:
        data, status = await collect(follower, handle)
        assert follower.unsupported
        assert 0 == follower.channels_opened
    assert (b"one\ntwo\n", 0) == (data, status)


# -- how the agent starts: a short stub that takes its source from stdin ---------------------


def _start(source: bytes, stdin: bytes) -> subprocess.CompletedProcess[bytes]:
    """Run the agent's start command (stub included) here on ``stdin``, for ``source``."""
    argv, _ = agent_start(source)
    return subprocess.run(argv, input=stdin, capture_output=True, timeout=30, check=False)


def test_the_stub_runs_its_source_and_leaves_the_rest_of_stdin_to_it() -> None:
    """The stub reads exactly the digest and the source: the command that was already in the
    pipe behind them (one write) reaches the source, as the agent's commands reach it."""
    source = b"import os, sys\nsys.stdout.write(repr(os.read(0, 100)))\n"
    _, payload = agent_start(source)
    done = _start(source, payload + b'{"op": "del", "key": 1}\n')
    assert (0, b"b'{\"op\": \"del\", \"key\": 1}\\n'") == (done.returncode, done.stdout)


@pytest.mark.parametrize("damage", ["flipped byte", "truncated", "added byte"])
def test_a_changed_or_truncated_source_is_refused_and_not_run(
    tmp_path: Path, damage: str,
) -> None:
    """A source that does not match the sha256 sent ahead of it is not run (the marker file
    is never written); the stub's stdout says AGENT_REFUSED."""
    marker = tmp_path / "ran"
    source = f"open({str(marker)!r}, 'w').close()\n".encode()
    _, payload = agent_start(source)
    if damage == "flipped byte":
        stdin = payload[:-3] + bytes([payload[-3] ^ 1]) + payload[-2:]
    elif damage == "truncated":
        stdin = payload[:-5]
    else:
        stdin = payload[:40] + b" " + payload[40:]
    done = _start(source, stdin)
    assert AGENT_REFUSED == done.stdout
    assert not marker.exists()


def test_the_agents_start_command_is_short_and_holds_no_source() -> None:
    """python3's whole argv, as `ps` shows it: under 200 characters, isolated (-I), named
    by its first words."""
    argv, payload = agent_start(agent_source())
    python = ["python3", "-I", "-c", argv[-1]]
    line = " ".join(python)
    assert len(line) < 200, line
    assert line.startswith("python3 -I -c 'launcher-agent';"), line
    assert "encode_frame" not in line
    assert payload.endswith(agent_source())


def _agent_ps(sshd: Sshd) -> tuple[str, str]:
    """``ps -o args=`` of the agent running under ``sshd`` (its one python3 -I -c
    descendant), and its interpreter's path."""
    found: list[int] = []
    todo = [sshd.pid]
    while todo:
        parent = todo.pop()
        for entry in Path("/proc").iterdir():
            fields = stat_fields(int(entry.name)) if entry.name.isdigit() else None
            if fields is not None and int(fields[1]) == parent:
                todo.append(int(entry.name))
                with contextlib.suppress(OSError):
                    argv = (entry / "cmdline").read_bytes().split(b"\0")
                    if os.path.basename(argv[0]).startswith(b"python3") and argv[1:3] == [
                            b"-I", b"-c"]:
                        found.append(int(entry.name))
    assert 1 == len(found), found
    ps = subprocess.run(["ps", "-ww", "-o", "args=", "-p", str(found[0])], check=True,
                        capture_output=True, text=True).stdout.strip()
    return ps, Path(f"/proc/{found[0]}/cmdline").read_bytes().split(b"\0")[0].decode()


@pytest.mark.ssh
async def test_ps_on_the_host_shows_the_agent_in_under_200_characters(
    sshd_host: Sshd, tmp_path: Path, record_property: Callable[[str, object], None],
) -> None:
    """Over a real sshd: the running agent's command line on the host (``ps -o args=``) is
    under 200 characters, names the agent and holds none of its source; the agent follows a
    server to its exit meanwhile. The interpreter's path is the host's and left out of the
    count: launcher runs ``python3``, but a pyenv shim (as on this test machine) execs it by
    its full path."""
    transport = SSHTransport("gpu1", **sshd_host.transport_kwargs())  # type: ignore[arg-type]
    local = LocalTransport("here")
    handle = await launch(local, tmp_path / "run", "s", ["sh", "-c", "echo one; echo two"])
    try:
        async with running(transport) as follower:
            data, status = await collect(follower, handle)
            ps, interpreter = await anyio.to_thread.run_sync(_agent_ps, sshd_host)
            assert 1 == follower.channels_opened
    finally:
        await transport.aclose()
    assert ps.startswith(interpreter + " -I -c "), ps[:300]
    line = "python3" + ps[len(interpreter):]
    record_property("agent_ps_chars", len(line))
    assert len(line) < 200, f"{len(line)} characters: {line[:300]}"
    assert line.startswith("python3 -I -c 'launcher-agent';"), line
    assert "def " not in line and "encode_frame" not in line
    assert (b"one\ntwo\n", 0) == (data, status)


class _Corrupting:
    """The agent's channel, with one byte of what is sent first changed on the way."""

    def __init__(self, inner: Duplex) -> None:
        self.inner = inner
        self.first = True

    async def send(self, data: bytes) -> None:
        if self.first:
            self.first = False
            data = data[:100] + bytes([data[100] ^ 0x20]) + data[101:]
        await self.inner.send(data)

    async def receive(self) -> bytes:
        return await self.inner.receive()


class CorruptingSSH(SSHTransport):
    @asynccontextmanager
    async def duplex(self, argv: Sequence[str], *, env: Mapping[str, str] | None = None,
                     ) -> AsyncIterator[Duplex]:
        async with super().duplex(argv, env=env) as inner:
            yield _Corrupting(inner)


@pytest.mark.ssh
async def test_a_source_changed_on_the_way_is_refused_and_follow_falls_back(
    sshd_host: Sshd, tmp_path: Path,
) -> None:
    """Over a real sshd, the agent's source arrives with one byte changed: the host refuses
    to run it, the follower says so (follow.agent_unavailable, naming the refusal) and
    follows the server with one stream of its own, as on a host without python3."""
    transport = CorruptingSSH("gpu1", **sshd_host.transport_kwargs())  # type: ignore[arg-type]
    local = LocalTransport("here")
    handle = await launch(local, tmp_path / "run", "s", ["sh", "-c", "echo one; echo two"])
    try:
        with capture_logs() as logs:
            async with running(transport) as follower:
                data, status = await collect(follower, handle)
    finally:
        await transport.aclose()
    assert (b"one\ntwo\n", 0) == (data, status)
    assert follower.unsupported
    assert 0 == follower.channels_opened
    [warning] = [e for e in logs if e["event"] == "follow.agent_unavailable"]
    assert "refused its source" in warning["error"]


# -- over real SSH ---------------------------------------------------------------------------


@pytest.mark.ssh
async def test_a_cut_connection_is_resumed_at_the_byte_offset(
    sshd_host: Sshd, tmp_path: Path,
) -> None:
    """The connection is cut (sshd's per-connection processes SIGKILLed) while three servers
    write: every follow raises HostUnreachable, a second agent takes all three on at their
    offsets, and each log arrives whole, exactly once."""
    stop = tmp_path / "stop"
    # Writes numbered lines until the test says stop: the cut lands mid-log whatever the load.
    writer = ("import os, sys, time\n"
              "i = 0\n"
              "while not os.path.exists(sys.argv[1]):\n"
              "    sys.stdout.write(f'{i:05d}:' + 'x' * (i % 37) + '\\n')\n"
              "    sys.stdout.flush()\n"
              "    i += 1\n"
              "    time.sleep(0.01)\n")
    local = LocalTransport("here")
    transport = SSHTransport("gpu1", **sshd_host.transport_kwargs())  # type: ignore[arg-type]
    handles = [await launch(local, tmp_path / "run", f"s{i}",
                            [sys.executable, "-c", writer, str(stop)]) for i in range(3)]
    got: dict[int, bytes] = {i: b"" for i in range(3)}
    statuses: dict[int, int | None] = {}
    cuts: list[int] = []
    enough = anyio.Event()
    resumed = anyio.Event()
    try:
        async with running(transport) as follower:

            async def one(i: int) -> None:
                while True:
                    try:
                        async with aclosing(follower.follow(handles[i], len(got[i]))) as items:
                            async for item in items:
                                if isinstance(item, RunExited):
                                    statuses[i] = item.status
                                    return
                                got[i] += item.data
                                if all(len(b) > 500 for b in got.values()):
                                    enough.set()
                                if len(set(cuts)) == 3 and all(len(b) > 1500 for b in got.values()):
                                    resumed.set()
                    except HostUnreachable:
                        cuts.append(i)
                        await anyio.sleep(0.1)

            async def cut() -> None:
                await enough.wait()
                await anyio.to_thread.run_sync(sshd_host.kill_connections)
                await resumed.wait()  # the second agent delivers; now let the writers end
                stop.touch()

            async with anyio.create_task_group() as tg:
                tg.start_soon(cut)
                for i in range(3):
                    tg.start_soon(one, i)
            opened = follower.channels_opened
    finally:
        await transport.aclose()
        for handle in handles:
            await run.stop(local, handle, grace=0.1)
    assert [0, 1, 2] == sorted(set(cuts))
    assert 2 == opened
    for i, handle in enumerate(handles):
        assert (await anyio.Path(handle.log_path).read_bytes(), 0) == (got[i], statuses[i])


@pytest.fixture
def stock_sshd(tmp_path_factory: pytest.TempPathFactory) -> AsyncIterator[Sshd]:
    daemon = Sshd(tmp_path_factory.mktemp("sshd"), max_sessions=None)  # MaxSessions 10
    daemon.start()
    yield daemon
    daemon.stop()


@pytest.mark.ssh
async def test_more_servers_than_max_sessions_all_come_up_on_a_stock_sshd(
    stock_sshd: Sshd, tmp_path: Path, record_property: Callable[[str, object], None],
) -> None:
    """14 simulated servers on one host behind a stock sshd (MaxSessions 10) all reach ready
    through supervise_all: their logs travel over one agent session."""
    n = 14
    site = Site.create(tmp_path, "gpu1", stock_sshd, gpu_count=n)
    config = ssh_config(tmp_path, [site.host_entry()], [
        server_entry(f"llm{i}", site, port=free_port(), gpus=[i]) for i in range(n)])
    events = EventRecorder()
    transport = SSHTransport.from_host_config(config.host("gpu1"))
    sups = [ServerSupervisor(config, s, transport, sglang_version=SIM_VERSION, hooks=[events])
            for s in config.servers]
    most_sessions = 0

    async def watch() -> None:
        nonlocal most_sessions
        while True:
            most_sessions = max(most_sessions, transport.sessions_open)
            await anyio.sleep(0.05)

    try:
        with anyio.fail_after(150):
            async with anyio.create_task_group() as tg:
                tg.start_soon(watch)
                states = await supervise_all(sups, until_ready=True)
                tg.cancel_scope.cancel()
    finally:
        await transport.aclose()
        kill_leftovers([site.run_dir])
    record_property("most_sessions", most_sessions)
    assert {f"llm{i}": State.STOPPED for i in range(n)} == states, events.names()
    assert n == len({e.server for e in events.named("server.ready")})
    followers = {id(s.host_follower) for s in sups}
    assert 1 == len(followers)
    assert sups[0].host_follower is not None
    assert 1 == sups[0].host_follower.channels_opened


async def test_the_agent_probes_health_on_the_host() -> None:
    """Probes made by the agent answer like launcher.host.health.probe_health: the status code,
    a timeout at the deadline, the connection error; no socket of ours per probe."""
    silent = socket.create_server(("127.0.0.1", 0))  # accepts (backlog), never answers
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        closed = int(s.getsockname()[1])
    try:
        async with running(LocalTransport("local")) as follower:
            with HostileHttp("huge", body_len=800 << 20) as srv:
                healthy = await follower.probe(srv.port, 5.0, "127.0.0.1")
            quiet = await follower.probe(int(silent.getsockname()[1]), 0.3, "127.0.0.1")
            refused = await follower.probe(closed, 5.0, "127.0.0.1")
            assert 1 == follower.channels_opened
    finally:
        silent.close()
    assert (True, "HTTP 200") == healthy
    assert (False, "no complete answer within 0.3s") == quiet
    assert refused is not None
    assert (False, "ConnectionRefusedError: [Errno 111] Connection refused") == refused


class _RecordingDuplex:
    """The agent's channel, with the command lines sent and the frames received kept."""

    def __init__(self, inner: Duplex, sent: list[bytes], frames: list[Frame]) -> None:
        self.inner, self.sent, self.frames = inner, sent, frames
        self.decoder = FrameDecoder()

    async def send(self, data: bytes) -> None:
        self.sent.append(data)
        await self.inner.send(data)

    async def receive(self) -> bytes:
        data = await self.inner.receive()
        self.frames += self.decoder.feed(data)
        return data


class RecordingLocal(LocalTransport):
    def __init__(self) -> None:
        super().__init__("local")
        self.sent: list[bytes] = []
        self.frames: list[Frame] = []

    @asynccontextmanager
    async def duplex(self, argv: Sequence[str], *, env: Mapping[str, str] | None = None,
                     ) -> AsyncIterator[Duplex]:
        async with super().duplex(argv, env=env) as inner:
            yield _RecordingDuplex(inner, self.sent, self.frames)


async def test_probes_asked_together_go_to_the_agent_as_one_command() -> None:
    """Five servers probed at the same moment (as on a host's probe tick): one command line
    to the agent, and each probe gets its own server's answer, its own deadline included."""
    silent = socket.create_server(("127.0.0.1", 0))  # accepts (backlog), never answers
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        closed = int(s.getsockname()[1])
    transport = RecordingLocal()
    got: dict[str, tuple[bool, str] | None] = {}
    try:
        with HostileHttp("huge", body_len=10) as a, HostileHttp("huge", body_len=20) as b, \
                HostileHttp("huge", body_len=30) as c:
            ports = {"a": (a.port, 5.0), "b": (b.port, 5.0), "c": (c.port, 5.0),
                     "refused": (closed, 5.0), "silent": (int(silent.getsockname()[1]), 0.3)}
            async with running(transport) as follower:
                # the agent is up: only the batch counts
                await follower.probe(a.port, 5.0, "127.0.0.1")
                before = len(transport.sent)

                async def one(name: str) -> None:
                    got[name] = await follower.probe(*ports[name], "127.0.0.1")

                async with anyio.create_task_group() as tg:
                    for name in ports:
                        tg.start_soon(one, name)
                commands = transport.sent[before:]
    finally:
        silent.close()
    assert 1 == len(commands)
    assert b'"op": "probes"' in commands[0]
    assert {"a": (True, "HTTP 200"), "b": (True, "HTTP 200"), "c": (True, "HTTP 200"),
            "refused": (False, "ConnectionRefusedError: [Errno 111] Connection refused"),
            "silent": (False, "no complete answer within 0.3s")} == got


def test_a_batch_answers_every_probe_once() -> None:
    """probe_many (the agent's side) answers each key exactly once, across waves."""
    waves: list[list[tuple[int, bytes]]] = []
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        closed = int(s.getsockname()[1])
    with HostileHttp("huge", body_len=5) as ok:
        follow_agent.probe_many([(1, ok.port, 5.0, "127.0.0.1"), (2, closed, 5.0, "127.0.0.1"),
                                 (3, ok.port, 5.0, "127.0.0.1")],
                                waves.append)
    answers = [a for wave in waves for a in wave]
    assert [1, 2, 3] == sorted(k for k, _ in answers)
    assert {1: b"200", 2: b"ConnectionRefusedError: [Errno 111] Connection refused",
            3: b"200"} == dict(answers)


def test_the_agent_dials_each_server_at_its_listen_address() -> None:
    """probe_many dials the address each probe names: a server bound to 127.0.0.2 or to ::1
    answers there, and refuses at 127.0.0.1; a name the host cannot resolve is that probe's
    error."""
    waves: list[list[tuple[int, bytes]]] = []
    with HostileHttp("huge", body_len=5, host="127.0.0.2") as v4, \
            HostileHttp("huge", body_len=5, host="::1") as v6:
        follow_agent.probe_many([(1, v4.port, 5.0, "127.0.0.2"), (2, v6.port, 5.0, "::1"),
                                 (3, v4.port, 5.0, "127.0.0.1"), (4, v6.port, 5.0, "127.0.0.1"),
                                 (5, v4.port, 5.0, "no-such-host.invalid")], waves.append)
    answers = dict(a for wave in waves for a in wave)
    assert [1, 2, 3, 4, 5] == sorted(answers)
    assert (b"200", b"200") == (answers[1], answers[2])
    refused = b"ConnectionRefusedError: [Errno 111] Connection refused"
    assert (refused, refused) == (answers[3], answers[4])
    assert answers[5].startswith(b"gaierror: "), answers[5]


async def test_the_host_followers_probe_names_the_address_to_the_agent() -> None:
    """HostFollower.probe sends the address with the port: a server bound to 127.0.0.2 is
    healthy through the agent."""
    with HostileHttp("huge", body_len=5, host="127.0.0.2") as srv:
        async with running(LocalTransport("local")) as follower:
            assert (True, "HTTP 200") == await follower.probe(srv.port, 5.0, "127.0.0.2")
            refused = await follower.probe(srv.port, 5.0, "127.0.0.1")
    assert (False, "ConnectionRefusedError: [Errno 111] Connection refused") == refused


async def test_the_probe_tick_is_shared_by_a_host_and_never_later_than_the_interval() -> None:
    """The tick is a multiple of the interval on the loop's clock: every server of the host
    with that interval waits for the same moment, and none waits longer than before."""
    follower = HostFollower(LocalTransport("local"))
    for interval in (0.3, 10.0):
        before = anyio.current_time()
        delay = follower.probe_delay(interval)
        assert 0 < delay <= interval
        due = before + delay  # a multiple of the interval, but for the time the call took
        assert abs(due - round(due / interval) * interval) < 0.05


async def test_a_hung_server_is_found_unhealthy_through_the_agents_probes(
    sim: SimSetup,
) -> None:
    """Under supervise_all the probes go through the host's agent on the host's tick: a
    server whose /health turns 503 after ready is still counted probe by probe and called
    unhealthy after probe_failures in a row, with the answer's detail."""
    config = sim.config(
        mem_fraction_static=0.8, cuda_graph_max_bs=8,
        faults=[{"kind": "hang_after_ready", "after_s": 1.0, "attempts": [1]}],
        policy={"probe_failures": 3},
    )
    rec = Recorder()
    unhealthy_seen = anyio.Event()

    def hook(server: str, event: events.Event) -> None:
        if isinstance(event, events.ServerUnhealthy):
            unhealthy_seen.set()

    server = config.servers[0]
    sup = ServerSupervisor(config, server,
                           LocalTransport(server.host, env=config.host(server.host).env),
                           sglang_version=SIM_VERSION, hooks=[rec, hook])
    with anyio.fail_after(60):
        async with anyio.create_task_group() as tg:
            tg.start_soon(supervise_all, [sup])
            await unhealthy_seen.wait()
            tg.cancel_scope.cancel()
    assert sup.host_follower is not None
    assert 1 == sup.host_follower.channels_opened
    [unhealthy] = rec.of("server.unhealthy")
    assert 3 == unhealthy["consecutive_failures"]
    assert "503" in unhealthy["detail"]
    assert [1, 2] == [p["consecutive"] for p in rec.of("probe.failed")]
