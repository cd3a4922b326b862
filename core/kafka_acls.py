"""Which Kafka principal may do what: one principal per component, and the ACLs of each.

Each component of the pipeline connects as a principal of its own (`User:tidegate-gateway`, ...),
and the broker's `StandardAuthorizer` allows it only what `grants` lists, derived from the topic
and group names the settings give. Nothing else is allowed: a producer application cannot write
the lifecycle, the registry's `_schemas` or a reply; only the workers write results and
replies, and only the controller (its outbox relay) writes the lifecycle. `tidegate stack acls`
shows the table and applies it; docs/security.md shows it too.

Consumer groups are granted by prefix: each reader makes throwaway groups under a prefix of its
own (`tidegate-lifecycle-feed-<id>`, `tidegate-producer-<id>`), and the workers' lanes add
suffixes to their group. READ of a topic or a group implies DESCRIBE, and so does WRITE.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from enum import StrEnum
from typing import Literal

from confluent_kafka.admin import (  # type: ignore[attr-defined]
    AclBinding,
    AclBindingFilter,
    AclOperation,
    AclPermissionType,
    AdminClient,
    ResourcePatternType,
    ResourceType,
)

from tidegate.core.settings import TopicSettings

__all__ = [
    "AclNames",
    "Component",
    "Grant",
    "apply_acls",
    "binding_filter",
    "bindings",
    "default_principals",
    "grants",
    "principal_filter",
    "prune_acls",
]


class Component(StrEnum):
    """A process kind with a Kafka principal of its own."""

    GATEWAY = "gateway"
    WORKER = "worker"
    CONTROLLER = "controller"
    REGISTRY = "registry"
    OPERATOR = "operator"
    PRODUCER = "producer"


Resource = Literal["topic", "group", "transactional_id"]
Operation = Literal["READ", "WRITE", "CREATE", "DESCRIBE", "DESCRIBE_CONFIGS", "ALTER_CONFIGS"]

# Throwaway groups of the readers that assign partitions and never commit (core.kafka.make_reader
# names them `tidegate-<purpose>-<id>`), and of the other tools that make groups of their own.
LIFECYCLE_FEED = "tidegate-lifecycle-feed-"
MODEL_HEALTH = "tidegate-model-health-"
PRODUCER_GROUPS = "tidegate-producer-"
REGISTRY_GROUPS = "tidegate-registry-"
DLQ_GROUPS = ("tidegate-dlq-inspect-", "tidegate-redrive-")
AUDIT_READ = "tidegate-audit-read-"


@dataclass(frozen=True)
class Grant:
    """`component` may do `operations` on the resource `name` (every name it prefixes when
    `prefixed`)."""

    component: Component
    resource: Resource
    name: str
    operations: tuple[Operation, ...]
    prefixed: bool = False


@dataclass(frozen=True)
class AclNames:
    """The names the ACLs are about, as the components' settings give them."""

    topics: TopicSettings
    schemas_topic: str = "_schemas"
    worker_group: str = "tidegate-workers"
    gateway_group: str = "tidegate-gateway"
    controller_group: str = "tidegate-lineage-indexer"
    replay_topic: str = "inference-results-replay"
    replay_group_prefix: str = "tidegate-replay"


def default_principals(user_prefix: str = "tidegate-") -> dict[Component, str]:
    """`User:tidegate-<component>` for each component: the SCRAM users `make up` creates."""
    return {c: f"User:{user_prefix}{c.value}" for c in Component}


