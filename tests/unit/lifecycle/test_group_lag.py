"""The controller's `GroupLag` stops even when its offsets reader's close hangs, as librdkafka's
can across a broker restart: a stop that waited would hold the controller's shutdown for good."""

from __future__ import annotations

import threading
import time

import pytest

from tidegate.core.settings import KafkaSettings
from tidegate.lifecycle.control import group_lag
from tidegate.lifecycle.control.group_lag import GroupLag


class HangingReader:
    def __init__(self) -> None:
        self.released = threading.Event()

    def close(self) -> None:
        self.released.wait(5.0)


async def test_stop_returns_while_the_readers_close_hangs(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(group_lag, "_CLOSE_S", 0.2)
    lag = GroupLag(KafkaSettings(), "workers", "inference-requests", every_s=60.0)
    reader = HangingReader()
    lag._reader = reader  # type: ignore[assignment]
    started = time.monotonic()
    try:
        await lag.stop()
        assert time.monotonic() - started < 2.0
        assert lag._reader is None
    finally:
        reader.released.set()
