"""MoveGuard: a moving model's requests wait for the old pool to pass this producer's records,
then go out in order; nothing else waits. The old pool's committed offsets are a fake here;
tests/integration/clients/test_pool_move.py runs the same against Kafka and real workers."""

from __future__ import annotations

import threading
from dataclasses import dataclass

import pytest

from tests.support import wait_for
from tidegate.clients.pool_moves import MoveGuard
from tidegate.core.errors import OverloadedError
from tidegate.core.settings import KafkaSettings, TopicSettings

TOPICS = TopicSettings()


@dataclass
class Msg:
    """The part of a delivered `confluent_kafka.Message` the guard reads."""

    _topic: str
    _partition: int
    _offset: int

    def error(self) -> None:
        return None

    def topic(self) -> str:
        return self._topic

    def partition(self) -> int:
        return self._partition

    def offset(self) -> int:
        return self._offset


class Guard(MoveGuard):
    """The old pool's group offsets as the test sets them."""

    def __init__(self, **options: float) -> None:
        super().__init__(KafkaSettings(), TOPICS, "workers", poll_s=0.01, **options)  # type: ignore[arg-type]
        self.committed: dict[tuple[str, int], int] = {}
        self.groups: set[str] = set()
        self.lock = threading.Lock()

    def _committed(self, group: str, parts: list[tuple[str, int]]) -> dict[tuple[str, int], int]:
        self.groups.add(group)
        with self.lock:
            return {tp: self.committed[tp] for tp in parts if tp in self.committed}


class Publisher:
    """Publishes through the guard as `TidegateProducer` does; `sent` is what reached Kafka."""

    def __init__(self, guard: Guard) -> None:
        self.guard = guard
        self.sent: list[str] = []
        self.failed: list[str] = []

    def publish(self, model: str, pool: str | None, name: str) -> object:
        token = object()
        fail = lambda _exc: self.failed.append(name)  # noqa: E731
        self.guard.send_or_hold(model, pool, token, lambda: self.sent.append(name), fail)
        return token


def test_a_moving_models_requests_wait_for_the_old_pool_then_go_in_order() -> None:
    guard = Guard()
    out = Publisher(guard)
    early = out.publish("fraud", None, "a1")  # the default pool
    guard.delivered(early, Msg("inference-requests", 2, 41))  # type: ignore[arg-type]
    late = out.publish("fraud", None, "a2")  # not yet delivered when the move is seen
    other = out.publish("other", None, "o1")
    # Placed in pool `tabular`: fraud's requests wait; other models' do not.
    out.publish("fraud", "tabular", "b1")
    out.publish("fraud", "tabular", "b2")
    out.publish("other", None, "o2")
    assert out.sent == ["a1", "a2", "o1", "o2"]
    assert guard.moves == 1
    # a2 is delivered at offset 7 of partition 0; the old pool has read up to 42 of partition 2.
    guard.delivered(late, Msg("inference-requests", 0, 7))  # type: ignore[arg-type]
    guard.delivered(other, Msg("inference-requests", 1, 3))  # type: ignore[arg-type]
    with guard.lock:
        guard.committed = {("inference-requests", p): o for p, o in ((2, 42), (0, 7), (1, 4))}
    out.publish("fraud", "tabular", "b3")
    assert out.sent == ["a1", "a2", "o1", "o2"], "offset 7 is not read yet: 7 is next"
    with guard.lock:
        guard.committed[("inference-requests", 0)] = 8
    wait_for(lambda: len(out.sent) == 7, timeout=5, interval=0.01, what="the held requests")
    assert out.sent[4:] == ["b1", "b2", "b3"], "in the order they came"
    assert guard.groups == {"workers"}, "the default pool's group is the workers' own"
    out.publish("fraud", "tabular", "b4")
    assert out.sent[-1] == "b4", "sent at once once the move is over"
    assert guard.timeouts == 0


def test_a_pool_that_never_drains_holds_its_model_only_for_drain_s() -> None:
    guard = Guard(drain_s=0.2)
    out = Publisher(guard)
    first = out.publish("fraud", "tabular", "a1")
    guard.delivered(first, Msg("inference-requests.tabular", 0, 3))  # type: ignore[arg-type]
    out.publish("fraud", "vision", "b1")
    assert out.sent == ["a1"]
    wait_for(lambda: out.sent == ["a1", "b1"], timeout=5, interval=0.01, what="b1 sent")
    assert guard.timeouts == 1
    assert guard.groups == {"workers.tabular"}


def test_held_requests_are_bounded() -> None:
    guard = Guard(drain_s=30.0, max_held=2)
    out = Publisher(guard)
    first = out.publish("fraud", None, "a1")
    guard.delivered(first, Msg("inference-requests", 0, 0))  # type: ignore[arg-type]
    out.publish("fraud", "tabular", "b1")
    out.publish("fraud", "tabular", "b2")
    with pytest.raises(OverloadedError, match="2 requests of fraud wait"):
        out.publish("fraud", "tabular", "b3")
    with guard.lock:
        guard.committed = {("inference-requests", 0): 1}
    wait_for(lambda: out.sent == ["a1", "b1", "b2"], timeout=5, interval=0.01, what="sent")


def test_with_warm_the_held_requests_also_wait_for_the_new_pool_to_load_the_model() -> None:
    loaded: set[tuple[str, str | None]] = set()
    guard = Guard(warm=lambda model, pool: (model, pool) in loaded)  # type: ignore[arg-type]
    out = Publisher(guard)
    first = out.publish("fraud", None, "a1")
    guard.delivered(first, Msg("inference-requests", 0, 0))  # type: ignore[arg-type]
    with guard.lock:
        guard.committed = {("inference-requests", 0): 1}  # the old pool is drained already
    out.publish("fraud", "tabular", "b1")
    out.publish("fraud", "tabular", "b2")
    loaded.add(("fraud", None))  # loaded in the old pool is not loaded in the new one
    with pytest.raises(AssertionError):
        wait_for(lambda: len(out.sent) > 1, timeout=0.3, interval=0.01, what="a send")
    loaded.add(("fraud", "tabular"))
    wait_for(lambda: out.sent == ["a1", "b1", "b2"], timeout=5, interval=0.01, what="sent")
    assert guard.timeouts == 0


def test_a_record_whose_produce_failed_is_not_waited_for_by_a_later_move() -> None:
    guard = Guard(drain_s=30.0)
    out = Publisher(guard)

    def refused() -> None:
        raise BufferError("the local queue is full")

    with pytest.raises(BufferError):
        guard.send_or_hold("fraud", None, object(), refused, lambda _exc: None)
    out.publish("fraud", "tabular", "b1")  # no delivery of the refused one will ever come
    wait_for(lambda: out.sent == ["b1"], timeout=5, interval=0.01, what="b1 sent")
    assert guard.timeouts == 0
