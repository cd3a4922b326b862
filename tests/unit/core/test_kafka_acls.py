"""The ACL table: who may write what. The broker's refusals are tested in
tests/integration/core/test_kafka_acls.py; here, that the table says what docs/security.md says."""

from __future__ import annotations

from confluent_kafka.admin import (  # type: ignore[attr-defined]
    AclOperation,
    ResourcePatternType,
    ResourceType,
)

from tidegate.core.kafka_acls import (
    AclNames,
    Component,
    Grant,
    bindings,
    default_principals,
    grants,
)
from tidegate.core.settings import TopicSettings

TOPICS = TopicSettings(
    requests="rq",
    requests_batch="rq-batch",
    results="rs",
    replies="rp",
    failed="fl",
    poison="ps",
    lifecycle="lc",
    shadow="sh",
    breakers="br",
    audit="au",
    retry_prefix="rt",
)
NAMES = AclNames(TOPICS, schemas_topic="sc", worker_group="wg", replay_topic="rpl")


def allowed(component: Component, op: str, resource: str = "topic") -> set[str]:
    """The names (a trailing * for a prefix) `component` may do `op` on."""
    return {
        g.name + ("*" if g.prefixed else "")
        for g in grants(NAMES)
        if g.component == component and g.resource == resource and op in g.operations
    }


def writers(topic: str) -> set[Component]:
    return {
        g.component
        for g in grants(NAMES)
        if g.resource == "topic" and g.name == topic and "WRITE" in g.operations
    }


def test_a_producer_sends_requests_reads_results_and_nothing_else() -> None:
    # Requests, to the default pool's topics and to every pool's (by prefix).
    assert allowed(Component.PRODUCER, "WRITE") == {"rq", "rq-batch", "rq.*", "rq-batch.*"}
    assert allowed(Component.PRODUCER, "READ") == {"rs"}
    assert allowed(Component.PRODUCER, "READ", "group") == {"tidegate-producer-*"}
    # The workers' committed offsets, for a moving model's order; never their membership.
    assert allowed(Component.PRODUCER, "DESCRIBE", "group") == {"wg*"}
    assert not allowed(Component.PRODUCER, "WRITE", "transactional_id")


def test_only_workers_write_results_and_replies_and_only_the_registry_its_topic() -> None:
    assert writers("rs") == {Component.WORKER}
    assert writers("rp") == {Component.WORKER}
    assert writers("sh") == {Component.WORKER}
    assert writers("sc") == {Component.REGISTRY}
    assert {g.component for g in grants(NAMES) if g.name == "sc"} == {Component.REGISTRY}


def test_only_the_controller_writes_the_lifecycle() -> None:
    # The CLI, /admin and the workers append to the event store; the controller's outbox relay
    # publishes every writer's events.
    assert writers("lc") == {Component.CONTROLLER}
    for reader in (Component.GATEWAY, Component.WORKER, Component.OPERATOR):
        assert "lc" in allowed(reader, "READ")


def test_the_operator_reads_the_workers_offsets_and_never_joins_their_group() -> None:
    groups = allowed(Component.OPERATOR, "READ", "group")
    assert "wg*" not in groups
    assert not any("wg".startswith(g.rstrip("*")) for g in groups)
    assert "wg*" in allowed(Component.OPERATOR, "DESCRIBE", "group")
    assert {"tidegate-dlq-inspect-*", "tidegate-redrive-*", "tidegate-replay*"} <= groups


def test_workers_own_their_groups_and_transactional_ids_by_prefix() -> None:
    assert allowed(Component.WORKER, "WRITE", "transactional_id") == {"wg*"}
    assert "wg*" in allowed(Component.WORKER, "READ", "group")
    # the gateway and the controller read the workers' lag, never join their group
    for reader in (Component.GATEWAY, Component.CONTROLLER):
        assert "wg*" in allowed(reader, "DESCRIBE", "group")
        assert "wg*" not in allowed(reader, "READ", "group")


def test_names_come_from_the_settings() -> None:
    other = AclNames(TopicSettings(requests="elsewhere"))
    assert "elsewhere" in {g.name for g in grants(other) if g.component == Component.PRODUCER}


def test_each_operation_is_one_binding_of_the_components_principal() -> None:
    principals = default_principals()
    table = [
        Grant(Component.WORKER, "transactional_id", "wg", ("WRITE",), prefixed=True),
        Grant(Component.PRODUCER, "topic", "rq", ("WRITE", "DESCRIBE")),
    ]
    made = bindings(table, principals)
    assert [
        (b.restype, b.name, b.resource_pattern_type, b.principal, b.operation) for b in made
    ] == [
        (
            ResourceType.TRANSACTIONAL_ID,
            "wg",
            ResourcePatternType.PREFIXED,
            "User:tidegate-worker",
            AclOperation.WRITE,
        ),
        (
            ResourceType.TOPIC,
            "rq",
            ResourcePatternType.LITERAL,
            "User:tidegate-producer",
            AclOperation.WRITE,
        ),
        (
            ResourceType.TOPIC,
            "rq",
            ResourcePatternType.LITERAL,
            "User:tidegate-producer",
            AclOperation.DESCRIBE,
        ),
    ]
    assert all(b.host == "*" for b in made)
