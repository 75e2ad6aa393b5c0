#!/usr/bin/env python3
"""The memory estimator against real SGLang start-ups (docs/benchmarks.md).

Usage::

    .venv/bin/python scripts/bench/bench_real.py [--cases DIR] [--quiet]

No processes, no GPU. Every case under ``tests/fixtures/real_startups/`` (read with
``tests/real_startups.py``; a case the loader rejects is skipped with its reason printed) is run
through ``launcher.sglang.modelfacts`` and ``launcher.memory.estimate``
(``ModelFacts.from_config`` on its ``config.json`` and
``draft_config.json``, ``estimate(...)``, ``Estimate.at(mfs, bs)``, ``Estimate.graphs_gib``),
and each component is set against what the log prints. SGLang's "GB" is GiB (``1 << 30``:
``get_available_gpu_memory`` returns ``free_gpu_memory / (1 << 30)``, sglang/srt/utils/common.py
l.576 of 0.5.23, and ``memory_pool.py`` l.116 ``GB = 1024 * 1024 * 1024`` for the K/V sizes),
so the estimator's GiB and the log's GB are compared as they are.

Components, each with the log's own figures for everything it depends on, so that one
component's error does not leak into the next:

- **weights per GPU**: the estimator's ``weights_gib`` from the case's safetensors index
  (``weights_total_bytes``) against ``Load weight end ... mem usage``. The estimator has no
  rule from the config's parameter count, so a case without an index (``weights_total_bytes =
  0``) skips this component, and the summary counts it.
- **KV tokens** (and KV GiB): ``Estimate.at(mfs, bs).kv_tokens`` with the log's free memory at
  ``Load weight begin`` as the pre-load free memory (not the card's total), the log's weights
  (target and draft), the case's ``mem_fraction_static`` (SGLang's auto value by the
  estimator's rule when the case does not show one), then capped at ``--max-total-tokens`` when
  the case sets it, against ``#tokens`` (``max_total_num_tokens`` where the KV line has none);
  KV GiB = tokens x the estimator's per-token bytes against the printed K + V (or KV) size.
- **graphs**: ``Estimate.graphs_gib(bs)`` against the memory taken between ``Memory pool end``
  and the last ``Capture ... end`` (the attention backend's buffers, which the estimator's
  ``graph_fixed_gib`` stands for, plus every capture pass; a separate EAGLE draft loads after
  the target's capture, so its passes count from its own pool end: :func:`graph_memory_log`);
  per pass, the estimator's share of
  it (found by switching its coefficients off one at a time: decode = the per-token and
  per-graph terms; draft and draft extend = the draft terms) against each pass's ``mem usage``.
- **free at ready**: pre-load free - weights - LoRA pool - KV pool (capped) - graphs against
  ``available_gpu_mem`` on the ``max_total_num_tokens`` line (else the last capture's avail).
  Warmup activations come later and are not in it.
- **LoRA pool** (the cases whose ``server_args`` dump shows LoRA on, :func:`lora_of`):
  ``launcher.sglang.lora`` from the dump's ``max_loras_per_batch``, ``max_lora_rank`` and
  ``lora_target_modules``; the adapters' ``adapter_config.json`` are not in the corpus, so
  unset targets are the upper bound (every linear module, labelled "upper bound") and an unset
  rank leaves the case without a LoRA figure (labelled). The pool comes before the KV pool; the
  docs cases cap the KV pool (``--max-total-tokens``), so it lowers the free memory at ready.
  The summary gives the LoRA cases' free-at-ready error without the pool and with it.
- **context**: the card's total - the free memory at ``Load weight begin`` against
  ``Coefficients.context(tp)`` (CUDA context, NCCL; the total is nvidia-smi's, as launcher
  reads it).

Errors are |estimate - log| / log; the summary gives medians over the cases that have the
component. The last line, ``real: weights median err X% · kv tokens Y% · graphs Z% · n=N ·
held-out graphs B% before the refit, A% after`` (X/Y/Z "-" when no case has the component), is
launcher's priors (``DEFAULT_COEFFICIENTS``) on every case, then the held-out half's graph error
under the priors before they were refitted to these cases (``BEFORE_REFIT``) and under
launcher's; the line before it counts the skipped components.

**Fit / held-out split.** A case is in the *fit* half when the last hex digit of
``sha256(case id)`` is even, else *held out* (:func:`split`): stable as cases are added, and
independent of the case's figures. On the fit half the script fits, by stated rules
(:func:`fit`):

- ``context_gib``: median of total - free at load begin, over cases where that is < 3 GiB (a
  larger gap means another process held the GPU: the docs CI ran notebooks side by side).
- the fixed part per attention backend (``graph_fixed_fa3_gib``, ``graph_fixed_flashinfer_gib``,
  ``graph_fixed_gib`` for the rest; the backend is the estimator's own choice,
  ``Estimate.attention_backend``, checked against the log's "Use X backend by default"): median of
  ``Memory pool end`` avail - the target's first ``Capture ... begin`` avail (what is allocated
  between the KV pool and the capture), less FlashInfer's wider workspace for the architectures
  that get one.
- ``graph_bytes_scale`` (per captured token, x ``ModelFacts.graph_bytes_per_token``) and
  ``graph_overhead_gib_per_layer_hidden`` (per graph): non-negative least squares on the decode
  passes' ``mem usage``, each residual relative to its pass (one bs-512 capture would otherwise
  outweigh every bs-4 one); three significant figures.
- ``draft_graph_overhead_gib``: the same on the draft and draft-extend passes (passes printed
  < 0, free memory that rose during capture, left out), with ``draft_graph_gib_per_token_hidden``
  kept: every draft capture in the cases is at bs <= 4, where the two cannot be told apart.
- warmup (``warmup_bytes_scale``): not fitted, no log prints the warmup's peak.

It prints the fitted values beside launcher's, the summary on the fit half and on the held-out
half with the fitted values, the held-out half with launcher's, and what the fitted values would
change for each model (graph memory at bs 4 and at SGLang's auto bs, and the first attempt
``choose`` would make). launcher's priors are not changed here.

Where the cases could flatter the estimator: nearly all are tp 1 dense 7-8B (and 1B) models on
one H100 from SGLang's docs CI, which from 2025-02-15 caps the KV pool at 20480 tokens (so the
KV-token error is 0 by construction there: the script prints the uncapped figure as well) and
until 2025-08 disabled CUDA graphs; graphs are captured at bs <= 4, where the fixed term
dominates and the per-token term is barely measured.
"""

