"""`launcher check`: the preflight checks `up` runs, without launching."""

from __future__ import annotations

from dataclasses import replace
from functools import partial

import anyio
import typer
import typer.core

from launcher import daemon
from launcher.cli.app import (
    ConfigArg,
    ServerOpt,
    check_webhook,
    coordination_dsn,
    err,
    guard,
    one_line,
    open_config,
    out,
    per_host,
    per_server,
    say,
    secrets_of,
    select_servers,
    webhook_source,
)
from launcher.config.schema import (
    Config,
    CoordinationConfig,
    RouterConfig,
    ServerConfig,
    SlackConfig,
    resolve_router_api_key,
)
from launcher.errors import (
    HostUnreachable,
    LauncherError,
)
from launcher.host import preflight, run
from launcher.host.transport import make_transport
from launcher.host.transport.base import Transport
from launcher.plan.first_attempt import plan_first_attempt, warm_start
from launcher.store.coordination import EngineUnavailable, ping
from launcher.store.ledger import Ledger, ledger_path
from launcher.supervise.router import routers_for

COORDINATION_TIMEOUT_S = 5.0  # one connection try to the coordination database


def check(config_path: ConfigArg = None, server: ServerOpt = None) -> None:
    """Validate the config (the Slack webhook's URL included), preflight every server's host
    and ask the memory estimate whether `up` would refuse it, look at each router's host
    (port, program) and, with [coordination], connect to the database once; launch
    nothing."""
    config = guard(lambda: open_config(config_path))
    servers = guard(lambda: select_servers(config, server, config_path))
    guard(lambda: secrets_of(config_path, config, servers))
    dsn = guard(lambda: coordination_dsn(config_path, config))
    slack = config.slack or SlackConfig()
    webhook = guard(lambda: slack.webhook_url())
    check_webhook(slack, webhook)
    say(out, "slack: ", ("ok", "green"), f"  webhook from {webhook_source(slack)}"
         if webhook is not None else "  no webhook: messages are logged instead")
    code = 0
    if config.coordination is not None and dsn is not None:
        code = _check_coordination(config.coordination, dsn)

    async def one(s: ServerConfig, t: Transport) -> list[str]:
        problems = []
        try:
            version = await daemon.sglang_version_of(s, t)
        except LauncherError as exc:
            problems.append(f"SGLang version: {exc}")
            version = "?"
        running = await run.find_running(t, config.run_dir_of(s), s.name)
        target = preflight.Target(s.host, config.host(s.host).nvidia_smi, s.name, s.gpus,
                                  s.model_path, s.port)
        if running is not None:  # a running server of ours holds its GPUs and port: fine
            target = replace(target, gpus=(), port=None)
        problems += [str(p) for p in await preflight.check(t, target)]
        if running is None and version != "?":
            # what `up` would start from: the ledger's last good params win, as there
            warm = warm_start(ledger, config, s, [version], fresh=False).warm
            first = await plan_first_attempt(config, s, t, version, s.launch_params(),
                                             warm=warm)
            if first.refused:
                problems.append(f"nothing fits (`up` would exit 5): {first.reason}")
        note = f" (running, pid {running.pid})" if running else ""
        return [f"SGLang {version}{note}", *problems]

    routers = routers_for(config, servers)
    guard(lambda: [resolve_router_api_key(r) for r in routers])  # read as `up` reads them

    path = ledger_path(config.state_dir)
    ledger = Ledger(path) if path.exists() else None  # never made by a check
    try:
        results = anyio.run(partial(per_server, one_try=True), config, servers, one)
    finally:
        if ledger is not None:
            ledger.close()
    for s, r in zip(servers, results, strict=True):
        if isinstance(r, LauncherError):
            say(err, f"{s.name} on {s.host}: ", ("unreachable", "red") if isinstance(
                r, HostUnreachable) else (type(r).__name__, "red"), f": {one_line(r)}")
            code = 1
            continue
        head, *problems = r
        mark = ("problems", "red") if problems else ("ok", "green")
        say(out, f"{s.name} on {s.host}: ", mark, f"  {head}")
        for p in problems:
            say(out, f"  - {p}")
        code = code or (1 if problems else 0)
    for r, found in zip(routers, anyio.run(_check_routers, config, routers), strict=True):
        head = f"router {r.name} on {r.host}: "
        if isinstance(found, LauncherError):
            say(err, head, ("unreachable", "red") if isinstance(
                found, HostUnreachable) else (type(found).__name__, "red"),
                f": {one_line(found)}")
            code = 1
            continue
        note, *problems = found
        say(out, head, ("problems", "red") if problems else ("ok", "green"), f"  {note}")
        for p in problems:
            say(out, f"  - {p}")
        code = code or (1 if problems else 0)
    raise typer.Exit(code)


def _check_coordination(c: CoordinationConfig, dsn: str) -> int:
    """One connection to the coordination database (one try, bounded: ``ping``), reported
    as a host is: ``coordination (lease L): ok  PostgreSQL 15.8`` or, on stderr,
    ``... unreachable: why``; 1 when it could not be reached, else 0."""
    head = f"coordination (lease {c.lease}, box {c.box}): "
    try:
        version = anyio.run(ping, dsn, COORDINATION_TIMEOUT_S)
    except EngineUnavailable as exc:
        say(err, head, ("unreachable", "red"), f": {exc}")
        return 1
    say(out, head, ("ok", "green"), f"  {version}")
    return 0


async def _check_routers(config: Config, routers: list[RouterConfig],
                         ) -> list[list[str] | LauncherError]:
    """Per router, what a look at its host finds cheaply (one connection try per host): a
    note (``running, pid N`` or ``port P free``, and the program), then its problems (the
    port taken while it is not running, its command's program missing); or the error that
    kept the host from answering. Not asked: whether that program can run the router
    (importing sglang_router means starting a Python on the host)."""
    transports = {r.host: make_transport(config.host(r.host), connect_attempts=1)
                  for r in routers}

    async def one(r: RouterConfig, t: Transport) -> list[str]:
        running = await run.find_running(t, config.run_dir_of(r), r.name)
        problems: list[str] = []
        if running is not None:
            note = f"running, pid {running.pid}"
        else:
            taken = await preflight.port_taken(t, r.host, r.port)
            note = f"port {r.port} free"
            if taken is not None:
                note = f"port {r.port}"
                problems.append(str(taken))
        program = r.command[0]
        if await preflight.program_found(t, program, r.env):
            note += f", {program} found"
        else:
            problems.append(f"{program} (the router's command) not found on {r.host}")
        return [note, *problems]

    return await per_host(routers, one, transports)
