"""The interface every transport implements. The supervisor and the remote-run protocol
(launcher.host.run) only ever talk to a host through it, so SSH and local are interchangeable.

Contract for implementers:
- ``argv`` is a list of strings. The transport runs it *without a shell on our side*: the local
  transport execs it directly; the SSH transport shell-quotes every element (shlex.quote) and
  sends one command string. A caller that needs shell features passes ["sh", "-c", script, ...]
  and quotes its own pieces.
- Secrets never travel in argv: pass them with ``stdin`` or write them into a 0600 file.
- Errors: connection problems raise launcher.errors.HostUnreachable (transient),
  AuthenticationFailed / HostKeyError (fatal). Callers rely on the distinction: a
  HostUnreachable never counts against a server (see docs/reliability.md), so a transport must
  not report a broken connection as anything else, nor a host's answer as HostUnreachable.
  A command's non-zero exit is *not* an exception unless ``check=True`` (then
  RemoteCommandError with host, command, exit status, stderr tail).
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Mapping, Sequence
from contextlib import AbstractAsyncContextManager
from dataclasses import dataclass
from typing import Protocol

# The most stdout one ``run`` collects; beyond it the command is stopped and RemoteCommandError
# raised (a host printing junk must not take launcher's memory). stderr keeps its last
# MAX_STDERR bytes. Callers that read more (logs) read it in pieces.
MAX_OUTPUT = 32 << 20
MAX_STDERR = 64 << 10


@dataclass(frozen=True)
class CommandResult:
    """Outcome of one finished command on a host."""

    exit_status: int  # 0..255; a command killed by signal N reports 128+N
    stdout: bytes
    stderr: bytes

    @property
    def ok(self) -> bool:
        return self.exit_status == 0


class Transport(Protocol):
    """A connection to one host, shared by every server on it."""

    @property
    def host_name(self) -> str:
        """The host's name from the config (for errors and log context)."""
        ...

    async def run(
        self,
        argv: Sequence[str],
        *,
        stdin: bytes | None = None,
        env: Mapping[str, str] | None = None,
        timeout: float | None = 30.0,
        check: bool = False,
    ) -> CommandResult:
        """Run ``argv`` to completion and return its status and output.

        At most MAX_OUTPUT bytes of stdout: a command printing more is stopped and
        RemoteCommandError raised. On ``timeout`` the command is killed on the host too.
        """
        ...

    def stream(
        self,
        argv: Sequence[str],
        *,
        env: Mapping[str, str] | None = None,
    ) -> AsyncIterator[bytes]:
        """Run ``argv`` and yield its stdout as it arrives, in chunks, until it exits.

        Raises HostUnreachable if the connection drops mid-stream (the caller reconnects and
        resumes from what it had received). Cancelling the iteration terminates the command.
        """
        ...

    def forward_port(self, remote_port: int, address: str,
                     ) -> AbstractAsyncContextManager[tuple[str, int]]:
        """Make ``address``:``remote_port`` on the host reachable here; yields the (address,
        port) to connect to here.

        ``address`` is what the host dials: the server's listen address, or the loopback for
        a wildcard one (launcher.config.schema.probe_address). The SSH transport yields a
        port of its own on 127.0.0.1; the local transport yields ``(address, remote_port)``
        (the host is this machine: it is reachable as it is).
        """
        ...

    async def aclose(self) -> None:
        """Close the connection. Never kills anything on the host."""
        ...


class Duplex(Protocol):
    """A running command's stdin and stdout, both open for the life of the command."""

    async def send(self, data: bytes) -> None:
        """Write ``data`` to the command's stdin (waits while the pipe or window is full).
        Raises HostUnreachable when the connection is lost, RemoteCommandError when the
        command no longer reads (it exited)."""
        ...

    async def receive(self) -> bytes:
        """The next piece of the command's stdout; ``b""`` once it has ended (the command
        exited or closed it). Raises HostUnreachable when the connection is lost."""
        ...


class DuplexTransport(Transport, Protocol):
    """A transport that can also keep a two-way command open (the host follow agent)."""

    def duplex(
        self, argv: Sequence[str], *, env: Mapping[str, str] | None = None,
    ) -> AbstractAsyncContextManager[Duplex]:
        """Start ``argv`` with its stdin and stdout open to us; stderr is discarded.

        Resource handling: leaving the ``async with`` closes both ends (the command sees EOF
        on stdin) and, on the local transport, kills the command's process group. The
        command holds one session of the connection while it runs (SSH).
        """
        ...
