"""One session per host: every server of a host is followed through one agent process.

:class:`HostFollower` pushes :mod:`launcher.host.agent` to its host when it first needs it
(a short ``python3 -I -c`` stub over one exec session of the transport, via ``duplex``, that
reads the agent's source from its stdin and runs it once its sha256 matches: see
:func:`agent_start`) and keeps it running while anything is followed. The agent tails every
followed log, notices every exit (and its status) and sends a heartbeat, all as frames on
that one channel (:class:`FrameDecoder`). Sessions per host are therefore O(1) in servers:
the agent's, plus the short commands (launch, probe, stop…), which the transport keeps under
its per-connection cap.

:meth:`HostFollower.follow` has exactly the contract of :func:`launcher.host.run.follow`: every
log byte from the offset exactly once, in order, then ``Exited``. A host without python3
(the agent does not start), or whose agent refused its source (it arrived changed), falls
back to ``remote.follow`` (one ``tail`` session per server).

Error handling: when the channel is lost (connection drop, no heartbeat for
HEARTBEAT_TIMEOUT_S, a frame that does not parse) every ``follow`` on it raises
HostUnreachable (or RemoteCommandError when the agent itself ended while the connection
stayed up); the caller follows again from the ``end_offset`` of the last chunk it got, and
the first caller to come back starts a new agent, which resumes every server at the offset
its caller asks for. An open that fails is not retried by the callers queued behind it: they
get the same error.

Resource handling: the channel's reader runs in :meth:`HostFollower.run`'s task group; leaving
it closes the channel, which ends the agent (it exits on EOF). Memory per followed server is
bounded: at most SUB_FRAMES frames of at most CHUNK bytes wait for a slow reader; past
SUB_WAIT_S of waiting the reader is cut off and re-added at its own offset (nothing is lost,
the log is read again from there).
"""

from __future__ import annotations

import contextlib
import functools
import hashlib
import itertools
import json
from collections.abc import AsyncGenerator, Callable
from dataclasses import dataclass
from importlib import resources
from typing import Any, cast

import anyio
import structlog
from anyio.abc import TaskGroup
from anyio.streams.memory import MemoryObjectSendStream

from launcher.errors import (
    HostUnreachable,
    LauncherError,
    LogFormatError,
    RemoteCommandError,
    describe_exception,
    format_traceback,
    reraise_lease_lost,
)
from launcher.host import agent
from launcher.host import run as remote
from launcher.host.health import status_code
from launcher.host.shell import UNSAFE_REMEDY
from launcher.host.transport.base import Duplex, DuplexTransport, Transport
from launcher.untrusted import bounded_int

log = structlog.get_logger(__name__)

HELLO_TIMEOUT_S = 60.0  # python3's start on a loaded host, plus the session's login shell
HEARTBEAT_TIMEOUT_S = 20.0  # silence (not even a heartbeat) after which the channel is lost
SUB_FRAMES = 2  # frames queued per followed server before the reader waits for it
SUB_WAIT_S = 5.0  # how long the reader waits for one slow follower before cutting it off
_DEL_WAIT_S = 2.0
_PROBE_SLACK_S = 2.0  # the frame's round trip on top of the probe's own deadline
PROBE_LINGER_S = 0.01  # probes asked within this long go to the agent as one command

# Starts the agent, or exits 127 when the host has no python3 (then follow falls back).
# -I (isolated, Python 3.4+): neither the current directory nor PYTHON* variables reach
# sys.path, so no module planted where the command runs is imported (docs/security.md,
# finding M6).
_START = 'command -v python3 > /dev/null 2>&1 || exit 127; exec python3 -I -c "$1"'

# The agent's source reaches python3 on its stdin, not in its argv: as argv, `ps` on the host
# would show the whole source as the agent's command line. The stub below is all of
# python3's argv (under 200 characters; its first words, 'launcher-agent', name it even where
# `ps` or `systemctl status` cut the line short). It reads exactly DIGEST + len(source) bytes
# with os.read on fd 0 in a loop (sys.stdin would buffer, and could swallow the agent's first
# commands) and runs the source only when the first DIGEST bytes (the 32 in the stub) are the
# sha256 of the rest; else it prints AGENT_REFUSED and exits.
# Why stdin and not a file in the run directory: a file there would need the checks the
# hardening does for the run directory (our own, not writable by others, opened with
# O_NOFOLLOW; docs/security.md) and a second session to write it; stdin needs neither.
# Why the digest leads the source on stdin and is not a literal in the stub: 64 hex digits,
# the exact read and a clear refusal do not fit in 200 characters. Both travel the same
# authenticated SSH channel, so the check guards the same thing either way: bytes changed or
# added between launcher and python3 (a host wrapper, a login script that writes to stdin)
# are refused at once; bytes lost (a login script that reads stdin) leave the stub waiting
# until HELLO_TIMEOUT_S closes the channel.
_STUB = ("'launcher-agent';import os,hashlib as h;b=bytearray();"
         "any(map(b.extend,iter(lambda:os.read(0,{size}-len(b)),b'')));"
         "exec(b[32:])if h.sha256(b[32:]).digest()==b[:32]else print('refused')")
