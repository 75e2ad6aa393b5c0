"""How launcher runs things on a host: locally (``local``) or over SSH (``ssh``)."""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from launcher.config import HostConfig
    from launcher.transport.base import Transport


def make_transport(host: HostConfig) -> Transport:
    """The transport for ``host``: one per host, shared by every server on it."""
    if host.transport == "local":
        from launcher.transport.local import LocalTransport

        return LocalTransport(host.name, env=host.env)
    from launcher.transport.ssh import SSHTransport

    return SSHTransport.from_host_config(host)
