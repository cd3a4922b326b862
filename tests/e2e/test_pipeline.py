"""End to end through real workers and a real gateway, with the real models."""

from __future__ import annotations

import asyncio
import uuid
from collections import defaultdict
from collections.abc import Callable
from datetime import UTC, datetime, timedelta
from typing import Any

import httpx
import numpy as np
import onnxruntime as ort
import pytest
from confluent_kafka.schema_registry import SchemaRegistryClient
from confluent_kafka.serialization import MessageField, SerializationContext

from tests.e2e.conftest import Pipeline
from tests.kafka_support import read_topic
from tests.support import unique, wait_for
from tidegate.core.errors import SerializationError
from tidegate.core.kafka import consume_ready, make_consumer, make_producer
from tidegate.core.settings import KafkaSettings, SchemaRegistrySettings
from tidegate.models.model_settings import ModelSettings
from tidegate.schemas.catalog import (
    DEAD_LETTER_ENVELOPE,
    INFERENCE_REQUEST,
    INFERENCE_RESULT,
    load_schema,
)
from tidegate.schemas.codec import AvroDecoder, AvroEncoder
from tidegate.schemas.records import RequestRecord, TensorRecord, Timestamp
from tidegate.schemas.tensors import from_numpy

RNG = np.random.default_rng(7)


def _registry() -> SchemaRegistryClient:
    return SchemaRegistryClient(SchemaRegistrySettings().client_config())


def _fraud_session() -> ort.InferenceSession:
    from tidegate.models.store import LocalArtifactStore

    package = asyncio.run(LocalArtifactStore(ModelSettings()).fetch("fraud", "1"))
    return ort.InferenceSession(
        str(package.path(package.manifest.entrypoint)), providers=["CPUExecutionProvider"]
    )


def _scan(
    topic: str, schema: str, keep: Callable[[Any, dict[str, Any]], bool], enough: Callable[[], bool]
) -> list[tuple[Any, dict[str, Any]]]:
    """(message, record) for the records of `topic` that `keep` accepts, read from the start until
    `enough()` says so."""
    consumer = make_consumer(KafkaSettings(), unique("e2e-reader"))
    consumer.subscribe([topic])
    decoder = AvroDecoder(_registry(), load_schema(schema))
    kept: list[tuple[Any, dict[str, Any]]] = []

    def more() -> bool:
        for msg in consume_ready(consumer, 500, 0.5):
            if not msg.error() and keep(msg, record := decoder(msg.value())):
                kept.append((msg, record))
        return enough()

    try:
        wait_for(more, timeout=120, interval=0, what=f"records on {topic}")
    finally:
        consumer.close()
    return kept


def _collect(topic: str, schema: str, ids: set[str]) -> list[tuple[Any, dict[str, Any]]]:
    """Every record whose request_id is in `ids`, read until each id was seen at least once."""
    missing = set(ids)

    def keep(_msg: Any, record: dict[str, Any]) -> bool:
        missing.discard(record.get("request_id", ""))
        return record.get("request_id") in ids

    return _scan(topic, schema, keep, lambda: not missing)


def _find(topic: str, schema: str, request_id: str) -> dict[str, Any]:
    return _collect(topic, schema, {request_id})[0][1]


def _find_envelope(topic: str, key: bytes) -> dict[str, Any]:
    seen: list[bool] = []

    def keep(_msg: Any, record: dict[str, Any]) -> bool:
        if record["original_key"] == key:
            seen.append(True)
        return bool(seen)

    return _scan(topic, DEAD_LETTER_ENVELOPE, keep, lambda: bool(seen))[0][1]


def _request(
    model: str,
    inputs: list[TensorRecord],
    *,
    routing_key: str | None = None,
    deadline: Timestamp | None = None,
) -> RequestRecord:
    record: RequestRecord = {
        "request_id": uuid.uuid4().hex,
        "model": model,
        "inputs": inputs,
        "created_at": datetime.now(UTC),
    }
    if routing_key is not None:
        record["routing_key"] = routing_key
    if deadline is not None:
        record["deadline"] = deadline
    return record


def test_http_fraud_matches_direct_onnxruntime(pipeline: Pipeline) -> None:
    rows = RNG.normal(size=(1000, 64)).astype(np.float32)
    expected = _fraud_session().run(None, {"features": rows})[0]
    url = f"{pipeline.base_url}/v2/models/fraud/infer"

    async def call_all() -> list[dict[str, Any]]:
        limit = asyncio.Semaphore(64)
        async with httpx.AsyncClient(timeout=60, headers=pipeline.headers) as client:

            async def one(i: int) -> dict[str, Any]:
                body = {"inputs": [{"name": "features", "datatype": "FP32", "shape": [1, 64],
                                    "data": rows[i].tolist()}]}  # fmt: skip
                async with limit:
                    resp = await client.post(url, json=body)
                assert resp.status_code == 200, resp.text
                return dict(resp.json())

            return await asyncio.gather(*(one(i) for i in range(len(rows))))

    answers = asyncio.run(call_all())
    got = np.asarray([a["outputs"][0]["data"] for a in answers], dtype=np.float32)
    np.testing.assert_allclose(got, expected, atol=1e-6)
    assert {a["model_version"] for a in answers} == {"1"}


