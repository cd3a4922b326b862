"""The pipeline against a schema registry we did not write: Apicurio Registry's
Confluent-compatible API (`make setup` builds it into var/apicurio). The schemas are registered,
the producer client encodes, a worker decodes and answers, and results are read back, all through
that registry alone, so "Confluent-compatible" is tested rather than claimed
(docs/decisions/026-a-third-party-registry.md)."""

from __future__ import annotations

import json
import struct
import subprocess
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest
from confluent_kafka import TopicPartition

from tests.integration.gateway.gateway_fixtures import GatewayServer
from tests.integration.workers import Reader, Stack, in_thread, running
from tests.support import free_port, unique, wait_for
from tidegate.clients.producer import TidegateProducer
from tidegate.core.kafka import make_consumer
from tidegate.core.settings import SchemaRegistrySettings
from tidegate.gateway.auth.auth_settings import AuthSettings
from tidegate.gateway.gateway_services import GatewayConfig
from tidegate.gateway.gateway_settings import GatewaySettings
from tidegate.models.model_settings import ModelSettings
from tidegate.schemas.catalog import INFERENCE_REQUEST, INFERENCE_RESULT
from tidegate.schemas.wire import unpack

REPO = Path(__file__).resolve().parents[3]
APICURIO = REPO / "var" / "apicurio" / "apicurio-registry-runner-1.0-runner.jar"


@pytest.fixture(scope="module")
def apicurio(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    """Apicurio Registry on a free port, in memory; the base URL of its Confluent API."""
    assert APICURIO.is_file(), "run `make setup`: it builds Apicurio Registry into var/apicurio"
    port = free_port()
    log = (tmp_path_factory.mktemp("apicurio") / "apicurio.log").open("wb")
    proc = subprocess.Popen(
        [
            "java",
            "-Xmx256m",
            f"-Dquarkus.http.port={port}",
            "-Dquarkus.http.host=127.0.0.1",
            "-jar",
            str(APICURIO),
        ],
        stdout=log,
        stderr=subprocess.STDOUT,
    )
    base = f"http://127.0.0.1:{port}/apis/ccompat/v7"
    try:
        wait_for(
            lambda: httpx.get(f"{base}/subjects", timeout=2).status_code == 200,
            timeout=120,
            what="Apicurio Registry to answer",
            retry_on=(httpx.TransportError,),
        )
        yield base
    finally:
        proc.terminate()
        try:
            proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
        log.close()


@pytest.fixture(scope="module")
def registry_settings(
    apicurio: str, tmp_path_factory: pytest.TempPathFactory
) -> SchemaRegistrySettings:
    """Every part of this module's pipeline uses Apicurio; it runs without authentication, and
    the local stack's registry credentials are not its own (an empty file says so)."""
    none = tmp_path_factory.mktemp("no-credentials") / "client.env"
    none.write_text("")
    return SchemaRegistrySettings(url=apicurio, local_credentials=none)


def _subjects(registry: SchemaRegistrySettings) -> set[str]:
    return set(httpx.get(f"{registry.url}/subjects", timeout=10).json())


def _schema_of(registry: SchemaRegistrySettings, schema_id: int) -> str:
    resp = httpx.get(f"{registry.url}/schemas/ids/{schema_id}", timeout=10)
    resp.raise_for_status()
    return str(resp.json()["schema"])


async def test_a_producer_and_a_worker_speak_only_through_apicurio(
    stack: Stack, models: ModelSettings
) -> None:
    registry = stack.registry
    assert "/apis/ccompat/" in registry.url
    # The stack fixture registered every subject of the pipeline's topics with Apicurio.
    assert {f"{stack.topics.requests}-value", f"{stack.topics.results}-value"} <= _subjects(
        registry
    )
    results = Reader(stack, stack.topics.results)
    sent: list[str] = []
    try:
        async with running(stack, models):
            with TidegateProducer(stack.kafka, stack.topics, registry) as producer:
                for i in range(20):
                    features = [float(i), 1.0, 2.0, 3.0]
                    data = struct.pack("<4f", *features)
                    inputs = [
                        {"name": "features", "datatype": "FP32", "shape": [1, 4], "data": data}
                    ]
                    sent.append(producer.publish("tiny", inputs, routing_key=f"k{i % 4}"))
                assert producer.flush(30) == 0
                assert producer.delivery_errors == {}
                request_schema_id = producer.schema_id()
            got = await in_thread(results.until, len(sent))
    finally:
        results.close()
    by_id = {r["request_id"]: r for r in got}
    assert set(by_id) == set(sent)
    assert {r["status"] for r in by_id.values()} == {"OK"}, [r.get("error") for r in got]
    assert {r["model_version"] for r in by_id.values()} == {"1"}
    # The ids on the wire are the ones Apicurio gave: tidegate kept none of its own.
    assert _record_name(_schema_of(registry, request_schema_id)) == INFERENCE_REQUEST
    result_schema_id = _first_schema_id(stack, stack.topics.results)
    assert _record_name(_schema_of(registry, result_schema_id)) == INFERENCE_RESULT
    assert result_schema_id != request_schema_id


def _record_name(schema: str) -> str:
    record = json.loads(schema)
    name = str(record["name"])
    return name if "." in name else f"{record['namespace']}.{name}"


def _first_schema_id(stack: Stack, topic: str) -> int:
    """The schema id in the header of a record of `topic`, read as raw bytes."""
    consumer = make_consumer(stack.kafka, unique("w-raw"))
    consumer.assign([TopicPartition(topic, p, 0) for p in range(4)])
    try:
        msg = wait_for(
            lambda: next(
                (m for m in consumer.consume(num_messages=1, timeout=0.5) if not m.error()), None
            ),
            timeout=30,
            what=f"a record of {topic}",
        )
        schema_id, _ = unpack(msg.value())
        return schema_id
    finally:
        consumer.close()


async def test_the_gateway_answers_through_apicurio(stack: Stack, models: ModelSettings) -> None:
    """A synchronous V2 call: the gateway encodes the request and decodes the worker's reply with
    the schemas Apicurio serves."""
    config = GatewayConfig(
        gateway=GatewaySettings(replica_id=unique("replica"), admin=False),
        kafka=stack.kafka,
        topics=stack.topics,
        registry=stack.registry,
        postgres=stack.pg,
        auth=AuthSettings(enabled=False),  # about the registry; test_auth.py is about callers
    )
    body = {
        "id": unique("via-apicurio"),
        "inputs": [{"name": "features", "datatype": "FP32", "shape": [1, 4], "data": [1, 2, 3, 4]}],
    }
    async with running(stack, models):
        gateway = await in_thread(GatewayServer(config).start)
        try:
            resp = await in_thread(lambda: gateway.http.post("/v2/models/tiny/infer", json=body))
        finally:
            await in_thread(gateway.stop)
    assert resp.status_code == 200, resp.text
    answer = resp.json()
    assert answer["id"] == body["id"]
    assert answer["model_version"] == "1"
    (output,) = answer["outputs"]
    assert output["shape"][0] == 1
    assert len(output["data"]) == output["shape"][0] * output["shape"][1]
