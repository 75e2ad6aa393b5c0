"""SSHTransport against real OpenSSH sshd instances on 127.0.0.1 (see tests/sshd.py)."""

from __future__ import annotations

import json
from collections.abc import Callable, MutableMapping
from contextlib import aclosing
from dataclasses import dataclass
from functools import partial
from pathlib import Path
from typing import Any

import anyio
import anyio.abc
import pytest
from anyio.from_thread import start_blocking_portal
from hypothesis import given, settings
from hypothesis import strategies as st
from structlog.testing import capture_logs

from launcher.errors import (
    AuthenticationFailed,
    HostKeyError,
    HostUnreachable,
    RemoteCommandError,
)
from launcher.host.transport.ssh import INITIAL_WAIT_S, JITTER_S, SSHTransport, shell_command
from tests.sshd import Sshd, free_port, keygen

ssh = pytest.mark.ssh

ECHO_JSON = "import json,sys,os; print(json.dumps([sys.argv[1:], os.environ.get('X')]))"


class RecordingSleep:
    """Injected sleep: records every requested wait and returns at once."""

    def __init__(self) -> None:
        self.waits: list[float] = []

    async def __call__(self, seconds: float) -> None:
        self.waits.append(seconds)


def transport(daemon: Sshd, name: str = "gpu1", **overrides: Any) -> SSHTransport:
    """An SSHTransport that reaches ``daemon``, with a recording sleep unless overridden."""
    kwargs: dict[str, Any] = {**daemon.transport_kwargs(), "sleep": RecordingSleep()}
    kwargs.update(overrides)
    return SSHTransport(name, **kwargs)


async def wait_for_path(path: Path, seconds: float = 5.0) -> None:
    """Poll until ``path`` exists (a remote command creates it) or ``seconds`` pass."""
    for _ in range(int(seconds / 0.02)):
        if await anyio.Path(path).exists():
            return
        await anyio.sleep(0.02)


def events(logs: list[MutableMapping[str, Any]], name: str) -> list[MutableMapping[str, Any]]:
    """The captured log entries whose event is ``name``."""
    return [entry for entry in logs if entry["event"] == name]


# -- command building (no SSH) ---------------------------------------------------------------


def test_build_command_quotes_every_word() -> None:
    """Each argv element becomes one shell-quoted word."""
    assert "echo 'a b' '$(x)' ''" == shell_command(["echo", "a b", "$(x)", ""])


def test_build_command_prefixes_env() -> None:
    """Environment variables travel as quoted `env -- K=V` words in front of the command."""
    assert "env -- 'A=1 2' B= ls" == shell_command(["ls"], {"A": "1 2", "B": ""})


def test_build_command_rejects_bad_input() -> None:
    """An empty argv or an env name env(1) cannot set is a programming error."""
    with pytest.raises(ValueError, match="argv"):
        shell_command([])
    with pytest.raises(ValueError, match="A=B"):
        shell_command(["true"], {"A=B": "x"})


# -- running commands ------------------------------------------------------------------------


@ssh
async def test_run_returns_output_and_exit_status(sshd_host: Sshd) -> None:
    """run returns stdout, stderr and the exit status, non-zero included, without raising."""
    t = transport(sshd_host)
    try:
        ok = await t.run(["echo", "hello world"])
        failed = await t.run(["sh", "-c", "echo out; echo err >&2; exit 3"])
    finally:
        await t.aclose()
    assert (0, b"hello world\n", b"") == (ok.exit_status, ok.stdout, ok.stderr)
    assert (3, b"out\n", b"err\n") == (failed.exit_status, failed.stdout, failed.stderr)


@ssh
async def test_run_check_raises_remote_command_error(sshd_host: Sshd) -> None:
    """With check=True a non-zero exit raises RemoteCommandError carrying status and stderr."""
    t = transport(sshd_host)
    try:
        with pytest.raises(RemoteCommandError) as caught:
            await t.run(["sh", "-c", "echo broken >&2; exit 7"], check=True)
    finally:
        await t.aclose()
    assert (7, "broken\n", "gpu1") == (
        caught.value.exit_status,
        caught.value.stderr,
        caught.value.host,
    )


