"""The chart's observability: promtool checks and tests the alerting rules, the dashboard names only metrics
netclaim exports (each expression parsed by promtool), the chart installs the three objects when asked and
lints clean, and docs/operating.md describes every metric, alert and log field the code has."""

from __future__ import annotations

import ast
import json
import re
import shutil
import subprocess
from pathlib import Path
from typing import Any

import pytest
import yaml

from netclaim.core.events import EventReason
from netclaim.errors import PrerequisiteError
from netclaim.runtime import metrics
from netclaim_lab.binaries import built_bin_dir, built_promtool
from netclaim_lab.layout import REPO_ROOT

pytestmark = pytest.mark.programs
CHART = REPO_ROOT / "charts" / "netclaim"
ALERTS = CHART / "files" / "alerts.yaml"
DASHBOARD = CHART / "files" / "dashboard.json"
ALERT_TESTS = REPO_ROOT / "tests" / "monitoring" / "alerts_test.yaml"
OPERATING = REPO_ROOT / "docs" / "operating.md"
HISTOGRAM_SERIES = re.compile(r"_(bucket|sum|count)$")


def _program(find: Any, what: str) -> Path:
    try:
        return Path(find())
    except PrerequisiteError as err:
        pytest.fail(f"{err} ({what} is built with the pinned programs: `make bins`)")


@pytest.fixture(scope="module")
def promtool() -> Path:
    return _program(built_promtool, "promtool")


@pytest.fixture(scope="module")
def helm() -> Path:
    return _program(lambda: built_bin_dir() / "helm", "helm")


def _exported() -> dict[str, tuple[str, tuple[str, ...]]]:
    """Every metric family of the registry: name as scraped (counters with _total) -> (type, labels)."""
    families = {}
    for collector in metrics.REGISTRY._collector_to_names:
        name, kind = collector._name, collector._type  # type: ignore[attr-defined]
        if kind == "counter":
            name += "_total"
        families[name] = (kind, tuple(collector._labelnames))  # type: ignore[attr-defined]
    return families


def _named(expression: str) -> set[str]:
    return {HISTOGRAM_SERIES.sub("", m) for m in re.findall(r"netclaim_[a-z_]+", expression)}


def _expressions_of_dashboard() -> list[str]:
    dashboard = json.loads(DASHBOARD.read_text())
    return [target["expr"] for panel in dashboard["panels"] for target in panel["targets"]]


def test_promtool_checks_the_rules_and_their_cases_pass(promtool: Path, tmp_path: Path) -> None:
    shutil.copy(ALERTS, tmp_path / "alerts.yaml")
    shutil.copy(ALERT_TESTS, tmp_path / "alerts_test.yaml")
    checked = subprocess.run(
        [str(promtool), "check", "rules", "alerts.yaml"], cwd=tmp_path, capture_output=True, text=True
    )
    assert checked.returncode == 0, checked.stdout + checked.stderr
    alerts = [r["alert"] for g in yaml.safe_load(ALERTS.read_text())["groups"] for r in g["rules"]]
    assert f"SUCCESS: {len(alerts)} rules found" in checked.stdout
    tested = subprocess.run(
        [str(promtool), "test", "rules", "alerts_test.yaml"], cwd=tmp_path, capture_output=True, text=True
    )
    assert tested.returncode == 0 and "SUCCESS" in tested.stdout, tested.stdout + tested.stderr
    # the cases fire (and clear) at least these: attach failures, a pool filling up, stale slices, a NIC
    # down, an agent down or none at all, no controller
    cases = [c for test in yaml.safe_load(ALERT_TESTS.read_text())["tests"] for c in test["alert_rule_test"]]
    assert {c["alertname"] for c in cases if c["exp_alerts"]} >= {
        "NetclaimAgentDown",
        "NetclaimAgentsAbsent",
        "NetclaimControllerDown",
        "NetclaimAttachFailures",
        "NetclaimIPPoolNearlyFull",
        "NetclaimIPPoolFull",
        "NetclaimSlicesStale",
        "NetclaimNicLinkDown",
    }
    exported = _exported()
    for rule in (r for g in yaml.safe_load(ALERTS.read_text())["groups"] for r in g["rules"]):
        assert _named(rule["expr"]) <= set(exported), (
            f"{rule['alert']}: {_named(rule['expr']) - set(exported)}"
        )


def test_the_dashboard_shows_only_exported_metrics_and_promtool_parses_every_panel(
    promtool: Path, tmp_path: Path
) -> None:
    expressions = _expressions_of_dashboard()
    exported = set(_exported())
    shown = set().union(*(_named(e) for e in expressions))
    assert shown <= exported, shown - exported
    assert len(shown) >= 25, sorted(exported - shown)  # most of what netclaim exports has a panel
    # each expression as a recording rule: promtool parses it as Prometheus would
    rules = {
        "groups": [
            {
                "name": "dashboard",
                "rules": [{"record": f"netclaim:panel_{i}", "expr": e} for i, e in enumerate(expressions)],
            }
        ]
    }
    (tmp_path / "panels.yaml").write_text(yaml.safe_dump(rules))
    checked = subprocess.run(
        [str(promtool), "check", "rules", "panels.yaml"], cwd=tmp_path, capture_output=True, text=True
    )
    assert checked.returncode == 0, checked.stdout + checked.stderr


