"""The gateway's lag probe reads a model pool's backlog too, once watched: the pool's group on
the pool's topic, against the real Kafka, beside the default pool's."""

from __future__ import annotations

import threading
from collections.abc import Callable

from confluent_kafka import TopicPartition
from confluent_kafka.admin import AdminClient, NewTopic  # type: ignore[attr-defined]

from tests.support import unique, wait_for
from tidegate.core.kafka import make_consumer, make_producer
from tidegate.core.settings import KafkaSettings
from tidegate.gateway.admission.admission_settings import AdmissionSettings
from tidegate.gateway.admission.lag_probe import LagProbe


def test_a_watched_pools_lag_is_read_beside_the_default_pools(
    admin: AdminClient, kafka_settings: KafkaSettings
) -> None:
    default_topic, pool_topic = unique("lag-default"), unique("lag-pool")
    default_group, pool_group = unique("lag-workers"), unique("lag-workers-pool")
    for future in admin.create_topics(
        [NewTopic(t, num_partitions=2, replication_factor=1) for t in (default_topic, pool_topic)]
    ).values():
        future.result(timeout=30)
    producer = make_producer(kafka_settings)
    for i in range(30):
        producer.produce(pool_topic, key=str(i).encode(), value=b"x", partition=i % 2)
    assert producer.flush(30) == 0
    # The pool's workers have committed 5 on each partition: a lag of 20.
    committer = make_consumer(kafka_settings, pool_group)
    committer.commit(offsets=[TopicPartition(pool_topic, p, 5) for p in (0, 1)], asynchronous=False)
    committer.close()

    seen: dict[str, tuple[int, int]] = {}
    lock = threading.Lock()

    def observer(name: str) -> Callable[[int, int], None]:
        def observe(lag: int, committed: int) -> None:
            with lock:
                seen[name] = (lag, committed)

        return observe

    settings = AdmissionSettings(worker_group=default_group, probe_interval_s=0.2)
    probe = LagProbe(kafka_settings, default_topic, settings)
    probe.start(observer("default"))
    try:
        wait_for(lambda: "default" in seen, timeout=30, what="the default pool's lag")
        assert "pool" not in seen
        probe.watch(pool_topic, pool_group, observer("pool"))
        wait_for(lambda: "pool" in seen, timeout=30, what="the pool's lag")
        assert seen["pool"] == (20, 10)
        assert seen["default"] == (0, 0)  # nothing committed there: nothing waits on it
    finally:
        probe.stop()
        for future in admin.delete_topics([default_topic, pool_topic]).values():
            future.result(timeout=30)
