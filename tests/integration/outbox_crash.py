"""A publisher that dies on purpose, for tests/integration/test_outbox.py.

Run as `python -m tests.integration.outbox_crash MODE SCHEMA TOPIC MODEL`: it appends one event to
MODEL's stream in SCHEMA and then, with MODE
- `before-publish`: exits before any publishing (the commit happened, the relay never ran);
- `after-publish`: runs the relay, which exits from its `after_publish` hook once Kafka
  acknowledged the event, before the outbox row is marked published.

`os._exit` skips every cleanup (no transaction commit, no producer flush, no pool close), like a
kill. The exit status is `CRASH_EXIT` so the test knows the crash happened where intended.

Events travel as JSON here (`encode_json`/`decode_json`): the relay is agnostic of the encoding,
and these tests are about delivery, not Avro.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import uuid
from datetime import datetime
from typing import Any

from tidegate.core.db import make_pool
from tidegate.core.settings import KafkaSettings, PostgresSettings
from tidegate.lifecycle.domain.events import (
    ModelRegistered,
    NewEvent,
    RecordedEvent,
    payload_from_dict,
    payload_to_dict,
)
from tidegate.lifecycle.eventstore.event_store import EventStore
from tidegate.lifecycle.eventstore.outbox import OutboxRelay
from tidegate.lifecycle.lifecycle_settings import LifecycleSettings

__all__ = ["CRASH_EXIT", "decode_json", "encode_json", "main"]

CRASH_EXIT = 75


def encode_json(event: RecordedEvent) -> bytes:
    return json.dumps(
        {
            "event_id": str(event.event_id),
            "stream": event.stream,
            "sequence": event.sequence,
            "position": event.position,
            "occurred_at": event.occurred_at.isoformat(),
            "type": event.type,
            "payload": payload_to_dict(event.payload),
            "actor": event.actor,
        }
    ).encode()


def decode_json(data: bytes | None) -> RecordedEvent:
    record: dict[str, Any] = json.loads(data or b"null")
    return RecordedEvent(
        event_id=uuid.UUID(record["event_id"]),
        stream=record["stream"],
        sequence=record["sequence"],
        position=record["position"],
        occurred_at=datetime.fromisoformat(record["occurred_at"]),
        payload=payload_from_dict(record["type"], record["payload"]),
        actor=record["actor"],
    )


def _crash(_events: list[RecordedEvent]) -> None:
    os._exit(CRASH_EXIT)


async def _run(mode: str, schema: str, topic: str, model: str) -> None:
    pool = make_pool(PostgresSettings(db_schema=schema), LifecycleSettings(pool_min_size=1))
    await pool.open(wait=True, timeout=30)
    event = ModelRegistered("v9", "onnx", f"file:///models/{model}/v9", {"model.onnx": "ab"})
    await EventStore(pool).append(model, [NewEvent(event, actor="crash")], expected_version=None)
    if mode == "before-publish":
        _crash([])
    relay = OutboxRelay(pool, KafkaSettings(), topic, encode_json, after_publish=_crash)
    await relay.open()
    await relay.flush()
    raise SystemExit("the relay published without calling its after_publish hook")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("mode", choices=["before-publish", "after-publish"])
    parser.add_argument("schema")
    parser.add_argument("topic")
    parser.add_argument("model")
    args = parser.parse_args()
    asyncio.run(_run(args.mode, args.schema, args.topic, args.model))


if __name__ == "__main__":
    main()
