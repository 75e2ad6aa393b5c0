"""The `launcher` command line. The only place that prints for people or exits.

Exit codes (the README's table; systemd/launcher@.service relies on them):

- 0 (EXIT_OK): done. `up`: stopped by SIGTERM/SIGINT, whether or not some server gave up,
  or `--until-ready` with every server ready. `status`: every server running and ready.
- 1 (EXIT_ERROR): an unexpected error (a bug, an unusable state directory, another `up` on
  the same state directory). `check`, `down` and `diagnose` also use it for "problems found",
  `describe` for a host that could not be asked.
- 2 (EXIT_USAGE): a config or command-line error found before anything started (bad values,
  no servers configured, a malformed Slack webhook URL, an unreadable log for `diagnose`).
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

import io
import json
import logging
import os
import posixpath
import shlex
import sys
import time
from collections.abc import Callable
from dataclasses import replace
from datetime import UTC, datetime
from functools import partial
from pathlib import Path
from typing import Annotated, Any, NoReturn, TextIO, TypeVar, cast

import anyio
import typer
import typer.core
from rich.console import Console, Group
from rich.live import Live
from rich.measure import Measurement
from rich.table import Table
from rich.text import Text

from launcher import __version__, daemon
from launcher.cli import inspection
from launcher.cli.memview import bar_text, legend
from launcher.config.load import load_config
from launcher.config.placeholders import expand_placeholders
from launcher.config.schema import (
    Config,
    ServerConfig,
    SlackConfig,
    default_state_dir,
    resolve_router_api_key,
    resolve_secret_env,
    secret_arg_env,
)
from launcher.errors import (
    ConfigError,
    HostUnreachable,
    LauncherError,
    LauncherException,
    LeaseLost,
    LogFormatError,
    RemoteCommandError,
    StateError,
    UsageError,
    WontFit,
)
from launcher.hooks.logging import Format, configure, on_journal
from launcher.hooks.messages import ServerInfo
from launcher.hooks.slack import SlackNotifier, webhook_url_ok
from launcher.host import preflight, run
from launcher.host.gpus import check_gpus
from launcher.host.preflight import path_exists
from launcher.host.transport import make_transport
from launcher.host.transport.base import Transport
from launcher.memory.estimate import observed_bar
from launcher.memory.policy import AttemptRecord, Bounds, capture_oom_ladder, next_params
from launcher.params import LaunchParams
from launcher.plan.first_attempt import Planned, estimate_servers, warm_start
from launcher.plan.multinode import rank_commands
from launcher.sglang.classify import diagnose_text
from launcher.sglang.flags import mask_secret_flags
from launcher.sglang.outcome import Diagnosis
from launcher.sglang.versions import DEFAULT_VERSION, SUPPORTED_VERSIONS
from launcher.store.coordination import EngineUnavailable, Membership, PgEngine
from launcher.store.ledger import Ledger, ledger_path
from launcher.store.lock import make_private_dir
from launcher.supervise import events
from launcher.supervise.ranks import stop_other_ranks
from launcher.supervise.router import plan_rows as router_plan_rows
from launcher.supervise.router import router_status, routers_for, stop_router
from launcher.supervise.supervisor import Snapshot
from launcher.untrusted import plain as _plain

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


class _ConventionalHelp(typer.core.TyperCommand):
    """A `launcher` subcommand whose help reads like other Unix tools' (see _usage_pieces)."""

    def get_params(self, ctx: Any) -> list[Any]:
        return _flags_untyped(super().get_params(ctx))

    def collect_usage_pieces(self, ctx: Any) -> list[str]:
        return _usage_pieces(self, ctx)


class _ConventionalGroupHelp(typer.core.TyperGroup):
    """`launcher` itself, with its subcommands' help conventions (`--help`, `--version`)."""

    def get_params(self, ctx: Any) -> list[Any]:
        return _flags_untyped(super().get_params(ctx))

    def collect_usage_pieces(self, ctx: Any) -> list[str]:
        return [*_usage_pieces(self, ctx), self.subcommand_metavar or "COMMAND [ARGS]..."]


_EXIT_CODES_HELP = (
    "Exit codes: 0 ok (up: stopped by a signal; status: all ready); "
    "1 unexpected error, or problems found (check, down, diagnose); "
    "2 config or usage error; 3 status: some server not ready; 4 up: every server gave up; "
    "5 up: the memory estimate says a server cannot fit (nothing launched; --force); "
    "6 up: this launcher lost its coordination lease (docs/ha.md)."
)

app = typer.Typer(
    cls=_ConventionalGroupHelp,
    add_completion=False,
    no_args_is_help=True,
    help="Bring SGLang servers up on GPU hosts over SSH and keep them up.",
    epilog=_EXIT_CODES_HELP,
)
out = Console(soft_wrap=True)
err = Console(stderr=True, soft_wrap=True)
T = TypeVar("T")

CONFIG_ENV = "LAUNCHER_CONFIG"
# Optional on the command line: LAUNCHER_CONFIG stands in for it, like KUBECONFIG; _open
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
    """Commands other than `up` log warnings only, to stderr; `up` reconfigures."""
    configure("console", stream=sys.stderr, level=logging.WARNING)


