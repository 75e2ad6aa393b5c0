"""The priors: launcher's guesses for the memory no config and no failing log shows. Pure.

Two groups, one frozen value (:class:`Priors`):

- :class:`Coefficients`, the estimator's (:func:`launcher.memory.estimate.estimate` takes them
  as ``coeffs=``): the CUDA context, the CUDA graphs' fixed, per-token and per-graph costs, the
  draft's graphs, the warmup activations. ``fleetlearn`` and :mod:`launcher.memory.calibration`
  replace or scale them per (architecture, GPU model, SGLang version, speculative settings).
- the OOM policy's (:func:`launcher.memory.policy.next_params` takes them as ``priors=``): the
  warmup need after a capture OOM, the size of a capture pass not yet begun, the smallest
  useful KV pool, the cost of each captured graph after the first.

Every field states its source (``source`` in the field's metadata, :func:`sources`): the real
start-ups in ``tests/fixtures/real_startups/`` it was fitted on (case ids), an SGLang file:line,
or the benchmark that chose it. docs/memory.md has the table. A what-if (bench_frontier) builds
another value with :func:`dataclasses.replace`; nothing rebinds these at run time.
"""

from __future__ import annotations

from dataclasses import dataclass, field, fields, replace
from typing import Any

__all__ = [
    "DEFAULT_COEFFICIENTS",
    "DEFAULT_PRIORS",
    "HIDDEN_ONLY_COEFFICIENTS",
    "SOURCE_SHAPED_COEFFICIENTS",
    "Coefficients",
    "Priors",
    "sources",
]


def _prior(default: float, source: str) -> Any:
    """A float field with its source in the metadata."""
    return field(default=default, metadata={"source": source})


@dataclass(frozen=True)
class Coefficients:
    """The costs the config cannot give exactly: the cold prior, per rank.

    The decode graphs' per-token term is ``graph_gib_per_token_hidden x hidden +
    graph_bytes_scale x`` :meth:`~launcher.sglang.modelfacts.ModelFacts.graph_bytes_per_token`
    (the tensors SGLang allocates per captured token on one rank: replicated + sharded / tp);
    the per-graph term is GiB per graph per unit of ``hidden_size x layers``, the draft's terms
    GiB per token per unit of hidden; the warmup per chunked-prefill token is
    ``warmup_gib_per_token_hidden x hidden + warmup_bytes_scale x``
    :meth:`~launcher.sglang.modelfacts.ModelFacts.prefill_bytes_per_token`.
    :data:`HIDDEN_ONLY_COEFFICIENTS` is the hidden-only alternative (docs/memory.md)."""

    context_gib: float = _prior(
        1.07, "CUDA context + NCCL buffers before weights at tp 1: median of nvidia-smi's "
        "total minus 'Load weight begin. avail mem' over the 27 fit-half real start-ups with a "
        "gap < 3 GiB (scripts/bench/bench_real.py; docs/memory.md lists the case ids)")
    context_gib_per_extra_rank: float = _prior(0.1, "NCCL buffers per extra rank (guess)")
    graph_gib_per_token_hidden: float = _prior(
        0.0, "hidden-only per-token term, 0 in the default (HIDDEN_ONLY_COEFFICIENTS: 4e-6)")
    graph_bytes_scale: float = _prior(
        3.05, "times ModelFacts.graph_bytes_per_token: non-negative least squares (relative "
        "residuals) with the per-graph term on the 11 fit-half decode/verify capture passes "
        "(bs 4 docs start-ups and gh11830's bs 512 B200 capture; docs/memory.md)")
    graph_overhead_gib_per_layer_hidden: float = _prior(
        1.49e-7, "per captured graph per unit of hidden x layers: the same fit")
    graph_fixed_gib: float = _prior(
        0.5, "backends without a fitted figure (triton, aiter, ...): SGLang's reserved_mem = "
        "512 MiB of attention-backend meta data (server_args.py, 0.5.10 and 0.5.23)")
    graph_fixed_fa3_gib: float = _prior(
        0.10, "FA3: 'Memory pool end' avail - first 'Capture cuda graph begin' avail, median of "
        "the 4 fit-half FA3 start-ups (docs/memory.md lists the case ids)")
    graph_fixed_flashinfer_gib: float = _prior(
        0.57, "FlashInfer (and trtllm_mha, its subclass) with its 384 MiB workspace: the same "
        "figure, median of the 7 fit-half FlashInfer start-ups (docs/memory.md)")
    draft_graph_gib_per_token_hidden: float = _prior(
        1e-6, "draft graphs per token per unit of hidden (guess, kept: every real draft capture "
        "is at bs <= 4, where it cannot be told from the per-graph term)")
    draft_graph_overhead_gib: float = _prior(
        0.0, "draft graphs per graph: least squares (relative residuals, >= 0) on the 8 "
        "fit-half EAGLE draft/draft-extend passes beside the per-token guess gives 0 "
        "(docs/memory.md)")
    prefill_graph_gib_per_shape: float = _prior(
        8 / 1024, "memory_hook.reserve_for_graph_mb: 8 MiB per prefill shape (0.5.23)")
    mla_prefill_graph_gib: float = _prior(
        1.5, "memory_hook.reserve_for_graph_mb: 1.5 GiB for MLA prefill graphs (0.5.23)")
    warmup_gib_per_token_hidden: float = _prior(
        0.0, "hidden-only warmup term, 0 in the default (HIDDEN_ONLY_COEFFICIENTS: 2.5e-8)")
    warmup_bytes_scale: float = _prior(
        1.0, "times ModelFacts.prefill_bytes_per_token: the prefill tensors themselves")
    # Scale factors a calibration may set from observations (1.0: the prior as is).
    weights_scale: float = _prior(1.0, "calibration (1: the prior as is)")
    graphs_scale: float = _prior(1.0, "calibration (1: the prior as is)")
    activations_scale: float = _prior(1.0, "calibration (1: the prior as is)")

    def context(self, tp: int) -> float:
        return self.context_gib + self.context_gib_per_extra_rank * max(0, tp - 1)

    def graph_fixed(self, backend: str) -> float:
        """GiB allocated after the KV pool and before capture for ``backend`` (its buffers,
        allocated even with CUDA graphs disabled)."""
        if backend == "fa3":
            return self.graph_fixed_fa3_gib
        if backend in ("flashinfer", "trtllm_mha"):
            return self.graph_fixed_flashinfer_gib
        return self.graph_fixed_gib


