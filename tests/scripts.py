"""Import a benchmark script from ``scripts/bench/`` as a module, for the benchmarks' tests."""

from __future__ import annotations

import importlib
import sys
from pathlib import Path
from types import ModuleType

SCRIPTS = Path(__file__).resolve().parents[1] / "scripts" / "bench"


def import_script(name: str) -> ModuleType:
    """``scripts/bench/<name>.py`` as a module. ``scripts/bench/`` is on ``sys.path`` only while
    it loads: the benchmarks import each other (bench_oom <-> bench_estimator, bench_frontier
    -> bench_oom) by plain name."""
    sys.path.insert(0, str(SCRIPTS))
    try:
        return importlib.import_module(name)
    finally:
        sys.path.remove(str(SCRIPTS))
