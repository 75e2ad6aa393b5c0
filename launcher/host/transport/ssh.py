"""The SSH transport: a small pool of asyncssh connections per host, shared by its servers.

:class:`SSHTransport` implements :class:`launcher.host.transport.base.Transport` over
OpenSSH-compatible
servers. Every caller on a host shares the pool: connections are opened lazily on first use and
reopened on the next call after they drop.

Sessions per connection: sshd limits the exec sessions of one connection (``MaxSessions``, 10 by
default) and each running command or stream holds one. The transport opens at most
``sessions_per_connection`` (default 8) per connection and opens another connection when all are
full, so a stock sshd_config serves any number of servers per host (about 1 connection per 8
followers). A refused session lowers that connection's cap and is retried on another one, so a
host with a lower MaxSessions works too. Port forwards (direct-tcpip channels) are not sessions
and ride on any live connection.

Resource handling: the connections (and jump-host connections, if any) live until
:meth:`SSHTransport.aclose` or until they are lost; every command runs on its own channel, which
is closed when the command finishes, times out or its stream is cancelled. Nothing on the host is
ever killed on purpose: closing a channel only closes the remote command's stdio (it sees EOF or
SIGPIPE).

Error handling: connection problems become :class:`~launcher.errors.HostUnreachable` (retried
here, with jittered exponential backoff bounded by attempts and total seconds, and only while
connecting), a rejected user key becomes :class:`~launcher.errors.AuthenticationFailed` and an
unknown or changed host key :class:`~launcher.errors.HostKeyError` (both fatal at once). Host keys
are always verified against a known_hosts file; trust-on-first-use only records the key of a host
that has no entry yet, and only when the host opted in.

Commands are sent as one string of shell-quoted words, so the remote login shell must be a POSIX
shell (sh, bash, dash, zsh); environment variables travel as ``env -- K=V`` words because sshd's
AcceptEnv is usually off.
"""

from __future__ import annotations

import contextlib
import math
import os
import re
import shlex
import socket
import tempfile
import warnings
from collections.abc import AsyncGenerator, AsyncIterator, Awaitable, Callable, Mapping, Sequence
from contextlib import asynccontextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol

import anyio
import structlog
from tenacity import (
    AsyncRetrying,
    RetryCallState,
    retry_if_exception_type,
    wait_exponential_jitter,
)
from tenacity.stop import stop_base

from launcher.errors import (
    AuthenticationFailed,
    CommandTimedOut,
    HostKeyChanged,
    HostKeyError,
    HostUnreachable,
    RemoteCommandError,
    TransportError,
)
from launcher.host.transport.base import MAX_OUTPUT, MAX_STDERR, CommandResult, Duplex

with warnings.catch_warnings():
    # asyncssh (2.24.1 and earlier) names cryptography's DSA classes at import, and cryptography
    # 51 deprecates DSA with a warning on each name: ten lines on every `launcher` start (an error
    # under `-W error`). Only that warning, only during the import, is silenced; launcher never
    # offers a DSA key and OpenSSH (9.8+) no longer serves one.
    from cryptography.utils import CryptographyDeprecationWarning

    warnings.filterwarnings(
        "ignore", message="DSA is deprecated", category=CryptographyDeprecationWarning
    )
    import asyncssh

log = structlog.get_logger(__name__)

KEEPALIVE_COUNT_MAX = 3
# Exec sessions (commands, streams) opened per connection before another connection is opened.
# OpenSSH's default MaxSessions is 10; 8 leaves room for sessions whose command outlives the
# channel we closed (sshd frees a session only when its command exits). A host with a lower
# MaxSessions is learnt from its refusals (see _open_process).
SESSIONS_PER_CONNECTION = 8
_OPEN_TRIES = 6
STREAM_CHUNK = 64 * 1024
_LOST_WHAT_MAX = 120  # characters of "while running <command>" in a lost connection's error
STDERR_TAIL = 2000
# Backoff between connection attempts: 0.5 s, 1 s, 2 s, ... plus up to JITTER_S of random jitter,
# never more than MAX_WAIT_S (and never past the total budget, see _RetryBudget).
INITIAL_WAIT_S = 0.5
MAX_WAIT_S = 10.0
JITTER_S = 0.5
# A command run with a timeout runs under the host's coreutils ``timeout``, a little longer
# than ours: our timeout only closes the channel, which a hung nvidia-smi never notices.
HOST_TIMEOUT_SLACK_S = 2
HOST_KILL_AFTER_S = 5
_ENV_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]*\Z")

Sleep = Callable[[float], Awaitable[Any]]


class HostConfigLike(Protocol):
    """The fields of a host's config entry the SSH transport reads (duck-typed HostConfig)."""

    @property
    def name(self) -> str: ...
    @property
    def address(self) -> str | None: ...
    @property
    def port(self) -> int | None: ...
    @property
    def user(self) -> str | None: ...
    @property
    def identity_file(self) -> str | Path | None: ...
    @property
    def known_hosts(self) -> str | Path | None: ...
    @property
    def use_ssh_config(self) -> bool: ...
    @property
    def jump_host(self) -> str | None: ...
    @property
    def trust_on_first_use(self) -> bool: ...
    @property
    def connect_timeout(self) -> float: ...
    @property
    def keepalive_interval(self) -> float: ...
    @property
    def env(self) -> Mapping[str, str] | None: ...


