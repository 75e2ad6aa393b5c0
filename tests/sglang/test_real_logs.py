"""The classifier on real SGLang logs from public threads (tests/fixtures/real_logs/).

The corpus and its labels are data (see scripts/diagnosis_report.py for the format); these tests
score the classifier on it and fail when it gets worse than the recorded level or makes one of
the mistakes that would send the supervisor the wrong way: an OOM taken for something else (or
the reverse), "raise --mem-fraction-static" taken for "lower it" (or the reverse), or a server
that ran out of memory while serving declared unable to hold its weights.
"""

from __future__ import annotations

import importlib.util
import sys
import tomllib
from pathlib import Path
from types import ModuleType

import pytest

from launcher.sglang.outcome import Outcome

ROOT = Path(__file__).resolve().parents[2]
CORPUS = ROOT / "tests" / "fixtures" / "real_logs"


def _report_module() -> ModuleType:
    spec = importlib.util.spec_from_file_location(
        "diagnosis_report", ROOT / "scripts" / "diagnosis_report.py"
    )
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module
    spec.loader.exec_module(module)
    return module


report = _report_module()


@pytest.fixture(scope="module")
def results() -> list[object]:
    return list(report.evaluate(report.load_corpus(CORPUS)))


def test_corpus_is_labelled_with_provenance() -> None:
    cases = report.load_corpus(CORPUS)
    assert len(cases) >= 40
    for case in cases:
        assert case.label["url"].startswith("https://"), case.id
        assert "/" in case.label["repository"], case.id
    # Every outcome a real log can show is covered (the supervisor's hang needs no log), but
    # 0.5.23's hybrid state-cache errors: no public issue thread quotes them yet (searched
    # 2026-12-01); tests/sglang/test_classify.py covers them with SGLang's own message text.
    covered = {case.outcome for case in cases}
    expected = set(Outcome) - {Outcome.HYBRID_STATE_TOO_SMALL}
    assert covered >= expected, sorted(o.value for o in expected - covered)


def test_accuracy_does_not_drop_below_the_recorded_level(results: list[object]) -> None:
    recorded = tomllib.loads((CORPUS / report.RECORD_FILE).read_text(encoding="utf-8"))
    summary = report.summarize(results)
    assert summary.total == recorded["total"], "corpus changed: re-run the report with --record"
    assert summary.correct >= recorded["correct"], report.report(results, misses=True)
    assert summary.phase_correct >= recorded["phase_correct"], report.report(results, misses=True)


def test_no_oom_is_taken_for_a_non_oom_or_the_reverse(results: list[object]) -> None:
    assert report.summarize(results).oom_confusions == 0, report.report(results, misses=True)


def test_raise_and_lower_mem_fraction_are_never_confused(results: list[object]) -> None:
    assert report.summarize(results).direction_confusions == 0, report.report(
        results, misses=True
    )


def test_no_serving_time_oom_is_called_a_weight_load_oom(results: list[object]) -> None:
    assert report.summarize(results).serving_called_weights == 0, report.report(
        results, misses=True
    )


def test_a_bad_label_is_reported_with_the_file_name(tmp_path: Path) -> None:
    (tmp_path / "x.log").write_text("Killed\n", encoding="utf-8")
    (tmp_path / "x.toml").write_text(
        'repository = "a/b"\nurl = "https://x"\nnote = "n"\noutcome = "exploded"\n',
        encoding="utf-8",
    )
    with pytest.raises(report.CorpusError, match=r"x\.toml: .*exploded"):
        report.load_corpus(tmp_path)


def test_a_log_without_a_label_is_refused(tmp_path: Path) -> None:
    (tmp_path / "lonely.log").write_text("Killed\n", encoding="utf-8")
    with pytest.raises(report.CorpusError, match=r"lonely\.log"):
        report.load_corpus(tmp_path)
