"""LocalTransport against real processes on this machine."""

from __future__ import annotations

import asyncio
import json
import os
import sys
import threading
from contextlib import aclosing
from pathlib import Path

import anyio
import pytest

from launcher.errors import RemoteCommandError
from launcher.host.transport.base import Transport
from launcher.host.transport.local import LocalTransport, install_pidfd_child_watcher

DUMP = "import json, os, sys; print(json.dumps([sys.argv[1:], dict(os.environ)]))"


def pid_alive(pid: int) -> bool:
    """Whether ``pid`` runs (zombies count as gone)."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rpartition(")")[2].split()[0] != "Z"
    except FileNotFoundError:
        return False


async def wait_for_file(path: Path, seconds: float = 5.0) -> str:
    """Poll until ``path`` has content and return it (empty string after ``seconds``)."""
    apath = anyio.Path(path)
    for _ in range(int(seconds / 0.02)):
        if await apath.exists() and (text := await apath.read_text()).strip():
            return text
        await anyio.sleep(0.02)
    return ""


def test_local_transport_satisfies_protocol() -> None:
    """LocalTransport is usable wherever a Transport is expected."""
    transport: Transport = LocalTransport("here")
    assert "here" == transport.host_name


async def test_run_returns_status_and_both_outputs() -> None:
    """stdout, stderr and the exit status of the command come back separately."""
    result = await LocalTransport("here").run(["sh", "-c", "echo out; echo err >&2; exit 3"])
    assert (3, b"out\n", b"err\n") == (result.exit_status, result.stdout, result.stderr)
    assert not result.ok


async def test_run_passes_argv_verbatim_without_a_shell() -> None:
    """Arguments with shell syntax reach the program untouched."""
    hostile = ["a b", "$(touch /tmp/x)", "`id`", "'\"", "x;y", "line1\nline2", "ünï", ""]
    result = await LocalTransport("here").run([sys.executable, "-c", DUMP, *hostile])
    assert hostile == json.loads(result.stdout)[0]


async def test_run_feeds_stdin() -> None:
    """Bytes given as stdin are what the command reads."""
    result = await LocalTransport("here").run(["cat"], stdin=b"secret\x00bytes")
    assert b"secret\x00bytes" == result.stdout


async def test_host_env_is_merged_under_command_env() -> None:
    """Host env reaches every command; a command's env overrides it key by key."""
    transport = LocalTransport("here", env={"HOST_ONLY": "h", "BOTH": "host"})
    result = await transport.run([sys.executable, "-c", DUMP], env={"BOTH": "cmd"})
    env = json.loads(result.stdout)[1]
    assert ("h", "cmd", os.environ["PATH"]) == (env["HOST_ONLY"], env["BOTH"], env["PATH"])


async def test_timeout_kills_the_command_and_its_group(tmp_path: Path) -> None:
    """A command past its timeout is killed with its children and reported as timed out."""
    pidfile = tmp_path / "child"
    script = f"sleep 30 & echo $! > {pidfile}; wait"
    with pytest.raises(RemoteCommandError) as caught:
        await LocalTransport("here").run(["sh", "-c", script], timeout=0.5)
    assert caught.value.exit_status is None
    assert "timed out after 0.5s" in str(caught.value)
    child = int(pidfile.read_text())
    for _ in range(100):
        if not pid_alive(child):
            break
        await anyio.sleep(0.02)
    assert not pid_alive(child)


async def test_check_raises_with_status_and_stderr() -> None:
    """check=True turns a non-zero exit into RemoteCommandError carrying status and stderr."""
    with pytest.raises(RemoteCommandError) as caught:
        await LocalTransport("box").run(["sh", "-c", "echo boom >&2; exit 4"], check=True)
    assert (4, "boom\n", "box") == (caught.value.exit_status, caught.value.stderr,
                                    caught.value.host)


async def test_missing_program_reports_127() -> None:
    """A program that does not exist reports 127, as a remote shell would."""
    result = await LocalTransport("here").run(["/nonexistent/program"])
    assert 127 == result.exit_status
    assert b"/nonexistent/program" in result.stderr


async def test_killed_command_reports_128_plus_signal() -> None:
    """A command killed by SIGKILL reports 137."""
    result = await LocalTransport("here").run(["sh", "-c", "kill -9 $$"])
    assert 137 == result.exit_status


async def test_stream_yields_output_before_the_command_ends(tmp_path: Path) -> None:
    """The first chunk arrives while the command is still running."""
    transport = LocalTransport("here")
    pidfile = tmp_path / "pid"
    script = f"echo $$ > {pidfile}; echo first; sleep 30"
    async with aclosing(transport.stream(["sh", "-c", script])) as chunks:
        first = await anext(chunks)
        assert pid_alive(int(pidfile.read_text()))  # the command has not ended
    assert b"first\n" == first


async def test_stream_ends_when_the_command_exits() -> None:
    """All output is yielded and the iteration then ends."""
    transport = LocalTransport("here", env={"V": "v1"})
    data = b"".join([c async for c in transport.stream(["sh", "-c", "echo $V; echo two"])])
    assert b"v1\ntwo\n" == data


async def test_closing_a_stream_kills_the_command(tmp_path: Path) -> None:
    """Abandoning a stream kills the command it runs."""
    pidfile = tmp_path / "pid"
    transport = LocalTransport("here")
    script = f"echo $$ > {pidfile}; echo go; exec sleep 30"
    async with aclosing(transport.stream(["sh", "-c", script])) as chunks:
        assert b"go\n" == await anext(chunks)
    pid = int(await wait_for_file(pidfile))
    assert not pid_alive(pid)


async def test_cancelling_a_stream_kills_the_command(tmp_path: Path) -> None:
    """Cancelling a task that iterates a stream kills the command."""
    pidfile = tmp_path / "pid"
    transport = LocalTransport("here")
    script = f"echo $$ > {pidfile}; while :; do echo tick; sleep 0.05; done"

    async def consume() -> None:
        async with aclosing(transport.stream(["sh", "-c", script])) as chunks:
            async for _ in chunks:
                pass

    with anyio.move_on_after(0.3):
        await consume()
    pid = int(await wait_for_file(pidfile))
    assert not pid_alive(pid)


async def test_forward_port_yields_the_same_address_and_port() -> None:
    """On the local host a remote address and port are already local."""
    async with LocalTransport("here").forward_port(30000, "127.0.0.2") as here:
        assert ("127.0.0.2", 30000) == here


async def test_with_the_pidfd_watcher_children_cost_no_threads() -> None:
    """install_pidfd_child_watcher: twenty commands running at once add no thread (Python
    3.11's default watcher parks one thread per child), and every one is still reaped."""
    policy = asyncio.get_event_loop_policy()
    before = getattr(policy, "_watcher", None)
    try:
        installed = install_pidfd_child_watcher()
        transport = LocalTransport("local")
        threads = threading.active_count()
        most = 0
        results: list[int] = []

        async def one() -> None:
            nonlocal most
            result = await transport.run(["sh", "-c", "sleep 0.3; exit 3"])
            results.append(result.exit_status)

        async def count() -> None:
            nonlocal most
            while True:
                most = max(most, threading.active_count())
                await anyio.sleep(0.02)

        async with anyio.create_task_group() as tg:
            tg.start_soon(count)
            async with anyio.create_task_group() as runs:
                for _ in range(20):
                    runs.start_soon(one)
            tg.cancel_scope.cancel()
    finally:
        policy._watcher = before  # type: ignore[attr-defined]
    assert installed == (sys.version_info < (3, 12))
    assert [3] * 20 == results
    if installed:
        assert threads == most
