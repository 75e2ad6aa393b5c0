#!/usr/bin/env python3
"""Mutation testing of launcher's pure core (docs/testing.md). Run it through ``scripts/mutation``,
which provides the separate ``.venv-mutation`` environment (mutmut 3.8.1 and launcher's
dependencies) this file runs in.

    scripts/mutation [MODULE ...] [--jobs N] [--survivors FILE]

MODULE is a path (``launcher/supervise/lifecycle.py``) or a name (``lifecycle``); none means all of
``MODULES``. Each module is mutated on its own, in a scratch copy of the tree under
``.mutation/<name>/`` (wiped first, so every run is full and nothing is cached), against only
the test files ``MODULES`` names for it. stdout gets exactly one line per module:

    mutation: launcher/supervise/lifecycle.py 512/555 = 92.3%

``killed`` counts mutants a test failed on, plus those that timed out (a test detected an
endless loop); ``total`` is every mutant mutmut generated, so a mutant no selected test reaches
counts as surviving. mutmut 3 does not mutate module-level constants and tables; those are
covered by tests at their boundaries. The surviving mutants (name, status and diff) go to the
survivors file (default ``.mutation/survivors.txt``); progress goes to stderr. Exit status: 0
when every module ran, 1 when mutmut failed on one (its output is printed), 2 for bad usage.
Not part of CI: a full run of all four modules takes minutes, not seconds.
"""

from __future__ import annotations

import argparse
import glob
import json
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
WORK = ROOT / ".mutation"

# module -> the test files (globs) that state its behaviour. Only these run against its mutants.
MODULES: dict[str, list[str]] = {
    "launcher/supervise/lifecycle.py": ["tests/supervision/test_lifecycle*.py"],
    "launcher/memory/policy.py": ["tests/memory/test_policy*.py"],
    # The real-log corpus and the evidence tests state most of what classify decides on real
    # logs (its newer code is reached by no other file).
    "launcher/sglang/classify.py": [
        "tests/sglang/test_classify*.py", "tests/sglang/test_logparse*.py",
        "tests/sglang/test_real_logs.py", "tests/sglang/test_evidence.py",
    ],
    "launcher/sglang/logparse.py": [
        "tests/sglang/test_logparse*.py", "tests/sglang/test_classify*.py",
    ],
}

# Run inside the scratch tree after ``mutmut run``: counts by status and every survivor's diff.
_REPORT = r"""
import json, sys
from mutmut.__main__ import walk_mutatable_files
from mutmut.mutation.data import SourceFileMutationData
from mutmut.mutation.diff_apply import get_diff_for_mutant
from mutmut.stats import status_by_exit_code
counts, survivors = {}, []
for path in walk_mutatable_files():
    m = SourceFileMutationData(path=path)
    m.load()
    for name, code in m.exit_code_by_key.items():
        status = status_by_exit_code[code]
        counts[status] = counts.get(status, 0) + 1
        if status not in ("killed", "timeout"):
            survivors.append({"name": name, "status": status,
                              "diff": get_diff_for_mutant(name, path=path)})
json.dump({"counts": counts, "survivors": survivors}, sys.stdout)
"""


# Examples per property test and mutant. CI runs 300 (tests/memory/test_policy_properties.py); every
# mutant reruns the property tests that reach it, and at 300 the policy alone took 25 minutes.
# The contract tests pin the policy's arithmetic, the property tests now mostly catch a mutant
# that breaks the search as a whole, which a few derandomized examples show.
PROPERTY_EXAMPLES = 10

_PROFILE = f"""

# Added by scripts/mutation (scratch copy only): fewer examples, no shrinking (a failing example
# kills the mutant). The property tests take max_examples from this profile when
# LAUNCHER_HYPOTHESIS_PROFILE=mutation (set by scripts/mutation).
from hypothesis import Phase as _Phase, settings as _settings  # noqa: E402

_settings.register_profile(
    "mutation",
    max_examples={PROPERTY_EXAMPLES},
    phases=[_Phase.explicit, _Phase.reuse, _Phase.generate, _Phase.target],
)

# Fastest tests first. mutmut runs a mutant's tests with -x, so a killed mutant costs the tests
# up to the first that fails; it passes them in no fixed order (a set), which often put the
# property tests (most of the CPU) before the contract tests that kill most mutants. The
# durations are those mutmut measured in its clean run (mutmut-stats.json, in the cwd of
# every test run); before that file exists the order is left as it is.
import json as _json  # noqa: E402
from pathlib import Path as _Path  # noqa: E402

_durations: dict[str, float] = {{}}


def pytest_collection_modifyitems(items: list[object]) -> None:
    if not _durations and _Path("mutmut-stats.json").is_file():
        _durations.update(_json.loads(_Path("mutmut-stats.json").read_text())["duration_by_test"])
    if _durations:
        items.sort(key=lambda item: _durations.get(item.nodeid, 0.0))  # type: ignore[attr-defined]
"""


def _toml_list(items: list[str]) -> str:
    return "[" + ", ".join(json.dumps(i) for i in items) + "]"


