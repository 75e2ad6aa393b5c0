"""The checks before a launch on a host: are the GPUs free, is the port free, does the model
path exist, which sglang version would the server's command run. Each is one short command over
the same transport and ``sh`` conventions as the run protocol (``launcher.host.run``).

:func:`check` is the one preflight of a host: the supervisor, the multi-node supervisor (once
per node) and ``launcher check`` all call it. It returns typed :class:`Problem` values; each
knows whether it may pass with time (``transient``: busy GPUs, the supervisor waits) or is
fatal (a missing GPU or model path, a taken port: the supervisor gives up).
"""

from __future__ import annotations

import contextlib
import enum
import json
import re
import shlex
from collections.abc import Awaitable, Callable, Mapping, Sequence
from dataclasses import dataclass, replace
from typing import Any

from launcher.errors import ConfigError, RemoteCommandError
from launcher.host.gpus import gpu_findings
from launcher.host.shell import PRELUDE, fail, sh
from launcher.host.transport.base import Transport
from launcher.sglang.versions import DEFAULT_VERSION, MAX_COMPONENT_DIGITS

_VERSION_REMEDY = "set sglang_version in the config"

_PORT_PY = """
import errno, socket, sys
port = int(sys.argv[1])
busy = False
for host in ("127.0.0.1", "0.0.0.0"):
    s = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    try:
        s.bind((host, port))
    except OSError as e:
        busy = busy or e.errno == errno.EADDRINUSE
    finally:
        s.close()
print(1 if busy else 0)
"""


# $1 port, $2 the python probe (_PORT_PY or _HOLDER_PY), which prints the answer. Without
# python3, ``ss -ltnp``: "0" when nothing listens on the port, else "1 MY_UID PID UID" with "-"
# for what this user may not see (the pid of another user's socket).
_PORT = r"""
if command -v python3 > /dev/null 2>&1; then exec python3 -I -c "$2" "$1"; fi
l=$(ss -ltnpH "sport = :$1" | head -n 1)
if [ -z "$l" ]; then echo 0; exit 0; fi
p=$(printf '%s\n' "$l" | sed -n 's/.*pid=\([0-9][0-9]*\).*/\1/p')
u=
if [ -n "$p" ]; then u=$(stat -c %u "/proc/$p" 2>/dev/null); fi
echo "1 $(id -u) ${p:--} ${u:--}"
"""


# The port check of _PORT_PY, then who holds the port: the owner uid of its listening socket
# (/proc/net/tcp{,6}, readable by every user), the pid whose descriptor is that socket (its
# /proc/PID/fd, readable for the same user or root only), and that pid's comm. One JSON line:
# {"busy": false} or {"busy": true, "me": UID, "uid": ..., "user": ..., "pid": ..., ...}.
_HOLDER_PY = _PORT_PY.replace("print(1 if busy else 0)", r"""
import json, os, pwd
if not busy:
    print(json.dumps({"busy": False}))
    sys.exit(0)
out = {"busy": True, "me": os.getuid()}
owners = []
for table in ("/proc/net/tcp", "/proc/net/tcp6"):
    try:
        with open(table) as f:
            for line in f.readlines()[1:]:
                w = line.split()
                if len(w) > 9 and w[3] == "0A" and int(w[1].rpartition(":")[2], 16) == port:
                    owners.append((int(w[7]), w[9]))
    except (OSError, ValueError):
        pass
# Another user's socket first: that is the one to name.
owners.sort(key=lambda o: o[0] == out["me"])
if owners:
    uid, inode = owners[0]
    out["uid"] = uid
    try:
        out["user"] = pwd.getpwuid(uid).pw_name
    except KeyError:
        pass
    target = "socket:[%s]" % inode
    for pid in os.listdir("/proc"):
        if "pid" in out:
            break
        if not pid.isdigit():
            continue
        try:
            if os.stat("/proc/" + pid).st_uid != uid:
                continue
            fds = os.listdir("/proc/%s/fd" % pid)
        except OSError:
            continue
        for fd in fds:
            try:
                if os.readlink("/proc/%s/fd/%s" % (pid, fd)) == target:
                    out["pid"] = int(pid)
                    with open("/proc/%s/comm" % pid) as f:
                        out["command"] = f.read(64).strip()
                    break
            except OSError:
                continue
print(json.dumps(out))
""")


