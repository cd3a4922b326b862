"""Faust agent vs confluent-kafka batch consumer vs the tidegate worker, on the real broker.

Every contender reads the same pre-filled topic of Avro `InferenceRequest`s (fraud, 64 features)
and writes one message per request to its own fresh output topic, in its own subprocess with its
own consumer group:

* `faust`: a faust-streaming agent (`async for event in stream.events()` -> `topic.send`), acks=all;
* `confluent`: a bare confluent-kafka relay, `consume(num_messages=500)` -> `produce`, idempotent
  acks=all producer from `tidegate.core.kafka` (the ceiling for a Python consumer);
* `avro`: the confluent relay plus the codec work every worker must do: decode each request and
  encode a result-sized record (the floor of any Python worker on this wire format);
* `tidegate`: the real worker hot path serving the fraud model (decode, batch, infer, encode,
  deliver, commit after delivery), when a fraud model is in the store.

The rate is read from the output records' own timestamps over the middle 90% of the run, so process
start-up and group joins do not count. Contenders alternate over rounds and the best round counts;
only the ratios are meaningful. Run with `python -m tests.bench.faust_vs_confluent`.
"""

from __future__ import annotations

import argparse
import os
import struct
import subprocess
import sys
import time
from datetime import UTC, datetime
from typing import Any

__all__ = ["main", "run"]

CONTENDERS = ("confluent", "faust", "avro", "tidegate")


def _request(i: int) -> dict[str, Any]:
    features = [((i * 31 + j) % 97) / 97.0 for j in range(64)]
    return {
        "request_id": f"bench-{i}",
        "model": "fraud",
        "tenant": "bench",
        "routing_key": f"card-{i % 64}",
        "inputs": [
            {
                "name": "features",
                "datatype": "FP32",
                "shape": [1, 64],
                "data": struct.pack("<64f", *features),
                "parameters": {},
            }
        ],
        "created_at": datetime.now(UTC),
    }


def _faust_relay(source: str, sink: str, group: str) -> None:
    import faust

    from tidegate.core.settings import KafkaSettings

    servers = KafkaSettings().bootstrap_servers.split(",")
    app = faust.App(
        group,
        broker=[f"kafka://{s}" for s in servers],
        web_enabled=False,
        producer_acks=-1,
        topic_disable_leader=True,
        consumer_auto_offset_reset="earliest",
    )
    src = app.topic(source, key_type=bytes, value_type=bytes, value_serializer="raw")
    dst = app.topic(sink, key_type=bytes, value_type=bytes, value_serializer="raw")

    @app.agent(src)
    async def relay(stream: Any) -> None:
        async for event in stream.events():
            await dst.send(key=event.key, value=event.value)

    from faust.worker import Worker

    Worker(app, loglevel="WARNING", quiet=True).execute_from_commandline()


def _confluent_relay(source: str, sink: str, group: str) -> None:
    from tidegate.core.kafka import make_consumer, make_producer
    from tidegate.core.settings import KafkaSettings

    kafka = KafkaSettings()
    consumer = make_consumer(kafka, group)
    producer = make_producer(kafka)
    consumer.subscribe([source])
    while True:
        messages = consumer.consume(num_messages=500, timeout=0.1)
        for msg in messages:
            if msg.error():
                continue
            while True:
                try:
                    producer.produce(sink, value=msg.value(), key=msg.key())
                    break
                except BufferError:
                    producer.poll(0.01)
        producer.poll(0)
        if messages:
            consumer.commit(asynchronous=True)


