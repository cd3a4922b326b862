"""docker-compose.yml: valid against the Compose specification's schema (and a broken copy is not),
every long-running service has a healthcheck, the one-shot services gate the tidegate ones, the
environment holds real settings, and what it mounts and scrapes exists.

`docker compose config` needs a Docker engine, which this machine lacks; the schema is the one
compose-go validates with (var/schemas/compose-spec.json, from infra/deploy-tools.sh).
"""

from __future__ import annotations

import copy
import json
import subprocess
from pathlib import Path
from typing import Any

import pytest
import yaml
from jsonschema import ValidationError
from jsonschema.validators import validator_for

from tests.unit.deploy.deploy_support import REPO, check_settings, require

COMPOSE = REPO / "docker-compose.yml"
TIDEGATE = {"kafka-setup", "init", "schemas", "registry", "gateway", "worker", "controller"}
ONE_SHOT = {"kafka-setup", "init", "schemas"}
# The services that use Kafka, each as its own principal (core/kafka_acls.py).
PRINCIPALS = {"registry", "gateway", "worker", "controller"}


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
    setup = all_["kafka-setup"]["command"][0]
    assert "tidegate stack topics" in setup
    assert "tidegate stack acls --apply --prune" in setup
    for name in ("gateway", "worker", "controller"):
        needs = all_[name]["depends_on"]
        for one_shot in ONE_SHOT:
            assert needs[one_shot]["condition"] == "service_completed_successfully", name


def test_each_kafka_client_runs_as_its_own_principal() -> None:
    from tidegate.core.kafka_acls import Component

    all_ = services()
    for name in PRINCIPALS:
        entry = all_[name]["entrypoint"]
        assert entry[:2] == ["sh", "/app/infra/compose-as.sh"], name
        assert Component(entry[2]).value == name
        assert all_[name]["depends_on"]["kafka-setup"]["condition"] == (
            "service_completed_successfully"
        )
        assert "models:/app/var" in all_[name]["volumes"], f"{name} reads its credentials there"
    assert (REPO / "infra" / "compose-as.sh").is_file()
    # No service but kafka-setup is told a Kafka address of its own: the env files hold them.
    for name, service in all_.items():
        env = service.get("environment", {})
        if name != "kafka-setup" and isinstance(env, dict):
            assert not any(k.startswith("TIDEGATE_KAFKA_") for k in env), name
    setup = all_["kafka-setup"]
    assert f"--listener {internal_listener()}" in setup["command"][0]
    assert "/app/var/kafka" in setup["command"][0]


def kafka_env() -> dict[str, str]:
    return {k: str(v) for k, v in services()["kafka"]["environment"].items()}


def listeners(key: str) -> dict[str, str]:
    return dict(item.split("://", 1) for item in kafka_env()[key].split(","))


def internal_listener() -> str:
    return listeners("KAFKA_ADVERTISED_LISTENERS")["INTERNAL"]


def test_only_the_brokers_loopback_is_a_super_user() -> None:
    env = kafka_env()
    protocols = dict(
        item.split(":") for item in env["KAFKA_LISTENER_SECURITY_PROTOCOL_MAP"].split(",")
    )
    bound = listeners("KAFKA_LISTENERS")
    for name, protocol in protocols.items():
        if protocol == "PLAINTEXT":  # ANONYMOUS, a super user: reachable from the container only
            assert bound[name].startswith("127.0.0.1:"), name
        else:
            assert protocol == "SASL_PLAINTEXT", name
    assert protocols["INTERNAL"] == protocols["HOST"] == "SASL_PLAINTEXT"
    assert env["KAFKA_SUPER_USERS"] == "User:ANONYMOUS"
    assert env["KAFKA_AUTHORIZER_CLASS_NAME"].endswith("StandardAuthorizer")
    assert env["KAFKA_ALLOW_EVERYONE_IF_NO_ACL_FOUND"] == "false"
    setup = services()["kafka-setup"]
    assert setup["network_mode"] == "service:kafka"
    assert setup["environment"]["TIDEGATE_KAFKA_BOOTSTRAP_SERVERS"] == bound["BROKER"]
    assert env["KAFKA_INTER_BROKER_LISTENER_NAME"] == "BROKER"


def test_compose_as_runs_tidegate_with_the_components_credentials(tmp_path: Path) -> None:
    (tmp_path / "worker.env").write_text(
        "TIDEGATE_KAFKA_SASL_USERNAME=tidegate-worker\nTIDEGATE_KAFKA_SASL_PASSWORD=pw\n"
    )
    fake = tmp_path / "tidegate"  # stands in for the image's `tidegate`: prints what it got
    fake.write_text('#!/bin/sh\necho "args: $*"\nenv\n')
    fake.chmod(0o755)
    env = {"PATH": f"{tmp_path}:/usr/bin:/bin", "TIDEGATE_KAFKA_ENV_DIR": str(tmp_path)}
    script = str(REPO / "infra" / "compose-as.sh")
    ran = subprocess.run(
        ["sh", script, "worker", "worker", "--processes", "1"],
        env=env,
        capture_output=True,
        text=True,
        timeout=30,
        check=True,
    )
    assert "args: worker --processes 1" in ran.stdout
    assert "TIDEGATE_KAFKA_SASL_USERNAME=tidegate-worker" in ran.stdout.splitlines()
    missing = subprocess.run(
        ["sh", script, "gateway", "gateway"], env=env, capture_output=True, text=True, timeout=30
    )
    assert missing.returncode == 1
    assert "gateway.env is missing" in missing.stderr


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
