"""Running one server attempt detached on a host: launch, follow, probe, stop, adopt.

One protocol for every transport: it only uses ``Transport.run`` and ``Transport.stream`` with
POSIX ``sh`` scripts whose inputs travel as positional arguments (never interpolated), so the
SSH and local transports behave alike.

Each attempt owns a run directory ``<run_dir>/<server>/<attempt>/`` on the host, made 0700
(``run_dir`` and ``<server>`` too when launch creates them). Every script that reads from or
signals through a run directory first checks it (``remote_shell``'s ``safe``): ``run_dir``,
the server and attempt directories must be the login user's own, not symlinks and not
writable by group or others, and every directory above them up to / owned by root or the
login user and not writable by others unless sticky and root's (like /tmp). Otherwise the
script refuses (RemoteCommandError naming the path and the fix): whoever could rename a
directory on the way could swap the files the server's shell sources, or plant a forged
``pid`` with a matching ``pid_start`` (which guards against pid reuse, not against forgery)
and a ``log`` symlink to a file only root may read::

    cmd          the server's command line, shell-quoted (for humans)
    env          mode 0600, ``export K='v'`` lines (written via stdin); the server's shell
                 sources and removes it before it writes ``pid``, so it never outlives launch
    log          stdout + stderr of the server
    pid_start    "<boot id> <start time>" of the server process (guards against pid reuse)
    pid          the server's pid, which is also its process-group and session id
    exit_status  written atomically by the wrapper shell once the server has exited:
                 the exit code, or 128+N when killed by signal N
    started_at   UTC ISO-8601 time of the launch
    fenced       (only when refused) the shim saw a newer lease's token: the server never ran

With ``[coordination]`` (docs/ha.md) the server directory also holds ``fence/``: one empty
file per fencing token an active launcher used there, named by the token. A launch, a
listing (adoption) and a stop by a launcher with a token first add its file; the launch
script, the shim (right before it takes the claim) and the stop refuse, exit FENCED_STATUS,
when a higher token's file is there. Files only ever get added, so "the highest token seen"
needs no lock and can never go back.

Process layout: ``launch``'s shell starts a *wrapper* shell in a new session; the wrapper starts
the server in another new session (so pid == pgid == sid), waits for it and writes
``exit_status``. Both have stdin from /dev/null and no terminal, so neither launcher's death nor
an SSH drop reaches them. Stopping signals the server's group and session, never the wrapper.

The checks before a launch (port free, path exists, sglang version) live in
``launcher.host.preflight``, the shared ``sh`` plumbing in ``launcher.host.shell``.
"""

from __future__ import annotations

import math
import re
import secrets
import shlex
from collections.abc import AsyncGenerator, AsyncIterator, Collection
from dataclasses import dataclass, field

import anyio
import structlog

from launcher.errors import (
    ConfigError,
    FencedOut,
    HostUnreachable,
    LogFormatError,
    RemoteCommandError,
    StateError,
)
from launcher.host.shell import PRELUDE, fail, sh
from launcher.host.transport.base import CommandResult, Transport
from launcher.host.transport.fenced import fence_of
from launcher.sglang.flags import PARAMS_ENV
from launcher.untrusted import bounded_float, bounded_int

log = structlog.get_logger(__name__)

# How often the remote follower (GNU tail --pid) checks that the server lives. In practice it
# notices at once: the wrapper's rename of exit_status wakes tail's inotify watch on the dir.
FOLLOW_POLL_S = 0.2
_EXIT_STATUS_WAIT_S = 2.0  # the wrapper writes exit_status right after reaping the server
_STOP_POLL_S = 0.1
_PID_WAIT_TICKS = 200  # launch waits 200 × 50 ms for the server's pid file
_EXISTS_STATUS = 17  # launch script: the attempt directory already exists
_WRITE_FAILED_STATUS = 28  # launch script: a file or directory in the run dir not writable
FENCED_STATUS = 29  # launch, listing or stop script: the host saw a newer lease's token
SHIM_FENCED_STATUS = 122  # the shim's exit (the attempt's exit_status) when it was fenced out
_ENV_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]*\Z")
# Starts the trailer of a follow stream (plus a random token per stream). \x01: a byte no
# log chunk ends with in practice, so holding back a possible marker start delays nothing.
_END_MARK = b"\x01launcher-follow-end-"
READ_CHUNK = 8 << 20  # log bytes read per command (below the transports' MAX_OUTPUT)


# ``newer SERVER_DIR TOKEN``: whether a token above TOKEN was seen there (see the module's
# docstring); ``mark SERVER_DIR TOKEN`` records TOKEN. Both do nothing without a token.
_FENCE = r"""
newer() {
  [ -n "$2" ] || return 1
  for f in "$1/fence"/*; do
    n=${f##*/}
    case $n in ''|*[!0-9]*) continue ;; esac
    [ "$n" -gt "$2" ] && return 0
  done
  return 1
}
mark() {
  [ -n "$2" ] || return 0
  (umask 077 && mkdir -p "$1/fence" && : > "$1/fence/$2")
}
"""

