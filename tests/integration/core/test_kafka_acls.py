"""Kafka authorizes each component: the broker's StandardAuthorizer, as `make up` starts it, with
each component's principal on the SASL_SSL listener (var/kafka/tls/<component>.env) and the ACLs
of `tidegate stack acls`.

Each test applies the table to topics and a workers' group of its own (the same function `make up`
uses for the default names), and removes those ACLs afterwards. A refusal is checked by what
matters: the broker's authorization error, and nothing delivered.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import os
import struct
import subprocess
import sys
from collections.abc import Iterator
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from confluent_kafka import (
    ConsumerGroupTopicPartitions,
    KafkaError,
    KafkaException,
    TopicPartition,
)
from confluent_kafka.admin import (  # type: ignore[attr-defined]
    AclOperation,
    AdminClient,
    NewTopic,
    ResourceType,
    ScramMechanism,
    UserScramCredentialAlteration,
    UserScramCredentialDeletion,
)

from tests.integration.gateway.gateway_fixtures import GatewayServer
from tests.integration.kafka_listeners import TLS, delivery, listener
from tests.integration.workers import Stack, in_thread, publish, request, running, tiny_softmax
from tests.support import unique, wait_for
from tidegate.core.kafka import make_admin, make_consumer, make_producer
from tidegate.core.kafka_acls import (
    PRODUCER_GROUPS,
    AclNames,
    Component,
    Grant,
    apply_acls,
    binding_filter,
    bindings,
    default_principals,
    grants,
    principal_filter,
    prune_acls,
)
from tidegate.core.settings import KafkaSettings, TopicSettings, read_env_file
from tidegate.gateway.admission.admission_settings import AdmissionSettings
from tidegate.gateway.auth.auth_settings import AuthSettings
from tidegate.gateway.gateway_services import GatewayConfig
from tidegate.gateway.gateway_settings import GatewaySettings
from tidegate.lifecycle.control.process import ControllerConfig, ControllerService
from tidegate.lifecycle.lifecycle_settings import LifecycleSettings
from tidegate.models.model_settings import ModelSettings

OTHERS = [c for c in Component if c is not Component.WORKER]
DEFAULT_NAMES = AclNames(TopicSettings())


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
    for principal in {b.principal for b in acls}:
        mine = [b for b in acls if b.principal == principal]
        wait_for(
            functools.partial(holds, admin, principal, mine),
            timeout=30,
            interval=0.05,
            what=f"{principal}'s new bindings on the broker",
        )
    # The readers' group prefixes are the same in every table: those bindings are `make up`'s
    # (and other tests' at the same time), and stay.
    shared = set(bindings(grants(DEFAULT_NAMES), default_principals()))
    try:
        yield Principals(names, {c: listener(c.value) for c in Component})
    finally:
        filters = [binding_filter(b) for b in acls if b not in shared]
        for future in admin.delete_acls(filters, request_timeout=30).values():
            future.result(30)


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


async def test_the_gateway_worker_and_controller_on_their_own_principals_serve_a_call(
    stack: Stack, models: ModelSettings, principals: Principals
) -> None:
    kafka = principals.kafka
    controller = ControllerService(
        ControllerConfig(
            postgres=stack.pg,
            lifecycle=LifecycleSettings(workers_group_id=stack.group),
            kafka=kafka[Component.CONTROLLER],
            topics=stack.topics,
            registry=stack.registry,
            group_id=unique(principals.names.controller_group),
        )
    )
    stop = asyncio.Event()
    controlling = asyncio.create_task(controller.run(stop))
    gateway = GatewayServer(
        GatewayConfig(
            gateway=GatewaySettings(replica_id=unique("acl-replica"), admin=False),
            kafka=kafka[Component.GATEWAY],
            topics=stack.topics,
            registry=stack.registry,
            auth=AuthSettings(enabled=False),  # Kafka's authorization is the subject here
            admission=AdmissionSettings(worker_group=stack.group),
        )
    )
    worker = replace(stack, kafka=kafka[Component.WORKER])
    body = {"inputs": [{"name": "features", "datatype": "FP32", "shape": [1, 4], "data": [1] * 4}]}
    try:
        # No relay in the test: the worker's reports reach the lifecycle topic only through the
        # controller, the one principal that may write it.
        async with running(worker, models, relay=False):
            await asyncio.to_thread(gateway.start)
            try:
                # Ready only once the worker's VersionLoaded came back through the lifecycle.
                ready = await asyncio.to_thread(
                    wait_for,
                    lambda: gateway.http.get("/v2/models/tiny/ready").status_code == 200,
                    timeout=60,
                    what="tiny ready, the worker's report published by the controller",
                )
                assert ready
                resp = await asyncio.to_thread(
                    gateway.http.post, "/v2/models/tiny/infer", json=body
                )
            finally:
                await asyncio.to_thread(gateway.stop)
    finally:
        stop.set()
        await asyncio.wait_for(controlling, 60)
    assert controller.acquisitions == 1
    assert resp.status_code == 200, resp.text
    [out] = resp.json()["outputs"]
    np.testing.assert_allclose(out["data"], tiny_softmax("1", np.ones((1, 4)))[0], atol=1e-6)


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


def test_a_producer_reads_the_workers_committed_offsets(
    stack: Stack, principals: Principals
) -> None:
    # What a moving model's order waits on (clients.pool_moves): allowed, as a describe.
    admin = make_admin(principals.kafka[Component.PRODUCER])
    asked = [ConsumerGroupTopicPartitions(stack.group, [TopicPartition(stack.topics.requests, 0)])]
    found = admin.list_consumer_group_offsets(asked)[stack.group].result(timeout=30)
    assert [tp.error for tp in found.topic_partitions] == [None]
    other = unique("tidegate-other-group")
    asked = [ConsumerGroupTopicPartitions(other, [TopicPartition(stack.topics.requests, 0)])]
    with pytest.raises(KafkaException) as refused:
        admin.list_consumer_group_offsets(asked)[other].result(timeout=30)
    assert refused.value.args[0].code() == KafkaError.GROUP_AUTHORIZATION_FAILED


def test_only_the_controller_writes_the_lifecycle(stack: Stack, principals: Principals) -> None:
    assert delivery(principals.kafka[Component.CONTROLLER], stack.topics.lifecycle) is None
    for other in Component:
        if other is not Component.CONTROLLER:
            assert_refused(principals.kafka[other], stack.topics.lifecycle)


def test_the_operator_cannot_join_the_workers_group(stack: Stack, principals: Principals) -> None:
    joined = consume_error(principals.kafka[Component.OPERATOR], stack.group, stack.topics.requests)
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
    found = described(admin, "User:tidegate-producer")
    topics = TopicSettings()
    writes = {b.name for b in found if b.operation == AclOperation.WRITE}
    # The default pool's requests topics, and every pool's by prefix (`<requests>.<pool>`).
    pools = {f"{topics.requests}.", f"{topics.requests_batch}."}
    assert writes == {topics.requests, topics.requests_batch, *pools}
    reads = {(b.restype, b.name) for b in found if b.operation == AclOperation.READ}
    assert reads == {(ResourceType.TOPIC, topics.results), (ResourceType.GROUP, PRODUCER_GROUPS)}
    describes = {(b.restype, b.name) for b in found if b.operation == AclOperation.DESCRIBE}
    assert describes == {(ResourceType.GROUP, "tidegate-workers")}


def test_prune_takes_away_a_grant_the_table_no_longer_has(stack: Stack, admin: AdminClient) -> None:
    principal = f"User:{unique('acl-prune')}"
    names = AclNames(stack.topics, schemas_topic=unique("acl-schemas"), worker_group=stack.group)
    table = [g for g in grants(names) if g.component is Component.PRODUCER]
    principals = dict.fromkeys(Component, principal)
    old = bindings(table, principals)
    dropped = Grant(Component.PRODUCER, "topic", stack.topics.lifecycle, ("WRITE",))
    every = [*old, *bindings([dropped], principals)]
    apply_acls(admin, every)
    try:
        # The broker's authorizer applies a change when it replays the metadata log, soon after
        # the admin call is answered: each step waits until DescribeAcls shows the last one.
        showing(admin, principal, every)
        assert prune_acls(admin, old, [principal]) == 1
        showing(admin, principal, old)
        assert prune_acls(admin, old, [principal]) == 0
    finally:
        prune_acls(admin, [], [principal])
    showing(admin, principal, [])


def holds(admin: AdminClient, principal: str, wanted: list[Any]) -> bool:
    """Whether the broker's authorizer shows every one of `wanted` (it may show more)."""
    return set(wanted) <= set(described(admin, principal))


