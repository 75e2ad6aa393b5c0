"""The SGLang command line and environment of one attempt, in the dialect of its version."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING

from launcher.params import LaunchParams
from launcher.sglang.flags import hidden_args_argv, params_argv
from launcher.untrusted import MASK

if TYPE_CHECKING:
    from launcher.config.schema import ServerConfig



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
