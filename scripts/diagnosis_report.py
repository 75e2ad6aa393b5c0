#!/usr/bin/env python3
"""Score ``launcher``'s classifier on the corpus of real SGLang logs (docs/diagnosis.md).

    .venv/bin/python scripts/diagnosis_report.py [--corpus DIR] [--misses] [--record]

The corpus lives in ``tests/fixtures/real_logs/``: one ``<id>.log`` (verbatim output from a
public issue thread or repository) and one ``<id>.toml`` (provenance and the label) per case.
Labels come from what the thread shows, never from what the classifier says. Label fields:

- ``outcome`` (required): a :class:`launcher.sglang.outcome.Outcome` value.
- ``phase`` (optional): a :class:`launcher.sglang.phases.Phase` value, when the thread shows it.
- ``repository``, ``url`` (required) and ``issue`` (when the source is a thread), ``version``,
  ``layout``, ``tags``, ``note``; ``[numbers]`` holds figures the log shows.
- inputs the supervisor would know but a pasted log cannot show: ``exit_status`` and
  ``hung = true`` (the thread says the process stayed alive without progress).

Prints, as Markdown: overall outcome accuracy, per-outcome accuracy, the confusion table, the
safety counts the test gates on (OOM/non-OOM confusions, increase/decrease confusions, serving
OOMs called ``oom_weights``) and, with ``--misses``, every miss. ``--record`` writes the
measured figures to ``<corpus>/recorded.toml``, the floor that
``tests/sglang/test_real_logs.py`` enforces.
Exit status: 0, or 2 for a corpus file that cannot be read (the message names the file).
"""

from __future__ import annotations

import argparse
import sys
import tomllib
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from launcher.sglang.classify import diagnose_text  # noqa: E402
from launcher.sglang.outcome import Diagnosis, Outcome  # noqa: E402
from launcher.sglang.phases import Phase  # noqa: E402

DEFAULT_CORPUS = ROOT / "tests" / "fixtures" / "real_logs"
RECORD_FILE = "recorded.toml"

# What the policy does with a memory outcome: raise --mem-fraction-static, or lower it.
INCREASE = frozenset({Outcome.KV_TOO_SMALL})
DECREASE = frozenset({Outcome.OOM_KV_CACHE, Outcome.OOM_GRAPH_CAPTURE, Outcome.OOM_RUNTIME})
REQUIRED = ("repository", "url", "outcome", "note")


class CorpusError(Exception):
    """A corpus file is missing, unreadable or mislabelled; the message names it."""


@dataclass(frozen=True)
class Case:
    """One corpus entry: the log text and its label."""

    id: str
    text: str
    outcome: Outcome
    phase: Phase | None
    exit_status: int | None
    hung: bool
    label: dict[str, Any] = field(hash=False, compare=False)


@dataclass(frozen=True)
class Result:
    case: Case
    diagnosis: Diagnosis

    @property
    def correct(self) -> bool:
        return self.diagnosis.outcome is self.case.outcome

    @property
    def phase_correct(self) -> bool | None:
        if self.case.phase is None:
            return None
        return self.diagnosis.phase is self.case.phase


def load_case(toml_path: Path) -> Case:
    """The case described by ``toml_path`` and its sibling ``.log``. Raises CorpusError."""
    log_path = toml_path.with_suffix(".log")
    try:
        label = tomllib.loads(toml_path.read_text(encoding="utf-8"))
        text = log_path.read_text(encoding="utf-8")
    except (OSError, tomllib.TOMLDecodeError, UnicodeDecodeError) as exc:
        raise CorpusError(f"{toml_path.name}: cannot read the case: {exc}") from exc
    missing = [k for k in REQUIRED if k not in label]
    if missing:
        raise CorpusError(f"{toml_path.name}: missing {', '.join(missing)}; add them")
    try:
        outcome = Outcome(label["outcome"])
        phase = Phase(label["phase"]) if "phase" in label else None
    except ValueError as exc:
        raise CorpusError(f"{toml_path.name}: {exc}; use launcher's Outcome/Phase values") from exc
    if not text.strip():
        raise CorpusError(f"{log_path.name}: empty log")
    return Case(
        id=toml_path.stem,
        text=text,
        outcome=outcome,
        phase=phase,
        exit_status=label.get("exit_status"),
        hung=bool(label.get("hung", False)),
        label=label,
    )


def load_corpus(corpus: Path = DEFAULT_CORPUS) -> list[Case]:
    """Every case of the corpus, sorted by id. Raises CorpusError on a bad or orphan file."""
    tomls = sorted(p for p in corpus.glob("*.toml") if p.name != RECORD_FILE)
    orphans = sorted(
        p.name for p in corpus.glob("*.log") if not p.with_suffix(".toml").exists()
    )
    if orphans:
        raise CorpusError(f"{orphans[0]}: a log without its .toml label; add the label")
    return [load_case(p) for p in tomls]


