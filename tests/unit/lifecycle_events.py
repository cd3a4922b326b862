"""Builders of recorded lifecycle events for tests that need no event store."""

from __future__ import annotations

import uuid
from collections.abc import Iterable
from datetime import UTC, datetime, timedelta

from lifecycle import events as ev

__all__ = ["T0", "at", "recorded", "registered_and_validated"]

T0 = datetime(2026, 1, 1, tzinfo=UTC)


def at(seconds: float) -> datetime:
    return T0 + timedelta(seconds=seconds)


def recorded(
    model: str, payloads: Iterable[ev.Payload], *, start: int = 1
) -> list[ev.RecordedEvent]:
    """One event per payload, sequence from `start`, a second apart."""
    return [
        ev.RecordedEvent(
            event_id=uuid.uuid4(),
            stream=model,
            sequence=seq,
            position=seq,
            occurred_at=at(seq),
            payload=payload,
            actor="test",
        )
        for seq, payload in enumerate(payloads, start=start)
    ]


def registered_and_validated(*versions: str) -> list[ev.Payload]:
    out: list[ev.Payload] = []
    for version in versions:
        out.append(
            ev.ModelRegistered(version, "onnx", f"store://m/{version}", {"model.onnx": "0" * 64})
        )
        out.append(ev.ArtifactValidated(version))
    return out