# $1 dir, $2 the fencing token (empty: none), $3 cwd, rest: the server's argv. Becomes the
# server by exec. Its variables have odd
# names because the env file is sourced in the same shell.
_SHIM = r"""
ident() {
  [ -r "/proc/$1/stat" ] || return 1
  read -r l < "/proc/$1/stat" || return 1
  set -- ${l##*) }; shift 19
  printf '%s %s' "$(cat /proc/sys/kernel/random/boot_id 2>/dev/null)" "$1"
}
_launcher_dir=$1; _launcher_tok=$2; _launcher_cwd=$3; shift 3
# A launcher that lost its lease must not start a server after a newer one acted here: the
# last check sits right before the claim (docs/ha.md, fencing).
if [ -n "$_launcher_tok" ]; then
  for _launcher_f in "$_launcher_dir/../fence"/*; do
    _launcher_n=${_launcher_f##*/}
    case $_launcher_n in ''|*[!0-9]*) continue ;; esac
    if [ "$_launcher_n" -gt "$_launcher_tok" ]; then
      : > "$_launcher_dir/fenced"; rm -f "$_launcher_dir/env"; exit 122
    fi
  done
fi
# Whoever makes "claim" first decides: this shim (the server starts) or a launcher that gave
# up on the launch (the server never starts, so no unsupervised copy can appear later).
# The env file (secrets too) goes with a lost claim: nobody else would ever remove it.
mkdir "$_launcher_dir/claim" 2> /dev/null || { rm -f "$_launcher_dir/env"; exit 125; }
if ident $$ > "$_launcher_dir/pid_start.tmp"; then
  mv -f "$_launcher_dir/pid_start.tmp" "$_launcher_dir/pid_start"
fi
. "$_launcher_dir/env"; _launcher_st=$?
rm -f "$_launcher_dir/env"
printf '%s\n' $$ > "$_launcher_dir/pid.tmp" && mv -f "$_launcher_dir/pid.tmp" "$_launcher_dir/pid" \
  || exit 126
[ "$_launcher_st" = 0 ] || exit 126
if [ -n "$_launcher_cwd" ]; then cd "$_launcher_cwd" || exit 126; fi
exec "$@"
"""

# $1 dir, $2 shim, rest: passed on to the shim. Waits for the server and records its status.
_WRAPPER = r"""
d=$1; shim=$2; shift 2
setsid sh -c "$shim" sh "$d" "$@" < /dev/null >> "$d/log" 2>&1 &
wait $!
st=$?
printf '%s\n' "$st" > "$d/exit_status.tmp" && mv -f "$d/exit_status.tmp" "$d/exit_status"
"""

# $1 run_dir, $2 server, $3 attempt, $4 cwd, $5 human command line, $6 wrapper, $7 shim,
# $8 the fencing token (empty: none), rest: the server's argv. stdin: the env file.
# Prints "<pid>\n--\n<absolute dir>".
# Without a configured cwd the server starts in $HOME (where an SSH login starts, so a
# relative path means the same on both transports), else in its attempt directory: never in
# whatever directory launcher was started from, where another user may have planted modules
# that ``python3 -m`` would import (docs/security.md, finding M6).
# The pid wait: $PID_TICKS ticks of 50 ms, then the launch takes the claim (see the shim) so
# that the server never starts; if the shim took it first, $PID_LIMIT ticks in all.
_LAUNCH = PRELUDE + _FENCE + r"""
set -u
command -v setsid > /dev/null || { echo "setsid not found on this host" >&2; exit 127; }
w() { printf 'cannot write %s\n' "$1" >&2; exit $WRITE_FAILED; }
expand "$1"; base=$x
(umask 077 && mkdir -p "$base/$2") || w "$base/$2"
for p in "${base%/}" "$base/$2"; do
  if [ -L "$p" ]; then unsafe "$p" "a symlink (point run_dir at the real directory)"; exit 13; fi
done
d=$(cd "$base/$2" && pwd -P) || exit 1
safe "$d" 2 || exit 13
if newer "$d" "$8"; then echo "fenced: $d saw a newer lease token than $8" >&2; exit 29; fi
mark "$d" "$8" || w "$d/fence"
d=$d/$3
if [ -e "$d" ]; then echo "attempt directory exists: $d" >&2; exit 17; fi
(umask 077 && mkdir "$d") || w "$d"
(umask 077 && cat > "$d/env") || w "$d/env"
(umask 077 && printf '%s\n' "$5" > "$d/cmd") || w "$d/cmd"
(umask 077 && : > "$d/log") || w "$d/log"
(umask 077 && date -u +%Y-%m-%dT%H:%M:%SZ > "$d/started_at") || w "$d/started_at"
cwd=$4; wrapper=$6; shim=$7; tok=$8; shift 8
if [ -n "$cwd" ]; then
  expand "$cwd"; cwd=$x
elif [ -n "${HOME-}" ] && [ -d "$HOME" ]; then
  cwd=$HOME
else
  cwd=$d
fi
cd "$d" || exit 1
setsid sh -c "$wrapper" sh "$d" "$shim" "$tok" "$cwd" "$@" < /dev/null > /dev/null 2>&1 &
i=0
while [ ! -s "$d/pid" ]; do
  i=$((i + 1))
  if [ -e "$d/fenced" ]; then echo "fenced: the server saw a newer lease token" >&2; exit 29; fi
  if [ "$i" -eq $PID_TICKS ] && mkdir "$d/claim" 2> /dev/null; then
    rm -f "$d/env"
    echo "server wrote no pid file in $d; it will not start" >&2; exit 3
  fi
  if [ "$i" -gt $PID_LIMIT ]; then echo "server wrote no pid file in $d" >&2; exit 3; fi
  sleep 0.05
done
printf '%s\n--\n%s' "$(cat "$d/pid")" "$d"
""".replace("$PID_TICKS", str(_PID_WAIT_TICKS)).replace(
    "$PID_LIMIT", str(_PID_WAIT_TICKS + 40)).replace("$WRITE_FAILED", "28")