@ssh
async def test_run_feeds_stdin(sshd_host: Sshd) -> None:
    """stdin bytes reach the command, followed by EOF; without stdin it gets EOF at once."""
    t = transport(sshd_host)
    try:
        fed = await t.run(["cat"], stdin=b"secret\x00\xff bytes")
        empty = await t.run(["cat"], timeout=5)
    finally:
        await t.aclose()
    assert b"secret\x00\xff bytes" == fed.stdout
    assert b"" == empty.stdout


@ssh
async def test_run_reports_signal_as_128_plus_n(sshd_host: Sshd) -> None:
    """A command killed by SIGTERM reports exit status 143."""
    t = transport(sshd_host)
    try:
        result = await t.run(["sh", "-c", "kill -TERM $$"])
    finally:
        await t.aclose()
    assert 143 == result.exit_status


@ssh
async def test_run_timeout_raises_and_closes_channel(sshd_host: Sshd, tmp_path: Path) -> None:
    """A timed-out command raises RemoteCommandError and loses its channel (writes then fail)."""
    pid_file = tmp_path / "pid"
    script = f"echo $$ > {pid_file}; while :; do echo tick; sleep 0.05; done"
    t = transport(sshd_host)
    try:
        with pytest.raises(RemoteCommandError, match="timed out"):
            # 3 s: a login shell whose rc files run pyenv can take over a second to start.
            await t.run(["sh", "-c", script], timeout=3.0)
        pid = int(pid_file.read_text())
        for _ in range(250):  # the shell dies of SIGPIPE on its next echo
            if _state(pid) in ("gone", "Z"):
                break
            await anyio.sleep(0.02)
        after = await t.run(["echo", "still usable"])
    finally:
        await t.aclose()
    assert (True, b"still usable\n") == (_state(pid) in ("gone", "Z"), after.stdout)


def _state(pid: int) -> str:
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except OSError:
        return "gone"


@ssh
async def test_host_env_and_call_env_are_merged(sshd_host: Sshd) -> None:
    """Host-level env applies to every command; a per-call value overrides it."""
    t = transport(sshd_host, env={"A": "host", "B": "host"})
    try:
        result = await t.run(["sh", "-c", 'echo "$A $B $C"'], env={"B": "call", "C": "call"})
    finally:
        await t.aclose()
    assert b"host call call\n" == result.stdout


@ssh
def test_hostile_strings_arrive_byte_for_byte(sshd_host: Sshd, tmp_path: Path) -> None:
    """Hostile argv elements and env values reach the remote program intact; nothing else runs."""
    marker = tmp_path / "injected"
    hostile = st.sampled_from(
        [
            f"; touch {marker}",
            f"$(touch {marker})",
            f"`touch {marker}`",
            f"' ; touch {marker} ; '",
            f'" ; touch {marker} ; "',
            f"\ntouch {marker}\n",
            f"&& touch {marker} ||",
            f"| touch {marker}",
            "-rf",
            "--",
            "-",
            "",
            " ",
            "*",
            "~",
            "$HOME",
            "\\",
            "'\"'",
            "日本語 ünïcödé 🚀",
            "\t\r\x1b[31m",
        ]
    )
    text = st.text(st.characters(exclude_categories=["Cs"], exclude_characters="\x00"), max_size=40)
    word = st.one_of(hostile, text, st.lists(hostile, max_size=4).map("".join))

    with start_blocking_portal() as portal:
        t = transport(sshd_host)

        @settings(max_examples=40, deadline=None, database=None)
        @given(args=st.lists(word, max_size=6), value=word)
        def check(args: list[str], value: str) -> None:
            result = portal.call(
                partial(t.run, ["python3", "-c", ECHO_JSON, *args], env={"X": value}, timeout=20)
            )
            assert (0, [args, value]) == (result.exit_status, json.loads(result.stdout))
            assert 1 == result.stdout.count(b"\n")

        try:
            check()
        finally:
            portal.call(t.aclose)
    assert not marker.exists()
    assert 1 == sshd_host.accepted_logins()


# -- host keys -------------------------------------------------------------------------------


