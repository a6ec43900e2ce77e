"""The monitoring files under deploy/: Prometheus alert rules that promtool accepts and whose unit
tests pass, and a Grafana dashboard whose queries are valid PromQL over metrics a node exports.

promtool is the one on PATH, or the one ``scripts/ensure_tools.sh`` (run by ``make test``) fetched
next to the virtual environment's Python when there was none.
"""

from __future__ import annotations

import json
import re
import shutil
import subprocess
import sys
from functools import cache
from pathlib import Path
from typing import Any

import pytest
import yaml

from fastlane.runtime.metrics import Metrics

REPO = Path(__file__).resolve().parents[2]
RULES = REPO / "deploy" / "prometheus" / "fastlane-alerts.yaml"
RULE_TESTS = REPO / "deploy" / "prometheus" / "fastlane-alerts.test.yaml"
DASHBOARD = REPO / "deploy" / "grafana" / "fastlane-dashboard.json"
METRIC_NAME = re.compile(r"\bfastlane_[a-z_]+\b")
# Grafana's variables, as Prometheus would see them once Grafana has filled them in.
GRAFANA_VARIABLES = {"$__rate_interval": "5m", "$instance": ".*"}


def promtool() -> str:
    beside_python = Path(sys.executable).parent / "promtool"
    found = shutil.which("promtool") or (str(beside_python) if beside_python.exists() else None)
    if found is None:
        pytest.fail("promtool is missing: run scripts/ensure_tools.sh (make test does), or install Prometheus's "
                    "promtool")
    return found


def run_promtool(*args: str, cwd: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run([promtool(), *args], cwd=cwd, capture_output=True, text=True, timeout=120, check=False)


@cache
def dashboard() -> dict[str, Any]:
    loaded: dict[str, Any] = json.loads(DASHBOARD.read_text())
    return loaded


def dashboard_queries() -> list[str]:
    return [target["expr"] for panel in dashboard()["panels"] for target in panel.get("targets", [])]


def rule_expressions() -> list[str]:
    document = yaml.safe_load(RULES.read_text())
    return [rule["expr"] for group in document["groups"] for rule in group["rules"]]


def exported_metric_names() -> set[str]:
    """Every series name a node's registry exposes (histograms' _bucket/_count/_sum, counters' _total)."""
    names: set[str] = set()
    for family in Metrics().registry.collect():
        names.add(family.name)
        suffixes = {"histogram": ("_bucket", "_count", "_sum"), "counter": ("_total",)}.get(family.type, ())
        names.update(family.name + suffix for suffix in suffixes)
    return names


def test_the_alert_rules_pass_promtool_check() -> None:
    checked = run_promtool("check", "rules", RULES.name, cwd=RULES.parent)
    assert checked.returncode == 0, checked.stdout + checked.stderr


def test_the_alert_rules_fire_when_they_should_and_only_then() -> None:
    tested = run_promtool("test", "rules", RULE_TESTS.name, cwd=RULE_TESTS.parent)
    assert tested.returncode == 0, tested.stdout + tested.stderr


def test_every_dashboard_query_is_valid_promql(tmp_path: Path) -> None:
    # promtool parses expressions only inside rules: each query becomes a recording rule.
    rules = []
    for index, query in enumerate(dashboard_queries()):
        for variable, value in GRAFANA_VARIABLES.items():
            query = query.replace(variable, value)
        assert "$" not in query, f"a Grafana variable promtool cannot read is left in {query!r}"
        rules.append({"record": f"dashboard:query_{index}", "expr": query})
    (tmp_path / "dashboard.yaml").write_text(yaml.safe_dump({"groups": [{"name": "dashboard", "rules": rules}]}))
    checked = run_promtool("check", "rules", "dashboard.yaml", cwd=tmp_path)
    assert checked.returncode == 0, checked.stdout + checked.stderr


def test_rules_and_dashboard_read_only_metrics_a_node_exports() -> None:
    exported = exported_metric_names()
    for source, expressions in (("alert rules", rule_expressions()), ("dashboard", dashboard_queries())):
        used = {name for expression in expressions for name in METRIC_NAME.findall(expression)}
        assert used, f"the {source} read no fastlane metric"
        assert used <= exported, f"the {source} read metrics no node exports: {sorted(used - exported)}"


def test_every_metric_an_alert_reads_is_on_the_dashboard() -> None:
    """An alert that fires points at a panel that shows what it saw (through recording rules)."""
    document = yaml.safe_load(RULES.read_text())
    rules = [rule for group in document["groups"] for rule in group["rules"]]
    recorded = {rule["record"]: rule["expr"] for rule in rules if "record" in rule}

    def family(name: str) -> str:  # a histogram's series are one family
        return re.sub(r"_(bucket|count|sum)$", "", name)

    def read_by(expression: str) -> set[str]:
        names = {family(name) for name in METRIC_NAME.findall(expression)}
        for record, recorded_expression in recorded.items():
            if record in expression:
                names |= read_by(recorded_expression)
        return names

    shown = {family(name) for query in dashboard_queries() for name in METRIC_NAME.findall(query)}
    for rule in rules:
        if "alert" in rule:
            unseen = read_by(rule["expr"]) - shown
            assert not unseen, f"{rule['alert']} reads {sorted(unseen)}, which no dashboard panel shows"


def test_the_dashboard_shows_the_event_loop_lag_histogram_and_the_trigger_lag_slo() -> None:
    panels = dashboard()["panels"]
    heatmaps = [panel for panel in panels if panel["type"] == "heatmap"]
    assert any("fastlane_event_loop_lag_seconds_bucket" in target["expr"]
               for panel in heatmaps for target in panel["targets"])
    assert any("fastlane_trigger_lag_seconds_bucket" in query for query in dashboard_queries())
    ids = [panel["id"] for panel in panels]
    assert len(ids) == len(set(ids)), "panel ids must be unique"
    assert all(panel["gridPos"]["x"] + panel["gridPos"]["w"] <= 24 for panel in panels)


def test_every_alert_has_a_runbook_section() -> None:
    """The alerts' descriptions are one line; the runbook says what to run, under the alert's name."""
    document = yaml.safe_load(RULES.read_text())
    alerts = {rule["alert"] for group in document["groups"] for rule in group["rules"] if "alert" in rule}
    runbook = (REPO / "docs" / "runbook.md").read_text()
    sections = set(re.findall(r"^## (\w+)$", runbook, re.M))
    assert alerts, "no alert found in the rules file"
    assert sorted(alerts - sections) == [], "alerts without a section in docs/runbook.md"
    assert sorted(sections - alerts) == [], "runbook sections for alerts that no longer exist"


RUNBOOK_BASE = "https://fastlane.invalid/runbook/#"


def test_every_alert_links_its_runbook_section() -> None:
    """Alertmanager shows runbook_url: each is the placeholder base and the anchor mkdocs gives
    the alert's section (its name in lower case), which the runbook has."""
    document = yaml.safe_load(RULES.read_text())
    rules = [rule for group in document["groups"] for rule in group["rules"] if "alert" in rule]
    runbook = (REPO / "docs" / "runbook.md").read_text()
    anchors = {title.lower() for title in re.findall(r"^## (\w+)$", runbook, re.M)}
    for rule in rules:
        url = rule["annotations"].get("runbook_url", "")
        assert url == RUNBOOK_BASE + rule["alert"].lower(), rule["alert"]
        assert url.removeprefix(RUNBOOK_BASE) in anchors
