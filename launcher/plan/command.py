"""The SGLang command line and environment of one attempt, in the dialect of its version."""

from __future__ import annotations

import itertools
import shlex
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING

from launcher.params import LaunchParams
from launcher.sglang.flags import PARAM_FLAGS, PARAM_SWITCHES, PARAM_TYPES, hidden_args_argv
from launcher.sglang.flags import SPEC_V2_ENV as SPEC_V2_ENV
from launcher.sglang.flags import env_is_read as env_is_read
from launcher.sglang.flags import graph_bs_flag as graph_bs_flag
from launcher.sglang.flags import mamba_strategy_flag as mamba_strategy_flag

if TYPE_CHECKING:
    from launcher.config.schema import ServerConfig

MASK = "***"


def params_argv(params: LaunchParams, sglang_version: str) -> list[str]:
    """The flags ``params`` set, in the dialect of ``sglang_version`` (None fields: none)."""
    argv: list[str] = []
    if params.mem_fraction_static is not None:
        argv += ["--mem-fraction-static", f"{params.mem_fraction_static:.3f}".rstrip("0")]
    if params.cuda_graph_max_bs is not None:
        argv += [graph_bs_flag(sglang_version), str(params.cuda_graph_max_bs)]
    if params.max_running_requests is not None:
        argv += ["--max-running-requests", str(params.max_running_requests)]
    if params.mamba_strategy is not None:
        argv += [mamba_strategy_flag(sglang_version), params.mamba_strategy]
    if params.max_mamba_cache_size is not None:
        argv += ["--max-mamba-cache-size", str(params.max_mamba_cache_size)]
    if params.mamba_full_memory_ratio is not None:
        argv += ["--mamba-full-memory-ratio", f"{params.mamba_full_memory_ratio:g}"]
    if params.disable_overlap_schedule:
        argv.append(PARAM_SWITCHES["disable_overlap_schedule"])
    return argv


# Environment variables a relaunch's params may set (``LaunchParams.env``), recovered from an
# adopted attempt's env file.
PARAMS_ENV = ("SGLANG_DISABLE_DRAFT_EXTEND_CUDA_GRAPH", SPEC_V2_ENV)


def params_from_argv(words: Iterable[str], env_lines: Iterable[str] = ()) -> LaunchParams:
    """Inverse of ``params_argv`` over an attempt's recorded argv (either dialect), plus the
    ``PARAMS_ENV`` settings among ``export NAME='value'`` lines of its env file."""
    kw: dict[str, object] = {}
    argv = list(words)
    switches = {w.strip("'\"") for w in argv}
    for name, switch in PARAM_SWITCHES.items():
        if switch in switches:
            kw[name] = True
    for quoted_flag, raw in itertools.pairwise(argv):
        flag, value = quoted_flag.strip("'\""), raw.strip("'\"")
        field = PARAM_FLAGS.get(flag)
        if field is None:
            continue
        try:
            kw[field] = PARAM_TYPES[field](value)
        except ValueError:
            continue  # a flag name used as a value: not ours
    env: list[tuple[str, str]] = []
    for line in env_lines:
        parts = shlex.split(line) if line.startswith("export ") else []
        if len(parts) == 2 and "=" in parts[1]:
            name, value = parts[1].split("=", 1)
            if name in PARAMS_ENV:
                env.append((name, value))
    return LaunchParams(**kw, env=tuple(sorted(env)))  # type: ignore[arg-type]


@dataclass(frozen=True)
class NodeRank:
    """One node of a multi-node server: ``--nnodes``, ``--node-rank``, ``--dist-init-addr``."""

    nnodes: int
    rank: int
    dist_init_addr: str
    gated_launch_port: int | None = None  # SGLang >= 0.5.23's all-ranks-joined gate


@dataclass(frozen=True)
class ServerCommand:
    """Everything needed to start one attempt: argv, plain env, secret env (never in argv)."""

    argv: list[str]
    env: dict[str, str]
    secret_env: dict[str, str]

    def masked_env(self) -> dict[str, str]:
        """Plain env plus secret names with masked values, for display."""
        return {**self.env, **{k: MASK for k in self.secret_env}}


def build_command(
    *,
    command: list[str],
    model_path: str,
    tp: int,
    dp: int,
    port: int,
    listen: str,
    gpus: list[int],
    params: LaunchParams,
    sglang_version: str,
    served_model_name: str | None = None,
    extra_args: list[str] | None = None,
    env: Mapping[str, str] | None = None,
    secret_env: Mapping[str, str] | None = None,
    attempt: int = 1,
    server_name: str = "",
    node: NodeRank | None = None,
    hidden_flags: list[str] | None = None,
) -> ServerCommand:
    """Build the attempt's command line. Explicit params only; None leaves SGLang's auto value.

    ``hidden_flags`` (a server's ``secret_args``) are appended inside the process from their
    ``secret_env`` variables (``hidden_args_argv``): the command line never holds their values.

    ``params.env`` overrides ``env`` (a relaunch's own settings win over the configured ones).

    ``--log-level info`` is forced: at warning and above SGLang prints neither progress nor the
    ready line, and launcher would be blind.
    """
    argv = [*command, "--model-path", model_path]
    if served_model_name:
        argv += ["--served-model-name", served_model_name]
    argv += ["--tp-size", str(tp)]
    if dp > 1:
        argv += ["--dp-size", str(dp)]
    argv += ["--host", listen, "--port", str(port)]
    if node is not None:  # every rank runs the same line but for --node-rank
        argv += ["--nnodes", str(node.nnodes), "--node-rank", str(node.rank),
                 "--dist-init-addr", node.dist_init_addr]
        if node.gated_launch_port is not None:
            argv += ["--gated-launch-port", str(node.gated_launch_port)]
    argv += params_argv(params, sglang_version)
    argv += ["--log-level", "info"]
    argv += list(extra_args or [])
    if hidden_flags:
        wrapped = hidden_args_argv(command, hidden_flags, argv[len(command):])
        if wrapped is None:  # config validation refuses this; never fall back to argv
            raise ValueError("secret_args need a 'PYTHON -m MODULE' command")
        argv = wrapped
    full_env = {
        "CUDA_VISIBLE_DEVICES": ",".join(str(g) for g in gpus),
        **dict(env or {}),
        **dict(params.env),
        "LAUNCHER_SERVER": server_name,
        "LAUNCHER_ATTEMPT": str(attempt),
    }
    return ServerCommand(argv=argv, env=full_env, secret_env=dict(secret_env or {}))


def server_command(
    server: ServerConfig, params: LaunchParams, sglang_version: str,
    secret_env: Mapping[str, str], attempt: int = 1, node: NodeRank | None = None,
) -> ServerCommand:
    """``build_command`` for a configured server (the supervisor and `plan` share it);
    ``node`` for one rank of a multi-node server (``launcher.plan.multinode.rank_commands``)."""
    s = server
    return build_command(
        command=s.command, model_path=s.model_path, tp=s.tp, dp=s.dp, port=s.port,
        listen=s.listen, gpus=s.gpus, params=params, sglang_version=sglang_version,
        served_model_name=s.served_model_name, extra_args=s.extra_args, env=s.env,
        secret_env=secret_env, attempt=attempt, server_name=s.name, node=node,
        hidden_flags=list(s.secret_args),
    )
