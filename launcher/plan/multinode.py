"""One SGLang server over several hosts: each rank's host, run-directory name and command.

A multi-node server (``nodes = ["gpu-a", "gpu-b"]`` in its ``[[servers]]`` table) runs the same
command on every node, differing only in ``--node-rank``; ``--nnodes`` and
``--dist-init-addr`` (node 0's address and ``dist_init_port``, or ``dist_init_addr``) are the
same everywhere (SGLang ``arg_groups/fields/parallel.py``; 0.5.10 ``server_args.py`` spells
them alike). ``gpus`` apply on each node; ``tp`` is global (TP16 over 2×8 GPUs: node 1 holds
TP8-15). Pure: no I/O. The supervision of the rank group is ``launcher.supervise.ranks``.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

from launcher.config.schema import Config, ServerConfig
from launcher.params import LaunchParams
from launcher.plan.command import NodeRank, ServerCommand, server_command

__all__ = ["Rank", "dist_init_addr", "rank_commands", "rank_run_name", "ranks_of"]


@dataclass(frozen=True)
class Rank:
    """One node of a server: its rank, its host's name, and the name of its run directory."""

    rank: int
    host: str
    run_name: str


def rank_run_name(server: str, rank: int) -> str:
    """The run-directory name of ``rank`` on its host: the server's own name on node 0 (so
    status, logs and adoption read it as for any server), ``<server>.node<rank>`` on the others
    (nodes sharing a home directory over NFS must not share attempt directories)."""
    return server if rank == 0 else f"{server}.node{rank}"


def ranks_of(server: ServerConfig) -> list[Rank]:
    """The server's ranks in order (one, rank 0, for a single-host server)."""
    return [Rank(r, host, rank_run_name(server.name, r))
            for r, host in enumerate(server.node_hosts)]


def dist_init_addr(config: Config, server: ServerConfig) -> str | None:
    """``--dist-init-addr`` of a multi-node server (None for one node): the configured
    ``dist_init_addr``, else node 0's address with ``dist_init_port``. A host without an
    address (``transport = "local"``) is 127.0.0.1; an IPv6 address gets brackets. An address
    that only this machine's ~/.ssh/config resolves must be replaced by ``dist_init_addr``."""
    if server.nnodes < 2:
        return None
    if server.dist_init_addr:
        return server.dist_init_addr
    host = config.host(server.node_hosts[0])
    address = host.address or "127.0.0.1"
    if ":" in address and not address.startswith("["):
        address = f"[{address}]"
    return f"{address}:{server.dist_init_port}"


def rank_commands(
    config: Config, server: ServerConfig, params: LaunchParams, sglang_version: str,
    secret_env: Mapping[str, str], attempt: int = 1,
) -> list[tuple[Rank, ServerCommand]]:
    """Every rank's command line for one attempt, node 0 first. A single-host server gets
    one command without the multi-node flags (exactly ``command.server_command``'s)."""
    addr = dist_init_addr(config, server)
    out: list[tuple[Rank, ServerCommand]] = []
    for rank in ranks_of(server):
        node = (NodeRank(server.nnodes, rank.rank, addr, server.gated_launch_port)
                if addr is not None else None)
        cmd = server_command(server, params, sglang_version, secret_env, attempt, node=node)
        out.append((rank, cmd))
    return out
