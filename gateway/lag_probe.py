"""Reading the workers' backlog: their consumer group's committed offsets against the requests
topic's end offsets, every `AdmissionSettings.probe_interval_s`, on a thread of its own.

Two requests per probe (the group's committed offsets, the partitions' end offsets), whatever the
request rate, so the cost of knowing the backlog never grows with the load. What it reads goes
to a callback (`Admission.observe_kafka`) as the total lag and the committed offsets' sum, from
whose movement the workers' consumption rate follows. A failed probe is logged and skipped: the
estimate keeps its last value until a probe succeeds again.

The probe reads through a plain consumer, never an `AdminClient`: librdkafka aborts the whole
process (`rd_kafka_enq_once_del_source_return: Assertion 'eonce->refcnt > 0' failed`) when
admin requests time out across a broker restart (librdkafka issues 4605 and 3663), which killed
a gateway in a 15 s Kafka outage. The consumer names the workers' group but never subscribes, so
it never joins, commits or moves it: `committed()` is one OffsetFetch, and `offsets_for_times`
with the timestamp -1 (ListOffsets' "latest") gives every partition's end offset in one request.
After a failure the consumer is made anew, so nothing of a broken connection's state lingers.
"""

from __future__ import annotations

import threading
from collections.abc import Callable

from confluent_kafka import OFFSET_END, Consumer, KafkaException, TopicPartition

from tidegate.core.kafka import make_offset_reader
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
        interval = self._settings.probe_interval_s
        timeout = max(1.0, 4 * interval)
        group = self._settings.worker_group
        reader: Consumer | None = None
        partitions: list[TopicPartition] = []
        probes = 0
        failing = False
        try:
            while not self._stopping.wait(0 if probes == 0 else interval):
                probes += 1
                try:
                    if reader is None:
                        reader = make_offset_reader(self._kafka, group)
                    if not partitions or probes % _RELIST_EVERY == 0:
                        meta = reader.list_topics(self._topic, timeout=timeout).topics[self._topic]
                        partitions = [
                            TopicPartition(self._topic, p) for p in sorted(meta.partitions)
                        ]
                    lag, committed = read_lag(reader, partitions, timeout)
                except Exception as exc:
                    # A broker away: keep the last estimate, say so once, start afresh.
                    if not failing:
                        _log.warning("the workers' lag could not be read: %s", exc)
                    failing = True
                    if reader is not None:
                        _close(reader)
                        reader = None
                    continue
                if failing:
                    _log.info("the workers' lag is read again")
                    failing = False
                observe(lag, committed)
        finally:
            if reader is not None:
                _close(reader)


def _close(reader: Consumer) -> None:
    try:
        reader.close()
    except (KafkaException, RuntimeError) as exc:
        _log.debug("closing the lag reader: %s", exc)


def read_lag(reader: Consumer, partitions: list[TopicPartition], timeout: float) -> tuple[int, int]:
    """The lag of `reader`'s group on `partitions` (end offsets minus committed ones, over the
    partitions it has committed on) and the sum of its committed offsets: two requests."""
    wanted = [TopicPartition(tp.topic, tp.partition) for tp in partitions]
    committed = {tp.partition: tp.offset for tp in reader.committed(wanted, timeout=timeout)}
    latest = [TopicPartition(tp.topic, tp.partition, OFFSET_END) for tp in partitions]
    lag = total = 0
    for tp in reader.offsets_for_times(latest, timeout=timeout):
        if tp.error is not None:
            raise KafkaException(tp.error)
        done = committed.get(tp.partition, -1)
        if done < 0:  # nothing committed yet: no consumer of this partition to wait for
            continue
        lag += max(0, tp.offset - done)
        total += done
    return lag, total
