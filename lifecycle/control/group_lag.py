"""The workers' consumer lag for every partition of the requests topic, from the brokers.

A worker reports lag only for the partitions it holds, so a partition nobody holds (the group is
empty, or a rebalance is stuck) shows no lag at all where it matters most. The controller, one per
deployment, reads the group's committed offsets and the partitions' end offsets with the admin
client, and which partitions the group's members hold, every `group_lag_every_s`.
"""

from __future__ import annotations

import asyncio
import logging

from confluent_kafka import ConsumerGroupTopicPartitions, KafkaException, TopicPartition
from confluent_kafka.admin import AdminClient, OffsetSpec  # type: ignore[attr-defined]
from prometheus_client import Gauge

from tidegate.core.aio import Periodic
from tidegate.core.kafka import make_admin
from tidegate.core.settings import KafkaSettings

__all__ = ["GROUP_LAG", "UNASSIGNED", "GroupLag"]

_log = logging.getLogger(__name__)
_TIMEOUT_S = 10.0

GROUP_LAG = Gauge(
    "tidegate_group_lag",
    "End offset minus the group's committed offset (the earliest offset when it committed "
    "none), for every partition of the topic, read by the controller.",
    ["group", "topic", "partition"],
)
UNASSIGNED = Gauge(
    "tidegate_group_unassigned_partitions",
    "Partitions of the topic that no member of the group holds.",
    ["group", "topic"],
)


class GroupLag:
    def __init__(self, kafka: KafkaSettings, group: str, topic: str, *, every_s: float) -> None:
        self.group = group
        self.topic = topic
        self._admin: AdminClient = make_admin(kafka)
        self._periodic = Periodic(self._step, every_s, name="group-lag")

    def start(self) -> None:
        self._periodic.start()

    async def stop(self) -> None:
        await self._periodic.stop()

    async def _step(self) -> None:
        try:
            await asyncio.to_thread(self.refresh)
        except KafkaException as exc:
            _log.warning("cannot read the lag of group %s: %s", self.group, exc)

    def refresh(self) -> dict[int, int]:
        """Read and export the lag of each partition; returns it."""
        admin, topic = self._admin, self.topic
        found = admin.list_topics(topic, timeout=_TIMEOUT_S).topics.get(topic)
        if found is None or found.error is not None:
            return {}
        partitions = [TopicPartition(topic, p) for p in sorted(found.partitions)]
        end = self._offsets(partitions, OffsetSpec.latest())  # type: ignore[no-untyped-call]
        start = self._offsets(partitions, OffsetSpec.earliest())  # type: ignore[no-untyped-call]
        request = [ConsumerGroupTopicPartitions(self.group, partitions)]
        committed = admin.list_consumer_group_offsets(request)[self.group].result(_TIMEOUT_S)
        positions = {tp.partition: tp.offset for tp in committed.topic_partitions or []}
        lag: dict[int, int] = {}
        for tp in partitions:
            position = positions.get(tp.partition, -1)
            since = position if position >= 0 else start[tp.partition]
            lag[tp.partition] = max(0, end[tp.partition] - since)
            GROUP_LAG.labels(self.group, topic, str(tp.partition)).set(lag[tp.partition])
        described = admin.describe_consumer_groups([self.group])[self.group].result(_TIMEOUT_S)
        held = {
            tp.partition
            for member in described.members
            if member.assignment is not None
            for tp in member.assignment.topic_partitions
            if tp.topic == topic
        }
        UNASSIGNED.labels(self.group, topic).set(len(set(lag) - held))
        return lag

    def _offsets(self, partitions: list[TopicPartition], spec: OffsetSpec) -> dict[int, int]:
        futures = self._admin.list_offsets({tp: spec for tp in partitions})
        return {tp.partition: fut.result(_TIMEOUT_S).offset for tp, fut in futures.items()}
