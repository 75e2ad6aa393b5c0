"""The ``sh`` plumbing shared by the run protocol (``launcher.host.run``) and the preflight
checks (``launcher.host.preflight``): the shell functions every script starts with
(``PRELUDE``), the argv that passes values as positional arguments, never interpolated
(``sh``), and the error for a failed command (``fail``).
"""

from __future__ import annotations

from launcher.errors import RemoteCommandError
from launcher.host.transport.base import CommandResult, Transport

# Shell functions shared by the scripts of ``run`` and ``preflight``: a script that uses one
# starts with PRELUDE. ``ident`` reads the boot id and the start time
# (field 22 of /proc/PID/stat, after the parenthesised command name) so that a recycled pid is
# never mistaken for our server. ``ours`` trusts a pid only when it is a number above 1, the
# attempt has a pid_start, and a live process with that pid matches it (a missing pid_start
# trusts nothing: a pid file holding 1 must never become ``kill -- -1``). When the pid is gone,
# its group (orphaned schedulers) is still ours: no process gets the id of a live group.
# ``settled DIR TICKS`` prints "<alive 0|1> <exit status or ->", first waiting up to
# TICKS × 50 ms for a dead server's status (the wrapper writes it right after reaping it).
#
# ``safe DIR LEVELS`` is the one check of a run directory, run by every script that reads
# from or signals through one (docs/security.md, finding H2): DIR (absolute,
# symlink-free: ``pwd -P``'s answer) and the LEVELS - 1 directories above it (2: a server
# directory and run_dir; 3: an attempt directory, its server directory and run_dir) must be
# real directories owned by the login user and not group/other-writable; every directory
# above them up to / must be owned by root or the login user and not group/other-writable
# unless it is sticky and owned by root (/tmp), as OpenSSH's StrictModes (``safe_path``)
# checks a home directory. Otherwise another user could rename a component and put a tree of
# his own in its place: forged pid and pid_start files (pid_start guards against pid reuse,
# not against forgery) and a ``log`` symlink to a file only root may read. For an attempt
# directory, ``pid``, ``pid_start``, ``log`` and ``exit_status`` must not be symlinks either.
# It prints "unsafe run directory PATH: why" on stderr and fails; the scripts then exit
# UNSAFE_STATUS, which ``fail`` turns into one RemoteCommandError with the fix.
PRELUDE = r"""
unsafe() { printf 'unsafe run directory %s: %s\n' "$1" "$2" >&2; }
plain() {
  for f in pid pid_start log exit_status; do
    if [ -L "$1/$f" ]; then unsafe "$1/$f" "a symlink (remove it)"; return 1; fi
  done
}
safe() {
  s=$1; me=$(id -u) || return 1
  case $s in /?*/*) ;; *) unsafe "$s" "not an absolute path below /"; return 1 ;; esac
  if [ "$2" = 3 ]; then set -- "$s" "${s%/*}" "${s%/*/*}"; else set -- "$s" "${s%/*}"; fi
  bad=$(find "$@" -maxdepth 0 \( ! -type d -o ! -user "$me" -o -perm -020 -o -perm -002 \) \
    -print 2>/dev/null) || { unsafe "$s" "missing, or a directory above it is not searchable"
    return 1; }
  if [ -n "$bad" ]; then
    unsafe "$bad" "it must be a real directory (not a symlink) owned by $(id -un)"\
" and writable by nobody else (chmod go-w)"
    return 1
  fi
  if [ $# = 3 ]; then plain "$s" || return 1; fi
  p=${s%/*}; set -- /
  while [ -n "$p" ]; do set -- "$@" "$p"; p=${p%/*}; done
  bad=$(find "$@" -maxdepth 0 \( ! -type d -o ! \( -user 0 -o -user "$me" \) \
    -o \( -perm -020 -o -perm -002 \) ! \( -perm -1000 -user 0 \) \) -print 2>/dev/null) \
    || { unsafe "$s" "a directory above it is not searchable"; return 1; }
  if [ -n "$bad" ]; then
    unsafe "$bad" "a directory above the run directory must be owned by root or $(id -un)"\
" and writable by nobody else, unless it is sticky and root's (like /tmp)"
    return 1
  fi
}
expand() { case $1 in "~") x=$HOME ;; "~/"*) x=$HOME/${1#"~/"} ;; *) x=$1 ;; esac; }
ident() {
  [ -r "/proc/$1/stat" ] || return 1
  read -r l < "/proc/$1/stat" || return 1
  set -- ${l##*) }; shift 19
  printf '%s %s' "$(cat /proc/sys/kernel/random/boot_id 2>/dev/null)" "$1"
}
ours() {
  case $2 in ''|*[!0-9]*|0|1) return 1 ;; esac
  [ -r "$1/pid_start" ] || return 1
  i=$(ident "$2") || return 0
  [ "$i" = "$(cat "$1/pid_start")" ]
}
alive() {
  [ -e "$1/exit_status" ] && return 1
  p=$(cat "$1/pid" 2>/dev/null) || return 1
  [ -n "$p" ] && kill -0 "$p" 2>/dev/null || return 1
  ours "$1" "$p"
}
settled() {
  if alive "$1"; then a=1; else
    a=0; i=0
    while [ ! -e "$1/exit_status" ] && [ "$i" -lt "$2" ]; do sleep 0.05; i=$((i + 1)); done
  fi
  st=$(cat "$1/exit_status" 2>/dev/null) || st=
  printf '%s %s' "$a" "${st:--}"
}
members() {
  ps -eo pid=,pgid=,sid=,stat= | awk -v g="$1" '($2 == g || $3 == g) && $4 !~ /^Z/ {print $1}'
}
strays() {
  ps -eo pid=,pgid=,sid=,stat= | awk -v g="$1" '$3 == g && $2 != g && $4 !~ /^Z/ {print $1}'
}
"""


