"""Circuit breakers against the real stack: a model forced to fail opens its breaker within the
window; its callers then get a fast UNAVAILABLE, or the declared fallback's answer marked
`fallback:...`; the open period doubles while half-open probes fail, and probes close it once
the model recovers. The gateway's `ModelHealth` reader sees the states the worker published.

The models are runtimes of the test's own (a switchable failure); everything else is the worker
as `tidegate worker` assembles it, publishing to a breaker-state topic of the test's own.
"""

from __future__ import annotations

import asyncio
import dataclasses
import json
import subprocess
import sys
import threading
import time
from collections.abc import AsyncIterator, Iterator
from contextlib import asynccontextmanager
from datetime import timedelta
from typing import Any

import numpy as np
import pytest
from confluent_kafka import Consumer, TopicPartition
from confluent_kafka.admin import AdminClient, NewTopic  # type: ignore[attr-defined]
from confluent_kafka.schema_registry import SchemaRegistryClient

from tests.integration.workers import (
    SIGNATURE,
    Reader,
    Stack,
    controller_relay,
    in_thread,
    publish,
    request,
)
from tests.support import unique, wait_for
from tidegate.agents.assembly import RunningWorker, WorkerConfig, running_worker
from tidegate.agents.breakers.breaker_settings import BreakerSettings
from tidegate.agents.inference.loaded import LoadedModel
from tidegate.agents.worker_settings import WorkerSettings
from tidegate.core.errors import ModelExecutionError
from tidegate.core.kafka import make_consumer
from tidegate.dlq.failure_settings import FailureSettings
from tidegate.gateway.modelstate.model_health import ModelHealth
from tidegate.lifecycle.domain import events as ev
from tidegate.models.model_settings import ModelSettings
from tidegate.models.runtime.contract import Arrays, ModelRuntime
from tidegate.schemas.catalog import BREAKER_STATE, load_schema, topic_subjects
from tidegate.schemas.codec import AvroDecoder
from tidegate.schemas.registration import RegistryHttp, register_all

CLI = (sys.executable, "-m", "tidegate.cli")
WHY = "lite is close enough"

BREAKER = BreakerSettings(min_calls=10, window_s=10.0, open_s=2.0, max_open_s=4.0, probes=2)
# Every failure answers its caller at once: the test follows each request to its result.
POLICY = FailureSettings(
    retries=0, crash_guard=False, actions={"MODEL_ERROR": "answer", "UNAVAILABLE": "answer"}
)


class Switchable(ModelRuntime):
    """Sums each row; while `broken`, every call fails with a model error."""

    def __init__(self, broken: bool) -> None:
        self.broken = broken
        self.calls = 0

    async def load(self, package: Any) -> None:
        """Nothing to load."""

    async def infer(self, inputs: Arrays) -> dict[str, Any]:
        self.calls += 1
        if self.broken:
            raise ModelExecutionError("the model is forced to fail")
        total = inputs["features"].sum(axis=1, keepdims=True, dtype=np.float32)
        return {"probabilities": np.concatenate([total, -total], axis=1)}


@pytest.fixture
def breakers(stack: Stack, admin: AdminClient) -> Iterator[Stack]:
    """The stack with a breaker-state topic of this test's own (compacted, as `make up` makes
    it), its subject registered."""
    topic = unique("w-breakers")
    spec = NewTopic(
        topic, num_partitions=1, replication_factor=1, config={"cleanup.policy": "compact"}
    )
    admin.create_topics([spec])[topic].result(timeout=30)
    topics = stack.topics.model_copy(update={"breakers": topic})
    with RegistryHttp(stack.registry) as http:
        list(register_all(http, {f"{topic}-value": topic_subjects(topics)[f"{topic}-value"]}))
    yield dataclasses.replace(stack, topics=topics)
    admin.delete_topics([topic])[topic].result(timeout=30)