# $1 run_dir, $2 server, $3 attempt. After a launch whose reply was lost: prints "absent" when
# the attempt directory was never made (the launch never ran), "nopid" when no pid appeared in
# it within the launch's own wait, else what the launch prints.
_RECOVER = PRELUDE + r"""
expand "$1"
[ -d "$x/$2/$3" ] || { echo absent; exit 0; }
for p in "${x%/}" "$x/$2" "$x/$2/$3"; do
  if [ -L "$p" ]; then unsafe "$p" "a symlink (point run_dir at the real directory)"; exit 13; fi
done
d=$(cd "$x/$2" && pwd -P) || exit 1
safe "$d" 2 || exit 13
d=$d/$3
safe "$d" 3 || exit 13
i=0
while [ ! -s "$d/pid" ]; do
  i=$((i + 1))
  if [ "$i" -eq $PID_TICKS ] && mkdir "$d/claim" 2> /dev/null; then
    rm -f "$d/env"; echo nopid; exit 0
  fi
  if [ "$i" -gt $PID_LIMIT ]; then echo nopid; exit 0; fi
  sleep 0.05
done
printf '%s\n--\n%s' "$(cat "$d/pid")" "$d"
""".replace("$PID_TICKS", str(_PID_WAIT_TICKS)).replace("$PID_LIMIT", str(_PID_WAIT_TICKS + 40))

# $1 dir. Prints "<alive 0|1> <exit status or -> <log size>".
_PROBE = PRELUDE + r"""
d=$1
safe "$d" 3 || exit 13
if alive "$d"; then a=1; else a=0; fi
st=$(cat "$d/exit_status" 2>/dev/null) || st=
size=$(wc -c 2> /dev/null < "$d/log") || size=0
printf '%s %s %s\n' "$a" "${st:--}" $size
"""

# $1 dir, $2 ticks of 50 ms. Prints the exit status once it exists, or nothing.
_EXIT_STATUS = PRELUDE + r"""
safe "$1" 3 || exit 13
i=0
while [ ! -e "$1/exit_status" ] && [ "$i" -lt "$2" ]; do sleep 0.05; i=$((i + 1)); done
cat "$1/exit_status" 2>/dev/null
exit 0
"""

# $1 dir. Prints the pids left in the server's process group or session (zombies excluded),
# or nothing when the recorded pid now belongs to someone else.
_MEMBERS = PRELUDE + r"""
safe "$1" 3 || exit 13
p=$(cat "$1/pid" 2>/dev/null) || exit 0
[ -n "$p" ] && ours "$1" "$p" || exit 0
members "$p"
"""

# $1 dir, $2 signal name, $3 the fencing token (empty: none). Signals the group, then the
# session's members outside the group
# (each process gets the signal once: a second SIGTERM can hit Python after it has restored
# the default handler on its way out, turning a clean exit into 143).
_SIGNAL = PRELUDE + _FENCE + r"""
safe "$1" 3 || exit 13
if newer "${1%/*}" "${3-}"; then echo "fenced: a newer token than $3 acted here" >&2; exit 29; fi
p=$(cat "$1/pid" 2>/dev/null) || exit 0
[ -n "$p" ] && ours "$1" "$p" || exit 0
[ -n "$(members "$p")" ] || exit 0
kill -s "$2" -- "-$p" 2>/dev/null
for q in $(strays "$p"); do kill -s "$2" "$q" 2>/dev/null; done
# A stopped (SIGSTOPped, hung) server only acts on SIGTERM once continued.
[ "$2" = TERM ] && kill -s CONT -- "-$p" 2>/dev/null
echo sent
"""

# $1 run_dir, $2 server, $3 "claim" when adopting, $4 the fencing token (empty: none: else
# it is recorded first, and a newer one refuses, FENCED_STATUS). Prints
# "<attempt> <alive 0|1> <pid or ->" lines, "@@", the absolute server directory (nothing at
# all when it does not exist).
# Adopting, an attempt with neither pid nor exit status is claimed (see the shim): if its shim
# claimed it first, its server is starting and its pid is waited for; else it never starts
# and its env file (secrets too) is removed. The server directory is checked by ``safe`` and
# every attempt directory must be the login user's own and writable by nobody else.
_LIST = PRELUDE + _FENCE + r"""
expand "$1"
[ -d "$x/$2" ] || exit 0
for p in "${x%/}" "$x/$2"; do
  if [ -L "$p" ]; then unsafe "$p" "a symlink (point run_dir at the real directory)"; exit 13; fi
done
cd "$x/$2" || exit 1
safe "$(pwd -P)" 2 || exit 13
if newer . "${4-}"; then echo "fenced: a newer lease token than $4 acted here" >&2; exit 29; fi
mark . "${4-}" || { echo "cannot write $PWD/fence" >&2; exit 1; }
bad=$(find . -mindepth 1 -maxdepth 1 -name '[0-9]*' \( -type l -o -type d \( ! -user "$(id -u)" \
  -o -perm -020 -o -perm -002 \) \) -print) || exit 1
if [ -n "$bad" ]; then
  unsafe "$PWD/${bad#./}" "not a directory of $(id -un)'s own (remove it, or chmod go-w it)"
  exit 13
fi
for a in *; do
  case $a in ''|*[!0-9]*) continue ;; esac
  [ -d "$a" ] || continue
  plain "$PWD/$a" || exit 13
  p=$(cat "$a/pid" 2>/dev/null) || p=
  if [ -z "$p" ] && [ "${3-}" = claim ] && [ ! -e "$a/exit_status" ]; then
    if mkdir "$a/claim" 2> /dev/null; then
      rm -f "$a/env"  # ours: its server never starts, and nobody else would remove it
    else
      i=0
      while [ ! -s "$a/pid" ] && [ "$i" -lt 100 ]; do sleep 0.05; i=$((i + 1)); done
      p=$(cat "$a/pid" 2>/dev/null) || p=
    fi
  fi
  case $p in *[!0-9]*) p='?' ;; esac
  if alive "$PWD/$a"; then l=1; else l=0; fi
  printf '%s %s %s\n' "$a" "$l" "${p:--}"
done
printf '@@\n%s' "$(pwd -P)"
"""

