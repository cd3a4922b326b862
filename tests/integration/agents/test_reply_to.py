"""A request's `reply_to` against the real Kafka: a worker replies only to a partition of the
configured replies topic, with the submission's nonce in the reply's header. Anything else a plain
producer writes there (another topic, a partition that does not exist) is poison with its reason,
answered INVALID on the results topic only, and never kills the worker."""

from __future__ import annotations

from collections.abc import Callable

from confluent_kafka import Consumer, TopicPartition

from tests.integration.workers import Reader, Stack, in_thread, publish, request, running
from tests.support import unique, wait_for
from tidegate.core.kafka import make_consumer
from tidegate.models.model_settings import ModelSettings
from tidegate.schemas.requests import SUBMISSION_HEADER


def records_of(stack: Stack, topic: str, partitions: int) -> Consumer:
    consumer = make_consumer(stack.kafka, unique("w-reply-reader"))
    consumer.assign([TopicPartition(topic, p, 0) for p in range(partitions)])
    return consumer


async def test_a_forged_reply_to_is_poison_and_writes_nowhere(
    stack: Stack, models: ModelSettings, new_topic: Callable[..., str]
) -> None:
    victim = new_topic("w-victim", 4)  # stands for `_schemas`, or any topic the worker may write
    replies = stack.topics.replies
    publish(
        stack,
        [
            request("to-victim", "k", reply_to={"topic": victim, "partition": 0}),
            request("no-such-partition", "k", reply_to={"topic": replies, "partition": 99}),
            request("mine", "k", reply_to={"topic": replies, "partition": 1, "nonce": "n-mine"}),
            request("after", "k"),
        ],
    )
    poison, results = Reader(stack, stack.topics.poison), Reader(stack, stack.topics.results)
    reply_reader = records_of(stack, replies, 4)
    victim_reader = records_of(stack, victim, 4)
    try:
        async with running(stack, models) as worker:
            got = {r["request_id"]: r for r in await in_thread(results.until, 4)}
            letters = await in_thread(poison.until, 2)
            # A forged reply_to must not kill the worker: it still runs, having failed nothing.
            assert not worker.worker.stopped
        assert {rid: r["status"] for rid, r in got.items()} == {
            "to-victim": "INVALID",
            "no-such-partition": "INVALID",
            "mine": "OK",
            "after": "OK",
        }
        assert got["to-victim"]["error"]["field"] == "reply_to"
        reasons = {e["request_id"]: e["error"]["message"] for e in letters}
        assert "replies go only to" in reasons["to-victim"]
        assert "not a partition 99" in reasons["no-such-partition"]

        # The one honoured reply: on its partition, carrying its submission's nonce.
        def replied() -> list[tuple[int | None, str | bytes | None]] | None:
            found = [
                (m.partition(), dict(m.headers() or []).get(SUBMISSION_HEADER))
                for m in reply_reader.consume(num_messages=100, timeout=0.5)
                if m.error() is None
            ]
            return found or None

        assert wait_for(replied, timeout=20, what="the reply") == [(1, b"n-mine")]
        assert victim_reader.consume(num_messages=10, timeout=2) == [], "nothing in the victim"
    finally:
        for consumer in (reply_reader, victim_reader):
            consumer.close()
        poison.close()
        results.close()
