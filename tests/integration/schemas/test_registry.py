"""tidegate's registry against real Kafka, driven by confluent-kafka's own, unmodified client.

Every test module run starts its own registry subprocesses on free ports, each with a unique state
topic, so nothing here depends on a registry started by `make up`.
"""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
from confluent_kafka.admin import (  # type: ignore[attr-defined]
    AdminClient,
    ConfigResource,
    NewTopic,
    ResourceType,
)
from confluent_kafka.schema_registry import (
    ConfigCompatibilityLevel,
    Schema,
    SchemaRegistryClient,
    ServerConfig,
)
from confluent_kafka.schema_registry.avro import AvroDeserializer, AvroSerializer
from confluent_kafka.schema_registry.error import SchemaRegistryError
from confluent_kafka.serialization import MessageField, SerializationContext

from tests.integration.schemas.registry_keys import basic_auth, issue_key, revoke_key
from tests.support import unique, wait_for
from tidegate.core.kafka import make_consumer, make_producer
from tidegate.core.settings import KafkaSettings

REPO = Path(__file__).resolve().parents[3]


def record(*fields: dict[str, Any], name: str = "Order") -> str:
    return json.dumps({"type": "record", "name": name, "namespace": "it", "fields": list(fields)})


V1 = record({"name": "id", "type": "string"}, {"name": "qty", "type": "int"})
V2 = record(
    {"name": "id", "type": "string"},
    {"name": "qty", "type": "int"},
    {"name": "tenant", "type": "string", "default": "acme"},
)
NO_DEFAULT = record(
    {"name": "id", "type": "string"},
    {"name": "qty", "type": "int"},
    {"name": "tenant", "type": "string"},
)


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


class RegistryProcess:
    """`tidegate registry` as a subprocess on its own port and state topic."""

    def __init__(self, topic: str, log_dir: Path, credentials: tuple[str, str]) -> None:
        self.topic = topic
        self.credentials = credentials
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self._log_path = log_dir / f"{topic}.log"
        self._proc: subprocess.Popen[bytes] | None = None
        self._graceful_stops = 0

    def start(self) -> None:
        code = (
            "from tidegate.cli.serve_registry import serve; "
            f"serve(port={self.port}, topic={self.topic!r})"
        )
        env = {**os.environ, "PYTHONPATH": str(REPO)}
        with self._log_path.open("ab") as out:
            self._proc = subprocess.Popen(
                [sys.executable, "-c", code], cwd=REPO, env=env, stdout=out, stderr=out
            )
        wait_for(
            self._healthy,
            timeout=90,
            what=f"registry on {self.url}",
            retry_on=(httpx.TransportError,),  # until it listens
        )

    def _healthy(self) -> bool:
        assert self._proc is not None
        if self._proc.poll() is not None:
            raise AssertionError(f"registry exited: {self._log_path.read_text()[-3000:]}")
        return httpx.get(f"{self.url}/_health", timeout=2).status_code == 200

    def stop(self, sig: signal.Signals = signal.SIGTERM) -> None:
        """Stop with `sig`; on SIGTERM, insist on a graceful shutdown that closed the Kafka log."""
        assert self._proc is not None
        self._proc.send_signal(sig)
        # uvicorn re-raises the signal once it has shut down, so the status is the signal's.
        assert self._proc.wait(timeout=30) == -sig
        if sig == signal.SIGTERM:
            self._graceful_stops += 1
            closed = self._log_path.read_text().count("registry log closed")
            assert closed == self._graceful_stops, self._log_path.read_text()[-3000:]

    def client(self) -> SchemaRegistryClient:
        """A client with the test's admin key (deletes and compatibility changes need one); the
        registry verifies it against the stack's PostgreSQL."""
        user, password = self.credentials
        return SchemaRegistryClient({"url": self.url, "basic.auth.user.info": f"{user}:{password}"})

    def http(self) -> httpx.Client:
        return httpx.Client(base_url=self.url, auth=self.credentials, timeout=10)

    def close(self) -> None:
        """Make sure no registry outlives its test, even one that failed half-way."""
        if self._proc is not None and self._proc.poll() is None:
            self._proc.kill()
            self._proc.wait(timeout=30)


