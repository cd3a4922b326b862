"""Exactly-once delivery against the real Kafka: `TIDEGATE_WORKER_DELIVERY=exactly-once` workers
consume, process and produce in transactions, so a worker killed mid-transaction leaves nothing
visible to read_committed readers, and its partitions' next owner does the work once.

The kill is made to land inside a transaction, not left to timing: the victim serves alone and
never commits on its own (its transaction interval and timeout outlast the test), it is SIGKILLed
once its results are visible read_uncommitted, and its transactional.id is fenced at once, as a
restarted worker would fence it, which aborts the transaction it left open. Only then does the
survivor start.
"""

from __future__ import annotations

import os
import signal
from collections import Counter
from typing import Any

import pytest
from confluent_kafka import Consumer, TopicPartition

from tests.integration.workers import Stack, publish, request, start_worker, stop_workers
from tests.support import unique, wait_for
from tidegate.core.kafka import make_consumer, make_producer
from tidegate.models.model_settings import ModelSettings

# The longest interval the settings allow, and a timeout past the test's: the victim's open
# transaction ends only when the test fences it.
VICTIM_TIMEOUT_MS = 600_000
VICTIM = {
    "TIDEGATE_WORKER_DELIVERY": "exactly-once",
    "TIDEGATE_WORKER_TRANSACTION_INTERVAL_MS": "60000",
    "TIDEGATE_WORKER_TRANSACTION_TIMEOUT_MS": str(VICTIM_TIMEOUT_MS),
    "TIDEGATE_WORKER_SESSION_TIMEOUT_MS": "6000",
}
SURVIVOR = {"TIDEGATE_WORKER_DELIVERY": "exactly-once"}
REQUESTS = 40


class Results:
    """Every record of the results topic, read committed or uncommitted: how many each worker
    wrote for each request id."""

    def __init__(self, stack: Stack, isolation: str) -> None:
        self._decode = stack.results
        self.consumer: Consumer = make_consumer(
            stack.kafka, unique("eos-reader"), {"isolation.level": isolation}
        )
        self.consumer.assign([TopicPartition(stack.topics.results, p, 0) for p in range(4)])
        self.by_id: dict[str, Counter[str]] = {}

    def poll(self) -> dict[str, Counter[str]]:
        for msg in self.consumer.consume(num_messages=500, timeout=0.2):
            if not msg.error():
                record: dict[str, Any] = self._decode(msg.value())
                self.by_id.setdefault(record["request_id"], Counter())[record["worker_id"]] += 1
        return self.by_id

    def written_by(self, worker_id: str) -> set[str]:
        return {rid for rid, writers in self.poll().items() if writers[worker_id]}

    def close(self) -> None:
        self.consumer.close()


def fence(stack: Stack, transactional_id: str) -> None:
    """What a worker restarted with this transactional.id does first: its `init_transactions`
    bumps the id's epoch, so the dead instance is fenced, and aborts what it left open."""
    producer = make_producer(
        stack.kafka,
        {"transactional.id": transactional_id, "transaction.timeout.ms": VICTIM_TIMEOUT_MS},
    )
    producer.init_transactions(30.0)


# Two worker starts (each loads the model) and two waits of at most 120 s each.
@pytest.mark.timeout(420)
def test_a_worker_killed_mid_transaction_leaves_no_result_twice(
    stack: Stack, models: ModelSettings
) -> None:
    ids = {f"eos-{i:03d}" for i in range(REQUESTS)}
    publish(stack, [request(rid, f"k{i % 16}") for i, rid in enumerate(sorted(ids))])
    committed = Results(stack, "read_committed")
    uncommitted = Results(stack, "read_uncommitted")
    transactional_id = unique("eos-victim")
    victim = start_worker(
        stack,
        models,
        TIDEGATE_WORKER_WORKER_ID="victim",
        TIDEGATE_WORKER_TRANSACTIONAL_ID=transactional_id,
        **VICTIM,
    )
    survivor = None
    try:
        # Alone in the group, the victim serves every partition; its results stay in its open
        # transaction.
        wait_for(
            lambda: ids <= uncommitted.written_by("victim"),
            timeout=120,
            what="the victim's result of every request, read uncommitted",
        )
        os.kill(victim.pid, signal.SIGKILL)
        victim.wait(timeout=10)
        fence(stack, transactional_id)
        survivor = start_worker(stack, models, TIDEGATE_WORKER_WORKER_ID="survivor", **SURVIVOR)
        wait_for(
            lambda: ids <= committed.written_by("survivor"),
            timeout=120,
            what="the survivor's committed result of every request",
        )
        # Everything committed so far is on the topic: the uncommitted view has all of it too.
        wait_for(
            lambda: ids <= uncommitted.written_by("survivor"),
            timeout=30,
            what="the survivor's results, read uncommitted",
        )
        committed.poll()
    finally:
        stop_workers(victim, *([survivor] if survivor is not None else []))
        committed.close()
        uncommitted.close()

    # Preconditions: the kill landed inside the victim's open transaction, which was aborted.
    unwritten = sorted(rid for rid in ids if not uncommitted.by_id[rid]["victim"])
    assert not unwritten, f"the victim wrote no result of {unwritten}"
    leaked = sorted(rid for rid, writers in committed.by_id.items() if writers["victim"])
    assert not leaked, f"the victim committed results of {leaked}: the kill was not mid-transaction"
    # Exactly once: each request has one committed result, the survivor's.
    assert set(committed.by_id) == ids, "a committed result of a request never sent"
    wrong = {rid: dict(w) for rid, w in committed.by_id.items() if w != Counter(survivor=1)}
    assert not wrong, f"{len(wrong)} requests without exactly one committed result: {wrong}"
