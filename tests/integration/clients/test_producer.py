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
from tidegate.clients.producer import TidegateProducer
from tidegate.core.errors import ResultTimeoutError
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
