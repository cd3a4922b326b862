"""Routing in a real worker by the lifecycle's table: sticky weighted splits, tenant pins,
explicit versions, and shadow comparisons published to the shadow topic.

The worker is the one `tidegate worker` assembles, on real Kafka, the registry and PostgreSQL;
the table changes through lifecycle events appended with `LifecycleLog`, as an operator would.
"""

from __future__ import annotations

import struct
from collections import Counter
from typing import Any

import numpy as np
from confluent_kafka import TopicPartition
from confluent_kafka.schema_registry import SchemaRegistryClient

from tests.integration.workers import (
    Reader,
    Stack,
    in_thread,
    publish,
    request,
    running,
    tiny_softmax,
)
from tests.support import eventually, unique, wait_for
from tidegate.core.kafka import make_consumer
from tidegate.lifecycle.domain import events as ev
from tidegate.lifecycle.domain.routing import RoutingTable
from tidegate.lifecycle.eventstore.event_codec import ShadowComparisonCodec
from tidegate.models.model_settings import ModelSettings

# The worker tests' fixtures: a store with tiny 1 and 2, topics and a schema, tiny 1 promoted.

N = 600
TOLERANCE = 0.06  # the share of 600 sticky hashes stays well within 6 points of the weight


def weights(table: RoutingTable | None) -> dict[str, int]:
    return dict(table.weights) if table is not None else {}


async def test_a_weighted_split_is_sticky_per_key_and_follows_the_weights(
    stack: Stack, models: ModelSettings
) -> None:
    await stack.append(ev.TrafficShifted({"1": 70, "2": 30}))
    results = Reader(stack, stack.topics.results)
    async with running(stack, models) as worker:
        # Version 2 takes its share once a worker reported it warm: this one, before it consumed.
        async def split() -> bool:
            return weights(worker.feed.table("tiny")) == {"1": 70, "2": 30}

        await eventually(split, what="the 70/30 split to take effect")
        table = worker.feed.table("tiny")
        assert table is not None
        keys = [f"user-{i}" for i in range(N)]
        publish(stack, [request(f"a-{i}", key) for i, key in enumerate(keys)])
        first = await in_thread(results.until, N, 90.0)
        publish(stack, [request(f"b-{i}", key) for i, key in enumerate(keys)])
        both = await in_thread(results.until, 2 * N, 90.0)
    results.close()
    assert {r["status"] for r in both} == {"OK"}
    assert {r["routing_rule"] for r in both} == {f"split@{table.sequence}"}
    served = {r["routing_key"]: r["model_version"] for r in first}
    share = Counter(served.values())["2"] / N
    assert abs(share - 0.30) <= TOLERANCE, f"version 2 served {share:.1%} of the keys"
    again = {r["routing_key"]: r["model_version"] for r in both if r["request_id"][0] == "b"}
    moved = [key for key in keys if again[key] != served[key]]
    assert moved == [], f"{len(moved)} keys changed version"


async def test_a_tenant_pin_overrides_the_split_and_retired_versions_are_not_found(
    stack: Stack, models: ModelSettings
) -> None:
    await stack.append(
        ev.TrafficShifted({"1": 70, "2": 30}),
        ev.RoutingRuleSet("acme-on-2", tenant="acme", version="2"),
        ev.ModelRegistered("3", "onnx", "file:///nowhere", {}),
        ev.ArtifactValidated("3"),
        ev.Retired("3"),
    )
    results = Reader(stack, stack.topics.results)
    async with running(stack, models):
        batch = [request(f"acme-{i}", f"k{i}", tenant="acme") for i in range(40)]
        batch += [request(f"zeta-{i}", f"k{i}", tenant="zeta") for i in range(40)]
        batch += [
            request("retired", "k0", model_version="3"),
            request("unknown", "k0", model_version="9"),
            request("explicit", "k0", model_version="1"),
        ]
        publish(stack, batch)
        got = {r["request_id"]: r for r in await in_thread(results.until, len(batch), 60.0)}
    results.close()
    acme = [got[f"acme-{i}"] for i in range(40)]
    assert {(r["model_version"], r["routing_rule"]) for r in acme} == {("2", "pin:acme-on-2")}
    zeta = [got[f"zeta-{i}"] for i in range(40)]
    assert {r["routing_rule"][:6] for r in zeta} == {"split@"}
    assert {r["model_version"] for r in zeta} <= {"1", "2"}
    assert got["retired"]["status"] == "NOT_FOUND"
    assert "retired" in got["retired"]["error"]["message"]
    assert got["unknown"]["status"] == "NOT_FOUND"
    assert (got["explicit"]["model_version"], got["explicit"]["routing_rule"]) == (
        "1",
        "explicit-version",
    )


class ShadowReader:
    def __init__(self, stack: Stack) -> None:
        client = SchemaRegistryClient(stack.registry.client_config())
        self.codec = ShadowComparisonCodec(client, stack.topics)
        self.consumer = make_consumer(stack.kafka, unique("w-shadow-reader"))
        self.consumer.assign([TopicPartition(stack.topics.shadow, p, 0) for p in range(4)])
        self.records: list[dict[str, Any]] = []

    def until(self, count: int) -> list[dict[str, Any]]:
        def enough() -> bool:
            for msg in self.consumer.consume(num_messages=500, timeout=0.2):
                if not msg.error():
                    self.records.append(self.codec.decode(msg.value()))
            return len(self.records) >= count

        wait_for(enough, timeout=60, what=f"{count} shadow comparisons")
        return self.records

    def close(self) -> None:
        self.consumer.close()


async def test_shadow_comparisons_match_a_direct_computation_of_both_versions(
    stack: Stack, models: ModelSettings
) -> None:
    await stack.append(ev.ShadowStarted("2", 1.0))
    rng = np.random.default_rng(3)
    rows = rng.normal(0, 2, size=(40, 4)).astype(np.float32)
    results, shadows = Reader(stack, stack.topics.results), ShadowReader(stack)
    async with running(stack, models):
        publish(
            stack,
            [request(f"s{i}", f"k{i}", [float(v) for v in row]) for i, row in enumerate(rows)],
        )
        got = await in_thread(results.until, len(rows), 60.0)
        records = await in_thread(shadows.until, len(rows))
    results.close()
    shadows.close()
    assert {r["model_version"] for r in got} == {"1"}, "a shadow answered a request"
    by_id = {r["request_id"]: r for r in records}
    assert len(by_id) == len(rows)
    for i, row in enumerate(rows):
        record = by_id[f"s{i}"]
        primary, candidate = tiny_softmax("1", row[None]), tiny_softmax("2", row[None])
        assert (record["primary_version"], record["candidate_version"]) == ("1", "2")
        assert (record["kind"], record["rows"], record["values"]) == ("classifier", 1, 2)
        assert record["agree_rows"] == int(primary.argmax() == candidate.argmax())
        assert abs(record["abs_diff_sum"] - float(np.abs(primary - candidate).sum())) < 1e-5
        assert record["candidate_error"] is None
        assert record["worker_id"] == "it"
        served = next(r for r in got if r["request_id"] == f"s{i}")
        probabilities = struct.unpack("<2f", served["outputs"][0]["data"])
        np.testing.assert_allclose(probabilities, primary[0], atol=1e-6)
    agreement = sum(r["agree_rows"] for r in records) / len(records)
    assert 0 < agreement < 1, "the versions should disagree on some rows, not all"
