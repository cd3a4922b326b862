"""The workers' consumer lag for every partition of the requests topic, from the brokers.

A worker reports lag only for the partitions it holds, so a partition nobody holds (the group is
empty, or a rebalance is stuck) shows no lag at all where it matters most. The controller, one per
deployment, reads the group's committed offsets and the partitions' end offsets through a consumer
that never joins the group, and which partitions the group's members hold through the admin
client, every `group_lag_every_s` (see `refresh` for why not all through the admin client).
"""

from __future__ import annotations

import asyncio
import logging

from confluent_kafka import (
    OFFSET_BEGINNING,
    OFFSET_END,
    Consumer,
    KafkaException,
    TopicPartition,
)
from confluent_kafka.admin import AdminClient
from prometheus_client import Gauge

from tidegate.core.aio import Periodic
from tidegate.core.kafka import close_within, make_admin, make_offset_reader
from tidegate.core.settings import KafkaSettings

__all__ = ["GROUP_LAG", "UNASSIGNED", "GroupLag"]

_log = logging.getLogger(__name__)
_TIMEOUT_S = 10.0
_CLOSE_S = 10.0  # a close that takes longer is left to finish on its own (close_within)

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
        self._kafka = kafka
        self._reader: Consumer | None = None
        self._admin: AdminClient | None = None
        self._periodic = Periodic(self._step, every_s, name="group-lag")

    def start(self) -> None:
        self._periodic.start()

    async def stop(self) -> None:
        await self._periodic.stop()
        await asyncio.to_thread(self._drop)

    async def _step(self) -> None:
        try:
            await asyncio.to_thread(self.refresh)
        except KafkaException as exc:
            _log.warning("cannot read the lag of group %s: %s", self.group, exc)
            # Nothing of a broken connection's state is kept (the admin client's least of all).
            await asyncio.to_thread(self._drop)

    def _drop(self) -> None:
        reader, self._reader, self._admin = self._reader, None, None
        if reader is not None:
            close_within(reader, _CLOSE_S, "group-lag-reader")

    def refresh(self) -> dict[int, int]:
        """Read and export the lag of each partition; returns it.

        Offsets come through a consumer that never joins the group (`make_offset_reader`); the
        admin client, whose timed-out requests can abort the process in a broker outage, is
        asked only which members hold what, and only once the offsets were read."""
        if self._reader is None:
            self._reader = make_offset_reader(self._kafka, self.group)
        reader, topic = self._reader, self.topic
        found = reader.list_topics(topic, timeout=_TIMEOUT_S).topics.get(topic)
        if found is None or found.error is not None:
            return {}
        partitions = [TopicPartition(topic, p) for p in sorted(found.partitions)]
        end = _offsets(reader, partitions, OFFSET_END)
        start = _offsets(reader, partitions, OFFSET_BEGINNING)
        committed = reader.committed(partitions, timeout=_TIMEOUT_S)
        positions = {tp.partition: tp.offset for tp in committed}
        lag: dict[int, int] = {}
        for tp in partitions:
            position = positions.get(tp.partition, -1)
            since = position if position >= 0 else start[tp.partition]
            lag[tp.partition] = max(0, end[tp.partition] - since)
            GROUP_LAG.labels(self.group, topic, str(tp.partition)).set(lag[tp.partition])
        if self._admin is None:
            self._admin = make_admin(self._kafka)
        described = self._admin.describe_consumer_groups([self.group])[self.group]
        members = described.result(_TIMEOUT_S).members
        held = {
            tp.partition
            for member in members
            if member.assignment is not None
            for tp in member.assignment.topic_partitions
            if tp.topic == topic
        }
        UNASSIGNED.labels(self.group, topic).set(len(set(lag) - held))
        return lag


def _offsets(reader: Consumer, partitions: list[TopicPartition], which: int) -> dict[int, int]:
    """Each partition's end (`OFFSET_END`) or start (`OFFSET_BEGINNING`) offset: one ListOffsets
    request, whose timestamp -1 or -2 asks exactly that."""
    asked = [TopicPartition(tp.topic, tp.partition, which) for tp in partitions]
    out: dict[int, int] = {}
    for tp in reader.offsets_for_times(asked, timeout=_TIMEOUT_S):
        if tp.error is not None:
            raise KafkaException(tp.error)
        out[tp.partition] = tp.offset
    return out
