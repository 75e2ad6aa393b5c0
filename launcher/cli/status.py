"""`launcher status` and `launcher describe`: what runs where, as the hosts and the ledger
say."""

from __future__ import annotations

import io
import json
import sys
import time
from datetime import UTC, datetime
from functools import partial
from pathlib import Path
from typing import Annotated, Any, NoReturn

import anyio
import typer
import typer.core
from rich.console import Console, Group
from rich.live import Live
from rich.table import Table
from rich.text import Text

from launcher import daemon
from launcher.cli import inspection
from launcher.cli.app import (
    CONFIG_ENV,
    EXIT_ERROR,
    EXIT_NOT_READY,
    EXIT_OK,
    ConfigArg,
    JsonOpt,
    ServerOpt,
    config_and_server,
    coordination_dsn,
    dur,
    err,
    fail,
    guard,
    open_config,
    out,
    per_server,
    print_table,
    row,
    say,
    select_servers,
    short_params,
    to_ready,
)
from launcher.config.schema import (
    Config,
    ServerConfig,
    resolve_router_api_key,
)
from launcher.errors import (
    LauncherError,
    UsageError,
)
from launcher.host.transport import make_transport
from launcher.store.coordination import (
    CLIENT_REMEDY,
    EngineUnavailable,
    Membership,
    PgEngine,
    client_missing,
)
from launcher.supervise.router import router_status
from launcher.untrusted import plain

_STATE_STYLE = {"ready": "green", "starting": "yellow", "unhealthy": "red", "gave up": "red",
                "unreachable": "red", "unknown": "red"}


def _status_table(rows: list[inspection.ServerStatus], config: Config, wide: bool) -> Table:
    table = Table(box=None, pad_edge=False)
    cols = ["NAME", "HOST", "STATE", "ENDPOINT", "ATTEMPT", "RESTARTS", "PARAMS", "AGE"]
    if wide:
        cols += ["PID", "PHASE", "HEALTH", "MODEL", "RUN DIR"]
    for col in cols:
        table.add_column(col, no_wrap=True)
    for r in rows:
        cells: list[str | Text] = [
            r.server, r.host, Text(plain(r.state), style=_STATE_STYLE.get(r.state, "")),
            r.endpoint, "" if r.attempt is None else str(r.attempt),
            "" if r.restarts is None else str(r.restarts),
            short_params(r.params) if not wide or not r.params
            else " ".join(f"{k}={'auto' if v is None else v}" for k, v in r.params.items()),
            dur(r.age_s)]
        if wide:
            model = config.server(r.server).model_path.rstrip("/").rsplit("/", 1)[-1]
            health = {None: "", True: "ok", False: "failing"}[r.healthy]
            cells += [str(r.pid or ""), r.phase or "", health, model, r.run_dir or ""]
        row(table, *cells)
    return table


def _status_rows(config: Config, servers: list[ServerConfig]) -> list[inspection.ServerStatus]:
    now = datetime.now(UTC).timestamp()
    results = anyio.run(partial(per_server, one_try=True), config, servers,
                        lambda s, t: inspection.server_status(config, s, t, now=now))
    return [inspection.unreachable_status(config, s, r, now=now)
            if isinstance(r, LauncherError) else r
            for s, r in zip(servers, results, strict=True)]


def _status_code(rows: list[inspection.ServerStatus]) -> int:
    # Like `systemctl status`: 0 only when everything asked about is up (running, ready and
    # not failing its health check), 3 otherwise, a host that cannot be asked included.
    up = all(r.error is None and r.running and r.ready and r.healthy is not False for r in rows)
    return EXIT_OK if up else EXIT_NOT_READY


def _status_errors(console: Console, rows: list[inspection.ServerStatus]) -> None:
    for r in rows:
        if r.error is not None:
            say(console, (f"{r.server}", "bold"), f" on {r.host}: ", (r.state, "red"),
                 f": {r.error}")
        elif r.gave_up is not None:
            when = "before launching" if r.gave_up_before_launch else f"at attempt {r.attempt}"
            say(console, (f"{r.server}", "bold"), f" gave up {when}: {r.gave_up}")


