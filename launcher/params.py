"""The knobs a relaunch may change."""

from __future__ import annotations

from dataclasses import dataclass, fields, replace
from typing import Any

# Set to "1" by the policy (0.5.23, when ``[policy] allow_disable_draft_extend_graph``) after a
# capture OOM that lowering the fraction and the graph bs cannot fix under speculative decoding.
DISABLE_DRAFT_EXTEND_ENV = "SGLANG_DISABLE_DRAFT_EXTEND_CUDA_GRAPH"


@dataclass(frozen=True, order=True)
class LaunchParams:
    """The memory settings of one attempt, rendered by ``launcher.plan.command`` per SGLang version.

    ``None`` means "not passed": SGLang picks its auto default. Once a log has shown the
    resolved value, the supervisor records the explicit value instead.

    - ``mem_fraction_static``: ``--mem-fraction-static``.
    - ``cuda_graph_max_bs``: ``--cuda-graph-max-bs`` (<= 0.5.10) / ``-decode`` (>= 0.5.15).
    - ``max_running_requests``: ``--max-running-requests``; with speculative decoding SGLang
      caps it at 48 when unset, and that cap also caps the captured graph batch sizes.
    - ``max_mamba_cache_size`` / ``mamba_full_memory_ratio``: hybrid (Mamba) state-cache knobs.
    - ``mamba_strategy``: ``--mamba-scheduler-strategy`` (<= 0.5.10) or
      ``--mamba-radix-cache-strategy`` (>= 0.5.15), the same choices but ``extra_buffer_lazy``.
    - ``disable_overlap_schedule``: ``True`` passes ``--disable-overlap-schedule`` (0.5.23's
      fix for ``no_buffer`` with the overlap schedule); ``None``/``False``: not passed.
    - ``env``: extra environment settings as sorted ``(name, value)`` pairs, e.g.
      ``SGLANG_DISABLE_DRAFT_EXTEND_CUDA_GRAPH=1`` or a prescribed ``SGLANG_ENABLE_SPEC_V2=1``.
      They override the server's configured ``env``.

    Speculative-decoding shape (steps, topk, draft tokens) is deliberately not here: it is the
    experiment, set in ``extra_args``, and never changed by launcher.
    """

    mem_fraction_static: float | None = None
    cuda_graph_max_bs: int | None = None
    max_running_requests: int | None = None
    max_mamba_cache_size: int | None = None
    mamba_full_memory_ratio: float | None = None
    mamba_strategy: str | None = None
    disable_overlap_schedule: bool | None = None
    env: tuple[tuple[str, str], ...] = ()

    def describe(self) -> str:
        """``mem_fraction_static=0.700 cuda_graph_max_bs=32``, plus any other field that is set."""
        mfs = "auto" if self.mem_fraction_static is None else f"{self.mem_fraction_static:.3f}"
        bs = "auto" if self.cuda_graph_max_bs is None else str(self.cuda_graph_max_bs)
        text = f"mem_fraction_static={mfs} cuda_graph_max_bs={bs}"
        for name, value in self.extras().items():
            if name == "env":
                text += " env=" + ",".join(f"{k}={v}" for k, v in self.env)
            else:
                text += f" {name}={value}"
        return text

    def extras(self) -> dict[str, Any]:
        """The fields other than the fraction and graph bs that are set (JSON-ready)."""
        out: dict[str, Any] = {}
        for f in fields(self):
            if f.name in ("mem_fraction_static", "cuda_graph_max_bs"):
                continue
            value = getattr(self, f.name)
            if value is None or value == () or value is False:
                continue
            out[f.name] = dict(value) if f.name == "env" else value
        return out

    def as_dict(self) -> dict[str, Any]:
        """JSON-ready: the fraction and graph bs always, the other fields when set."""
        return {
            "mem_fraction_static": self.mem_fraction_static,
            "cuda_graph_max_bs": self.cuda_graph_max_bs,
            **self.extras(),
        }

    def with_env(self, name: str, value: str) -> LaunchParams:
        """A copy with ``name=value`` in ``env`` (replacing an earlier value of ``name``)."""
        env = dict(self.env)
        env[name] = value
        return replace(self, env=tuple(sorted(env.items())))

    def env_value(self, name: str) -> str | None:
        return dict(self.env).get(name)

    @classmethod
    def from_extras(
        cls, mem_fraction_static: float | None, cuda_graph_max_bs: int | None,
        extras: dict[str, Any] | None,
    ) -> LaunchParams:
        """Inverse of ``as_dict`` (``extras`` as ``extras()`` gives it; unknown keys ignored)."""
        kw: dict[str, Any] = {}
        known = {f.name for f in fields(cls)}
        for name, value in (extras or {}).items():
            if name not in known or name in ("mem_fraction_static", "cuda_graph_max_bs"):
                continue
            kw[name] = tuple(sorted((str(k), str(v)) for k, v in value.items())) if (
                name == "env" and isinstance(value, dict)
            ) else value
        return cls(mem_fraction_static, cuda_graph_max_bs, **kw)