def _say(console: Console, *parts: str | tuple[str, str]) -> None:
    """Print ``parts`` on one line: plain strings verbatim, ``(text, style)`` styled.

    Nothing is parsed as rich markup and no control character gets through: config values,
    host output and server log lines reach the terminal as the characters they are (``[/]``
    or ``[link=...]`` included).
    """
    console.print(Text.assemble(*(_plain(p) if isinstance(p, str) else (_plain(p[0]), p[1])
                                  for p in parts)), highlight=False)


def _row(table: Table, *cells: str | Text) -> None:
    """Add a row whose string cells are plain text (see _say), never markup."""
    table.add_row(*(c if isinstance(c, Text) else Text(_plain(c)) for c in cells))


def _say_err(priority: int, *parts: str | tuple[str, str]) -> None:
    """``_say(err, *parts)``; but when stderr is the journal (``$JOURNAL_STREAM``, as under
    systemd) each of its lines gets the sd-daemon ``<priority>`` prefix the event lines get,
    so the reason launcher stopped is in ``journalctl -p err`` and not an info line."""
    if not on_journal(sys.stderr):
        _say(err, *parts)
        return
    text = _plain("".join(p if isinstance(p, str) else p[0] for p in parts))
    sys.stderr.write("".join(f"<{priority}>{line}\n" for line in text.split("\n")))
    sys.stderr.flush()


def _error(console: Console, exc: LauncherException, prefix: str = "") -> None:
    if console is err:
        _say_err(3, prefix, (type(exc).__name__, "bold red"), f": {exc}")  # 3: err
        return
    _say(console, prefix, (type(exc).__name__, "bold red"), f": {exc}")


def _one_line(exc: LauncherException) -> str:
    """``exc``'s message without its remedy, on one line."""
    return " ".join(str(exc.args[0] if exc.args else exc).split())


def _exit_code(exc: LauncherException) -> int:
    if isinstance(exc, WontFit):
        return EXIT_WONT_FIT
    if isinstance(exc, LeaseLost):
        return EXIT_LEASE_LOST
    return EXIT_USAGE if isinstance(exc, ConfigError | UsageError | LogFormatError) else EXIT_ERROR


def _fail(exc: LauncherException) -> NoReturn:
    code = _exit_code(exc)
    _error(err, exc)
    raise typer.Exit(code)


def _guard(fn: Callable[[], T]) -> T:
    try:
        return fn()
    except LauncherException as exc:
        _fail(exc)


def _open(path: Path | None) -> Config:
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


def _selected(config: Config, names: list[str] | None) -> list[ServerConfig]:
    if not config.servers:
        raise ConfigError(["servers: no servers configured; add a [[servers]] table"])
    if not names:
        return list(config.servers)
    return [config.server(n) for n in names]


# --- diagnose / plan ------------------------------------------------------------------


_PARAM_NAMES = ("mem_fraction_static", "cuda_graph_max_bs")


def _parse_params(text: str | None) -> dict[str, float | int]:
    """``--params mem_fraction_static=0.85,cuda_graph_max_bs=32`` (dashes allowed in names)."""
    out: dict[str, float | int] = {}
    for item in (text or "").split(","):
        if not item.strip():
            continue
        name, sep, value = item.partition("=")
        key = name.strip().lstrip("-").replace("-", "_")
        if not sep or key not in _PARAM_NAMES:
            raise UsageError(
                f"--params: cannot read {item.strip()!r}",
                remedy="give name=value pairs separated by commas, names "
                + " and ".join(_PARAM_NAMES),
            )
        try:
            out[key] = float(value) if key == "mem_fraction_static" else int(value)
        except ValueError:
            raise UsageError(
                f"--params: {key}={value.strip()!r} is not a number",
                remedy="e.g. mem_fraction_static=0.85,cuda_graph_max_bs=32",
            ) from None
    mfs = out.get("mem_fraction_static")
    if mfs is not None and not 0 < mfs < 1:
        raise UsageError(
            f"--params: mem_fraction_static={mfs} is outside (0, 1)",
            remedy="give the fraction the server was launched with, e.g. 0.85",
        )
    return out


def _launched(
    diag: Diagnosis, given: dict[str, float | int]
) -> tuple[LaunchParams, dict[str, str]]:
    """The params the server was launched with: the log's server_args dump first, then
    ``--params``; and where each came from ("log", "--params" or "unknown")."""
    n = diag.numbers
    from_log = {
        "mem_fraction_static": n.mem_fraction_static,
        "cuda_graph_max_bs": n.cuda_graph_max_bs,
    }
    values: dict[str, float | int | None] = {}
    source: dict[str, str] = {}
    for key in _PARAM_NAMES:
        logged = from_log[key]
        values[key] = logged if logged is not None else given.get(key)
        source[key] = "log" if logged is not None else "--params" if key in given else "unknown"
    mfs, bs = values["mem_fraction_static"], values["cuda_graph_max_bs"]
    launched = LaunchParams(None if mfs is None else float(mfs), None if bs is None else int(bs))
    return launched, source


def _policy_next(
    diag: Diagnosis, launched: LaunchParams, sglang_version: str
) -> LaunchParams | str:
    record = AttemptRecord(launched, diag.outcome, diag.phase, diag.numbers)
    decision = next_params(launched, Bounds(), [record], sglang_version=sglang_version)
    return decision.params if decision.params is not None else decision.reason


# Not "--mamba-scheduler-strategy": 0.5.23 names it too, rejecting it as unrecognized.
_OLD_LOG_MARKS = ("server_args=ServerArgs(", "Init torch distributed begin")