# $1 dir, $2 log offset + 1, $3 server pid, $4 poll seconds, $5 ticks of 50 ms, $6 end marker.
# The remote follower: the log from the offset while the server lives (GNU tail --pid), then,
# in the same stream so that noticing a death costs no further round trip, the marker and
# "<alive 0|1> <exit status or -> <log size>" (waiting up to the ticks for the exit status).
_FOLLOW = PRELUDE + r"""
safe "$1" 3 || exit 13
tail -c "+$2" -F --pid="$3" -s "$4" "$1/log"
end=$(settled "$1" "$5")
size=$(wc -c 2> /dev/null < "$1/log") || size=0
printf '%s%s %s\n' "$6" "$end" $size
"""

# $1 dir, $2 log offset + 1, $3 ticks of 50 ms, $4 max bytes. What follow needs when its
# follower died without a trailer, in one round trip: "<alive 0|1> <exit status or ->" on the
# first line (see the ticks above), then at most $4 bytes of the log from the offset.
_FINISH = PRELUDE + r"""
safe "$1" 3 || exit 13
settled "$1" "$3"
echo
tail -c "+$2" "$1/log" 2>/dev/null | head -c "$4"
exit 0
"""

# $1 dir, $2 log offset + 1, $3 max bytes (empty: all). The log's bytes from the offset.
_READ = PRELUDE + r"""
safe "$1" 3 || exit 13
if [ -n "$3" ]; then tail -c "+$2" "$1/log" | head -c "$3"; else tail -c "+$2" "$1/log"; fi
"""


@dataclass(frozen=True)
class AttemptSpec:
    """Everything needed to start one attempt of one server.

    ``secret_env`` values are treated like ``env`` on the host but are kept out of every log
    line and every process's argv.
    """

    server: str
    attempt: int
    run_dir: str
    argv: list[str]
    env: dict[str, str]
    secret_env: dict[str, str] = field(default_factory=dict)
    cwd: str | None = None


@dataclass(frozen=True)
class RunHandle:
    """A launched attempt: its run directory (absolute on the host) and its server pid."""

    server: str
    attempt: int
    dir: str
    pid: int

    @property
    def log_path(self) -> str:
        return f"{self.dir}/log"


@dataclass(frozen=True)
class LogChunk:
    """Bytes of the log; ``end_offset`` is the log offset just after them (resume from it)."""

    data: bytes
    end_offset: int


@dataclass(frozen=True)
class RunExited:
    """The server has exited: its status (128+N when killed by signal N), or None when nobody
    recorded it (its wrapper shell was killed too, or the host rebooted)."""

    status: int | None


@dataclass(frozen=True)
class RunStatus:
    """A one-off look at an attempt."""

    alive: bool
    exit_status: int | None
    log_size: int


@dataclass(frozen=True)
class StopReport:
    """What ``stop`` did: the signals it sent, in order, and what was left afterwards."""

    signals_sent: list[str]
    exit_status: int | None
    leftover_pids: list[int]


def _number(transport: Transport, where: str, what: str, text: str | bytes) -> int | None:
    """``text`` (read from the file ``what`` of the attempt at ``where``) as an int, or None
    when it is none: a forged or corrupt file is reported as ``remote.attempt_corrupt`` and
    must never stop the supervision, status or stop of anything else."""
    value = text.decode("utf-8", "replace") if isinstance(text, bytes) else text
    value = value.strip()
    number = bounded_int(value)
    if number is not None:
        return number
    log.warning("remote.attempt_corrupt", host=transport.host_name, dir=where, file=what,
                value=value[:80])
    return None
class RunDirUnwritable(RemoteCommandError):
    """The run directory on the host cannot be written (filesystem full, read-only, no
    permission): relaunching cannot help until someone fixes the host."""


def _env_file(spec: AttemptSpec) -> bytes:
    """The ``env`` file: plain then secret values, then the two variables every server needs.

    SGL_FORCE_SHUTDOWN=1 makes SGLang's SIGTERM exit instead of draining requests forever;
    no_proxy keeps the server's warmup request to itself away from any HTTP proxy (the host's
    own no_proxy entries are kept after ours).
    """
    problems = [
        f"servers.{spec.server}.env: {name!r} is not a valid environment variable name"
        for name in (*spec.env, *spec.secret_env)
        if not _ENV_NAME.match(name)
    ]
    if problems:
        raise ConfigError(problems)
    values = {**spec.env, **spec.secret_env, "SGL_FORCE_SHUTDOWN": "1"}
    given_no_proxy = values.pop("no_proxy", "")
    no_proxy = ",".join(p for p in ("127.0.0.1,localhost", given_no_proxy) if p)
    lines = [f"export {name}={shlex.quote(value)}" for name, value in values.items()]
    # Unquoted on purpose: the host's inherited no_proxy is appended when the file is sourced.
    lines.append(f'export no_proxy={shlex.quote(no_proxy)}"${{no_proxy:+,$no_proxy}}"')
    return ("\n".join(lines) + "\n").encode("utf-8", "surrogateescape")


def _token(transport: Transport) -> str:
    """The fencing token the host is shown ("" without coordination)."""
    fence = fence_of(transport)
    return "" if fence is None or fence.token is None else str(fence.token)


def _refuse_fenced(transport: Transport, result: CommandResult, what: str) -> None:
    """FencedOut when the host refused ``what``: it saw a newer lease's token."""
    if result.exit_status == FENCED_STATUS:
        fence = fence_of(transport)
        raise FencedOut(
            f"{what} refused by {transport.host_name}: a launcher with a newer lease acted "
            f"there: {result.stderr[-300:].decode('utf-8', 'replace').strip()}",
            host=transport.host_name, token=None if fence is None else fence.token)


def _check_name(server: str) -> None:
    if not server or server in (".", "..") or "/" in server or "\0" in server:
        raise ConfigError([f"server name {server!r} cannot be used as a directory name"])


