"""`launcher up`: supervise the servers until stopped, with the live view on a terminal."""

from __future__ import annotations

import io
import json
import os
import sys
from pathlib import Path
from typing import Annotated, Any, TextIO, cast

import anyio
import typer
import typer.core
from rich.console import Console, Group
from rich.live import Live
from rich.table import Table
from rich.text import Text

from launcher import daemon
from launcher.cli.app import (
    EXIT_ERROR,
    EXIT_GAVE_UP,
    EXIT_OK,
    ConfigArg,
    ServerOpt,
    check_webhook,
    coordination_dsn,
    dur,
    err,
    error,
    exit_code,
    fail,
    guard,
    labelled,
    open_config,
    out,
    row,
    say_err,
    secrets_of,
    select_servers,
    short_params,
)
from launcher.config.schema import (
    SlackConfig,
    resolve_router_api_key,
)
from launcher.errors import (
    LauncherException,
    StateError,
    UsageError,
)
from launcher.hooks.logging import Format, configure
from launcher.hooks.messages import ServerInfo
from launcher.hooks.slack import SlackNotifier
from launcher.store.lock import make_private_dir
from launcher.supervise import events
from launcher.supervise.router import routers_for
from launcher.supervise.supervisor import Snapshot
from launcher.untrusted import plain


def _progress_text(s: Snapshot) -> str:
    """Progress as numbers: ``shards 12/40``, ``graphs 28/36 at bs 32 (draft extend)``; a
    capture pass that has not drawn its bar yet shows its name only, never the last pass's
    100%."""
    if s.phase == "cuda_graph":
        where = f" ({s.graph_pass.replace('_', ' ')})" if s.graph_pass else ""
        if s.steps is None:
            return f"capture starting{where}" if where else ""
        at = f" at bs {s.graph_bs}" if s.graph_bs is not None else ""
        return f"graphs {s.steps[0]}/{s.steps[1]}{at}{where}"
    if s.steps is not None:
        return f"{'shards' if s.phase == 'weights' else 'steps'} {s.steps[0]}/{s.steps[1]}"
    return "" if s.progress is None else f"{s.progress * 100:.0f}%"


_COLUMNS = ("SERVER", "HOST", "STATE", "PROGRESS", "STALL LEFT", "ATTEMPT", "PARAMS",
            "ELAPSED")
# Left out, first to last, when the terminal is too narrow for the whole table (an empty
# column goes before a filled one): the last screen is the one the operator keeps, and a
# cut STATE ("stopped (left runni…") says less than no STALL LEFT column at all.
_NARROW_DROPS = ("STALL LEFT", "PROGRESS", "ELAPSED", "HOST", "PARAMS")
_NOTE_MIN = 12  # what the NOTE column keeps before the others go


def _view(snaps: list[Snapshot], width: int | None = None) -> Table:
    """`up`'s live table: per server its state and time in it, progress in numbers, the stall
    budget left, the attempt, params, the server's own elapsed time, and a note (the last
    failure; why it gave up; how long its host has been unreachable). ``width``: the
    terminal's; columns are left out (``_NARROW_DROPS``) until the others fit it whole."""
    rows: list[dict[str, str]] = []
    for s in snaps:
        state = s.state.replace("_", " ")
        if s.phase_s is not None and s.state not in ("gave_up", "stopped"):
            state += f" {dur(s.phase_s)}"
        if s.state == "stopped" and s.pid is not None:
            state += " (left running)"  # supervision stopped; the server did not
        rows.append({
            "SERVER": s.server, "HOST": s.host, "STATE": plain(state),
            "PROGRESS": _progress_text(s), "STALL LEFT": dur(s.stall_left_s),
            "ATTEMPT": str(s.attempt), "PARAMS": labelled(s.params),
            "ELAPSED": dur(s.elapsed_s),
            "NOTE": plain("; ".join(n for n in (s.last_failure, s.reason) if n)),
        })
    kept = list(_COLUMNS)
    if width is not None:
        def need(columns: list[str]) -> int:  # two spaces between columns (rich's padding)
            return sum(max(len(c), *(len(r[c]) for r in rows)) + 2
                       for c in columns) + _NOTE_MIN

        empty = [c for c in _NARROW_DROPS if not any(r[c] for r in rows)]
        for column in [*empty, *_NARROW_DROPS]:
            if need(kept) <= width:
                break
            if column in kept:
                kept.remove(column)
    table = Table(box=None, pad_edge=False)
    for col in kept:
        table.add_column(col, no_wrap=True)
    # NOTE alone may shrink (the others are no_wrap); its text is one line cut with an
    # ellipsis (below), so a long note cannot fold a row onto several lines; the full note
    # is in up.log.
    table.add_column("NOTE", overflow="ellipsis")
    for s, r in zip(snaps, rows, strict=True):
        color = {"ready": "green", "gave_up": "red"}.get(s.state, "yellow")
        cells: list[str | Text] = [Text(r[c], style=color) if c == "STATE" else r[c]
                                   for c in kept]
        row(table, *cells, Text(r["NOTE"], no_wrap=True, overflow="ellipsis"))
    return table