@ssh
async def test_unknown_host_key_is_refused(sshd_host: Sshd, tmp_path: Path) -> None:
    """A host missing from known_hosts is refused with its fingerprint and the fix; no retry."""
    known_hosts = tmp_path / "known_hosts"
    known_hosts.write_text("")
    sleep = RecordingSleep()
    t = transport(sshd_host, known_hosts=known_hosts, sleep=sleep)
    with pytest.raises(HostKeyError) as caught:
        await t.run(["true"])
    message = str(caught.value)
    assert sshd_host.host_key_fingerprint in message
    assert "gpu1" in message
    assert f"ssh-keyscan -p {sshd_host.port} 127.0.0.1 >> {known_hosts}" in message
    assert "trust_on_first_use" in message
    assert ([], "", 0) == (sleep.waits, known_hosts.read_text(), sshd_host.accepted_logins())


@ssh
async def test_changed_host_key_is_refused_even_with_tofu(sshd_host: Sshd, tmp_path: Path) -> None:
    """A host whose key differs from its known_hosts entry is refused, TOFU or not."""
    keygen(tmp_path / "other", "impostor")
    other = " ".join((tmp_path / "other.pub").read_text().split()[:2])
    known_hosts = tmp_path / "known_hosts"
    known_hosts.write_text(f"[127.0.0.1]:{sshd_host.port} {other}\n")
    t = transport(sshd_host, known_hosts=known_hosts, trust_on_first_use=True)
    with pytest.raises(HostKeyError) as caught:
        await t.run(["true"])
    assert sshd_host.host_key_fingerprint in str(caught.value)
    assert "does not match" in str(caught.value)
    assert f"[127.0.0.1]:{sshd_host.port} {other}\n" == known_hosts.read_text()
    assert 0 == sshd_host.accepted_logins()


@ssh
async def test_tofu_records_key_then_connects(sshd_host: Sshd, tmp_path: Path) -> None:
    """With TOFU a new host's key is appended to known_hosts, logged, and then trusted."""
    known_hosts = tmp_path / "ssh" / "known_hosts"  # neither file nor directory exists yet
    t = transport(sshd_host, known_hosts=known_hosts, trust_on_first_use=True)
    with capture_logs() as logs:
        try:
            first = await t.run(["echo", "first"])
        finally:
            await t.aclose()
    recorded = events(logs, "ssh.host_key_recorded")
    assert [sshd_host.host_key_fingerprint] == [entry["fingerprint"] for entry in recorded]
    assert sshd_host.known_hosts_line() == known_hosts.read_text()
    strict = transport(sshd_host, known_hosts=known_hosts)
    try:
        second = await strict.run(["echo", "second"])
    finally:
        await strict.aclose()
    assert (b"first\n", b"second\n") == (first.stdout, second.stdout)


# -- authentication and reachability ---------------------------------------------------------


@ssh
async def test_wrong_user_key_fails_at_once(sshd_host: Sshd, tmp_path: Path) -> None:
    """A key the host does not accept raises AuthenticationFailed after one attempt."""
    keygen(tmp_path / "stranger", "stranger")
    sleep = RecordingSleep()
    t = transport(sshd_host, identity_file=tmp_path / "stranger", sleep=sleep)
    with capture_logs() as logs, pytest.raises(AuthenticationFailed) as caught:
        await t.run(["true"])
    assert f"{sshd_host.user}@127.0.0.1" in str(caught.value)
    assert str(tmp_path / "stranger") in str(caught.value)
    assert ([], [], 1) == (
        sleep.waits,
        events(logs, "ssh.connect_retry"),
        sshd_host.connections_seen(),
    )


@ssh
async def test_missing_identity_file_is_an_authentication_failure(sshd_host: Sshd) -> None:
    """An identity file that cannot be read fails at once, naming the file."""
    t = transport(sshd_host, identity_file="/nonexistent/id_ed25519")
    with pytest.raises(AuthenticationFailed, match="/nonexistent/id_ed25519"):
        await t.run(["true"])
    assert 0 == sshd_host.connections_seen()


