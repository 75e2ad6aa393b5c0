"""First contact with the `launcher` command line, through the real CLI (a subprocess):
`--version`, the help text (exit codes, metavars), `LAUNCHER_CONFIG`, `history`'s
positional config, and `logs --tail/--attempt`."""

from __future__ import annotations

import pytest

import launcher
from tests.supervise import run_cli

pytestmark = pytest.mark.timeout(90)


def test_version_prints_the_package_version() -> None:
    result = run_cli("--version")

    assert result.returncode == 0, result.stderr
    assert result.stdout.strip() == f"launcher {launcher.__version__}"
