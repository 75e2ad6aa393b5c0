"""What identifies a supervised server to a person or a dashboard: the facts Slack messages
and the metrics' info series carry, built in one place so both say the same thing.

Pure: no I/O beyond ``socket.gethostname()`` in ``operator_box``.
"""

from __future__ import annotations

import socket
from dataclasses import dataclass

from launcher.config.schema import HostConfig, ServerConfig

__all__ = ["ServerFacts", "endpoint", "model_name", "operator_box"]


def endpoint(server: ServerConfig, host: HostConfig | None = None) -> str:
    """``ADDRESS:PORT`` (IPv6 as ``[ADDRESS]:PORT``) where clients reach ``server`` on
    ``host`` (its config entry): for a local host the server's listen address (loopback when
    it listens on every address), else the host's ``address``, else the host's name.
    The one answer for `status`, Slack and metrics alike."""
    if host is not None and host.transport == "local":
        address = {"0.0.0.0": "127.0.0.1", "::": "::1"}.get(server.listen, server.listen)
    elif host is not None and host.address:
        address = host.address
    else:
        address = server.host
    return f"[{address}]:{server.port}" if ":" in address else f"{address}:{server.port}"


def model_name(server: ServerConfig) -> str:
    """The model as people name it: ``served_model_name``, else the last part of
    ``model_path`` (``/models/Llama-3.1-70B-Instruct/`` → ``Llama-3.1-70B-Instruct``), never a
    full path (it says where the weights lie, not what runs, and it is long)."""
    if server.served_model_name:
        return server.served_model_name
    parts = [p for p in server.model_path.replace("\\", "/").split("/") if p]
    return parts[-1] if parts else server.model_path


def operator_box() -> str:
    """This machine's host name: where the launcher that sent a message or serves metrics runs."""
    return socket.gethostname() or "?"


@dataclass(frozen=True)
class ServerFacts:
    """One server as messages and metrics label it.

    ``endpoint`` is ``ADDRESS:PORT`` as clients on the network reach it (the host's
    ``address``, else its name; for a local host the listen address); ``gpus`` the GPU indexes
    on that host (``0,1``); ``sglang_version`` "?" until detected.
    """

    host: str
    model: str
    endpoint: str = "?"
    gpus: str = "?"
    sglang_version: str = "?"

    @classmethod
    def of(
        cls, server: ServerConfig, host: HostConfig | None = None, sglang_version: str | None = None
    ) -> ServerFacts:
        """The facts of ``server`` on ``host`` (its config entry) running ``sglang_version``."""
        return cls(
            host=server.host,
            model=model_name(server),
            endpoint=endpoint(server, host),
            gpus=",".join(str(g) for g in server.gpus) or "?",
            sglang_version=sglang_version or server.sglang_version or "?",
        )
