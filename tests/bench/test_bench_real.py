"""scripts/bench/bench_real.py: the estimator against the real start-ups (docs/benchmarks.md).

Runs on whatever cases the loader accepts (tests/real_startups.py), so it holds before and
after the loader admits the older log formats."""

from __future__ import annotations

import contextlib
import hashlib
import re
import statistics

import pytest
from real_startups import ROOT, CaseError, case_dirs, load_case

from scripts import import_script

bench_real = import_script("bench_real")

SUMMARY = re.compile(
    r"^real: weights median err (-|\d+\.\d\d)% · kv tokens (-|\d+\.\d\d)% · "
    r"graphs (-|\d+\.\d\d)% · n=(\d+) · held-out graphs (-|\d+\.\d\d)% before the "
    r"refit, (-|\d+\.\d\d)% after$"
)
HAND_CASE = "docs-llama31-8b-h100-tp1-mf0874-bs4-20250812"
EAGLE_CASE = "docs-eagle-llama2-7b-h100-tp1-mf0849-bs4-20250811"


def _loadable() -> list[str]:
    ids = []
    for d in case_dirs():
        with contextlib.suppress(CaseError):
            ids.append(load_case(d).id)
    return ids


def test_summary_line_format_and_count() -> None:
    """The last line is the summary, exactly ``real: weights median err X% · kv tokens Y% ·
    graphs Z% · n=N · held-out graphs B% before the refit, A% after``; N is every case the
    loader accepts, and each rejected one is printed."""
    lines: list[str] = []
    assert bench_real.main(["--quiet"], out=lines.append) == 0
    text = "\n".join(lines).splitlines()
    match = SUMMARY.match(text[-1])
    assert match, text[-1]
    loadable = _loadable()
    assert int(match.group(4)) == len(loadable)
    rejected = len(case_dirs()) - len(loadable)
    assert sum(1 for line in text if line.startswith("skip ")) >= rejected
    # the fit and held-out summaries are printed too, in the same form
    assert any(line.startswith("real held-out half, fitted priors: weights median err")
               for line in text)


def test_split_is_disjoint_stable_and_stated() -> None:
    """Fit = last hex digit of sha256(id) even: a function of the id alone, so it is the same
    on every run and does not move when cases are added."""
    ids = [d.name for d in case_dirs()]
    fit = {i for i in ids if bench_real.split(i) == "fit"}
    held = {i for i in ids if bench_real.split(i) == "held_out"}
    assert fit and held and not fit & held and fit | held == set(ids)
    for i in ids:
        digit = int(hashlib.sha256(i.encode()).hexdigest()[-1], 16)
        assert bench_real.split(i) == ("fit" if digit % 2 == 0 else "held_out")
        assert bench_real.split(i) == bench_real.split(str(i))
    assert bench_real.split(HAND_CASE) == "fit"  # pinned: ...0812's digest ends in an even digit


def test_kv_tokens_worked_by_hand() -> None:
    """docs-llama31-8b-h100-tp1-mf0874-bs4-20250812 (Llama-3.1-8B-Instruct, H100, tp 1).

    config.json: 32 layers, 8 KV heads, head_dim 4096 / 32 = 128, bfloat16, so one token's KV
    is 8 x (128 + 128) x 32 x 2 B = 131072 B (0.125 MiB). The log: ``Load weight begin. avail
    mem=78.58 GB`` (free at start), ``mem usage=15.11 GB`` (weights); the flags:
    mem_fraction_static 0.874, max_total_tokens 20480 (the docs CI's cap).

    Pool = free after weights - free at start x (1 - mfs)
         = (78.58 - 15.11) - 78.58 x 0.126 = 63.47 - 9.90108 = 53.56892 GiB
    tokens = floor(53.56892 x 2**30 / 131072) = floor(53.56892 x 8192) = floor(438836.59)
           = 438836 before the cap; min(438836, 20480) = 20480.
    The log prints ``#tokens: 20480``: error 0. KV GiB = 20480 x 131072 / 2**30 = 2.5 against
    the printed K 1.25 + V 1.25 GB: error 0."""
    row = bench_real.evaluate(load_case(ROOT / HAND_CASE))
    assert row.kv_tokens_uncapped == 438836
    assert row.kv_cap == 20480
    assert row.kv_tokens_est == 20480 and row.kv_tokens_log == 20480
    assert row.kv_tokens_err == 0.0
    assert row.kv_gib_est == pytest.approx(2.5) and row.kv_gib_log == pytest.approx(2.5)
    assert row.kv_gib_err == pytest.approx(0.0, abs=1e-12)
    # Weights: the index's total_size 16060522496 / 2**30 = 14.9575 GiB at tp 1 against the
    # log's ``mem usage=15.11 GB``: |14.9575 - 15.11| / 15.11 = 1.01 %.
    assert row.weights_est == pytest.approx(14.9575, abs=1e-4) and row.weights_log == 15.11
    assert row.weights_err == pytest.approx(0.0101, abs=1e-4)