from __future__ import annotations

import argparse
import hashlib
import re
import statistics
import sys
import tomllib
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

from launcher.memory.estimate import Estimate, choose, estimate
from launcher.memory.priors import DEFAULT_COEFFICIENTS, Coefficients
from launcher.params import LaunchParams
from launcher.sglang.autoargs import captured_sizes
from launcher.sglang.lora import LoraFlags, LoraShape, resolve_lora
from launcher.sglang.modelfacts import (
    GIB,
    GpuFacts,
    ModelFacts,
    NoEstimate,
    ServerShape,
    SpecShape,
    WeightFacts,
)

_TESTS = Path(__file__).resolve().parents[2] / "tests"
if str(_TESTS) not in sys.path:
    sys.path.insert(0, str(_TESTS))
from real_startups import ROOT as CASES  # noqa: E402
from real_startups import Case, CaseError, case_dirs, load_case  # noqa: E402

# A larger gap between the card's total and the free memory at load begin means another process
# held part of the GPU (the docs CI ran notebooks side by side from ~2025-03 to ~2025-08).
SHARED_GPU_GAP_GIB = 3.0
SUMMARY_PREFIX = "real"
# launcher's priors before they were refitted to these cases (one fixed part for every backend,
# the per-token scale that kept the hidden-only level): the "before" of the held-out figure.
BEFORE_REFIT = Coefficients(
    context_gib=1.0, graph_fixed_gib=0.5, graph_fixed_fa3_gib=0.5, graph_fixed_flashinfer_gib=0.5,
    graph_bytes_scale=14.0, graph_overhead_gib_per_layer_hidden=1.6e-7,
    draft_graph_gib_per_token_hidden=1e-6, draft_graph_overhead_gib=0.01,
)


def split(case_id: str) -> str:
    """``fit`` when the last hex digit of sha256(case id) is even, else ``held_out``."""
    return "fit" if int(hashlib.sha256(case_id.encode()).hexdigest()[-1], 16) % 2 == 0 \
        else "held_out"


@dataclass
class Row:
    """One case's estimate against its log (GiB unless named otherwise; None: not computable)."""

    id: str
    half: str
    mfs: float
    mfs_auto: bool
    bs: int
    weights_est: float | None = None
    weights_log: float | None = None
    kv_tokens_est: int | None = None
    kv_tokens_uncapped: int | None = None
    kv_tokens_log: int | None = None
    kv_cap: int | None = None
    kv_gib_est: float | None = None
    kv_gib_log: float | None = None
    graphs_est: float | None = None
    graphs_log: float | None = None
    passes: list[tuple[str, float | None, float]] = field(default_factory=list)
    free_est: float | None = None
    free_log: float | None = None
    context_est: float | None = None
    context_log: float | None = None
    lora: str | None = None  # the LoRA pool line (None: LoRA off)
    lora_gib: float | None = None  # the predicted pool (None: LoRA off or not predictable)
    free_est_no_lora: float | None = None  # free at ready without the LoRA pool
    skipped: dict[str, str] = field(default_factory=dict)

    @staticmethod
    def _err(est: float | None, log: float | None) -> float | None:
        if est is None or log is None or log == 0:
            return None
        return abs(est - log) / abs(log)

    @property
    def weights_err(self) -> float | None:
        return self._err(self.weights_est, self.weights_log)

    @property
    def kv_tokens_err(self) -> float | None:
        return self._err(self.kv_tokens_est, self.kv_tokens_log)

    @property
    def kv_gib_err(self) -> float | None:
        return self._err(self.kv_gib_est, self.kv_gib_log)

    @property
    def graphs_err(self) -> float | None:
        return self._err(self.graphs_est, self.graphs_log)


