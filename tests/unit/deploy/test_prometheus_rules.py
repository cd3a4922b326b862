"""The alert rules of deploy/prometheus: promtool's unit tests pass, every alert has a case that
fires and one that stays quiet, a broken threshold makes them fail, and every metric they read
exists."""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path
from typing import Any

import pytest
import yaml

from tests.unit.deploy.deploy_support import REPO, metric_names, promql_metrics, require

PROMETHEUS = REPO / "deploy" / "prometheus"
RULES = sorted((PROMETHEUS / "rules").glob("*.yml"))
TESTS = PROMETHEUS / "tests" / "tidegate-alerts.test.yml"
INSTALLED_BY = "`make setup` (Debian's prometheus package, infra/install-system.sh)"


def promtool(*args: str | Path) -> subprocess.CompletedProcess[str]:
    tool = require("promtool", INSTALLED_BY)
    return subprocess.run(
        [tool, *map(str, args)], capture_output=True, text=True, timeout=120, check=False
    )


def rules() -> list[dict[str, Any]]:
    return [
        rule
        for path in RULES
        for group in yaml.safe_load(path.read_text())["groups"]
        for rule in group["rules"]
    ]


def alerts() -> set[str]:
    return {rule["alert"] for rule in rules() if "alert" in rule}


def test_the_rules_pass_promtool_check() -> None:
    result = promtool("check", "rules", *RULES)
    assert result.returncode == 0, result.stdout + result.stderr


def test_the_compose_scrape_config_passes_promtool_check() -> None:
    result = promtool("check", "config", PROMETHEUS / "prometheus.yml")
    assert result.returncode == 0, result.stdout + result.stderr


def test_the_alert_unit_tests_pass() -> None:
    result = promtool("test", "rules", TESTS)
    assert result.returncode == 0, result.stdout + result.stderr
    assert "SUCCESS" in result.stdout


def test_every_alert_has_a_case_that_fires_and_one_that_does_not() -> None:
    cases = [
        case
        for test in yaml.safe_load(TESTS.read_text())["tests"]
        for case in test["alert_rule_test"]
    ]
    fires = {c["alertname"] for c in cases if c.get("exp_alerts")}
    quiet = {c["alertname"] for c in cases if not c.get("exp_alerts")}
    assert alerts(), "no alert found"
    assert alerts() - fires == set(), "alerts no case expects to fire"
    assert alerts() - quiet == set(), "alerts no case expects to stay quiet"
    assert (fires | quiet) - alerts() == set(), "cases of alerts that do not exist"


def test_the_alerts_the_issue_asks_for_exist() -> None:
    expected = {
        "TidegateErrorBudgetFastBurn",
        "TidegateErrorBudgetSlowBurn",
        "TidegateLatencyBudgetFastBurn",
        "TidegateLatencyBudgetSlowBurn",
        "TidegateConsumerLagGrowing",
        "TidegateDeadLettersGrowing",
        "TidegatePartitionsWithoutWorker",
        "TidegateCanaryRolledBack",
        "TidegateWorkerCrashes",
        "TidegateModelTimeouts",
    }
    assert expected <= alerts()


def test_the_rules_read_only_metrics_the_code_exports() -> None:
    recorded = {rule["record"] for rule in rules() if "record" in rule}
    known = metric_names() | recorded
    unknown = {
        rule.get("alert") or rule["record"]: sorted(promql_metrics(rule["expr"]) - known)
        for rule in rules()
    }
    assert {name: names for name, names in unknown.items() if names} == {}
    # Each rule selects something: a parser that found nothing would make the check above vacuous.
    assert all(promql_metrics(rule["expr"]) for rule in rules())


def _dead_letter_tests(copy: Path) -> Path:
    """The promtool cases of the dead-letter alert alone, beside a copy of the rules."""
    shutil.copytree(PROMETHEUS / "rules", copy / "rules")
    (copy / "tests").mkdir()
    doc = yaml.safe_load(TESTS.read_text())
    doc["tests"] = [
        test
        for test in doc["tests"]
        if any(c["alertname"] == "TidegateDeadLettersGrowing" for c in test["alert_rule_test"])
    ]
    assert doc["tests"], "no promtool case of TidegateDeadLettersGrowing"
    path = copy / "tests" / "dead-letters.test.yml"
    path.write_text(yaml.safe_dump(doc, sort_keys=False))
    return path


@pytest.mark.parametrize("threshold", ["5000", "250"])
def test_a_broken_threshold_fails_the_promtool_tests(tmp_path: Path, threshold: str) -> None:
    tests = _dead_letter_tests(tmp_path)
    assert promtool("test", "rules", tests).returncode == 0, "the cases fail unbroken"

    alerts_file = tmp_path / "rules" / "tidegate-alerts.yml"
    text = alerts_file.read_text()
    seed = "sum by (topic) (increase(tidegate_worker_dead_letters_total[1h])) > 500"
    assert text.count(seed) == 1
    alerts_file.write_text(text.replace(seed, seed.removesuffix("500") + threshold))
    assert promtool("check", "rules", alerts_file).returncode == 0, "still valid rules"

    result = promtool("test", "rules", tests)
    assert result.returncode != 0, result.stdout
    assert "TidegateDeadLettersGrowing" in result.stdout + result.stderr
