"""Operator commands racing other writers: worker reports are decided around, the rest conflict."""

from __future__ import annotations

from collections.abc import Sequence
from datetime import datetime
from typing import Any

import pytest

from tests.unit.lifecycle_events import recorded, registered_and_validated
from tidegate.core.errors import ConcurrencyConflictError
from tidegate.lifecycle.domain import events as ev
from tidegate.lifecycle.domain.state import ModelState, fold
from tidegate.lifecycle.lifecycle_settings import LifecycleSettings
from tidegate.lifecycle.operations.commands import LifecycleCommands


class RacingStore:
    """An in-memory event store in which `sneak` is appended by someone else just before the
    next append is checked, as a worker's report or another operator's command would be."""

    def __init__(self, *payloads: ev.Payload) -> None:
        self.events = recorded("fraud", payloads)
        self.sneak: ev.Payload | None = None

    async def load(self, stream: str, *, until: datetime | None = None) -> ModelState:
        return fold(stream, self.events)

    async def read(self, stream: str, *, until: datetime | None = None) -> list[ev.RecordedEvent]:
        return list(self.events)

    async def append(
        self, stream: str, events: Sequence[ev.NewEvent], *, expected_version: int | None
    ) -> list[ev.RecordedEvent]:
        if self.sneak is not None:
            self.events += recorded(stream, [self.sneak], start=len(self.events) + 1)
            self.sneak = None
        current = len(self.events)
        if expected_version is not None and expected_version != current:
            raise ConcurrencyConflictError(stream, expected_version, current)
        new = recorded(stream, [e.payload for e in events], start=current + 1)
        self.events += new
        return new


def _commands(store: RacingStore) -> LifecycleCommands:
    none: Any = None
    return LifecycleCommands(store, none, none, LifecycleSettings(), events=store)  # type: ignore[arg-type]


BASE = (*registered_and_validated("1", "2"), ev.Promoted("1"))


async def test_a_worker_report_in_between_does_not_fail_the_command() -> None:
    store = RacingStore(*BASE)
    store.sneak = ev.VersionLoaded("2", "w1")
    result = await _commands(store).shadow("fraud", "2", actor="op", sample_rate=0.5)
    assert [e.type for e in store.events[-2:]] == ["VersionLoaded", "ShadowStarted"]
    assert result.state.shadows() == {"2": 0.5}


async def test_another_operators_change_in_between_is_a_conflict() -> None:
    store = RacingStore(*BASE)
    store.sneak = ev.ShadowStarted("2", 1.0)
    with pytest.raises(ConcurrencyConflictError):
        await _commands(store).shadow("fraud", "2", actor="op", sample_rate=0.5)
    assert store.events[-1].type == "ShadowStarted"
    assert len(store.events) == len(BASE) + 1


async def test_a_named_sequence_is_honoured_exactly() -> None:
    store = RacingStore(*BASE)
    store.sneak = ev.VersionLoaded("2", "w1")
    with pytest.raises(ConcurrencyConflictError):
        await _commands(store).shadow(
            "fraud", "2", actor="op", sample_rate=0.5, expected_sequence=len(BASE)
        )
