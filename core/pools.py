"""Model pools' Kafka layout: a pool's requests topics (one per lane) and its
consumer group are derived from the default pool's, so a set-up without pools changes nothing.
What a pool is and how models are placed in one: docs/pools.md.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import TYPE_CHECKING

from tidegate.core.pool_names import check_pool
from tidegate.core.settings import TopicSettings

if TYPE_CHECKING:
    from confluent_kafka.admin import AdminClient

__all__ = ["declared_pools", "missing_topics", "pool_group", "pool_topic_names", "pool_topics"]


def pool_topics(topics: TopicSettings, pool: str | None) -> TopicSettings:
    """The topic layout a pool's workers and publishers use: the same as `topics`, except for
    the requests topic of each lane, `<requests>.<pool>`, and the retry topics,
    `<retry_prefix>.<pool>-<level>`, which the pool's own retry relays read (a request is
    retried where it was first read). The default pool (None) is `topics`."""
    if pool is None:
        return topics
    check_pool(pool)
    return topics.model_copy(
        update={
            "requests": f"{topics.requests}.{pool}",
            "requests_batch": f"{topics.requests_batch}.{pool}",
            "retry_prefix": f"{topics.retry_prefix}.{pool}",
        }
    )


def pool_topic_names(topics: TopicSettings, pool: str) -> list[str]:
    """The topics a pool has of its own: its requests topics and its retry topics."""
    layout = pool_topics(topics, pool)
    return [layout.requests, layout.requests_batch, *layout.retry_topics()]


def pool_group(group_id: str, pool: str | None) -> str:
    """The consumer group of a pool's workers: `<group_id>.<pool>`, or `group_id` for the default
    pool, so a pool's backlog and lag are its own."""
    return group_id if pool is None else f"{group_id}.{check_pool(pool)}"


def missing_topics(
    admin: AdminClient, topics: TopicSettings, pool: str, timeout: float
) -> list[str]:
    """The topics of `pool` that Kafka does not have (empty: the pool may take
    models). `tidegate pools declare` creates them."""
    present = admin.list_topics(timeout=timeout).topics
    return [t for t in pool_topic_names(topics, pool) if t not in present]


def declared_pools(names: Iterable[str], topics: TopicSettings) -> list[str]:
    """The pools whose real-time requests topic (`<requests>.<pool>`) is among the topic
    `names` (what Kafka listed), sorted."""
    prefix = f"{topics.requests}."
    return sorted(name.removeprefix(prefix) for name in names if name.startswith(prefix))