async def launch(transport: Transport, spec: AttemptSpec) -> RunHandle:
    """Start ``spec.argv`` detached on the host and return once its pid is recorded.

    Resource handling: the server outlives this call, the transport and launcher itself; only
    ``stop`` ends it. Error handling: StateError if the attempt directory already exists,
    RemoteCommandError if the host could not start it (the server's own failures, such as a
    missing program or a bad cwd, show up later as an exit status and in the log).

    A connection lost while the launch command runs does not lose the server: the attempt
    directory is looked up on a new connection and the server found there is returned; when
    the directory was never made, nothing ran and the launch is sent once more.
    HostUnreachable only when the host cannot be reached again.
    """
    _check_name(spec.server)
    if spec.attempt < 1:
        raise StateError(f"attempt numbers start at 1, got {spec.attempt}")
    if not spec.argv:
        raise ConfigError([f"servers.{spec.server}.command is empty"])
    # The command file shows what ran: the argv, led by the settings a relaunch put in the
    # environment (adoption reads both back; the env file is removed once read, secrets too).
    shown = [f"{name}={spec.env[name]}" for name in PARAMS_ENV if name in spec.env]
    args = [
        spec.run_dir, spec.server, str(spec.attempt), spec.cwd or "",
        shlex.join([*shown, *spec.argv]), _WRAPPER, _SHIM, _token(transport), *spec.argv,
    ]
    stdout = await _launch_once(transport, spec, args)
    if stdout is None:  # the connection was lost before the command reached the host
        stdout = await _launch_once(transport, spec, args)
    if stdout is None:
        raise HostUnreachable(
            f"launch of {spec.server} attempt {spec.attempt} on {transport.host_name} was "
            "cut off twice before it ran", host=transport.host_name,
            remedy="check the host and the network",
        )
    handle = _parse_launched(transport, spec, stdout)
    log.info("remote.launched", host=transport.host_name, server=spec.server,
             attempt=spec.attempt, pid=handle.pid, dir=handle.dir)
    return handle


async def _launch_once(
    transport: Transport, spec: AttemptSpec, args: list[str],
) -> bytes | None:
    """Run the launch script once; its output, or None when its connection was lost before
    it made the attempt directory (nothing ran, so it may be sent again)."""
    try:
        result = await transport.run(sh(_LAUNCH, *args), stdin=_env_file(spec), timeout=60.0)
    except HostUnreachable as exc:
        log.warning("remote.launch_reply_lost", host=transport.host_name, server=spec.server,
                    attempt=spec.attempt, error=str(exc))
        return await _recover_launch(transport, spec)
    _refuse_fenced(transport, result, f"launch of {spec.server}")
    if result.exit_status == _EXISTS_STATUS:
        raise StateError(
            f"attempt {spec.attempt} of {spec.server} already exists on {transport.host_name}",
            remedy="attempt numbers must increase; start from latest_attempt() + 1",
        )
    if result.exit_status == _WRITE_FAILED_STATUS:
        stderr = result.stderr[-2000:].decode("utf-8", "replace")
        path = next((line.removeprefix("cannot write ") for line in stderr.splitlines()
                     if line.startswith("cannot write ")), spec.run_dir)
        reason = next((line for line in stderr.splitlines()
                       if not line.startswith("cannot write ")), "")
        raise RunDirUnwritable(
            f"cannot write {path} on {transport.host_name}" + (f": {reason}" if reason else ""),
            host=transport.host_name, command="launch", exit_status=result.exit_status,
            stderr=stderr,
            remedy=f"free space on the filesystem of {path} on {transport.host_name} "
            "(df -h), or point run_dir at one with room",
        )
    fail(transport, "launch", result)
    return result.stdout


async def _recover_launch(transport: Transport, spec: AttemptSpec) -> bytes | None:
    """What a launch whose reply was lost left on the host: its output as the launch would
    have printed it, or None when the attempt directory does not exist (nothing ran)."""
    result = await transport.run(sh(_RECOVER, spec.run_dir, spec.server, str(spec.attempt)),
                                 timeout=60.0)
    fail(transport, "launch recovery", result)
    if result.stdout == b"absent\n":
        return None
    if result.stdout == b"nopid\n":
        raise RemoteCommandError(
            f"launch of {spec.server} attempt {spec.attempt} on {transport.host_name} was cut "
            "off by a lost connection before the server started",
            host=transport.host_name, command="launch",
            remedy="the attempt directory holds what was written; the next attempt retries",
        )
    return result.stdout


def _parse_launched(transport: Transport, spec: AttemptSpec, stdout: bytes) -> RunHandle:
    pid_text, sep, directory = stdout.decode("utf-8", "surrogateescape").partition("\n--\n")
    pid = bounded_int(pid_text.strip())
    if not sep or pid is None:
        raise LogFormatError(f"launch on {transport.host_name} printed {stdout[:200]!r}")
    return RunHandle(spec.server, spec.attempt, directory, pid)


async def probe(transport: Transport, handle: RunHandle) -> RunStatus:
    """Whether the server still runs, its exit status if recorded, and the log's size."""
    result = await transport.run(sh(_PROBE, handle.dir))
    fail(transport, "probe", result)
    fields = result.stdout.split()
    if len(fields) != 3:
        raise LogFormatError(f"probe on {transport.host_name} printed {result.stdout[:200]!r}")
    alive, status, size = (f.decode("utf-8", "replace") for f in fields)
    return RunStatus(alive == "1",
                     None if status == "-" else _number(transport, handle.dir, "exit_status",
                                                        status),
                     _number(transport, handle.dir, "log size", size) or 0)