@dataclass(frozen=True)
class PortHolder:
    """Who holds a TCP port on a host, as far as the host lets launcher's user read it.

    ``uid`` (and ``user``) from the listening socket's entry in /proc/net/tcp, which every
    user may read; ``pid`` (and ``command``) only where that process's descriptors are
    readable (the same user, or root); None for what could not be read (a socket that is
    bound but not listening has no entry at all). ``ours``: the holder runs as the user
    launcher runs its commands as on that host.
    """

    uid: int | None = None
    user: str | None = None
    pid: int | None = None
    command: str | None = None
    ours: bool = False

    def describe(self) -> str:
        """``uid 65534 (nobody), pid 4242 (python3)``; what is unknown said so."""
        if self.uid is None:
            who = "an unknown user (no listening socket in /proc/net/tcp)"
        else:
            who = f"uid {self.uid}" + (f" ({self.user})" if self.user else "")
        if self.pid is None:
            return f"{who}, pid not readable"
        return f"{who}, pid {self.pid}" + (f" ({self.command})" if self.command else "")


def _int_or_none(value: Any) -> int | None:
    if isinstance(value, int) and not isinstance(value, bool) and 0 <= value < 2**32:
        return value
    return None


def _str_or_none(value: Any) -> str | None:
    return value[:64] if isinstance(value, str) and value else None


async def port_holder(transport: Transport, port: int) -> PortHolder | None:
    """None when TCP ``port`` is free on the host (127.0.0.1 and 0.0.0.0, as ``port_in_use``
    checks it), else who holds it (``PortHolder``; its fields are the host's, bounded).

    Error handling: RemoteCommandError when the check fails or answers something else than
    its one JSON line.
    """
    result = await transport.run(sh(_PORT, str(port), _HOLDER_PY))
    fail(transport, "port check", result)
    text = result.stdout.decode("utf-8", "replace").strip()
    answer: Any = None
    with contextlib.suppress(ValueError):
        if text.startswith("{"):
            answer = json.loads(text)
        elif text == "0" or text.startswith("1 "):  # the ss fallback
            words = [int(w) if w.isdigit() else None for w in text.split()]
            answer = {"busy": words[0] == 1,
                      **dict(zip(("me", "pid", "uid"), words[1:4], strict=False))}
    if not isinstance(answer, dict):
        raise RemoteCommandError(
            f"port check on {transport.host_name} printed {text[:200]!r}",
            host=transport.host_name, command="port check", exit_status=0,
            stderr=result.stderr[-2000:].decode("utf-8", "replace"),
        )
    if answer.get("busy") is not True:
        return None
    uid = _int_or_none(answer.get("uid"))
    me = _int_or_none(answer.get("me"))
    return PortHolder(uid=uid, user=_str_or_none(answer.get("user")),
                      pid=_int_or_none(answer.get("pid")),
                      command=_str_or_none(answer.get("command")),
                      ours=uid is not None and uid == me)


_PATH_EXISTS = PRELUDE + r"""
expand "$1"; test -e "$x"
"""


_PROGRAM_FOUND = r"""
case $1 in
  */*) test -f "$1" && test -x "$1" ;;
  *) command -v "$1" > /dev/null 2>&1 ;;
esac
"""


_VERSION_PY = "import importlib.metadata as m; print(m.version('sglang'))"
_SIM_MODULE = "launcher.sim.server"


async def port_in_use(transport: Transport, port: int) -> bool:
    """Whether something on the host holds TCP ``port`` (on 127.0.0.1 or 0.0.0.0)."""
    result = await transport.run(sh(_PORT, str(port), _PORT_PY))
    fail(transport, "port check", result)
    return result.stdout.split()[:1] == [b"1"]