# --- per case ------------------------------------------------------------------------------


def raw_flags(case: Case) -> dict[str, Any]:
    """case.toml's [flags] as written (the loader keeps only the schema's keys; the docs cases
    also record ``max_total_tokens``, ``kv_cache_dtype``, ...)."""
    raw = tomllib.loads((case.path / "case.toml").read_text(encoding="utf-8"))
    flags = raw.get("flags", {})
    return dict(flags) if isinstance(flags, dict) else {}


def log_passes(case: Case) -> list[tuple[str, float | None, float | None, float | None]]:
    """(name, begin avail, end avail, mem usage) per capture pass, in log order."""
    if case.graph_passes:
        return [(g.name, g.begin_avail_gb, g.end_avail_gb, g.mem_usage_gb)
                for g in case.graph_passes]
    f = case.figures
    if "graph_end_mem_usage_gb" in f or "graph_end_avail_gb" in f:
        return [("decode", _opt(f.get("graph_begin_avail_gb")),
                 _opt(f.get("graph_end_avail_gb")), _opt(f.get("graph_end_mem_usage_gb")))]
    return []


def _opt(v: float | int | None) -> float | None:
    return None if v is None else float(v)


def shape_of(case: Case, flags: dict[str, Any]) -> ServerShape:
    fl = case.flags
    spec = None
    if fl.speculative_algorithm:
        spec = SpecShape(fl.speculative_algorithm, fl.speculative_num_steps or 3,
                         fl.speculative_eagle_topk or 1, fl.speculative_num_draft_tokens or 4)
    kv_dtype = flags.get("kv_cache_dtype")
    return ServerShape(
        tp=case.tp, sglang_version=case.sglang_version,
        kv_cache_dtype=kv_dtype if isinstance(kv_dtype, str) and kv_dtype else "auto",
        context_len=fl.context_length or None,
        chunked_prefill_size=fl.chunked_prefill_size or None,
        max_running_requests=fl.max_running_requests or None,
        spec=spec, disable_cuda_graph=fl.disable_cuda_graph,
        attention_backend=case.attention_backend or None,
    )


def graph_parts(e: Estimate, bs: int) -> dict[str, float]:
    """The estimator's graph memory at ``bs`` split by pass, each found by switching the
    estimator's own terms off: ``fixed`` (attention-backend buffers), ``prefill`` (0.5.15+
    prefill graphs), ``decode`` (per-token and per-graph terms of the target's graphs),
    ``draft`` and ``draft_extend``."""
    c = e.coeffs
    total = e.graphs_gib(bs)
    no_draft_c = replace(c, draft_graph_gib_per_token_hidden=0.0, draft_graph_overhead_gib=0.0)
    no_draft = replace(e, coeffs=no_draft_c).graphs_gib(bs)
    no_prefill = replace(e, coeffs=replace(no_draft_c, prefill_graph_gib_per_shape=0.0,
                                            mla_prefill_graph_gib=0.0)).graphs_gib(bs)
    fixed = e.graph_fixed_gib() * c.graphs_scale if total else 0.0
    parts = {"fixed": fixed, "prefill": no_draft - no_prefill,
             "decode": no_prefill - fixed}
    spec = e.shape.spec
    if spec is not None:
        one_step = replace(e, shape=replace(e.shape, spec=replace(spec, num_steps=1)))
        draft_decode = total - one_step.graphs_gib(bs)
        parts["draft"] = draft_decode
        parts["draft_extend"] = total - no_draft - draft_decode
    return parts


def graph_memory_log(case: Case) -> float | None:
    """The memory the log shows taken after the KV pool until the last capture ends: per
    capture segment, its ``Memory pool end`` avail - its last ``Capture ... end`` avail. A
    separate draft (EAGLE up to 0.5.x) loads and builds its own pool after the target's capture,
    so its passes (named ``draft...``) count from ``draft_memory_pool_end_avail_gb``. None when
    the log shows no capture end or no pool end."""
    f = case.figures
    passes = log_passes(case)
    segments = [("memory_pool_end_avail_gb", [p for p in passes if not _is_draft(p[0])]),
                ("draft_memory_pool_end_avail_gb", [p for p in passes if _is_draft(p[0])])]
    total, seen = 0.0, False
    for key, seg in segments:
        if not seg:
            continue
        pool_end, last_end = _opt(f.get(key)), seg[-1][2]
        if pool_end is None or last_end is None:
            return None
        total += pool_end - last_end
        seen = True
    return total if seen else None


def _is_draft(name: str) -> bool:
    return _pass_key(name).startswith("draft")


def _pass_key(name: str) -> str:
    return name.lower().replace(" ", "_")


_SERVER_ARGS = re.compile(r"server_args=ServerArgs\((.*)\)\s*$", re.M)


