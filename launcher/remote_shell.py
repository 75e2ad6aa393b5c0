"""The ``sh`` plumbing shared by the run protocol (``remote``) and the preflight checks
(``remote_preflight``): the shell functions every script starts with, the argv that passes
values as positional arguments (never interpolated), and the error for a failed command.
"""

from __future__ import annotations

from launcher.errors import RemoteCommandError
from launcher.transport.base import CommandResult, Transport

# Shell functions shared by the scripts of ``remote`` and ``remote_preflight``.
# ``ident`` reads the boot id and the start time
# (field 22 of /proc/PID/stat, after the parenthesised command name) so that a recycled pid is
# never mistaken for our server. ``ours`` trusts a pid only when it is a number above 1, the
# attempt has a pid_start, and a live process with that pid matches it (a missing pid_start
# trusts nothing: a pid file holding 1 must never become ``kill -- -1``). When the pid is gone,
# its group (orphaned schedulers) is still ours: no process gets the id of a live group.
# ``settled DIR TICKS`` prints "<alive 0|1> <exit status or ->", first waiting up to
# TICKS × 50 ms for a dead server's status (the wrapper writes it right after reaping it).
_PRELUDE = r"""
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


def _sh(script: str, *args: str) -> list[str]:
    """argv running ``script`` with ``args`` as $1, $2, … (values are never interpolated)."""
    return ["sh", "-c", script, "sh", *args]


def _fail(transport: Transport, what: str, result: CommandResult, remedy: str = "") -> None:
    if result.ok:
        return
    raise RemoteCommandError(
        f"{what} failed on {transport.host_name} with exit status {result.exit_status}",
        host=transport.host_name,
        command=what,
        exit_status=result.exit_status,
        stderr=result.stderr[-2000:].decode("utf-8", "replace"),
        remedy=remedy,
    )
