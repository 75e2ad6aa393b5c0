"""Start-up phases of an SGLang server, in the order SGLang goes through them."""

from __future__ import annotations

import enum


class Phase(enum.StrEnum):
    """Where a server is in its start-up. Values are stable: they appear in events and JSON."""

    INIT = "init"  # process started, args parsed, distributed init
    WEIGHTS = "weights"  # "Load weight begin" .. "Load weight end"
    KV_CACHE = "kv_cache"  # KV pool allocation
    CUDA_GRAPH = "cuda_graph"  # "Capture cuda graph begin" .. "end"
    WARMUP = "warmup"  # HTTP server up, warmup request in flight
    READY = "ready"  # "The server is fired up and ready to roll!"

    @property
    def order(self) -> int:
        return _ORDER.index(self)


_ORDER = list(Phase)
