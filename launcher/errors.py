"""The one exception tree of launcher. Only the CLI turns these into exit codes.

    LauncherException                  root; carries a remedy
    ├── LauncherError                  a failure of what was asked
    │   ├── ConfigError                bad config.toml / env; lists every problem (exit 2)
    │   ├── UsageError                 bad CLI input (exit 2)
    │   ├── LogFormatError             a log or remote output we cannot read (names the line)
    │   ├── PolicyError                the backoff policy was asked something impossible
    │   ├── TransportError             running a command on a host failed
    │   │   ├── HostUnreachable        refused / timed out / lost (transient: retried)
    │   │   ├── AuthenticationFailed   wrong user key (fatal at once)
    │   │   └── HostKeyError           unknown or changed host key (fatal at once)
    │   │       └── HostKeyChanged     it changed while connected (no more commands)
    │   ├── RemoteCommandError         a remote command exited non-zero
    │   │   └── CommandTimedOut        it did not finish in time (transient: retried)
    │   ├── PreflightError             GPUs / port / model path not usable for a launch
    │   ├── WontFit                    the memory estimate says no setting fits (exit 5)
    │   ├── StateError                 the attempt ledger / state dir (lock held, corrupt)
    │   └── IllegalTransition          the start-up state machine got an impossible event
    └── LeaseLost                      not a failure: this launcher no longer holds the
        │                              coordination lease and must stop acting (exit 6,
        │                              docs/ha.md)
        └── FencedOut                  a host refused an action: it saw a newer lease's token

LeaseLost is a sibling of LauncherError, not a kind of it, so that the many handlers that
judge a failed host action (``except LauncherError``: retry, count an attempt, relaunch)
never see it; only a handler as broad as ``Exception`` must let it through
(``reraise_lease_lost``).
"""

from __future__ import annotations

import traceback


class LauncherException(Exception):
    """Root of everything launcher raises on purpose.

    ``remedy`` says what the operator can do about it; the CLI prints it.
    """

    remedy: str = ""

    def __init__(self, message: str, *, remedy: str = "") -> None:
        super().__init__(message)
        if remedy:
            self.remedy = remedy

    def __str__(self) -> str:
        text = super().__str__()
        return f"{text}\n  fix: {self.remedy}" if self.remedy else text


class LauncherError(LauncherException):
    """Something launcher was asked to do failed (see the tree above)."""


class ConfigError(LauncherError):
    """The configuration is invalid. ``problems`` holds one line per problem, each with its path."""

    def __init__(self, problems: list[str], *, source: str = "config") -> None:
        self.problems = problems
        self.source = source
        lines = "\n".join(f"  {p}" for p in problems)
        super().__init__(f"{source}: {len(problems)} problem(s):\n{lines}")


class UsageError(LauncherError):
    """The command line is wrong."""


class LogFormatError(LauncherError):
    """A log or a remote command's output could not be understood."""


class PolicyError(LauncherError):
    """The backoff policy got inputs it cannot act on."""


class TransportError(LauncherError):
    """Running something on a host failed."""

    def __init__(self, message: str, *, host: str = "", remedy: str = "") -> None:
        self.host = host
        super().__init__(message, remedy=remedy)


class HostUnreachable(TransportError):
    """Connection refused, timed out or lost. Transient: the only transport error retried."""


class AuthenticationFailed(TransportError):
    """The host rejected our credentials. Fatal at once; retrying cannot help."""


class HostKeyError(TransportError):
    """The host key is unknown or has changed. Fatal at once. ``offered_fingerprint`` is the
    key the host offered (SHA256:...), when known."""

    offered_fingerprint: str | None = None


class HostKeyChanged(HostKeyError):
    """The host key changed while launcher was connected to the host: this process will not
    send it another command. ``previous`` and ``offered`` are the two fingerprints."""

    def __init__(self, host: str, previous: str, offered: str, *, detail: str = "") -> None:
        self.previous = previous
        self.offered_fingerprint = offered
        super().__init__(
            f"host key of {host} changed while launcher was running: it was {previous}, it is "
            f"now {offered}{detail}; no further commands are sent to {host}",
            host=host,
            remedy="this may be an attack; if the host was really reinstalled, check the new "
            "fingerprint out of band, update known_hosts, then restart launcher",
        )


