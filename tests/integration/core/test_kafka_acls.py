"""Kafka authorizes each component: the broker's StandardAuthorizer, as `make up` starts it, with
each component's principal on the SASL_SSL listener (var/kafka/tls/<component>.env) and the ACLs
of `tidegate stack acls`.

Each test applies the table to topics and a workers' group of its own (the same function `make up`
uses for the default names), and removes those ACLs afterwards. A refusal is checked by what
matters: the broker's authorization error, and nothing delivered.
"""

from __future__ import annotations

import struct
from collections.abc import Iterator
from dataclasses import dataclass, replace
from typing import Any

import numpy as np
import pytest
from confluent_kafka import KafkaError, KafkaException, TopicPartition
from confluent_kafka.admin import (  # type: ignore[attr-defined]
    AclBindingFilter,
    AclOperation,
    AclPermissionType,
    AdminClient,
    NewTopic,
    ResourcePatternType,
    ResourceType,
)

from tests.integration.kafka_listeners import listener
from tests.integration.workers import Stack, in_thread, publish, request, running, tiny_softmax
from tests.support import unique, wait_for
from tidegate.core.kafka import make_consumer, make_producer
from tidegate.core.kafka_acls import (
    AclNames,
    Component,
    apply_acls,
    bindings,
    default_principals,
    grants,
)
from tidegate.core.settings import KafkaSettings, TopicSettings
from tidegate.models.model_settings import ModelSettings

OTHERS = [c for c in Component if c is not Component.WORKER]


@dataclass
class Principals:
    names: AclNames
    kafka: dict[Component, KafkaSettings]


@pytest.fixture
def principals(stack: Stack, admin: AdminClient) -> Iterator[Principals]:
    """The stack's topics and group under the ACL table, and each component's settings."""
    names = AclNames(stack.topics, schemas_topic=unique("acl-schemas"), worker_group=stack.group)
    acls = bindings(grants(names), default_principals())
    apply_acls(admin, acls)
    try:
        yield Principals(names, {c: listener(c.value) for c in Component})
    finally:
        filters = [
            AclBindingFilter(
                b.restype,
                b.name,
                b.resource_pattern_type,
                b.principal,
                b.host,
                b.operation,
                b.permission_type,
            )
            for b in acls
        ]
        for future in admin.delete_acls(filters, request_timeout=30).values():
            future.result(30)


def delivery(settings: KafkaSettings, topic: str, partition: int = 0) -> KafkaError | None:
    """Produces one record with `settings`: None when the broker took it, else its error."""
    outcome: list[KafkaError | None] = []
    producer = make_producer(settings, {"message.timeout.ms": 10_000})
    producer.produce(
        topic,
        key=b"k",
        value=b"x",
        partition=partition,
        on_delivery=lambda e, _m: outcome.append(e),
    )
    wait_for(lambda: producer.poll(0.2) >= 0 and outcome, timeout=30, what="a delivery report")
    return outcome[0]


def assert_refused(settings: KafkaSettings, topic: str, partition: int = 0) -> None:
    err = delivery(settings, topic, partition)
    assert err is not None, f"{settings.sasl_username} wrote to {topic}"
    assert err.code() == KafkaError.TOPIC_AUTHORIZATION_FAILED, err


def consume_error(settings: KafkaSettings, group: str, topic: str) -> KafkaError:
    """Subscribes `group` to `topic` with `settings` and returns the first error it is told."""
    consumer = make_consumer(settings, group)
    consumer.subscribe([topic])
    try:
        msg = wait_for(
            lambda: (m := consumer.poll(0.5)) is not None and m.error() is not None and m,
            timeout=30,
            what=f"an error reading {topic}",
        )
    finally:
        consumer.close()
    error: KafkaError = msg.error()  # type: ignore[attr-defined]
    return error


async def test_a_worker_and_a_producer_on_their_own_principals_serve_requests(
    stack: Stack, models: ModelSettings, principals: Principals
) -> None:
    worker = replace(stack, kafka=principals.kafka[Component.WORKER])
    producer = replace(stack, kafka=principals.kafka[Component.PRODUCER])
    rows = np.random.default_rng(5).normal(0, 2, size=(8, 4)).astype(np.float32)
    ids = [unique(f"acl{i}") for i in range(len(rows))]
    # a producer application's reader: its own group under the producer's prefix
    reader = make_consumer(producer.kafka, unique("tidegate-producer-acl"))
    reader.assign([TopicPartition(stack.topics.results, p, 0) for p in range(4)])
    got: dict[str, dict[str, Any]] = {}

    def read() -> bool:
        for msg in reader.consume(num_messages=100, timeout=0.2):
            assert msg.error() is None, msg.error()
            result = stack.results(msg.value())
            got[str(result["request_id"])] = result
        return set(ids) <= set(got)

    async with running(worker, models):
        items = [
            request(rid, f"k{i}", [float(v) for v in row])
            for i, (rid, row) in enumerate(zip(ids, rows, strict=True))
        ]
        publish(producer, items)
        try:
            await in_thread(lambda: wait_for(read, timeout=60, what="every result"))
        finally:
            reader.close()
    assert set(got) == set(ids), "a request went unanswered under the components' ACLs"
    for rid, row in zip(ids, rows, strict=True):
        assert got[rid]["status"] == "OK", got[rid]
        probabilities = struct.unpack("<2f", got[rid]["outputs"][0]["data"])
        np.testing.assert_allclose(probabilities, tiny_softmax("1", row[None])[0], atol=1e-6)