class _LiveView:
    """`up`'s terminal table, redrawn four times a second (a daemon.View), with the events
    as one line each above it; every event in full (JSON lines) goes to ``log_path``, named
    under the table."""

    def __init__(self, log_path: Path) -> None:
        self.log_path = log_path
        self._live = Live(Text(""), console=out, refresh_per_second=4,
                          redirect_stdout=False, redirect_stderr=False)
        self._snaps: list[Snapshot] = []

    def start(self) -> None:
        self._live.start()

    def update(self, snapshots: list[Snapshot]) -> None:
        self._snaps = snapshots
        self._live.update(self._render())

    def stop(self) -> None:
        self._live.update(self._render())
        self._live.stop()

    def _render(self) -> Group:
        foot = Text(plain(f"events in full: {self.log_path}  ·  Ctrl-C stops supervising "
                           "(servers keep running)"), style="dim")
        return Group(_view(self._snaps, out.size.width), foot)


_EVENT_KEYS = ("attempt", "outcome", "phase", "params", "reason", "error", "delay_s",
               "silent_s", "unreachable_s", "url")


# Shown in the log file only: probes come every second; a message to Slack (or, without a
# webhook, to the log) repeats what the event lines above it already say, and so would the
# count of messages held back as repeats (info noise, and without the kind it says nothing).
_QUIET_EVENTS = frozenset({events.Probed.name, "notify.message", "notify.suppressed"})


def _event_line(event: dict[str, Any]) -> Text | None:
    """One JSON event as one short line: time, server, event, a few fields; None for
    events too frequent to show (probe results)."""
    name = str(event.get("event", ""))
    if name in _QUIET_EVENTS:
        return None
    parts = []
    for key in _EVENT_KEYS:
        value = event.get(key)
        if value is None or value == "":
            continue
        if key == "params":
            value = short_params(value) if isinstance(value, dict) else labelled(str(value))
        parts.append(f"{key}={value}")
    stamp = str(event.get("timestamp", ""))[11:19]
    level = str(event.get("level", "info"))
    style = {"warning": "yellow", "error": "red", "critical": "red"}.get(level, "")
    server = str(event.get("server", "launcher"))
    text = Text.assemble((plain(stamp), "dim"), " ", (plain(server), "bold"), " ",
                         (plain(name), style), " ", plain(" ".join(parts)))
    text.no_wrap = True
    text.overflow = "ellipsis"
    return text


class _LiveLog(io.TextIOBase):
    """structlog's stream while the live view runs: each JSON line goes whole to ``file``
    and, shortened to one line (see _event_line), to ``console`` above the live table."""

    def __init__(self, console: Console, file: TextIO) -> None:
        self._console = console
        self._file = file
        self._pending = ""

    def writable(self) -> bool:
        return True

    def isatty(self) -> bool:
        return False

    def write(self, text: str) -> int:
        self._file.write(text)
        self._pending += text
        *lines, self._pending = self._pending.split("\n")
        for line in lines:
            try:
                event = json.loads(line)
            except ValueError:
                event = {"event": line}
            shown = _event_line(event) if isinstance(event, dict) else None
            if shown is not None:  # one line: cut, never wrapped under the table
                self._console.print(shown, soft_wrap=False, no_wrap=True, crop=True,
                                    overflow="ellipsis")
        return len(text)

    def flush(self) -> None:
        self._file.flush()