async def path_exists(transport: Transport, path: str) -> bool:
    """Whether ``path`` (``~`` expanded on the host) exists there."""
    result = await transport.run(sh(_PATH_EXISTS, path))
    return result.ok


async def program_found(transport: Transport, program: str,
                        env: Mapping[str, str] | None = None) -> bool:
    """Whether ``program`` (a path, or a name looked up on ``PATH``, with ``env`` applied as
    the launch applies it) names an executable on the host (``command -v``)."""
    result = await transport.run(sh(_PROGRAM_FOUND, program), env=env or None)
    return result.ok


def version_probe_argv(command: Sequence[str]) -> list[str]:
    """The argv printing the sglang version with the interpreter ``command`` would use.

    ``[prefix..., python, "-m", "sglang..."]`` keeps the prefix and the python (so ``docker
    exec c python3 -m ...`` probes inside the container); a ``sglang`` console script is
    replaced by the ``python3`` beside it (or on PATH). Nothing but importlib.metadata is
    imported, so torch is never loaded.
    """
    for i, arg in enumerate(command[:-1]):
        if arg == "-m" and command[i + 1].split(".")[0] == "sglang" and i > 0:
            return [*command[:i], "-c", _VERSION_PY]
    for i, arg in enumerate(command):
        directory, _, name = arg.rpartition("/")
        if name == "sglang":
            python = f"{directory}/python3" if directory else "python3"
            return [*command[:i], python, "-c", _VERSION_PY]
    if command and command[0].rpartition("/")[2].startswith("python"):
        return [command[0], "-c", _VERSION_PY]
    raise ConfigError([
        f"cannot tell which python runs {shlex.join(command)!r}; {_VERSION_REMEDY}",
    ])


def _plausible_version(version: str) -> bool:
    """A PEP 440-ish version of at most 64 characters whose dotted numeric components have
    at most MAX_COMPONENT_DIGITS digits each (``versions.version_tuple`` reads them)."""
    if len(version) > 64 or not re.fullmatch(r"[0-9][0-9A-Za-z.+!-]*", version):
        return False
    return all(len(piece) <= MAX_COMPONENT_DIGITS for piece in version.split(".")
               if piece.isdigit())


async def detect_sglang_version(transport: Transport, command: list[str]) -> str:
    """The sglang version installed where ``command`` would run.

    For the simulator (``launcher.sim.server`` in the command) this is the host's
    SGLANG_SIM_VERSION, or 0.5.23. Error handling: RemoteCommandError (with the stderr tail
    and the remedy) when the probe fails or prints something that is not a version.
    """
    if any(_SIM_MODULE in arg for arg in command):
        argv = sh('printf %s "${SGLANG_SIM_VERSION-}"')
        result = await transport.run(argv)
        version = result.stdout.decode("utf-8", "replace").strip() or DEFAULT_VERSION
    else:
        argv = version_probe_argv(command)
        result = await transport.run(argv, timeout=60.0)
        fail(transport, "sglang version probe", result, remedy=_VERSION_REMEDY)
        version = result.stdout.decode("utf-8", "replace").strip()
    if not _plausible_version(version):
        raise RemoteCommandError(
            f"sglang version probe on {transport.host_name} printed {version[:200]!r}",
            host=transport.host_name, command=shlex.join(argv), exit_status=0,
            stderr=result.stderr[-2000:].decode("utf-8", "replace"), remedy=_VERSION_REMEDY,
        )
    return version


# --- the one preflight ---------------------------------------------------------------------


class ProblemKind(enum.Enum):
    """What a preflight problem is about; ``transient`` says whether it may pass with time."""

    GPU_BUSY = "gpu_busy"  # a wanted GPU holds memory or a foreign process: wait
    GPU_MISSING = "gpu_missing"  # the host has no such GPU: fatal
    MODEL_MISSING = "model_missing"  # an absolute model path that does not exist: fatal
    PORT_TAKEN = "port_taken"  # the server's port is held (after any wait for it): fatal
    DIST_PORT_BUSY = "dist_port_busy"  # torch's store of an earlier attempt: wait
    HOST_UNAVAILABLE = "host_unavailable"  # the host cannot be asked right now: wait
    CHECK_FAILED = "check_failed"  # a check failed otherwise: fatal

    @property
    def transient(self) -> bool:
        """Whether this kind of problem may pass with time (the supervisor waits for it)."""
        return self in _TRANSIENT