def shell_command(argv: Sequence[str], env: Mapping[str, str] | None = None) -> str:
    """Return the one shell command string that runs ``argv`` with ``env`` set, nothing else.

    Every word is quoted with :func:`shlex.quote`, so no element can start a second command.
    Raises ValueError for an empty argv or an environment name that ``env`` could not set.
    """
    if not argv:
        raise ValueError("argv must not be empty")
    words: list[str] = []
    if env:
        words += ["env", "--"]
        for key, value in env.items():
            if not _ENV_NAME.match(key):
                raise ValueError(f"invalid environment variable name: {key!r}")
            words.append(f"{key}={value}")
    words += argv
    return " ".join(shlex.quote(word) for word in words)


def _known_hosts_pattern(host: str, port: int) -> str:
    return host if port == 22 else f"[{host}]:{port}"


@dataclass
class _HostKeyCheck:
    """Per-attempt state of host key verification (what was offered, what TOFU accepted)."""

    known_hosts_file: Path
    trust_on_first_use: bool
    offered_fingerprint: str | None = None
    known_entry: bool = False
    recorded_line: str | None = None
    recorded_fingerprint: str | None = None
    host_label: str = ""

    def validate(self, host: str, addr: str, port: int, key: asyncssh.SSHKey) -> bool:
        """Called by asyncssh only for a key that known_hosts does not trust."""
        self.offered_fingerprint = key.get_fingerprint("sha256")
        self.host_label = _known_hosts_pattern(host, port)
        self.known_entry = _has_entry(self.known_hosts_file, host, addr, port)
        if self.known_entry or not self.trust_on_first_use:
            return False
        public = key.export_public_key("openssh").decode().split()
        self.recorded_line = f"{self.host_label} {public[0]} {public[1]}\n"
        self.recorded_fingerprint = self.offered_fingerprint
        return True


def _offered(error: HostKeyError, fingerprint: str | None) -> HostKeyError:
    error.offered_fingerprint = fingerprint
    return error


def _server_fingerprint(conn: asyncssh.SSHClientConnection) -> str:
    key = conn.get_server_host_key()
    return "(none)" if key is None else str(key.get_fingerprint("sha256"))


def _read_known_hosts(path: Path) -> asyncssh.SSHKnownHosts:
    if not path.exists():
        return asyncssh.import_known_hosts("")
    return asyncssh.read_known_hosts(str(path))


def _has_entry(path: Path, host: str, addr: str, port: int) -> bool:
    """True if known_hosts says anything (keys, CAs, revocations) about this host."""
    match = _read_known_hosts(path).match(host, addr, None if port == 22 else port)
    return any(match)


class _Client(asyncssh.SSHClient):
    """Verifies host keys through ``check`` and logs the end of an established connection."""

    def __init__(self, check: _HostKeyCheck, host: str) -> None:
        self._check = check
        self._host = host
        self._established = False

    def auth_completed(self) -> None:
        self._established = True

    def validate_host_public_key(
        self, host: str, addr: str, port: int, key: asyncssh.SSHKey
    ) -> bool:
        return self._check.validate(host, addr, port, key)

    def connection_lost(self, exc: Exception | None) -> None:
        # A failed attempt is reported by the error it raises; only a live connection "ends".
        if self._established:
            log.info("ssh.disconnected", host=self._host, error=str(exc) if exc else None)


class _RetryBudget(stop_base):
    """Stop after ``attempts`` tries, or before a wait would take the total past ``seconds``.

    Total time is the larger of wall time and the sum of the waits, so an injected sleep that
    returns at once is bounded the same way as a real one.
    """

    def __init__(self, attempts: int, seconds: float) -> None:
        self.attempts = attempts
        self.seconds = seconds

    def __call__(self, retry_state: RetryCallState) -> bool:
        if retry_state.attempt_number >= self.attempts:
            return True
        spent = max(retry_state.seconds_since_start or 0.0, retry_state.idle_for)
        return spent + retry_state.upcoming_sleep > self.seconds


@dataclass(frozen=True)
class _Endpoint:
    """Where one SSH hop goes; ``role`` names it in errors ("host gpu1", "jump host of gpu1")."""

    address: str
    port: int | None
    user: str | None
    role: str

    @property
    def login(self) -> str:
        port = f":{self.port}" if self.port else ""
        return f"{self.user or '(default user)'}@{self.address}{port}"


@dataclass(eq=False)
class _Connection:
    """One SSH connection of the pool; ``sessions`` counts its open exec channels.

    ``cap`` starts at the transport's sessions_per_connection and is lowered to what the host
    actually accepted when it refuses a session (its MaxSessions is lower than we assumed).
    """

    conn: asyncssh.SSHClientConnection
    tunnel: asyncssh.SSHClientConnection | None = None
    sessions: int = 0
    cap: int = 8

    def close(self) -> None:
        self.conn.close()
        if self.tunnel is not None:
            self.tunnel.close()

    @property
    def closed(self) -> bool:
        return self.conn.is_closed() or (self.tunnel is not None and self.tunnel.is_closed())