def status(
    config_path: ConfigArg = None, server: ServerOpt = None, as_json: JsonOpt = False,
    output: Annotated[str | None, typer.Option(
        "--output", "-o", metavar="FORMAT",
        help="wide (more columns: pid, phase, health, model, run dir) or json.")] = None,
    watch: Annotated[bool, typer.Option(
        "--watch", "-w", help="Keep watching: redraw (a terminal) or print each change.")
    ] = False,
    interval: Annotated[float, typer.Option(
        "--interval", min=0.1, metavar="SECONDS", help="--watch's refresh interval.")] = 2.0,
) -> None:
    """Per server: state, endpoint, attempt, restarts, params and age (like `kubectl get`).

    STATE is starting, ready, unhealthy, stopped (on request: `down`, `up --stop-on-exit`;
    AGE is then how long it ran), exited (N), gave up, not started or unreachable; an
    unreachable host's error is printed under the table. RESTARTS counts the failed attempts
    before the newest one (from the attempt ledger).

    Exits 0 only when every server is running and ready, else 3."""
    if output not in (None, "wide", "json"):
        fail(UsageError(f"--output {output!r}", remedy="use -o wide or -o json"))
    if as_json and output == "wide":
        fail(UsageError("--output wide and --json ask for two formats",
                        remedy="give one: -o wide (the table with more columns) or --json"))
    as_json = as_json or output == "json"
    config = guard(lambda: open_config(config_path))
    servers = guard(lambda: select_servers(config, server, config_path))
    if watch:
        _watch_status(config, servers, output == "wide", as_json, interval)
    rows = _status_rows(config, servers)
    router_rows = guard(lambda: _router_rows(config, server))
    coordination = guard(lambda: _coordination(config_path, config))
    if as_json:
        out.print_json(json.dumps([r.as_dict() for r in rows] + router_rows
                                  + ([{"coordination": coordination}] if coordination else [])))
    else:
        print_table(out, _status_table(rows, config, output == "wide"))
        _status_errors(err, rows)
        if router_rows:
            print_table(out, _router_table(router_rows))
        if coordination:
            out.print(Text(_coordination_line(coordination)))
    raise typer.Exit(_status_code(rows))


def _coordination(config_path: Path | None, config: Config) -> dict[str, Any] | None:
    """With ``[coordination]``: the lease's active box and the standbys, as the database
    sees them (``error`` instead when it cannot be asked); None without it."""
    c = config.coordination
    if c is None:
        return None
    missing = client_missing()
    if missing is not None:
        return {"lease": c.lease, "error": f"the PostgreSQL client cannot be imported "
                f"({missing}); fix: {CLIENT_REMEDY}"}
    dsn = coordination_dsn(config_path, config)  # a config error: headed with the file
    assert dsn is not None
    engine = PgEngine(dsn, lease=c.lease, holder="status", box=c.box, ttl=c.ttl)

    async def ask() -> Membership:
        try:
            with anyio.fail_after(10.0):
                return await engine.membership()
        finally:
            engine.drop()

    try:
        seen = anyio.run(ask)
    except (EngineUnavailable, TimeoutError) as exc:
        return {"lease": c.lease, "error": str(exc)}
    active = seen.active
    return {
        "lease": c.lease,
        "active": None if active is None else {
            "box": active.box, "pid": active.pid, "token": seen.lease.token,
            "lease_left_s": round(seen.lease.remaining_s or 0.0, 1)},
        "standbys": [{"box": m.box, "pid": m.pid, "heard_s_ago": round(m.age_s, 1)}
                     for m in seen.standbys],
    }


