"""The worker against the real Kafka, schema registry and PostgreSQL, with unique topics, groups
and database schema per test.

Models are a tiny ONNX graph (MatMul + Softmax), two versions with different weights, put into a
temporary artifact store and served by the real runtime; the isolation test swaps in a runtime
that fails on NaN. What serves is decided by lifecycle events appended through `LifecycleLog`
(version 1 registered, validated and promoted), which the worker reads from its lifecycle topic.
"""

from __future__ import annotations

import asyncio
import os
import re
import signal
import time
from datetime import UTC, datetime, timedelta
from typing import Any

import httpx
import numpy as np
import pytest
from confluent_kafka import TopicPartition
from confluent_kafka.schema_registry import SchemaRegistryClient

from tests.integration.registry_clients import registry_clients_made
from tests.integration.workers import (
    SIGNATURE,
    Reader,
    Stack,
    Waves,
    in_thread,
    publish,
    request,
    running,
    start_worker,
    stop_workers,
)
from tests.support import eventually, free_port, wait_for
from tidegate.agents.assembly import WorkerConfig, running_worker
from tidegate.agents.inference.loaded import LoadedModel
from tidegate.agents.worker_settings import WorkerSettings
from tidegate.core.errors import ModelExecutionError
from tidegate.core.kafka import make_consumer
from tidegate.lifecycle.domain import events as ev
from tidegate.models.model_settings import ModelSettings
from tidegate.models.runtime.contract import Arrays, ModelRuntime
from tidegate.schemas.catalog import INFERENCE_REQUEST, load_schema
from tidegate.schemas.codec import AvroDecoder

# The shared fixtures: a store with tiny 1 and 2, topics and a schema, tiny 1 promoted.


async def test_a_worker_serves_while_postgres_is_unreachable(
    stack: Stack, models: ModelSettings
) -> None:
    publish(stack, [request("no-db", "k")])
    results = Reader(stack, stack.topics.results)
    dead = stack.pg.model_copy(update={"port": free_port()})
    config = WorkerConfig(
        worker=WorkerSettings(group_id=stack.group, worker_id="it", metrics_port=0),
        kafka=stack.kafka,
        topics=stack.topics,
        models=models,
        registry=stack.registry,
        postgres=dead,
    )
    async with running_worker(config):
        [result] = await in_thread(results.until, 1)
    assert (result["request_id"], result["status"], result["model_version"]) == ("no-db", "OK", "1")
    results.close()