class RemoteCommandError(LauncherError):
    """A command on a host exited with a non-zero status."""

    def __init__(
        self, message: str, *, host: str = "", command: str = "", exit_status: int | None = None,
        stderr: str = "", remedy: str = "",
    ) -> None:
        self.host = host
        self.command = command
        self.exit_status = exit_status
        self.stderr = stderr
        super().__init__(message, remedy=remedy)


class CommandTimedOut(RemoteCommandError):
    """A command on a host did not finish within its timeout and was stopped. Transient: a
    loaded host (or a loaded launcher) answers the next time."""


def is_transient(exc: BaseException) -> bool:
    """Whether ``exc`` says "the host could not be asked right now", so asking again later
    may succeed: HostUnreachable (refused, timed out, lost), CommandTimedOut, and a plain
    TransportError (the host refused a session, e.g. sshd's MaxSessions, or a jump host
    hiccup). Never AuthenticationFailed or HostKeyError, nor a command's own failure."""
    return isinstance(exc, HostUnreachable | CommandTimedOut) or type(exc) is TransportError


class PreflightError(LauncherError):
    """A server cannot be launched now (GPUs missing or busy, port taken, model path missing)."""

    def __init__(self, message: str, *, transient: bool = False, remedy: str = "") -> None:
        self.transient = transient
        super().__init__(message, remedy=remedy)


class WontFit(LauncherError):
    """The memory estimate says no setting of the server fits its GPUs (weights alone exceed
    them, or the KV pool would fall below the minimum); nothing was launched. ``servers``
    names them. `launcher up --force` launches anyway."""

    def __init__(self, message: str, *, servers: list[str], remedy: str = "") -> None:
        super().__init__(message, remedy=remedy)
        self.servers = servers


class StateError(LauncherError):
    """The local state directory or attempt ledger cannot be used."""


class LeaseLost(LauncherException):
    """This launcher no longer holds the coordination lease (``[coordination]``,
    docs/ha.md): every action on a host is refused from now on, and ``up`` ends (exit 6) so
    that systemd starts it again as a standby. ``token`` is the lease's fencing token that
    was lost (None when none was ever held)."""

    def __init__(self, message: str, *, token: int | None = None, remedy: str = "") -> None:
        self.token = token
        super().__init__(message, remedy=remedy or (
            "another launcher is (or is about to become) the active one; this one stands "
            "by once restarted (systemd restarts it on exit 6)"))


class FencedOut(LeaseLost):
    """A host refused an action because it has seen a higher fencing token than this
    launcher's: a newer active launcher acted there. ``host`` names it."""

    def __init__(self, message: str, *, host: str, token: int | None) -> None:
        self.host = host
        super().__init__(message, token=token)


def lease_lost_in(exc: BaseException) -> LeaseLost | None:
    """The LeaseLost ``exc`` is, or the first one a task group wrapped in it (at any depth)."""
    if isinstance(exc, LeaseLost):
        return exc
    if isinstance(exc, BaseExceptionGroup):
        for inner in exc.exceptions:
            found = lease_lost_in(inner)
            if found is not None:
                return found
    return None


def reraise_lease_lost(exc: BaseException) -> None:
    """Raise the LeaseLost ``exc`` is or holds (``lease_lost_in``), itself; return when there
    is none. A handler that catches broadly (``Exception``, around a task group) calls it
    first, so that a lost lease is never taken for a failure (docs/ha.md)."""
    lost = lease_lost_in(exc)
    if lost is not None:
        raise lost


class IllegalTransition(LauncherError):
    """The start-up state machine got an event that cannot happen in its current state."""


TRACEBACK_MAX = 8000  # characters of an internal error's traceback kept (its end)


def describe_exception(exc: BaseException) -> str:
    """``Type: message`` of ``exc``, or of the one exception a task group wrapped in it;
    at most 500 characters."""
    while isinstance(exc, BaseExceptionGroup) and len(exc.exceptions) == 1:
        exc = exc.exceptions[0]
    return f"{type(exc).__name__}: {exc}"[:500]


def format_traceback(exc: BaseException) -> str:
    """The end (TRACEBACK_MAX characters) of ``exc``'s formatted traceback."""
    return "".join(traceback.format_exception(exc))[-TRACEBACK_MAX:]
