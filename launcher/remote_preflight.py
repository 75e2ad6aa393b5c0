"""The checks before a launch on a host: is the port free, does the model path exist, which
sglang version would the server's command run. Each is one short command over the same
transport and ``sh`` conventions as the run protocol (``remote``); the supervisor, ``ranks``
and ``launcher check`` call them through ``remote``, which re-exports them.
"""

from __future__ import annotations

import re
import shlex
from collections.abc import Sequence

from launcher.errors import ConfigError, RemoteCommandError
from launcher.remote_shell import _PRELUDE, _fail, _sh
from launcher.sglang.versions import DEFAULT_VERSION, MAX_COMPONENT_DIGITS
from launcher.transport.base import Transport

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


# $1 port, $2 the python probe. Prints 1 when something holds the port, else 0.
_PORT = r"""
if command -v python3 > /dev/null 2>&1; then exec python3 -c "$2" "$1"; fi
if ss -ltnH "sport = :$1" | grep -q .; then echo 1; else echo 0; fi
"""


_PATH_EXISTS = _PRELUDE + r"""
expand "$1"; test -e "$x"
"""


_VERSION_PY = "import importlib.metadata as m; print(m.version('sglang'))"
_SIM_MODULE = "launcher.sim.server"


async def port_in_use(transport: Transport, port: int) -> bool:
    """Whether something on the host holds TCP ``port`` (on 127.0.0.1 or 0.0.0.0)."""
    result = await transport.run(_sh(_PORT, str(port), _PORT_PY))
    _fail(transport, "port check", result)
    return result.stdout.strip() == b"1"


async def path_exists(transport: Transport, path: str) -> bool:
    """Whether ``path`` (``~`` expanded on the host) exists there."""
    result = await transport.run(_sh(_PATH_EXISTS, path))
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
        argv = _sh('printf %s "${SGLANG_SIM_VERSION-}"')
        result = await transport.run(argv)
        version = result.stdout.decode("utf-8", "replace").strip() or DEFAULT_VERSION
    else:
        argv = version_probe_argv(command)
        result = await transport.run(argv, timeout=60.0)
        _fail(transport, "sglang version probe", result, remedy=_VERSION_REMEDY)
        version = result.stdout.decode("utf-8", "replace").strip()
    if not _plausible_version(version):
        raise RemoteCommandError(
            f"sglang version probe on {transport.host_name} printed {version[:200]!r}",
            host=transport.host_name, command=shlex.join(argv), exit_status=0,
            stderr=result.stderr[-2000:].decode("utf-8", "replace"), remedy=_VERSION_REMEDY,
        )
    return version
