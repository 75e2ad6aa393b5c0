"""The command line's shared parts: the typer ``app`` every command registers on, the exit
codes, the consoles and how errors are shown, and the config and server selection every
command starts from. The command line is the only place that prints for people or exits.

Exit codes (the README's table; systemd/launcher@.service relies on them):

- 0 (EXIT_OK): done. `up`: stopped by SIGTERM/SIGINT, whether or not some server gave up,
  or `--until-ready` with every server ready. `status`: every server running and ready.
- 1 (EXIT_ERROR): an unexpected error (a bug, an unusable state directory, another `up` on
  the same state directory, which `up` and `down` refuse; a `down` still on it, for `up`).
  `check`, `down` and `diagnose` also use it for "problems found", `describe` for a host
  that could not be asked.
- 2 (EXIT_USAGE): a config or command-line error found before anything started (bad values,
  no servers configured, a malformed Slack webhook URL, an unreadable or binary log for
  `diagnose`).
- 3 (EXIT_NOT_READY): `status`: some configured server is not running and ready.
- 4 (EXIT_GAVE_UP): `up`: every server gave up, so nothing is left to supervise
  (`--until-ready`: some server gave up). systemd does not restart on it.
- 5 (EXIT_WONT_FIT): `up`: the memory estimate says some server cannot fit its GPUs (weights
  alone exceed them, or the KV pool would fall below the minimum); nothing was launched.
  `up --force` launches anyway (docs/memory.md).
- 6 (EXIT_LEASE_LOST): `up` with `[coordination]`: this launcher lost the lease (another box
  is, or is about to be, the active one); it stopped supervising and did nothing more on any
  host. systemd restarts it, and it stands by (docs/ha.md).
"""

from __future__ import annotations

import logging
import os
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Annotated, Any, NoReturn, Protocol, TypeVar

import anyio
import typer
import typer.core
from rich.console import Console
from rich.measure import Measurement
from rich.table import Table
from rich.text import Text

from launcher import __version__, daemon
from launcher.config.load import load_config
from launcher.config.placeholders import expand_placeholders
from launcher.config.schema import (
    Config,
    ServerConfig,
    SlackConfig,
    resolve_secret_env,
)
from launcher.errors import (
    ConfigError,
    LauncherError,
    LauncherException,
    LeaseLost,
    LogFormatError,
    UsageError,
    WontFit,
)
from launcher.hooks.logging import configure, on_journal
from launcher.hooks.slack import webhook_url_ok
from launcher.host.transport import make_transport
from launcher.host.transport.base import Transport
from launcher.store.coordination import CLIENT_REMEDY, client_missing
from launcher.untrusted import plain

EXIT_OK = 0


EXIT_ERROR = 1


EXIT_USAGE = 2


EXIT_NOT_READY = 3


EXIT_GAVE_UP = 4


EXIT_WONT_FIT = 5


EXIT_LEASE_LOST = 6


def _flags_untyped(params: list[Any]) -> list[Any]:
    """``params`` with every flag's metavar set to "": typer shows a metavar, when set, instead
    of the type, and a flag takes no value (typer 0.29 writes ``--json <bool>``)."""
    for p in params:
        if isinstance(p, typer.core.TyperOption) and p.is_flag and p.metavar is None:
            p.metavar = ""
    return params


def _usage_pieces(command: Any, ctx: Any) -> list[str]:
    """The usage line's pieces with arguments as ``CONFIG`` or ``[SERVER]`` (their metavar, or
    their name in capitals), where typer 0.29 writes a required one as ``{config_path}``. An
    explicit metavar is shown as given unless an environment variable can stand in for the
    argument (``[CONFIG]``): `logs`' SERVER is optional to click only so that
    `logs SERVER` can take its CONFIG from the environment."""
    pieces = [command.options_metavar] if command.options_metavar else []
    for p in command.get_params(ctx):
        if isinstance(p, typer.core.TyperArgument):
            name = p.metavar or (p.name or "").upper()
            optional = p.envvar or (not p.required and p.metavar is None)
            name = f"[{name}]" if optional and not name.startswith("[") else name
            pieces.append(name if p.nargs == 1 else f"{name}...")
        else:
            pieces.extend(p.get_usage_pieces(ctx))
    return pieces


class ConventionalHelp(typer.core.TyperCommand):
    """A `launcher` subcommand whose help reads like other Unix tools' (see _usage_pieces)."""

    def get_params(self, ctx: Any) -> list[Any]:
        return _flags_untyped(super().get_params(ctx))

    def collect_usage_pieces(self, ctx: Any) -> list[str]:
        return _usage_pieces(self, ctx)