def lora_of(case: Case) -> LoraFlags | None:
    """The LoRA flags the log's ``server_args`` dump shows (None: LoRA off): on when
    ``enable_lora=True`` or ``lora_paths`` is a non-empty list/dict; ``max_loras_per_batch``,
    ``max_lora_rank`` and ``lora_target_modules`` (a Python set or list of names) as printed.
    The adapter paths are not needed (their configs are not in the corpus)."""
    text = (case.path / "log.txt").read_text(encoding="utf-8", errors="replace")
    m = _SERVER_ARGS.search(text)
    if m is None:
        return None
    args = m.group(1)
    on = "enable_lora=True" in args or re.search(r"lora_paths=[\[{][^\]}]", args) is not None
    if not on:
        return None
    per = re.search(r"max_loras_per_batch=(\d+)", args)
    rank = re.search(r"max_lora_rank=(\d+)", args)
    targets = re.search(r"lora_target_modules=[\[{]([^\]}]*)[\]}]", args)
    names = tuple(re.findall(r"'([^']+)'", targets.group(1))) if targets else None
    return LoraFlags((), int(per.group(1)) if per else 8,
                     int(rank.group(1)) if rank else None, names or None)


def lora_shape(case: Case, model: ModelFacts) -> tuple[LoraShape | None, str | None]:
    """(the LoRA pool's shape, or None; the case's LoRA line, None when LoRA is off)."""
    flags = lora_of(case)
    if flags is None:
        return None, None
    try:
        return resolve_lora(flags, None, model, case.sglang_version), None
    except NoEstimate as exc:
        return None, f"LoRA pool not predicted: {exc.why} (the adapters' configs are not in " \
                     "the corpus)"


def row_estimate(case: Case, coeffs: Coefficients = DEFAULT_COEFFICIENTS) -> Estimate:
    """The estimator on the case's configs, flags and card (its total, for SGLang's auto
    values). ``estimate`` needs positive weight sizes: where the case has no index, 1 byte
    stands in, and :func:`evaluate` puts the log's weights in its place."""
    model = ModelFacts.from_config(case.config)
    draft = ModelFacts.from_config(case.draft_config) if case.draft_config is not None else None
    return estimate(model, WeightFacts(case.weights_total_bytes or 1, "index"),
                    [GpuFacts(0, case.gpu_total_gib, 0.0, case.gpu)],
                    shape_of(case, raw_flags(case)), draft=draft,
                    draft_weights=WeightFacts(1) if draft is not None else None, coeffs=coeffs,
                    lora=lora_shape(case, model)[0])


def evaluate(case: Case, coeffs: Coefficients = DEFAULT_COEFFICIENTS) -> Row:
    """One case's components (see the module docstring). Raises NoEstimate when the config
    gives no estimate at all."""
    f = case.figures
    flags = raw_flags(case)
    e = row_estimate(case, coeffs)
    draft = e.draft_weights_gib is not None and case.draft_config is not None
    passes = log_passes(case)
    bs = case.flags.cuda_graph_max_bs or int(f.get("graph_max_bs", 0)) or e.auto_bs()
    mfs_auto = not case.flags.mem_fraction_static
    mfs = e.auto_mfs(bs) if mfs_auto else case.flags.mem_fraction_static
    row = Row(case.id, split(case.id), mfs, mfs_auto, bs)
    if e.lora is not None:
        row.lora, row.lora_gib = e.lora.describe(), e.lora.gib
    else:
        row.lora = lora_shape(case, e.model)[1]

    weights_log = _opt(f.get("weight_mem_usage_gb"))
    if weights_log is None and "load_weight_begin_avail_gb" in f and \
            "load_weight_end_avail_gb" in f:  # SGLang <= 0.4.1 prints no "mem usage"
        weights_log = float(f["load_weight_begin_avail_gb"]) - float(f["load_weight_end_avail_gb"])
    row.weights_log = weights_log
    if case.weights_total_bytes > 0:
        row.weights_est = e.weights_gib
    else:
        row.skipped["weights"] = "no safetensors index (weights_total_bytes = 0)"

    pre = _opt(f.get("load_weight_begin_avail_gb"))
    if pre is None and weights_log is not None and "load_weight_end_avail_gb" in f:
        pre = float(f["load_weight_end_avail_gb"]) + weights_log
    if pre is not None:
        row.context_log = case.gpu_total_gib - pre
        row.context_est = coeffs.context(case.tp)
    draft_log = _opt(f.get("draft_weight_mem_usage_gb"))
    if draft_log is None and "draft_load_weight_begin_avail_gb" in f and \
            "draft_load_weight_end_avail_gb" in f:
        draft_log = (float(f["draft_load_weight_begin_avail_gb"])
                     - float(f["draft_load_weight_end_avail_gb"]))
    if pre is None or weights_log is None or (draft and draft_log is None):
        row.skipped["kv tokens"] = "the log shows no free memory at load begin or no weights"
        row.skipped["free at ready"] = row.skipped["kv tokens"]
    else:
        e = replace(e, pre_load_free_gib=pre, weights_gib=weights_log,
                    draft_weights_gib=draft_log or 0.0)
        b = e.at(mfs, bs)
        cap = flags.get("max_total_tokens")
        row.kv_cap = cap if isinstance(cap, int) and cap > 0 else None
        row.kv_tokens_uncapped = b.kv_tokens
        row.kv_tokens_est = min(b.kv_tokens, row.kv_cap) if row.kv_cap else b.kv_tokens
        row.kv_gib_est = row.kv_tokens_est * e.kv_bytes_per_token / GIB
        log_tokens = f.get("kv_tokens", f.get("max_total_num_tokens"))
        row.kv_tokens_log = int(log_tokens) if log_tokens is not None else None
        if "kv_size_gb" in f:
            row.kv_gib_log = float(f["kv_size_gb"])
        elif "k_size_gb" in f and "v_size_gb" in f:
            row.kv_gib_log = float(f["k_size_gb"]) + float(f["v_size_gb"])
        pools = row.kv_tokens_est * (e.kv_bytes_per_token + e.draft_kv_bytes_per_token) / GIB
        row.free_est_no_lora = pre - b.weights_gib - pools - b.state_gib - b.graphs_gib
        row.free_est = row.free_est_no_lora - b.lora_gib
        ready = f.get("ready_available_gpu_mem_gb")
        if ready is None and passes:
            ready = passes[-1][2]
        row.free_log = _opt(ready)
        if row.free_log is None:
            row.skipped["free at ready"] = "the log shows no free memory at ready"

    graphs_log = graph_memory_log(case)
    if graphs_log is not None:
        row.graphs_est = e.graphs_gib(bs)
        row.graphs_log = graphs_log
        parts = graph_parts(e, bs)
        for name, _, _, usage in passes:
            if usage is not None:
                row.passes.append((name, parts.get(_pass_key(name)), usage))
    else:
        row.skipped["graphs"] = ("CUDA graphs disabled" if case.flags.disable_cuda_graph
                                 else "the log shows no capture end or no memory pool end")
    return row


