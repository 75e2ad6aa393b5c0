"""`launcher down`: stop the servers (and their routers)."""

from __future__ import annotations

import time
from typing import Annotated

import anyio
import typer
import typer.core

from launcher import daemon
from launcher.cli.app import (
    ConfigArg,
    ServerOpt,
    err,
    error,
    fail,
    guard,
    open_config,
    out,
    per_server,
    say,
    select_servers,
)
from launcher.config.schema import (
    Config,
    ServerConfig,
)
from launcher.errors import (
    LauncherError,
    RemoteCommandError,
    StateError,
)
from launcher.host import run
from launcher.host.gpus import check_gpus
from launcher.host.transport import make_transport
from launcher.host.transport.base import Transport
from launcher.store.ledger import Ledger, ledger_path
from launcher.store.lock import DOWN, StateLock, StateLockHeld
from launcher.supervise.ranks import stop_other_ranks
from launcher.supervise.router import stop_router


def down(
    config_path: ConfigArg = None, server: ServerOpt = None,
    force: Annotated[bool, typer.Option(
        "--force", help="Stop them even while a `launcher up` supervises this state directory "
        "(it relaunches what it sees die).")] = False,
) -> None:
    """Stop servers cleanly (TERM, bounded wait, KILL) and check their GPUs were freed; then
    the routers (without --server). Refused while a `launcher up` holds the state directory
    (unless --force); holds it meanwhile, so that no `up` starts."""
    config = guard(lambda: open_config(config_path))
    servers = guard(lambda: select_servers(config, server, config_path))
    lock = StateLock(config.state_dir, DOWN)
    try:
        lock.acquire()
    except StateLockHeld as exc:
        if exc.holder == DOWN:
            fail(exc)
        if not force:
            who = f"pid {exc.pid}" if exc.pid is not None else "pid unknown"
            fail(StateError(
                f"another `launcher up` ({who}) supervises this state directory: "
                f"{config.state_dir}", remedy="stop that `launcher up` first (systemctl stop "
                "<its unit>, or Ctrl-C): it relaunches what it sees die; or `launcher down "
                "--force` to stop them anyway and let it relaunch"))
    except StateError as exc:  # an unusable state directory must not keep a stop from running
        error(err, exc, "warning: not locking the state directory: ")
    try:
        _down(config, servers, server)
    finally:
        lock.release()


def _down(config: Config, servers: list[ServerConfig], server: list[str] | None) -> None:
    async def stop_one(s: ServerConfig, t: Transport) -> str:
        said = await stop_first(s, t)
        if s.nnodes > 1:  # node 0 first (0.5.23's nodes >= 1 wait for its shutdown)
            said = "; ".join([f"node 0 ({s.host}): {said}",
                              *await stop_other_ranks(config, s)])
        return said

    async def stop_first(s: ServerConfig, t: Transport) -> str:
        handle = await run.find_running(t, config.run_dir_of(s), s.name)
        if handle is None:
            return "not running"
        report = await run.stop(t, handle)
        unrecorded = _record_stopped(config, s, handle.attempt)
        if report.leftover_pids:
            raise RemoteCommandError(
                f"processes left after SIGKILL: {report.leftover_pids}", host=s.host,
                remedy="they are stuck in the driver (D state); check `nvidia-smi` on the host")
        deadline = anyio.current_time() + config.policy_for(s.name).gpu_free_timeout
        while True:
            problems = await check_gpus(t, config.host(s.host).nvidia_smi, s.gpus)
            if not problems or anyio.current_time() > deadline:
                break
            await anyio.sleep(1.0)
        signals = "+".join(report.signals_sent) or "none needed"
        if problems:
            return (f"stopped (pid {handle.pid}, {signals}) but GPUs not free: "
                    f"{'; '.join(problems)}{unrecorded}")
        return f"stopped (pid {handle.pid}, {signals}); GPUs {s.gpus} free{unrecorded}"

    results = anyio.run(per_server, config, servers, stop_one)
    code = 0
    for s, r in zip(servers, results, strict=True):
        if isinstance(r, LauncherError):
            error(err, r, f"{s.name}: ")
            code = 1
        else:
            say(out, f"{s.name}: {r}")
            code = code or (1 if "not free" in r else 0)
    for name, line in _stop_routers(config) if not server else []:  # after their servers
        if isinstance(line, LauncherError):
            error(err, line, f"{name}: ")
            code = 1
        else:
            say(out, f"{name}: {line}")
    raise typer.Exit(code)


def _record_stopped(config: Config, s: ServerConfig, attempt: int) -> str:
    """Close the ledger's row of ``attempt`` as ``stopped`` (a stop asked for, not a crash:
    `status` then reads "stopped" and RESTARTS does not count it). ``""``, or a note for the
    operator when the ledger cannot be written; no ledger yet: nothing to record."""
    path = ledger_path(config.state_dir)
    if not path.exists():
        return ""
    try:
        with Ledger(path) as ledger:
            ledger.attempt_stopped(s.name, attempt, ended_at=time.time())
    except StateError as exc:
        return f" (not recorded in the ledger: {exc})"
    return ""


def _stop_routers(config: Config) -> list[tuple[str, str | LauncherError]]:
    async def stop_all() -> list[tuple[str, str | LauncherError]]:
        transports = {r.host: make_transport(config.host(r.host)) for r in config.routers}
        done: list[tuple[str, str | LauncherError]] = []
        try:
            for r in config.routers:
                try:
                    done.append((r.name, await stop_router(config, r, transports[r.host])))
                except LauncherError as exc:
                    done.append((r.name, exc))
        finally:
            await daemon.close_transports(transports)
        return done

    return anyio.run(stop_all) if config.routers else []
