"""The local transport: runs commands on this machine, with the same contract as SSH.

Every command runs in a new session (``start_new_session``), so a timeout or a cancelled
stream can kill the command *and* whatever it started in its process group, and a Ctrl-C
aimed at launcher does not reach the commands it runs. Processes that a command detaches on
purpose (``setsid``, as launcher.host.run does for servers) leave that group and survive.
"""

from __future__ import annotations

import asyncio
import os
import signal
import subprocess
import sys
from collections.abc import AsyncGenerator, AsyncIterator, Mapping, Sequence
from contextlib import AbstractAsyncContextManager, asynccontextmanager, suppress

import anyio
from anyio.abc import ByteReceiveStream, Process

from launcher.errors import CommandTimedOut, RemoteCommandError
from launcher.host.transport.base import MAX_OUTPUT, MAX_STDERR, CommandResult, Duplex

_STDERR_TAIL = 2000
# What a command inherits from launcher's own environment: what a login shell would have (as
# over SSH). Everything else (LAUNCHER_SLACK_WEBHOOK, a systemd EnvironmentFile's secrets)
# stays in launcher; a server gets more only through the config's ``env``.
INHERITED_ENV = frozenset({
    "PATH", "HOME", "USER", "LOGNAME", "SHELL", "LANG", "LANGUAGE", "TZ", "TMPDIR",
    "LD_LIBRARY_PATH", "CUDA_HOME", "CUDA_PATH",
})


def install_pidfd_child_watcher() -> bool:
    """Have asyncio watch this loop's child processes with pidfds (one fd in the event loop
    per child) instead of Python 3.11's default of one thread blocked in waitpid() per child.

    Call it from inside the one event loop of a process (``launcher up``'s composition
    root): the watcher is global and bound to that loop. Python 3.12+ picks pidfds by
    itself, and a kernel without pidfd_open keeps the default; returns whether it installed
    one. Whatever the old watcher watches keeps being watched by it (it is not closed).
    """
    if sys.version_info >= (3, 12) or not hasattr(os, "pidfd_open"):
        return False
    try:
        loop = asyncio.get_running_loop()
    except RuntimeError:  # not asyncio (trio): it has its own
        return False
    policy = asyncio.get_event_loop_policy()
    current = getattr(policy, "_watcher", None)
    if isinstance(current, asyncio.PidfdChildWatcher) and getattr(current, "_loop", None) is loop:
        return True
    watcher = asyncio.PidfdChildWatcher()
    watcher.attach_loop(loop)
    # Not set_child_watcher: it would close the old watcher, cutting off its children.
    policy._watcher = watcher  # type: ignore[attr-defined]
    return True


def _status(returncode: int) -> int:
    """Map a Popen return code to the shell convention: killed by signal N → 128+N."""
    return 128 - returncode if returncode < 0 else returncode


def _kill_group(process: Process) -> None:
    """SIGKILL the command's process group (it leads its own session, so pgid == pid).

    The kernel does not hand out a pid that is still some group's id, so this cannot hit a
    stranger even after the command itself has been reaped.
    """
    with suppress(ProcessLookupError, PermissionError):
        os.killpg(process.pid, signal.SIGKILL)


class _TooMuchOutput(Exception):
    pass


async def _read_all(stream: ByteReceiveStream | None, sink: bytearray, cap: int) -> None:
    """Collect ``stream``; raise _TooMuchOutput past ``cap`` bytes (``-cap``: keep the last)."""
    if stream is None:
        return
    async for chunk in stream:
        sink += chunk
        if cap < 0 and len(sink) > -cap:
            del sink[:len(sink) + cap]
        elif 0 < cap < len(sink):
            raise _TooMuchOutput