def _avro_relay(source: str, sink: str, group: str) -> None:
    import numpy as np
    from confluent_kafka.schema_registry import SchemaRegistryClient

    from tidegate.core.kafka import make_consumer, make_producer
    from tidegate.core.settings import KafkaSettings, SchemaRegistrySettings, TopicSettings
    from tidegate.schemas.catalog import INFERENCE_REQUEST, INFERENCE_RESULT, load_schema
    from tidegate.schemas.codec import AvroDecoder, AvroEncoder
    from tidegate.schemas.tensors import from_numpy

    kafka = KafkaSettings()
    registry = SchemaRegistryClient(SchemaRegistrySettings().client_config())
    decode = AvroDecoder(registry, load_schema(INFERENCE_REQUEST))
    encoder = AvroEncoder(registry, load_schema(INFERENCE_RESULT))
    schema_id = encoder.schema_id(f"{TopicSettings().results}-value")
    output = [from_numpy("probabilities", np.zeros((1, 2), dtype=np.float32))]
    consumer = make_consumer(kafka, group)
    producer = make_producer(kafka)
    consumer.subscribe([source])
    while True:
        messages = consumer.consume(num_messages=500, timeout=0.1)
        for msg in messages:
            if msg.error():
                continue
            request = decode(msg.value())
            result = {
                "request_id": request["request_id"],
                "model": request["model"],
                "model_version": "1",
                "status": "OK",
                "outputs": output,
                "timings": {"queue_ms": 0.0, "batch_ms": 0.0, "compute_ms": 0.0, "total_ms": 0.0},
                "batch_size": 1,
                "worker_id": "bench",
                "source": None,
                "tenant": request["tenant"],
                "routing_key": request["routing_key"],
                "completed_at": int(time.time() * 1000),
            }
            while True:
                try:
                    producer.produce(sink, value=encoder.encode(result, schema_id), key=msg.key())
                    break
                except BufferError:
                    producer.poll(0.01)
        producer.poll(0)
        if messages:
            consumer.commit(asynchronous=True)


def _tidegate_worker(source: str, sink: str, group: str) -> None:
    os.environ.update(
        {
            "TIDEGATE_TOPICS_REQUESTS": source,
            "TIDEGATE_TOPICS_RESULTS": sink,
            "TIDEGATE_WORKER_GROUP_ID": group,
            "TIDEGATE_WORKER_METRICS_PORT": "0",
        }
    )
    from tidegate.cli.serve_worker import worker

    worker(None, None, None, None, None)