async def test_closed_port_is_unreachable_after_bounded_jittered_retries(tmp_path: Path) -> None:
    """Connection refused is retried retry_attempts times with jittered exponential waits."""
    port = free_port()
    sleep = RecordingSleep()
    t = SSHTransport(
        "down",
        "127.0.0.1",
        port=port,
        known_hosts=tmp_path / "kh",
        use_ssh_config=False,
        retry_attempts=4,
        sleep=sleep,
    )
    with capture_logs() as logs, pytest.raises(HostUnreachable) as caught:
        await t.run(["true"])
    assert "down" == caught.value.host
    assert str(port) in str(caught.value)
    bases = [INITIAL_WAIT_S * 2**i for i in range(3)]
    assert 3 == len(sleep.waits)
    for base, wait in zip(bases, sleep.waits, strict=True):
        assert base <= wait <= base + JITTER_S
    assert sleep.waits != bases  # jitter was added (continuous uniform; never exactly zero)
    retries = events(logs, "ssh.connect_retry")
    assert [1, 2, 3] == [entry["attempt"] for entry in retries]
    assert [round(w, 3) for w in sleep.waits] == [entry["wait_s"] for entry in retries]
    assert all("down" == entry["host"] and entry["error"] for entry in retries)


async def test_retries_stop_at_the_time_budget(tmp_path: Path) -> None:
    """However many attempts are allowed, the waits never add up past retry_max_seconds."""
    sleep = RecordingSleep()
    t = SSHTransport(
        "down",
        "127.0.0.1",
        port=free_port(),
        known_hosts=tmp_path / "kh",
        use_ssh_config=False,
        retry_attempts=100,
        retry_max_seconds=5.0,
        sleep=sleep,
    )
    with pytest.raises(HostUnreachable):
        await t.run(["true"])
    assert 1 <= len(sleep.waits) < 99
    assert sum(sleep.waits) <= 5.0


@ssh
async def test_unresponsive_host_times_out_as_unreachable(sshd_host: Sshd) -> None:
    """A host that accepts TCP but never speaks SSH fails after connect_timeout."""
    t = transport(sshd_host, connect_timeout=0.5, retry_attempts=1)
    sshd_host.pause()
    try:
        with pytest.raises(HostUnreachable, match="timed out"):
            await t.run(["true"])
    finally:
        sshd_host.resume()


@ssh
async def test_dropped_connection_reconnects_on_next_call(sshd_host: Sshd) -> None:
    """After the SSH connection is killed, the next run reconnects transparently."""
    t = transport(sshd_host)
    try:
        with capture_logs() as logs:
            before = await t.run(["echo", "1"])
            assert 1 <= sshd_host.kill_connections()
            after = await t.run(["echo", "2"])
    finally:
        await t.aclose()
    assert (b"1\n", b"2\n") == (before.stdout, after.stdout)
    assert 2 == len(events(logs, "ssh.connected"))
    assert 2 == sshd_host.accepted_logins()


@ssh
async def test_concurrent_calls_share_one_connection(sshd_host: Sshd) -> None:
    """Many concurrent callers use a single SSH connection."""
    t = transport(sshd_host)
    results: list[bytes] = []

    async def call(i: int) -> None:
        results.append((await t.run(["echo", str(i)])).stdout)

    try:
        async with anyio.create_task_group() as tg:
            for i in range(8):
                tg.start_soon(call, i)
    finally:
        await t.aclose()
    assert sorted(f"{i}\n".encode() for i in range(8)) == sorted(results)
    assert 1 == sshd_host.accepted_logins()


# -- streaming and forwarding ----------------------------------------------------------------


@ssh
async def test_stream_yields_output_incrementally(sshd_host: Sshd, tmp_path: Path) -> None:
    """stream yields the first line before the command goes on, then the rest until exit."""
    gate = tmp_path / "gate"
    script = f"echo first; while [ ! -e {gate} ]; do sleep 0.02; done; echo second"
    t = transport(sshd_host)
    received = b""
    try:
        with anyio.fail_after(10):
            async for chunk in t.stream(["sh", "-c", script]):
                received += chunk
                if received == b"first\n":
                    gate.touch()  # the command is blocked until we saw its first line
    finally:
        await t.aclose()
    assert b"first\nsecond\n" == received