async def _exit_status(transport: Transport, handle: RunHandle, wait_s: float) -> int | None:
    ticks = str(math.ceil(wait_s / 0.05))
    result = await transport.run(sh(_EXIT_STATUS, handle.dir, ticks), timeout=wait_s + 30.0)
    text = result.stdout.strip()
    return _number(transport, handle.dir, "exit_status", text) if text else None


async def read_log(
    transport: Transport, handle: RunHandle, offset: int = 0, max_bytes: int | None = None,
) -> bytes:
    """The log's bytes from ``offset`` (at most ``max_bytes`` of them), read READ_CHUNK bytes
    per command (a transport returns at most MAX_OUTPUT per command)."""
    data = bytearray()
    while max_bytes is None or len(data) < max_bytes:
        want = READ_CHUNK if max_bytes is None else min(READ_CHUNK, max_bytes - len(data))
        result = await transport.run(
            sh(_READ, handle.dir, str(offset + len(data) + 1), str(want)))
        fail(transport, "read_log", result)
        data += result.stdout
        if len(result.stdout) < want:
            break
    return bytes(data)


# $1 dir. Prints "<host's time now> <log's mtime>", both in seconds since the epoch: with
# nanoseconds where GNU date can (date -r), else whole seconds from stat.
_LOG_AGE = PRELUDE + r"""
safe "$1" 3 || exit 13
set -- "$1/log"
now=$(date +%s.%N); m=$(date -r "$1" +%s.%N 2>/dev/null) || m=$(stat -c %Y "$1") || exit 1
case $now$m in *N*) now=$(date +%s); m=$(stat -c %Y "$1") || exit 1 ;; esac
printf '%s %s\n' "$now" "$m"
"""


async def log_age(transport: Transport, handle: RunHandle) -> float:
    """Seconds since the log last changed, by the host's own clock (never negative).

    This is what the stall check trusts after the operator box lost sight of the host: the
    log's modification time does not depend on whether we were connected meanwhile.
    Error handling: HostUnreachable from the transport; RemoteCommandError when the log
    cannot be stat'ed; LogFormatError for output that is not two numbers.
    """
    result = await transport.run(sh(_LOG_AGE, handle.dir))
    fail(transport, "log age", result)
    figures = [bounded_float(f.decode("ascii", "replace")) for f in result.stdout.split()]
    if len(figures) != 2 or figures[0] is None or figures[1] is None:
        raise LogFormatError(f"log age on {transport.host_name} printed {result.stdout[:200]!r}")
    return max(0.0, figures[0] - figures[1])


# $1 dir, $2 bytes. The end of the log.
_TAIL = PRELUDE + r"""
safe "$1" 3 || exit 13
tail -c "$2" "$1/log"
"""


async def tail_log(transport: Transport, handle: RunHandle, nbytes: int = 64 * 1024) -> bytes:
    """The last ``nbytes`` bytes of the log, from the first line that starts in them: a
    tail cut inside a line drops that line's piece (which could hold the end of a secret,
    unmaskable without its start). A tail without any line end is returned whole."""
    result = await transport.run(sh(_TAIL, handle.dir, str(nbytes)))
    fail(transport, "tail_log", result)
    tail = result.stdout
    if len(tail) >= nbytes:
        cut = tail.find(b"\n")
        if 0 <= cut < len(tail) - 1:
            tail = tail[cut + 1:]
    return tail


async def _close(iterator: AsyncIterator[bytes]) -> None:
    aclose = getattr(iterator, "aclose", None)
    if aclose is not None:
        with anyio.CancelScope(shield=True):
            await aclose()


async def follow(
    transport: Transport, handle: RunHandle, offset: int = 0,
) -> AsyncGenerator[LogChunk | RunExited, None]:
    """Yield the log from byte ``offset`` as it grows, then ``RunExited`` once the server is gone.

    Every byte is yielded exactly once, in order; ``RunExited`` comes after the last byte the
    server wrote. Death is noticed within about FOLLOW_POLL_S (GNU ``tail --pid`` on the
    host, whose stream then ends with the exit status: no further round trip); without GNU
    tail this degrades to polling.

    Error handling: HostUnreachable from the transport propagates; call ``follow`` again with
    the ``end_offset`` of the last chunk received to resume without loss or repetition.
    Resource handling: closing or cancelling the iteration stops the remote follower.
    """
    position = offset
    ticks = str(math.ceil(_EXIT_STATUS_WAIT_S / 0.05))
    while True:
        # A fresh random marker per stream: no log can contain it by accident.
        marker = _END_MARK + secrets.token_hex(16).encode() + b":"
        stream = transport.stream(sh(
            _FOLLOW, handle.dir, str(position + 1), str(handle.pid), str(FOLLOW_POLL_S), ticks,
            marker.decode(),
        ))
        held = b""  # a possible start of the marker, not yet known to be log
        trailer: bytes | None = None
        try:
            async for data in stream:
                if trailer is not None:
                    trailer += data
                    continue
                held += data
                at = held.find(marker)
                if at >= 0:
                    data, trailer = held[:at], held[at + len(marker):]
                    held = b""
                else:
                    data, held = _hold_back(held, marker)
                if data:
                    position += len(data)
                    yield LogChunk(data, position)
        finally:
            await _close(stream)
        if held:  # the stream ended without its marker: what was held back is log
            position += len(held)
            yield LogChunk(held, position)
        end = _parse_trailer(trailer)
        if end is None:  # the follower died without its trailer: ask the host
            alive, exit_status, data = await _finish(transport, handle, position)
        else:
            alive, exit_status, size = end
            data = (await read_log(transport, handle, position, READ_CHUNK)
                    if size > position else b"")
        if data:
            position += len(data)
            yield LogChunk(data, position)
        if not alive:
            # What the server wrote beyond the one piece read above, a piece at a time.
            while len(data) == READ_CHUNK:
                data = await read_log(transport, handle, position, READ_CHUNK)
                if data:
                    position += len(data)
                    yield LogChunk(data, position)
            break
        # The follower ended while the server lives (no GNU tail, or it was killed): what it
        # missed was just read; try again shortly so a missing --pid cannot busy-loop.
        await anyio.sleep(FOLLOW_POLL_S)
    yield RunExited(exit_status)