def _prepare(module: str, tests: list[str], work: Path) -> None:
    """A scratch tree with the package, the tests and a pyproject carrying mutmut's config."""
    if work.exists():
        shutil.rmtree(work)
    work.mkdir(parents=True)
    shutil.copytree(ROOT / "launcher", work / "launcher",
                    ignore=shutil.ignore_patterns("__pycache__"))
    shutil.copytree(ROOT / "tests", work / "tests", ignore=shutil.ignore_patterns("__pycache__"))
    # tests/sglang/test_real_logs.py loads scripts/diagnosis_report.py; some policy tests read the
    # simulated models' config.json under configs/sim/models.
    for extra in ("scripts", "configs"):
        shutil.copytree(ROOT / extra, work / extra, ignore=shutil.ignore_patterns("__pycache__"))
    # A failing example is enough to kill a mutant: the scratch copy's conftest registers a
    # hypothesis profile without the shrink phase (often the slowest part of a failure). A
    # fixed seed keeps the property tests' verdicts reproducible.
    with (work / "tests" / "conftest.py").open("a") as conftest:
        conftest.write(_PROFILE)
    # Each mutant's tests run in a process forked from mutmut's fork server. pytest's
    # unraisableexception plugin runs gc.collect() at the end of every session, which in a
    # forked child walks (and copies) the whole inherited heap: without it (and xdist, unused)
    # a killed mutant of the policy costs about 0.26 s of CPU instead of 0.45 s.
    config = "\n".join([
        "",
        "[tool.mutmut]",
        'source_paths = ["launcher"]',
        'also_copy = ["scripts/", "configs/"]',
        f"only_mutate = {_toml_list([module])}",
        f"pytest_add_cli_args_test_selection = {_toml_list(tests)}",
        'pytest_add_cli_args = ["-p", "no:cacheprovider", "--hypothesis-seed=0",'
        ' "--hypothesis-profile=mutation", "-p", "no:unraisableexception", "-p", "no:xdist"]',
        "use_git_change_detection = false",
        "",
    ])
    (work / "pyproject.toml").write_text((ROOT / "pyproject.toml").read_text() + config)


def _resolve(arg: str, ap: argparse.ArgumentParser) -> str:
    """The MODULES key for a path or name; a usage error (exit 2) naming the known ones."""
    if arg in MODULES:
        return arg
    for module in MODULES:
        if Path(module).stem == arg:
            return module
    if arg.endswith(".py") and (ROOT / arg).is_file():
        ap.error(f"{arg} has no test selection: add it to MODULES in scripts/mutation.py")
    ap.error(f"unknown module {arg!r}; known: " + ", ".join(MODULES))


def _run_module(module: str, jobs: int) -> tuple[int, int, list[dict[str, str]]] | None:
    tests = sorted({t for pattern in MODULES[module]
                    for t in glob.glob(pattern, root_dir=ROOT)})
    if not tests:
        print(f"scripts/mutation: no tests match {MODULES[module]} for {module}", file=sys.stderr)
        return None
    work = WORK / Path(module).stem
    _prepare(module, tests, work)
    print(f"[{module}] mutating against {' '.join(tests)} ({jobs} jobs)", file=sys.stderr)
    started = time.monotonic()
    env = {**os.environ, "PYTHONDONTWRITEBYTECODE": "1", "LAUNCHER_HYPOTHESIS_PROFILE": "mutation"}
    run = subprocess.run([sys.executable, "-m", "mutmut", "run", "--max-children", str(jobs)],
                         cwd=work, env=env, capture_output=True, text=True)
    if run.returncode != 0:
        print(run.stdout[-6000:], run.stderr[-6000:], sep="\n", file=sys.stderr)
        print(f"scripts/mutation: mutmut failed on {module} (exit {run.returncode})",
              file=sys.stderr)
        return None
    report = subprocess.run([sys.executable, "-c", _REPORT], cwd=work, env=env,
                            capture_output=True, text=True, check=True)
    data = json.loads(report.stdout)
    counts: dict[str, int] = data["counts"]
    killed = counts.get("killed", 0) + counts.get("timeout", 0)
    total = sum(counts.values())
    print(f"[{module}] {time.monotonic() - started:.0f}s, by status: "
          + ", ".join(f"{k} {v}" for k, v in sorted(counts.items())), file=sys.stderr)
    return killed, total, data["survivors"]


def main() -> int:
    ap = argparse.ArgumentParser(prog="scripts/mutation",
                                 description=__doc__.split("\n\n")[0] if __doc__ else None)
    ap.add_argument("modules", nargs="*", help="module paths or names (default: all)")
    ap.add_argument("--jobs", type=int, default=os.cpu_count() or 2,
                    help="mutants tested at once (default: CPU count)")
    ap.add_argument("--survivors", type=Path, default=WORK / "survivors.txt",
                    help="where the surviving mutants are written")
    args = ap.parse_args()
    if args.jobs < 1:
        ap.error("--jobs must be at least 1")
    modules = [_resolve(m, ap) for m in args.modules] or list(MODULES)
    failed = False
    started = time.monotonic()
    args.survivors.parent.mkdir(parents=True, exist_ok=True)
    with args.survivors.open("w") as out:
        for module in modules:
            result = _run_module(module, args.jobs)
            if result is None:
                failed = True
                continue
            killed, total, survivors = result
            score = 100.0 * killed / total if total else 100.0
            print(f"mutation: {module} {killed}/{total} = {score:.1f}%", flush=True)
            out.write(f"# {module}: {len(survivors)} not killed\n")
            for s in survivors:
                out.write(f"\n## {s['name']} ({s['status']})\n{s['diff'].rstrip()}\n")
            out.write("\n")
            out.flush()
    print(f"scripts/mutation: {len(modules)} module(s) in {time.monotonic() - started:.0f}s;"
          f" survivors written to {args.survivors}", file=sys.stderr)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
