"""The Kubernetes manifests of deploy/k8s: kubeconform -strict passes them against the Kubernetes
and KEDA schemas (and rejects a broken one), and they agree with the code: real settings, real
probe endpoints, a grace period past the drain, KEDA never above the partition count.

Kustomize renders them: var/bin/kustomize (pinned, from `make setup`), or `kubectl kustomize`.
"""

from __future__ import annotations

import re
import shutil
import subprocess
from collections.abc import Iterator
from functools import cache
from pathlib import Path
from typing import Any

import pytest
import yaml
from typer.testing import CliRunner

from tests.unit.deploy.deploy_support import (
    REPO,
    SCHEMAS,
    check_settings,
    require,
    schema_manifest,
    secret_fields,
)
from tidegate.cli import app as cli_app

K8S = REPO / "deploy" / "k8s"
KUSTOMIZATIONS = ["base", "overlays/sasl-ssl", "overlays/pools"]
SECRET_EXAMPLE = K8S / "secret.example.yaml"
ALL_INTERFACES = "0.0.0.0"  # noqa: S104 (what the gateway must listen on in a pod)
TMP = "/tmp"  # noqa: S108 (an emptyDir in the pods)
# Read by libpq, not by tidegate's settings.
PASSTHROUGH = {"PGSSLMODE", "PGSSLROOTCERT"}
Doc = dict[str, Any]


@cache
def rendered(kustomization: str) -> tuple[Doc, ...]:
    folder = str(K8S / kustomization)
    kubectl = shutil.which("kubectl")
    if (REPO / "var" / "bin" / "kustomize").exists() or not kubectl:
        command = [require("var/bin/kustomize", "`make setup` (infra/deploy-tools.sh)"), "build"]
    else:
        command = [kubectl, "kustomize"]
    result = subprocess.run([*command, folder], capture_output=True, text=True, timeout=60)
    assert result.returncode == 0, result.stderr
    return tuple(doc for doc in yaml.safe_load_all(result.stdout) if doc)


def kind(docs: tuple[Doc, ...], wanted: str) -> list[Doc]:
    return [doc for doc in docs if doc["kind"] == wanted]


def named(docs: tuple[Doc, ...], wanted: str, name: str) -> Doc:
    (doc,) = [d for d in kind(docs, wanted) if d["metadata"]["name"] == name]
    return doc


def config(docs: tuple[Doc, ...]) -> dict[str, str]:
    return {k: str(v) for k, v in named(docs, "ConfigMap", "tidegate-config")["data"].items()}


def secret_example() -> dict[str, str]:
    doc = yaml.safe_load(SECRET_EXAMPLE.read_text())
    return {k: str(v) for k, v in doc["stringData"].items()}


def pod_specs(docs: tuple[Doc, ...]) -> Iterator[tuple[str, Doc]]:
    for doc in docs:
        if doc["kind"] in {"Deployment", "Job", "StatefulSet", "DaemonSet"}:
            yield doc["metadata"]["name"], doc["spec"]["template"]["spec"]


def container(docs: tuple[Doc, ...], deployment: str) -> Doc:
    spec = named(docs, "Deployment", deployment)["spec"]["template"]["spec"]
    (first, *_) = spec["containers"]
    return dict(first)


