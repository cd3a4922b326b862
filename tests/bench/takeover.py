"""How soon a SIGKILLed worker's partitions are served again (`python -m tests.bench takeover`):
two `tidegate worker` processes under steady load (100 requests/s over 4 partitions), the one
started last is killed, and the time until results of each of its partitions come from the
survivor is read from the results' own Kafka timestamps. `KILLS` kills per side, a new victim
joining the survivor before each; every request must get a result.

Sides: the settings before decision 015 (classic protocol, session 10 s, heartbeat 1 s), the classic
protocol with the new defaults (session 2 s, heartbeat 0.5 s), and KIP-848 (`group.protocol=
consumer`) with the same session and heartbeat set as the group's config.

Bar (moved from tests/integration/agents/test_takeover.py): with the new settings, every takeover
within 3 s.
"""

from __future__ import annotations

import asyncio
import statistics
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from confluent_kafka.admin import NewTopic  # type: ignore[attr-defined]
from confluent_kafka.schema_registry import SchemaRegistryClient

from tests.bench.bench_pg import scratch_schema
from tests.integration.agents.takeover_support import (
    BAR_S,
    CLASSIC_OLD,
    FAST,
    KIP848,
    kill_and_measure,
)
from tests.integration.workers import Stack, build_tiny_model, registered
from tests.support import unique
from tidegate.core.kafka import make_admin
from tidegate.core.settings import (
    KafkaSettings,
    SchemaRegistrySettings,
    TopicSettings,
)
from tidegate.lifecycle.domain import events as ev
from tidegate.models.model_settings import ModelSettings
from tidegate.schemas.catalog import (
    DEAD_LETTER_ENVELOPE,
    INFERENCE_REQUEST,
    INFERENCE_RESULT,
    load_schema,
    topic_subjects,
)
from tidegate.schemas.codec import AvroDecoder, AvroEncoder
from tidegate.schemas.registration import RegistryHttp, register_all

__all__ = ["run"]

KILLS = 3
SIDES = {
    "classic, session 10 s (before)": CLASSIC_OLD,
    "classic, session 2 s": FAST,
    "consumer (KIP-848), session 2 s": KIP848,
}


@contextmanager
def bench_stack(models: ModelSettings) -> Iterator[Stack]:
    """Topics, subjects and a PostgreSQL schema of the run's own, as the integration tests'
    `stack` fixture makes them: tiny 1 registered, validated and promoted."""
    kafka = KafkaSettings()
    admin = make_admin(kafka)
    topics = TopicSettings(
        requests=unique("tk-requests"),
        results=unique("tk-results"),
        replies=unique("tk-replies"),
        failed=unique("tk-failed"),
        poison=unique("tk-poison"),
        lifecycle=unique("tk-lifecycle"),
        shadow=unique("tk-shadow"),
        retry_prefix=unique("tk-retry"),
    )
    names = [
        *topics.retry_topics(),
        topics.requests,
        topics.results,
        topics.replies,
        topics.failed,
        topics.poison,
        topics.lifecycle,
        topics.shadow,
    ]
    for future in admin.create_topics(
        [NewTopic(n, num_partitions=4, replication_factor=1) for n in names]
    ).values():
        future.result(timeout=30)
    registry = SchemaRegistrySettings()
    with RegistryHttp(registry) as http:
        list(register_all(http, topic_subjects(topics)))
    client = SchemaRegistryClient(registry.client_config())
    try:
        with scratch_schema("tk") as pg:
            stack = Stack(
                kafka,
                topics,
                registry,
                pg,
                unique("tk-group"),
                AvroEncoder(client, load_schema(INFERENCE_REQUEST)),
                AvroDecoder(client, load_schema(INFERENCE_RESULT)),
                AvroDecoder(client, load_schema(DEAD_LETTER_ENVELOPE)),
            )
            asyncio.run(stack.append(*registered(models, "1"), ev.Promoted("1")))
            yield stack
    finally:
        for future in admin.delete_topics(names).values():
            future.result(timeout=30)


def run() -> None:
    with tempfile.TemporaryDirectory(prefix="takeover-") as tmp:
        models = build_tiny_model(Path(tmp))
        found: dict[str, list[float]] = {}
        for name, env in SIDES.items():
            print(f"takeover: {name}, {KILLS} kills")
            with bench_stack(models) as stack:
                result = kill_and_measure(stack, models, env, kills=KILLS)
            found[name] = result.seconds
            print(f"  {result.requests} requests, every one answered, {result.duplicates} redone")
    print("\ntakeover: SIGKILL of one of 2 workers until its partitions are served again")
    for name, seconds in found.items():
        every = ", ".join(f"{s:.2f}" for s in seconds)
        bar = (
            ""
            if SIDES[name] is CLASSIC_OLD
            else f"  bar <= {BAR_S:.0f} s " + ("met" if max(seconds) <= BAR_S else "missed")
        )
        print(
            f"  {name:<34} p50 {statistics.median(seconds):5.2f} s  "
            f"max {max(seconds):5.2f} s  ({every}){bar}"
        )
