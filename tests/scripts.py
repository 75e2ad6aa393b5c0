"""Import a script from ``scripts/`` as a module, for tests of benchmarks and reports."""

from __future__ import annotations

import importlib
import sys
from pathlib import Path
from types import ModuleType

SCRIPTS = Path(__file__).resolve().parents[1] / "scripts"


def import_script(name: str) -> ModuleType:
    """``scripts/<name>.py`` as a module. ``scripts/`` is on ``sys.path`` only while it loads:
    the benchmarks import each other (bench_oom <-> bench_estimator, bench_frontier ->
    bench_oom) by plain name."""
    sys.path.insert(0, str(SCRIPTS))
    try:
        return importlib.import_module(name)
    finally:
        sys.path.remove(str(SCRIPTS))