def _hold_back(data: bytes, marker: bytes) -> tuple[bytes, bytes]:
    """Split ``data`` into (log, held): ``held`` is the longest end of it that could be the
    start of ``marker`` (empty unless ``data`` ends in part of it)."""
    start = data.rfind(marker[:1], max(0, len(data) - len(marker) + 1))
    if start >= 0 and marker.startswith(data[start:]):
        return data[:start], data[start:]
    return data, b""


def _parse_trailer(trailer: bytes | None) -> tuple[bool, int | None, int] | None:
    """(alive, exit status, log size) from the follower's trailer; None if it is incomplete
    or a number in it is out of bounds (the caller then asks the host, which reports a
    corrupt ``exit_status`` as ``remote.attempt_corrupt``)."""
    if trailer is None or not trailer.endswith(b"\n"):
        return None
    fields = trailer.split()
    if len(fields) != 3 or fields[0] not in (b"0", b"1"):
        return None
    size = bounded_int(fields[2])
    status = None if fields[1] == b"-" else bounded_int(fields[1])
    if size is None or (status is None and fields[1] != b"-"):
        return None
    return fields[0] == b"1", status, size


async def _finish(
    transport: Transport, handle: RunHandle, offset: int,
) -> tuple[bool, int | None, bytes]:
    """(alive, exit status, log bytes from ``offset``) in one command (see _FINISH)."""
    ticks = str(math.ceil(_EXIT_STATUS_WAIT_S / 0.05))
    result = await transport.run(sh(_FINISH, handle.dir, str(offset + 1), ticks,
                                     str(READ_CHUNK)),
                                 timeout=_EXIT_STATUS_WAIT_S + 30.0)
    fail(transport, "follow", result)
    head, sep, data = result.stdout.partition(b"\n")
    fields = head.split()
    if not sep or len(fields) != 2 or fields[0] not in (b"0", b"1"):
        raise LogFormatError(f"follow on {transport.host_name} printed {result.stdout[:200]!r}")
    status = None if fields[1] == b"-" else _number(transport, handle.dir, "exit_status",
                                                    fields[1])
    return fields[0] == b"1", status, data


async def _members(transport: Transport, handle: RunHandle) -> list[int]:
    result = await transport.run(sh(_MEMBERS, handle.dir))
    fail(transport, "process listing", result)
    pids = (bounded_int(p) for p in result.stdout.split())
    return [p for p in pids if p is not None]


async def _wait_gone(transport: Transport, handle: RunHandle, seconds: float) -> list[int]:
    """Poll until the server's group and session are empty or ``seconds`` pass; the leftovers."""
    with anyio.move_on_after(seconds):
        while True:
            if not await _members(transport, handle):
                return []
            await anyio.sleep(_STOP_POLL_S)
    return await _members(transport, handle)


async def stop(
    transport: Transport, handle: RunHandle, *, grace: float = 20.0, kill_wait: float = 5.0,
) -> StopReport:
    """SIGTERM the server's process group and session, SIGKILL what is left after ``grace``.

    Idempotent: on a server that is already gone no signal is sent. ``leftover_pids`` lists
    processes still in the group after the SIGKILL wait (typically stuck in a driver call,
    still holding GPU memory). Never signals a process that merely reuses the server's pid.
    """
    sent: list[str] = []
    for signal_name, wait_s in (("SIGTERM", grace), ("SIGKILL", kill_wait)):
        result = await transport.run(sh(_SIGNAL, handle.dir, signal_name.removeprefix("SIG"),
                                         _token(transport)))
        _refuse_fenced(transport, result, f"stop of {handle.server}")
        fail(transport, "signal", result)
        if not result.stdout.strip():
            break
        sent.append(signal_name)
        log.info("remote.signal_sent", host=transport.host_name, server=handle.server,
                 attempt=handle.attempt, pid=handle.pid, signal=signal_name)
        if not await _wait_gone(transport, handle, wait_s):
            break
    leftovers = await _members(transport, handle)
    # The wrapper records the status right after the server dies; nothing to wait for when
    # no signal was needed.
    exit_status = await _exit_status(transport, handle, 1.0 if sent else 0.0)
    if leftovers:
        log.warning("remote.stop_leftovers", host=transport.host_name, server=handle.server,
                    attempt=handle.attempt, pids=leftovers)
    return StopReport(sent, exit_status, leftovers)


async def _list_attempts(
    transport: Transport, run_dir: str, server: str, *, claim: bool = False,
) -> tuple[str, list[tuple[int, bool, int | None]]]:
    """The absolute server directory and its attempts as (attempt, alive, pid); ``claim``:
    see _LIST."""
    _check_name(server)
    result = await transport.run(sh(_LIST, run_dir, server, "claim" if claim else "",
                                     _token(transport)), timeout=60.0)
    _refuse_fenced(transport, result, f"listing of {server}")
    fail(transport, "listing attempts", result)
    entries, sep, directory = result.stdout.decode("utf-8", "surrogateescape").partition(
        "@@\n")
    if not sep:
        return "", []
    attempts = []
    for line in entries.splitlines():
        parts = line.split()
        number = _number(transport, directory, "attempt listing", parts[0]) if parts else None
        if len(parts) != 3 or number is None:
            log.warning("remote.attempt_corrupt", host=transport.host_name, dir=directory,
                        file="attempt listing", value=line[:80])
            continue
        _, alive, pid_text = parts
        # An attempt whose pid file is not a pid still takes its number (directories are never
        # reused), but is never adopted, probed by pid or signalled.
        pid = None if pid_text == "-" else _number(transport, f"{directory}/{number}", "pid",
                                                   pid_text)
        attempts.append((number, alive == "1" and pid is not None, pid))
    return directory, attempts