def _log_version(text: str) -> str:
    """The SGLang version a log's shape suggests: 0.5.23 dumps its args as a dict and says
    "Init parallel"; older ones print ``ServerArgs(...)`` and "Init torch distributed" (their
    flag dialect is 0.5.10's). Without either, 0.5.23; ``--sglang-version`` overrides."""
    return "0.5.10" if any(mark in text for mark in _OLD_LOG_MARKS) else DEFAULT_VERSION


@app.command(cls=_ConventionalHelp, epilog=_EXIT_CODES_HELP)
def diagnose(
    logfile: Annotated[Path, typer.Argument(metavar="LOGFILE",
                                            help="An SGLang log (or its tail).")],
    as_json: JsonOpt = False,
    exit_status: Annotated[
        int | None, typer.Option("--exit-status", help="The process's exit status, if known.")
    ] = None,
    params: Annotated[
        str | None,
        typer.Option(
            "--params",
            help="Launch params the log does not show, e.g. "
            "mem_fraction_static=0.85,cuda_graph_max_bs=32 (the log's server_args win).",
        ),
    ] = None,
    sglang_version: Annotated[
        str | None,
        typer.Option("--sglang-version", help="The server's SGLang version (default: from the "
                     "log's shape, 0.5.10 or 0.5.23); advice uses its flag dialect."),
    ] = None,
) -> None:
    """Classify an SGLang start-up log: outcome, confidence, phase, evidence, advice."""
    given = _guard(lambda: _parse_params(params))
    try:
        text = logfile.read_bytes().decode("utf-8", errors="replace")
    except OSError as exc:
        _fail(
            UsageError(
                f"{logfile}: cannot read: {exc.strerror}",
                remedy="pass the path of an SGLang log file",
            )
        )
    version = sglang_version or _log_version(text)
    diag = diagnose_text(text, exit_status, sglang_version=version)
    data = diag.as_dict()
    if diag.outcome.is_memory:
        launched, source = _launched(diag, given)
        unknown = [k for k, v in source.items() if v == "unknown"]
        data["params_source"] = source
        if unknown:  # never invent them from assumed defaults
            data["next_params"] = None
            data["advice"] = (
                f"{diag.advice} Next attempt: not computed, the log does not show "
                f"{' and '.join(unknown)}; pass --params {unknown[0]}=..."
            )
        else:
            nxt = _policy_next(diag, launched, version)
            if isinstance(nxt, LaunchParams):
                data["next_params"] = nxt.as_dict()
                data["advice"] = f"{diag.advice} Next attempt: {nxt.describe()}."
            else:
                data["next_params"] = None
                data["advice"] = f"{diag.advice} Policy: {nxt}"
    observed = observed_bar(diag.numbers, diag.phase.value) if diag.outcome.is_memory else None
    data["memory"] = None
    if observed is not None:
        data["memory"] = [{**observed.bar.as_dict(), "broke": observed.broke,
                           "deficit_gib": None if observed.deficit_gib is None
                           else round(observed.deficit_gib, 2)}]
    if as_json:
        out.print_json(json.dumps(data))
    else:
        _say(out, ("outcome", "bold"), f"  {diag.outcome.value}  (phase {diag.phase.value}"
             f"{', rank ' + diag.rank if diag.rank else ''}; {diag.confidence.value})")
        _say(out, ("retry", "bold"), f"    {'yes' if diag.retryable else 'no'}")
        if data["numbers"]:
            nums = ", ".join(f"{k}={v}" for k, v in data["numbers"].items())
            _say(out, ("numbers", "bold"), f"  {nums}")
        _say(out, ("advice", "bold"), f"   {data['advice']}")
        for remark in diag.remarks:
            _say(out, ("note", "bold"), f"     {remark}")
        if observed is not None:
            _say(out, ("memory", "bold"), f"   as the log shows it; broke in {observed.broke}")
            out.print(bar_text(observed.bar, label=f"GPU {observed.bar.index}",
                               mfs=observed.mem_fraction_static,
                               deficit_gib=observed.deficit_gib), soft_wrap=True)
            out.print(legend(observed.bar), soft_wrap=True)
        if diag.evidence:
            _say(out, ("evidence", "bold"))
            for line in diag.evidence:
                _say(out, f"  {line}")
    raise typer.Exit(0 if diag.outcome.value == "ready" else 1)


def _remembered_params(config: Config, s: ServerConfig) -> tuple[LaunchParams, str] | None:
    """The ledger's last good params for this launch, which the next `up` starts ``s`` with
    (daemon.run's warm start), and why; None when the ledger has none. Without a configured
    SGLang version, the launch is looked up under each supported version (`up` detects it)."""
    path = ledger_path(config.state_dir)
    if not path.exists():
        return None
    versions = [s.sglang_version] if s.sglang_version else list(SUPPORTED_VERSIONS)
    with Ledger(path) as ledger:
        entry = warm_start(ledger, config, s, versions, fresh=False).last_good
    if entry is None:
        return None
    return entry.params, f"last good, {inspection.iso(entry.updated_at)}; `up --fresh` ignores them"


