"""Which offset of a partition may be committed: the end of the prefix whose outputs are delivered.

Each consumed offset holds one "processing" token until its outputs are produced, plus one token
per produced message (result, reply, dead letter) until Kafka acknowledges it. An offset is done
when it holds none. The committable position is one past the last offset of the longest done
prefix, so nothing after an undelivered result is ever committed (at-least-once).
"""

from __future__ import annotations

from collections import deque

__all__ = ["OffsetTracker"]


class OffsetTracker:
    def __init__(self) -> None:
        self._order: deque[int] = deque()
        self._tokens: dict[int, int] = {}
        self._done_until: int | None = None
        self._committed: int | None = None
        # Set when the partition is given up: sinks then drop what they still hold for it.
        self.closed = False

    @property
    def in_flight(self) -> int:
        """Offsets consumed and not yet part of the done prefix."""
        return len(self._order)

    def consumed(self, offset: int) -> None:
        self._order.append(offset)
        self._tokens[offset] = 1

    def expect(self, offset: int, count: int = 1) -> None:
        """`count` more messages produced for `offset`, each awaiting its acknowledgement."""
        self._tokens[offset] += count

    def done(self, offset: int) -> None:
        """One token of `offset` released: its processing finished, or one message was acked."""
        left = self._tokens[offset] - 1
        if left:
            self._tokens[offset] = left
            return
        del self._tokens[offset]
        order = self._order
        while order and order[0] not in self._tokens:
            self._done_until = order.popleft() + 1

    def committable(self) -> int | None:
        """The position to commit when it moved since the last call, else None."""
        if self._done_until is None or self._done_until == self._committed:
            return None
        self._committed = self._done_until
        return self._committed

    @property
    def position(self) -> int | None:
        """One past the done prefix, whether or not it was offered for commit already."""
        return self._done_until