@ssh
async def test_stream_raises_unreachable_when_connection_is_killed(sshd_host: Sshd) -> None:
    """Killing the SSH connection mid-stream raises HostUnreachable from the iterator. Its
    message quotes the start of the command, not a long script whole (a follower's is 3 KB:
    it went into every event and hook that carried the error)."""
    t = transport(sshd_host)
    chunks: list[bytes] = []
    script = "echo ready; exec sleep 30" + "; : padding" * 300
    try:
        with anyio.fail_after(10), pytest.raises(HostUnreachable) as lost:
            async for chunk in t.stream(["sh", "-c", script]):
                chunks.append(chunk)
                sshd_host.kill_connections()
        again = await t.run(["echo", "back"])
    finally:
        await t.aclose()
    assert ([b"ready\n"], b"back\n") == (chunks, again.stdout)
    message = str(lost.value.args[0])
    assert "while streaming sh -c 'echo ready; exec sleep 30" in message, message
    assert len(message) < 200 and message.endswith("…: Connection lost"), message


@ssh
async def test_leaving_a_stream_closes_its_channel(sshd_host: Sshd, tmp_path: Path) -> None:
    """Breaking out of a stream closes the channel: the command sees EOF on stdin."""
    done = tmp_path / "done"
    t = transport(sshd_host)
    try:
        command = ["sh", "-c", f"echo started; cat >/dev/null; touch {done}"]
        async with aclosing(t.stream(command)) as stream:
            async for chunk in stream:
                assert b"started\n" == chunk
                break
        await wait_for_path(done)
    finally:
        await t.aclose()
    assert done.exists()


@ssh
@pytest.mark.parametrize("address", ["127.0.0.1", "127.0.0.2"])
async def test_forward_port_reaches_the_server_at_its_address(sshd_host: Sshd,
                                                              address: str) -> None:
    """forward_port makes a server listening on ``address`` of the host (its loopback, or a
    specific address) reachable through a local port: the host dials that address."""
    listener = await anyio.create_tcp_listener(local_host=address, local_port=0)
    remote_port = listener.extra(anyio.abc.SocketAttribute.local_port)

    async def serve(stream: anyio.abc.SocketStream) -> None:
        async with stream:
            request = await stream.receive()
            await stream.send(b"pong:" + request)

    t = transport(sshd_host)
    try:
        async with anyio.create_task_group() as tg:
            tg.start_soon(listener.serve, serve)
            async with (
                t.forward_port(remote_port, address) as (here, local_port),
                await anyio.connect_tcp(here, local_port) as client,
            ):
                await client.send(b"ping")
                with anyio.fail_after(5):
                    reply = await client.receive()
            tg.cancel_scope.cancel()
    finally:
        await listener.aclose()
        await t.aclose()
    assert local_port != remote_port
    assert b"pong:ping" == reply


# -- several hosts, jump hosts, config -------------------------------------------------------


@ssh
async def test_two_hosts_at_once(make_sshd: Callable[[], Sshd]) -> None:
    """Two sshd instances serve two transports concurrently, each with its own host key."""
    a, b = make_sshd(), make_sshd()
    ta, tb = transport(a, "a"), transport(b, "b")
    outputs: dict[str, bytes] = {}

    async def call(t: SSHTransport) -> None:
        outputs[t.host_name] = (await t.run(["echo", t.host_name])).stdout

    try:
        async with anyio.create_task_group() as tg:
            tg.start_soon(call, ta)
            tg.start_soon(call, tb)
    finally:
        await ta.aclose()
        await tb.aclose()
    crossed = transport(b, "b", known_hosts=a.known_hosts, identity_file=b.identity_file)
    with pytest.raises(HostKeyError):
        await crossed.run(["true"])
    assert {"a": b"a\n", "b": b"b\n"} == outputs
    assert a.host_key_fingerprint != b.host_key_fingerprint


