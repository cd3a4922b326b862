"""Killing one of two workers under steady load and timing how soon the survivor serves its
partitions: the takeover test's and `python -m tests.bench takeover`'s."""

from __future__ import annotations

import os
import signal
import subprocess
import threading
import time
from collections import Counter
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any

from confluent_kafka import Consumer, TopicPartition

from tests.integration.workers import Stack, request, start_worker, stop_workers
from tests.support import unique, wait_for
from tidegate.core.kafka import make_admin, make_consumer, make_producer
from tidegate.models.model_settings import ModelSettings

__all__ = [
    "BAR_S",
    "CLASSIC_OLD",
    "FAST",
    "KIP848",
    "Load",
    "Results",
    "Takeovers",
    "kill_and_measure",
    "worker",
]


# What each side of the comparison sets; the new settings are the defaults.
CLASSIC_OLD = {
    "TIDEGATE_WORKER_SESSION_TIMEOUT_MS": "10000",
    "TIDEGATE_WORKER_HEARTBEAT_INTERVAL_MS": "1000",
}


FAST = {"TIDEGATE_WORKER_GROUP_PROTOCOL": "classic"}


KIP848 = {"TIDEGATE_WORKER_GROUP_PROTOCOL": "consumer"}


# The bar `make bench` holds the new settings to.
BAR_S = 3.0


_RATE_PER_S = 100


@dataclass
class Results:
    """Every result record with its Kafka timestamp (when the worker produced it)."""

    stack: Stack
    consumer: Consumer = field(init=False)
    records: list[tuple[dict[str, Any], float]] = field(default_factory=list)

    def __post_init__(self) -> None:
        self.consumer = make_consumer(self.stack.kafka, unique("takeover-reader"))
        topic = self.stack.topics.results
        self.consumer.assign([TopicPartition(topic, p, 0) for p in range(4)])

    def poll(self) -> list[tuple[dict[str, Any], float]]:
        for msg in self.consumer.consume(num_messages=500, timeout=0.05):
            if not msg.error():
                _, ms = msg.timestamp()
                self.records.append((self.stack.results(msg.value()), ms / 1000.0))
        return self.records

    def partitions_of(self, worker_id: str, since: float) -> set[int]:
        return {
            r["source"]["partition"]
            for r, at in self.records
            if r["worker_id"] == worker_id and at >= since
        }

    def ids(self) -> Counter[str]:
        return Counter(r["request_id"] for r, _ in self.records)


class Load:
    """Steady keyed requests (16 keys over the 4 partitions) from a thread, every id kept."""

    def __init__(self, stack: Stack, rate_per_s: float = _RATE_PER_S) -> None:
        self.stack, self.ids, self._gap = stack, list[str](), 1.0 / rate_per_s
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="takeover-load", daemon=True)

    def start(self) -> None:
        self._thread.start()

    def stop(self) -> set[str]:
        """Stop sending; every id sent."""
        self._stop.set()
        self._thread.join(30)
        return set(self.ids)

    def _run(self) -> None:
        producer = make_producer(self.stack.kafka)
        schema_id = self.stack.encoder.schema_id(f"{self.stack.topics.requests}-value")
        prefix = unique("t")
        next_at = time.monotonic()
        while not self._stop.is_set():
            item = request(f"{prefix}-{len(self.ids)}", f"k{len(self.ids) % 16}")
            value = self.stack.encoder.encode(item, schema_id)
            producer.produce(self.stack.topics.requests, key=item["routing_key"], value=value)
            self.ids.append(item["request_id"])
            producer.poll(0)
            next_at += self._gap
            self._stop.wait(max(0.0, next_at - time.monotonic()))
        producer.flush(30)


@dataclass
class Takeovers:
    seconds: list[float]
    requests: int
    duplicates: int
    protocols: set[str]  # the group's protocol, as the brokers describe it while both served


@contextmanager
def worker(
    stack: Stack, models: ModelSettings, name: str, env: dict[str, str]
) -> Iterator[subprocess.Popen[bytes]]:
    proc = start_worker(stack, models, TIDEGATE_WORKER_WORKER_ID=name, **env)
    try:
        yield proc
    finally:
        stop_workers(proc)


def kill_and_measure(
    stack: Stack, models: ModelSettings, env: dict[str, str], kills: int = 1
) -> Takeovers:
    """Under steady load, `kills` times: start a second worker beside the survivor, wait until
    both serve, SIGKILL the one started last and time how long until results of each of its
    partitions come from the survivor."""
    results = Results(stack)
    seconds: list[float] = []
    protocols: set[str] = set()
    load = Load(stack)
    load.start()
    try:
        with worker(stack, models, "survivor", env):
            for k in range(kills):
                seconds.append(_kill_one(stack, models, env, results, f"victim-{k}", protocols))
                print(f"takeover {k + 1}: {seconds[-1]:.2f} s")
            wanted = load.stop()
            wait_for(
                lambda: wanted <= set(_ids(results)), timeout=90, what="a result for every request"
            )
    finally:
        load.stop()
    counts = results.ids()
    results.consumer.close()
    duplicates = sum(n - 1 for n in counts.values() if n > 1)
    return Takeovers(seconds, len(wanted), duplicates, protocols)


def _kill_one(
    stack: Stack,
    models: ModelSettings,
    env: dict[str, str],
    results: Results,
    name: str,
    protocols: set[str],
) -> float:
    with worker(stack, models, name, env) as victim:
        started = time.time()
        wait_for(
            lambda: results.poll()
            and results.partitions_of(name, started)
            and results.partitions_of("survivor", time.time() - 1.0),
            timeout=120,
            what="both workers serving",
        )
        # The group settles (a second rebalance may move partitions once more).
        settled = time.time() + 2.0
        wait_for(lambda: results.poll() and time.time() > settled, what="the group settling")
        held = results.partitions_of(name, time.time() - 1.0)
        assert held, f"{name} serves no partition"
        admin = make_admin(stack.kafka)  # held: a collected client never completes its futures
        group = admin.describe_consumer_groups([stack.group])[stack.group].result(timeout=10)
        protocols.add(group.type.name.lower())
        killed_at = time.time()
        os.kill(victim.pid, signal.SIGKILL)
        victim.wait(timeout=10)
        firsts = wait_for(
            lambda: _served_again(results, held, killed_at),
            timeout=60,
            what=f"the survivor serving partitions {sorted(held)}",
        )
    return max(firsts.values()) - killed_at


def _ids(results: Results) -> Counter[str]:
    results.poll()
    return results.ids()


def _served_again(results: Results, held: set[int], since: float) -> dict[int, float] | None:
    """When each of `held` first had a result from the survivor after `since`; None until all."""
    firsts: dict[int, float] = {}
    for record, at in results.poll():
        partition = record["source"]["partition"]
        if record["worker_id"] == "survivor" and partition in held and at >= since:
            firsts[partition] = min(at, firsts.get(partition, at))
    return firsts if set(firsts) == held else None
