"""`tidegate schemas register` and the codec against the real registry and Kafka."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from confluent_kafka.schema_registry import SchemaRegistryClient
from confluent_kafka.serialization import MessageField, SerializationContext

from tests.support import unique, wait_for
from tests.unit.schemas.codec_samples import SAMPLES
from tidegate.core.errors import SchemaMismatchError, UnknownSchemaError, WireFormatError
from tidegate.core.kafka import make_consumer, make_producer
from tidegate.core.settings import KafkaSettings, SchemaRegistrySettings, TopicSettings
from tidegate.schemas.catalog import (
    INFERENCE_REQUEST,
    SCHEMA_DIR,
    SHADOW_COMPARISON,
    event_subjects,
    load_schema,
    topic_subjects,
)
from tidegate.schemas.codec import AvroDecoder, AvroEncoder
from tidegate.schemas.registration import RegistryHttp
from tidegate.schemas.wire import pack, unpack

TIDEGATE = [sys.executable, "-m", "tidegate.cli"]


def _env(prefix: str) -> dict[str, str]:
    env = dict(os.environ)
    keys = ("REQUESTS", "REQUESTS_BATCH", "RESULTS", "REPLIES", "FAILED", "POISON", "LIFECYCLE")
    for key in (*keys, "SHADOW", "BREAKERS"):
        env[f"TIDEGATE_TOPICS_{key}"] = f"{prefix}-{key.lower()}"
    env["TIDEGATE_TOPICS_AUDIT"] = f"{prefix}-audit"
    env["TIDEGATE_TOPICS_RETRY_PREFIX"] = f"{prefix}-retry"
    env["COLUMNS"] = "200"  # keep rich tables on one line per row
    return env


def _register(env: dict[str, str], *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [*TIDEGATE, "schemas", "register", *args],
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )


def _rows(stdout: str) -> dict[str, list[str]]:
    """The printed table: subject to its cells (subject, schema, id, version, action, level)."""
    rows: dict[str, list[str]] = {}
    for line in stdout.splitlines():
        cells = [c.strip() for c in line.split("│")[1:-1]]
        if len(cells) == 6 and cells[0] != "subject":
            rows[cells[0]] = cells
    return rows


def _schema_dir(tmp_path: Path, mutate: Any) -> Path:
    target = tmp_path / "avro"
    shutil.copytree(SCHEMA_DIR, target)
    path = target / f"{INFERENCE_REQUEST}.avsc"
    doc = json.loads(path.read_text())
    mutate(doc)
    path.write_text(json.dumps(doc))
    return target


def test_register_then_refuse_incompatible_then_accept_compatible(tmp_path: Path) -> None:
    prefix = unique("it-reg")
    env = _env(prefix)
    first = _register(env)
    assert first.returncode == 0, first.stdout + first.stderr
    rows = _rows(first.stdout)
    ours = {s: r for s, r in rows.items() if s.startswith(prefix)}
    # Every topic subject of the layout, each under the test's own topic names.
    layout = TopicSettings.model_validate(
        {k.removeprefix("TIDEGATE_TOPICS_").lower(): v for k, v in env.items()
         if k.startswith("TIDEGATE_TOPICS_")}
    )  # fmt: skip
    assert set(ours) == set(topic_subjects(layout))
    assert all(r[4] == "registered" and r[5] == "global" for r in ours.values())
    assert rows[f"{prefix}-shadow-value"][1] == SHADOW_COMPARISON
    # Each lifecycle event type under its own name, pinned to BACKWARD. These subjects are
    # shared by every run, so an earlier run may have registered them already.
    events = {s: r for s, r in rows.items() if not s.startswith(prefix)}
    assert set(events) == set(event_subjects())
    assert all(r[4] in ("registered", "unchanged") and r[5] == "BACKWARD" for r in events.values())
    with RegistryHttp(SchemaRegistrySettings()) as http:
        assert all(http.compatibility(s) == "BACKWARD" for s in events)

    again = _register(env)
    assert again.returncode == 0, again.stdout + again.stderr
    assert [r[4] for r in _rows(again.stdout).values()] == ["unchanged"] * len(rows)

    def required_field(doc: dict[str, Any]) -> None:
        doc["fields"].append({"name": "priority_class", "type": "string"})

    refused = _register(env, "--schema-dir", str(_schema_dir(tmp_path / "bad", required_field)))
    assert refused.returncode == 1
    assert "refused" in refused.stdout
    assert "priority_class" in refused.stdout  # the field at fault is named
    assert "Traceback" not in refused.stdout + refused.stderr

    def optional_field(doc: dict[str, Any]) -> None:
        doc["fields"].append({"name": "priority_class", "type": "string", "default": "normal"})

    accepted = _register(env, "--schema-dir", str(_schema_dir(tmp_path / "ok", optional_field)))
    assert accepted.returncode == 0, accepted.stdout + accepted.stderr
    row = next(line for line in accepted.stdout.splitlines() if "-requests-value" in line)
    assert "registered" in row
    assert row.split("│")[4].strip() == "2"  # the compatible change is version 2


def test_codec_through_kafka_and_poison_errors(new_topic: Callable[..., str]) -> None:
    topic = new_topic("it-codec")
    registry = SchemaRegistryClient(SchemaRegistrySettings().client_config())
    schema = load_schema(INFERENCE_REQUEST)
    ctx = SerializationContext(topic, MessageField.VALUE)
    good = AvroEncoder(registry, schema, auto_register=True)(SAMPLES[INFERENCE_REQUEST], ctx)

    producer = make_producer(KafkaSettings())
    garbled = pack(unpack(good)[0], b"\x99\x99\x99")
    for value in (b"\x07not-avro", pack(2_000_000_000, b"\x02"), garbled, good):
        producer.produce(topic, value=value)
    assert producer.flush(15) == 0

    consumer = make_consumer(KafkaSettings(), unique("it-codec-group"))
    consumer.subscribe([topic])
    seen: list[bytes] = []

    def read_all() -> bool:
        msg = consumer.poll(0.5)
        if msg is not None and not msg.error() and msg.value() is not None:
            seen.append(msg.value() or b"")
        return len(seen) == 4

    wait_for(read_all, timeout=30, what="four messages")
    consumer.close()

    decoder = AvroDecoder(registry, schema)
    with pytest.raises(WireFormatError):
        decoder(seen[0], ctx)
    with pytest.raises(UnknownSchemaError):
        decoder(seen[1], ctx)
    with pytest.raises(SchemaMismatchError):
        decoder(seen[2], ctx)
    assert decoder(seen[3], ctx) == SAMPLES[INFERENCE_REQUEST]
