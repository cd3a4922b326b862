"""A stand-in for `tidegate.cli.worker_pool.Supervisor` in tests of the commands that run one:
it records the slots and the stop bound it was given, and its `run` returns 0 at once."""

from __future__ import annotations

from collections.abc import Sequence

from tidegate.cli.worker_pool import Slot

__all__ = ["RecordedSupervisor"]


class RecordedSupervisor:
    def __init__(self) -> None:
        self.slots: list[Slot] = []
        self.stop_timeout_s = 0.0

    def __call__(self, slots: Sequence[Slot], *, stop_timeout_s: float) -> RecordedSupervisor:
        self.slots, self.stop_timeout_s = list(slots), stop_timeout_s
        return self

    def run(self) -> int:
        return 0
