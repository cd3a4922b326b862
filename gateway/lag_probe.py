"""Reading the workers' backlog: their consumer group's committed offsets against the requests
topic's end offsets, every `AdmissionSettings.probe_interval_s`, on a thread of its own.

Two admin requests per probe (committed offsets, end offsets), whatever the request rate, so the
cost of knowing the backlog never grows with the load. What it reads goes to a callback
(`Admission.observe_kafka`) as the total lag and the committed offsets' sum, from whose movement
the workers' consumption rate follows. A failed probe is logged and skipped: the estimate keeps
its last value until a probe succeeds again.
"""

from __future__ import annotations

import threading
from collections.abc import Callable

from confluent_kafka import ConsumerGroupTopicPartitions, TopicPartition
from confluent_kafka.admin import AdminClient, OffsetSpec  # type: ignore[attr-defined]

from tidegate.core.kafka import make_admin
from tidegate.core.settings import KafkaSettings
from tidegate.core.telemetry import get_logger
from tidegate.gateway.admission_settings import AdmissionSettings

__all__ = ["LagProbe", "Observe", "read_lag"]

_log = get_logger(__name__)

Observe = Callable[[int, int], None]
# Partitions are listed again this often (in probes): a topic may grow partitions.
_RELIST_EVERY = 120


class LagProbe:
    def __init__(self, kafka: KafkaSettings, topic: str, settings: AdmissionSettings) -> None:
        self._kafka = kafka
        self._topic = topic
        self._settings = settings
        self._stopping = threading.Event()
        self._thread: threading.Thread | None = None

    def start(self, observe: Observe) -> None:
        self._thread = threading.Thread(
            target=self._run, args=(observe,), name="gateway-lag-probe", daemon=True
        )
        self._thread.start()

    def stop(self) -> None:
        self._stopping.set()
        if self._thread is not None:
            self._thread.join(timeout=10)

    def _run(self, observe: Observe) -> None:
        admin = make_admin(self._kafka)
        interval = self._settings.probe_interval_s
        timeout = max(1.0, 4 * interval)
        partitions: list[TopicPartition] = []
        probes = 0
        failing = False
        while not self._stopping.wait(0 if probes == 0 else interval):
            try:
                if not partitions or probes % _RELIST_EVERY == 0:
                    meta = admin.list_topics(self._topic, timeout=timeout).topics[self._topic]
                    partitions = [TopicPartition(self._topic, p) for p in sorted(meta.partitions)]
                probes += 1
                lag, committed = read_lag(admin, partitions, self._settings.worker_group, timeout)
            except Exception as exc:  # a broker away: keep the last estimate, say so once
                if not failing:
                    _log.warning("the workers' lag could not be read: %s", exc)
                failing = True
                probes += 1
                continue
            if failing:
                _log.info("the workers' lag is read again")
                failing = False
            observe(lag, committed)


def read_lag(
    admin: AdminClient, partitions: list[TopicPartition], group: str, timeout: float
) -> tuple[int, int]:
    """`group`'s lag on `partitions` (end offsets minus committed ones, over the partitions it
    has committed on) and the sum of its committed offsets: two admin requests."""
    wanted = [TopicPartition(tp.topic, tp.partition) for tp in partitions]
    offsets = admin.list_consumer_group_offsets(
        [ConsumerGroupTopicPartitions(group, wanted)], request_timeout=timeout
    )
    latest = OffsetSpec.latest()  # type: ignore[no-untyped-call]
    ends = admin.list_offsets(
        {TopicPartition(tp.topic, tp.partition): latest for tp in partitions},
        request_timeout=timeout,
    )
    committed = {tp.partition: tp.offset for tp in offsets[group].result(timeout).topic_partitions}
    lag = total = 0
    for tp, future in ends.items():
        end = future.result(timeout).offset
        done = committed.get(tp.partition, -1)
        if done < 0:  # nothing committed yet: no consumer of this partition to wait for
            continue
        lag += max(0, end - done)
        total += done
    return lag, total