AGENT_REFUSED = b"refused\n"  # the stub's answer to a source that arrived changed
DIGEST = 32  # bytes of a sha256 digest


class FrameError(LogFormatError):
    """The agent's stream does not parse (a bug, or something else wrote to the channel)."""


@dataclass(frozen=True)
class Frame:
    """One frame of the agent's stream (see launcher.host.agent)."""

    kind: str
    key: int
    offset: int
    payload: bytes


class FrameDecoder:
    """Frames from the agent's stream, fed in pieces of any size.

    ``feed`` returns the frames completed so far; a partial frame waits for the next piece.
    Error handling: a frame with the wrong magic byte, an unknown kind or a payload longer
    than MAX_PAYLOAD raises FrameError, after which the decoder is unusable (the stream has
    lost its framing; the channel must be dropped).
    """

    def __init__(self) -> None:
        self._buf = bytearray()
        self._broken: str | None = None

    def feed(self, data: bytes) -> list[Frame]:
        if self._broken is not None:
            raise FrameError(self._broken)
        self._buf += data
        frames: list[Frame] = []
        size = agent.HEADER.size
        pos = 0
        buf = self._buf
        while len(buf) - pos >= size:
            magic, kind, key, offset, length = agent.HEADER.unpack_from(buf, pos)
            if magic != agent.MAGIC or kind not in agent.KINDS:
                self._broken = (f"follow agent stream out of frame at byte {pos}: "
                                f"{bytes(buf[pos:pos + 16])!r}")
                raise FrameError(self._broken)
            if length > agent.MAX_PAYLOAD:
                self._broken = f"follow agent frame announces {length} bytes"
                raise FrameError(self._broken)
            if len(buf) - pos - size < length:
                break
            start = pos + size
            frames.append(Frame(chr(kind), key, offset, bytes(buf[start:start + length])))
            pos = start + length
        del buf[:pos]
        return frames

    @property
    def pending(self) -> int:
        """Bytes of a frame not yet complete."""
        return len(self._buf)


@functools.cache
def agent_source() -> bytes:
    """The agent's source, as shipped in the package."""
    return resources.files("launcher.host").joinpath("agent.py").read_bytes()


def agent_start(source: bytes) -> tuple[list[str], bytes]:
    """The argv that starts the agent on a host, and what to send on its stdin first: the
    sha256 of ``source`` (DIGEST bytes), then ``source``. Runs ``source`` only if both arrive
    intact; else the agent's stdout says AGENT_REFUSED and it ends."""
    stub = _STUB.format(size=DIGEST + len(source))
    return ["sh", "-c", _START, "sh", stub], hashlib.sha256(source).digest() + source


class AgentUnavailable(LauncherError):
    """The host cannot run the agent (no python3): follow one session per server instead."""


class _Lost(Exception):
    """Internal: the channel ended; ``error`` is what each follower raises."""

    def __init__(self, error: LauncherError) -> None:
        super().__init__(str(error))
        self.error = error


@dataclass(eq=False)
class _Sub:
    key: int
    send: MemoryObjectSendStream[Frame]
    error: LauncherError | None = None
    resync: bool = False


@dataclass(eq=False)
class _Probe:
    done: anyio.Event
    answer: bytes | None = None
    error: LauncherError | None = None


class _Channel:
    """One running agent: its duplex, the keys followed on it and the probes in flight."""

    def __init__(self, duplex: Duplex) -> None:
        self.duplex = duplex
        self.subs: dict[int, _Sub] = {}
        self.probes: dict[int, _Probe] = {}
        # probes not sent yet: key, port, timeout, address
        self.batch: list[tuple[int, int, float, str]] = []
        self.lock = anyio.Lock()  # one writer at a time on the agent's stdin
        self.closed = False

    async def command(self, **cmd: Any) -> None:
        line = json.dumps(cmd, ensure_ascii=True).encode("ascii") + b"\n"
        async with self.lock:
            await self.duplex.send(line)


