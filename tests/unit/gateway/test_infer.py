"""The data plane under the routes (`tidegate.gateway.v2api.infer`), driven with plain values and no
HTTP: a synchronous call waits for its reply and Kafka's acknowledgement together, and a 504 is
given only for a request Kafka has."""

from __future__ import annotations

import asyncio
import gc
import json
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest

from tests.unit.gateway_harness import Harness, features, kept_writes
from tidegate.clients.producer import PublishError
from tidegate.core.errors import InvalidInputError, ModelNotFoundError, ResultTimeoutError
from tidegate.gateway.v2api.gateway_runtime import GatewayRuntime
from tidegate.gateway.v2api.infer import UNKNOWN_MODEL, InferCall, Inference, Outcome


@pytest.fixture
async def plane(tmp_path: Path) -> AsyncIterator[tuple[Harness, Inference]]:
    harness = Harness(tmp_path)
    runtime = GatewayRuntime(harness.config, harness.services)
    await runtime.start()
    yield harness, runtime.inference
    await runtime.stop()


def call(request_id: str, timeout: str | None = None, **body: Any) -> InferCall:
    payload = json.dumps(features(id=request_id, **body)).encode()
    return InferCall("fraud", None, payload, timeout=timeout)


def started(inference: Inference, infer_call: InferCall) -> asyncio.Task[Outcome]:
    return asyncio.get_running_loop().create_task(inference.infer(infer_call))


async def test_the_core_takes_plain_values_and_answers_outcomes(
    plane: tuple[Harness, Inference],
) -> None:
    harness, inference = plane
    done = await inference.infer(call("plain-1"))
    assert done.error is None
    assert (done.request_id, done.model, done.version) == ("plain-1", "fraud", "1")
    assert done.result is not None
    assert done.result["outputs"][0]["name"] == "probabilities"

    bad = await inference.infer(InferCall("fraud", None, b'{"id": "bad-1", "inputs": [{}]}'))
    assert isinstance(bad.error, InvalidInputError)
    assert bad.model == UNKNOWN_MODEL

    # A version nobody serves never becomes a metric label.
    unknown = await inference.infer(InferCall("fraud", "made-up", json.dumps(features()).encode()))
    assert isinstance(unknown.error, ModelNotFoundError)
    assert (unknown.model, unknown.version) == (UNKNOWN_MODEL, "")
    assert kept_writes(harness.store) == []


async def test_the_reply_may_come_before_the_ack(plane: tuple[Harness, Inference]) -> None:
    harness, inference = plane
    harness.worker.hold_ack = True
    loop = asyncio.get_running_loop()
    unhandled: list[dict[str, Any]] = []
    loop.set_exception_handler(lambda _loop, context: unhandled.append(context))

    outcome = await asyncio.wait_for(inference.infer(call("quick-1", timeout="5")), 2)
    assert outcome.result is not None, outcome.error
    ack = harness.worker.acks.pop("quick-1")
    assert not ack.done(), "answered while Kafka's acknowledgement was still pending"

    # A publish reported failed after its reply came (possible when an ack is lost) is no
    # unretrieved error, and changes nothing.
    ack.set_exception(PublishError("ack lost"))
    await asyncio.sleep(0)
    del ack
    gc.collect()
    assert unhandled == []
    assert kept_writes(harness.store) == []


async def test_the_deadline_waits_for_the_ack_then_answers_504(
    plane: tuple[Harness, Inference],
) -> None:
    harness, inference = plane
    harness.worker.hold = harness.worker.hold_ack = True
    task = started(inference, call("slow-ack", timeout="0.05"))
    await asyncio.sleep(0.2)
    assert "slow-ack" in harness.worker.acks, "published, not acknowledged"
    assert not task.done(), "a 504 promises a request Kafka has: it waits for the ack"
    assert kept_writes(harness.store) == []
    harness.worker.release_ack("slow-ack")
    outcome = await asyncio.wait_for(task, 2)
    assert isinstance(outcome.error, ResultTimeoutError)
    assert "/v2/requests/slow-ack" in str(outcome.error)
    assert harness.store.requests["slow-ack"].meta is not None


async def test_an_ack_after_the_deadline_ends_the_call_before_the_reply_it_precedes(
    plane: tuple[Harness, Inference],
) -> None:
    """The ack of a call past its deadline ends it when it comes (504, the result kept for a
    fetch), however soon the reply follows: a reply that beat it would be answered, and lost to
    the fetch the 504 promises."""
    harness, inference = plane
    harness.worker.hold = harness.worker.hold_ack = True
    task = started(inference, call("ack-then-reply", timeout="0.05"))
    await asyncio.sleep(0.1)
    harness.worker.release_ack("ack-then-reply")
    await asyncio.sleep(0.01)  # the ack's wake-up runs; the reply comes right after
    harness.worker.release("ack-then-reply")
    outcome = await asyncio.wait_for(task, 2)
    assert isinstance(outcome.error, ResultTimeoutError)
    assert harness.store.requests["ack-then-reply"].meta is not None


async def test_a_publish_failing_after_the_deadline_is_no_504(
    plane: tuple[Harness, Inference],
) -> None:
    harness, inference = plane
    harness.worker.hold = harness.worker.hold_ack = True
    task = started(inference, call("lost", timeout="0.05"))
    await asyncio.sleep(0.1)
    harness.worker.release_ack("lost", PublishError("message timed out"))
    outcome = await asyncio.wait_for(task, 2)
    assert isinstance(outcome.error, PublishError)
    assert kept_writes(harness.store) == []


async def test_a_reply_while_a_late_ack_is_pending_answers_the_call(
    plane: tuple[Harness, Inference],
) -> None:
    harness, inference = plane
    harness.worker.hold = harness.worker.hold_ack = True
    task = started(inference, call("late-ack", timeout="0.05"))
    await asyncio.sleep(0.1)
    harness.worker.release("late-ack")
    outcome = await asyncio.wait_for(task, 2)
    assert outcome.result is not None, outcome.error
    harness.worker.release_ack("late-ack")


async def test_a_publish_failure_ends_the_call_at_once(plane: tuple[Harness, Inference]) -> None:
    harness, inference = plane
    harness.worker.fail = True
    outcome = await asyncio.wait_for(inference.infer(call("down", timeout="5")), 1)
    assert isinstance(outcome.error, PublishError)
    assert kept_writes(harness.store) == []