_TRANSIENT = frozenset({
    ProblemKind.GPU_BUSY, ProblemKind.DIST_PORT_BUSY, ProblemKind.HOST_UNAVAILABLE,
})


@dataclass(frozen=True)
class Problem:
    """One reason a launch cannot start now: its ``kind``, the ``message`` a user reads and,
    where there is one, the ``remedy``. ``str()`` is the message, then ``fix: remedy`` on its
    own line (as ``LauncherError`` prints)."""

    kind: ProblemKind
    message: str
    remedy: str = ""

    @property
    def transient(self) -> bool:
        """Whether it may pass with time (``ProblemKind.transient``)."""
        return self.kind.transient

    def on(self, host: str) -> Problem:
        """This problem with ``host: `` before its message (a node of a multi-node server)."""
        return replace(self, message=f"{host}: {self.message}")

    def __str__(self) -> str:
        return f"{self.message}\n  fix: {self.remedy}" if self.remedy else self.message


@dataclass(frozen=True)
class Target:
    """What a launch needs of one host: ``gpus`` free (none: not checked), ``model_path``
    present when it is absolute (None: not checked), ``port`` free (None: not checked).
    ``server`` names the server in remedies."""

    host: str
    nvidia_smi: Sequence[str]
    server: str = ""
    gpus: Sequence[int] = ()
    model_path: str | None = None
    port: int | None = None


PortCheck = Callable[[Transport, str, int], Awaitable[Problem | None]]
"""``(transport, host, port)`` → None once the port is free, else its ``PORT_TAKEN`` problem.
The supervisor's waits for a taken port; :func:`port_taken` asks once."""


def port_problem(host: str, port: int, holder: PortHolder) -> Problem:
    """The ``PORT_TAKEN`` problem of ``port`` on ``host``, naming its holder."""
    return Problem(ProblemKind.PORT_TAKEN,
                   f"port {port} is already in use on {host} ({holder.describe()})")


async def port_taken(transport: Transport, host: str, port: int) -> Problem | None:
    """The default ``PortCheck``: asks once (``port_holder``)."""
    holder = await port_holder(transport, port)
    return None if holder is None else port_problem(host, port, holder)


async def check(transport: Transport, target: Target, *,
                port_check: PortCheck = port_taken) -> list[Problem]:
    """Every problem of ``target`` on its host, the fatal ones first; empty when a launch may
    start. The GPUs are asked first: a GPU the host does not have ends the check with one
    ``GPU_MISSING`` problem naming every missing GPU (nothing else is worth asking). Then the
    model path, then the port through ``port_check``.

    Error handling: a check that cannot be made raises its ``LauncherError`` (the caller
    retries what ``is_transient``); problems are returned, never raised.
    """
    busy: list[Problem] = []
    if target.gpus:
        found = await gpu_findings(transport, target.nvidia_smi, target.gpus)
        missing = [f.text for f in found if f.missing]
        if missing:
            return [Problem(ProblemKind.GPU_MISSING, "; ".join(missing),
                            remedy=f"fix the gpus of server {target.server}")]
        busy = [Problem(ProblemKind.GPU_BUSY, f.text) for f in found]
    fatal: list[Problem] = []
    path = target.model_path
    if path is not None and path.startswith("/") and not await path_exists(transport, path):
        fatal.append(Problem(ProblemKind.MODEL_MISSING,
                             f"model path {path} does not exist on {target.host}"))
    if target.port is not None:
        taken = await port_check(transport, target.host, target.port)
        if taken is not None:
            fatal.append(taken)
    return fatal + busy
