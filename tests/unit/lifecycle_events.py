"""Builders of recorded lifecycle events for tests that need no event store."""

from __future__ import annotations

import uuid
from collections.abc import Iterable, Sequence
from datetime import UTC, datetime, timedelta

from tidegate.lifecycle.domain import events as ev

__all__ = ["T0", "at", "recorded", "registered_and_validated"]

T0 = datetime(2026, 1, 1, tzinfo=UTC)


def at(seconds: float) -> datetime:
    return T0 + timedelta(seconds=seconds)


def recorded(
    model: str,
    payloads: Iterable[ev.Payload],
    *,
    start: int = 1,
    times: Sequence[float] | None = None,
) -> list[ev.RecordedEvent]:
    """One event per payload, sequence from `start`; at `times` (seconds after T0) when given,
    else a second apart."""
    items = list(payloads)
    seconds = list(times) if times is not None else range(start, start + len(items))
    return [
        ev.RecordedEvent(
            event_id=uuid.uuid4(),
            stream=model,
            sequence=seq,
            position=seq,
            occurred_at=at(t),
            payload=payload,
            actor="test",
        )
        for seq, t, payload in zip(range(start, start + len(items)), seconds, items, strict=True)
    ]


def registered_and_validated(
    *versions: str,
    loaded_on: str | None = None,
    signature_json: str = "{}",
    runtime: str = "onnx",
) -> list[ev.Payload]:
    """Register and validate each version; with `loaded_on`, also report it warm on that worker."""
    out: list[ev.Payload] = []
    for version in versions:
        out.append(
            ev.ModelRegistered(
                version,
                runtime,
                f"store://m/{version}",
                {"model.onnx": "0" * 64},
                signature_json=signature_json,
            )
        )
        out.append(ev.ArtifactValidated(version))
        if loaded_on:
            out.append(ev.VersionLoaded(version, loaded_on))
    return out