def test_kafka_keyed_requests_all_answered_in_key_order(pipeline: Pipeline) -> None:
    topics = pipeline.topics
    encoder = AvroEncoder(_registry(), load_schema(INFERENCE_REQUEST))
    ctx = SerializationContext(topics["requests"], MessageField.VALUE)
    producer = make_producer(KafkaSettings())
    sent: dict[str, list[str]] = defaultdict(list)
    run = unique("order")
    for i in range(1000):
        key = f"{run}-key-{i % 25}"
        row = RNG.normal(size=(1, 64)).astype(np.float32)
        record = _request("fraud", [from_numpy("features", row)], routing_key=key)
        record["request_id"] = f"{key}-{i:04d}"
        sent[key].append(record["request_id"])
        producer.produce(topics["requests"], key=key, value=encoder(record, ctx))
        producer.poll(0)
    assert producer.flush(30) == 0

    ids = {rid for rids in sent.values() for rid in rids}
    mine = _collect(topics["results"], INFERENCE_RESULT, ids)
    assert len({r["request_id"] for _, r in mine}) == 1000
    assert all(r["status"] == "OK" for _, r in mine)
    by_key: dict[str, list[str]] = defaultdict(list)
    for msg, r in sorted(mine, key=lambda m: (m[0].partition(), m[0].offset())):
        assert msg.key().decode() == r["routing_key"]  # keyed like the request
        if r["request_id"] not in by_key[r["routing_key"]]:  # at-least-once: skip redeliveries
            by_key[r["routing_key"]].append(r["request_id"])
    assert by_key == sent


def test_tritonclient_calls_the_gateway_unmodified(pipeline: Pipeline) -> None:
    import tritonclient.http as triton

    client = triton.InferenceServerClient(pipeline.base_url.removeprefix("http://"))
    rows = RNG.normal(size=(4, 64)).astype(np.float32)
    infer_input = triton.InferInput("features", list(rows.shape), "FP32")
    infer_input.set_data_from_numpy(rows)  # binary_data=True is the default
    answer = client.infer("fraud", [infer_input], headers=pipeline.headers)
    got = answer.as_numpy("probabilities")
    expected = _fraud_session().run(None, {"features": rows})[0]
    np.testing.assert_allclose(got, expected, atol=1e-6)
    assert client.is_model_ready("fraud", headers=pipeline.headers)


def test_minilm_paraphrase_is_closer_than_unrelated(pipeline: Pipeline) -> None:
    texts = [
        "A man is playing a guitar on stage.",
        "Someone performs music with a guitar in front of an audience.",
        "The central bank raised interest rates again.",
    ]
    body = {"inputs": [{"name": "text", "datatype": "BYTES", "shape": [3], "data": texts}]}
    resp = httpx.post(
        f"{pipeline.base_url}/v2/models/minilm/infer",
        json=body,
        headers=pipeline.headers,
        timeout=60,
    )
    assert resp.status_code == 200, resp.text
    out = resp.json()["outputs"][0]
    emb = np.asarray(out["data"], dtype=np.float32).reshape(out["shape"])
    assert emb.shape == (3, 384)
    assert float(emb[0] @ emb[1]) > float(emb[0] @ emb[2]) + 0.2


def test_poison_lands_in_quarantine_and_the_next_message_is_processed(
    pipeline: Pipeline,
) -> None:
    topics = pipeline.topics
    encoder = AvroEncoder(_registry(), load_schema(INFERENCE_REQUEST))
    ctx = SerializationContext(topics["requests"], MessageField.VALUE)
    key = unique("poison-key")
    good = _request("fraud", [from_numpy("features", np.zeros((1, 64), np.float32))])
    producer = make_producer(KafkaSettings())
    producer.produce(topics["requests"], key=key, value=b"\x07this is not avro")
    producer.produce(topics["requests"], key=key, value=encoder(good, ctx))
    assert producer.flush(30) == 0

    envelope = _find_envelope(topics["poison"], key.encode())
    assert envelope["original_value"] == b"\x07this is not avro"
    assert envelope["error"]["code"] == "WIRE_FORMAT"
    assert "magic byte" in envelope["error"]["message"]
    after = _find(topics["results"], INFERENCE_RESULT, good["request_id"])
    assert after["status"] == "OK"