def kubeconform(*paths: Path | str, stdin: str | None = None, version: str) -> str:
    """Runs kubeconform -strict on paths (or stdin); returns its output; asserts nothing."""
    manifest = schema_manifest()
    assert version in manifest["kubernetes_versions"]
    tool = require("var/bin/kubeconform", "`make setup` (infra/deploy-tools.sh)")
    kube = "{{ .NormalizedKubernetesVersion }}-standalone{{ .StrictSuffix }}"
    kind_file = "{{ .ResourceKind }}{{ .KindSuffix }}.json"
    crd_file = "{{ .Group }}/{{ .ResourceKind }}_{{ .ResourceAPIVersion }}.json"
    result = subprocess.run(
        [
            tool,
            "-strict",
            "-summary",
            "-kubernetes-version",
            version,
            "-schema-location",
            f"{SCHEMAS}/kubernetes/{kube}/{kind_file}",
            "-schema-location",
            f"{SCHEMAS}/crds/{crd_file}",
            *(map(str, paths) if paths else ["-"]),
        ],
        input=stdin,
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    return f"exit {result.returncode}\n{result.stdout}{result.stderr}"


def versions() -> list[str]:
    # The versions infra/deploy-tools.sh builds; read here without failing collection.
    text = (REPO / "infra" / "deploy-tools.sh").read_text()
    match = re.search(r"^KUBERNETES_VERSIONS=(\S+)$", text, re.MULTILINE)
    assert match
    return match.group(1).split(",")


# --- kubeconform ---------------------------------------------------------------------------------


@pytest.mark.parametrize("version", versions())
@pytest.mark.parametrize("kustomization", KUSTOMIZATIONS)
def test_the_manifests_pass_kubeconform(kustomization: str, version: str) -> None:
    docs = rendered(kustomization)
    output = kubeconform(stdin=yaml.safe_dump_all(docs), version=version)
    assert output.startswith("exit 0"), output
    assert f"{len(docs)} resources found" in output, output
    assert f"Valid: {len(docs)}, Invalid: 0, Errors: 0, Skipped: 0" in output, output


@pytest.mark.parametrize("version", versions())
def test_the_secret_example_passes_kubeconform(version: str) -> None:
    output = kubeconform(SECRET_EXAMPLE, version=version)
    assert output.startswith("exit 0"), output


def _broken(docs: tuple[Doc, ...], how: str) -> tuple[list[Doc], str]:
    docs_ = [yaml.safe_load(yaml.safe_dump(d)) for d in docs]
    worker = next(d for d in docs_ if d["metadata"]["name"] == "tidegate-worker")
    scaled = next(d for d in docs_ if d["kind"] == "ScaledObject")
    if how == "misspelt-field":
        worker["spec"]["template"]["spec"]["terminationGracePeriod"] = 90
        return docs_, "additional properties 'terminationGracePeriod' not allowed"
    if how == "wrong-type":
        worker["spec"]["template"]["spec"]["containers"][0]["ports"][0]["containerPort"] = "9100"
        return docs_, "containerPort"
    if how == "keda-misspelt-field":
        scaled["spec"]["maxReplicas"] = 32
        return docs_, "additional properties 'maxReplicas' not allowed"
    if how == "keda-wrong-type":
        scaled["spec"]["triggers"][0]["metadata"]["lagThreshold"] = 1000
        return docs_, "lagThreshold"
    assert how == "unknown-kind"
    docs_.append(
        {"apiVersion": "keda.sh/v1alpha1", "kind": "ScaledThing", "metadata": {"name": "x"}}
    )
    return docs_, "could not find schema for ScaledThing"


@pytest.mark.parametrize(
    "how",
    ["misspelt-field", "wrong-type", "keda-misspelt-field", "keda-wrong-type", "unknown-kind"],
)
def test_kubeconform_rejects_a_broken_manifest(how: str) -> None:
    """The check can fail: a misspelt field and a wrong type, in a Kubernetes object and in KEDA's,
    and a kind without a schema are each rejected."""
    version = versions()[0]
    docs, reason = _broken(rendered("base"), how)
    output = kubeconform(stdin=yaml.safe_dump_all(docs), version=version)
    assert not output.startswith("exit 0"), output
    assert reason in output, output


# --- what the manifests say about the code -------------------------------------------------------


@pytest.mark.parametrize("kustomization", KUSTOMIZATIONS)
def test_the_config_and_the_secret_hold_real_settings(kustomization: str) -> None:
    """Every key names a field of a settings class (pydantic-settings would silently ignore a
    misspelt one) and every settings class loads from them."""
    data = config(rendered(kustomization))
    loaded = check_settings({**data, **secret_example()}, passthrough=PASSTHROUGH)
    assert loaded["TIDEGATE_GATEWAY_"].host == ALL_INTERFACES  # type: ignore[attr-defined]
    # Secrets never in the ConfigMap; the Secret holds secrets (and the user names beside them).
    assert secret_fields() & set(data) == set()
    assert {
        k for k in secret_example() if not k.endswith(("_USER", "_USERNAME"))
    } <= secret_fields()


def test_the_sasl_ssl_overlay_configures_kafka_for_it() -> None:
    docs = rendered("overlays/sasl-ssl")
    loaded = check_settings({**config(docs), **secret_example()}, passthrough=PASSTHROUGH)
    kafka = loaded["TIDEGATE_KAFKA_"]
    assert kafka.security_protocol == "SASL_SSL"  # type: ignore[attr-defined]
    ca = Path(kafka.ssl_ca_location)  # type: ignore[attr-defined]
    for name, spec in pod_specs(docs):
        mounts = {m["mountPath"] for m in spec["containers"][0]["volumeMounts"]}
        assert str(ca.parent) in mounts, f"{name} does not mount the Kafka CA"
        # PostgreSQL's certificate is verified, against a CA every pod mounts.
        assert config(docs)["PGSSLMODE"] == "verify-full"
        pg_ca = Path(config(docs)["PGSSLROOTCERT"])
        assert str(pg_ca.parent) in mounts, f"{name} does not mount the PostgreSQL CA"
    trigger = kind(docs, "ScaledObject")[0]["spec"]["triggers"][0]
    assert trigger["metadata"]["sasl"] == "scram_sha512"
    assert trigger["metadata"]["tls"] == "enable"
    auth = named(docs, "TriggerAuthentication", trigger["authenticationRef"]["name"])
    for ref in auth["spec"]["secretTargetRef"]:
        # KEDA reads the lag as the workers do, on their principal.
        assert ref["name"] in {"tidegate-kafka-worker", "tidegate-kafka-ca"}
        if ref["name"] == "tidegate-kafka-worker":
            assert ref["key"] in {"TIDEGATE_KAFKA_SASL_USERNAME", "TIDEGATE_KAFKA_SASL_PASSWORD"}


def test_the_sasl_ssl_overlay_runs_each_component_on_its_own_principal() -> None:
    from tidegate.core.kafka_acls import Component

    docs = rendered("overlays/sasl-ssl")
    for deployment in kind(docs, "Deployment"):
        component = deployment["metadata"]["name"].removeprefix("tidegate-")
        sources = deployment["spec"]["template"]["spec"]["containers"][0]["envFrom"]
        names = [s.get("secretRef", {}).get("name") for s in sources]
        # Last, so that its user and password take precedence over the shared Secret's.
        assert names[-1] == f"tidegate-kafka-{Component(component).value}", names
        assert names.index("tidegate-secrets") < len(names) - 1
    job = named(docs, "Job", "tidegate-setup")["spec"]["template"]["spec"]
    (acls,) = job["initContainers"]
    assert acls["args"] == ["stack", "acls", "--apply", "--prune"]
    assert acls["image"] == job["containers"][0]["image"]
    mounts = {m["mountPath"] for m in acls["volumeMounts"]}
    ca = Path(config(docs)["TIDEGATE_KAFKA_SSL_CA_LOCATION"])
    assert str(ca.parent) in mounts, "the ACL step reaches Kafka over TLS too"
    assert acls["securityContext"]["readOnlyRootFilesystem"] is True
    # The base (no Kafka authorization) references no such Secret.
    base = rendered("base")
    for deployment in kind(base, "Deployment"):
        sources = deployment["spec"]["template"]["spec"]["containers"][0]["envFrom"]
        assert all(
            not s.get("secretRef", {}).get("name", "").startswith("tidegate-kafka-")
            for s in sources
        )


@pytest.mark.parametrize("kustomization", KUSTOMIZATIONS)
def test_every_pod_reads_the_config_runs_locked_down_and_has_resources(kustomization: str) -> None:
    docs = rendered(kustomization)
    specs = dict(pod_specs(docs))
    pools = {name for name in specs if name.startswith("tidegate-worker-")}
    assert set(specs) - pools == {
        "tidegate-gateway",
        "tidegate-worker",
        "tidegate-controller",
        "tidegate-setup",
    }
    for name, spec in specs.items():
        # Service links would add TIDEGATE_GATEWAY_PORT=tcp://... for the gateway's Service.
        assert spec["enableServiceLinks"] is False, name
        assert spec["automountServiceAccountToken"] is False, name
        pod = spec["securityContext"]
        assert (pod["runAsNonRoot"], pod["runAsUser"], pod["runAsGroup"]) == (True, 10001, 10001)
        for c in [*spec.get("initContainers", []), *spec["containers"]]:
            sources = [next(iter(s.values()))["name"] for s in c["envFrom"]]
            # Then, in the SASL_SSL overlay, the component's own Kafka principal.
            assert sources[:2] == ["tidegate-config", "tidegate-secrets"], name
            assert sources[2:] in ([], [f"tidegate-kafka-{name.removeprefix('tidegate-')}"]), name
            security = c["securityContext"]
            assert security["readOnlyRootFilesystem"] is True, name
            assert security["allowPrivilegeEscalation"] is False, name
            assert security["capabilities"]["drop"] == ["ALL"], name
            for bound in ("requests", "limits"):
                assert {"cpu", "memory"} <= set(c["resources"][bound]), f"{name} {bound}"
            # A read-only root needs a writable /tmp, which HOME points at for caches under ~.
            assert TMP in {m["mountPath"] for m in c["volumeMounts"]}, name
            assert {"name": "HOME", "value": TMP} in c["env"], name
            assert c["image"].split(":")[0].endswith("tidegate"), name


def test_the_probes_use_the_endpoints_the_processes_serve() -> None:
    docs = rendered("base")
    data = config(docs)
    gateway = container(docs, "tidegate-gateway")
    port = {p["name"]: p["containerPort"] for p in gateway["ports"]}["http"]
    assert str(port) == data["TIDEGATE_GATEWAY_PORT"]
    assert gateway["readinessProbe"]["httpGet"]["path"] == "/v2/health/ready"
    assert gateway["livenessProbe"]["httpGet"]["path"] == "/v2/health/live"
    gateway_source = "\n".join(p.read_text() for p in (REPO / "gateway").rglob("*.py"))
    for path in ("/v2/health/ready", "/v2/health/live", "/metrics"):
        assert f'"{path}"' in gateway_source, f"the gateway no longer serves {path}"

    # Worker and controller serve no health endpoint: their probes read /metrics.
    worker = container(docs, "tidegate-worker")
    assert worker["ports"][0]["containerPort"] == int(data["TIDEGATE_WORKER_METRICS_PORT"])
    controller = container(docs, "tidegate-controller")
    args = controller["args"]
    metrics_port = int(args[args.index("--metrics-port") + 1])
    assert controller["ports"][0]["containerPort"] == metrics_port
    for c in (worker, controller):
        for probe in ("readinessProbe", "livenessProbe"):
            assert c[probe]["httpGet"] == {"path": "/metrics", "port": "metrics"}, c["name"]
    # The options the manifests pass exist (the controller has no env setting for its port).
    help_text = CliRunner().invoke(cli_app, ["controller", "--help"], env={"COLUMNS": "200"}).output
    assert "--metrics-port" in help_text
    assert "--migrate" in help_text
    annotations = named(docs, "Deployment", "tidegate-worker")["spec"]["template"]["metadata"]
    assert annotations["annotations"]["prometheus.io/port"] == data["TIDEGATE_WORKER_METRICS_PORT"]


def test_termination_outlasts_the_workers_drain() -> None:
    docs = rendered("base")
    drain = float(config(docs)["TIDEGATE_WORKER_DRAIN_TIMEOUT_S"])
    worker = named(docs, "Deployment", "tidegate-worker")["spec"]["template"]["spec"]
    # Drained, then the commit and flush that follow it.
    assert worker["terminationGracePeriodSeconds"] > drain + 30
    gateway = named(docs, "Deployment", "tidegate-gateway")["spec"]["template"]["spec"]
    pause = int(gateway["containers"][0]["lifecycle"]["preStop"]["exec"]["command"][-1])
    shutdown = check_settings(config(docs), passthrough=PASSTHROUGH)["TIDEGATE_GATEWAY_"]
    own = float(getattr(shutdown, "shutdown_timeout_s", 10))
    assert gateway["terminationGracePeriodSeconds"] > pause + own


def test_keda_scales_workers_on_lag_between_a_warm_pool_and_the_partition_count() -> None:
    docs = rendered("base")
    data = config(docs)
    (scaled,) = kind(docs, "ScaledObject")
    spec = scaled["spec"]
    assert spec["scaleTargetRef"]["name"] == "tidegate-worker"
    # KEDA owns the replica count: a `replicas` in the Deployment would fight it on every apply.
    assert "replicas" not in named(docs, "Deployment", "tidegate-worker")["spec"]
    partitions = int(data["TIDEGATE_TOPICS_PARTITIONS"])
    # Each pod runs --processes consumers; the default (one per core of the node) is not known here.
    args = container(docs, "tidegate-worker")["args"]
    processes = int(args[args.index("--processes") + 1])
    assert 1 <= spec["minReplicaCount"] <= spec["maxReplicaCount"]
    assert spec["maxReplicaCount"] * processes <= partitions
    assert "idleReplicaCount" not in spec, "the warm pool never scales to zero"
    (trigger,) = spec["triggers"]
    assert trigger["type"] == "kafka"
    meta = trigger["metadata"]
    assert int(meta["lagThreshold"]) > 0
    assert meta["allowIdleConsumers"] == "false"
    # KEDA reads the brokers, the group and the topic from the worker's environment: the same
    # variables the worker reads, and they are set.
    for key, variable in {
        "bootstrapServersFromEnv": "TIDEGATE_KAFKA_BOOTSTRAP_SERVERS",
        "consumerGroupFromEnv": "TIDEGATE_WORKER_GROUP_ID",
        "topicFromEnv": "TIDEGATE_TOPICS_REQUESTS",
    }.items():
        assert meta[key] == variable
        assert variable in data


def test_each_pool_has_its_workers_scaled_on_its_demand_and_its_lag() -> None:
    from tidegate.core.pools import pool_group, pool_topics
    from tidegate.core.settings import TopicSettings

    docs = rendered("overlays/pools")
    data = config(docs)
    scaled = {doc["spec"]["scaleTargetRef"]["name"]: doc for doc in kind(docs, "ScaledObject")}
    assert set(scaled) == {"tidegate-worker", "tidegate-worker-tabular"}
    env = {e["name"]: e.get("value") for e in container(docs, "tidegate-worker-tabular")["env"]}
    assert env["TIDEGATE_WORKER_POOL"] == "tabular"
    assert int(env["TIDEGATE_WORKER_MEMORY_BUDGET_MIB"]) * 2**20 < 4 * 2**30  # the memory limit
    spec = scaled["tidegate-worker-tabular"]["spec"]
    assert 1 <= spec["minReplicaCount"] <= spec["maxReplicaCount"]
    triggers = {t["type"]: t["metadata"] for t in spec["triggers"]}
    assert triggers["prometheus"]["query"] == 'max(tidegate_pool_desired_workers{pool="tabular"})'
    assert triggers["prometheus"]["threshold"] == "1"
    # The lag trigger names the pool's own topic and group, as the worker derives them.
    topics = TopicSettings(requests=data["TIDEGATE_TOPICS_REQUESTS"])
    assert triggers["kafka"]["topic"] == pool_topics(topics, "tabular").requests
    group = data.get("TIDEGATE_WORKER_GROUP_ID", "tidegate-workers")
    assert triggers["kafka"]["consumerGroup"] == pool_group(group, "tabular")
    # The default pool's workers are the base's, untouched; no selector picks the other's pods.
    assert scaled["tidegate-worker"] == next(d for d in kind(rendered("base"), "ScaledObject")) | {
        "metadata": scaled["tidegate-worker"]["metadata"]
    }
    default, tabular = (
        named(docs, "Deployment", n)["spec"] for n in ("tidegate-worker", "tidegate-worker-tabular")
    )
    assert (
        not default["selector"]["matchLabels"].items()
        <= tabular["template"]["metadata"]["labels"].items()
    )
    assert {c["image"] for _, spec in pod_specs(docs) for c in spec["containers"]} == {
        c["image"] for _, spec in pod_specs(rendered("base")) for c in spec["containers"]
    }


def test_the_partition_count_is_the_same_everywhere() -> None:
    """The ConfigMap, the Compose stack's default, the settings' default and the alert on
    partitions without a worker all say 32."""
    from tidegate.core.settings import TopicSettings

    partitions = config(rendered("base"))["TIDEGATE_TOPICS_PARTITIONS"]
    assert partitions == str(TopicSettings.model_fields["partitions"].default)
    compose = (REPO / "docker-compose.yml").read_text()
    assert f"${{TIDEGATE_TOPICS_PARTITIONS:-{partitions}}}" in compose
    alerts = (REPO / "deploy" / "prometheus" / "rules" / "tidegate-alerts.yml").read_text()
    assert re.search(rf"or on\(\) vector\(0\)\s*\)\s*< {partitions}\n", alerts)


def test_gateway_replicas_fit_the_reply_partitions() -> None:
    docs = rendered("base")
    data = config(docs)
    replicas = named(docs, "Deployment", "tidegate-gateway")["spec"]["replicas"]
    gateway = check_settings(data, passthrough=PASSTHROUGH)["TIDEGATE_GATEWAY_"]
    per_pod = int(getattr(gateway, "workers", 1))
    assert replicas * per_pod <= int(data["TIDEGATE_TOPICS_REPLY_PARTITIONS"])


@pytest.mark.parametrize("kustomization", KUSTOMIZATIONS)
def test_each_deployment_has_a_disruption_budget_that_allows_an_eviction(
    kustomization: str,
) -> None:
    docs = rendered(kustomization)
    budgets = kind(docs, "PodDisruptionBudget")
    for deployment in kind(docs, "Deployment"):
        labels = deployment["spec"]["template"]["metadata"]["labels"]
        selecting = [
            b for b in budgets if b["spec"]["selector"]["matchLabels"].items() <= labels.items()
        ]
        name = deployment["metadata"]["name"]
        assert len(selecting) == 1, name
        budget = selecting[0]["spec"]
        replicas = deployment["spec"].get("replicas")
        if "minAvailable" in budget and replicas is not None:
            assert budget["minAvailable"] < replicas, f"{name}: a drain could never evict one"
        if "maxUnavailable" in budget:
            assert budget["maxUnavailable"] >= 1, name


def test_the_models_volume_is_shared_and_writable() -> None:
    docs = rendered("base")
    (claim,) = kind(docs, "PersistentVolumeClaim")
    assert claim["spec"]["accessModes"] == ["ReadWriteMany"]
    store = config(docs)["TIDEGATE_MODELS_STORE_DIR"]
    for name in ("tidegate-gateway", "tidegate-worker", "tidegate-controller"):
        (mount,) = [m for m in container(docs, name)["volumeMounts"] if m["name"] == "models"]
        assert store.startswith(mount["mountPath"] + "/"), name
        # Workers write too: a version's first fetch links its files into the store.
        assert not mount.get("readOnly", False), name