class SSHTransport:
    """A :class:`~launcher.host.transport.base.Transport` to one host over SSH.

    ``address`` is what to connect to (a name or IP, possibly a ``~/.ssh/config`` alias when
    ``use_ssh_config``); ``port``, ``user`` and ``identity_file`` default to the SSH config and
    then to OpenSSH's defaults (port 22, the local user, ssh-agent and ``~/.ssh/id_*``). An
    explicit ``identity_file`` is the only key offered (like IdentitiesOnly). ``known_hosts``
    defaults to ``~/.ssh/known_hosts``. ``jump_host`` is ``[user@]host[:port]``, reached with
    the same identity and known_hosts. ``env`` is set for every command on the host (per-call
    env wins). ``sleep`` is awaited between connection attempts (tests inject a recorder).

    Resource handling and errors: see the module docstring.
    """

    def __init__(
        self,
        name: str,
        address: str,
        *,
        port: int | None = None,
        user: str | None = None,
        identity_file: str | Path | None = None,
        known_hosts: str | Path | None = None,
        use_ssh_config: bool = True,
        jump_host: str | None = None,
        trust_on_first_use: bool = False,
        connect_timeout: float = 10.0,
        keepalive_interval: float = 15.0,
        env: Mapping[str, str] | None = None,
        retry_attempts: int = 5,
        retry_max_seconds: float = 60.0,
        sessions_per_connection: int = SESSIONS_PER_CONNECTION,
        sleep: Sleep = anyio.sleep,
    ) -> None:
        if retry_attempts < 1:
            raise ValueError("retry_attempts must be at least 1")
        if sessions_per_connection < 1:
            raise ValueError("sessions_per_connection must be at least 1")
        self.name = name
        self.address = address
        self.port = port
        self.user = user
        self.identity_file = Path(identity_file).expanduser() if identity_file else None
        self.known_hosts = Path(known_hosts or "~/.ssh/known_hosts").expanduser()
        self.use_ssh_config = use_ssh_config
        self.jump_host = jump_host
        self.trust_on_first_use = trust_on_first_use
        self.connect_timeout = connect_timeout
        self.keepalive_interval = keepalive_interval
        self.env = dict(env or {})
        self.retry_attempts = retry_attempts
        self.retry_max_seconds = retry_max_seconds
        self.sessions_per_connection = sessions_per_connection
        self._sleep = sleep
        self._lock = anyio.Lock()
        self._pool: list[_Connection] = []
        self._client_keys: Sequence[asyncssh.SSHKeyPair] | None = None
        self._pinned_key: str | None = None  # the host key's fingerprint, from the first connection
        self._changed_key: str | None = None  # another key offered later: the host is refused

    @classmethod
    def from_host_config(cls, host: HostConfigLike, **overrides: Any) -> SSHTransport:
        """Build a transport from a host's config entry; ``overrides`` (e.g. sleep) win.

        An entry without ``address`` connects to its ``name`` (e.g. an ``~/.ssh/config`` alias).
        """
        fields: dict[str, Any] = {
            name: getattr(host, name)
            for name in (
                "port",
                "user",
                "identity_file",
                "known_hosts",
                "use_ssh_config",
                "jump_host",
                "trust_on_first_use",
                "connect_timeout",
                "keepalive_interval",
                "env",
            )
            if hasattr(host, name)
        }
        fields.update(overrides)
        return cls(host.name, host.address or host.name, **fields)

    @property
    def host_name(self) -> str:
        """The host's name from the config."""
        return self.name

    # -- connecting -------------------------------------------------------------------------

    def _endpoints(self) -> tuple[_Endpoint | None, _Endpoint]:
        """The jump host (if any) and the host itself."""
        target = _Endpoint(self.address, self.port, self.user, f"host {self.name}")
        if not self.jump_host:
            return None, target
        user, _, hostport = self.jump_host.rpartition("@")
        address, sep, port_text = hostport.rpartition(":")
        if not sep:
            address, port_text = hostport, ""
        port = int(port_text) if port_text else None
        return _Endpoint(address, port, user or None, f"jump host of {self.name}"), target

    def _load_client_keys(self, endpoint: _Endpoint) -> Sequence[asyncssh.SSHKeyPair] | None:
        """Load the explicit identity file once; None means "agent and default keys"."""
        if self.identity_file is None:
            return None
        if self._client_keys is None:
            try:
                self._client_keys = asyncssh.load_keypairs([str(self.identity_file)])
            except (OSError, asyncssh.KeyImportError, asyncssh.KeyEncryptionError) as exc:
                raise AuthenticationFailed(
                    f"cannot use identity file {self.identity_file} for {endpoint.login}: {exc}",
                    host=self.name,
                    remedy="point identity_file at a readable, unencrypted private key "
                    "(or leave it unset to use ssh-agent)",
                ) from exc
        return self._client_keys

    def _host_key_error(
        self, endpoint: _Endpoint, check: _HostKeyCheck, exc: Exception
    ) -> HostKeyError:
        fingerprint = check.offered_fingerprint or "(unknown)"
        port = endpoint.port or 22
        label = check.host_label or _known_hosts_pattern(endpoint.address, port)
        keyscan = f"`ssh-keyscan -p {port} {endpoint.address} >> {self.known_hosts}`"
        if check.known_entry:
            return _offered(HostKeyError(
                f"host key of {endpoint.role} ({label}) does not match {self.known_hosts}: "
                f"it offered {fingerprint}",
                host=self.name,
                remedy=(
                    "this may be an attack; if the host was really reinstalled, check the new "
                    "fingerprint out of band, then "
                    f"`ssh-keygen -R '{label}' -f {self.known_hosts}` and {keyscan} "
                    "(trust_on_first_use never replaces a changed key)"
                ),
            ), check.offered_fingerprint)
        return _offered(HostKeyError(
            f"host key of {endpoint.role} ({label}) is not in {self.known_hosts}: "
            f"it offered {fingerprint} ({exc})",
            host=self.name,
            remedy=(
                f"check the fingerprint {fingerprint} out of band, then {keyscan}, "
                f"or set trust_on_first_use = true for host {self.name}"
            ),
        ), check.offered_fingerprint)

    def _map_connect_error(
        self, endpoint: _Endpoint, exc: BaseException, check: _HostKeyCheck
    ) -> TransportError:
        login = endpoint.login
        if isinstance(exc, asyncssh.HostKeyNotVerifiable):
            return self._host_key_error(endpoint, check, exc)
        if isinstance(exc, asyncssh.PermissionDenied | asyncssh.IllegalUserName):
            key = self.identity_file or "ssh-agent / default keys"
            return AuthenticationFailed(
                f"{login} ({endpoint.role}) rejected our key ({key}): {exc.reason}",
                host=self.name,
                remedy=f"add the public half of {key} to the authorized_keys of {login}, "
                "or fix user / identity_file for this host",
            )
        if isinstance(exc, asyncssh.KeyExchangeFailed):
            return TransportError(
                f"key exchange with {login} ({endpoint.role}) failed: {exc.reason}",
                host=self.name,
                remedy="the host offers no host key type or cipher we accept; "
                f"compare its keys with {self.known_hosts}",
            )
        if isinstance(exc, asyncssh.ChannelOpenError) and (
            exc.code == asyncssh.OPEN_ADMINISTRATIVELY_PROHIBITED
        ):
            return TransportError(
                f"jump host {self.jump_host} refused to forward to {login}: {exc.reason}",
                host=self.name,
                remedy="allow TCP forwarding (AllowTcpForwarding) on the jump host",
            )
        if isinstance(exc, TimeoutError):
            reason = f"timed out after {self.connect_timeout} s"
        elif isinstance(exc, asyncssh.DisconnectError | asyncssh.ChannelOpenError):
            reason = exc.reason
        else:
            reason = str(exc) or type(exc).__name__
        return HostUnreachable(
            f"cannot reach {endpoint.role} ({login}): {reason}",
            host=self.name,
            remedy="check that the host is up and sshd listens on that port",
        )

    async def _connect_direct(
        self, endpoint: _Endpoint, tunnel: asyncssh.SSHClientConnection | None
    ) -> asyncssh.SSHClientConnection:
        """One connection attempt to ``endpoint`` (through ``tunnel``), errors mapped."""
        client_keys = self._load_client_keys(endpoint)
        try:
            known = _read_known_hosts(self.known_hosts)
        except (OSError, ValueError) as exc:
            raise HostKeyError(
                f"cannot read known_hosts {self.known_hosts} for {self.name}: {exc}",
                host=self.name,
                remedy="fix or remove the malformed file",
            ) from exc
        check = _HostKeyCheck(self.known_hosts, self.trust_on_first_use)
        options: dict[str, Any] = {
            "known_hosts": known,
            "config": () if self.use_ssh_config else None,
            "connect_timeout": self.connect_timeout,
            "keepalive_interval": self.keepalive_interval,
            "keepalive_count_max": KEEPALIVE_COUNT_MAX,
            "client_factory": lambda: _Client(check, self.name),
        }
        if endpoint.port is not None:
            options["port"] = endpoint.port
        if endpoint.user is not None:
            options["username"] = endpoint.user
        if client_keys is not None:
            options["client_keys"] = client_keys
        if tunnel is not None:
            options["tunnel"] = tunnel
        try:
            conn = await asyncssh.connect(endpoint.address, **options)
        except (OSError, TimeoutError, asyncssh.DisconnectError, asyncssh.ChannelOpenError) as exc:
            raise self._map_connect_error(endpoint, exc, check) from exc
        if check.recorded_line is not None:
            try:
                self._record_host_key(check)
            except OSError as exc:
                # Unrecorded, the key would be trusted afresh on every connection (and a
                # changed one never noticed): refuse, and close what was opened.
                conn.close()
                raise HostKeyError(
                    f"{endpoint.role}: trust_on_first_use accepted host key "
                    f"{check.recorded_fingerprint} but cannot record it in "
                    f"{self.known_hosts}: {exc.strerror or exc}",
                    host=self.name,
                    remedy="make known_hosts writable, set known_hosts to a writable file, or "
                    "add the host's key yourself (ssh-keyscan) and turn trust_on_first_use off",
                ) from exc
        return conn

    def _record_host_key(self, check: _HostKeyCheck) -> None:
        """Append the key trust-on-first-use accepted to known_hosts (created 0600 if missing)."""
        assert check.recorded_line is not None
        path = self.known_hosts
        path.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
        prefix = ""
        if path.exists():
            text = path.read_bytes()
            if text and not text.endswith(b"\n"):
                prefix = "\n"
        else:
            path.touch(mode=0o600)
        with path.open("a") as fh:
            fh.write(prefix + check.recorded_line)
        log.warning(
            "ssh.host_key_recorded",
            host=self.name,
            known_hosts_entry=check.host_label,
            fingerprint=check.recorded_fingerprint,
            known_hosts=str(path),
        )

    async def _open_once(self) -> _Connection:
        jump, target = self._endpoints()
        tunnel = None if jump is None else await self._connect_direct(jump, None)
        try:
            conn = await self._connect_direct(target, tunnel)
        except BaseException:
            if tunnel is not None:
                tunnel.close()
            raise
        return _Connection(conn, tunnel)

    def _log_retry(self, retry_state: RetryCallState) -> None:
        exc = retry_state.outcome.exception() if retry_state.outcome else None
        log.warning(
            "ssh.connect_retry",
            host=self.name,
            attempt=retry_state.attempt_number,
            wait_s=round(retry_state.upcoming_sleep, 3),
            error=str(exc),
        )

    async def _connect(self) -> _Connection:
        """Open a connection (with retries). The host's key is pinned on the first one: a
        later connection offering another key (a known_hosts mismatch, or a key known_hosts
        was changed to accept meanwhile) raises HostKeyChanged, then and on every later call,
        before any command is sent."""
        self._refuse_if_key_changed()
        try:
            current = await self._connect_retrying()
        except HostKeyError as exc:
            if self._pinned_key is None:
                raise
            self._changed_key = exc.offered_fingerprint or "(not shown)"
            raise self._key_changed_error() from exc
        offered = _server_fingerprint(current.conn)
        if self._pinned_key is None:
            self._pinned_key = offered
        elif offered != self._pinned_key:
            current.close()
            self._changed_key = offered
            raise self._key_changed_error()
        return current

    def _refuse_if_key_changed(self) -> None:
        if self._changed_key is not None:
            raise self._key_changed_error()

    def _key_changed_error(self) -> HostKeyChanged:
        assert self._pinned_key is not None and self._changed_key is not None
        return HostKeyChanged(self.name, self._pinned_key, self._changed_key)

    async def _connect_retrying(self) -> _Connection:
        retrying = AsyncRetrying(
            sleep=self._sleep,
            retry=retry_if_exception_type(HostUnreachable),
            stop=_RetryBudget(self.retry_attempts, self.retry_max_seconds),
            wait=wait_exponential_jitter(multiplier=INITIAL_WAIT_S, max=MAX_WAIT_S,
                                         jitter=JITTER_S),
            before_sleep=self._log_retry,
            reraise=True,
        )
        async for attempt in retrying:
            with attempt:
                current = await self._open_once()
        log.info(
            "ssh.connected",
            host=self.name,
            address=self.address,
            port=self.port,
            via=self.jump_host,
        )
        return current

    async def _connection(self, *, session: bool) -> tuple[_Connection, bool]:
        """A live pool connection and whether it was opened for this call.

        With ``session`` it is one with a free session slot, and the slot is taken (give it
        back with :meth:`_release`); a new connection (with retries) is opened when every
        connection is full or none is alive. Without, any live connection does (port
        forwards: direct-tcpip channels do not count toward sshd's MaxSessions).
        """
        self._refuse_if_key_changed()  # not even on a connection still open to the host
        async with self._lock:
            live = []
            for current in self._pool:
                if current.closed:
                    current.close()
                else:
                    live.append(current)
            self._pool = live
            for current in live:
                if not session:
                    return current, False
                if current.sessions < current.cap:
                    current.sessions += 1
                    return current, False
            current = await self._connect()
            current.cap = self.sessions_per_connection
            current.sessions = 1 if session else 0
            self._pool.append(current)
            if len(self._pool) > 1:
                log.info("ssh.pool_grew", host=self.name, connections=len(self._pool),
                         sessions=sum(c.sessions for c in self._pool))
            return current, True

    @staticmethod
    def _release(current: _Connection) -> None:
        current.sessions = max(0, current.sessions - 1)

    def _discard(self, current: _Connection) -> None:
        current.close()
        if current in self._pool:
            self._pool.remove(current)

    @property
    def sessions_open(self) -> int:
        """Exec sessions this transport has open now, over all its connections."""
        return sum(c.sessions for c in self._pool if not c.closed)

    @property
    def connections_open(self) -> int:
        """Live SSH connections in the pool."""
        return sum(1 for c in self._pool if not c.closed)

    def _lost(self, exc: BaseException, what: str) -> HostUnreachable:
        # ``what`` may quote a command (a follower's whole script): its start says which
        # one; the rest would fill every log line and hook that carries the error.
        if len(what) > _LOST_WHAT_MAX:
            what = what[:_LOST_WHAT_MAX - 1] + "…"
        return HostUnreachable(
            f"connection to {self.name} lost {what}: {exc}",
            host=self.name,
            remedy="the next call reconnects; check the host and network if this repeats",
        )

    async def _open_process(
        self, command: str, **kwargs: Any
    ) -> tuple[_Connection, asyncssh.SSHClientProcess[bytes]]:
        """Open a channel running ``command`` on a pool connection with a free session slot.

        The slot stays taken until :meth:`_release` (callers do it when the channel closes).
        If opening the channel fails, the command never started, so retrying is safe: a stale
        connection is replaced. A session the host refuses is asked for once more on the same
        connection at once: sshd frees a finished session only once it has read our close of
        its channel, and it answers an open only after freeing what closed before it, so a
        refusal because our just-closed sessions were not yet freed (an open that reached
        sshd with those closes, likelier the busier the host) does not repeat. Refused again
        (the host's MaxSessions is below our cap, or commands of channels we closed still
        run there), the connection's cap is lowered to what it holds and the next connection
        is tried. Only a brand-new connection refusing its first session is an error
        (TransportError: the host allows no sessions at all).
        """
        tries = 0
        again: _Connection | None = None  # a refusal's connection, asked once more
        # The connections asked again (once each); held, not their ids, which a connection
        # made later in this call could reuse once one of them is gone.
        asked_again: list[_Connection] = []
        fresh = False
        while True:
            if again is not None and self._take_slot(again):
                current = again  # ``fresh`` stays what it was for the first ask
            elif tries < _OPEN_TRIES:
                tries += 1
                current, fresh = await self._connection(session=True)
            else:
                raise TransportError(
                    f"{self.name} kept refusing sessions ({_OPEN_TRIES} tries)",
                    host=self.name,
                    remedy="check MaxSessions in the host's sshd_config",
                )
            again = None
            try:
                process = await current.conn.create_process(command, encoding=None, **kwargs)
            except (OSError, asyncssh.DisconnectError, asyncssh.ChannelOpenError) as exc:
                self._release(current)
                if not current.closed and isinstance(exc, asyncssh.ChannelOpenError):
                    others = current.sessions
                    if not any(c is current for c in asked_again):
                        asked_again.append(current)
                        again = current
                        log.debug("ssh.session_asked_again", host=self.name,
                                  open_sessions=others, error=exc.reason)
                        continue
                    if fresh and others == 0:
                        raise TransportError(
                            f"{self.name} refused a session on a new connection: {exc.reason}",
                            host=self.name,
                            remedy="check MaxSessions (at least 1) and the login's shell "
                            "in the host's sshd_config",
                        ) from exc
                    current.cap = max(1, others)
                    log.warning("ssh.session_refused", host=self.name, open_sessions=others,
                                cap=current.cap, error=exc.reason)
                    if others == 0:  # commands of channels we closed still run on the host
                        self._discard(current)
                    continue
                self._discard(current)
                if fresh:
                    raise self._lost(exc, "while opening a session") from exc
                continue
            return current, process

    def _take_slot(self, current: _Connection) -> bool:
        """Take a session slot of ``current`` if it is a live pool connection with one free."""
        if current.closed or current not in self._pool or current.sessions >= current.cap:
            return False
        current.sessions += 1
        return True

    # -- Transport --------------------------------------------------------------------------

    def _merged_env(self, env: Mapping[str, str] | None) -> dict[str, str]:
        merged = dict(self.env)
        merged.update(env or {})
        return merged

    async def run(
        self,
        argv: Sequence[str],
        *,
        stdin: bytes | None = None,
        env: Mapping[str, str] | None = None,
        timeout: float | None = 30.0,
        check: bool = False,
    ) -> CommandResult:
        """Run ``argv`` on the host and return its status and output (see Transport.run).

        Exit by signal N reports 128+N. On ``timeout`` the channel is closed and
        RemoteCommandError raised; a connection lost while the command runs raises
        HostUnreachable (whether the command finished is unknown).
        """
        if timeout is not None:
            limit = str(math.ceil(timeout) + HOST_TIMEOUT_SLACK_S)
            argv = ["timeout", "-k", str(HOST_KILL_AFTER_S), limit, *argv]
        command = shell_command(argv, self._merged_env(env))
        current, process = await self._open_process(command)
        out, err = bytearray(), bytearray()
        try:
            if stdin:
                process.stdin.write(stdin)
            process.stdin.write_eof()
            with anyio.fail_after(timeout):
                async with anyio.create_task_group() as tg:
                    tg.start_soon(_collect, process.stderr, err, -MAX_STDERR)
                    await _collect(process.stdout, out, MAX_OUTPUT)
                await process.wait_closed()
            stdout, stderr = bytes(out), bytes(err)
        except* _TooMuchOutput:
            raise RemoteCommandError(
                f"{self.name}: command printed more than {MAX_OUTPUT} bytes: {command}",
                host=self.name,
                command=command,
                stderr=_tail(bytes(err)),
                remedy="its channel was closed (the host's `timeout` ends it)",
            ) from None
        except* TimeoutError:
            raise CommandTimedOut(
                f"{self.name}: command timed out after {timeout} s: {command}",
                host=self.name,
                command=command,
                stderr=_tail(bytes(err)),
                remedy="the command's channel was closed; raise the timeout if it is just slow",
            ) from None
        except* (OSError, asyncssh.DisconnectError) as group:
            self._discard(current)
            exc = group.exceptions[0]
            raise self._lost(exc, f"while running {command}") from exc
        finally:
            process.close()
            self._release(current)
        code = process.returncode
        if code is None:
            if current.closed:
                self._discard(current)
                raise self._lost(ConnectionError("no exit status"), f"while running {command}")
            code = 255  # closed without a status, as OpenSSH's client reports it
        status = 128 - code if code < 0 else code
        result = CommandResult(exit_status=status, stdout=_bytes(stdout), stderr=_bytes(stderr))
        if check and not result.ok:
            raise RemoteCommandError(
                f"{self.name}: command exited with status {status}: {command}",
                host=self.name,
                command=command,
                exit_status=status,
                stderr=_tail(result.stderr),
            )
        return result

    async def stream(
        self,
        argv: Sequence[str],
        *,
        env: Mapping[str, str] | None = None,
    ) -> AsyncGenerator[bytes, None]:
        """Yield the command's stdout in chunks as it arrives, until it exits (see Transport).

        stderr is discarded; stdin stays open, so closing the stream gives the command EOF on
        stdin. Leaving the iteration (break, cancel, aclose) closes the channel. A connection
        lost mid-stream raises HostUnreachable.
        """
        command = shell_command(argv, self._merged_env(env))
        current, process = await self._open_process(command, stderr=asyncssh.DEVNULL)
        try:
            while True:
                try:
                    chunk = await process.stdout.read(STREAM_CHUNK)
                except (OSError, asyncssh.DisconnectError) as exc:
                    self._discard(current)
                    raise self._lost(exc, f"while streaming {command}") from exc
                if not chunk:
                    break
                yield _bytes(chunk)
            await process.wait_closed()
            if process.returncode is None and current.closed:
                self._discard(current)
                lost = ConnectionError("stream ended without an exit status")
                raise self._lost(lost, f"while streaming {command}")
        finally:
            process.close()
            self._release(current)

    @asynccontextmanager
    async def duplex(
        self, argv: Sequence[str], *, env: Mapping[str, str] | None = None,
    ) -> AsyncIterator[Duplex]:
        """Run ``argv`` with its stdin and stdout open to us (see DuplexTransport.duplex).

        It holds one session slot of a pool connection until the ``async with`` ends, which
        closes the channel (the command sees EOF on stdin). A connection lost meanwhile
        raises HostUnreachable from ``send`` or ``receive``.
        """
        command = shell_command(argv, self._merged_env(env))
        current, process = await self._open_process(command, stderr=asyncssh.DEVNULL)
        try:
            yield _SSHDuplex(self, current, process, command)
        finally:
            process.close()
            self._release(current)

    @asynccontextmanager
    async def forward_port(self, remote_port: int, address: str,
                           ) -> AsyncIterator[tuple[str, int]]:
        """Forward 127.0.0.1:<local> here to ``address``:``remote_port`` on the host (the host
        dials it: its listen address, or its loopback for a wildcard one); yield
        ("127.0.0.1", local).

        The local port stays the same for the whole ``async with``, across dropped and
        reopened connections: each accepted local connection is carried by its own channel on
        whatever connection is current, reconnecting first when it was lost (so a prober that
        keeps its URL keeps working after an SSH drop).

        Error handling: nothing here raises for the host's sake. A local connection whose
        channel cannot be opened (host unreachable, forwarding refused, nothing listening on
        the port) is closed at once and ``ssh.forward_failed`` logged; one whose connection
        drops is closed. The client sees a closed connection, as from a dead server.
        Resource handling: leaving the ``async with`` closes the listener, every local
        connection and every channel. The sockets are plain non-blocking ones, accepted
        without an await in between, so cancellation can never drop one unclosed.
        """
        listener = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        try:
            listener.bind(("127.0.0.1", 0))
            async with self._serve_forward(listener, remote_port, address):
                yield "127.0.0.1", int(listener.getsockname()[1])
        finally:
            listener.close()

    @asynccontextmanager
    async def forward_unix(self, remote_port: int, address: str) -> AsyncIterator[str]:
        """Like forward_port, but listening on a Unix socket in a fresh 0700 directory; yields
        its path. Unlike a loopback port, no other local user can reach the server through it
        (the probes use this: SGLang's admin endpoints are on the same port)."""
        folder = tempfile.mkdtemp(prefix="launcher-fwd-")  # mode 0700
        path = os.path.join(folder, "s")
        listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        try:
            listener.bind(path)
            async with self._serve_forward(listener, remote_port, address):
                yield path
        finally:
            listener.close()
            with contextlib.suppress(OSError):
                os.unlink(path)
            with contextlib.suppress(OSError):
                os.rmdir(folder)

    @asynccontextmanager
    async def _serve_forward(
        self, listener: socket.socket, remote_port: int, address: str
    ) -> AsyncIterator[None]:
        """Accept on the bound ``listener`` and relay each connection (see forward_port)."""
        accepted: set[socket.socket] = set()
        try:
            listener.listen()
            listener.setblocking(False)
            async with anyio.create_task_group() as tg:

                async def accept_loop() -> None:
                    while True:
                        await anyio.wait_readable(listener)
                        try:
                            conn, _ = listener.accept()
                        except (BlockingIOError, InterruptedError):
                            continue  # another wake-up took it, or the client gave up
                        accepted.add(conn)
                        conn.setblocking(False)
                        tg.start_soon(self._relay, remote_port, address, conn, accepted)

                tg.start_soon(accept_loop)
                try:
                    yield
                finally:
                    tg.cancel_scope.cancel()
        finally:
            for conn in accepted:
                conn.close()

    async def _relay(
        self, remote_port: int, address: str, conn: socket.socket,
        accepted: set[socket.socket],
    ) -> None:
        """Carry one local connection over a new channel to ``address``:``remote_port`` on the
        host."""
        try:
            try:
                reader, writer = await self._open_tunnel(remote_port, address)
            except (TransportError, OSError, asyncssh.Error) as exc:
                log.info("ssh.forward_failed", host=self.name, address=address,
                         port=remote_port, error=str(exc))
                return
            try:
                async with anyio.create_task_group() as tg:
                    tg.start_soon(_socket_to_channel, conn, writer)
                    await _channel_to_socket(reader, conn)
                    tg.cancel_scope.cancel()
            finally:
                writer.close()
        finally:
            accepted.discard(conn)
            conn.close()

    async def connect_port(self, remote_port: int, address: str) -> anyio.abc.ByteStream:
        """A byte stream to ``address``:``remote_port`` on the host (the host dials it) over a
        direct-tcpip channel of the pool's connection (no local socket). HostUnreachable when
        the host cannot be reached; OSError or asyncssh.ChannelOpenError (as TransportError)
        when it refuses."""
        try:
            reader, writer = await self._open_tunnel(remote_port, address)
        except asyncssh.ChannelOpenError as exc:
            raise TransportError(f"{self.name} refused a channel to port {remote_port} on "
                                 f"{address}: {exc.reason}", host=self.name) from exc
        return _ChannelStream(reader, writer)

    async def _open_tunnel(
        self, remote_port: int, address: str
    ) -> tuple[asyncssh.SSHReader[bytes], asyncssh.SSHWriter[bytes]]:
        """A direct-tcpip channel to ``address``:``remote_port`` (sshd on the host dials it);
        a stale connection is replaced once (as in _open_process: a channel that never
        opened carried nothing)."""
        for _ in range(2):
            current, fresh = await self._connection(session=False)
            try:
                return await current.conn.open_connection(address, remote_port)
            except (OSError, asyncssh.DisconnectError, asyncssh.ChannelOpenError) as exc:
                if not current.closed:
                    raise  # the host refused this channel; the connection is fine
                self._discard(current)
                if fresh:
                    raise self._lost(exc, "while forwarding a port") from exc
        raise AssertionError("unreachable")  # pragma: no cover

    async def aclose(self) -> None:
        """Close the connection (and jump connection). Never kills anything on the host."""
        async with self._lock:
            pool, self._pool = self._pool, []
        for current in pool:
            current.close()
        with anyio.move_on_after(5, shield=True):
            for current in pool:
                await current.conn.wait_closed()
                if current.tunnel is not None:
                    await current.tunnel.wait_closed()


