"""`launcher history`: the attempt ledger, read back."""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Annotated

import typer
import typer.core
from rich.table import Table

from launcher.cli import inspection
from launcher.cli.app import (
    CONFIG_ENV,
    JsonOpt,
    fail,
    guard,
    open_config,
    out,
    print_table,
    row,
    to_ready,
)
from launcher.config.schema import (
    default_state_dir,
)
from launcher.errors import (
    UsageError,
)
from launcher.store.ledger import Ledger, ledger_path


def _history_args(first: str | None, second: str | None, config_opt: Path | None
                  ) -> tuple[Path | None, str | None]:
    """CONFIG and SERVER of `history [CONFIG] [SERVER]`, which also keeps its older forms
    `history [SERVER] -c CONFIG` and `history [SERVER]` (the default state directory).

    Two arguments are CONFIG and SERVER. A lone argument is SERVER when ``-c`` is given; else
    CONFIG when it names a file; else SERVER, with the config from $LAUNCHER_CONFIG if set.
    Without arguments or ``-c``, the config is $LAUNCHER_CONFIG's, if set."""
    from_env = os.environ.get(CONFIG_ENV) or None
    if config_opt is not None:
        if second is not None:
            fail(UsageError("history: CONFIG given twice (as an argument and as --config)",
                             remedy="`launcher history CONFIG [SERVER]`"))
        return config_opt, first
    if second is not None:
        return Path(first or ""), second
    if first is not None and Path(first).is_file():
        return Path(first), None
    return (Path(from_env) if from_env else None), first


def history(
    first: Annotated[str | None, typer.Argument(
        metavar="[CONFIG]", show_default=False,
        help=f"config.toml, whose state_dir holds the ledger (default: ${CONFIG_ENV}, else "
        "the XDG state dir).")] = None,
    second: Annotated[str | None, typer.Argument(
        metavar="[SERVER]", show_default=False, help="Only this server's attempts.")] = None,
    config_opt: Annotated[Path | None, typer.Option(
        "--config", "-c", help="The config as an option (older form of CONFIG).")] = None,
    state_dir: Annotated[Path | None, typer.Option(
        "--state-dir", help="The state directory (default: the config's).")] = None,
    limit: Annotated[int, typer.Option("--limit", "-n", min=1)] = 50,
    as_json: JsonOpt = False,
) -> None:
    """Show the attempt ledger: every attempt with params, outcome, phase and timings."""
    config_path, server_name = _history_args(first, second, config_opt)
    config = (guard(lambda: open_config(config_path))
              if config_path and (state_dir is None or server_name is not None) else None)
    if config is not None and server_name is not None:  # a typo is an error, not an empty table
        guard(lambda: config.server(server_name))
    if state_dir is None:
        state_dir = config.state_dir if config is not None else default_state_dir(os.environ)
    path = ledger_path(state_dir)
    if not path.exists():
        fail(UsageError(f"no attempt ledger at {path}",
                         remedy="run `launcher up` first, or pass CONFIG or --state-dir"))
    with Ledger(path) as ledger:
        rows = ledger.history(server_name, limit=limit)
    if as_json:  # times as ISO 8601 in UTC, like the event log's
        out.print_json(json.dumps([r.as_dict() | {"started_at": inspection.iso(r.started_at),
                                                  "ended_at": inspection.iso(r.ended_at)}
                                   for r in rows]))
        return
    table = Table(box=None, pad_edge=False)
    for col in ("started", "server", "attempt", "params", "outcome", "phase", "to ready"):
        table.add_column(col, no_wrap=True)
    for r in rows:
        started = inspection.iso(r.started_at) or ""
        ttr = to_ready(r.seconds_to_ready)
        row(table, started, r.server, str(r.attempt), r.params.describe(),
             r.outcome or "running", r.phase or "", ttr)
    print_table(out, table)
