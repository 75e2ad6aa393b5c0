"""configs/grafana/launcher.json: every query parses as Prometheus parses it (promtool) and
names only series launcher exports. (tests/hooks/test_alerts.py checks the same names against the
demo's live /metrics.)"""

from __future__ import annotations

from pathlib import Path

import yaml

from tests.demo_metrics import SCRAPE_SERIES, every_family_fed
from tests.promql import dashboard, dashboard_queries, from_grafana, names, promtool


def promtool_check(tmp_path: Path, queries: list[str]) -> tuple[int, str]:
    """``promtool check rules`` on ``queries`` as recording rules: Prometheus's own parser."""
    rules = [{"record": f"dashboard:query_{i}", "expr": from_grafana(query)}
             for i, query in enumerate(queries)]
    path = tmp_path / "queries.yml"
    path.write_text(yaml.safe_dump({"groups": [{"name": "dashboard", "rules": rules}]}))
    done = promtool("check", "rules", str(path))
    return done.returncode, done.stdout + done.stderr


def test_every_query_parses_with_promtool(tmp_path: Path) -> None:
    """Each query, Grafana's variables filled in as Grafana does, passes promtool check rules;
    a broken query would not (checked with one)."""
    queries = dashboard_queries()
    code, output = promtool_check(tmp_path, queries)
    assert 0 == code, output
    assert f"SUCCESS: {len(queries)} rules found" in output
    code, output = promtool_check(tmp_path, ["sum by (host (launcher_server_ready)"])
    assert 0 != code and "parse error" in output, output


def test_every_query_names_only_exported_series() -> None:
    """The series each query selects are served by launcher's Metrics (fed one event of each
    kind, so every family has samples), or `up` from Prometheus itself; the labels it uses
    are labels of those series."""
    served = every_family_fed().labels
    problems = {}
    for query in dashboard_queries():
        used = names(from_grafana(query))
        missing = used.series - served.keys() - SCRAPE_SERIES
        carried = {"job", "instance"}.union(*(served.get(name, ()) for name in used.series))
        if missing or used.labels - carried:
            problems[query] = (sorted(missing), sorted(used.labels - carried))
    assert {} == problems


def test_the_panels_cover_what_operators_watch() -> None:
    """Servers by state, attempts and outcomes, time to ready, the OOM back-off's steps,
    detection latency and per-host agent health each have a panel; ids are unique."""
    panels = dashboard()["panels"]
    titles = {panel["title"] for panel in panels}
    assert {"Servers by state", "Attempts and outcomes", "Time to ready", "OOM back-off steps",
            "Detection latency", "Per-host agent health"} <= titles
    assert len(panels) == len({panel["id"] for panel in panels})
    assert all(panel.get("targets") for panel in panels)