@app.command(cls=_ConventionalHelp, epilog=_EXIT_CODES_HELP)
def plan(
    config_path: ConfigArg = None, server: ServerOpt = None, as_json: JsonOpt = False,
    fresh: Annotated[bool, typer.Option(
        "--fresh", help="Plan as `up --fresh` starts: ignore remembered good params.")] = False,
) -> None:
    """Show each server's exact command line, env (secrets masked), run dir, OOM ladder, and
    its memory estimate: the first attempt's params and one bar per GPU (reads config.json,
    the weights' index and nvidia-smi on the host; docs/memory.md); then each router's
    command line and worker URLs (without --server). It plans what the next `up` starts
    with: the remembered good params when the ledger has them (unless --fresh)."""
    config = _guard(lambda: _open(config_path))
    rows: list[dict[str, Any]] = []
    selected = _guard(lambda: _selected(config, server))
    # The remembered params win in `up` (not in `up --fresh`); the estimate below is drawn
    # for them too.
    warm = {} if fresh else {
        s.name: found for s in selected
        if (found := _guard(partial(_remembered_params, config, s))) is not None}
    planned = anyio.run(partial(estimate_servers, config, selected, warm=warm))
    for s in selected:
        version = s.sglang_version or DEFAULT_VERSION
        first = planned[s.name]
        params, params_source = warm.get(s.name) or (
            first.params, f"{first.source}: see the estimate below")
        secrets = {k: "***" for k in [*s.secret_env, *secret_arg_env(s).values()]}
        ranks = _plan_ranks(config, s, params, version, secrets)
        cmd = rank_commands(config, s, params, version, secrets)[0][1]  # node 0's
        p = config.policy_for(s.name)
        ladder = capture_oom_ladder(
            params,
            p.bounds(),
            gpu_total_gib=None,
            tp=s.tp,
            sglang_version=version,
        )
        rows.append(
            {
                "server": s.name,
                "host": s.host,
                "sglang_version": version,
                "version_source": "config"
                if s.sglang_version
                else "detected on the host at launch",
                "argv": mask_secret_flags(cmd.argv),
                "command": shlex.join(mask_secret_flags(cmd.argv)),
                "env": _planned_env(cmd.masked_env()),
                "params": params.as_dict(),
                "params_source": params_source,
                "run_dir": posixpath.normpath(f"{config.run_dir_of(s)}/{s.name}")
                + "/<attempt>",
                "ranks": ranks,
                "oom_ladder": [
                    {
                        "mem_fraction_static": q.mem_fraction_static,
                        "cuda_graph_max_bs": q.cuda_graph_max_bs,
                    }
                    for q in ladder
                ],
                **_plan_memory(first),
            }
        )
    if not server:
        rows += router_plan_rows(config)
    if as_json:
        out.print_json(json.dumps(rows))
        return
    for r in rows:
        if "router" in r:
            _say(out, (r["router"], "bold"), f" on {r['host']}  (router)")
            _say(out, f"  command  {r['command']}")
            _say(out, f"  run dir  {r['run_dir']}")
            for name, url in r["workers"].items():
                _say(out, f"  worker   {name} = {url}  (registered once ready)")
            continue
        _say(out, (r["server"], "bold"), f" on {r['host']}  (SGLang {r['sglang_version']}, "
             f"{r['version_source']})")
        _say(out, f"  params   {_short_params(r['params'])}  ({r['params_source']})")
        _say(out, f"  command  {r['command']}")
        for k, v in r["env"].items():
            if k == _ATTEMPT_ENV:  # a placeholder, not a value: shown unquoted, explained
                _say(out, f"  env      {k}={v}  (set at launch: the attempt's number)")
            else:
                _say(out, f"  env      {k}={shlex.quote(v)}")
        _say(out, f"  run dir  {r['run_dir']}")
        for rank in r["ranks"][1:]:  # node 0's is the command above
            _say(out, f"  rank {rank['rank']}   on {rank['host']}: {rank['command']}")
            _say(out, f"           run dir {rank['run_dir']}")
        steps = " → ".join(
            f"{q['mem_fraction_static']}/{q['cuda_graph_max_bs']}" for q in r["oom_ladder"]
        )
        _say(out, f"  after capture OOMs (fraction/graph bs): {steps or 'gives up'}")
        _print_plan_memory(planned[r["server"]])


def _plan_memory(first: Planned) -> dict[str, Any]:
    """`plan --json`'s estimate keys: the first attempt and ``memory`` (one dict per GPU)."""
    data: dict[str, Any] = {
        "first_attempt": {"params": first.params.as_dict(), "source": first.source,
                          "reason": first.reason, "refused": first.refused},
        "memory": None,
        "no_estimate": first.no_estimate,
    }
    if first.choice is not None:
        b = first.choice.budget
        data["memory"] = [g.as_dict() for g in b.gpus]
        data["estimate"] = {
            "mem_fraction_static": b.mem_fraction_static,
            "cuda_graph_max_bs": b.cuda_graph_max_bs,
            "margin": first.choice.margin,
            "fits": b.fits,
            "problem": b.problem,
            "kv_tokens": b.kv_tokens,
            "lora_gib": round(b.lora_gib, 2),
            "lora": (first.estimate.lora.describe()
                     if first.estimate is not None and first.estimate.lora is not None else None),
            "headroom_gib": round(b.headroom_gib, 2),
            "pre_load_free_gib": round(b.pre_load_free_gib, 2),
            "basis": first.memory_basis,
        }
    return data