# --- cases, fit, summary -------------------------------------------------------------------


def load_all(root: Path = CASES) -> tuple[list[Case], list[str]]:
    """Every case the loader accepts, and one line per rejected case with the loader's reason."""
    cases, rejected = [], []
    for d in case_dirs(root):
        try:
            cases.append(load_case(d))
        except CaseError as exc:
            rejected.append(f"skip {d.name}: {str(exc).removeprefix(str(d) + '/')}")
    return cases, rejected


def _median(values: Iterable[float | None]) -> float | None:
    vals = [v for v in values if v is not None]
    return statistics.median(vals) if vals else None


def _pct(v: float | None) -> str:
    return "-" if v is None else f"{100 * v:.2f}"


def summary(rows: Sequence[Row], prefix: str = SUMMARY_PREFIX) -> str:
    """``<prefix>: weights median err X% · kv tokens Y% · graphs Z% · n=N``."""
    return (f"{prefix}: weights median err {_pct(_median(r.weights_err for r in rows))}% · "
            f"kv tokens {_pct(_median(r.kv_tokens_err for r in rows))}% · "
            f"graphs {_pct(_median(r.graphs_err for r in rows))}% · n={len(rows)}")


def skipped_line(rows: Sequence[Row]) -> str:
    counts = {k: sum(1 for r in rows if k in r.skipped)
              for k in ("weights", "kv tokens", "graphs", "free at ready")}
    return (f"{SUMMARY_PREFIX} skipped: " + " · ".join(f"{k} {v}" for k, v in counts.items())
            + f" of {len(rows)} (weights: no safetensors index, and the estimator has no rule "
            "from the config's parameter count)")


def _nnls2(xs: Sequence[tuple[float, float]], ys: Sequence[float]) -> tuple[float, float]:
    """Least squares y = a x1 + b x2 with a, b >= 0 (the 2x2 normal equations; a negative
    coefficient is set to 0 and the other refitted alone)."""
    s11 = sum(x1 * x1 for x1, _ in xs)
    s22 = sum(x2 * x2 for _, x2 in xs)
    s12 = sum(x1 * x2 for x1, x2 in xs)
    t1 = sum(x1 * y for (x1, _), y in zip(xs, ys, strict=True))
    t2 = sum(x2 * y for (_, x2), y in zip(xs, ys, strict=True))
    det = s11 * s22 - s12 * s12
    if det > 1e-12 * max(s11 * s22, 1e-300):
        a, b = (t1 * s22 - t2 * s12) / det, (s11 * t2 - s12 * t1) / det
        if a >= 0 and b >= 0:
            return a, b
    a_only = max(t1 / s11, 0.0) if s11 else 0.0
    b_only = max(t2 / s22, 0.0) if s22 else 0.0

    def sse(a: float, b: float) -> float:
        return sum((a * x1 + b * x2 - y) ** 2 for (x1, x2), y in zip(xs, ys, strict=True))

    return min(((a_only, 0.0), (0.0, b_only)), key=lambda ab: sse(*ab))


