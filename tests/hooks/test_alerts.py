"""configs/prometheus/launcher-alerts.yml, checked by Prometheus's own promtool and against the
demo's live /metrics.

promtool comes from Debian's ``prometheus`` package (``scripts/setup.sh --test`` installs it as
root); without it these tests fail rather than skip, as a missing check must not pass.
"""

from __future__ import annotations

import subprocess
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml

from tests.demo_metrics import (
    SCRAPE_LABELS,
    SCRAPE_SERIES,
    Exposition,
    every_family_fed,
    names_and_labels,
    read_exposition,
    run_demo,
)
from tests.promql import dashboard_queries, from_grafana, names, promtool, promtool_path
from tests.simhost import REPO
from tests.supervise import SimSetup

RULES = REPO / "configs" / "prometheus" / "launcher-alerts.yml"
RULE_TESTS = REPO / "tests" / "data" / "launcher-alerts-test.yml"


def rules() -> list[dict[str, Any]]:
    """Every alerting rule of the file, all groups."""
    data = yaml.safe_load(RULES.read_text())
    return [rule for group in data["groups"] for rule in group["rules"] if "alert" in rule]


def rule_tests() -> list[dict[str, Any]]:
    """Every ``alert_rule_test`` entry of the promtool test file."""
    data = yaml.safe_load(RULE_TESTS.read_text())
    return [case for test in data["tests"] for case in test.get("alert_rule_test", [])]


def test_promtool_check_rules_passes() -> None:
    """The rules parse as Prometheus parses them (expressions and annotation templates)."""
    done = promtool("check", "rules", str(RULES))
    assert 0 == done.returncode, done.stdout + done.stderr
    assert f"SUCCESS: {len(rules())} rules found" in done.stdout


def test_promtool_rule_tests_pass() -> None:
    """promtool test rules: every alert fires (labels and rendered annotations as expected)
    where its test says, and stays quiet where its test says."""
    done = promtool("test", "rules", str(RULE_TESTS))
    assert 0 == done.returncode, done.stdout + done.stderr
    assert "SUCCESS" in done.stdout


def test_every_alert_has_a_test_that_fires_it_and_one_that_does_not() -> None:
    """Each alert of the rules file appears in the promtool tests once expected to fire and
    once expected to stay quiet; every rule has a runbook and a severity."""
    alerts = [rule["alert"] for rule in rules()]
    fired = {case["alertname"] for case in rule_tests() if case["exp_alerts"]}
    quiet = {case["alertname"] for case in rule_tests() if not case["exp_alerts"]}
    assert sorted(alerts) == sorted(set(alerts))
    assert set(alerts) == fired
    assert set(alerts) == quiet
    for rule in rules():
        assert {"summary", "description", "runbook"} <= set(rule["annotations"]), rule["alert"]
        assert rule["labels"]["severity"] in ("warning", "critical"), rule["alert"]


def mutated(tmp_path: Path, alert: str, expr: str) -> Path:
    """A copy of the rules and their tests where ``alert``'s expression is ``expr``; returns the
    test file's path (its rule_files point at the copy)."""
    data = yaml.safe_load(RULES.read_text())
    for group in data["groups"]:
        for rule in group["rules"]:
            if rule.get("alert") == alert:
                rule["expr"] = expr
    where = tmp_path / f"{alert}-{'never' if '0' in expr else 'always'}"
    where.mkdir()
    (where / "rules.yml").write_text(yaml.safe_dump(data))
    tests = yaml.safe_load(RULE_TESTS.read_text())
    tests["rule_files"] = ["rules.yml"]
    (where / "test.yml").write_text(yaml.safe_dump(tests))
    return where / "test.yml"


def test_the_rule_tests_catch_an_alert_that_never_or_always_fires(tmp_path: Path) -> None:
    """For each alert, a copy of the rules where it never fires (``vector(0) > 1``) and one
    where it always does (``vector(1)``): promtool's tests fail on both, so each alert's
    firing and quiet cases are really checked. One promtool run for all copies."""
    files = []
    for rule in rules():
        files.append(mutated(tmp_path, rule["alert"], "vector(0) > 1"))
        files.append(mutated(tmp_path, rule["alert"], "vector(1)"))
    # One stream: promtool prints "Unit Testing:  FILE" on stdout, then SUCCESS there or
    # FAILED on stderr, for each file in turn.
    done = subprocess.run([promtool_path(), "test", "rules", *map(str, files)], cwd=tmp_path,
                          stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, timeout=60)
    assert 0 != done.returncode
    verdicts: dict[str, str] = {}
    current = None
    for line in done.stdout.splitlines():
        if line.startswith("Unit Testing:"):
            current = line.split(":", 1)[1].strip()
        elif current is not None and line.strip().rstrip(":") in ("SUCCESS", "FAILED"):
            verdicts.setdefault(current, line.strip().rstrip(":"))
    assert {str(f): "FAILED" for f in files} == verdicts, done.stdout


# --- every name the rules and the dashboard use is served by the demo -------------------


@pytest.fixture(scope="module")
def demo_exposition(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Exposition]:
    """The demo's /metrics once its server is ready (the OOM and the relaunch behind it)."""
    sim = SimSetup.create(tmp_path_factory.mktemp("demo"))
    try:
        with run_demo(sim) as demo:
            yield read_exposition(demo.wait_ready())
    finally:
        sim.cleanup()


def check_names(query: str, served: dict[str, frozenset[str]]) -> list[str]:
    """Problems with ``query``: a series launcher does not serve, or a label that none of the
    series it names carries (the labels Prometheus adds at scrape allowed)."""
    used = names(query)
    problems = [f"{name}: not served" for name in sorted(used.series - served.keys() -
                                                           SCRAPE_SERIES)]
    carried = set(SCRAPE_LABELS).union(*(served.get(name, ()) for name in used.series))
    problems += [f"label {label}: no series of the query has it"
                 for label in sorted(used.labels - carried)]
    return problems


def test_the_demo_serves_every_series_the_rules_and_the_dashboard_name(
    demo_exposition: Exposition,
) -> None:
    """Each series name in the rules' expressions, the promtool tests' input series and the
    dashboard's queries is in the live /metrics of configs/demo.toml run by `launcher up`;
    each label they name is a label of those series. The demo has no router, no outage and
    no stall, so those families are in its /metrics without samples: their label names come
    from a Metrics fed those events."""
    # Every name must be in the demo's exposition (the fed one only adds label names).
    fed = every_family_fed()
    served = names_and_labels([demo_exposition, fed])
    assert set(fed.labels) <= set(demo_exposition.labels), "a family the demo does not serve"
    problems = {}
    for rule in rules():
        problems[rule["alert"]] = check_names(rule["expr"], served)
    for query in dashboard_queries():
        problems[query] = check_names(from_grafana(query), served)
    series = {s["series"] for t in yaml.safe_load(RULE_TESTS.read_text())["tests"]
              for s in t["input_series"]}
    for selector in series:
        problems[selector] = check_names(selector, served)
    assert {} == {where: found for where, found in problems.items() if found}
    assert dashboard_queries(), "the dashboard has no queries"
    # The check itself tells a name or a label launcher does not serve.
    assert ["launcher_no_such_series: not served"] == check_names("launcher_no_such_series",
                                                                  served)
    assert ["label outcome: no series of the query has it"] == check_names(
        'launcher_server_ready{outcome="oom_weights"}', served)
