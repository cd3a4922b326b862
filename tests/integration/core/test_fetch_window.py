"""The worker's fetch window against the real broker: a burst read at once goes after the idle
slice, not the whole window; without the idle close the same burst waits the window out. A
message already queued when the poll starts has waited since the caller's last batch, and the
window counts from then."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Iterator

import pytest
from confluent_kafka import OFFSET_BEGINNING, Consumer, Producer, TopicPartition

from tests.support import unique
from tidegate.core.kafka import consume_ready, make_consumer, make_producer
from tidegate.core.settings import KafkaSettings

_BURST = 5


def burst_read(kafka_settings: KafkaSettings, topic: str) -> tuple[Producer, Consumer]:
    """A producer that sent one burst to `topic`, and a consumer of it from the start."""
    producer = make_producer(kafka_settings)
    for i in range(_BURST):
        producer.produce(topic, value=str(i).encode())
    assert producer.flush(30) == 0
    consumer = make_consumer(kafka_settings, unique("fetch-window"))
    consumer.assign([TopicPartition(topic, 0, OFFSET_BEGINNING)])
    return producer, consumer


@pytest.fixture
def burst(kafka_settings: KafkaSettings, new_topic: Callable[..., str]) -> Iterator[Consumer]:
    """A consumer of a topic that holds one producer's burst, produced before it reads."""
    _, consumer = burst_read(kafka_settings, new_topic("fetch-window"))
    yield consumer
    consumer.close()


def timed(consumer: Consumer, window: float, idle: float | None) -> tuple[int, float]:
    started = time.monotonic()
    taken = consume_ready(consumer, 500, 30.0, window, idle)
    return len(taken), time.monotonic() - started


def test_a_burst_goes_after_the_idle_slice(burst: Consumer) -> None:
    count, took = timed(burst, window=5.0, idle=0.1)
    assert count == _BURST
    assert took < 2.5, f"the burst waited {took:.2f} s of a 5 s window"


def test_without_the_idle_close_a_burst_waits_the_window_out(burst: Consumer) -> None:
    count, took = timed(burst, window=1.0, idle=None)
    assert count == _BURST
    assert took >= 0.95, f"the window closed after {took:.2f} s of 1 s"


@pytest.fixture
def trickle(kafka_settings: KafkaSettings, new_topic: Callable[..., str]) -> Iterator[Consumer]:
    """A consumer with messages already queued, and one more arriving every 50 ms meanwhile."""
    topic = new_topic("fetch-window-trickle")
    producer, consumer = burst_read(kafka_settings, topic)
    # The burst comes in one fetch: once its first message is read, the rest is queued.
    assert consumer.poll(30) is not None
    stop = threading.Event()

    def produce() -> None:
        while not stop.wait(0.05):
            producer.produce(topic, value=b"more")
            producer.poll(0)

    thread = threading.Thread(target=produce, daemon=True)
    thread.start()
    yield consumer
    stop.set()
    thread.join()
    producer.flush(10)
    consumer.close()


def test_the_window_counts_from_the_last_batch_for_a_queued_message(trickle: Consumer) -> None:
    # The caller took its last batch 0.6 s ago: what is queued has waited that long already.
    started = time.monotonic()
    taken = consume_ready(trickle, 500, 30.0, 1.0, None, since=started - 0.6)
    took = time.monotonic() - started
    assert len(taken) > _BURST - 1, "the window collected nothing more"
    assert 0.25 <= took <= 0.75, f"the window closed after {took:.2f} s, not 1 - 0.6 s"


def test_without_the_last_batch_time_a_queued_message_waits_the_whole_window(
    trickle: Consumer,
) -> None:
    count, took = timed(trickle, window=1.0, idle=None)
    assert count > _BURST - 1
    assert took >= 0.95, f"the window closed after {took:.2f} s of 1 s"