class States:
    """Reads the breaker-state topic from its start, records decoded in order (None: a
    tombstone)."""

    def __init__(self, stack: Stack) -> None:
        self.consumer: Consumer = make_consumer(stack.kafka, unique("w-states"))
        self.consumer.assign([TopicPartition(stack.topics.breakers, 0, 0)])
        client = SchemaRegistryClient(stack.registry.client_config())
        self.decode = AvroDecoder(client, load_schema(BREAKER_STATE))
        self.records: list[dict[str, Any] | None] = []

    def poll(self) -> list[dict[str, Any] | None]:
        for msg in self.consumer.consume(num_messages=100, timeout=0.2):
            if not msg.error():
                value = msg.value()
                self.records.append(None if value is None else self.decode(value))
        return self.records

    def opened(self) -> list[dict[str, Any]]:
        return [r for r in self.poll() if r is not None and r["state"] == "open"]


class Traffic:
    """A request to `tiny` every 0.1 s from a thread, so a half-open breaker always has a
    probe to let through; every id is kept."""

    def __init__(self, stack: Stack, **extra: Any) -> None:
        self.stack, self.extra = stack, extra
        self.ids: list[str] = []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def __enter__(self) -> Traffic:
        self._thread.start()
        return self

    def __exit__(self, *_: object) -> None:
        self._stop.set()
        self._thread.join()

    def _run(self) -> None:
        while not self._stop.is_set():
            rid = f"t{len(self.ids):04d}"
            self.ids.append(rid)
            publish(self.stack, [request(rid, f"k{len(self.ids) % 8}", **self.extra)])
            self._stop.wait(0.1)


@asynccontextmanager
async def running(
    stack: Stack, models: ModelSettings, runtimes: dict[str, ModelRuntime]
) -> AsyncIterator[RunningWorker]:
    async def loader(name: str, version: str) -> LoadedModel:
        return LoadedModel(name, version, SIGNATURE, runtimes[name])

    config = WorkerConfig(
        # Small batches: the breaker is asked per batch, so a burst is cut once it opens.
        worker=WorkerSettings(
            group_id=stack.group, worker_id="it", metrics_port=0, max_batch_size=4
        ),
        kafka=stack.kafka,
        topics=stack.topics,
        models=models,
        registry=stack.registry,
        postgres=stack.pg,
        failure=POLICY,
        breaker=BREAKER,
    )
    # The controller's relay publishes the worker's reports (VersionLoaded) to the lifecycle.
    async with controller_relay(stack), running_worker(config, loader=loader) as worker:
        yield worker


def period(record: dict[str, Any]) -> float:
    """An open record's open period, ms (timestamps decode as datetimes)."""
    gap: timedelta = record["open_until"] - record["changed_at"]
    return gap.total_seconds() * 1000


def lite_registered() -> list[ev.Payload]:
    return [
        ev.ModelRegistered(
            "1", "onnx", "file:///lite", {}, signature_json=SIGNATURE.model_dump_json()
        ),
        ev.ArtifactValidated("1"),
        ev.Promoted("1"),
    ]