def _output_rate(topic: str, count: int, timeout: float, proc: subprocess.Popen[bytes]) -> float:
    """Wait for `count` records in `topic`; records/s over the middle 90% of their timestamps."""
    from confluent_kafka import TopicPartition

    from tests.support import unique
    from tidegate.core.kafka import make_consumer
    from tidegate.core.settings import KafkaSettings

    consumer = make_consumer(KafkaSettings(), unique("bench-reader"))
    try:
        parts = list(consumer.list_topics(topic, timeout=10).topics[topic].partitions)
        tps = [TopicPartition(topic, p) for p in parts]
        deadline = time.monotonic() + timeout
        while True:
            total = sum(consumer.get_watermark_offsets(tp, timeout=10)[1] for tp in tps)
            if total >= count:
                break
            if proc.poll() is not None:
                raise RuntimeError(f"the contender writing {topic} exited with {proc.returncode}")
            if time.monotonic() > deadline:
                raise TimeoutError(f"{topic}: {total} of {count} records after {timeout}s")
            time.sleep(0.2)
        consumer.assign([TopicPartition(topic, p, 0) for p in parts])
        stamps: list[int] = []
        while len(stamps) < count:
            for msg in consumer.consume(num_messages=1000, timeout=1.0):
                if not msg.error():
                    stamps.append(msg.timestamp()[1])
    finally:
        consumer.close()
    stamps.sort()
    lo, hi = stamps[len(stamps) // 20], stamps[len(stamps) * 19 // 20]
    return (len(stamps) * 0.9) / max((hi - lo) / 1000.0, 1e-3)


def _has_fraud_model() -> bool:
    from tidegate.models.model_settings import ModelSettings

    return (ModelSettings().store_dir / "manifests" / "fraud").exists()


def run(
    count: int = 20_000,
    partitions: int = 8,
    rounds: int = 2,
    only: tuple[str, ...] = CONTENDERS,
) -> dict[str, float]:
    from confluent_kafka.admin import NewTopic  # type: ignore[attr-defined]
    from confluent_kafka.schema_registry import SchemaRegistryClient
    from confluent_kafka.serialization import MessageField, SerializationContext

    from tests.support import unique
    from tidegate.core.kafka import make_admin, make_producer
    from tidegate.core.settings import KafkaSettings, SchemaRegistrySettings, TopicSettings
    from tidegate.schemas.catalog import INFERENCE_REQUEST, load_schema, topic_subjects
    from tidegate.schemas.codec import AvroEncoder
    from tidegate.schemas.registration import RegistryHttp, register_all

    kafka, registry_settings = KafkaSettings(), SchemaRegistrySettings()
    admin = make_admin(kafka)
    source = unique("bench-relay-in")
    contenders = [c for c in only if c != "tidegate" or _has_fraud_model()]
    sinks = {(c, r): unique(f"bench-{c}-out") for c in contenders for r in range(rounds)}
    topics = [source, *sinks.values()]
    for future in admin.create_topics(
        [NewTopic(t, num_partitions=partitions, replication_factor=1) for t in topics]
    ).values():
        future.result(timeout=30)
    try:
        with RegistryHttp(registry_settings) as http:
            subjects = topic_subjects(TopicSettings(requests=source))
            for (name, _), sink in sinks.items():
                if name == "tidegate":
                    subjects.update(topic_subjects(TopicSettings(requests=source, results=sink)))
            list(register_all(http, subjects))
        encoder = AvroEncoder(
            SchemaRegistryClient(registry_settings.client_config()), load_schema(INFERENCE_REQUEST)
        )
        ctx = SerializationContext(source, MessageField.VALUE)
        # Uncompressed: aiokafka reads lz4 (our producers' default) only with the `lz4` package.
        producer = make_producer(kafka, {"compression.type": "none"})
        for i in range(count):
            record = _request(i)
            while True:
                try:
                    producer.produce(source, key=record["routing_key"], value=encoder(record, ctx))
                    break
                except BufferError:
                    producer.poll(0.05)
            producer.poll(0)
        producer.flush(60)

        best = dict.fromkeys(contenders, 0.0)
        for r in range(rounds):
            for name in contenders:
                sink = sinks[(name, r)]
                module = "tests.bench.faust_vs_confluent"
                proc = subprocess.Popen(
                    [sys.executable, "-m", module, "contender", name, source, sink, unique(name)],
                    stdout=subprocess.DEVNULL,
                )
                try:
                    best[name] = max(best[name], _output_rate(sink, count, 600, proc))
                finally:
                    proc.terminate()
                    proc.wait(timeout=60)
    finally:
        for future in admin.delete_topics(topics).values():
            future.result(timeout=30)

    print(f"relay of {count:,} InferenceRequests over {partitions} partitions, best of {rounds}")
    print(f"{'contender':<12}{'records/s':>12}{'vs confluent':>14}")
    for name, rate in best.items():
        print(f"{name:<12}{rate:>12,.0f}{rate / best['confluent']:>13.2f}x")
    return best


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m tests.bench.faust_vs_confluent")
    parser.add_argument("--count", type=int, default=20_000)
    parser.add_argument("--partitions", type=int, default=8)
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--only", default=",".join(CONTENDERS), help="Comma-separated contenders.")
    args, rest = parser.parse_known_args(argv)
    if rest[:1] == ["contender"]:
        name, source, sink, group = rest[1:5]
        contender = {
            "faust": _faust_relay,
            "confluent": _confluent_relay,
            "avro": _avro_relay,
            "tidegate": _tidegate_worker,
        }[name]
        contender(source, sink, group)
        return 0
    run(args.count, args.partitions, args.rounds, tuple(args.only.split(",")))
    return 0


if __name__ == "__main__":
    sys.exit(main())