class ConventionalGroupHelp(typer.core.TyperGroup):
    """`launcher` itself, with its subcommands' help conventions (`--help`, `--version`)."""

    def get_params(self, ctx: Any) -> list[Any]:
        return _flags_untyped(super().get_params(ctx))

    def collect_usage_pieces(self, ctx: Any) -> list[str]:
        return [*_usage_pieces(self, ctx), self.subcommand_metavar or "COMMAND [ARGS]..."]


EXIT_CODES_HELP = (
    "Exit codes: 0 ok (up: stopped by a signal; status: all ready); "
    "1 unexpected error, or problems found (check, down, diagnose); "
    "2 config or usage error; 3 status: some server not ready; 4 up: every server gave up; "
    "5 up: the memory estimate says a server cannot fit (nothing launched; --force); "
    "6 up: this launcher lost its coordination lease (docs/ha.md)."
)


app = typer.Typer(
    cls=ConventionalGroupHelp,
    add_completion=False,
    no_args_is_help=True,
    help="Bring SGLang servers up on GPU hosts over SSH and keep them up.",
    epilog=EXIT_CODES_HELP,
)


out = Console(soft_wrap=True)


err = Console(stderr=True, soft_wrap=True)


T = TypeVar("T")


CONFIG_ENV = "LAUNCHER_CONFIG"


# Optional on the command line: LAUNCHER_CONFIG stands in for it, like KUBECONFIG; open_config
# reports neither being given as a usage error naming both.
ConfigArg = Annotated[Path | None, typer.Argument(
    metavar="CONFIG", envvar=CONFIG_ENV, show_default=False,
    help="config.toml")]


ServerOpt = Annotated[
    list[str] | None, typer.Option("--server", "-s", help="Only these servers (repeatable).")
]


JsonOpt = Annotated[bool, typer.Option("--json", help="Machine-readable output.")]


def _print_version(value: bool) -> None:
    if value:
        out.print(f"launcher {__version__}", highlight=False)
        raise typer.Exit(EXIT_OK)


@app.callback()
def _setup(
    version: Annotated[bool, typer.Option(
        "--version", is_eager=True, callback=_print_version,
        help="Print launcher's version and exit.")] = False,
) -> None:
    """Commands other than `up` log warnings only, to stderr; `up` reconfigures. An SSH
    connection's retries are not shown: the command reports the host unreachable itself
    once they are spent (a raw event line is for `up`'s log, not a person's terminal)."""
    configure("console", stream=sys.stderr, level=logging.WARNING,
              drop=frozenset({"ssh.connect_retry"}))


def say(console: Console, *parts: str | tuple[str, str]) -> None:
    """Print ``parts`` on one line: plain strings verbatim, ``(text, style)`` styled.

    Nothing is parsed as rich markup and no control character gets through: config values,
    host output and server log lines reach the terminal as the characters they are (``[/]``
    or ``[link=...]`` included).
    """
    console.print(Text.assemble(*(plain(p) if isinstance(p, str) else (plain(p[0]), p[1])
                                  for p in parts)), highlight=False)


def row(table: Table, *cells: str | Text) -> None:
    """Add a row whose string cells are plain text (see say), never markup."""
    table.add_row(*(c if isinstance(c, Text) else Text(plain(c)) for c in cells))


def say_err(priority: int, *parts: str | tuple[str, str]) -> None:
    """``say(err, *parts)``; but when stderr is the journal (``$JOURNAL_STREAM``, as under
    systemd) each of its lines gets the sd-daemon ``<priority>`` prefix the event lines get,
    so the reason launcher stopped is in ``journalctl -p err`` and not an info line."""
    if not on_journal(sys.stderr):
        say(err, *parts)
        return
    text = plain("".join(p if isinstance(p, str) else p[0] for p in parts))
    sys.stderr.write("".join(f"<{priority}>{line}\n" for line in text.split("\n")))
    sys.stderr.flush()


def error(console: Console, exc: LauncherException, prefix: str = "") -> None:
    if console is err:
        say_err(3, prefix, (type(exc).__name__, "bold red"), f": {exc}")  # 3: err
        return
    say(console, prefix, (type(exc).__name__, "bold red"), f": {exc}")


def one_line(exc: LauncherException) -> str:
    """``exc``'s message without its remedy, on one line."""
    return " ".join(str(exc.args[0] if exc.args else exc).split())


def exit_code(exc: LauncherException) -> int:
    if isinstance(exc, WontFit):
        return EXIT_WONT_FIT
    if isinstance(exc, LeaseLost):
        return EXIT_LEASE_LOST
    return EXIT_USAGE if isinstance(exc, ConfigError | UsageError | LogFormatError) else EXIT_ERROR