def sh(script: str, *args: str) -> list[str]:
    """argv running ``script`` with ``args`` as $1, $2, … (values are never interpolated into
    the script, so no value needs quoting)."""
    return ["sh", "-c", script, "sh", *args]


UNSAFE_STATUS = 13  # a script's exit status when ``safe`` refused a run directory
UNSAFE_REMEDY = (
    "make run_dir a directory of your own whose every parent up to / is owned by root or you "
    "and not writable by others (chmod go-w; a shared parent needs the sticky bit and root "
    "as owner, like /tmp), or point run_dir at such a directory"
)


class RunDirUnsafe(RemoteCommandError):
    """A run directory that another user could swap (see ``safe``): nothing is read from it
    or signalled through it, and relaunching cannot help until someone fixes the host."""


def fail(transport: Transport, what: str, result: CommandResult, remedy: str = "") -> None:
    """Nothing when ``result`` is a success; else raise RemoteCommandError for the failed
    command ``what`` (with ``remedy``): RunDirUnsafe for a refused run directory (see
    ``safe``), its message naming the path and why, UNSAFE_REMEDY the fix."""
    if result.ok:
        return
    stderr = result.stderr[-2000:].decode("utf-8", "replace")
    refusal = [line for line in stderr.splitlines() if line.startswith("unsafe run directory ")]
    if result.exit_status == UNSAFE_STATUS and refusal:
        raise RunDirUnsafe(
            f"{what} on {transport.host_name}: {refusal[-1]}", host=transport.host_name,
            command=what, exit_status=result.exit_status, stderr=stderr,
            remedy=UNSAFE_REMEDY,
        )
    raise RemoteCommandError(
        f"{what} failed on {transport.host_name} with exit status {result.exit_status}",
        host=transport.host_name,
        command=what,
        exit_status=result.exit_status,
        stderr=stderr,
        remedy=remedy,
    )