DEFAULT_COEFFICIENTS = Coefficients()
# The default prior by its shape: the per-token graph and warmup costs as SGLang's tensors lay
# them out (replicated + sharded / tp).
SOURCE_SHAPED_COEFFICIENTS = DEFAULT_COEFFICIENTS
# The hidden-only prior, per-token costs growing with hidden only and ignoring tp: kept for
# scripts/bench/bench_oom.py --estimator --prior hidden (docs/benchmarks.md compares the two).
HIDDEN_ONLY_COEFFICIENTS = Coefficients(
    graph_gib_per_token_hidden=4e-6, graph_bytes_scale=0.0,
    warmup_gib_per_token_hidden=2.5e-8, warmup_bytes_scale=0.0,
)


@dataclass(frozen=True)
class Priors:
    """Every prior launcher uses, as one value: the estimator's :class:`Coefficients` and the
    OOM policy's guesses for what a failing log does not show yet.

    ``next_params(..., priors=)`` reads the policy's fields; the estimate takes
    ``coefficients`` (``estimate(..., coeffs=priors.coefficients)``)."""

    coefficients: Coefficients = DEFAULT_COEFFICIENTS
    kv_cushion: float = _prior(
        0.02, "smallest useful KV pool, share of pre (a guess: SGLang 0.5.23 states its "
        "minimum only for a pool <= 0, 0.5.6 never; scripts/bench/bench_frontier.py swept "
        "0-0.10)")
    step_gib: float = _prior(
        0.02, "GiB per captured graph after the first until a log shows one (bench_oom "
        "families; bench_frontier swept 0.02-0.05)")
    same_model_share: float = _prior(
        1.0, "a later capture pass of the same model, per captured token, as large as the "
        "failing pass (SGLang sizes every decode-like graph from max_bs x its width)")
    draft_after_target_share: float = _prior(
        0.25, "a draft pass after a target pass, share of its first step (the simulated "
        "Kimi-K2.5 EAGLE-3 draft's graph cost over its target's, 0.005 / 0.02 GiB per graph "
        "bs; docs/memory.md, \"The OOM policy's guesses for a pass not yet begun\")")
    warmup_share: float = _prior(
        0.02, "warmup need after capture, share of pre, until a warmup OOM shows it (keeps "
        "the KV a wrong guess leaves under 0.03 of pre)")
    warmup_min_gib: float = _prior(0.5, "lower clamp of the warmup guess")
    warmup_max_gib: float = _prior(2.5, "upper clamp of the warmup guess")

    def warmup_gib(self, pre: float) -> float:
        """Warmup activations assumed until a warmup OOM shows them: ``warmup_share`` of
        ``pre`` within [``warmup_min_gib``, ``warmup_max_gib``] (bigger GPUs get bigger auto
        chunked-prefill sizes, hence bigger activations)."""
        return min(self.warmup_max_gib, max(self.warmup_min_gib, self.warmup_share * pre))

    def scaled_warmup(self, k: float) -> Priors:
        """These priors with the warmup guess ``k`` times as large at every ``pre``."""
        return replace(self, warmup_share=k * self.warmup_share,
                       warmup_min_gib=k * self.warmup_min_gib,
                       warmup_max_gib=k * self.warmup_max_gib)


DEFAULT_PRIORS = Priors()


def sources(value: Priors | Coefficients) -> dict[str, str]:
    """Each field of a :class:`Priors` or :class:`Coefficients` and its source."""
    return {f.name: str(f.metadata["source"]) for f in fields(value) if "source" in f.metadata}
