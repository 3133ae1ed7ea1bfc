"""The shipped alert rules pass promtool's check and their unit tests, and neither the rules nor
the Grafana dashboard query a metric that the dashboard, its controllers or the engines do not
export."""

import json
import re
import shutil
import subprocess

import pytest
import yaml

from cuzk_engine.config import EngineConfig
from cuzk_engine.daemon.metrics import EngineMetrics
from cuzk_engine.engine.orchestrator import Engine
from tests.conftest import REPO
from vastmgr.controller.instrumentation import ControllerMetrics
from vastmgr.metrics.fleet import FleetCollector

PROMETHEUS = REPO / "deploy" / "prometheus"
DASHBOARD = REPO / "deploy" / "grafana" / "vastmgr-fleet.json"
# Every metric of ours is prefixed; PromQL functions, keywords and label names never are.
METRIC_NAME = re.compile(r"\b(?:vastmgr|cuzk)_[a-z0-9_]+")
SUFFIXES = {"counter": ("_total",), "histogram": ("_bucket", "_sum", "_count"), "gauge": ("",)}

promtool = shutil.which("promtool")
needs_promtool = pytest.mark.skipif(
    promtool is None, reason="promtool not installed (Debian's prometheus package; .ci/run has it)")


@pytest.fixture
def exported(db, settings) -> set[str]:
    """The sample names that /metrics and /metrics/engines can serve."""
    settings.VASTMGR_BUDGET_DOLLARS_PER_HOUR = 1.0  # that gauge is exported only when set
    families = [*FleetCollector().collect(),
                *ControllerMetrics("c", 15.0).registry.collect(),
                *EngineMetrics(Engine(EngineConfig())).registry.collect()]
    return {family.name + suffix for family in families for suffix in SUFFIXES[family.type]}


def queries_of_rules() -> list[str]:
    rules = yaml.safe_load((PROMETHEUS / "vastmgr-rules.yml").read_text())
    return [rule["expr"] for group in rules["groups"] for rule in group["rules"]]


def queries_of_dashboard() -> list[str]:
    dashboard = json.loads(DASHBOARD.read_text())
    queries = [target["expr"] for panel in dashboard["panels"]
               for target in panel.get("targets", [])]
    queries += [variable["definition"] for variable in dashboard["templating"]["list"]
                if variable["type"] == "query"]
    return queries


@needs_promtool
def test_rules_pass_promtool_check_and_unit_tests():
    check = subprocess.run([promtool, "check", "rules", "vastmgr-rules.yml"], cwd=PROMETHEUS,
                           capture_output=True, text=True, timeout=60, check=False)
    assert check.returncode == 0, check.stdout + check.stderr
    assert "SUCCESS: 7 rules found" in check.stdout
    tests = subprocess.run([promtool, "test", "rules", "vastmgr-rules.test.yml"],
                           cwd=PROMETHEUS, capture_output=True, text=True, timeout=60, check=False)
    assert tests.returncode == 0, tests.stdout + tests.stderr


def test_every_alert_has_a_unit_test():
    alerts = {rule["alert"] for rule in yaml.safe_load(
        (PROMETHEUS / "vastmgr-rules.yml").read_text())["groups"][0]["rules"]}
    tested = yaml.safe_load((PROMETHEUS / "vastmgr-rules.test.yml").read_text())["tests"]
    firing = {case["alertname"] for test in tested for case in test["alert_rule_test"]
              if case["exp_alerts"]}
    assert alerts == firing


@pytest.mark.parametrize("source", ["rules", "dashboard"])
def test_queries_name_only_exported_metrics(exported, source):
    queries = queries_of_rules() if source == "rules" else queries_of_dashboard()
    named = {name for query in queries for name in METRIC_NAME.findall(query)}
    assert named, "no metric found: the pattern is wrong"
    assert named - exported == set(), f"{source} query metrics nobody exports"


def test_a_misspelt_metric_is_caught(exported):
    # The check above must be able to fail.
    assert not {"vastmgr_host_upp"} <= exported
    assert "vastmgr_host_up" in exported and "cuzk_queue_depth" in exported


def test_dashboard_shape():
    dashboard = json.loads(DASHBOARD.read_text())
    rows = [panel["title"] for panel in dashboard["panels"] if panel["type"] == "row"]
    assert rows == ["Fleet overview", "Per host ($host)", "Cost", "Controllers"]
    ids = [panel["id"] for panel in dashboard["panels"]]
    assert len(ids) == len(set(ids))
    for panel in dashboard["panels"]:
        grid = panel["gridPos"]
        assert grid["x"] + grid["w"] <= 24, panel["title"]
        if panel["type"] != "row":
            assert panel["targets"] and all(t["expr"] for t in panel["targets"]), panel["title"]
