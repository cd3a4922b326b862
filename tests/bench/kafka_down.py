"""How fast the gateway refuses calls while Kafka is down (`python -m tests.bench kafka_down`):
a gateway replica in this process publishes to a broker of the run's own (tests/integration/
own_broker.py), which is SIGKILLed; each of 200 calls is then answered 503 PUBLISH_FAILED.

Bar (moved from tests/integration/gateway/test_edge_faults.py, which keeps the behaviour: every
refusal comes before the publish timeout): the 503s' p99 under 50 ms. The best of `ROUNDS`
rounds counts, each with a broker and a gateway of its own.
"""

from __future__ import annotations

import numpy as np
from confluent_kafka.admin import NewTopic  # type: ignore[attr-defined]

from tests.bench.bench_pg import scratch_schema
from tests.integration.gateway.edge_support import (
    PUBLISH_TIMEOUT_S,
    calls_while_kafka_is_down,
    config_of,
    publishing_to,
)
from tests.integration.gateway.gateway_fixtures import (
    GatewayServer,
    append_lifecycle,
    gateway_topics,
)
from tests.integration.own_broker import own_broker
from tests.support import unique
from tidegate.core.kafka import make_admin
from tidegate.core.settings import KafkaSettings, SchemaRegistrySettings

__all__ = ["run"]

ROUNDS = 3
BAR_MS = 50.0


def _round() -> tuple[float, list[float]]:
    kafka, registry = KafkaSettings(), SchemaRegistrySettings()
    admin = make_admin(kafka)
    created: list[str] = []

    def new_topic(prefix: str, partitions: int = 1) -> str:
        name = unique(prefix)
        new = NewTopic(name, num_partitions=partitions, replication_factor=1)
        admin.create_topics([new])[name].result(timeout=30)
        created.append(name)
        return name

    try:
        topics = gateway_topics(new_topic, registry)
        with scratch_schema("kd") as pg, own_broker() as broker:
            append_lifecycle(kafka, topics, registry, pg)
            own = make_admin(broker.settings)
            new = NewTopic(topics.requests, num_partitions=1, replication_factor=1)
            own.create_topics([new])[topics.requests].result(timeout=30)
            config = config_of(kafka, topics, registry, publish_timeout_s=PUBLISH_TIMEOUT_S)
            server = GatewayServer(config, publishing_to(broker.settings)).start(90)
            try:
                return calls_while_kafka_is_down(server, broker)
            finally:
                server.stop()
    finally:
        for future in admin.delete_topics(created).values():
            future.result(timeout=30)


def run() -> None:
    print("\nkafka_down: 503s of a gateway whose broker was SIGKILLed")
    p99s = []
    for k in range(ROUNDS):
        noticed_s, latencies = _round()
        ms = np.array(latencies) * 1000
        p99s.append(float(np.percentile(ms, 99)))
        print(
            f"  round {k + 1}: noticed in {noticed_s * 1000:.0f} ms; 503s p50 "
            f"{np.percentile(ms, 50):.1f} ms, p99 {p99s[-1]:.1f} ms, max {ms.max():.1f} ms"
        )
    best = min(p99s)
    verdict = "met" if best < BAR_MS else "missed"
    print(f"  p99 of the 503s {best:.1f} ms  bar < {BAR_MS:.0f}  {verdict}")