# The fixed part is fitted per attention backend: FA3's buffers are ~0.1 GiB, FlashInfer's
# workspace alone 384 MiB (docs/memory.md); the other backends share one field.
FIXED_FIELD = {"fa3": "graph_fixed_fa3_gib", "flashinfer": "graph_fixed_flashinfer_gib",
               "other": "graph_fixed_gib"}


def _fixed_key(backend: str) -> str:
    if backend == "fa3":
        return "fa3"
    return "flashinfer" if backend in ("flashinfer", "trtllm_mha") else "other"


def log_backend(case: Case) -> str | None:
    """The attention backend the log shows: SGLang's "Use X backend by default" line, else
    the server_args dump's (``case.attention_backend``), else None."""
    m = re.search(r"Use (\w+) backend by default", (case.path / "log.txt").read_text(
        encoding="utf-8", errors="replace"))
    return m.group(1) if m else (case.attention_backend or None)


def _sig(v: float) -> float:
    """Three significant figures: the fitted values are stated to this precision (and a sum's
    last bits do not depend on the order of the cases)."""
    return float(f"{v:.3g}")


@dataclass(frozen=True)
class Fit:
    coeffs: Coefficients
    n: dict[str, int]
    ids: dict[str, list[str]] = field(default_factory=dict)  # the cases behind each field


def fit(cases: Sequence[Case], base: Coefficients = DEFAULT_COEFFICIENTS) -> Fit:
    """The coefficients the cases support, by the rules in the module docstring; a coefficient
    without data keeps ``base``'s value."""
    ctx: list[float] = []
    fixed: dict[str, list[float]] = {}
    ids: dict[str, list[str]] = {}
    dec_x: list[tuple[float, float]] = []
    dec_y: list[float] = []
    dr_x: list[tuple[float, float]] = []
    dr_y: list[float] = []
    for case in cases:
        f = case.figures
        try:
            row = evaluate(case, base)
        except NoEstimate:
            continue
        if row.context_log is not None and row.context_log < SHARED_GPU_GAP_GIB:
            ctx.append(row.context_log)
            ids.setdefault("context_gib", []).append(case.id)
        passes = log_passes(case)
        target = [p for p in passes if not _is_draft(p[0])]
        pool_end = _opt(f.get("memory_pool_end_avail_gb"))
        if not target or pool_end is None or target[0][1] is None:
            continue
        e = row_estimate(case, base)
        ids.setdefault(FIXED_FIELD[_fixed_key(e.attention_backend)], []).append(case.id)
        fixed.setdefault(_fixed_key(e.attention_backend), []).append(
            pool_end - target[0][1] - (e.graph_fixed_gib() - base.graph_fixed(e.attention_backend)))
        model, spec = e.model, e.shape.spec
        sizes = captured_sizes(row.bs, spec=spec is not None, cap=e.request_cap())
        top = sizes[-1]
        per_req = spec.num_draft_tokens if spec is not None else 1
        per_token_gib = model.graph_bytes_per_token(e.shape.tp) / GIB
        graph_unit = model.hidden_size * model.num_layers * len(sizes)
        for name, _, _, usage in passes:
            if usage is None or usage < 0:
                continue
            key = _pass_key(name)
            if key == "decode":
                dec_x.append((per_token_gib * top * per_req, graph_unit))
                dec_y.append(usage)
                ids.setdefault("graph_bytes_scale", []).append(case.id)
            elif spec is not None and key in ("draft", "draft_extend"):
                width = spec.topk if key == "draft" else spec.num_draft_tokens
                dr_x.append((model.hidden_size * top * width, len(sizes)))
                dr_y.append(usage)
                ids.setdefault("draft_graph_overhead_gib", []).append(case.id)
    c = base
    n = {"context": len(ctx), **{f"fixed {k}": len(v) for k, v in sorted(fixed.items())},
         "decode passes": len(dec_y), "draft passes": len(dr_y)}
    if ctx:
        c = replace(c, context_gib=round(statistics.median(ctx), 2))
    for key, values in fixed.items():
        c = replace(c, **{FIXED_FIELD[key]: round(max(statistics.median(values), 0.0), 2)})
    if dec_y:
        # Relative residuals (each pass's row divided by its own figure): the benchmark's
        # error is relative, and one bs-512 capture would otherwise outweigh every bs-4 one.
        s, o = _nnls2([(x1 / y, x2 / y) for (x1, x2), y in zip(dec_x, dec_y, strict=True)],
                      [1.0] * len(dec_y))
        c = replace(c, graph_bytes_scale=_sig(s), graph_overhead_gib_per_layer_hidden=_sig(o))
    if dr_y:
        # Every draft capture in the cases is at bs <= 4 (<= 32 tokens), where a per-token term
        # cannot be told from a per-graph one: the per-token prior is kept, the per-graph term
        # fitted beside it (least squares on relative residuals, >= 0).
        g = base.draft_graph_gib_per_token_hidden
        rows = [((y - g * x1) / y, x2 / y) for (x1, x2), y in zip(dr_x, dr_y, strict=True)]
        den = sum(x * x for _, x in rows)
        o = max(0.0, sum(r * x for r, x in rows) / den) if den else base.draft_graph_overhead_gib
        c = replace(c, draft_graph_overhead_gib=_sig(o))
    return Fit(c, n, {k: sorted(set(v)) for k, v in ids.items()})


