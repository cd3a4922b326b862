"""Reading the workers' backlog (`LagProbe`): their group's committed offsets against the requests
topic's end offsets, two requests every `probe_interval_s` on a thread of its own, through a
consumer that never joins the group; the same for each model pool's topic and group once a call
of the pool was checked. Never an `AdminClient`: it can abort the process.
Why, and what it reads: docs/overload.md ("What the gateway measures").
"""

from __future__ import annotations

import threading
from collections.abc import Callable

from confluent_kafka import OFFSET_END, Consumer, KafkaException, TopicPartition

from tidegate.core.kafka import close_within, make_offset_reader
from tidegate.core.settings import KafkaSettings
from tidegate.core.telemetry import get_logger
from tidegate.gateway.admission.admission_settings import AdmissionSettings

__all__ = ["LagProbe", "Observe", "read_lag"]

_log = get_logger(__name__)

Observe = Callable[[int, int], None]
# Partitions are listed again this often (in probes): a topic may grow partitions.
_RELIST_EVERY = 120
_CLOSE_S = 5.0  # a reader's close that takes longer is left behind (close_within)


class _Target:
    """One topic and group the probe reads, with its reader and what it last knew."""

    def __init__(self, topic: str, group: str, observe: Observe) -> None:
        self.topic = topic
        self.group = group
        self.observe = observe
        self.reader: Consumer | None = None
        self.partitions: list[TopicPartition] = []
        self.failing = False

    def probe(self, kafka: KafkaSettings, timeout: float, relist: bool) -> None:
        try:
            if self.reader is None:
                self.reader = make_offset_reader(kafka, self.group)
            if not self.partitions or relist:
                meta = self.reader.list_topics(self.topic, timeout=timeout).topics[self.topic]
                self.partitions = [TopicPartition(self.topic, p) for p in sorted(meta.partitions)]
            lag, committed = read_lag(self.reader, self.partitions, timeout)
        except Exception as exc:
            # A broker away: keep the last estimate, say so once, start afresh.
            if not self.failing:
                _log.warning("the workers' lag on %s could not be read: %s", self.topic, exc)
            self.failing = True
            self.close()
            return
        if self.failing:
            _log.info("the workers' lag on %s is read again", self.topic)
            self.failing = False
        self.observe(lag, committed)

    def close(self) -> None:
        if self.reader is not None:
            close_within(self.reader, _CLOSE_S, "gateway-lag-reader")
            self.reader = None


class LagProbe:
    def __init__(self, kafka: KafkaSettings, topic: str, settings: AdmissionSettings) -> None:
        self._kafka = kafka
        self._topic = topic
        self._settings = settings
        self._stopping = threading.Event()
        self._thread: threading.Thread | None = None
        self._targets: list[_Target] = []

    def start(self, observe: Observe) -> None:
        """Probe the default pool's topic and group; `watch` adds another pool's."""
        self.watch(self._topic, self._settings.worker_group, observe)
        self._thread = threading.Thread(target=self._run, name="gateway-lag-probe", daemon=True)
        self._thread.start()

    def watch(self, topic: str, group: str, observe: Observe) -> None:
        """Probe `group`'s lag on `topic` too, from the next probe on (any thread)."""
        self._targets = [*self._targets, _Target(topic, group, observe)]

    def stop(self) -> None:
        self._stopping.set()
        if self._thread is not None:
            self._thread.join(timeout=10)

    def _run(self) -> None:
        interval = self._settings.probe_interval_s
        timeout = max(1.0, 4 * interval)
        probes = 0
        try:
            while not self._stopping.wait(0 if probes == 0 else interval):
                probes += 1
                for target in self._targets:
                    target.probe(self._kafka, timeout, probes % _RELIST_EVERY == 0)
        finally:
            for target in self._targets:
                target.close()


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