class LocalTransport:
    """A Transport for the machine launcher runs on.

    ``env`` is the host-level environment from the config: it is laid over the INHERITED_ENV
    (and ``LC_*``) part of launcher's own environment for every command, and a command's
    ``env`` is laid over that. Every command runs in that environment's ``$HOME`` (else /),
    as over SSH, never in launcher's own current directory.

    Resource handling: nothing is held between calls; ``aclose`` is a no-op kept for the
    protocol. A command outliving its ``timeout`` (or a cancelled caller) gets its whole
    process group SIGKILLed.

    Error handling: a missing or non-executable program is reported like a shell would
    (exit status 127 / 126), never as an OSError; a timeout raises RemoteCommandError with
    ``exit_status=None``.
    """

    def __init__(self, name: str, env: Mapping[str, str] | None = None) -> None:
        self._name = name
        self._env = dict(env or {})

    @property
    def host_name(self) -> str:
        return self._name

    def _environment(self, env: Mapping[str, str] | None) -> dict[str, str]:
        merged = {k: v for k, v in os.environ.items()
                  if k in INHERITED_ENV or k.startswith("LC_")}
        merged.update(self._env)
        if env:
            merged.update(env)
        return merged

    def _cwd(self, env: Mapping[str, str]) -> str:
        """Where every command runs: the user's home (an SSH login's cwd), else /; never
        launcher's own cwd, where another user may have planted modules that ``python3 -c``
        or ``-m`` would import first (docs/security.md, finding M6)."""
        home = env.get("HOME", "")
        return home if home.startswith("/") and os.path.isdir(home) else "/"

    def _error(
        self,
        message: str,
        argv: Sequence[str],
        status: int | None,
        stderr: bytes,
    ) -> RemoteCommandError:
        return RemoteCommandError(
            message,
            host=self._name,
            command=" ".join(argv),
            exit_status=status,
            stderr=stderr[-_STDERR_TAIL:].decode("utf-8", "replace"),
        )

    async def run(
        self,
        argv: Sequence[str],
        *,
        stdin: bytes | None = None,
        env: Mapping[str, str] | None = None,
        timeout: float | None = 30.0,
        check: bool = False,
    ) -> CommandResult:
        """Run ``argv`` (no shell) to completion; see Transport.run."""
        try:
            # Shielded: a cancel that lands while asyncio spawns the child would orphan it
            # (the Popen is made but never returned, and nobody reaps it).
            with anyio.CancelScope(shield=True):
                environment = self._environment(env)
                process = await anyio.open_process(
                    list(argv),
                    stdin=subprocess.PIPE if stdin is not None else subprocess.DEVNULL,
                    stdout=subprocess.PIPE,
                    stderr=subprocess.PIPE,
                    cwd=self._cwd(environment),
                    env=environment,
                    start_new_session=True,
                )
        except OSError as exc:
            # Report it the way a remote shell would, so callers treat both transports alike.
            status = 126 if isinstance(exc, PermissionError) else 127
            result = CommandResult(status, b"", f"{argv[0]}: {exc.strerror}\n".encode())
            if check:
                raise self._error(
                    f"command failed on {self._name} with exit status {status}",
                    argv,
                    status,
                    result.stderr,
                ) from exc
            return result

        out = bytearray()
        err = bytearray()
        too_much = False
        try:
            with anyio.move_on_after(timeout) as scope:
                async with anyio.create_task_group() as tg:
                    tg.start_soon(_read_all, process.stdout, out, MAX_OUTPUT)
                    tg.start_soon(_read_all, process.stderr, err, -MAX_STDERR)
                    if process.stdin is not None:
                        assert stdin is not None
                        # A command that exits without reading its input is not an error.
                        with suppress(anyio.BrokenResourceError, anyio.ClosedResourceError):
                            await process.stdin.send(stdin)
                        await process.stdin.aclose()
                    await process.wait()
        except* _TooMuchOutput:
            too_much = True
        finally:
            with anyio.CancelScope(shield=True):
                if process.returncode is None or scope.cancelled_caught or too_much:
                    _kill_group(process)
                await process.wait()
                await process.aclose()

        if too_much:
            raise self._error(
                f"command on {self._name} printed more than {MAX_OUTPUT} bytes and was killed",
                argv,
                None,
                bytes(err),
            )
        if scope.cancelled_caught:
            raise CommandTimedOut(
                f"command on {self._name} timed out after {timeout}s and was killed",
                host=self._name,
                command=" ".join(argv),
                stderr=bytes(err)[-_STDERR_TAIL:].decode("utf-8", "replace"),
            )
        assert process.returncode is not None
        result = CommandResult(_status(process.returncode), bytes(out), bytes(err))
        if check and not result.ok:
            raise self._error(
                f"command failed on {self._name} with exit status {result.exit_status}",
                argv,
                result.exit_status,
                result.stderr,
            )
        return result

    async def stream(
        self,
        argv: Sequence[str],
        *,
        env: Mapping[str, str] | None = None,
    ) -> AsyncGenerator[bytes, None]:
        """Yield the stdout of ``argv`` as it arrives; see Transport.stream.

        stderr is discarded. Closing or cancelling the iteration kills the command's group.
        A program that cannot be started yields nothing (as a failing remote command would).
        """
        try:
            process = await self._spawn_piped(argv, env, stdin=subprocess.DEVNULL)
        except OSError:
            return
        try:
            assert process.stdout is not None
            async for chunk in process.stdout:
                yield chunk
        finally:
            await _reap(process)

    @asynccontextmanager
    async def duplex(
        self, argv: Sequence[str], *, env: Mapping[str, str] | None = None,
    ) -> AsyncIterator[Duplex]:
        """Start ``argv`` with stdin and stdout piped to us; see DuplexTransport.duplex.

        A program that cannot be started yields a duplex that has already ended (as a
        failing remote command would: its stdout is empty)."""
        try:
            process = await self._spawn_piped(argv, env, stdin=subprocess.PIPE)
        except OSError:
            yield _Ended()
            return
        try:
            yield _LocalDuplex(self._name, process)
        finally:
            await _reap(process)

    async def _spawn_piped(self, argv: Sequence[str], env: Mapping[str, str] | None, *,
                           stdin: int) -> Process:
        """``argv`` in its own session with stdout piped to us (stderr discarded); OSError
        when it cannot be started. Shielded, as in run(): never orphan a spawned child."""
        environment = self._environment(env)
        with anyio.CancelScope(shield=True):
            process = await anyio.open_process(
                list(argv), stdin=stdin, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL,
                cwd=self._cwd(environment), env=environment, start_new_session=True,
            )
        return process

    def forward_port(self, remote_port: int, address: str,
                     ) -> AbstractAsyncContextManager[tuple[str, int]]:
        """The host *is* this machine: ``address``:``remote_port`` is reachable as it is."""
        return _same_address(address, remote_port)

    async def aclose(self) -> None:
        """Nothing to close; never touches running commands."""


