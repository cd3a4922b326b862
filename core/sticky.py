"""Sticky partitions for records whose key promises no order.

librdkafka sends one ProduceRequest per partition (measured: 8 partitions written within one
`linger.ms` cost 8 requests), and a request to a broker costs it about 0.3 ms of CPU on these
machines. A request without a routing key is keyed by its own id, which no other record shares,
so its partition is arbitrary; hashing that id spread a gateway's calls over every partition, one
ProduceRequest (and one fetch by a worker, and one result produce) per call however many calls a
linger held. `StickyPartitions` sends such records to one partition for `window_s`, then to the
next, as librdkafka's own sticky partitioner does for records without a key (KIP-480), while the
record keeps its key: the results, retries and dead letters that derive theirs from it are
unchanged. Records with a routing key are never given a partition here; they hash as always, so
per-key order holds.
"""

from __future__ import annotations

import time
from collections.abc import Callable

__all__ = ["StickyPartitions"]


class StickyPartitions:
    """`pick(topic, count)`: the partition for a record that may go anywhere. Not thread-safe:
    each producer's caller holds its own."""

    __slots__ = ("_clock", "_current", "_window_s")

    def __init__(self, window_s: float, clock: Callable[[], float] = time.monotonic) -> None:
        self._window_s = window_s
        self._clock = clock
        # topic -> (partition, until)
        self._current: dict[str, tuple[int, float]] = {}

    def pick(self, topic: str, count: int) -> int:
        now = self._clock()
        current = self._current.get(topic)
        if current is not None and now < current[1] and current[0] < count:
            return current[0]
        partition = 0 if current is None else (current[0] + 1) % count
        if current is None:
            # Replicas and workers started together should not all begin on partition 0.
            partition = int(now * 1_000_003) % count
        self._current[topic] = (partition, now + self._window_s)
        return partition
