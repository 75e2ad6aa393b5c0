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


class GraphPass(enum.StrEnum):
    """Which CUDA-graph capture pass a ``Capture ... begin`` line opened. Values are stable.

    SGLang captures several passes one after another, each taking memory from what the one
    before left: 0.5.23 target prefill -> target decode (target *verify* with speculative
    decoding) -> draft prefill -> draft decode (only with ``--speculative-num-steps`` > 1) ->
    draft extend; 0.5.10 target graphs, then the draft model's weights and pool, then its
    draft decode and draft extend graphs. The progress bar never names the pass, so the pass
    of a failure is the one of the last ``begin`` line.
    """

    TARGET_PREFILL = "target_prefill"
    TARGET_DECODE = "target_decode"
    TARGET_VERIFY = "target_verify"
    DRAFT_PREFILL = "draft_prefill"
    DRAFT_DECODE = "draft_decode"
    DRAFT_EXTEND = "draft_extend"

    @property
    def is_draft(self) -> bool:
        return self.value.startswith("draft")