@pytest.fixture(scope="module")
def topics(admin: AdminClient) -> Iterator[list[str]]:
    created: list[str] = []
    yield created
    if created:
        for future in admin.delete_topics(created, operation_timeout=30).values():
            future.result()


@pytest.fixture(scope="module")
def schema_admin() -> Iterator[tuple[str, str]]:
    key = issue_key("admin")
    yield basic_auth(key)
    revoke_key(key)


@pytest.fixture(scope="module")
def registry(
    tmp_path_factory: pytest.TempPathFactory, topics: list[str], schema_admin: tuple[str, str]
) -> Iterator[RegistryProcess]:
    proc = RegistryProcess(unique("_schemas-it"), tmp_path_factory.mktemp("registry"), schema_admin)
    topics.append(proc.topic)
    try:
        proc.start()
        yield proc
        proc.stop()
    finally:
        proc.close()


@pytest.fixture
def restartable(
    tmp_path: Path, topics: list[str], schema_admin: tuple[str, str]
) -> Iterator[RegistryProcess]:
    proc = RegistryProcess(unique("_schemas-restart"), tmp_path, schema_admin)
    topics.append(proc.topic)
    yield proc
    proc.close()


def test_state_topic_is_compacted_with_one_partition(
    registry: RegistryProcess, admin: AdminClient
) -> None:
    found = admin.list_topics(topic=registry.topic, timeout=15).topics[registry.topic]
    assert len(found.partitions) == 1
    resource = ConfigResource(ResourceType.TOPIC, registry.topic)
    configs = admin.describe_configs([resource])[resource].result(15)
    assert configs["cleanup.policy"].value == "compact"


def test_confluent_serializer_round_trip_through_kafka(
    registry: RegistryProcess, admin: AdminClient, kafka_settings: KafkaSettings, topics: list[str]
) -> None:
    topic = unique("it-registry-orders")
    admin.create_topics([NewTopic(topic, num_partitions=1, replication_factor=1)])[topic].result()
    topics.append(topic)
    client = registry.client()
    serializer = AvroSerializer(client, V1)
    deserializer = AvroDeserializer(client)
    order = {"id": "o-1", "qty": 3}

    payload = serializer(order, SerializationContext(topic, MessageField.VALUE))
    assert payload is not None
    producer = make_producer(kafka_settings)
    producer.produce(topic, value=payload)
    assert producer.flush(15) == 0

    consumer = make_consumer(kafka_settings, unique("it-registry"))
    consumer.subscribe([topic])
    try:
        msg = wait_for(lambda: consumer.poll(0.5), timeout=30, what="the produced order")
    finally:
        consumer.close()
    assert msg.error() is None
    value = deserializer(msg.value(), SerializationContext(topic, MessageField.VALUE))
    assert value == order

    latest = client.get_latest_version(f"{topic}-value")
    assert latest.version == 1
    assert int.from_bytes(payload[1:5], "big") == latest.schema_id
    assert client.get_schema(latest.schema_id).schema_str == latest.schema.schema_str


def test_backward_incompatible_is_409_and_compatible_is_version_2(
    registry: RegistryProcess,
) -> None:
    subject = unique("it-compat")
    client = registry.client()
    first = client.register_schema(subject, Schema(V1, "AVRO"))
    assert client.register_schema(subject, Schema(V1, "AVRO")) == first

    assert client.test_compatibility(subject, Schema(NO_DEFAULT, "AVRO")) is False
    with pytest.raises(SchemaRegistryError) as refused:
        client.register_schema(subject, Schema(NO_DEFAULT, "AVRO"))
    assert refused.value.http_status_code == 409
    assert refused.value.error_code == 409
    assert "tenant" in refused.value.error_message

    with registry.http() as http:
        verbose = http.post(
            f"/compatibility/subjects/{subject}/versions?verbose=true",
            json={"schema": NO_DEFAULT},
        ).json()
    assert verbose["is_compatible"] is False
    assert any("field 'tenant'" in m and "no default" in m for m in verbose["messages"])

    assert client.test_compatibility_all_versions(subject, Schema(V2, "AVRO")) is True
    second = client.register_schema_full_response(subject, Schema(V2, "AVRO"))
    assert second.version == 2
    assert second.schema_id != first
    assert client.get_versions(subject) == [1, 2]
    assert client.lookup_schema(subject, Schema(V1, "AVRO")).version == 1