class HostFollower:
    """Follows every server of one host through one agent; run it with
    ``await tg.start(follower.run)`` and use :meth:`follow` while it runs."""

    def __init__(
        self, transport: DuplexTransport, *, heartbeat_timeout: float = HEARTBEAT_TIMEOUT_S,
    ) -> None:
        self.transport = transport
        self.heartbeat_timeout = heartbeat_timeout
        self._tg: TaskGroup | None = None
        self._channel: _Channel | None = None
        self._opening = anyio.Lock()
        self._opens = 0  # channels opened or failed to open so far
        self._open_error: LauncherError | None = None  # how the last open failed
        self._keys = itertools.count(1)
        self.unsupported = False  # the host has no python3: followers use remote.follow
        self.channels_opened = 0

    @property
    def host_name(self) -> str:
        return self.transport.host_name

    @property
    def following(self) -> int:
        """Servers followed through the agent right now."""
        return len(self._channel.subs) if self._channel is not None else 0

    async def run(self, *, task_status: anyio.abc.TaskStatus[None] = anyio.TASK_STATUS_IGNORED,
                  ) -> None:
        """Hold the task group the channel's reader runs in, until cancelled."""
        try:
            async with anyio.create_task_group() as tg:
                self._tg = tg
                task_status.started()
                await anyio.sleep_forever()
        finally:
            self._tg = None
            self._channel = None

    # -- the channel --------------------------------------------------------------------

    async def _current(self) -> _Channel:
        """The live channel, opened (agent started) if there is none. Raises what the open
        raised; callers that queued behind a failed open get its error without retrying."""
        channel = self._channel
        if channel is not None and not channel.closed:
            return channel
        seen = self._opens
        async with self._opening:
            channel = self._channel
            if channel is not None and not channel.closed:
                return channel
            if self._opens != seen and self._open_error is not None:
                raise self._open_error
            if self._tg is None:
                raise RuntimeError("HostFollower.follow called while run() is not running")
            self._opens += 1
            try:
                channel = cast(_Channel, await self._tg.start(self._serve))
            except LauncherError as exc:
                self._open_error = exc
                raise
            self._open_error = None
            self._channel = channel
            return channel

    async def _serve(self, *, task_status: anyio.abc.TaskStatus[_Channel]) -> None:
        """Start the agent, hand its channel over once it said hello, then read it until it
        ends; every follower on it then gets the reason."""
        argv, payload = agent_start(agent_source())
        channel: _Channel | None = None
        error: LauncherError = RemoteCommandError(
            f"follow agent on {self.host_name} stopped", host=self.host_name,
            command="follow agent")
        try:
            async with self.transport.duplex(argv) as duplex:
                decoder = FrameDecoder()
                hello: list[Frame] | None = None
                with anyio.move_on_after(HELLO_TIMEOUT_S):
                    # A command that already ended (no python3) no longer reads: its stdout,
                    # empty, says so below.
                    with contextlib.suppress(RemoteCommandError):
                        await duplex.send(payload)
                    hello = await self._hello(duplex, decoder)
                if hello is None:
                    raise AgentUnavailable(
                        f"the follow agent did not start on {self.host_name} (no python3?)",
                        remedy="install python3 on the host, or accept one SSH session per "
                        "server (MaxSessions)")
                channel = _Channel(duplex)
                self.channels_opened += 1
                log.info("follow.agent_started", host=self.host_name)
                task_status.started(channel)
                error = await self._read(channel, duplex, decoder, hello)
        except LauncherError as exc:
            if channel is None:
                raise  # to the opener (tg.start)
            error = exc
        except Exception as exc:  # never cancellation (BaseException)
            reraise_lease_lost(exc)  # not a failure: the lease is gone (docs/ha.md)
            # A bug (or a frame no parser bounds) must not end the follower's task group,
            # and with it every server's supervision: the channel ends with an error its
            # followers and probes already handle (docs/security.md, finding H1).
            log.error("follow.internal_error", host=self.host_name,
                      error=describe_exception(exc), traceback=format_traceback(exc))
            error = RemoteCommandError(
                f"follow agent channel on {self.host_name} failed: {describe_exception(exc)}",
                host=self.host_name, command="follow agent")
            if channel is None:
                raise error from exc
        finally:
            if channel is not None:
                self._close(channel, error)

    async def _hello(self, duplex: Duplex, decoder: FrameDecoder) -> list[Frame] | None:
        """Frames after the hello (the rest of that read); None when the agent ended first.
        AgentUnavailable when the stub refused the source (see agent_start)."""
        head: bytes | None = b""  # the first bytes, until known to be a frame or the refusal
        while True:
            data = await duplex.receive()
            if head is not None:
                head += data
                if data and AGENT_REFUSED.startswith(head):
                    continue
                if head.startswith(AGENT_REFUSED):
                    raise AgentUnavailable(
                        f"the follow agent on {self.host_name} refused its source: it arrived "
                        "changed (its sha256 did not match)",
                        remedy="look for something on the host that reads or writes the "
                        "session's stdin (a login script); meanwhile one SSH session per "
                        "server follows the logs")
                data, head = head, None
            if not data:
                return None
            frames = decoder.feed(data)
            for i, frame in enumerate(frames):
                if frame.kind == "R":
                    if frame.payload != str(agent.VERSION).encode():
                        raise FrameError(f"follow agent on {self.host_name} speaks version "
                                         f"{frame.payload!r}")
                    return frames[i + 1:]
                raise FrameError(f"follow agent on {self.host_name} sent {frame.kind} first")

    async def _read(self, channel: _Channel, duplex: Duplex, decoder: FrameDecoder,
                    first: list[Frame]) -> LauncherError:
        """Dispatch frames until the channel ends; the error its followers get."""
        try:
            await self._dispatch(channel, first)
            while True:
                with anyio.move_on_after(self.heartbeat_timeout) as quiet:
                    data = await duplex.receive()
                if quiet.cancelled_caught:
                    return HostUnreachable(
                        f"follow agent on {self.host_name} silent for "
                        f"{self.heartbeat_timeout:g} s", host=self.host_name,
                        remedy="the next follow restarts it")
                if not data:
                    return RemoteCommandError(
                        f"follow agent on {self.host_name} ended", host=self.host_name,
                        command="follow agent")
                await self._dispatch(channel, decoder.feed(data))
        except LauncherError as exc:
            return exc

    async def _dispatch(self, channel: _Channel, frames: list[Frame]) -> None:
        for frame in frames:
            if frame.kind in "HR":
                continue
            if frame.kind == "P":
                for line in frame.payload.splitlines():
                    key, _, answer = line.partition(b" ")
                    number = bounded_int(key)
                    waiter = None if number is None else channel.probes.pop(number, None)
                    if waiter is not None:
                        waiter.answer = answer
                        waiter.done.set()
                continue
            sub = channel.subs.get(frame.key)
            if sub is None:
                continue  # a follower that left; its del is on its way
            try:
                sub.send.send_nowait(frame)
                continue
            except anyio.WouldBlock:
                pass
            except (anyio.BrokenResourceError, anyio.ClosedResourceError):
                continue
            with anyio.move_on_after(SUB_WAIT_S):
                with contextlib.suppress(anyio.BrokenResourceError, anyio.ClosedResourceError):
                    await sub.send.send(frame)
                continue
            # The follower keeps not reading: cut it off; it resumes at its own offset.
            sub.resync = True
            channel.subs.pop(sub.key, None)
            sub.send.close()
            log.warning("follow.reader_cut_off", host=self.host_name, key=sub.key)

    def _close(self, channel: _Channel, error: LauncherError) -> None:
        channel.closed = True
        if self._channel is channel:
            self._channel = None
        if channel.subs:
            log.info("follow.agent_lost", host=self.host_name, error=str(error),
                     following=len(channel.subs))
        for sub in channel.subs.values():
            sub.error = error
            sub.send.close()
        channel.subs.clear()
        for waiter in channel.probes.values():
            waiter.error = error
            waiter.done.set()
        channel.probes.clear()

    # -- following ----------------------------------------------------------------------

    async def follow(
        self, handle: remote.RunHandle, offset: int = 0, *,
        on_attached: Callable[[], None] | None = None,
    ) -> AsyncGenerator[remote.LogChunk | remote.RunExited, None]:
        """Yield the log from byte ``offset`` as it grows, then ``Exited`` once the server is
        gone: the contract of :func:`launcher.host.run.follow`. ``on_attached`` is called each
        time the agent took the server on (proof that the host answers)."""
        position = offset
        while True:
            if self.unsupported:
                async for item in remote.follow(self.transport, handle, position):
                    yield item
                return
            try:
                channel = await self._current()
            except AgentUnavailable as exc:
                log.warning("follow.agent_unavailable", host=self.host_name, error=str(exc))
                self.unsupported = True
                continue
            key = next(self._keys)
            send, receive = anyio.create_memory_object_stream[Frame](SUB_FRAMES)
            sub = _Sub(key, send)
            channel.subs[key] = sub
            done = False
            try:
                with receive:
                    await channel.command(op="add", key=key, dir=handle.dir, offset=position,
                                          pid=handle.pid)
                    if on_attached is not None:
                        on_attached()
                    async for frame in receive:
                        if frame.kind == "D":
                            if frame.offset != position:
                                raise FrameError(
                                    f"follow agent on {self.host_name} sent bytes from "
                                    f"{frame.offset} for {handle.dir}, expected {position}")
                            position += len(frame.payload)
                            yield remote.LogChunk(frame.payload, position)
                        elif frame.kind == "X":
                            done = True
                            yield remote.RunExited(bounded_int(frame.payload))
                            return
                        elif frame.kind == "E":
                            done = True
                            why = frame.payload.decode("utf-8", "replace")
                            raise RemoteCommandError(
                                f"follow of {handle.dir} on {self.host_name}: {why}",
                                host=self.host_name, command="follow agent",
                                remedy=UNSAFE_REMEDY if why.startswith("unsafe run directory")
                                else "")
            finally:
                channel.subs.pop(key, None)
                send.close()
                if not done and not channel.closed:
                    with anyio.move_on_after(_DEL_WAIT_S, shield=True):
                        with contextlib.suppress(LauncherError):
                            await channel.command(op="del", key=key)
            if sub.error is not None:
                raise sub.error
            # Cut off for reading too slowly (sub.resync): take it on again from here.


    def probe_delay(self, interval: float) -> float:
        """Seconds to this host's next probe tick, in (0, ``interval``]: the ticks are the
        multiples of ``interval`` on the event loop's clock, so the probes of every server
        that waits for them (same interval) fall due together and go to the agent as one
        command, their answers come back in one frame, and the access lines they cause in
        one round of the agent."""
        return interval - anyio.current_time() % interval

    async def probe(self, port: int, deadline_s: float,
                    address: str) -> tuple[bool, str] | None:
        """``GET /health`` on ``address``:``port`` as the host dials it (the server's listen
        address, or the loopback for a wildcard one), made by the agent: (whether it
        answered 200, a detail as launcher.host.health.probe_health gives it). No channel and no
        socket per probe: the probes asked within PROBE_LINGER_S of each other go as one
        command and their answers come back together. None when the host has no agent
        (probe some other way). HostUnreachable (or the error that ended the channel)
        propagates; HostKeyError too."""
        if self.unsupported:
            return None
        try:
            channel = await self._current()
        except AgentUnavailable:
            self.unsupported = True
            return None
        key = next(self._keys)
        waiter = _Probe(anyio.Event())
        channel.probes[key] = waiter
        if not channel.batch and self._tg is not None:
            self._tg.start_soon(self._send_probes, channel)
        channel.batch.append((key, port, deadline_s, address))
        try:
            with anyio.move_on_after(PROBE_LINGER_S + deadline_s + _PROBE_SLACK_S):
                await waiter.done.wait()
        finally:
            channel.probes.pop(key, None)
        if waiter.error is not None:
            raise waiter.error
        answer = waiter.answer
        if answer is None or answer == b"timeout":
            return False, f"no complete answer within {deadline_s:g}s"
        code = status_code(answer)
        if code is not None:
            return code == 200, f"HTTP {code}"
        if answer.isdigit():  # a status "code" of any other length: not HTTP
            return False, f"RemoteProtocolError: not an HTTP answer: {answer[:60]!r}"
        return False, answer.decode("utf-8", "replace")[:200]


    async def _send_probes(self, channel: _Channel) -> None:
        """After PROBE_LINGER_S, send the probes asked meanwhile as one command; if it cannot
        be sent, each of them gets the error."""
        await anyio.sleep(PROBE_LINGER_S)
        batch, channel.batch = channel.batch, []
        try:
            await channel.command(op="probes", key=next(self._keys),
                                  items=[list(item) for item in batch])
        except LauncherError as exc:
            for key, *_ in batch:
                waiter = channel.probes.pop(key, None)
                if waiter is not None:
                    waiter.error = exc
                    waiter.done.set()


def followers_for(transports: list[Transport]) -> dict[int, HostFollower]:
    """A HostFollower for each distinct transport that can run the agent, by ``id``."""
    out: dict[int, HostFollower] = {}
    for t in transports:
        if id(t) not in out and callable(getattr(t, "duplex", None)):
            out[id(t)] = HostFollower(t)  # type: ignore[arg-type]
    return out