async def _socket_to_channel(conn: socket.socket, writer: asyncssh.SSHWriter[bytes]) -> None:
    """Copy what the local client sends to the channel, then pass its EOF on."""
    try:
        while True:
            await anyio.wait_readable(conn)
            try:
                data = conn.recv(STREAM_CHUNK)
            except (BlockingIOError, InterruptedError):
                continue
            if not data:
                break
            writer.write(data)
            await writer.drain()
        if writer.can_write_eof():
            writer.write_eof()
    except (OSError, asyncssh.Error):
        pass  # the client or the channel is gone: the relay closes both


async def _channel_to_socket(reader: asyncssh.SSHReader[bytes], conn: socket.socket) -> None:
    """Copy the channel's data to the local client until the channel ends or either fails."""
    try:
        while data := await reader.read(STREAM_CHUNK):
            view = memoryview(data)
            while view:
                await anyio.wait_writable(conn)
                try:
                    view = view[conn.send(view):]
                except (BlockingIOError, InterruptedError):
                    continue
        conn.shutdown(socket.SHUT_WR)
    except (OSError, asyncssh.Error):
        pass  # the client or the channel is gone: the relay closes both


class _ChannelStream(anyio.abc.ByteStream):
    """A direct-tcpip channel as an anyio byte stream."""

    def __init__(self, reader: asyncssh.SSHReader[bytes],
                 writer: asyncssh.SSHWriter[bytes]) -> None:
        self._reader = reader
        self._writer = writer

    async def receive(self, max_bytes: int = 65536) -> bytes:
        try:
            data = await self._reader.read(max_bytes)
        except asyncssh.Error as exc:
            raise anyio.BrokenResourceError(str(exc)) from exc
        if not data:
            raise anyio.EndOfStream
        return _bytes(data)

    async def send(self, item: bytes) -> None:
        try:
            self._writer.write(item)
            await self._writer.drain()
        except asyncssh.Error as exc:
            raise anyio.BrokenResourceError(str(exc)) from exc

    async def send_eof(self) -> None:
        if self._writer.can_write_eof():
            self._writer.write_eof()

    async def aclose(self) -> None:
        self._writer.close()