@ssh
async def test_jump_host_tunnels_to_target(make_sshd: Callable[[], Sshd], tmp_path: Path) -> None:
    """With jump_host the connection to the target goes through the jump host's sshd."""
    jump, target = make_sshd(), make_sshd()
    jump.authorize(Path(f"{target.identity_file}.pub"))
    known_hosts = tmp_path / "known_hosts"
    known_hosts.write_text(jump.known_hosts_line() + target.known_hosts_line())
    t = transport(target, known_hosts=known_hosts, jump_host=f"{jump.user}@127.0.0.1:{jump.port}")
    try:
        result = await t.run(["echo", "via jump"])
    finally:
        await t.aclose()
    assert b"via jump\n" == result.stdout
    assert (1, 1) == (jump.accepted_logins(), target.accepted_logins())


@ssh
async def test_unknown_jump_host_key_names_the_jump_host(
    make_sshd: Callable[[], Sshd], tmp_path: Path
) -> None:
    """A jump host missing from known_hosts is refused, and the error says it is the jump host."""
    jump, target = make_sshd(), make_sshd()
    known_hosts = tmp_path / "known_hosts"
    known_hosts.write_text(target.known_hosts_line())
    t = transport(target, known_hosts=known_hosts, jump_host=f"{jump.user}@127.0.0.1:{jump.port}")
    with pytest.raises(HostKeyError) as caught:
        await t.run(["true"])
    assert "jump host of gpu1" in str(caught.value)
    assert jump.host_key_fingerprint in str(caught.value)
    assert f"ssh-keyscan -p {jump.port} 127.0.0.1" in str(caught.value)
    assert (0, 0) == (jump.accepted_logins(), target.connections_seen())


@ssh
async def test_ssh_config_is_honoured(
    sshd_host: Sshd, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """With use_ssh_config an alias from ~/.ssh/config supplies address, port, user and key."""
    home = tmp_path / "home"
    (home / ".ssh").mkdir(parents=True)
    (home / ".ssh" / "config").write_text(
        "Host gpu-alias\n"
        "  HostName 127.0.0.1\n"
        f"  Port {sshd_host.port}\n"
        f"  User {sshd_host.user}\n"
        f"  IdentityFile {sshd_host.identity_file}\n"
    )
    monkeypatch.setenv("HOME", str(home))
    monkeypatch.delenv("SSH_AUTH_SOCK", raising=False)
    t = SSHTransport("gpu1", "gpu-alias", known_hosts=sshd_host.known_hosts, sleep=RecordingSleep())
    try:
        result = await t.run(["echo", "configured"])
    finally:
        await t.aclose()
    assert b"configured\n" == result.stdout


@dataclass
class FakeHostConfig:
    """The fields config.HostConfig carries, for from_host_config."""

    name: str
    address: str
    port: int | None
    user: str | None
    identity_file: str | None
    known_hosts: str | None
    use_ssh_config: bool = False
    jump_host: str | None = None
    trust_on_first_use: bool = False
    connect_timeout: float = 5.0
    keepalive_interval: float = 15.0
    env: dict[str, str] | None = None


@ssh
async def test_from_host_config_reads_every_field(sshd_host: Sshd) -> None:
    """from_host_config builds a working transport from a host config entry."""
    host = FakeHostConfig(
        name="gpu7",
        address="127.0.0.1",
        port=sshd_host.port,
        user=sshd_host.user,
        identity_file=str(sshd_host.identity_file),
        known_hosts=str(sshd_host.known_hosts),
        env={"X": "from-config"},
    )
    t = SSHTransport.from_host_config(host, sleep=RecordingSleep())
    try:
        result = await t.run(["sh", "-c", 'echo "$X"'])
    finally:
        await t.aclose()
    assert ("gpu7", b"from-config\n") == (t.host_name, result.stdout)


def test_the_transport_imports_without_a_warning() -> None:
    """Loading the SSH transport (every `launcher up` with an SSH host) prints nothing: asyncssh's
    import-time use of cryptography's deprecated DSA names (cryptography 51+) is silenced, and
    only that, so an operator's stderr and a `-W error` run stay clean."""
    import subprocess
    import sys

    done = subprocess.run(
        [sys.executable, "-W", "error", "-c", "import launcher.host.transport.ssh"],
        capture_output=True,
        text=True,
        check=False,
    )
    assert (done.returncode, done.stderr) == (0, "")