async def test_a_worker_process_makes_one_schema_registry_client(
    stack: Stack, models: ModelSettings, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Its lanes, lifecycle feed, breakers and retry relay share one: each client costs 40 ms of
    CPU to make, at every start and restart."""
    publish(stack, [request("one-client", "k")])
    results = Reader(stack, stack.topics.results)
    made = registry_clients_made(monkeypatch)
    async with running(stack, models, relay=False) as running_one:
        [result] = await in_thread(results.until, 1)
        assert running_one.breakers is not None
        assert len(running_one.lanes) == 2
    results.close()
    assert (result["request_id"], result["status"]) == ("one-client", "OK")
    assert len(made) == 1


async def test_bad_input_never_blocks_its_partition(stack: Stack, models: ModelSettings) -> None:
    late = datetime.now(UTC) - timedelta(seconds=5)
    bad_tensor = request("short", "k")
    bad_tensor["inputs"][0]["data"] = b"\x00\x01\x02"
    publish(
        stack,
        [
            ("k", b"\x07not avro at all"),
            ("k", b"\x00\x00\x0f\x42\x3f" + b"\x02xx"),  # magic 0, schema id 999999
            bad_tensor,
            request("late", "k", deadline=late),
            request("fine", "k"),
        ],
    )
    poison, results = Reader(stack, stack.topics.poison), Reader(stack, stack.topics.results)
    async with running(stack, models):
        got = {r["request_id"]: r for r in await in_thread(results.until, 3)}
        letters = await in_thread(poison.until, 3)
    assert got["fine"]["status"] == "OK"
    assert got["fine"]["model_version"] == "1"
    assert got["fine"]["routing_rule"].startswith("split@")
    assert got["late"]["status"] == "DEADLINE_EXCEEDED"
    assert got["late"]["timings"]["compute_ms"] == 0.0
    assert got["late"]["batch_size"] == 0
    assert got["short"]["status"] == "INVALID"
    assert got["short"]["error"]["field"] == "features"
    codes = [e["error"]["code"] for e in letters]
    assert codes == ["WIRE_FORMAT", "UNKNOWN_SCHEMA", "INVALID_INPUT"]
    assert letters[0]["original_value"] == b"\x07not avro at all"
    assert "magic byte" in letters[0]["error"]["message"]
    assert letters[1]["error"]["error_class"] == "UnknownSchemaError"
    assert letters[2]["request_id"] == "short"
    assert {e["source"]["topic"] for e in letters} == {stack.topics.requests}
    poison.close()
    results.close()


def reports(history: list[ev.Payload]) -> list[tuple[str, str, str]]:
    """The worker reports in a stream: (event type, version, unload reason)."""
    return [
        (type(p).__name__, p.version, getattr(p, "reason", ""))
        for p in history
        if isinstance(p, ev.VersionLoaded | ev.VersionUnloaded) and p.worker_id == "it"
    ]


async def test_the_worker_reports_what_it_loads_and_unloads(
    stack: Stack, models: ModelSettings
) -> None:
    async with running(stack, models) as worker:
        history = await stack.history()
        assert reports(history) == [("VersionLoaded", "1", "")], "not loaded before consuming"
        loaded = next(p for p in history if isinstance(p, ev.VersionLoaded))
        assert isinstance(loaded, ev.VersionLoaded)
        assert loaded.load_ms > 0
        # The worker's first onnxruntime load also paid for the runtime's start: no size.
        assert loaded.rss_bytes is None

        async def warm_here() -> bool:
            state = worker.feed.state("tiny")
            version = state.version("1") if state else None
            return version is not None and version.loaded_on == {"it"}

        await eventually(warm_here, what="the worker's own report to come back through its feed")
        await stack.append(ev.Promoted("2"))  # wanted now: loaded in the background

        async def reported(count: int) -> bool:
            return len(reports(await stack.history())) == count

        await eventually(lambda: reported(2), what="the load of 2")
        second = [p for p in await stack.history() if isinstance(p, ev.VersionLoaded)][-1]
        # Measured on this Linux host and carried through the store: a size, not "unknown".
        assert isinstance(second, ev.VersionLoaded)
        assert second.rss_bytes is not None
        assert second.rss_bytes >= 0
        await stack.append(ev.Retired("1"))
        await eventually(lambda: reported(3), what="the unload of 1")
        assert worker.versions.ready("tiny", "2")
        assert not worker.versions.ready("tiny", "1")
    assert reports(await stack.history()) == [
        ("VersionLoaded", "1", ""),
        ("VersionLoaded", "2", ""),
        ("VersionUnloaded", "1", "retired"),
        ("VersionUnloaded", "2", "worker stopping"),
    ]


class NanFailingRuntime(ModelRuntime):
    """Sums each row; a NaN anywhere in the call fails the whole call, like a picky model."""

    def __init__(self) -> None:
        self.calls: list[int] = []

    async def load(self, package: Any) -> None:
        """Nothing to load."""

    async def infer(self, inputs: Arrays) -> dict[str, Any]:
        x = inputs["features"]
        self.calls.append(len(x))
        if np.isnan(x).any():
            raise ModelExecutionError("NaN in the input")
        total = x.sum(axis=1, keepdims=True, dtype=np.float32)
        return {"probabilities": np.concatenate([total, -total], axis=1)}


async def test_a_failing_input_does_not_fail_its_batch_mates(
    stack: Stack, models: ModelSettings
) -> None:
    runtime = NanFailingRuntime()

    async def loader(name: str, version: str) -> LoadedModel:
        return LoadedModel(name, version, SIGNATURE, runtime)

    batch = [request(f"r{i}", "same-key", [float("nan")] * 4 if i == 3 else None) for i in range(8)]
    publish(stack, batch)
    results, failed = Reader(stack, stack.topics.results), Reader(stack, stack.topics.failed)
    async with running(stack, models, loader, max_batch_size=8, max_batch_delay_ms=200):
        got = {r["request_id"]: r for r in await in_thread(results.until, 8)}
        (envelope,) = await in_thread(failed.until, 1)
    assert got.pop("r3")["status"] == "ERROR"
    assert {r["status"] for r in got.values()} == {"OK"}
    assert runtime.calls[0] == 8, "the batch was not formed"
    assert envelope["request_id"] == "r3"
    assert envelope["error"]["code"] == "MODEL_ERROR"
    assert envelope["attempt"] == 1  # deliveries, not the model runs the bisection took
    assert envelope["source"]["topic"] == stack.topics.requests
    # The letter keeps the request as it was published, for a redrive to send again.
    registry = SchemaRegistryClient(stack.registry.client_config())
    original = AvroDecoder(registry, load_schema(INFERENCE_REQUEST))(envelope["original_value"])
    assert original["request_id"] == "r3"
    assert original["inputs"][0]["data"] == batch[3]["inputs"][0]["data"]  # the NaN row
    results.close()
    failed.close()


async def test_keyed_requests_get_results_in_per_key_order(
    stack: Stack, models: ModelSettings
) -> None:
    keys = [f"card-{k}" for k in range(10)]
    reply = {"topic": stack.topics.replies, "partition": 3}
    batch = [
        request(
            f"{keys[i % 10]}/{i // 10:03d}", keys[i % 10], reply_to=reply if i % 4 == 0 else None
        )
        for i in range(200)
    ]
    publish(stack, batch)
    results, replies = Reader(stack, stack.topics.results), Reader(stack, stack.topics.replies)
    async with running(stack, models):
        got = await in_thread(results.until, 200)
        replied = await in_thread(replies.until, 50)
    assert len({r["request_id"] for r in got}) == 200
    assert {r["status"] for r in got} == {"OK"}
    for key in keys:
        seq = [r["request_id"] for r in got if r["routing_key"] == key]
        assert seq == sorted(seq), f"results of {key} out of order"
    by_key_partition = {r["routing_key"]: p for r, p in results.records}
    assert len(by_key_partition) == 10  # every key's results share one partition
    assert {p for _, p in replies.records} == {3}
    assert {r["request_id"] for r in replied} == {b["request_id"] for b in batch[::4]}
    results.close()
    replies.close()


def committed(stack: Stack) -> int:
    consumer = make_consumer(stack.kafka, stack.group)
    try:
        tps = consumer.committed(
            [TopicPartition(stack.topics.requests, p) for p in range(4)], timeout=10
        )
        return sum(max(tp.offset, 0) for tp in tps)
    finally:
        consumer.close()


def scraped(port: int) -> str:
    """The worker's /metrics page; it must answer 200 once it listens."""
    resp = httpx.get(f"http://127.0.0.1:{port}/metrics", timeout=5)
    assert resp.status_code == 200, resp.text
    return resp.text


def test_a_restarted_worker_loses_nothing_and_sigterm_commits(
    stack: Stack, models: ModelSettings
) -> None:
    port = free_port()
    publish(stack, [request(f"a{i}", f"k{i % 7}") for i in range(100)])
    results = Reader(stack, stack.topics.results)
    worker = start_worker(stack, models, TIDEGATE_WORKER_METRICS_PORT=str(port))
    try:
        results.until(100, timeout=90)
        body = wait_for(lambda: scraped(port), what="/metrics", retry_on=(httpx.TransportError,))
        assert 'tidegate_worker_requests_total{model="tiny",status="OK",version="1"} 100.0' in body
        assert "tidegate_worker_batch_size_bucket" in body
        # A sample per held partition, not the metric's HELP line: the gauge is refreshed
        # every few seconds from the consumer's positions.
        lag = re.compile(
            rf'tidegate_worker_consumer_lag{{partition="\d",topic="{stack.topics.requests}"}} 0.0'
        )
        wait_for(
            lambda: len(lag.findall(scraped(port))) == 4,
            what="a lag sample of 0 for each of the 4 partitions",
        )
        worker.send_signal(signal.SIGTERM)
        assert worker.wait(timeout=60) == 0
    finally:
        if worker.poll() is None:
            worker.kill()
    assert committed(stack) == 100, "a graceful stop must commit everything it delivered"

    publish(stack, [request(f"b{i}", f"k{i % 7}") for i in range(100)])
    worker = start_worker(stack, models)
    try:
        got = results.until(200, timeout=90)
        wait_for(lambda: committed(stack) == 200, what="the commit of the second run")
    finally:
        worker.send_signal(signal.SIGTERM)
        worker.wait(timeout=60)
    ids = [r["request_id"] for r in got]
    assert len(ids) == len(set(ids)) == 200, "the restart redid or lost requests"
    results.close()


def test_a_killed_worker_loses_nothing(stack: Stack, models: ModelSettings) -> None:
    results = Reader(stack, stack.topics.results)
    first = start_worker(stack, models, TIDEGATE_WORKER_WORKER_ID="first")
    second = start_worker(stack, models, TIDEGATE_WORKER_WORKER_ID="second")
    waves = Waves(stack)
    wave, ids = waves.send, waves.ids

    def serving() -> set[str]:
        wave()
        return {r["worker_id"] for r, _ in results.poll()}

    try:
        # A wave per try, its results read on the next (0.3 s later).
        wait_for(
            lambda: {"first", "second"} <= serving(),
            timeout=90,
            interval=0.3,
            what="both workers serving",
        )
        before = {r["source"]["partition"] for r, _ in results.records if r["worker_id"] == "first"}
        killed_at = len(ids)
        os.kill(first.pid, signal.SIGKILL)
        first.wait(timeout=10)
        for _ in range(5):
            wave()
            time.sleep(0.2)
        wanted = set(ids)
        wait_for(
            lambda: wanted <= {r["request_id"] for r, _ in results.poll()},
            timeout=90,
            what="a result for every request",
        )
    finally:
        stop_workers(first, second)
    later = set(ids[killed_at:])
    after = {
        r["source"]["partition"]
        for r, _ in results.records
        if r["worker_id"] == "second" and r["request_id"] in later
    }
    assert before <= after, "the survivor did not take over the killed worker's partitions"
    results.close()


class GatedRuntime(NanFailingRuntime):
    """Holds every call until the test opens the gate."""

    def __init__(self) -> None:
        super().__init__()
        self.gate = asyncio.Event()

    async def infer(self, inputs: Arrays) -> dict[str, Any]:
        await self.gate.wait()
        return await super().infer(inputs)


async def test_consumption_pauses_at_max_in_flight(stack: Stack, models: ModelSettings) -> None:
    runtime = GatedRuntime()

    async def loader(name: str, version: str) -> LoadedModel:
        return LoadedModel(name, version, SIGNATURE, runtime)

    publish(stack, [request(f"p{i}", f"k{i % 8}") for i in range(120)])
    results = Reader(stack, stack.topics.results)
    async with running(stack, models, loader, max_in_flight=20, max_batch_size=4) as worker:

        def in_flight() -> int:
            return sum(p.tracker.in_flight for p in worker.worker._pipelines.values())

        deadline = time.monotonic() + 2.0
        peak = 0
        while time.monotonic() < deadline:
            peak = max(peak, in_flight())
            await asyncio.sleep(0.02)
        assert 0 < peak <= 20, f"{peak} requests in flight with max_in_flight=20"
        runtime.gate.set()
        got = await in_thread(results.until, 120)
    assert len({r["request_id"] for r in got}) == 120
    results.close()