class _SSHDuplex:
    """One channel's stdin and stdout (see Duplex)."""

    def __init__(self, transport: SSHTransport, current: _Connection,
                 process: asyncssh.SSHClientProcess[bytes], command: str) -> None:
        self._transport = transport
        self._current = current
        self._process = process
        self._command = command

    def _lost(self, exc: BaseException) -> HostUnreachable:
        self._transport._discard(self._current)
        return self._transport._lost(exc, f"while running {self._command[:80]}")

    async def send(self, data: bytes) -> None:
        try:
            self._process.stdin.write(data)
            await self._process.stdin.drain()
        except asyncssh.DisconnectError as exc:
            raise self._lost(exc) from exc
        except (OSError, asyncssh.Error) as exc:
            if self._current.closed:
                raise self._lost(exc) from exc
            raise RemoteCommandError(
                f"{self._transport.name}: command stopped reading its input: {exc}",
                host=self._transport.name, command=self._command) from exc

    async def receive(self) -> bytes:
        try:
            chunk = await self._process.stdout.read(STREAM_CHUNK)
        except (OSError, asyncssh.DisconnectError) as exc:
            raise self._lost(exc) from exc
        if chunk:
            return _bytes(chunk)
        await self._process.wait_closed()
        if self._process.returncode is None and self._current.closed:
            raise self._lost(ConnectionError("channel ended without an exit status"))
        return b""


class _TooMuchOutput(Exception):
    pass


async def _collect(stream: asyncssh.SSHReader[bytes], sink: bytearray, cap: int) -> None:
    """Read ``stream`` to EOF into ``sink``; raise _TooMuchOutput past ``cap`` bytes, or with
    a negative ``cap`` keep only the last ``-cap``."""
    while chunk := await stream.read(STREAM_CHUNK):
        sink += _bytes(chunk)
        if cap < 0 and len(sink) > -cap:
            del sink[:len(sink) + cap]
        elif 0 < cap < len(sink):
            raise _TooMuchOutput


def _bytes(data: bytes | str) -> bytes:
    return data.encode() if isinstance(data, str) else data


def _tail(data: bytes | str) -> str:
    text = data.decode(errors="replace") if isinstance(data, bytes) else data
    return text[-STDERR_TAIL:]