FITTED_FIELDS = ("context_gib", "graph_fixed_gib", "graph_fixed_fa3_gib",
                 "graph_fixed_flashinfer_gib", "graph_bytes_scale",
                 "graph_overhead_gib_per_layer_hidden", "draft_graph_gib_per_token_hidden",
                 "draft_graph_overhead_gib", "warmup_bytes_scale")


# --- printing --------------------------------------------------------------------------------


def _g(v: float | None, digits: int = 2) -> str:
    return "-" if v is None else f"{v:.{digits}f}"


def _signed(est: float | None, log: float | None) -> str:
    if est is None or log is None or log == 0:
        return ""
    return f" ({100 * (est - log) / abs(log):+.1f}%)"


def case_line(r: Row) -> str:
    kv = (f"kv tokens {r.kv_tokens_est}/{r.kv_tokens_log}"
          f"{_signed(r.kv_tokens_est, r.kv_tokens_log)}"
          + (f" [cap {r.kv_cap}, uncapped {r.kv_tokens_uncapped}]" if r.kv_cap else "")
          + f" {_g(r.kv_gib_est)}/{_g(r.kv_gib_log)} GiB"
          if r.kv_tokens_est is not None else "kv tokens -")
    passes = " ".join(f"{name} {_g(est)}/{usage:.2f}" for name, est, usage in r.passes)
    graphs = (f"graphs {_g(r.graphs_est)}/{_g(r.graphs_log)}{_signed(r.graphs_est, r.graphs_log)}"
              + (f" [{passes}]" if passes else "") if r.graphs_est is not None else "graphs -")
    free = (f"free {_g(r.free_est)}/{_g(r.free_log)} ({r.free_est - r.free_log:+.2f})"
            if r.free_est is not None and r.free_log is not None else "free -")
    line = (f"{r.id} [{r.half}] mfs {r.mfs:.3f}{' auto' if r.mfs_auto else ''} bs {r.bs}: "
            f"weights {_g(r.weights_est)}/{_g(r.weights_log)}"
            f"{_signed(r.weights_est, r.weights_log)}"
            f" · {kv} · {graphs} · {free} · context {_g(r.context_est)}/{_g(r.context_log)}")
    if r.lora is not None:
        line += "\n    " + r.lora
        if r.free_est_no_lora is not None and r.free_log is not None:
            line += (f"; free at ready err without it {r.free_est_no_lora - r.free_log:+.2f}"
                     + (f", with it {r.free_est - r.free_log:+.2f} GiB"
                        if r.lora_gib is not None and r.free_est is not None else " GiB"))
    return line


def lora_line(rows: Sequence[Row]) -> str:
    """The LoRA cases' free-at-ready error (median |estimate - log|, GiB) without the LoRA pool
    and with it, over the cases with a predicted pool; the others are counted."""
    lora = [r for r in rows if r.lora is not None]
    both = [r for r in lora if r.lora_gib is not None and r.free_log is not None
            and r.free_est is not None and r.free_est_no_lora is not None]
    before = _median(abs(r.free_est_no_lora - r.free_log) for r in both
                     if r.free_est_no_lora is not None and r.free_log is not None)
    after = _median(abs(r.free_est - r.free_log) for r in both
                    if r.free_est is not None and r.free_log is not None)
    return (f"{SUMMARY_PREFIX} LoRA pool: free at ready median |err| {_g(before)} GiB without "
            f"it, {_g(after)} GiB with it · n={len(both)} of {len(lora)} LoRA cases "
            f"({len(lora) - len(both)} without a predicted pool)")


def run_rows(cases: Sequence[Case], coeffs: Coefficients) -> tuple[list[Row], list[str]]:
    rows, errors = [], []
    for case in cases:
        try:
            rows.append(evaluate(case, coeffs))
        except NoEstimate as exc:
            errors.append(f"skip {case.id}: {exc}")
    return rows, errors