def up(
    config_path: ConfigArg = None,
    server: ServerOpt = None,
    until_ready: Annotated[
        bool,
        typer.Option(
            "--until-ready", help="Exit 0 once every server is ready (they keep running)."
        ),
    ] = False,
    stop_on_exit: Annotated[
        bool, typer.Option("--stop-on-exit", help="Stop the servers when launcher exits.")
    ] = False,
    log_format: Annotated[
        str, typer.Option("--log-format", help="auto (live view on a TTY), json or console.")
    ] = "auto",
    fresh: Annotated[bool, typer.Option("--fresh", help="Ignore remembered good params.")] = False,
    force: Annotated[bool, typer.Option(
        "--force", help="Launch even when the memory estimate says nothing fits (exit 5 "
        "otherwise).")] = False,
) -> None:
    """Launch every server and supervise it to ready; keep it up."""
    if log_format not in ("auto", "json", "console"):
        fail(UsageError(f"--log-format {log_format!r}", remedy="use auto, json or console"))
    config = guard(lambda: open_config(config_path))
    servers = guard(lambda: select_servers(config, server, config_path))
    secrets = guard(lambda: secrets_of(config_path, config, servers))
    guard(lambda: coordination_dsn(config_path, config))
    router_keys = guard(lambda: {r.name: resolve_router_api_key(r)
                                  for r in routers_for(config, servers)})
    slack = config.slack or SlackConfig()
    webhook = guard(lambda: slack.webhook_url())
    secret_values = [v for env in secrets.values() for v in env.values()]
    secret_values += [key for key in router_keys.values() if key]
    # Checked here, before anything starts: a malformed webhook URL is a config error (exit 2).
    check_webhook(slack, webhook)
    notifier = guard(lambda: SlackNotifier(
        webhook, secrets=secret_values, announce_adoption=slack.announce_adoption,
        remind_every_s=slack.remind_every, config_path=config_path,
        servers_info={s.name: ServerInfo.of(s, config.host(s.host)) for s in servers}))
    live = log_format == "auto" and sys.stdout.isatty()
    fmt: Format = (
        "json" if log_format == "json" or (log_format == "auto" and not live) else "console"
    )
    view = None
    if live:
        log_path = Path(os.path.normpath(config.state_dir / "up.log"))
        log_file = guard(lambda: _open_log(log_path))
        configure("json", stream=cast(TextIO, _LiveLog(out, log_file)))
        view = _LiveView(log_path)
    else:
        configure(fmt, stream=sys.stdout)
    opts = daemon.Options(until_ready=until_ready, stop_on_exit=stop_on_exit, fresh=fresh,
                          force=force)
    try:
        result = anyio.run(daemon.run, config, servers, secrets, notifier, opts, view,
                           router_keys)
    except LauncherException as exc:  # LeaseLost too: exit 6
        error(err, exc)
        raise typer.Exit(exit_code(exc)) from None
    for name, reason in result.gave_up:
        # The reason is SGLang's and the policy's text (a TOML snippet's [[servers]]): no markup.
        say_err(3, (f"{name} gave up", "red"), f": {reason}")
    left = [*result.left_running, *(f"router {r}" for r in result.routers_left_running)]
    if left:
        say_err(5, left_running_line(left, coordinated=config.coordination is not None))
    raise typer.Exit(_up_exit_code(interrupted=result.interrupted, until_ready=until_ready,
                                   gave_up=[True] * len(result.gave_up)
                                   + [False] * (len(result.ready) - len(result.gave_up)),
                                   ready=result.ready))


def left_running_line(left: list[str], *, coordinated: bool) -> str:
    """`up`'s last line (a notice) when it leaves servers or routers running. With
    ``[coordination]`` the lease was released on the way out: a standby box takes them over
    at its next poll, so `launcher down` is the fix only where no box stands by (it would
    stop what the new active box supervises, which relaunches it)."""
    names = ", ".join(left)
    if coordinated:
        return (f"launcher exited and released the lease; left running: {names} (a standby "
                "box takes them over; only if none stands by, stop them with `launcher down`)")
    return f"launcher exited; left running: {names} (stop them with `launcher down`)"


def _open_log(path: Path) -> TextIO:
    """``path`` opened for appending (state_dir made private if new, refused if not ours
    alone: see store_lock.make_private_dir)."""
    make_private_dir(path.parent)
    try:
        fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT | os.O_NOFOLLOW, 0o600)
    except OSError as exc:
        raise StateError(f"cannot open {path}: {exc.strerror or exc}",
                         remedy="fix the state directory's permissions") from exc
    return io.TextIOWrapper(io.FileIO(fd, "a"), encoding="utf-8", line_buffering=True)


def _up_exit_code(*, interrupted: bool, until_ready: bool, gave_up: list[bool],
                  ready: list[bool]) -> int:
    """`up`'s exit status once supervision ended (see the module docstring); one entry per
    server in ``gave_up`` (it gave up) and ``ready`` (it reached ready at some point)."""
    if interrupted:
        return EXIT_OK  # a stop was asked for: that is success, whatever the servers did
    if any(gave_up) and (until_ready or all(gave_up)):
        return EXIT_GAVE_UP
    if until_ready and ready and all(ready):
        return EXIT_OK
    return EXIT_ERROR
