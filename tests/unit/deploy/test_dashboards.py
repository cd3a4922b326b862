"""The Grafana dashboards of deploy/grafana: every panel's PromQL reads metrics the code exports (or
recording rules of deploy/prometheus) and parses, and docker-compose provisions them."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path
from typing import Any

import pytest
import yaml

from tests.unit.deploy.deploy_support import REPO, metric_names, promql_metrics, require

GRAFANA = REPO / "deploy" / "grafana"
DASHBOARDS = sorted((GRAFANA / "dashboards").glob("*.json"))


def panels() -> list[tuple[str, dict[str, Any]]]:
    found = []
    for path in DASHBOARDS:
        board = json.loads(path.read_text())
        stack = list(board["panels"])
        while stack:
            panel = stack.pop(0)
            stack.extend(panel.get("panels", []))
            if panel.get("type") != "row":
                found.append((f"{path.name}: {panel['title']}", panel))
    return found


def expressions() -> list[tuple[str, str]]:
    return [(name, t["expr"]) for name, panel in panels() for t in panel.get("targets", [])]


def recorded() -> set[str]:
    return {
        rule["record"]
        for path in (REPO / "deploy" / "prometheus" / "rules").glob("*.yml")
        for group in yaml.safe_load(path.read_text())["groups"]
        for rule in group["rules"]
        if "record" in rule
    }


def unknown_metrics(exprs: list[tuple[str, str]]) -> dict[str, list[str]]:
    known = metric_names() | recorded()
    found = {name: sorted(promql_metrics(expr) - known) for name, expr in exprs}
    return {name: names for name, names in found.items() if names}


def test_the_dashboards_cover_what_the_issue_asks() -> None:
    assert {p.stem for p in DASHBOARDS} == {"tidegate-pipeline", "tidegate-lifecycle"}
    rows = {
        panel["title"]
        for path in DASHBOARDS
        for panel in json.loads(path.read_text())["panels"]
        if panel["type"] == "row"
    }
    for topic in ("Requests", "Errors", "Latency by stage", "Batches", "Consumer lag", "Rollouts"):
        assert topic in rows


def test_every_panel_queries_something() -> None:
    assert panels()
    for name, panel in panels():
        assert panel.get("targets"), f"{name} has no query"
        for target in panel["targets"]:
            assert promql_metrics(target["expr"]), f"{name}: no metric in {target['expr']!r}"
            assert target["datasource"]["uid"] == "prometheus", name


def test_every_metric_a_panel_reads_exists_in_the_code() -> None:
    assert unknown_metrics(expressions()) == {}


def test_a_misspelt_metric_is_caught() -> None:
    """The check above can fail: a panel reading a name no code exports is reported."""
    wrong = [("typo", "sum(rate(tidegate_worker_requets_total[$__rate_interval]))")]
    assert unknown_metrics(wrong) == {"typo": ["tidegate_worker_requets_total"]}


def test_every_expression_parses(tmp_path: Path) -> None:
    """Each query, as a recording rule, passes `promtool check rules` (Grafana's $__rate_interval
    stands in as 5m)."""
    tool = require("promtool", "`make setup` (Debian's prometheus package)")
    rules = [
        {"record": f"dashboard:query{i}", "expr": expr.replace("$__rate_interval", "5m")}
        for i, (_, expr) in enumerate(expressions())
    ]
    path = tmp_path / "queries.yml"
    path.write_text(yaml.safe_dump({"groups": [{"name": "dashboards", "rules": rules}]}))
    result = subprocess.run(
        [tool, "check", "rules", str(path)], capture_output=True, text=True, timeout=60
    )
    assert result.returncode == 0, result.stdout + result.stderr


def test_docker_compose_provisions_the_dashboards_and_the_datasource() -> None:
    compose = yaml.safe_load((REPO / "docker-compose.yml").read_text())
    mounts = dict(
        volume.removesuffix(":ro").split(":", 1)
        for volume in compose["services"]["grafana"]["volumes"]
        if volume.startswith("./")
    )
    assert mounts["./deploy/grafana/dashboards"] == "/etc/grafana/dashboards"
    assert mounts["./deploy/grafana/provisioning"] == "/etc/grafana/provisioning"
    provider = yaml.safe_load((GRAFANA / "provisioning/dashboards/tidegate.yml").read_text())
    assert provider["providers"][0]["options"]["path"] == "/etc/grafana/dashboards"
    source = yaml.safe_load((GRAFANA / "provisioning/datasources/prometheus.yml").read_text())
    (datasource,) = source["datasources"]
    assert datasource["uid"] == "prometheus"
    assert datasource["url"] == "http://prometheus:9090"
    assert "prometheus" in compose["services"]
    home = compose["services"]["grafana"]["environment"][
        "GF_DASHBOARDS_DEFAULT_HOME_DASHBOARD_PATH"
    ]
    assert (GRAFANA / "dashboards" / Path(home).name).exists()


@pytest.mark.parametrize("path", DASHBOARDS, ids=lambda p: p.name)
def test_panel_ids_are_unique_and_in_the_grid(path: Path) -> None:
    board = json.loads(path.read_text())
    ids = [panel["id"] for panel in board["panels"]]
    assert len(ids) == len(set(ids))
    for panel in board["panels"]:
        grid = panel["gridPos"]
        assert grid["x"] >= 0, panel["title"]
        assert grid["x"] + grid["w"] <= 24, panel["title"]
    assert board["uid"] == path.stem