def test_request_past_its_deadline_is_not_computed(pipeline: Pipeline) -> None:
    past = datetime.now(UTC) - timedelta(seconds=5)
    rows = np.zeros((1, 64), np.float32)
    record = _request("fraud", [from_numpy("features", rows)], deadline=past)
    topics = pipeline.topics
    encoder = AvroEncoder(_registry(), load_schema(INFERENCE_REQUEST))
    producer = make_producer(KafkaSettings())
    ctx = SerializationContext(topics["requests"], MessageField.VALUE)
    producer.produce(topics["requests"], key=record["request_id"], value=encoder(record, ctx))
    assert producer.flush(30) == 0
    found = _find(topics["results"], INFERENCE_RESULT, record["request_id"])
    assert found["status"] == "DEADLINE_EXCEEDED"
    assert found["outputs"] == []
    assert found["timings"]["compute_ms"] == 0.0


def test_sync_timeout_answers_504_and_the_late_answer_is_deadline_exceeded(
    pipeline: Pipeline,
) -> None:
    """`Request-Timeout` is the request's deadline too: the workers answer the request that
    timed out DEADLINE_EXCEEDED instead of computing it for a caller who left, and that answer
    is what a fetch by id finds."""
    body = {"inputs": [{"name": "features", "datatype": "FP32", "shape": [1, 64],
                        "data": [0.5] * 64}]}  # fmt: skip
    resp = httpx.post(
        f"{pipeline.base_url}/v2/models/fraud/infer",
        json=body,
        headers={**pipeline.headers, "Request-Timeout": "0.001"},
        timeout=30,
    )
    assert resp.status_code == 504, resp.text
    problem = resp.json()
    request_id = problem["request_id"]
    assert resp.headers["content-type"].startswith("application/problem+json")

    def fetched() -> httpx.Response | None:
        later = httpx.get(
            f"{pipeline.base_url}/v2/requests/{request_id}", headers=pipeline.headers, timeout=10
        )
        return later if later.status_code != 202 else None  # 202: still pending

    later = wait_for(fetched, timeout=60, what="the late answer")
    assert later.status_code == 504, later.text
    assert later.headers["content-type"].startswith("application/problem+json")
    assert later.json()["code"] == "DEADLINE_EXCEEDED"
    assert later.json()["request_id"] == request_id


def test_async_flow(pipeline: Pipeline) -> None:
    body = {"inputs": [{"name": "features", "datatype": "FP32", "shape": [2, 64],
                        "data": [0.1] * 128}]}  # fmt: skip
    resp = httpx.post(
        f"{pipeline.base_url}/v2/models/fraud/infer",
        json=body,
        headers={**pipeline.headers, "Prefer": "respond-async"},
        timeout=30,
    )
    assert resp.status_code == 202, resp.text
    location = resp.headers["Location"]
    assert location.startswith("/v2/requests/")

    def done() -> httpx.Response | None:
        got = httpx.get(f"{pipeline.base_url}{location}", headers=pipeline.headers, timeout=10)
        assert got.status_code in (200, 202), got.text
        return got if got.status_code == 200 else None

    final = wait_for(done, timeout=60, what="the async result")
    assert final.json()["outputs"][0]["shape"] == [2, 2]
    unknown = httpx.get(
        f"{pipeline.base_url}/v2/requests/{uuid.uuid4().hex}", headers=pipeline.headers, timeout=10
    )
    assert unknown.status_code == 404


@pytest.mark.parametrize("bad", ["shape", "datatype", "name"])
def test_invalid_input_is_a_problem_body_and_nothing_is_published(
    pipeline: Pipeline, bad: str
) -> None:
    tensor: dict[str, Any] = {"name": "features", "datatype": "FP32", "shape": [1, 64],
                              "data": [0.0] * 64}  # fmt: skip
    if bad == "shape":
        tensor["shape"] = [1, 63]
        tensor["data"] = [0.0] * 63
    elif bad == "datatype":
        tensor["datatype"] = "INT32"
        tensor["data"] = [0] * 64
    else:
        tensor["name"] = "feature"
    refused_id, marker_id = unique("invalid"), unique("marker")
    resp = httpx.post(
        f"{pipeline.base_url}/v2/models/fraud/infer",
        json={"id": refused_id, "inputs": [tensor]},
        headers=pipeline.headers,
        timeout=30,
    )
    assert resp.status_code == 400
    problem = resp.json()
    assert problem["status"] == 400
    assert "feature" in problem["field"]
    # A valid call after it, answered: had the refused call been published, its record would be
    # on the requests topic by now, before the end that the read below stops at.
    valid = {"name": "features", "datatype": "FP32", "shape": [1, 64], "data": [0.0] * 64}
    marker = httpx.post(
        f"{pipeline.base_url}/v2/models/fraud/infer",
        json={"id": marker_id, "inputs": [valid]},
        headers=pipeline.headers,
        timeout=30,
    )
    assert marker.status_code == 200, marker.text
    decode = AvroDecoder(_registry(), load_schema(INFERENCE_REQUEST))
    on_topic = read_topic(KafkaSettings(), pipeline.topics["requests"], timeout=120)
    published = set()
    for message in on_topic:
        try:
            published.add(decode(message.value())["request_id"])
        except SerializationError:
            continue  # another test's poison pill on the same topic: no call of the gateway's
    assert marker_id in published, "the read did not reach the valid call's record"
    assert refused_id not in published