def fail(exc: LauncherException) -> NoReturn:
    code = exit_code(exc)
    error(err, exc)
    raise typer.Exit(code)


def guard(fn: Callable[[], T]) -> T:
    try:
        return fn()
    except LauncherException as exc:
        fail(exc)


def open_config(path: Path | None) -> Config:
    if path is None:
        raise UsageError("no config given", remedy=f"pass CONFIG (the path of a config.toml) "
                         f"or set {CONFIG_ENV}=/path/to/config.toml")
    if not path.exists() and os.environ.get(CONFIG_ENV) == str(path):
        # Name where the path came from: a forgotten export is otherwise a riddle.
        raise UsageError(f"{CONFIG_ENV}={path}: no such file",
                         remedy=f"pass CONFIG, or point {CONFIG_ENV} at a config.toml "
                         f"(`unset {CONFIG_ENV}` to stop using it)")
    config = expand_placeholders(load_config(path), path)
    if not config.servers:  # every command needs one: none is an error, never a silent 0
        raise ConfigError(["servers: no servers configured; add a [[servers]] table"],
                          source=str(path))
    return config


def select_servers(config: Config, names: list[str] | None,
                   config_path: Path | None = None) -> list[ServerConfig]:
    """The servers ``--server`` names (all without it); a name the config lacks is a
    ConfigError headed with ``config_path``, as the config's other errors are."""
    source = str(config_path or "config")
    if not config.servers:
        raise ConfigError(["servers: no servers configured; add a [[servers]] table"],
                          source=source)
    if not names:
        return list(config.servers)
    try:
        return [config.server(n) for n in names]
    except ConfigError as exc:
        raise ConfigError(exc.problems, source=source) from None


def secrets_of(config_path: Path | None, config: Config,
               servers: list[ServerConfig]) -> dict[str, dict[str, str]]:
    """Each server's ``secret_env`` values by server name (``resolve_secret_env``). Error
    handling: one ConfigError for every secret that cannot be read, headed with the config
    file and naming servers by their index (``servers[0].secret_env.HF_TOKEN``), as the
    config's other errors are; values never appear."""
    values: dict[str, dict[str, str]] = {}
    problems: list[str] = []
    for s in servers:
        try:
            values[s.name] = resolve_secret_env(s)
        except ConfigError as exc:
            i = next(i for i, c in enumerate(config.servers) if c.name == s.name)
            problems += [p.replace(f"servers[{s.name}].", f"servers[{i}].", 1)
                         for p in exc.problems]
    if problems:
        raise ConfigError(problems, source=str(config_path or "config"))
    return values


def coordination_dsn(config_path: Path | None, config: Config) -> str | None:
    """With ``[coordination]``: the DSN its reference names (None without it). `up` and
    `check` ask before anything starts.

    Error handling: one ConfigError (exit 2, which the systemd unit does not restart),
    headed with the config file as ``secrets_of``'s is, for a DSN reference that cannot be
    read (``coordination.dsn: environment variable ... is not set``) and for a PostgreSQL
    client that cannot be imported here (its remedy ``pip install 'launcher[ha]'``)."""
    c = config.coordination
    if c is None:
        return None
    problems: list[str] = []
    why = client_missing()
    if why is not None:
        problems.append(f"coordination: [coordination] needs the PostgreSQL client asyncpg, "
                        f"which cannot be imported here ({why})")
    dsn = None
    try:
        dsn = c.resolve_dsn()
    except ConfigError as exc:
        problems += exc.problems
    if problems:
        problem = ConfigError(problems, source=str(config_path or "config"))
        if why is not None:
            problem.remedy = CLIENT_REMEDY
        raise problem
    return dsn


def labelled(params: str) -> str:
    """LaunchParams.describe() with the short labels of PARAMS columns (mfs=, bs=)."""
    return params.replace("mem_fraction_static=", "mfs=").replace("cuda_graph_max_bs=", "bs=")


def webhook_source(slack: SlackConfig) -> str:
    """Where the Slack webhook URL is read from, for messages (never its value: a secret)."""
    return ("LAUNCHER_SLACK__WEBHOOK (credential or variable)" if slack.webhook is not None
            else f"the file {slack.webhook_url_file}" if slack.webhook_url_file is not None
            else f"${slack.webhook_url_env}")