def evaluate(cases: list[Case]) -> list[Result]:
    return [
        Result(c, diagnose_text(c.text, c.exit_status, hung=c.hung)) for c in cases
    ]


@dataclass(frozen=True)
class Summary:
    total: int
    correct: int
    phase_total: int
    phase_correct: int
    oom_confusions: int  # memory outcome vs non-memory outcome, either way
    direction_confusions: int  # raise-mem-fraction vs lower-mem-fraction
    serving_called_weights: int  # oom_runtime labelled, oom_weights given

    @property
    def accuracy(self) -> float:
        return self.correct / self.total if self.total else 0.0


def summarize(results: list[Result]) -> Summary:
    oom = direction = serving = 0
    for r in results:
        want, got = r.case.outcome, r.diagnosis.outcome
        oom += want.is_memory != got.is_memory
        direction += (want in INCREASE and got in DECREASE) or (
            want in DECREASE and got in INCREASE
        )
        serving += want is Outcome.OOM_RUNTIME and got is Outcome.OOM_WEIGHTS
    phased = [r for r in results if r.phase_correct is not None]
    return Summary(
        total=len(results),
        correct=sum(r.correct for r in results),
        phase_total=len(phased),
        phase_correct=sum(bool(r.phase_correct) for r in phased),
        oom_confusions=oom,
        direction_confusions=direction,
        serving_called_weights=serving,
    )


def report(results: list[Result], *, misses: bool) -> str:
    s = summarize(results)
    lines = [
        f"Outcome accuracy: **{s.correct}/{s.total} ({s.accuracy:.1%})**; phase accuracy "
        f"where the thread shows the phase: {s.phase_correct}/{s.phase_total}.",
        "",
        f"- OOM/non-OOM confusions: {s.oom_confusions}",
        f"- increase/decrease confusions: {s.direction_confusions}",
        f"- serving-time OOMs called oom_weights: {s.serving_called_weights}",
        "",
        "| label | cases | correct | accuracy |",
        "| --- | ---: | ---: | ---: |",
    ]
    by_label: dict[Outcome, list[Result]] = {}
    for r in results:
        by_label.setdefault(r.case.outcome, []).append(r)
    for outcome in Outcome:
        rs = by_label.get(outcome, [])
        if rs:
            ok = sum(r.correct for r in rs)
            lines.append(f"| {outcome.value} | {len(rs)} | {ok} | {ok / len(rs):.0%} |")
    got_cols = [o for o in Outcome if any(r.diagnosis.outcome is o for r in results)]
    lines += [
        "",
        "Confusion table (rows: label, columns: classifier):",
        "",
        "| label \\ got | " + " | ".join(o.value for o in got_cols) + " |",
        "| --- |" + " ---: |" * len(got_cols),
    ]
    for outcome in Outcome:
        rs = by_label.get(outcome, [])
        if not rs:
            continue
        counts = Counter(r.diagnosis.outcome for r in rs)
        cells = [str(counts[o]) if counts[o] else "." for o in got_cols]
        lines.append(f"| {outcome.value} | " + " | ".join(cells) + " |")
    if misses:
        lines += ["", "Misses:", ""]
        for r in results:
            if not r.correct or r.phase_correct is False:
                d = r.diagnosis
                want_phase = r.case.phase.value if r.case.phase else "-"
                lines.append(
                    f"- `{r.case.id}`: label {r.case.outcome.value}/{want_phase}, got "
                    f"{d.outcome.value}/{d.phase.value}"
                )
    return "\n".join(lines)


def record(corpus: Path, s: Summary) -> None:
    (corpus / RECORD_FILE).write_text(
        "# Written by scripts/diagnosis_report.py --record; tests/sglang/test_real_logs.py\n"
        "# fails when the classifier gets fewer corpus outcomes right than this.\n"
        f"total = {s.total}\ncorrect = {s.correct}\nphase_correct = {s.phase_correct}\n",
        encoding="utf-8",
    )


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--corpus", type=Path, default=DEFAULT_CORPUS)
    ap.add_argument("--misses", action="store_true", help="list every miss")
    ap.add_argument("--record", action="store_true", help=f"write <corpus>/{RECORD_FILE}")
    args = ap.parse_args(argv)
    try:
        cases = load_corpus(args.corpus)
    except CorpusError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    results = evaluate(cases)
    print(report(results, misses=args.misses))
    if args.record:
        record(args.corpus, summarize(results))
    return 0


if __name__ == "__main__":
    sys.exit(main())
