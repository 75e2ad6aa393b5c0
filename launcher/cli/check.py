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
    coordination_ready,
    err,
    guard,
    one_line,
    open_config,
    out,
    per_server,
    say,
    secrets_of,
    select_servers,
    webhook_source,
)
from launcher.config.schema import (
    ServerConfig,
    SlackConfig,
)
from launcher.errors import (
    HostUnreachable,
    LauncherError,
)
from launcher.host import preflight, run
from launcher.host.transport.base import Transport
from launcher.plan.first_attempt import plan_first_attempt, warm_start
from launcher.store.ledger import Ledger, ledger_path


def check(config_path: ConfigArg = None, server: ServerOpt = None) -> None:
    """Validate the config (the Slack webhook's URL included), preflight every server's host
    and ask the memory estimate whether `up` would refuse it; launch nothing."""
    config = guard(lambda: open_config(config_path))
    servers = guard(lambda: select_servers(config, server))
    guard(lambda: secrets_of(config_path, config, servers))
    guard(lambda: coordination_ready(config_path, config))
    slack = config.slack or SlackConfig()
    webhook = guard(lambda: slack.webhook_url())
    check_webhook(slack, webhook)
    say(out, "slack: ", ("ok", "green"), f"  webhook from {webhook_source(slack)}"
         if webhook is not None else "  no webhook: messages are logged instead")

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

    path = ledger_path(config.state_dir)
    ledger = Ledger(path) if path.exists() else None  # never made by a check
    try:
        results = anyio.run(partial(per_server, one_try=True), config, servers, one)
    finally:
        if ledger is not None:
            ledger.close()
    code = 0
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
    raise typer.Exit(code)