class _LocalDuplex:
    """A local command's stdin and stdout (see Duplex)."""

    def __init__(self, host: str, process: Process) -> None:
        self._host = host
        self._process = process

    async def send(self, data: bytes) -> None:
        assert self._process.stdin is not None
        try:
            await self._process.stdin.send(data)
        except (anyio.BrokenResourceError, anyio.ClosedResourceError, OSError) as exc:
            raise RemoteCommandError(f"command on {self._host} stopped reading its input",
                                     host=self._host, command="duplex") from exc

    async def receive(self) -> bytes:
        assert self._process.stdout is not None
        try:
            return await self._process.stdout.receive(1 << 20)
        except (anyio.EndOfStream, anyio.ClosedResourceError):
            return b""


class _Ended:
    """The duplex of a command that never started: nothing to read, nobody to write to."""

    async def send(self, data: bytes) -> None:
        raise RemoteCommandError("the command did not start", command="duplex")

    async def receive(self) -> bytes:
        return b""


@asynccontextmanager
async def _same_address(address: str, port: int) -> AsyncIterator[tuple[str, int]]:
    yield address, port


async def _reap(process: Process) -> None:
    """Kill ``process``'s group if it still runs, then wait for it and close its pipes
    (shielded: cleanup must finish)."""
    with anyio.CancelScope(shield=True):
        if process.returncode is None:
            _kill_group(process)
        await process.wait()
        await process.aclose()