def _coordination_line(view: dict[str, Any]) -> str:
    """``coordination (lease L): active BOX (token N, lease 7.1s left); standby: ...``."""
    head = f"coordination (lease {view['lease']}): "
    if "error" in view:
        return head + f"the database cannot be asked: {view['error']}"
    active = view["active"]
    text = head + ("no active launcher" if active is None else
                   f"active {active['box']} (pid {active['pid']}, token {active['token']}, "
                   f"lease {active['lease_left_s']}s left)")
    standbys = ", ".join(f"{m['box']} (pid {m['pid']}, heard {m['heard_s_ago']}s ago)"
                         for m in view["standbys"])
    return text + f"; standby: {standbys or 'none'}"


def _watch_status(config: Config, servers: list[ServerConfig], wide: bool, as_json: bool,
                  interval: float) -> NoReturn:
    """`status --watch`: on a terminal a table redrawn in place; else (or with --json) the
    table (one JSON array per line) printed again whenever it changed. Ctrl-C ends it with
    the exit code of the last look."""
    code = EXIT_NOT_READY
    last = ""
    live = Live(Text(""), console=out, auto_refresh=False) if out.is_terminal else None
    try:
        if live is not None and not as_json:
            live.start()
        while True:
            rows = _status_rows(config, servers)
            code = _status_code(rows)
            if as_json:
                text = json.dumps([r.as_dict() | {"age_s": None} for r in rows])
                if text != last:
                    sys.stdout.write(json.dumps([r.as_dict() for r in rows]) + "\n")
                    sys.stdout.flush()
            else:
                table = _status_table(rows, config, wide)
                buffer = io.StringIO()
                _status_errors(Console(file=buffer, width=out.width), rows)
                shown = Group(table, Text(buffer.getvalue().rstrip("\n")))
                if live is not None:
                    live.update(shown, refresh=True)
                    text = ""
                else:
                    text = "|".join(f"{r.server} {r.state} {r.attempt} {r.error}" for r in rows)
                    if text != last:
                        print_table(out, table)
                        _status_errors(out, rows)
                        out.print()
                        sys.stdout.flush()
            last = text
            time.sleep(interval)
    except KeyboardInterrupt:
        pass
    finally:
        if live is not None and live.is_started:
            live.stop()
    raise typer.Exit(code)


def describe(
    config_path: ConfigArg = None,
    server_name: Annotated[str | None, typer.Argument(
        metavar="SERVER", show_default=False,
        help=f"The server (`describe SERVER` alone reads CONFIG from ${CONFIG_ENV}).")] = None,
    as_json: JsonOpt = False,
) -> None:
    """One server in detail (like `kubectl describe`): config, command line, run directory,
    current state, the last attempts with outcomes and evidence, recent events, the memory
    figures and the time to ready.

    Exits 0 once described (whatever its state), 1 when its host could not be asked (what
    the ledger knows is still shown)."""
    config_path, name = config_and_server(config_path, server_name, "describe")
    config = guard(lambda: open_config(config_path))
    s = guard(lambda: config.server(name))
    now = datetime.now(UTC).timestamp()
    path = config_path or Path()
    results = anyio.run(partial(per_server, one_try=True), config, [s],
                        lambda s, t: inspection.describe(config, path, s, t, now=now))
    d = results[0]
    if isinstance(d, LauncherError):
        st = inspection.unreachable_status(config, s, d, now=now)
        rows = inspection.ledger_rows(config, s.name) or []
        d = inspection.Description(str(path), s, st, None, {}, None, rows[:5],
                                   inspection.events_of(rows, 12))
    if as_json:
        out.print_json(json.dumps(d.as_dict()))
    else:
        _print_description(d)
    raise typer.Exit(EXIT_OK if d.status.error is None else EXIT_ERROR)


