"""Exactly-once delivery against the real Kafka: `TIDEGATE_WORKER_DELIVERY=exactly-once` workers
consume, process and produce in transactions, so a worker killed mid-transaction leaves nothing
visible to read_committed readers, and its partitions' next owner redoes the work once.

"""

from __future__ import annotations

import os
import signal
import time
from collections import Counter
from typing import Any

from confluent_kafka import Consumer, TopicPartition

from tests.integration import workers
from tests.integration.agents.test_worker import start_worker
from tests.integration.workers import Stack, Waves, stop_workers
from tests.support import unique, wait_for
from tidegate.core.kafka import make_consumer
from tidegate.models.model_settings import ModelSettings

models = workers.models
stack = workers.stack

# Long transactions make a kill land inside one; a short session and transaction timeout let the
# survivor take over, and readers get past the dead worker's open transaction, within seconds.
EXACTLY_ONCE = {
    "TIDEGATE_WORKER_DELIVERY": "exactly-once",
    "TIDEGATE_WORKER_TRANSACTION_INTERVAL_MS": "1000",
    "TIDEGATE_WORKER_TRANSACTION_TIMEOUT_MS": "5000",
    "TIDEGATE_WORKER_SESSION_TIMEOUT_MS": "6000",
}


class Results:
    """Every record of the results topic, read committed or uncommitted, by request id."""

    def __init__(self, stack: Stack, isolation: str) -> None:
        self._decode = stack.results
        self.consumer: Consumer = make_consumer(
            stack.kafka, unique("eos-reader"), {"isolation.level": isolation}
        )
        self.consumer.assign([TopicPartition(stack.topics.results, p, 0) for p in range(4)])
        self.ids: Counter[str] = Counter()
        self.workers: Counter[str] = Counter()

    def poll(self) -> Counter[str]:
        for msg in self.consumer.consume(num_messages=500, timeout=0.2):
            if not msg.error():
                record: dict[str, Any] = self._decode(msg.value())
                self.ids[record["request_id"]] += 1
                self.workers[record["worker_id"]] += 1
        return self.ids

    def close(self) -> None:
        self.consumer.close()


def kill_one_of_two_mid_stream(
    stack: Stack, models: ModelSettings, **env: str
) -> tuple[Results, Results, list[str]]:
    """Two workers serve waves of requests; the first is SIGKILLed while waves keep coming, and
    the survivor finishes every request. Returns both readers and every request id."""
    committed = Results(stack, "read_committed")
    uncommitted = Results(stack, "read_uncommitted")
    first = start_worker(stack, models, TIDEGATE_WORKER_WORKER_ID="first", **env)
    second = start_worker(stack, models, TIDEGATE_WORKER_WORKER_ID="second", **env)
    waves = Waves(stack)
    wave, ids = waves.send, waves.ids

    def serving() -> set[str]:
        wave()
        time.sleep(0.3)
        committed.poll()
        return set(committed.workers)

    try:
        wait_for(lambda: {"first", "second"} <= serving(), timeout=90, what="both serving")
        for _ in range(3):  # the first worker's open transaction fills up
            wave()
            time.sleep(0.1)
        os.kill(first.pid, signal.SIGKILL)
        first.wait(timeout=10)
        for _ in range(5):
            wave()
            time.sleep(0.2)
        wanted = set(ids)
        wait_for(
            lambda: wanted <= set(committed.poll()),
            timeout=90,
            what="a committed result for every request",
        )
        wait_for(lambda: wanted <= set(uncommitted.poll()), timeout=30, what="every record")
    finally:
        stop_workers(first, second)
    return committed, uncommitted, ids


def test_a_worker_killed_mid_transaction_leaves_no_result_twice(
    stack: Stack, models: ModelSettings
) -> None:
    committed, uncommitted, ids = kill_one_of_two_mid_stream(stack, models, **EXACTLY_ONCE)
    try:
        twice = [rid for rid, n in committed.ids.items() if n > 1]
        assert not twice, f"{len(twice)} results committed twice, e.g. {twice[:3]}"
        assert set(committed.ids) == set(ids), "a request has no committed result"
        redone = [rid for rid, n in uncommitted.ids.items() if n > 1]
        assert redone, "the kill landed outside a transaction: nothing was redone"
    finally:
        committed.close()
        uncommitted.close()
