"""The lifecycle feed on real Kafka and the registry: replay, dedupe, gaps, poison, listeners."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable, Iterable, Iterator

import pytest
from confluent_kafka import Producer
from confluent_kafka.schema_registry import SchemaRegistryClient

from tests.support import unique
from tests.unit.lifecycle_events import recorded, registered_and_validated
from tidegate.core.errors import LifecycleUnavailableError
from tidegate.core.kafka import make_producer
from tidegate.core.settings import KafkaSettings, SchemaRegistrySettings, TopicSettings
from tidegate.lifecycle.domain import events as ev
from tidegate.lifecycle.domain.routing import RoutingTable
from tidegate.lifecycle.domain.state import ModelState, fold
from tidegate.lifecycle.eventstore.event_codec import LifecycleCodec
from tidegate.lifecycle.readmodels.feed import LifecycleFeed
from tidegate.schemas.catalog import topic_subjects
from tidegate.schemas.registration import RegistryHttp, register_all
from tidegate.schemas.wire import pack


@pytest.fixture
def topics(
    new_topic: Callable[..., str], registry_settings: SchemaRegistrySettings
) -> TopicSettings:
    topics = TopicSettings(lifecycle=new_topic("it-lc"))
    with RegistryHttp(registry_settings) as http:
        subjects = topic_subjects(topics)
        list(
            register_all(http, {f"{topics.lifecycle}-value": subjects[f"{topics.lifecycle}-value"]})
        )
    return topics


@pytest.fixture
def codec(topics: TopicSettings, registry_settings: SchemaRegistrySettings) -> LifecycleCodec:
    return LifecycleCodec(SchemaRegistryClient(registry_settings.client_config()), topics)


@pytest.fixture
def producer(kafka_settings: KafkaSettings) -> Iterator[Producer]:
    producer = make_producer(kafka_settings)
    yield producer
    producer.flush(10)


@pytest.fixture
def feed(
    kafka_settings: KafkaSettings, topics: TopicSettings, registry_settings: SchemaRegistrySettings
) -> Iterator[LifecycleFeed]:
    feed = LifecycleFeed(kafka_settings, topics, registry_settings, name=unique("it-feed"))
    yield feed
    feed.stop()


def publish(producer: Producer, topic: str, values: Iterable[tuple[str, bytes]]) -> None:
    for key, value in values:
        producer.produce(topic, key=key.encode(), value=value)
    assert producer.flush(15) == 0


async def test_an_empty_topic_is_caught_up_at_once(feed: LifecycleFeed) -> None:
    feed.start()
    await feed.caught_up(10)
    assert feed.states() == {}
    assert feed.table("fraud") is None


async def test_caught_up_times_out_on_a_missing_topic(
    kafka_settings: KafkaSettings, registry_settings: SchemaRegistrySettings
) -> None:
    topics = TopicSettings(lifecycle=unique("it-lc-missing"))
    feed = LifecycleFeed(kafka_settings, topics, registry_settings, name=unique("it-feed"))
    feed.start()
    try:
        with pytest.raises(LifecycleUnavailableError, match="not readable"):
            await feed.caught_up(2)
    finally:
        feed.stop()


async def test_replay_dedupes_skips_poison_reports_gaps_and_notifies(
    feed: LifecycleFeed,
    codec: LifecycleCodec,
    producer: Producer,
    topics: TopicSettings,
    caplog: pytest.LogCaptureFixture,
) -> None:
    fraud = recorded(
        "fraud",
        [
            *registered_and_validated("1", "2"),
            ev.Promoted("1"),
            ev.VersionLoaded("1", "w-a"),
            ev.VersionLoaded("2", "w-a"),
            ev.CanaryStarted("2", [10, 50, 100], 5.0, {"max_error_rate": 0.1}),
            ev.TrafficShifted({"1": 90, "2": 10}, reason="step 0"),
            ev.ShadowStarted("2", 0.5),
        ],
    )
    minilm = recorded("minilm", [*registered_and_validated("a"), ev.Promoted("a")])
    # A stream whose sequence 2 never reached the topic.
    gappy = recorded("gappy", [*registered_and_validated("x"), ev.Promoted("x")])
    del gappy[1]

    def encoded(events: Iterable[ev.RecordedEvent]) -> list[tuple[str, bytes]]:
        return [(e.stream, codec.encode(e)) for e in events]

    good = codec.encode(fraud[0])
    garbled = good[:5] + b"\x99\x99\x99"  # a registered schema id, a body that does not fit it
    publish(producer, topics.lifecycle, encoded(fraud[:5]))
    publish(producer, topics.lifecycle, [("fraud", b"\x07not avro"), ("fraud", garbled)])
    # An outbox crash after publishing, before marking: the relay publishes 3..5 again.
    publish(producer, topics.lifecycle, encoded(fraud[2:]))
    publish(producer, topics.lifecycle, encoded(minilm + gappy + fraud[:2]))
    publish(producer, topics.lifecycle, [("x", pack(1_999_999_999, b"\x02"))])  # unknown id

    caplog.set_level(logging.INFO, logger="tidegate.lifecycle.readmodels.feed")
    feed.start()
    await feed.caught_up(30)
    # caught_up means everything published before start is applied: no polling needed.
    expected = {m: fold(m, evs) for m, evs in [("fraud", fraud), ("minilm", minilm)]}
    expected["gappy"] = fold("gappy", gappy)
    assert feed.states() == expected
    for model, state in expected.items():
        assert feed.table(model) == RoutingTable.from_state(state)
    stats = feed.stats
    assert stats.applied == len(fraud) + len(minilm) + len(gappy)
    assert stats.duplicates == 3 + 2
    assert stats.skipped == 3
    assert stats.gaps == 1
    assert any("gappy" in r.getMessage() and r.levelno == logging.ERROR for r in caplog.records)

    # Live changes after catching up reach sync and async listeners, on this loop.
    loop = asyncio.get_running_loop()
    seen_sync: list[ModelState] = []
    seen_async: list[ModelState] = []
    done = asyncio.Event()

    def on_change(state: ModelState) -> None:
        assert asyncio.get_running_loop() is loop
        seen_sync.append(state)

    async def on_change_async(state: ModelState) -> None:
        await asyncio.sleep(0)
        seen_async.append(state)
        if state.model == "fraud" and state.sequence == len(more):
            done.set()

    feed.add_listener(on_change)
    feed.add_listener(on_change_async)
    more = recorded("fraud", [*[e.payload for e in fraud], ev.Promoted("2"), ev.Retired("1")])
    publish(producer, topics.lifecycle, encoded([more[-2], more[-2], more[-1]]))
    await asyncio.wait_for(done.wait(), 30)
    final = fold("fraud", [*fraud, *more[-2:]])
    assert feed.state("fraud") == final
    assert seen_sync[-1] == final
    assert seen_async[-1] == final
    assert all(s.model == "fraud" for s in seen_sync)
    assert feed.table("fraud") == RoutingTable.from_state(final)
    assert feed.stats.duplicates == 3 + 2 + 1