def what_changes(cases: Sequence[Case], fitted: Coefficients) -> list[str]:
    """Per model (its first case): graph memory at bs 4 and at SGLang's auto bs, and the first
    attempt ``choose`` makes with the params unset, under launcher's priors and the fitted."""
    lines, seen = [], set()
    for case in cases:
        if case.model in seen or case.draft_config is not None:
            continue
        f = case.figures
        pre, w = f.get("load_weight_begin_avail_gb"), f.get("weight_mem_usage_gb")
        if pre is None or w is None:
            continue
        seen.add(case.model)
        out = []
        for label, c in (("launcher", DEFAULT_COEFFICIENTS), ("fitted", fitted)):
            e = estimate(ModelFacts.from_config(case.config), WeightFacts(1),
                         [GpuFacts(0, case.gpu_total_gib, 0.0, case.gpu)],
                         replace(shape_of(case, {}), disable_cuda_graph=False,
                                 max_running_requests=None), coeffs=c)
            e = replace(e, weights_gib=float(w),
                        pre_load_free_gib=case.gpu_total_gib - c.context(case.tp))
            auto = e.auto_bs()
            ch = choose(e, LaunchParams())
            out.append(f"{label}: graphs bs4 {e.graphs_gib(4):.2f} / bs{auto} "
                       f"{e.graphs_gib(auto):.2f} GiB, first attempt mfs "
                       f"{ch.params.mem_fraction_static} bs {ch.params.cuda_graph_max_bs}")
        lines.append(f"  {case.model} on {case.gpu} (SGLang {case.sglang_version}): "
                     + " -> ".join(out))
    return lines


def bench(root: Path = CASES, quiet: bool = False) -> list[str]:
    cases, rejected = load_all(root)
    rows, errors = run_rows(cases, DEFAULT_COEFFICIENTS)
    lines = [f"{len(cases)} cases loaded, {len(rejected)} rejected by the loader "
             f"(estimate/log; GiB, SGLang's GB)", *rejected, *errors]
    if not quiet:
        lines += [case_line(r) for r in rows]
    fit_cases = [c for c in cases if split(c.id) == "fit"]
    held_cases = [c for c in cases if split(c.id) == "held_out"]
    fitted = fit(fit_cases)
    fit_rows, _ = run_rows(fit_cases, fitted.coeffs)
    held_rows, _ = run_rows(held_cases, fitted.coeffs)
    held_default = [r for r in rows if r.half == "held_out"]
    held_before, _ = run_rows(held_cases, BEFORE_REFIT)
    backends = []
    for c in cases:
        try:
            est_backend = row_estimate(c).attention_backend
        except NoEstimate:
            continue
        backends.append((c.id, est_backend, log_backend(c)))
    shown = [b for b in backends if b[2] is not None]
    wrong = [f"{i} (estimator {e}, log {g})" for i, e, g in shown if e != g]
    uncapped = [r for r in rows if r.kv_cap is None and r.kv_tokens_est is not None]
    free_errs = [abs(r.free_est - r.free_log) for r in rows
                 if r.free_est is not None and r.free_log is not None]
    lines += [
        "",
        f"fit half: {len(fit_cases)} cases (last hex digit of sha256(id) even); "
        f"held out: {len(held_cases)}; data points {fitted.n}",
        "fitted priors (launcher's -> fitted on the fit half):",
        *(f"  {name}: {getattr(DEFAULT_COEFFICIENTS, name):g} -> "
          f"{getattr(fitted.coeffs, name):g}" for name in FITTED_FIELDS),
        "  (warmup_bytes_scale: not fitted, no log prints the warmup's peak)",
        *(f"  cases behind {name}: {', '.join(v)}" for name, v in sorted(fitted.ids.items())),
        "what the fitted priors would change (free at start = total - context, params unset):",
        *what_changes(cases, fitted.coeffs),
        summary(fit_rows, f"{SUMMARY_PREFIX} fit half, fitted priors"),
        summary(held_rows, f"{SUMMARY_PREFIX} held-out half, fitted priors"),
        summary(held_before, f"{SUMMARY_PREFIX} held-out half, priors before the refit"),
        summary(held_default, f"{SUMMARY_PREFIX} held-out half, launcher's priors"),
        f"{SUMMARY_PREFIX} attention backend: the estimator's = the log's on "
        f"{len(shown) - len(wrong)} of {len(shown)} cases"
        + (f"; differs: {', '.join(wrong)}" if wrong else ""),
        summary(uncapped, f"{SUMMARY_PREFIX} KV pool sized by mem_fraction_static only "
                          "(no --max-total-tokens)"),
        f"{SUMMARY_PREFIX} kv GiB median err {_pct(_median(r.kv_gib_err for r in rows))}% · "
        f"free at ready median |err| "
        f"{_g(_median(free_errs))}"
        f" GiB · context median (total - free at load begin) "
        f"{_g(_median(r.context_log for r in rows))} GiB vs prior "
        f"{DEFAULT_COEFFICIENTS.context_gib:g}",
        lora_line(rows),
        skipped_line(rows),
        summary(rows) + f" · held-out graphs {_pct(_median(r.graphs_err for r in held_before))}% "
        f"before the refit, {_pct(_median(r.graphs_err for r in held_default))}% after",
    ]
    return lines


def main(argv: Sequence[str] | None = None,
         out: Callable[[str], None] = print) -> int:
    p = argparse.ArgumentParser(description=(__doc__ or "").split("\n\n")[0])
    p.add_argument("--cases", type=Path, default=CASES, help="the cases' root directory")
    p.add_argument("--quiet", action="store_true", help="no per-case lines")
    args = p.parse_args(argv)
    lines = bench(args.cases, args.quiet)
    out("\n".join(lines))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