async def find_running(
    transport: Transport, run_dir: str, server: str, *, adopting: bool = False,
) -> RunHandle | None:
    """The newest attempt of ``server`` whose server still runs, or None.

    ``adopting`` (only the launcher that will supervise the server): launches left half-way
    by a launcher that died are settled first, so that none can start a second copy later:
    one whose server is already starting is waited for (and found), any other never starts.
    """
    directory, attempts = await _list_attempts(transport, run_dir, server, claim=adopting)
    for attempt, alive, pid in sorted(attempts, reverse=True):
        if alive and pid is not None:
            return RunHandle(server, attempt, f"{directory}/{attempt}", pid)
    return None


async def latest_handle(transport: Transport, run_dir: str, server: str) -> RunHandle | None:
    """The newest attempt of ``server``, running or not (pid 0 when it never wrote one)."""
    directory, attempts = await _list_attempts(transport, run_dir, server)
    if not attempts:
        return None
    attempt, _, pid = max(attempts)
    return RunHandle(server, attempt, f"{directory}/{attempt}", pid or 0)


async def latest_attempt(transport: Transport, run_dir: str, server: str) -> int:
    """The highest attempt number on the host for ``server`` (0 if none)."""
    _, attempts = await _list_attempts(transport, run_dir, server)
    return max((a for a, _, _ in attempts), default=0)


async def ended_attempts(
    transport: Transport, run_dir: str, server: str, attempts: Collection[int],
) -> list[tuple[RunHandle, int]]:
    """Those of ``attempts`` of ``server`` whose server has ended and whose wrapper recorded
    its exit status, as (handle, exit status), oldest first: one listing, then one read of
    each such attempt's small files. An attempt still running, one without a recorded status
    (its wrapper died too, the host rebooted) and one not on the host are left out."""
    wanted = set(attempts)
    if not wanted:
        return []
    directory, listed = await _list_attempts(transport, run_dir, server)
    found = []
    for number, alive, pid in sorted(listed):
        if number not in wanted or alive:
            continue
        handle = RunHandle(server, number, f"{directory}/{number}", pid or 0)
        status = bounded_int((await attempt_files(transport, handle)).get("exit_status", ""))
        if status is not None:
            found.append((handle, status))
    return found


@dataclass(frozen=True)
class Survey:
    """One successful listing of a server's attempts on a host."""

    running: RunHandle | None  # the newest attempt whose server still runs
    latest: int  # the highest attempt number there (0 if none)


async def survey(
    transport: Transport, run_dir: str, server: str, *, adopting: bool = False,
) -> Survey:
    """What one listing shows of ``server`` on the host: the attempt to adopt (if any) and
    the number to go on from. Raises (never answers "nothing there") when it cannot list.
    ``adopting``: as for :func:`find_running` (half-way launches are settled first)."""
    directory, attempts = await _list_attempts(transport, run_dir, server, claim=adopting)
    running = None
    for attempt, alive, pid in sorted(attempts, reverse=True):
        if alive and pid is not None:
            running = RunHandle(server, attempt, f"{directory}/{attempt}", pid)
            break
    return Survey(running, max((a for a, _, _ in attempts), default=0))


# $1 dir, $2 the reason. Written once supervision of the attempt's server gave up.
_MARK_GAVE_UP = PRELUDE + r"""
safe "$1" 3 || exit 13
printf '%s\n' "$2" > "$1/gave_up.tmp" && mv -f "$1/gave_up.tmp" "$1/gave_up"
"""
GAVE_UP_LIMIT = 4096  # bytes of a give-up reason kept in the attempt's ``gave_up`` file
_ATTEMPT_FILES = ("cmd", "started_at", "exit_status", "gave_up")
# $1 dir, $2 bytes per file. Prints "name\0content\0" for each small file of the attempt
# that exists (at most $2 bytes of it).
_READ_FILES = PRELUDE + r"""
safe "$1" 3 || exit 13
d=$1; n=$2; shift 2
for f in "$@"; do
  [ -f "$d/$f" ] && [ ! -L "$d/$f" ] || continue
  printf '%s\000' "$f"; head -c "$n" "$d/$f"; printf '\000'
done
exit 0
"""


async def mark_gave_up(transport: Transport, handle: RunHandle, reason: str) -> None:
    """Leave ``reason`` in the attempt's ``gave_up`` file: `launcher status`, from any box,
    then shows the attempt as given up rather than as merely exited."""
    text = reason.encode("utf-8", "replace")[:GAVE_UP_LIMIT].decode("utf-8", "ignore")
    result = await transport.run(sh(_MARK_GAVE_UP, handle.dir, text), timeout=30.0)
    fail(transport, "marking the attempt as given up", result)


async def attempt_files(transport: Transport, handle: RunHandle,
                        limit: int = GAVE_UP_LIMIT) -> dict[str, str]:
    """The attempt's small files that exist (``cmd``, ``started_at``, ``exit_status``,
    ``gave_up``), at most ``limit`` bytes of each, whitespace-stripped; one command."""
    result = await transport.run(sh(_READ_FILES, handle.dir, str(limit), *_ATTEMPT_FILES),
                                 timeout=30.0)
    fail(transport, "reading the attempt's files", result)
    parts = result.stdout.split(b"\0")
    return {parts[i].decode("utf-8", "replace"): parts[i + 1].decode("utf-8", "replace").strip()
            for i in range(0, len(parts) - 1, 2)
            if parts[i].decode("utf-8", "replace") in _ATTEMPT_FILES}