async def test_a_failing_model_opens_then_answers_fast_the_backoff_doubles_and_probes_close_it(
    breakers: Stack, models: ModelSettings
) -> None:
    stack = breakers
    tiny = Switchable(broken=True)
    states = States(stack)
    health = ModelHealth(stack.kafka, stack.topics, stack.registry, name=unique("it"))
    health.start()
    results = Reader(stack, stack.topics.results)
    try:
        async with running(stack, models, {"tiny": tiny}):
            started = time.monotonic()
            publish(stack, [request(f"f{i}", f"k{i % 8}") for i in range(30)])
            got = await in_thread(results.until, 30, 60.0)
            # It opened within the window: 10 calls, all failed, well inside 10 s.
            (first, *_) = await in_thread(lambda: wait_for(states.opened, what="an open state"))
            assert time.monotonic() - started < 10.0
            assert (first["trips"], first["worker_id"]) == (1, "it")
            assert period(first) == 2000
            failed = [r for r in got if r["status"] == "ERROR"]
            refused = [r for r in got if r["status"] == "UNAVAILABLE"]
            assert len(failed) >= 10, [r["status"] for r in got]
            assert refused
            assert len(failed) + len(refused) == 30
            for r in refused:
                assert "circuit breaker is open" in r["error"]["message"]
                assert r["timings"]["compute_ms"] == 0.0  # never called: a fast answer
                assert int(r["error"]["details"]["retry_not_before_ms"]) > 0
            # The gateway's reader sees it open (until its open period is over).
            await in_thread(
                lambda: wait_for(
                    lambda: health.state("tiny", "1") in ("open", "half_open"),
                    what="the gateway's view",
                )
            )
            assert health.state("tiny", "2") == "closed"
            with Traffic(stack):
                # Probes keep failing: 2 s, then 4 s, then the 4 s cap.
                await in_thread(
                    lambda: wait_for(
                        lambda: len(states.opened()) >= 3, timeout=40.0, what="3 trips"
                    )
                )
                opened = states.opened()
                periods = [period(r) for r in opened[:3]]
                assert periods == [2000, 4000, 4000]
                assert [r["trips"] for r in opened[:3]] == [1, 2, 3]
                tiny.broken = False
                await in_thread(
                    lambda: wait_for(
                        lambda: [r for r in states.poll() if r and r["state"] == "closed"],
                        timeout=30.0,
                        what="the breaker closing",
                    )
                )
                await in_thread(
                    lambda: wait_for(
                        lambda: health.state("tiny", "1") == "closed", what="health closed"
                    )
                )
                calls = tiny.calls
                mark = len(results.poll())
                await in_thread(
                    lambda: wait_for(lambda: len(results.poll()) >= mark + 10, what="later results")
                )
            later = [r for r, _ in results.records[mark:]]
            assert {r["status"] for r in later} == {"OK"}
            assert tiny.calls > calls
            kinds = [r["state"] for r in states.poll() if r]
            assert "half_open" in kinds
        # A stopping worker tombstones its states: the gateway forgets them.
        await in_thread(lambda: wait_for(lambda: None in states.poll(), what="a tombstone"))
    finally:
        await asyncio.to_thread(health.stop)
        results.close()
        states.consumer.close()


async def test_an_open_model_is_served_by_its_declared_fallback_marked_unless_refused(
    breakers: Stack, models: ModelSettings
) -> None:
    stack = breakers
    await stack.append(*lite_registered(), model="tiny-lite")
    # Declared as an operator does, through the CLI (event-sourced, shown in the state).
    declared = await asyncio.to_thread(
        subprocess.run,
        [*CLI, "models", "fallback", "tiny", "tiny-lite", "--reason", WHY, "--json"],
        env=stack.env(models, TIDEGATE_ACTOR="it"),
        capture_output=True,
        timeout=120,
        check=False,
    )
    assert declared.returncode == 0, declared.stderr.decode()
    assert json.loads(declared.stdout)["state"]["fallback"] == "tiny-lite"
    assert ev.FallbackSet("tiny-lite", WHY) in await stack.history()
    tiny, lite = Switchable(broken=True), Switchable(broken=False)
    results = Reader(stack, stack.topics.results)
    try:
        async with running(stack, models, {"tiny": tiny, "tiny-lite": lite}):
            publish(stack, [request(f"f{i}", f"k{i % 8}") for i in range(30)])
            await in_thread(results.until, 30, 60.0)
            publish(
                stack,
                [
                    request("lite", "a"),
                    request("strict", "b", parameters={"fallback": False}),
                ],
            )
            got = {r["request_id"]: r for r in await in_thread(results.until, 32, 60.0)}
    finally:
        results.close()
    served = [r for r in got.values() if r["routing_rule"] == "fallback:breaker-open@tiny/1"]
    assert got["lite"] in served
    for r in served:
        assert r["status"] == "OK"
        assert (r["model"], r["model_version"]) == ("tiny-lite", "1")
        assert r["outputs"][0]["name"] == "probabilities"
    assert lite.calls >= 1
    strict = got["strict"]
    assert strict["status"] == "UNAVAILABLE"
    assert "circuit breaker is open" in strict["error"]["message"]
    failed = [r for r in got.values() if r["status"] == "ERROR"]
    assert len(failed) >= 10  # what opened it
    assert len(failed) + len(served) + 1 == 32
