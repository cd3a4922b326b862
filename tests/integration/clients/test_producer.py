"""The producer client and `tidegate produce` against the real Kafka and registry.

Results come from the in-test `FakeWorker` (see test_gateway.py), which answers on the results
topic of the test's own topics.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

import numpy as np
import pytest

from tests.integration.fakes import FakeWorker, register_subjects
from tests.support import wait_for
from tidegate.clients.producer import TidegateProducer
from tidegate.core.errors import ResultTimeoutError
from tidegate.core.kafka import make_reader
from tidegate.core.settings import KafkaSettings, SchemaRegistrySettings, TopicSettings

PRODUCE = "import typer; from tidegate.cli.produce import produce; typer.run(produce)"


@pytest.fixture
def topics(
    new_topic: Callable[..., str], registry_settings: SchemaRegistrySettings
) -> TopicSettings:
    settings = TopicSettings(
        requests=new_topic("it-prod-requests", 4), results=new_topic("it-prod-results", 4)
    )
    register_subjects(registry_settings, settings)
    return settings


def test_publish_and_await(
    kafka_settings: KafkaSettings,
    topics: TopicSettings,
    registry_settings: SchemaRegistrySettings,
    worker: FakeWorker,
) -> None:
    features = np.arange(8, dtype=np.float32).reshape(2, 4)
    with TidegateProducer(
        kafka_settings, topics, registry_settings, await_results=True
    ) as producer:
        ids = [
            producer.publish("fraud", {"features": features}, routing_key=f"card-{i}", tenant="t")
            for i in range(5)
        ]
        assert producer.flush(10) == 0
        assert producer.delivery_errors == {}
        # Awaiting one at a time, out of order: results read meanwhile are kept for later.
        for request_id in reversed(ids):
            result = producer.await_result(request_id, timeout=20)
            assert result["status"] == "OK"
            assert result["routing_key"] == f"card-{ids.index(request_id)}"
        with pytest.raises(ResultTimeoutError):
            producer.await_result("never-published", timeout=0.3)
    by_id = {r["request_id"]: r for r in worker.seen}
    assert set(by_id) == set(ids)
    assert all(r["reply_to"] is None and r["tenant"] == "t" for r in by_id.values())


def run_produce(path: Path, topics: TopicSettings, *args: str) -> subprocess.CompletedProcess[str]:
    env = dict(os.environ)
    env["TIDEGATE_TOPICS_REQUESTS"] = topics.requests
    env["TIDEGATE_TOPICS_RESULTS"] = topics.results
    env["COLUMNS"] = "200"
    return subprocess.run(
        [sys.executable, "-c", PRODUCE, str(path), *args],
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )


def line(i: int) -> str:
    tensor = {"name": "features", "datatype": "FP32", "shape": [1, 4], "data": [i, 1, 2, 3]}
    return json.dumps({"model": "fraud", "routing_key": f"k{i}", "inputs": [tensor]})


def test_requests_without_a_routing_key_share_a_partition(
    kafka_settings: KafkaSettings,
    topics: TopicSettings,
    registry_settings: SchemaRegistrySettings,
) -> None:
    """Keyless requests go to one sticky partition (one ProduceRequest for a linger's worth),
    keeping their request id as the key; keyed ones hash to their key's partition as always."""
    features = np.zeros((1, 4), dtype=np.float32)
    with TidegateProducer(kafka_settings, topics, registry_settings) as producer:
        keyless = [producer.publish("fraud", {"features": features}) for _ in range(20)]
        keyed = [
            producer.publish("fraud", {"features": features}, routing_key=f"card-{i % 3}")
            for i in range(30)
        ]
        assert producer.flush(10) == 0
        assert producer.delivery_errors == {}
    placed = read_keys(kafka_settings, topics.requests, 50)
    # Published within a few milliseconds: one window, or two if it ended meanwhile.
    assert len({placed[rid.encode()] for rid in keyless}) <= 2
    by_card: dict[bytes, set[int]] = {}
    for key, partition in placed.items():
        if key.startswith(b"card-"):
            by_card.setdefault(key, set()).add(partition)
    assert sorted(by_card) == [b"card-0", b"card-1", b"card-2"]
    assert all(len(p) == 1 for p in by_card.values()), by_card
    assert len(keyed) == 30


def read_keys(kafka: KafkaSettings, topic: str, count: int) -> dict[bytes, int]:
    """The partition of each key among the topic's first `count` records."""
    consumer = make_reader(kafka, "it-sticky")
    found: dict[bytes, int] = {}
    seen: list[int] = []

    def read() -> bool:
        msg = consumer.poll(0.5)
        if msg is not None and msg.error() is None:
            key, partition = msg.key(), msg.partition()
            assert key is not None
            assert partition is not None
            found[key] = partition
            seen.append(partition)
        return len(seen) >= count

    try:
        consumer.subscribe([topic])
        wait_for(read, timeout=30, interval=0, what=f"{count} records on {topic}")
    finally:
        consumer.close()
    return found


def test_produce_file_with_wait(tmp_path: Path, topics: TopicSettings, worker: FakeWorker) -> None:
    good = tmp_path / "good.jsonl"
    good.write_text("\n".join(line(i) for i in range(4)) + "\n\n")
    done = run_produce(good, topics, "--wait", "--timeout", "30")
    assert done.returncode == 0, done.stdout + done.stderr
    assert "OK" in done.stdout
    assert len(worker.seen) == 4

    mixed = tmp_path / "mixed.jsonl"
    mixed.write_text("\n".join([line(10), "{oops", line(11), '{"model": "fraud"}']) + "\n")
    failed = run_produce(mixed, topics)
    assert failed.returncode == 1, failed.stdout + failed.stderr
    assert "line 2:" in failed.stderr
    assert "line 4:" in failed.stderr
    assert "inputs" in failed.stderr.split("line 4:")[1]