def _print_plan_memory(first: Planned) -> None:
    """The first attempt and one stacked bar per GPU (text from hosts appended, never markup)."""
    style = "red" if first.refused else "bold"
    _say(out, ("  first attempt", style), f"  {first.params.describe()}  ({first.source})")
    _say(out, f"           {first.reason}")
    if first.choice is None:
        return
    b = first.choice.budget
    _say(out, f"  memory   {first.memory_basis}")
    if first.estimate is not None and first.estimate.lora is not None:
        _say(out, f"           {first.estimate.lora.describe()}")
    for g in b.gpus:
        out.print(bar_text(g, mfs=b.mem_fraction_static), soft_wrap=True)
    if b.gpus:
        out.print(legend(b.gpus[0]), soft_wrap=True)


_ATTEMPT_ENV = "LAUNCHER_ATTEMPT"


def _planned_env(env: dict[str, str]) -> dict[str, str]:
    """``env`` as `plan` shows it: ``LAUNCHER_ATTEMPT`` is the number of the attempt `up`
    starts (numbered on from the host's run directories, not 1), known only then: it reads
    ``<attempt>``, like the run dir."""
    return {k: "<attempt>" if k == _ATTEMPT_ENV else v for k, v in env.items()}


def _plan_ranks(config: Config, s: ServerConfig, params: LaunchParams, version: str,
                secrets: dict[str, str]) -> list[dict[str, Any]]:
    """Every rank's host, command line and run dir (one entry, rank 0, for one host)."""
    return [
        {"rank": rank.rank, "host": rank.host, "argv": cmd.argv, "command": shlex.join(cmd.argv),
         "run_dir": f"{config.run_dir_of(s, rank.host)}/{rank.run_name}/<attempt>"}
        for rank, cmd in rank_commands(config, s, params, version, secrets)
    ]


# --- up ---------------------------------------------------------------------------------


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


def _view(snaps: list[Snapshot]) -> Table:
    """`up`'s live table: per server its state and time in it, progress in numbers, the stall
    budget left, the attempt, params, the server's own elapsed time, and a note (the last
    failure; why it gave up; how long its host has been unreachable)."""
    table = Table(box=None, pad_edge=False)
    for col in ("SERVER", "HOST", "STATE", "PROGRESS", "STALL LEFT", "ATTEMPT", "PARAMS",
                "ELAPSED"):
        table.add_column(col, no_wrap=True)
    # NOTE alone may shrink (the others are no_wrap); its text is one line cut with an
    # ellipsis (below): the full note is in up.log (issue 15: it folded onto four lines).
    table.add_column("NOTE", overflow="ellipsis")
    for s in snaps:
        color = {"ready": "green", "gave_up": "red"}.get(s.state, "yellow")
        state = s.state.replace("_", " ")
        if s.phase_s is not None and s.state not in ("gave_up", "stopped"):
            state += f" {_dur(s.phase_s)}"
        if s.state == "stopped" and s.pid is not None:
            state += " (left running)"  # supervision stopped; the server did not
        note = "; ".join(n for n in (s.last_failure, s.reason) if n)
        _row(table, s.server, s.host, Text(_plain(state), style=color), _progress_text(s),
             _dur(s.stall_left_s), str(s.attempt), _labelled(s.params), _dur(s.elapsed_s),
             Text(_plain(note), no_wrap=True, overflow="ellipsis"))
    return table


def _labelled(params: str) -> str:
    """LaunchParams.describe() with the short labels of PARAMS columns (mfs=, bs=)."""
    return params.replace("mem_fraction_static=", "mfs=").replace("cuda_graph_max_bs=", "bs=")


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
        foot = Text(_plain(f"events in full: {self.log_path}  ·  Ctrl-C stops supervising "
                           "(servers keep running)"), style="dim")
        return Group(_view(self._snaps), foot)


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
            value = _short_params(value) if isinstance(value, dict) else _labelled(str(value))
        parts.append(f"{key}={value}")
    stamp = str(event.get("timestamp", ""))[11:19]
    level = str(event.get("level", "info"))
    style = {"warning": "yellow", "error": "red", "critical": "red"}.get(level, "")
    server = str(event.get("server", "launcher"))
    text = Text.assemble((_plain(stamp), "dim"), " ", (_plain(server), "bold"), " ",
                         (_plain(name), style), " ", _plain(" ".join(parts)))
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


def _webhook_source(slack: SlackConfig) -> str:
    """Where the Slack webhook URL is read from, for messages (never its value: a secret)."""
    return ("LAUNCHER_SLACK__WEBHOOK (credential or variable)" if slack.webhook is not None
            else f"the file {slack.webhook_url_file}" if slack.webhook_url_file is not None
            else f"${slack.webhook_url_env}")


def _check_webhook(slack: SlackConfig, webhook: str | None) -> None:
    """Exit 2 (a config error naming where the URL comes from and the fix) when ``webhook``
    is set but not an http(s) URL with a host; `up` and `check` share it."""
    if webhook is None or webhook_url_ok(webhook):
        return
    where = _webhook_source(slack)
    problem = ConfigError([
        f"slack: the webhook URL from {where} is not an http(s) URL with a host "
        "(value not shown: it is a secret)"], source="slack")
    problem.remedy = (f"set {where} to https://hooks.slack.com/services/..., or unset it "
                      "to have messages logged instead")
    _fail(problem)