def test_graph_memory_of_a_separate_draft_worked_by_hand() -> None:
    """docs-eagle-llama2-7b-h100-tp1-mf0849-bs4-20250811 (EAGLE, SGLang 0.5.0rc0): the target's
    ``Memory pool end. avail mem=55.73 GB`` to its capture end ``avail mem=54.79 GB`` is 0.94;
    the draft loads after that, its ``Memory pool end. avail mem=53.55 GB`` to the draft-extend
    capture end ``avail mem=53.56 GB`` is -0.01 (free memory rose 0.22 before the draft's
    capture); together 0.93 GiB, not the 2.17 from the target's pool end to the last capture
    (that would count the draft's weights and pool as graphs)."""
    case = load_case(ROOT / EAGLE_CASE)
    assert bench_real.graph_memory_log(case) == pytest.approx(0.93)
    row = bench_real.evaluate(case)
    assert row.graphs_log == pytest.approx(0.93)
    assert [name for name, _, _ in row.passes] == ["decode", "draft", "draft_extend"]


def test_fit_uses_only_its_half() -> None:
    """The priors the benchmark prints are fitted on the fit half alone (order-independent),
    and the held-out summary is computed with them."""
    cases, _ = bench_real.load_all()
    fit_half = [c for c in cases if bench_real.split(c.id) == "fit"]
    fitted = bench_real.fit(fit_half).coeffs
    assert fitted == bench_real.fit(list(reversed(fit_half))).coeffs
    lines: list[str] = []
    bench_real.main(["--quiet"], out=lines.append)
    text = "\n".join(lines)
    for name in bench_real.FITTED_FIELDS:
        assert f"  {name}: {getattr(bench_real.DEFAULT_COEFFICIENTS, name):g} -> " \
               f"{getattr(fitted, name):g}" in text


def test_launchers_priors_are_the_fit_halfs_figures() -> None:
    """The shipped graph and context priors are what the fit half gives (to the rounding
    docs/memory.md states), so the held-out figure is not a fit to itself, and graph memory on
    the held-out half is within the benchmark's target of 30 %."""
    cases, _ = bench_real.load_all()
    fitted = bench_real.fit([c for c in cases if bench_real.split(c.id) == "fit"]).coeffs
    shipped = bench_real.DEFAULT_COEFFICIENTS
    for name in bench_real.FITTED_FIELDS:
        assert getattr(shipped, name) == pytest.approx(getattr(fitted, name), rel=0.01,
                                                       abs=1e-9), name
    held, _ = bench_real.run_rows([c for c in cases if bench_real.split(c.id) == "held_out"],
                                  shipped)
    errors = [r.graphs_err for r in held if r.graphs_err is not None]
    assert len(errors) >= 10
    assert statistics.median(errors) <= 0.30


def test_lora_cases_get_the_pool_from_their_server_args() -> None:
    """The LoRA cases' server_args dumps give the pool: rank 256 x 2 per batch with unset
    targets is the labelled upper bound (2.50 GiB), the printed targets of -20250827 give
    3.75 GiB, an unset rank no prediction; the pool closes most of the free-at-ready gap."""
    rows = {}
    for d in case_dirs():
        if "-lora-" in d.name:
            with contextlib.suppress(CaseError):
                case = load_case(d)
                rows[case.id] = bench_real.evaluate(case)
    if not rows:
        pytest.skip("no LoRA case loads")
    capped = rows.get("docs-llama31-8b-lora-h100-tp1-fa3-mf0841-bs4-20260124")
    assert capped is not None and capped.lora_gib == pytest.approx(2.50)
    assert capped.lora is not None and "upper bound" in capped.lora
    printed = rows["docs-llama31-8b-lora-h100-tp1-mf0874-bs4-20250827"]
    assert printed.lora_gib == pytest.approx(3.75) and "upper bound" not in (printed.lora or "")
    unset = rows["docs-llama31-8b-lora-h100-tp1-mf0874-bs4-20250817"]
    assert unset.lora_gib is None and "not predicted" in (unset.lora or "")
    for r in (capped, printed):
        assert r.free_est is not None and r.free_est_no_lora is not None
        assert r.free_log is not None
        assert abs(r.free_est - r.free_log) < 0.5 < abs(r.free_est_no_lora - r.free_log)
    line = bench_real.lora_line(list(rows.values()))
    assert line.startswith("real LoRA pool: free at ready median |err| 3.04 GiB without it, "
                           "0.61 GiB with it")
