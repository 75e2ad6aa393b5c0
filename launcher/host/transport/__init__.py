"""How launcher runs things on a host: locally (``local``) or over SSH (``ssh``)."""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from launcher.config.schema import HostConfig
    from launcher.host.transport.base import Transport


def make_transport(host: HostConfig, *, connect_attempts: int | None = None) -> Transport:
    """The transport for ``host``: one per host, shared by every server on it.
    ``connect_attempts``: SSH connection tries before a host counts as unreachable (default
    the transport's; 1 for a one-off command that should fail fast)."""
    if host.transport == "local":
        from launcher.host.transport.local import LocalTransport

        return LocalTransport(host.name, env=host.env)
    from launcher.host.transport.ssh import SSHTransport

    if connect_attempts is not None:
        return SSHTransport.from_host_config(host, retry_attempts=connect_attempts)
    return SSHTransport.from_host_config(host)
