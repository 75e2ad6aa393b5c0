"""`launcher plan`: what `up` would launch, and the memory estimate behind it; nothing runs."""

from __future__ import annotations

import json
import posixpath
import shlex
from functools import partial
from typing import Annotated, Any

import anyio
import typer
import typer.core

from launcher.cli import inspection
from launcher.cli.app import (
    ConfigArg,
    JsonOpt,
    ServerOpt,
    err,
    error,
    guard,
    open_config,
    out,
    say,
    secrets_of,
    select_servers,
    short_params,
)
from launcher.cli.memview import bar_text, legend
from launcher.config.schema import (
    Config,
    ServerConfig,
    secret_arg_env,
    unreadable_secrets,
)
from launcher.errors import ConfigError
from launcher.memory.policy import capture_oom_ladder
from launcher.params import LaunchParams
from launcher.plan.first_attempt import Planned, estimate_servers, warm_start
from launcher.plan.multinode import rank_commands
from launcher.sglang.flags import mask_secret_flags
from launcher.sglang.versions import DEFAULT_VERSION, SUPPORTED_VERSIONS
from launcher.store.ledger import Ledger, ledger_path
from launcher.supervise.router import plan_rows as router_plan_rows


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
    config = guard(lambda: open_config(config_path))
    rows: list[dict[str, Any]] = []
    selected = guard(lambda: select_servers(config, server, config_path))
    # A secret that cannot be read here: plan, the dry run, is often run where the secrets
    # are not (a laptop, CI), so it still shows the launch, names the secret <unreadable>
    # and warns with the config error `check` and `up` would stop at (exit 2).
    try:
        secrets_of(config_path, config, selected)
    except ConfigError as exc:
        error(err, exc, "warning: `up` would refuse this here: ")
    unreadable = {(s.name, name) for s in selected for name in unreadable_secrets(s)}
    # The remembered params win in `up` (not in `up --fresh`); the estimate below is drawn
    # for them too.
    warm = {} if fresh else {
        s.name: found for s in selected
        if (found := guard(partial(_remembered_params, config, s))) is not None}
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
                "env": {k: "<unreadable>" if (s.name, k) in unreadable else v
                        for k, v in _planned_env(cmd.masked_env()).items()},
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
            say(out, (r["router"], "bold"), f" on {r['host']}  (router)")
            say(out, f"  command  {r['command']}")
            say(out, f"  run dir  {r['run_dir']}")
            for name, url in r["workers"].items():
                say(out, f"  worker   {name} = {url}  (registered once ready)")
            continue
        say(out, (r["server"], "bold"), f" on {r['host']}  (SGLang {r['sglang_version']}, "
             f"{r['version_source']})")
        say(out, f"  params   {short_params(r['params'])}  ({r['params_source']})")
        say(out, f"  command  {r['command']}")
        for k, v in r["env"].items():
            if k == _ATTEMPT_ENV:  # a placeholder, not a value: shown unquoted, explained
                say(out, f"  env      {k}={v}  (set at launch: the attempt's number)")
            elif v == "<unreadable>":
                say(out, f"  env      {k}={v}  (this secret cannot be read here: see above)")
            else:
                say(out, f"  env      {k}={shlex.quote(v)}")
        say(out, f"  run dir  {r['run_dir']}")
        for rank in r["ranks"][1:]:  # node 0's is the command above
            say(out, f"  rank {rank['rank']}   on {rank['host']}: {rank['command']}")
            say(out, f"           run dir {rank['run_dir']}")
        steps = " → ".join(
            f"{q['mem_fraction_static']}/{q['cuda_graph_max_bs']}" for q in r["oom_ladder"]
        )
        say(out, f"  after capture OOMs (fraction/graph bs): {steps or 'gives up'}")
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
    say(out, ("  first attempt", style), f"  {first.params.describe()}  ({first.source})")
    say(out, f"           {first.reason}")
    if first.choice is None:
        return
    b = first.choice.budget
    say(out, f"  memory   {first.memory_basis}")
    if first.estimate is not None and first.estimate.lora is not None:
        say(out, f"           {first.estimate.lora.describe()}")
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
