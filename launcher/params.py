"""The memory knobs a relaunch may change."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True, order=True)
class LaunchParams:
    """``--mem-fraction-static`` and the decode CUDA-graph max batch size of one attempt.

    ``None`` means "not passed": SGLang picks its auto default. Once a log has shown the
    resolved value, the supervisor records the explicit value instead.
    """

    mem_fraction_static: float | None = None
    cuda_graph_max_bs: int | None = None

    def describe(self) -> str:
        mfs = "auto" if self.mem_fraction_static is None else f"{self.mem_fraction_static:.3f}"
        bs = "auto" if self.cuda_graph_max_bs is None else str(self.cuda_graph_max_bs)
        return f"mem_fraction_static={mfs} cuda_graph_max_bs={bs}"
