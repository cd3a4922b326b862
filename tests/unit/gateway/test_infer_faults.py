"""The data plane (`tidegate.gateway.v2api.infer`) under faults, with the harness's fakes: the
call's timeout becomes the request's deadline, calls are refused at once while Kafka is unreachable,
and an asynchronous call is either accepted (Kafka has it) or refused (it does not), its retry by id
published once."""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest

from tests.support import eventually
from tests.unit.gateway_harness import Harness, features, left_s, make_result
from tidegate.clients.producer import PublishError
from tidegate.core.errors import ResultTimeoutError
from tidegate.gateway.http_errors import RequestIdTakenError, RequestInFlightError
from tidegate.gateway.roundtrip.result_store import StoredRequest
from tidegate.gateway.v2api.gateway_runtime import GatewayRuntime
from tidegate.gateway.v2api.infer import InferCall, Inference, Outcome


@pytest.fixture
async def plane(tmp_path: Path) -> AsyncIterator[tuple[Harness, Inference]]:
    harness = Harness(tmp_path, async_deadline_s=30.0)
    runtime = GatewayRuntime(harness.config, harness.services)
    await runtime.start()
    yield harness, runtime.inference
    await runtime.stop()


def call(
    request_id: str | None,
    timeout: str | None = None,
    *,
    respond_async: bool = False,
    owner: str | None = "alice",
    **body: Any,
) -> InferCall:
    if request_id is not None:
        body["id"] = request_id
    payload = json.dumps(features(**body)).encode()
    return InferCall(
        "fraud", None, payload, timeout=timeout, respond_async=respond_async, owner=owner
    )


async def test_the_timeout_is_the_deadline_and_the_504_says_what_follows(
    plane: tuple[Harness, Inference],
) -> None:
    harness, inference = plane
    harness.worker.hold = True
    outcome = await inference.infer(call("late", timeout="0.2"))
    (record,) = harness.worker.published
    assert left_s(record) == pytest.approx(0.2, abs=0.01)
    assert isinstance(outcome.error, ResultTimeoutError)
    detail = str(outcome.error)
    assert "DEADLINE_EXCEEDED" in detail
    assert "just in time" in detail
    assert "/v2/requests/late" in detail


async def test_the_earlier_of_the_timeout_and_tritons_timeout_wins(
    plane: tuple[Harness, Inference],
) -> None:
    harness, inference = plane
    await inference.infer(call("header-first", timeout="1", parameters={"timeout": 3_000_000}))
    await inference.infer(call("param-first", timeout="3", parameters={"timeout": 1_000_000}))
    await inference.infer(call("default"))
    by_id = {r["request_id"]: r for r in harness.worker.published}
    assert left_s(by_id["header-first"]) == pytest.approx(1.0, abs=0.01)
    assert left_s(by_id["param-first"]) == pytest.approx(1.0, abs=0.01)
    # The harness's default_timeout_s.
    assert left_s(by_id["default"]) == pytest.approx(5.0, abs=0.01)


async def test_an_async_call_has_its_timeout_or_the_async_default_as_deadline(
    plane: tuple[Harness, Inference],
) -> None:
    harness, inference = plane
    timed = await inference.infer(call("a-timed", timeout="2", respond_async=True))
    untimed = await inference.infer(call("a-untimed", respond_async=True))
    assert timed.accepted
    assert untimed.accepted
    by_id = {r["request_id"]: r for r in harness.worker.published}
    assert left_s(by_id["a-timed"]) == pytest.approx(2.0, abs=0.01)
    assert left_s(by_id["a-untimed"]) == pytest.approx(30.0, abs=0.01)


async def test_without_an_async_default_an_untimed_async_call_has_no_deadline(
    tmp_path: Path,
) -> None:
    harness = Harness(tmp_path)
    runtime = GatewayRuntime(harness.config, harness.services)
    await runtime.start()
    try:
        assert (await runtime.inference.infer(call("free", respond_async=True))).accepted
    finally:
        await runtime.stop()
    assert harness.worker.published[0]["deadline"] is None