def test_a_producer_cannot_write_the_lifecycle_the_schemas_or_a_reply(
    stack: Stack, principals: Principals
) -> None:
    producer = principals.kafka[Component.PRODUCER]
    assert delivery(producer, stack.topics.requests) is None
    # the stack's own topics, under the ACLs `make up` applied, and this test's
    defaults = TopicSettings()
    for topic in (defaults.lifecycle, "_schemas", defaults.replies):
        assert_refused(producer, topic)
    for topic in (stack.topics.lifecycle, principals.names.schemas_topic, stack.topics.results):
        assert_refused(producer, topic)
    for partition in (0, 3):
        assert_refused(producer, stack.topics.replies, partition)


def test_a_producer_cannot_read_requests_or_join_the_workers_group(
    stack: Stack, principals: Principals
) -> None:
    producer = principals.kafka[Component.PRODUCER]
    stolen = consume_error(producer, unique("tidegate-producer-x"), stack.topics.requests)
    assert stolen.code() == KafkaError.TOPIC_AUTHORIZATION_FAILED, stolen
    joined = consume_error(producer, stack.group, stack.topics.results)
    assert joined.code() == KafkaError.GROUP_AUTHORIZATION_FAILED, joined


def test_only_the_workers_write_results_and_replies(stack: Stack, principals: Principals) -> None:
    worker = principals.kafka[Component.WORKER]
    for topic in (stack.topics.results, stack.topics.replies):
        assert delivery(worker, topic) is None, f"the worker could not write {topic}"
        for other in OTHERS:
            assert_refused(principals.kafka[other], topic)


def test_only_the_registry_writes_its_topic_and_it_writes_nothing_else(
    stack: Stack, principals: Principals, admin: AdminClient
) -> None:
    registry = principals.kafka[Component.REGISTRY]
    schemas = principals.names.schemas_topic
    admin.create_topics([NewTopic(schemas, 1, 1)])[schemas].result(30)
    try:
        assert delivery(registry, schemas) is None
        for other in Component:
            if other is not Component.REGISTRY:
                assert_refused(principals.kafka[other], schemas)
        for topic in (stack.topics.requests, stack.topics.lifecycle, stack.topics.results):
            assert_refused(registry, topic)
    finally:
        admin.delete_topics([schemas])[schemas].result(30)


def test_the_worker_cannot_write_a_topic_outside_its_table(
    stack: Stack, principals: Principals, admin: AdminClient
) -> None:
    # What a forged reply_to once aimed at: any topic the worker could write.
    assert_refused(principals.kafka[Component.WORKER], "_schemas")
    assert_refused(principals.kafka[Component.WORKER], stack.topics.audit)


def test_a_transactional_id_outside_the_workers_prefix_is_refused(
    principals: Principals,
) -> None:
    config = {"transactional.id": unique("not-the-workers"), "message.timeout.ms": 10_000}
    producer = make_producer(principals.kafka[Component.WORKER], config)
    with pytest.raises(KafkaException) as refused:
        producer.init_transactions(30)
    code = refused.value.args[0].code()
    assert code == KafkaError.TRANSACTIONAL_ID_AUTHORIZATION_FAILED, refused.value


def test_make_up_applied_the_table_for_the_default_names(admin: AdminClient) -> None:
    found = admin.describe_acls(
        AclBindingFilter(
            ResourceType.ANY,
            None,  # type: ignore[arg-type]
            ResourcePatternType.ANY,
            "User:tidegate-producer",
            None,  # type: ignore[arg-type]
            AclOperation.ANY,
            AclPermissionType.ANY,
        ),
        request_timeout=30,
    ).result(30)
    topics = TopicSettings()
    writes = {b.name for b in found if b.operation == AclOperation.WRITE}
    assert writes == {topics.requests, topics.requests_batch}
    assert topics.results in {b.name for b in found if b.operation == AclOperation.READ}