def _print_description(d: inspection.Description) -> None:
    st, s = d.status, d.server

    def field(label: str, value: object, style: str = "") -> None:
        if value is None or value == "":
            return
        say(out, (f"{label + ':':<15}", "bold"), (str(value), style) if style else str(value))

    field("Name", s.name)
    field("Config", d.config_path)
    field("Host", s.host)
    field("Endpoint", st.endpoint)
    field("Model", s.model_path)
    field("GPUs", ",".join(str(g) for g in s.gpus) + f"  (tp {s.tp}, dp {s.dp})")
    field("State", st.state, _STATE_STYLE.get(st.state, ""))
    if st.error is not None:
        field("Error", st.error.splitlines()[0], "red")
    field("Gave up", st.gave_up, "red")
    field("Attempt", st.attempt)
    field("Restarts", st.restarts)
    field("PID", st.pid)
    stopped = st.state == "stopped"
    field("Phase", f"{st.phase} (when stopped)" if stopped and st.phase else st.phase)
    field("Started", inspection.iso(st.started_at))
    field("Stopped", inspection.iso(st.ended_at))
    field("Ran for" if stopped else "Age", dur(st.age_s))
    field("Ready after", None if d.ready_s is None else to_ready(d.ready_s))
    field("Params", short_params(st.params))
    field("Run dir", st.run_dir)
    field("Command", d.command)
    if d.numbers:
        say(out, ("Memory (from the newest attempt's log):", "bold"))
        for k, v in d.numbers.items():
            say(out, f"  {k.removesuffix('_gib'):<26} {v}{' GiB' if k.endswith('_gib') else ''}")
    if d.attempts:
        say(out, ("Attempts:", "bold"))
        table = Table(box=None, pad_edge=False)
        for col in ("  ATTEMPT", "STARTED", "PARAMS", "OUTCOME", "PHASE", "TO READY"):
            table.add_column(col, no_wrap=True)
        for r in d.attempts:
            row(table, f"  {r.attempt}", inspection.iso(r.started_at) or "",
                 short_params(r.params.as_dict()), r.outcome or "running", r.phase or "",
                 to_ready(r.seconds_to_ready))
        print_table(out, table)
        failed = next((r for r in d.attempts if r.evidence), None)
        if failed is not None:
            say(out, (f"Evidence (attempt {failed.attempt}, {failed.outcome}):", "bold"))
            for line in failed.evidence[:8]:
                say(out, f"  {line}")
    if d.events:
        say(out, ("Events:", "bold"))
        for at, text in d.events:
            say(out, f"  {inspection.iso(at)}  {text}")


def _router_rows(config: Config, server: list[str] | None) -> list[dict[str, Any]]:
    """Each router's status row (none with --server); a host that cannot be asked is an
    ``error`` row."""
    if server or not config.routers:
        return []

    async def ask() -> list[dict[str, Any]]:
        transports = {r.host: make_transport(config.host(r.host)) for r in config.routers}
        rows: list[dict[str, Any]] = []
        try:
            for r in config.routers:
                try:
                    key = resolve_router_api_key(r)
                    rows.append(await router_status(config, r, transports[r.host], key))
                except LauncherError as exc:
                    rows.append({"router": r.name, "host": r.host, "error": str(exc)})
        finally:
            await daemon.close_transports(transports)
        return rows

    return anyio.run(ask)


def _router_table(rows: list[dict[str, Any]]) -> Table:
    table = Table(box=None, pad_edge=False)
    for col in ("router", "host", "running", "pid", "attempt", "healthy", "workers"):
        table.add_column(col)
    for r in rows:
        if "error" in r:
            row(table, r["router"], r["host"], Text(plain(r["error"]), style="red"))
            continue
        workers = r["workers_error"] or ", ".join(f"{k}: {v}" for k, v in r["workers"].items())
        row(table, r["router"], f"{r['host']}:{r['port']}", "yes" if r["running"] else "no",
             str(r["pid"] or ""), str(r["attempt"] or ""),
             {None: "", True: "yes", False: "no"}[r["healthy"]], workers)
    return table
