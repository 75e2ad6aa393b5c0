"""PromQL for the rule and dashboard tests: what a query names (promql-parser's tree), promtool
(Prometheus's own parser and rule tester), and the dashboard's queries.

promql-parser only lists names: whether a query is valid PromQL is promtool's call.
"""

from __future__ import annotations

import json
import re
import shutil
import subprocess
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import promql_parser as pq
import pytest

from tests.simhost import REPO

DASHBOARD = REPO / "configs" / "grafana" / "launcher.json"


@dataclass
class Names:
    """The series names a query selects and every label name it mentions (matchers, by /
    without, on / ignoring, group_left / group_right)."""

    series: set[str] = field(default_factory=set)
    labels: set[str] = field(default_factory=set)


def names(query: str) -> Names:
    """The names ``query`` uses. Raises ValueError when promql-parser cannot parse it, or when
    a selector has no metric name (``{job="x"}``): every query here names its series."""
    found = Names()

    def visit(node: pq.Expr) -> None:
        if isinstance(node, pq.VectorSelector):
            name = node.name or next(
                (m.value for m in node.matchers.matchers if m.name == "__name__"), None)
            if not name:
                raise ValueError(f"a selector without a metric name in {query!r}")
            found.series.add(name)
            found.labels.update(m.name for m in node.matchers.matchers if m.name != "__name__")
        elif isinstance(node, pq.AggregateExpr) and node.modifier is not None:
            found.labels.update(node.modifier.labels)
        elif isinstance(node, pq.BinaryExpr) and node.modifier is not None:
            if node.modifier.matching is not None:
                found.labels.update(node.modifier.matching.labels)
            found.labels.update(node.modifier.group_labels or ())

    pq.walk(pq.parse(query), pre_visit=visit)
    return found


# Grafana's built-in interval variables and the dashboard's own ($server, $datasource).
_GRAFANA_INTERVALS = ("$__rate_interval", "$__interval", "$__range")


def from_grafana(query: str) -> str:
    """A dashboard query as Prometheus receives it: Grafana's interval variables as ``5m``,
    ``$server`` (a regex matcher's value) as ``.*``, its "All"."""
    for variable in _GRAFANA_INTERVALS:
        query = query.replace(variable, "5m")
    return query.replace("$server", ".*")


def promtool_path() -> str:
    """promtool's path; fails the test (never skips) when it is not installed."""
    found = shutil.which("promtool")
    if found is None:
        pytest.fail("promtool is not installed: run scripts/setup.sh --test as root (it installs "
                    "Debian's prometheus package), or apt-get install prometheus")
    return found


def promtool(*args: str, cwd: Path = REPO) -> subprocess.CompletedProcess[str]:
    """``promtool *args``, output captured."""
    return subprocess.run([promtool_path(), *args], cwd=cwd, capture_output=True, text=True,
                          timeout=60)


def dashboard() -> dict[str, Any]:
    data: dict[str, Any] = json.loads(DASHBOARD.read_text())
    return data


def dashboard_queries() -> list[str]:
    """Every panel target's PromQL, then the template variables' queries."""
    data = dashboard()
    queries = [target["expr"] for panel in data["panels"] for target in panel.get("targets", [])]
    for variable in data["templating"]["list"]:
        if variable["type"] == "query":
            # label_values(SERIES, LABEL) is Grafana's; Prometheus is asked for SERIES.
            found = re.fullmatch(r"label_values\((.+), *\w+\)", variable["definition"])
            assert found, variable["definition"]
            queries.append(found.group(1))
    return queries
