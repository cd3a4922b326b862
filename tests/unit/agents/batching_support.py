"""The deliver side of a batcher, recorded: a future per submitted item."""

from __future__ import annotations

import asyncio
from collections.abc import Hashable, Sequence

__all__ = ["Outbox"]


class Outbox:
    """The `deliver` side: a future per submitted item, settled from the delivered batches."""

    def __init__(self) -> None:
        self.futures: dict[Hashable, asyncio.Future[object]] = {}
        self.deliveries: list[list[Hashable]] = []

    def expect(self, item: Hashable) -> asyncio.Future[object]:
        future = self.futures[item] = asyncio.get_running_loop().create_future()
        return future

    def __call__(
        self, items: Sequence[Hashable], outcome: Sequence[object] | BaseException
    ) -> None:
        self.deliveries.append(list(items))
        for index, item in enumerate(items):
            future = self.futures[item]
            if isinstance(outcome, BaseException):
                future.set_exception(outcome)
            else:
                future.set_result(outcome[index])