def grants(names: AclNames) -> list[Grant]:
    """Every component's grants; what is not here is refused."""
    t = names.topics
    requests = (t.requests, t.requests_batch)
    # Every pool's requests topics, `<requests>.<pool>` (tidegate.core.pools): by prefix, so a
    # pool declared later needs no new grant.
    pools = (f"{t.requests}.", f"{t.requests_batch}.")
    dead = (t.failed, t.poison)
    gw, wk, ct = Component.GATEWAY, Component.WORKER, Component.CONTROLLER
    rg, op, pr = Component.REGISTRY, Component.OPERATOR, Component.PRODUCER
    every_topic = (
        *requests,
        t.results,
        t.replies,
        *dead,
        t.lifecycle,
        t.shadow,
        t.breakers,
        t.audit,
    )
    out: list[Grant] = []

    def topic(c: Component, names_: Iterable[str], *ops: Operation) -> None:
        out.extend(Grant(c, "topic", n, ops) for n in names_)

    def prefixes(c: Component, resource: Resource, names_: Iterable[str], *ops: Operation) -> None:
        out.extend(Grant(c, resource, n, ops, prefixed=True) for n in names_)

    # Producer applications: send requests, read results. Nothing else.
    topic(pr, requests, "WRITE")
    prefixes(pr, "topic", pools, "WRITE")
    topic(pr, [t.results], "READ")
    prefixes(pr, "group", [PRODUCER_GROUPS], "READ")
    # A moving model's requests wait until the old pool's workers read past the producer's own
    # (clients.pool_moves): it reads their committed offsets, and cannot join their groups.
    prefixes(pr, "group", [names.worker_group], "DESCRIBE")

    # The gateway sends requests (its DLQ API redrives to them), reads its replies, folds the
    # lifecycle and the breakers, and audits; /admin's lifecycle events go to the event store,
    # whose outbox the controller publishes. Its lag probe reads the workers' committed offsets.
    topic(gw, requests, "WRITE", "DESCRIBE_CONFIGS")
    prefixes(gw, "topic", pools, "WRITE", "DESCRIBE_CONFIGS")
    topic(gw, [t.replies, t.breakers, *dead], "READ")
    prefixes(gw, "topic", [t.retry_prefix], "READ")
    topic(gw, [t.lifecycle], "READ")
    topic(gw, [t.audit], "WRITE")
    prefixes(gw, "group", [names.gateway_group, LIFECYCLE_FEED, MODEL_HEALTH, *DLQ_GROUPS], "READ")
    prefixes(gw, "group", [names.worker_group], "DESCRIBE")

    # Workers consume requests and their retries (the retry relay moves due ones back), write
    # results, replies, failures, shadow comparisons and breaker states, and fold the lifecycle
    # (their reports go to the event store). Their transactional ids and groups start with their
    # group's name.
    topic(wk, requests, "READ", "WRITE")
    prefixes(wk, "topic", pools, "READ", "WRITE")
    prefixes(wk, "topic", [t.retry_prefix], "READ", "WRITE")
    topic(wk, [t.results, t.replies, *dead, t.shadow], "WRITE")
    topic(wk, [t.breakers], "READ", "WRITE")
    topic(wk, [t.lifecycle], "READ")
    prefixes(wk, "group", [names.worker_group], "READ", "DESCRIBE_CONFIGS", "ALTER_CONFIGS")
    prefixes(wk, "group", [f"tidegate-worker-{names.worker_group}", LIFECYCLE_FEED], "READ")
    prefixes(wk, "transactional_id", [names.worker_group], "WRITE")

    # The controller indexes results and shadow comparisons, publishes the lifecycle's outbox
    # (every writer's events: the only principal that writes the lifecycle topic), and reads the
    # workers' lag.
    topic(ct, [t.results, t.shadow], "READ")
    topic(ct, [t.lifecycle], "READ", "WRITE")
    topic(ct, requests, "DESCRIBE")
    prefixes(ct, "topic", pools, "DESCRIBE")
    prefixes(ct, "group", [names.controller_group, LIFECYCLE_FEED], "READ")
    prefixes(ct, "group", [names.worker_group], "DESCRIBE")

    # The schema registry keeps its state in its own compacted topic, which it creates.
    topic(rg, [names.schemas_topic], "CREATE", "READ", "WRITE", "DESCRIBE_CONFIGS")
    prefixes(rg, "group", [REGISTRY_GROUPS], "READ")

    # Operators inspect everything, redrive and replay requests, and run lifecycle commands (to the
    # event store, as /admin does). Their
    # tools' groups are their own: they may read the workers' offsets (lag), never join the group.
    topic(op, every_topic, "READ", "DESCRIBE_CONFIGS")
    prefixes(op, "topic", [t.retry_prefix], "READ", "WRITE")
    topic(op, [*requests, *dead, t.audit], "WRITE")
    # `tidegate pools declare` creates a pool's topics.
    prefixes(op, "topic", pools, "CREATE", "READ", "WRITE", "DESCRIBE_CONFIGS")
    prefixes(op, "topic", [names.replay_topic], "CREATE", "READ", "WRITE")
    tools = [*DLQ_GROUPS, AUDIT_READ, LIFECYCLE_FEED, MODEL_HEALTH, names.replay_group_prefix]
    prefixes(op, "group", tools, "READ")
    prefixes(op, "group", [names.worker_group], "DESCRIBE")
    return out


_RESOURCE = {
    "topic": ResourceType.TOPIC,
    "group": ResourceType.GROUP,
    "transactional_id": ResourceType.TRANSACTIONAL_ID,
}


def bindings(table: Sequence[Grant], principals: Mapping[Component, str]) -> list[AclBinding]:
    """The broker's ACL bindings of `table`, one per operation, allowed from any host."""
    return [
        AclBinding(
            _RESOURCE[g.resource],
            g.name,
            ResourcePatternType.PREFIXED if g.prefixed else ResourcePatternType.LITERAL,
            principals[g.component],
            "*",
            getattr(AclOperation, op),
            AclPermissionType.ALLOW,
        )
        for g in table
        for op in g.operations
    ]


def apply_acls(admin: AdminClient, acls: Sequence[AclBinding], timeout: float = 30.0) -> int:
    """Creates `acls` (an existing one is left as it is); raises on the first the broker refuses.
    Returns how many were asked for."""
    if not acls:
        return 0
    for future in admin.create_acls(list(acls), request_timeout=timeout).values():
        future.result(timeout)
    return len(acls)


def binding_filter(b: AclBinding) -> AclBindingFilter:
    """The filter that matches `b` alone (to delete it)."""
    return AclBindingFilter(
        b.restype,
        b.name,
        b.resource_pattern_type,
        b.principal,
        b.host,
        b.operation,
        b.permission_type,
    )


def principal_filter(principal: str) -> AclBindingFilter:
    """The filter that matches every binding of `principal`."""
    return AclBindingFilter(
        ResourceType.ANY,
        None,  # type: ignore[arg-type]  # any name: librdkafka takes NULL, the stub says str
        ResourcePatternType.ANY,
        principal,
        None,  # type: ignore[arg-type]  # any host
        AclOperation.ANY,
        AclPermissionType.ANY,
    )


def prune_acls(
    admin: AdminClient,
    wanted: Sequence[AclBinding],
    principals: Iterable[str],
    timeout: float = 30.0,
) -> int:
    """Deletes every binding of `principals` that `wanted` does not hold, so that a grant the
    table no longer has is taken away on the cluster too. Returns how many were deleted."""
    keep = set(wanted)  # bindings compare (and hash) by every field
    stale: list[AclBinding] = []
    for principal in principals:
        found = admin.describe_acls(principal_filter(principal), request_timeout=timeout).result(
            timeout
        )
        stale += [b for b in found if b not in keep]
    if stale:
        filters = [binding_filter(b) for b in stale]
        for future in admin.delete_acls(filters, request_timeout=timeout).values():
            future.result(timeout)
    return len(stale)
