"""docker-compose.yml: valid against the Compose specification's schema (and a broken copy is not),
every long-running service has a healthcheck, the one-shot services gate the tidegate ones, the
environment holds real settings, and what it mounts and scrapes exists.

`docker compose config` needs a Docker engine, which this machine lacks; the schema is the one
compose-go validates with (var/schemas/compose-spec.json, from infra/deploy-tools.sh).
"""

from __future__ import annotations

import copy
import json
from pathlib import Path
from typing import Any

import pytest
import yaml
from jsonschema import ValidationError
from jsonschema.validators import validator_for

from tests.unit.deploy.deploy_support import REPO, check_settings, require

COMPOSE = REPO / "docker-compose.yml"
TIDEGATE = {"init", "schemas", "registry", "gateway", "worker", "controller"}
ONE_SHOT = {"init", "schemas"}


def compose() -> dict[str, Any]:
    doc: dict[str, Any] = yaml.safe_load(COMPOSE.read_text())
    return doc


def services() -> dict[str, dict[str, Any]]:
    return dict(compose()["services"])


def validate(doc: dict[str, Any]) -> None:
    path = Path(require("var/schemas/compose-spec.json", "`make setup` (infra/deploy-tools.sh)"))
    schema = json.loads(path.read_text())
    validator_for(schema)(schema).validate(doc)


def test_the_compose_file_matches_the_compose_schema() -> None:
    validate(compose())


@pytest.mark.parametrize(
    ("path", "value"),
    [
        (("services", "worker", "healthchek"), {"test": ["CMD", "true"]}),
        (("services", "gateway", "depends_on", "schemas", "condition"), "service_completed"),
        (("services", "worker", "depends_on"), "registry"),
        (("services", "grafana", "ports"), "3000:3000"),
    ],
    ids=["misspelt-key", "bad-condition", "wrong-type", "not-a-list"],
)
def test_the_schema_rejects_a_broken_compose_file(path: tuple[str, ...], value: object) -> None:
    """The check can fail: each of these is rejected."""
    doc = copy.deepcopy(compose())
    node = doc
    for key in path[:-1]:
        node = node[key]
    node[path[-1]] = value
    with pytest.raises(ValidationError):
        validate(doc)


def test_every_long_running_service_has_a_healthcheck() -> None:
    for name, service in services().items():
        if name in ONE_SHOT:
            assert service["restart"] == "no", name
            continue
        assert service.get("restart") == "unless-stopped", name
        check = service.get("healthcheck")
        assert check, f"{name} has no healthcheck"
        assert not check.get("disable"), name
        assert check["test"][0] in {"CMD", "CMD-SHELL"}, name


def test_the_one_shot_services_gate_the_tidegate_processes() -> None:
    all_ = services()
    assert all_["schemas"]["command"] == ["schemas", "register"]
    assert all_["schemas"]["depends_on"]["registry"]["condition"] == "service_healthy"
    assert "tidegate stack topics" in all_["init"]["command"][0]
    for name in ("gateway", "worker", "controller"):
        needs = all_[name]["depends_on"]
        for one_shot in ONE_SHOT:
            assert needs[one_shot]["condition"] == "service_completed_successfully", name


def test_the_healthchecks_probe_what_the_processes_serve() -> None:
    all_ = services()

    def url(name: str) -> str:
        return str(all_[name]["healthcheck"]["test"][-1])

    env = {name: all_[name].get("environment", {}) for name in TIDEGATE}
    assert (
        url("gateway")
        == f"http://127.0.0.1:{env['gateway']['TIDEGATE_GATEWAY_PORT']}/v2/health/ready"
    )
    assert (
        url("worker") == f"http://127.0.0.1:{env['worker']['TIDEGATE_WORKER_METRICS_PORT']}/metrics"
    )
    command = all_["controller"]["command"]
    assert (
        url("controller")
        == f"http://127.0.0.1:{command[command.index('--metrics-port') + 1]}/metrics"
    )
    # The image has python but no curl or wget: the probe is python's urllib.
    for name in ("gateway", "worker", "controller"):
        assert all_[name]["healthcheck"]["test"][:3] == ["CMD", "python", "-c"], name


def test_each_worker_container_runs_one_process_on_the_scraped_port() -> None:
    """`tidegate worker` defaults to a process per core, child k on metrics port + k - 1: the
    healthcheck and Prometheus see port 9100 only, so the container runs one."""
    command = services()["worker"]["command"]
    assert command[command.index("--processes") + 1] == "1"


def test_the_worker_stop_grace_outlasts_its_drain() -> None:
    from tidegate.agents.worker_settings import WorkerSettings

    worker = services()["worker"]
    drain = float(worker["environment"].get("TIDEGATE_WORKER_DRAIN_TIMEOUT_S", 0) or 0) or float(
        WorkerSettings.model_fields["drain_timeout_s"].default
    )
    assert int(worker["stop_grace_period"].removesuffix("s")) > drain


@pytest.mark.parametrize("name", sorted(TIDEGATE))
def test_the_tidegate_environment_holds_real_settings(name: str) -> None:
    env = {k: str(v) for k, v in services()[name]["environment"].items()}
    # ${VAR:-default} is interpolated by compose; the default is what the file means.
    env = {k: v.split(":-", 1)[1].rstrip("}") if v.startswith("${") else v for k, v in env.items()}
    check_settings(env)


def test_what_the_services_mount_exists() -> None:
    for name, service in services().items():
        for volume in service.get("volumes", []):
            source = volume.split(":")[0]
            if source.startswith("./"):
                assert (REPO / source).exists(), f"{name} mounts {source}, which is missing"
            else:
                assert source in compose()["volumes"], f"{name}: undeclared volume {source}"


def test_prometheus_scrapes_every_tidegate_process_and_loads_the_rules() -> None:
    all_ = services()
    config = yaml.safe_load((REPO / "deploy" / "prometheus" / "prometheus.yml").read_text())
    targets = set()
    for job in config["scrape_configs"]:
        for static in job.get("static_configs", []):
            targets.update(static["targets"])
        for dns in job.get("dns_sd_configs", []):
            targets.update(f"{n}:{dns['port']}" for n in dns["names"])
    worker_port = all_["worker"]["environment"]["TIDEGATE_WORKER_METRICS_PORT"]
    command = all_["controller"]["command"]
    assert {
        f"gateway:{all_['gateway']['environment']['TIDEGATE_GATEWAY_PORT']}",
        f"worker:{worker_port}",
        f"controller:{command[command.index('--metrics-port') + 1]}",
    } <= targets
    mounts = dict(
        v.removesuffix(":ro").split(":", 1)
        for v in all_["prometheus"]["volumes"]
        if v.startswith("./")
    )
    assert mounts["./deploy/prometheus/rules"] + "/*.yml" in config["rule_files"]