def _render(helm: Path, *args: str) -> list[dict[str, Any]]:
    result = subprocess.run(
        [str(helm), "template", "netclaim", str(CHART), "--namespace", "ops", *args],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert result.returncode == 0, result.stderr
    return [d for d in yaml.safe_load_all(result.stdout) if d]


ALL_ON = "monitoring.podMonitor.enabled=true,monitoring.rules.enabled=true,monitoring.dashboard.enabled=true"


def test_the_chart_installs_monitor_rules_and_dashboard_when_asked_and_lints_clean(helm: Path) -> None:
    kinds = {d["kind"] for d in _render(helm)}
    assert not kinds & {"PodMonitor", "PrometheusRule"}, kinds  # off by default: their CRDs may not exist
    objects = {(d["kind"], d["metadata"]["name"]): d for d in _render(helm, "--set", ALL_ON)}
    rule = objects[("PrometheusRule", "netclaim")]
    assert rule["spec"] == yaml.safe_load(ALERTS.read_text())
    dashboard = objects[("ConfigMap", "netclaim-dashboard")]
    assert dashboard["metadata"]["labels"] == {"grafana_dashboard": "1"}
    assert json.loads(dashboard["data"]["netclaim.json"]) == json.loads(DASHBOARD.read_text())
    monitor = objects[("PodMonitor", "netclaim")]
    [endpoint] = monitor["spec"]["podMetricsEndpoints"]
    selected = set(monitor["spec"]["selector"]["matchExpressions"][0]["values"])
    for kind, name in (("DaemonSet", "netclaim-agent"), ("Deployment", "netclaim-controller")):
        pod = objects[(kind, name)]["spec"]["template"]
        assert pod["metadata"]["labels"]["app.kubernetes.io/name"] in selected
        ports = {p["name"]: p["containerPort"] for p in pod["spec"]["containers"][0]["ports"]}
        assert endpoint["port"] in ports, (name, ports)
    lint = subprocess.run(
        [str(helm), "lint", str(CHART), "--set", ALL_ON], capture_output=True, text=True, timeout=120
    )
    assert lint.returncode == 0 and "0 chart(s) failed" in lint.stdout, lint.stdout + lint.stderr
    assert "[WARNING]" not in lint.stdout and "[ERROR]" not in lint.stdout, lint.stdout


def _documented_rows(heading: str) -> dict[str, list[str]]:
    """The table under `heading` of docs/operating.md: first cell (without backquotes) -> the other cells."""
    text = OPERATING.read_text()
    section = text[text.index(heading) :]
    section = section[: section.find("\n## ", 1)] if "\n## " in section[1:] else section
    rows = {}
    for line in section.splitlines():
        if line.startswith("| `"):
            cells = [c.strip() for c in line.strip("|").split("|")]
            for name in re.findall(r"`([^`]+)`", cells[0]):
                rows[name] = cells[1:]
    return rows


def test_every_metric_is_documented_with_its_type_and_labels() -> None:
    documented = _documented_rows("## Metrics")
    for name, (kind, labels) in _exported().items():
        assert name in documented, f"docs/operating.md does not describe {name}"
        assert documented[name][:2] == [kind, ", ".join(labels) or "—"], (name, documented[name])
    assert set(documented) == set(_exported()), set(documented) - set(_exported())


def test_every_alert_is_documented() -> None:
    alerts = {r["alert"] for g in yaml.safe_load(ALERTS.read_text())["groups"] for r in g["rules"]}
    assert set(_documented_rows("## Alerts")) == alerts


def test_every_event_reason_is_documented() -> None:
    assert set(_documented_rows("## Events")) == {str(reason) for reason in EventReason}


def _log_fields() -> set[str]:
    """The keys netclaim's code passes to its logs: dict literals given as `extra`, or built as `where`."""
    fields: set[str] = set()
    for path in (REPO_ROOT / "src" / "netclaim").rglob("*.py"):
        for node in ast.walk(ast.parse(path.read_text())):
            dicts: list[ast.expr] = []
            if isinstance(node, ast.Call):
                dicts += [k.value for k in node.keywords if k.arg == "extra"]
            elif isinstance(node, ast.Assign) and any(
                isinstance(t, ast.Name) and t.id == "where" for t in node.targets
            ):
                dicts.append(node.value)
            for value in dicts:
                if isinstance(value, ast.Dict):
                    fields |= {
                        k.value
                        for k in value.keys
                        if isinstance(k, ast.Constant) and isinstance(k.value, str)
                    }
    return fields


def test_every_log_field_is_documented() -> None:
    fields = _log_fields()
    assert {"claim", "error", "ms", "pod"} <= fields  # the scan sees the code's logs
    documented = set(_documented_rows("## Logs"))
    assert fields <= documented, f"docs/operating.md, Logs, lacks {sorted(fields - documented)}"