def check_webhook(slack: SlackConfig, webhook: str | None) -> None:
    """Exit 2 (a config error naming where the URL comes from and the fix) when ``webhook``
    is set but not an http(s) URL with a host; `up` and `check` share it."""
    if webhook is None or webhook_url_ok(webhook):
        return
    where = webhook_source(slack)
    problem = ConfigError([
        f"slack: the webhook URL from {where} is not an http(s) URL with a host "
        "(value not shown: it is a secret)"], source="slack")
    problem.remedy = (f"set {where} to https://hooks.slack.com/services/..., or unset it "
                      "to have messages logged instead")
    fail(problem)


class _OnAHost(Protocol):
    @property
    def host(self) -> str: ...


_Placed = TypeVar("_Placed", bound=_OnAHost)


async def per_server(config: Config, servers: list[ServerConfig],
                      fn: Callable[[ServerConfig, Transport], Any], *,
                      one_try: bool = False) -> list[Any]:
    """Run ``fn(server, transport)`` for every server concurrently, transports shared per host.
    ``one_try``: an SSH host that does not answer the first connection is unreachable at once
    (a look such as `status` or `check` reports it rather than retrying for a minute)."""
    transports = ({s.host: make_transport(config.host(s.host), connect_attempts=1)
                   for s in servers} if one_try else daemon.transports_for(config, servers))
    return await per_host(servers, fn, transports)


async def per_host(items: list[_Placed], fn: Callable[[_Placed, Transport], Any],
                   transports: dict[str, Transport]) -> list[Any]:
    """``fn(item, transports[item.host])`` for every item (a server, a router) concurrently:
    its result, or the LauncherError it raised, in ``items`` order. The transports are closed
    at the end."""
    results: list[Any] = [None] * len(items)
    try:
        async with anyio.create_task_group() as tg:
            for i, item in enumerate(items):
                async def one(i: int = i, item: _Placed = item) -> None:
                    try:
                        results[i] = await fn(item, transports[item.host])
                    except LauncherError as exc:
                        results[i] = exc
                tg.start_soon(one)
    finally:
        await daemon.close_transports(transports)
    return results


def dur(seconds: float | None) -> str:
    """``42s``, ``12m05s``, ``3h04m``, ``2d03h``: a duration in two units at most."""
    if seconds is None:
        return ""
    s = int(max(0.0, seconds))
    if s < 60:
        return f"{s}s"
    if s < 3600:
        return f"{s // 60}m{s % 60:02d}s"
    if s < 86400:
        return f"{s // 3600}h{s % 3600 // 60:02d}m"
    return f"{s // 86400}d{s % 86400 // 3600:02d}h"


def to_ready(seconds: float | None) -> str:
    """A time to ready as `history`, `describe` and the events ("ready in 8s") all show it:
    rounded to the second (``dur`` alone cuts 7.6 s to 7s), empty when there is none."""
    return "" if seconds is None else dur(float(round(seconds)))


def short_params(params: dict[str, Any] | None) -> str:
    """``mfs=0.8 bs=8`` (``auto`` where SGLang chose); empty before the log shows them."""
    if not params:
        return ""
    mfs, bs = params.get("mem_fraction_static"), params.get("cuda_graph_max_bs")
    return (f"mfs={'auto' if mfs is None else f'{mfs:g}'} "
            f"bs={'auto' if bs is None else bs}")


def print_table(console: Console, table: Table) -> None:
    """Print ``table``; off a terminal at its natural width, so that nothing is cut to 80
    columns for a pipe or a file (the terminal's width otherwise)."""
    if console.is_terminal:
        console.print(table)
        return
    wide = console.options.update_width(1 << 16)
    width = console.width  # print(width=) is capped at the console's width: widen it
    console.width = max(width, Measurement.get(console, wide, table).maximum)
    try:
        console.print(table)
    finally:
        console.width = width


def config_and_server(config_path: Path | None, server_name: str | None,
                       command: str = "logs") -> tuple[Path | None, str]:
    """CONFIG and SERVER of `logs CONFIG SERVER`, or of `logs SERVER` with the config in
    $LAUNCHER_CONFIG (click gives the lone argument to CONFIG: it comes first)."""
    if server_name is not None or config_path is None:  # open_config reports a missing config
        return config_path, server_name or ""
    from_env = os.environ.get(CONFIG_ENV)
    if from_env and config_path is not None and str(config_path) != from_env:
        return Path(from_env), str(config_path)
    fail(UsageError(f"`launcher {command} {config_path}`: SERVER missing ({CONFIG_ENV} is "
                     "not set, so the one argument is the CONFIG)",
                     remedy=f"`launcher {command} CONFIG SERVER`, or `launcher {command} "
                     f"SERVER` with {CONFIG_ENV} set"))