@app.command(cls=_ConventionalHelp, epilog=_EXIT_CODES_HELP)
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
        _fail(UsageError(f"--log-format {log_format!r}", remedy="use auto, json or console"))
    config = _guard(lambda: _open(config_path))
    servers = _guard(lambda: _selected(config, server))
    secrets = _guard(lambda: {s.name: resolve_secret_env(s) for s in servers})
    router_keys = _guard(lambda: {r.name: resolve_router_api_key(r)
                                  for r in routers_for(config, servers)})
    slack = config.slack or SlackConfig()
    webhook = _guard(lambda: slack.webhook_url())
    secret_values = [v for env in secrets.values() for v in env.values()]
    secret_values += [key for key in router_keys.values() if key]
    # Checked here, before anything starts: a malformed webhook URL is a config error (exit 2).
    _check_webhook(slack, webhook)
    notifier = _guard(lambda: SlackNotifier(
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
        log_file = _guard(lambda: _open_log(log_path))
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
        _error(err, exc)
        raise typer.Exit(_exit_code(exc)) from None
    for name, reason in result.gave_up:
        # The reason is SGLang's and the policy's text (a TOML snippet's [[servers]]): no markup.
        _say_err(3, (f"{name} gave up", "red"), f": {reason}")
    if result.left_running:
        _say_err(5, f"launcher exited; left running: {', '.join(result.left_running)} "
                 "(stop them with `launcher down`)")  # 5: notice
    raise typer.Exit(_up_exit_code(interrupted=result.interrupted, until_ready=until_ready,
                                   gave_up=[True] * len(result.gave_up)
                                   + [False] * (len(result.ready) - len(result.gave_up)),
                                   ready=result.ready))


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
            _fail(UsageError("history: CONFIG given twice (as an argument and as --config)",
                             remedy="`launcher history CONFIG [SERVER]`"))
        return config_opt, first
    if second is not None:
        return Path(first or ""), second
    if first is not None and Path(first).is_file():
        return Path(first), None
    return (Path(from_env) if from_env else None), first


@app.command(cls=_ConventionalHelp, epilog=_EXIT_CODES_HELP)
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
    if state_dir is None:
        state_dir = (_guard(lambda: _open(config_path)).state_dir if config_path
                     else default_state_dir(os.environ))
    path = ledger_path(state_dir)
    if not path.exists():
        _fail(UsageError(f"no attempt ledger at {path}",
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
        ttr = _to_ready(r.seconds_to_ready)
        _row(table, started, r.server, str(r.attempt), r.params.describe(),
             r.outcome or "running", r.phase or "", ttr)
    _print_table(out, table)


# --- down / status / logs / check ----------------------------------------------------


async def _per_server(config: Config, servers: list[ServerConfig],
                      fn: Callable[[ServerConfig, Transport], Any], *,
                      one_try: bool = False) -> list[Any]:
    """Run ``fn(server, transport)`` for every server concurrently, transports shared per host.
    ``one_try``: an SSH host that does not answer the first connection is unreachable at once
    (a look such as `status` or `check` reports it rather than retrying for a minute)."""
    transports = ({s.host: make_transport(config.host(s.host), connect_attempts=1)
                   for s in servers} if one_try else daemon.transports_for(config, servers))
    results: list[Any] = [None] * len(servers)
    try:
        async with anyio.create_task_group() as tg:
            for i, s in enumerate(servers):
                async def one(i: int = i, s: ServerConfig = s) -> None:
                    try:
                        results[i] = await fn(s, transports[s.host])
                    except LauncherError as exc:
                        results[i] = exc
                tg.start_soon(one)
    finally:
        await daemon.close_transports(transports)
    return results


@app.command(cls=_ConventionalHelp, epilog=_EXIT_CODES_HELP)
def down(config_path: ConfigArg = None, server: ServerOpt = None) -> None:
    """Stop servers cleanly (TERM, bounded wait, KILL) and check their GPUs were freed; then
    the routers (without --server)."""
    config = _guard(lambda: _open(config_path))
    servers = _guard(lambda: _selected(config, server))

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
            return f"stopped (pid {handle.pid}, {signals}) but GPUs not free: {'; '.join(problems)}"
        return f"stopped (pid {handle.pid}, {signals}); GPUs {s.gpus} free"

    results = anyio.run(_per_server, config, servers, stop_one)
    code = 0
    for s, r in zip(servers, results, strict=True):
        if isinstance(r, LauncherError):
            _error(err, r, f"{s.name}: ")
            code = 1
        else:
            _say(out, f"{s.name}: {r}")
            code = code or (1 if "not free" in r else 0)
    for name, line in _stop_routers(config) if not server else []:  # after their servers
        if isinstance(line, LauncherError):
            _error(err, line, f"{name}: ")
            code = 1
        else:
            _say(out, f"{name}: {line}")
    raise typer.Exit(code)


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


def _dur(seconds: float | None) -> str:
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


def _to_ready(seconds: float | None) -> str:
    """A time to ready as `history`, `describe` and the events ("ready in 8s") all show it:
    rounded to the second (``_dur`` alone cuts 7.6 s to 7s), empty when there is none."""
    return "" if seconds is None else _dur(float(round(seconds)))


def _short_params(params: dict[str, Any] | None) -> str:
    """``mfs=0.8 bs=8`` (``auto`` where SGLang chose); empty before the log shows them."""
    if not params:
        return ""
    mfs, bs = params.get("mem_fraction_static"), params.get("cuda_graph_max_bs")
    return (f"mfs={'auto' if mfs is None else f'{mfs:g}'} "
            f"bs={'auto' if bs is None else bs}")


_STATE_STYLE = {"ready": "green", "starting": "yellow", "unhealthy": "red", "gave up": "red",
                "unreachable": "red", "unknown": "red"}


def _print_table(console: Console, table: Table) -> None:
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


def _status_table(rows: list[inspection.ServerStatus], config: Config, wide: bool) -> Table:
    table = Table(box=None, pad_edge=False)
    cols = ["NAME", "HOST", "STATE", "ENDPOINT", "ATTEMPT", "RESTARTS", "PARAMS", "AGE"]
    if wide:
        cols += ["PID", "PHASE", "HEALTH", "MODEL", "RUN DIR"]
    for col in cols:
        table.add_column(col, no_wrap=True)
    for r in rows:
        cells: list[str | Text] = [
            r.server, r.host, Text(_plain(r.state), style=_STATE_STYLE.get(r.state, "")),
            r.endpoint, "" if r.attempt is None else str(r.attempt),
            "" if r.restarts is None else str(r.restarts),
            _short_params(r.params) if not wide or not r.params
            else " ".join(f"{k}={'auto' if v is None else v}" for k, v in r.params.items()),
            _dur(r.age_s)]
        if wide:
            model = config.server(r.server).model_path.rstrip("/").rsplit("/", 1)[-1]
            health = {None: "", True: "ok", False: "failing"}[r.healthy]
            cells += [str(r.pid or ""), r.phase or "", health, model, r.run_dir or ""]
        _row(table, *cells)
    return table


def _status_rows(config: Config, servers: list[ServerConfig]) -> list[inspection.ServerStatus]:
    now = datetime.now(UTC).timestamp()
    results = anyio.run(partial(_per_server, one_try=True), config, servers,
                        lambda s, t: inspection.server_status(config, s, t, now=now))
    return [inspection.unreachable_status(config, s, r) if isinstance(r, LauncherError) else r
            for s, r in zip(servers, results, strict=True)]


def _status_code(rows: list[inspection.ServerStatus]) -> int:
    # Like `systemctl status`: 0 only when everything asked about is up (running, ready and
    # not failing its health check), 3 otherwise, a host that cannot be asked included.
    up = all(r.error is None and r.running and r.ready and r.healthy is not False for r in rows)
    return EXIT_OK if up else EXIT_NOT_READY


def _status_errors(console: Console, rows: list[inspection.ServerStatus]) -> None:
    for r in rows:
        if r.error is not None:
            _say(console, (f"{r.server}", "bold"), f" on {r.host}: ", (r.state, "red"),
                 f": {r.error}")
        elif r.gave_up is not None:
            _say(console, (f"{r.server}", "bold"), f" gave up at attempt {r.attempt}: "
                 f"{r.gave_up}")


@app.command(cls=_ConventionalHelp, epilog=_EXIT_CODES_HELP)
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

    STATE is starting, ready, unhealthy, exited (N), gave up, not started or unreachable; an
    unreachable host's error is printed under the table. RESTARTS counts the failed attempts
    before the newest one (from the attempt ledger).

    Exits 0 only when every server is running and ready, else 3."""
    if output not in (None, "wide", "json"):
        _fail(UsageError(f"--output {output!r}", remedy="use -o wide or -o json"))
    as_json = as_json or output == "json"
    config = _guard(lambda: _open(config_path))
    servers = _guard(lambda: _selected(config, server))
    if watch:
        _watch_status(config, servers, output == "wide", as_json, interval)
    rows = _status_rows(config, servers)
    router_rows = _guard(lambda: _router_rows(config, server))
    coordination = _guard(lambda: _coordination(config))
    if as_json:
        out.print_json(json.dumps([r.as_dict() for r in rows] + router_rows
                                  + ([{"coordination": coordination}] if coordination else [])))
    else:
        _print_table(out, _status_table(rows, config, output == "wide"))
        _status_errors(err, rows)
        if router_rows:
            _print_table(out, _router_table(router_rows))
        if coordination:
            out.print(Text(_coordination_line(coordination)))
    raise typer.Exit(_status_code(rows))


def _coordination(config: Config) -> dict[str, Any] | None:
    """With ``[coordination]``: the lease's active box and the standbys, as the database
    sees them (``error`` instead when it cannot be asked); None without it."""
    c = config.coordination
    if c is None:
        return None
    engine = PgEngine(c.resolve_dsn(), lease=c.lease, holder="status", box=c.box, ttl=c.ttl)

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
                        _print_table(out, table)
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


@app.command(cls=_ConventionalHelp, epilog=_EXIT_CODES_HELP)
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
    config_path, name = _config_and_server(config_path, server_name, "describe")
    config = _guard(lambda: _open(config_path))
    s = _guard(lambda: config.server(name))
    now = datetime.now(UTC).timestamp()
    path = config_path or Path()
    results = anyio.run(partial(_per_server, one_try=True), config, [s],
                        lambda s, t: inspection.describe(config, path, s, t, now=now))
    d = results[0]
    if isinstance(d, LauncherError):
        st = inspection.unreachable_status(config, s, d)
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
        _say(out, (f"{label + ':':<15}", "bold"), (str(value), style) if style else str(value))

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
    field("Phase", st.phase)
    field("Started", inspection.iso(st.started_at))
    field("Age", _dur(st.age_s))
    field("Ready after", None if d.ready_s is None else _to_ready(d.ready_s))
    field("Params", _short_params(st.params))
    field("Run dir", st.run_dir)
    field("Command", d.command)
    if d.numbers:
        _say(out, ("Memory (from the newest attempt's log):", "bold"))
        for k, v in d.numbers.items():
            _say(out, f"  {k.removesuffix('_gib'):<26} {v}{' GiB' if k.endswith('_gib') else ''}")
    if d.attempts:
        _say(out, ("Attempts:", "bold"))
        table = Table(box=None, pad_edge=False)
        for col in ("  ATTEMPT", "STARTED", "PARAMS", "OUTCOME", "PHASE", "TO READY"):
            table.add_column(col, no_wrap=True)
        for r in d.attempts:
            _row(table, f"  {r.attempt}", inspection.iso(r.started_at) or "",
                 _short_params(r.params.as_dict()), r.outcome or "running", r.phase or "",
                 _to_ready(r.seconds_to_ready))
        _print_table(out, table)
        failed = next((r for r in d.attempts if r.evidence), None)
        if failed is not None:
            _say(out, (f"Evidence (attempt {failed.attempt}, {failed.outcome}):", "bold"))
            for line in failed.evidence[:8]:
                _say(out, f"  {line}")
    if d.events:
        _say(out, ("Events:", "bold"))
        for at, text in d.events:
            _say(out, f"  {inspection.iso(at)}  {text}")


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
            _row(table, r["router"], r["host"], Text(_plain(r["error"]), style="red"))
            continue
        workers = r["workers_error"] or ", ".join(f"{k}: {v}" for k, v in r["workers"].items())
        _row(table, r["router"], f"{r['host']}:{r['port']}", "yes" if r["running"] else "no",
             str(r["pid"] or ""), str(r["attempt"] or ""),
             {None: "", True: "yes", False: "no"}[r["healthy"]], workers)
    return table


def _config_and_server(config_path: Path | None, server_name: str | None,
                       command: str = "logs") -> tuple[Path | None, str]:
    """CONFIG and SERVER of `logs CONFIG SERVER`, or of `logs SERVER` with the config in
    $LAUNCHER_CONFIG (click gives the lone argument to CONFIG: it comes first)."""
    if server_name is not None or config_path is None:  # _open reports a missing config
        return config_path, server_name or ""
    from_env = os.environ.get(CONFIG_ENV)
    if from_env and config_path is not None and str(config_path) != from_env:
        return Path(from_env), str(config_path)
    _fail(UsageError(f"`launcher {command} {config_path}`: SERVER missing ({CONFIG_ENV} is "
                     "not set, so the one argument is the CONFIG)",
                     remedy=f"`launcher {command} CONFIG SERVER`, or `launcher {command} "
                     f"SERVER` with {CONFIG_ENV} set"))


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


@app.command(cls=_ConventionalHelp, epilog=_EXIT_CODES_HELP)
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
    config_path, name = _config_and_server(config_path, server_name)
    config = _guard(lambda: _open(config_path))
    s = _guard(lambda: config.server(name))

    async def show(s: ServerConfig, t: Transport) -> None:
        handle = await _attempt_handle(t, config.run_dir_of(s), s, attempt)
        offset = 0 if tail is None else await _tail_offset(t, handle, tail)
        if since is not None:
            now = await inspection.host_now(t)
            try:
                cutoff = inspection.since_cutoff(since, now)
            except ValueError as exc:
                raise UsageError(f"--since {since!r}: {exc}", remedy="e.g. --since 10m or "
                                 "--since '2026-12-01 17:02:03' (the host's local time)"
                                 ) from None
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
        results = anyio.run(_per_server, config, [s], show)
    except KeyboardInterrupt:
        raise typer.Exit(0) from None
    if isinstance(results[0], LauncherError):
        _fail(results[0])


@app.command(cls=_ConventionalHelp, epilog=_EXIT_CODES_HELP)
def check(config_path: ConfigArg = None, server: ServerOpt = None) -> None:
    """Validate the config (the Slack webhook's URL included) and preflight every server's
    host; launch nothing."""
    config = _guard(lambda: _open(config_path))
    servers = _guard(lambda: _selected(config, server))
    _guard(lambda: [resolve_secret_env(s) for s in servers])
    slack = config.slack or SlackConfig()
    webhook = _guard(lambda: slack.webhook_url())
    _check_webhook(slack, webhook)
    _say(out, "slack: ", ("ok", "green"), f"  webhook from {_webhook_source(slack)}"
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
        note = f" (running, pid {running.pid})" if running else ""
        return [f"SGLang {version}{note}", *problems]

    results = anyio.run(partial(_per_server, one_try=True), config, servers, one)
    code = 0
    for s, r in zip(servers, results, strict=True):
        if isinstance(r, LauncherError):
            _say(err, f"{s.name} on {s.host}: ", ("unreachable", "red") if isinstance(
                r, HostUnreachable) else (type(r).__name__, "red"), f": {_one_line(r)}")
            code = 1
            continue
        head, *problems = r
        mark = ("problems", "red") if problems else ("ok", "green")
        _say(out, f"{s.name} on {s.host}: ", mark, f"  {head}")
        for p in problems:
            _say(out, f"  - {p}")
        code = code or (1 if problems else 0)
    raise typer.Exit(code)


def main() -> None:
    """Console-script entry point."""
    app()


if __name__ == "__main__":  # pragma: no cover
    main()