@pytest.mark.parametrize("respond_async", [False, True])
async def test_kafka_down_refuses_at_once_and_touches_nothing(
    plane: tuple[Harness, Inference], respond_async: bool
) -> None:
    harness, inference = plane
    harness.worker.is_connected = False
    outcome = await asyncio.wait_for(
        inference.infer(call(None, timeout="5", respond_async=respond_async)), 0.5
    )
    assert isinstance(outcome.error, PublishError)
    assert outcome.error.retriable
    assert harness.worker.published == []
    assert harness.store.calls == [], "not even a marker while Kafka is unreachable"
    harness.worker.is_connected = True
    assert (await inference.infer(call(None, respond_async=respond_async))).error is None


async def test_an_async_retry_of_an_accepted_id_is_not_published_again(
    plane: tuple[Harness, Inference],
) -> None:
    harness, inference = plane
    harness.worker.hold = True
    first = await inference.infer(call("once", respond_async=True))
    again = await inference.infer(call("once", respond_async=True))
    assert first.accepted
    assert again.accepted
    assert [r["request_id"] for r in harness.worker.published] == ["once"]
    meta = harness.store.requests["once"].meta
    assert meta is not None
    assert "publishing" not in meta, "marked accepted once Kafka had it"


async def test_an_async_call_that_kafka_refuses_leaves_nothing_and_may_be_retried(
    plane: tuple[Harness, Inference],
) -> None:
    harness, inference = plane
    harness.worker.hold = harness.worker.hold_ack = True
    task: asyncio.Task[Outcome] = asyncio.create_task(
        inference.infer(call("refused", respond_async=True))
    )
    await asyncio.sleep(0.05)
    assert not task.done(), "no 202 (nor failure) before Kafka answers"
    marker = harness.store.requests["refused"].meta
    assert marker is not None
    assert marker["publishing"] is True
    # A retry while the first is being published is told to come back.
    racing = await inference.infer(call("refused", respond_async=True))
    assert isinstance(racing.error, RequestInFlightError)
    harness.worker.release_ack("refused", PublishError("Local: Message timed out"))
    outcome = await asyncio.wait_for(task, 1)
    assert isinstance(outcome.error, PublishError)
    assert "refused" not in harness.store.requests
    harness.worker.hold_ack = False
    retried = await inference.infer(call("refused", respond_async=True))
    assert retried.accepted
    assert [r["request_id"] for r in harness.worker.published] == ["refused", "refused"]


async def test_a_retry_finding_a_marker_still_publishing_elsewhere_is_in_flight(
    plane: tuple[Harness, Inference],
) -> None:
    harness, inference = plane
    # Another replica marked it and has not heard from Kafka yet.
    await harness.store.save(
        "elsewhere", meta={"model": "fraud", "publishing": True}, owner="alice"
    )
    outcome = await inference.infer(call("elsewhere", respond_async=True))
    assert isinstance(outcome.error, RequestInFlightError)
    assert harness.worker.published == []


async def test_an_async_retry_of_another_callers_id_is_taken(
    plane: tuple[Harness, Inference],
) -> None:
    harness, inference = plane
    assert (await inference.infer(call("hers", respond_async=True, owner="alice"))).accepted
    stolen = await inference.infer(call("hers", respond_async=True, owner="mallory"))
    assert isinstance(stolen.error, RequestIdTakenError)
    assert len(harness.worker.published) == 1


async def test_a_deadline_exceeded_answer_before_the_ack_can_still_be_fetched(
    plane: tuple[Harness, Inference],
) -> None:
    """The worker's DEADLINE_EXCEEDED can overtake Kafka's late ack: the call then ends with
    that answer, 504, and a fetch by id must find it as it would after a timeout here."""
    harness, inference = plane
    harness.worker.hold_ack = True
    harness.worker.answer = lambda record: make_result(record, status="DEADLINE_EXCEEDED")
    outcome = await inference.infer(call("overtaken", timeout="0.001"))
    assert outcome.result is not None
    assert outcome.result["status"] == "DEADLINE_EXCEEDED"

    def stored() -> StoredRequest | None:
        found = harness.store.requests.get("overtaken")
        return found if found is not None and found.meta and found.result else None

    found = await eventually(stored, timeout=5, interval=0.01, what="the late answer stored")
    assert found.owner == "alice"
