"""`launcher logs`: a server's current attempt's log, from its host."""

from __future__ import annotations

import sys
from datetime import datetime
from functools import partial
from typing import Annotated

import anyio
import typer
import typer.core

from launcher.cli import inspection
from launcher.cli.app import (
    CONFIG_ENV,
    ConfigArg,
    config_and_server,
    fail,
    guard,
    open_config,
    per_server,
)
from launcher.config.schema import (
    ServerConfig,
)
from launcher.errors import (
    LauncherError,
    UsageError,
)
from launcher.host import run
from launcher.host.preflight import path_exists
from launcher.host.transport.base import Transport


async def _attempt_handle(t: Transport, run_dir: str, s: ServerConfig,
                          attempt: int | None) -> run.RunHandle:
    """The newest attempt of ``s``, or attempt ``attempt``; a usage error naming the attempts
    there are when it does not exist."""
    latest = await run.latest_handle(t, run_dir, s.name)
    if latest is None:
        raise UsageError(f"{s.name} has no attempt on {s.host} yet",
                         remedy="start it with `launcher up`")
    if attempt is None or attempt == latest.attempt:
        return latest
    directory = latest.dir.rsplit("/", 1)[0]
    handle = run.RunHandle(s.name, attempt, f"{directory}/{attempt}", 0)
    if attempt > latest.attempt or not await path_exists(t, handle.dir):
        raise UsageError(f"{s.name} has no attempt {attempt} on {s.host}",
                         remedy=f"its newest attempt is {latest.attempt}; "
                         f"`launcher history CONFIG {s.name}` lists them")
    return handle


async def _tail_offset(t: Transport, handle: run.RunHandle, lines: int) -> int:
    """The log offset where its last ``lines`` lines start (a last line without its newline
    counts), read backwards READ_CHUNK bytes at a time."""
    size = (await run.probe(t, handle)).log_size
    end = size
    newlines: list[int] = []  # offsets just after each newline found, from the end
    while end > 0:
        start = max(0, end - run.READ_CHUNK)
        chunk = await run.read_log(t, handle, start, end - start)
        newlines += [start + i + 1 for i in range(len(chunk) - 1, -1, -1) if chunk[i] == 10]
        # A final newline ends the last line rather than starting an empty one.
        wanted = lines + (1 if newlines and newlines[0] == size else 0)
        if len(newlines) >= wanted:
            return size if lines == 0 else newlines[wanted - 1]
        end = start
    return 0


_ANY_NOW = datetime(2000, 1, 1)  # a stand-in for the host's time, to check --since's form


def _cutoff(since: str, now: datetime) -> datetime:
    """``inspection.since_cutoff``; a usage error naming the flag when WHEN is malformed."""
    try:
        return inspection.since_cutoff(since, now)
    except (ValueError, OverflowError) as exc:
        raise UsageError(f"--since {since!r}: {exc}", remedy="e.g. --since 10m or "
                         "--since '2026-12-01 17:02:03' (the host's local time)") from None


def logs(
    config_path: ConfigArg = None,
    server_name: Annotated[str | None, typer.Argument(
        metavar="SERVER", show_default=False,
        help=f"The server (`logs SERVER` alone reads CONFIG from ${CONFIG_ENV}).")] = None,
    follow: Annotated[bool, typer.Option("--follow", "-f", help="Keep following.")] = False,
    tail: Annotated[int | None, typer.Option(
        "--tail", "-n", min=0, metavar="N", help="Only the last N lines.")] = None,
    attempt: Annotated[int | None, typer.Option(
        "--attempt", min=1, metavar="N",
        help="This attempt's log (default: the newest), a failed one included.")] = None,
    since: Annotated[str | None, typer.Option(
        "--since", metavar="WHEN",
        help="Only lines stamped since WHEN: a duration back (90s, 10m, 2h, 1d) or the host's "
        "local time as the log writes it (2026-12-01 17:02:03).")] = None,
) -> None:
    """Print the log of a server's current (or last) attempt, or of attempt N.

    Reads a chunk at a time, whatever the log's size; --tail and --since read it backwards
    from its end only as far as they need."""
    config_path, name = config_and_server(config_path, server_name)
    config = guard(lambda: open_config(config_path))
    s = guard(lambda: config.server(name))
    if since is not None:  # its form is checked before anything is contacted
        guard(lambda: _cutoff(since, _ANY_NOW))

    async def show(s: ServerConfig, t: Transport) -> None:
        handle = await _attempt_handle(t, config.run_dir_of(s), s, attempt)
        offset = 0 if tail is None else await _tail_offset(t, handle, tail)
        if since is not None:
            cutoff = _cutoff(since, await inspection.host_now(t))
            offset = max(offset, await inspection.since_offset(t, handle, cutoff))
        if not follow:
            while data := await run.read_log(t, handle, offset, run.READ_CHUNK):
                sys.stdout.buffer.write(data)
                offset += len(data)
            return
        async for item in run.follow(t, handle, offset):
            if isinstance(item, run.LogChunk):
                sys.stdout.buffer.write(item.data)
                sys.stdout.buffer.flush()

    try:
        # One connection attempt, as `status` makes: an unreachable host is reported at once.
        # `--follow` keeps the retries, which carry it over a dropped connection.
        results = anyio.run(partial(per_server, one_try=not follow), config, [s], show)
    except KeyboardInterrupt:
        raise typer.Exit(0) from None
    if isinstance(results[0], LauncherError):
        fail(results[0])
