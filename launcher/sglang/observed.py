"""What one attempt's log showed its memory components cost, per GPU: the ledger's observations.

Pure: built from the figures ``LogFollower`` read (``Numbers``, or its ``as_dict()`` as stored
in the ledger and carried by the ``attempt.ended`` event). The lines behind each figure
(SGLang 0.5.10 and 0.5.23 print them alike; verbatim examples in tests/sglang/test_observed.py):

- ``Load weight end. elapsed=31.02 s, type=Qwen3ForCausalLM, avail mem=106.75 GB, mem usage=30.73
  GB.`` -> ``weights_gib`` (the target's; a draft's ``type=...NextN/MTP/Eagle`` ->
  ``draft_weights_gib``), ``post_weights_avail_gib``;
- ``KV Cache is allocated. [dtype: torch.bfloat16, ]#tokens: 1106880, K size: 38.03 GB, V size:
  38.03 GB`` (or ``KV size: X GB`` for MLA) -> ``kv_tokens``, ``kv_pool_gib`` (a rank's second
  pool is the draft's: ``draft_kv_*``);
- ``Mamba Cache is allocated. max_mamba_cache_size: N, conv_state size: XGB, ssm_state size:
  YGB`` -> ``mamba_slots``, ``mamba_state_gib``;
- ``Capture <pass> CUDA graph end. [bs=[...], ]elapsed=.. s, mem usage=X GB, avail mem=Y GB.``
  -> ``graph_mem_gib[pass]``;
- ``max_total_num_tokens=..., ..., available_gpu_mem=X GB`` (at ready) -> ``ready_avail_gib``.

SGLang labels GiB "GB"; all figures here are GiB.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from launcher.sglang.outcome import Numbers

__all__ = ["GIB", "Observed", "speculative_key"]

GIB = float(2**30)


def _float(data: Mapping[str, Any], name: str) -> float | None:
    value = data.get(name)
    return None if value is None else float(value)


def _int(data: Mapping[str, Any], name: str) -> int | None:
    value = data.get(name)
    return None if value is None else int(value)


@dataclass(frozen=True)
class Observed:
    """One attempt's observed per-GPU costs; a field is None when the log did not show it
    (the attempt failed before that phase, or the version does not print it)."""

    weights_gib: float | None = None
    draft_weights_gib: float | None = None
    pre_load_avail_gib: float | None = None  # free before the weights: the GPU as SGLang saw it
    post_weights_avail_gib: float | None = None
    kv_tokens: int | None = None
    kv_pool_gib: float | None = None
    draft_kv_tokens: int | None = None
    draft_kv_pool_gib: float | None = None
    mamba_slots: int | None = None
    mamba_state_gib: float | None = None
    graph_mem_gib: Mapping[str, float] = field(default_factory=dict)  # GraphPass value -> GiB
    # The graph bs setting (the resolved cuda_graph_max_bs of the args dump), else the largest
    # batch size a capture line listed: what an estimate for this attempt was made for.
    graph_max_bs: int | None = None
    ready_avail_gib: float | None = None
    mem_fraction_static: float | None = None
    # Runtime OOM figures (a failed attempt): what torch tried to allocate and what was free.
    tried_gib: float | None = None
    free_gib: float | None = None

    @classmethod
    def from_numbers(cls, numbers: Numbers | Mapping[str, Any]) -> Observed:
        """From a ``Numbers`` or its ``as_dict()``; unknown or missing keys are ignored."""
        data = numbers.as_dict() if isinstance(numbers, Numbers) else numbers
        graphs = data.get("graph_mem_gib") or {}
        bs = _int(data, "cuda_graph_max_bs")
        return cls(
            weights_gib=_float(data, "weights_gib"),
            draft_weights_gib=_float(data, "draft_weights_gib"),
            pre_load_avail_gib=_float(data, "pre_load_avail_gib"),
            post_weights_avail_gib=_float(data, "post_weights_avail_gib"),
            kv_tokens=_int(data, "kv_tokens"),
            kv_pool_gib=_float(data, "kv_pool_gib"),
            draft_kv_tokens=_int(data, "draft_kv_tokens"),
            draft_kv_pool_gib=_float(data, "draft_kv_pool_gib"),
            mamba_slots=_int(data, "mamba_cache_size"),
            mamba_state_gib=_float(data, "mamba_state_gib"),
            graph_mem_gib={str(k): float(v) for k, v in dict(graphs).items()},
            graph_max_bs=bs if bs is not None else _int(data, "graph_captured_max_bs"),
            ready_avail_gib=_float(data, "ready_avail_gib"),
            mem_fraction_static=_float(data, "mem_fraction_static"),
            tried_gib=_float(data, "tried_gib"),
            free_gib=_float(data, "free_gib"),
        )

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> Observed:
        """The inverse of ``as_dict`` (the ledger's ``figures`` column)."""
        known = {k: v for k, v in data.items() if k in cls.__dataclass_fields__}
        known["graph_mem_gib"] = dict(known.get("graph_mem_gib") or {})
        return cls(**known)

    def as_dict(self) -> dict[str, Any]:
        """JSON-ready; None fields and an empty ``graph_mem_gib`` left out."""
        out: dict[str, Any] = {}
        for name in self.__dataclass_fields__:
            value = getattr(self, name)
            if isinstance(value, Mapping):
                if value:
                    out[name] = dict(value)
            elif value is not None:
                out[name] = value
        return out

    @property
    def empty(self) -> bool:
        """True when the log showed no cost at all (nothing worth recording)."""
        return not any(
            (self.weights_gib, self.kv_pool_gib, self.graph_mem_gib, self.ready_avail_gib,
             self.mamba_state_gib, self.tried_gib)
        )

    @property
    def kv_bytes_per_token(self) -> float | None:
        """The target pool's bytes per token per GPU (None without both figures).

        The log rounds the pool to 0.01 GiB, so this is within 0.01 GiB / #tokens.
        """
        if not self.kv_tokens or self.kv_pool_gib is None:
            return None
        return self.kv_pool_gib * GIB / self.kv_tokens

    @property
    def draft_kv_bytes_per_token(self) -> float | None:
        if not self.draft_kv_tokens or self.draft_kv_pool_gib is None:
            return None
        return self.draft_kv_pool_gib * GIB / self.draft_kv_tokens

    @property
    def mamba_gib_per_slot(self) -> float | None:
        if not self.mamba_slots or self.mamba_state_gib is None:
            return None
        return self.mamba_state_gib / self.mamba_slots

    def graph_gib_per_bs(self, pass_name: str) -> float | None:
        """What one batch-size step of ``pass_name`` cost, averaged over the capture (the
        pass's memory over ``graph_max_bs``)."""
        gib = self.graph_mem_gib.get(pass_name)
        if gib is None or not self.graph_max_bs:
            return None
        return gib / self.graph_max_bs


def speculative_key(numbers: Numbers | Mapping[str, Any]) -> str:
    """The speculative settings as one stable string, "" when off: e.g.
    ``"EAGLE3 steps=3 topk=1 draft=4"`` (from the log's server_args dump)."""
    data = numbers.as_dict() if isinstance(numbers, Numbers) else numbers
    algo = str(data.get("speculative_algorithm") or "")
    if not algo or algo.upper() in ("NONE", "NULL"):
        return ""
    parts = [algo.upper()]
    for label, name in (("steps", "speculative_num_steps"), ("topk", "speculative_eagle_topk"),
                        ("draft", "speculative_num_draft_tokens")):
        if data.get(name) is not None:
            parts.append(f"{label}={int(data[name])}")
    return " ".join(parts)
