"""`TidegateProducer` with a placement: a record that librdkafka refused to queue is not part of
a later move's fence. librdkafka and the encoder are stand-ins here; the move against Kafka and
real workers is tests/integration/clients/test_pool_move.py."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np
import pytest

from tests.support import wait_for
from tidegate.clients.producer import TidegateProducer, build_request
from tidegate.core.errors import OverloadedError


class Delivered:
    """A delivered message, as a delivery report hands it over (no offset: no fence)."""

    def error(self) -> None:
        return None

    def offset(self) -> int:
        return -1


class Librdkafka:
    """The producer's queue: refuses while `full`, and reports each delivery at once."""

    def __init__(self) -> None:
        self.full = False
        self.sent: list[str] = []

    def produce(self, topic: str, on_delivery: Callable[[Any, Any], None], **_: Any) -> None:
        if self.full:
            raise BufferError("Local: Queue full")
        self.sent.append(topic)
        on_delivery(None, Delivered())

    def poll(self, timeout: float = 0.0) -> int:
        return 0


class Encoder:
    def encode(self, record: Any, schema_id: int) -> bytes:
        return b"\0"


def test_a_record_the_queue_refused_is_not_waited_for_by_a_later_move() -> None:
    pools: dict[str, str | None] = {"fraud": None}
    producer = TidegateProducer(placement=pools.get, drain_s=30.0)
    queue = Librdkafka()
    producer._producer = queue  # type: ignore[assignment]
    producer._encoder = Encoder()  # type: ignore[assignment]

    def request() -> Any:
        return build_request("fraud", {"features": np.zeros((1, 4), np.float32)}, routing_key="k")

    producer.publish_record(request())
    queue.full = True
    with pytest.raises(OverloadedError):
        producer.publish_record(request())  # fraud's pool unchanged: the common path
    queue.full = False
    pools["fraud"] = "tabular"
    producer.publish_record(request())  # held until nothing sent before the move is in flight
    wait_for(lambda: len(queue.sent) == 2, timeout=5, interval=0.01, what="the held request")
    assert queue.sent[1].endswith(".tabular")