def test_errors_config_and_deletes(registry: RegistryProcess) -> None:
    client = registry.client()
    subject = unique("it-errors")

    def code_of(call: Any, *args: Any) -> int:
        with pytest.raises(SchemaRegistryError) as failed:
            call(*args)
        return int(failed.value.error_code)

    assert code_of(client.register_schema, subject, Schema("{not json", "AVRO")) == 42201
    assert code_of(client.register_schema, subject, Schema('{"type": "recrod"}', "AVRO")) == 42201
    assert code_of(client.get_latest_version, unique("it-nobody")) == 40401
    client.register_schema(subject, Schema(V1, "AVRO"))
    assert code_of(client.get_version, subject, 99) == 40402

    client.set_compatibility(subject, "FULL")
    assert client.get_compatibility(subject) == "FULL"
    assert client.get_config(subject).compatibility_level == ConfigCompatibilityLevel.FULL
    client.set_config(subject, ServerConfig(compatibility=ConfigCompatibilityLevel.NONE))
    assert client.get_compatibility(subject) == "NONE"
    assert client.delete_config(subject).compatibility_level == ConfigCompatibilityLevel.NONE
    assert code_of(client.set_compatibility, subject, "SIDEWAYS") == 42203

    client.register_schema(subject, Schema(V2, "AVRO"))
    assert code_of(client.delete_version, subject, 2, True) == 40407
    assert client.delete_version(subject, 2) == 2
    assert client.delete_version(subject, 2, True) == 2
    assert code_of(client.delete_subject, subject, True) == 40405
    assert client.delete_subject(subject) == [1]
    assert subject not in client.get_subjects()
    assert subject in client.get_subjects(deleted=True)
    assert code_of(client.delete_subject, subject) == 40404
    assert client.delete_subject(subject, True) == [1]
    assert subject not in client.get_subjects(deleted=True)
    assert code_of(client.get_versions, subject) == 40401


def snapshot(proc: RegistryProcess) -> dict[str, Any]:
    """Everything a client can see: subjects, versions (deleted too), ids, schemas, levels."""
    with proc.http() as http:

        def get(path: str) -> Any:
            return http.get(path).json()

        state: dict[str, Any] = {"config": get("/config"), "subjects": {}}
        for subject in get("/subjects?deleted=true"):
            versions = get(f"/subjects/{subject}/versions?deleted=true")
            live = get(f"/subjects/{subject}/versions") if subject in get("/subjects") else []
            state["subjects"][subject] = {
                "live": live,
                "versions": [
                    get(f"/subjects/{subject}/versions/{v}?deleted=true") for v in versions
                ],
                "config": get(f"/config/{subject}"),
            }
    return state


@pytest.mark.parametrize("kill", [signal.SIGTERM, signal.SIGKILL], ids=["sigterm", "sigkill"])
def test_restart_keeps_subjects_versions_and_ids(
    kill: signal.Signals, restartable: RegistryProcess
) -> None:
    proc = restartable
    proc.start()
    client = proc.client()
    a, b, c = unique("it-a"), unique("it-b"), unique("it-c")
    client.register_schema(a, Schema(V1, "AVRO"))
    client.register_schema(a, Schema(V2, "AVRO"))
    client.register_schema(b, Schema(V2, "AVRO"))  # same schema, another subject: same id
    client.register_schema(c, Schema('"string"', "AVRO"))
    client.set_compatibility(b, "FORWARD")
    client.set_compatibility(level="FULL")
    client.delete_version(a, 1)
    client.delete_subject(c)
    before = snapshot(proc)
    assert before["subjects"][b]["versions"][0]["id"] == before["subjects"][a]["versions"][1]["id"]

    proc.stop(kill)
    proc.start()
    assert snapshot(proc) == before

    # Allocation carries on from the rebuilt state rather than reusing ids or versions.
    client = proc.client()
    v3 = record(*json.loads(V2)["fields"], {"name": "note", "type": "string", "default": ""})
    third = client.register_schema_full_response(a, Schema(v3, "AVRO"))
    ids = [v["id"] for s in before["subjects"].values() for v in s["versions"]]
    assert (third.version, third.schema_id) == (3, max(ids) + 1)
    proc.stop()