def showing(admin: AdminClient, principal: str, expected: list[Any]) -> None:
    wait_for(
        lambda: set(described(admin, principal)) == set(expected),
        timeout=30,
        interval=0.05,
        what=f"{principal}'s bindings on the broker to be the {len(expected)} expected",
    )


def described(admin: AdminClient, principal: str) -> list[Any]:
    return list(admin.describe_acls(principal_filter(principal), request_timeout=30).result(30))


def answers(admin: AdminClient) -> bool:
    return bool(admin.list_topics(timeout=5).brokers)


def test_kafka_principals_makes_each_component_a_user_once(
    tmp_path: Path, admin: AdminClient
) -> None:
    prefix = unique("kp") + "-"
    ca = TLS / "ca.crt"
    command = [
        sys.executable,
        "-m",
        "tidegate.cli",
        "stack",
        "kafka-principals",
        str(tmp_path),
        "--listener",
        listener("worker").bootstrap_servers,
        "--security-protocol",
        "SASL_SSL",
        "--ssl-ca-location",
        str(ca),
        "--user-prefix",
        prefix,
    ]
    env = {k: v for k, v in os.environ.items() if not k.startswith("TIDEGATE_KAFKA_")}
    users = [f"{prefix}{c.value}" for c in Component]
    try:
        done = subprocess.run(command, env=env, capture_output=True, text=True, timeout=120)
        assert done.returncode == 0, done.stderr
        files = {c: tmp_path / f"{c.value}.env" for c in Component}
        first = {c: path.read_text() for c, path in files.items()}
        for c, path in files.items():
            assert path.stat().st_mode & 0o777 == 0o600
            settings = KafkaSettings.model_validate(read_env_file(path, "TIDEGATE_KAFKA_"))
            assert settings.sasl_username == f"{prefix}{c.value}"
            password = settings.sasl_password
            assert password is not None
            assert password.get_secret_value() not in done.stdout + done.stderr
            # The broker takes the credential: metadata comes back over SASL_SSL.
            wait_for(
                functools.partial(answers, make_admin(settings)),
                timeout=30,
                what=f"{c.value}'s user to authenticate",
                retry_on=(KafkaException,),
            )
        again = subprocess.run(command, env=env, capture_output=True, text=True, timeout=120)
        assert again.returncode == 0, again.stderr
        assert {c: path.read_text() for c, path in files.items()} == first, "passwords kept"
        wrong = KafkaSettings.model_validate(
            {**read_env_file(files[Component.WORKER], "TIDEGATE_KAFKA_"), "sasl_password": "x"}
        )
        errors: list[KafkaError] = []
        assert delivery(wrong, "inference-requests", errors=errors, timeout_ms=5000) is not None
        assert any(e.code() == KafkaError._AUTHENTICATION for e in errors), errors
    finally:
        gone: list[UserScramCredentialAlteration] = [
            UserScramCredentialDeletion(u, ScramMechanism.SCRAM_SHA_512) for u in users
        ]
        for future in admin.alter_user_scram_credentials(gone).values():
            with contextlib.suppress(KafkaException):
                future.result(timeout=30)
