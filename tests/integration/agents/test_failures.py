"""Failure handling against the real Kafka: retries through the retry topics with their delays,
the dead-letter queue after the last retry, model timeouts, and hold-key ordering.

The models are small runtimes of the test's own that fail (or hang) on chosen request inputs;
everything else is the worker as `tidegate worker` runs it, with its retry relay.
"""

from __future__ import annotations

import asyncio
import time
from collections import Counter
from datetime import datetime
from typing import Any

import numpy as np

from tests.integration.workers import SIGNATURE, Reader, Stack, in_thread, publish, request, running
from tidegate.agents.inference.loaded import LoadedModel
from tidegate.core.errors import ModelUnavailableError
from tidegate.dlq.failure_settings import FailureSettings, ModelFailurePolicy
from tidegate.models.model_settings import ModelSettings
from tidegate.models.runtime.contract import Arrays, ModelRuntime

FLAKY, DOOMED, HANG = 7.0, 13.0, 99.0


def ms(value: Any) -> float:
    return value.timestamp() * 1000 if isinstance(value, datetime) else float(value)


class MarkedRuntime(ModelRuntime):
    """Sums each row. A row whose first feature is FLAKY fails (retriably) on its first two
    calls, DOOMED always, and HANG blocks its thread for 20 s."""

    def __init__(self) -> None:
        self.flaky_calls = 0

    async def load(self, package: Any) -> None:
        """Nothing to load."""

    async def infer(self, inputs: Arrays) -> dict[str, Any]:
        x = inputs["features"]
        first = set(x[:, 0].tolist())
        if DOOMED in first:
            raise ModelUnavailableError("the model's backend is down for this input")
        if FLAKY in first:
            self.flaky_calls += 1
            if self.flaky_calls <= 2:
                raise ModelUnavailableError("the model's backend is warming up")
        if HANG in first:
            await asyncio.to_thread(time.sleep, 20)
        total = x.sum(axis=1, keepdims=True, dtype=np.float32)
        return {"probabilities": np.concatenate([total, -total], axis=1)}


def loader_of(runtime: ModelRuntime) -> Any:
    async def loader(name: str, version: str) -> LoadedModel:
        return LoadedModel(name, version, SIGNATURE, runtime)

    return loader


async def test_a_retriable_failure_is_retried_with_backoff_then_succeeds_and_a_permanent_one_is_dead_lettered(  # noqa: E501
    stack: Stack, models: ModelSettings
) -> None:
    delays = [0.5, 1.0, 1.5]
    policy = FailureSettings(retry_delays_s=delays, retries=3, jitter=0.0, crash_guard=False)
    publish(
        stack,
        [
            request("flaky", "a", [FLAKY, 0, 0, 0]),
            request("doomed", "b", [DOOMED, 0, 0, 0]),
            request("fine", "c"),
        ],
    )
    results, failed = Reader(stack, stack.topics.results), Reader(stack, stack.topics.failed)
    # One request per batch: a retriable failure fails its whole batch, and this test follows
    # each request alone.
    runtime = MarkedRuntime()
    async with running(stack, models, loader_of(runtime), failure=policy, max_batch_size=1):
        got = {r["request_id"]: r for r in await in_thread(results.until, 3, 90.0)}
        (letter,) = await in_thread(failed.until, 1, 90.0)
        await asyncio.to_thread(results.poll)
    # One result per request, the final one: a retried request never answered twice.
    assert Counter(r["request_id"] for r, _ in results.records) == {
        "flaky": 1,
        "doomed": 1,
        "fine": 1,
    }
    flaky = got["flaky"]
    assert flaky["status"] == "OK"
    assert flaky["attempt"] == 3
    steps = flaky["history"]
    assert [s["kind"] for s in steps] == ["retry", "retry"]
    assert {s["reason"] for s in steps} == {"UNAVAILABLE"}
    assert [s["from"]["topic"] for s in steps] == stack.topics.retry_topics()[:2]
    assert flaky["origin"]["topic"] == stack.topics.requests
    assert flaky["source"]["offset"] != flaky["origin"]["offset"]  # read again, elsewhere
    # The relay sent each retry when its delay was up, not before.
    assert ms(steps[1]["at"]) - ms(steps[0]["at"]) >= delays[1] * 1000
    assert got["fine"]["attempt"] == 1
    assert got["fine"]["history"] == []

    assert got["doomed"]["status"] == "UNAVAILABLE"
    assert letter["request_id"] == "doomed"
    assert letter["error"]["code"] == "UNAVAILABLE"
    assert letter["error"]["details"]["version"] == "1"  # for `tidegate dlq --version`
    assert letter["attempt"] == 4  # the first delivery and three retries
    assert [s["kind"] for s in letter["history"]] == ["retry"] * 3
    waited = ms(letter["failed_at"]) - ms(letter["first_failed_at"])
    assert waited >= sum(delays) * 1000
    assert letter["origin"]["topic"] == stack.topics.requests
    results.close()
    failed.close()


async def test_a_model_that_hangs_on_some_inputs_gets_them_timed_out_and_its_partition_flows(
    stack: Stack, models: ModelSettings
) -> None:
    policy = FailureSettings(
        retry_delays_s=[0.2],
        retries=1,
        jitter=0.0,
        crash_guard=False,
        models={"tiny": ModelFailurePolicy(timeout_ms=300)},
    )
    items = [request(f"r{i}", "one-key") for i in range(20)]
    items.insert(5, request("hangs", "one-key", [HANG, 0, 0, 0]))
    publish(stack, items)
    results, failed = Reader(stack, stack.topics.results), Reader(stack, stack.topics.failed)
    started = time.monotonic()
    async with running(stack, models, loader_of(MarkedRuntime()), failure=policy):
        got = {r["request_id"]: r for r in await in_thread(results.until, 21, 60.0)}
        (letter,) = await in_thread(failed.until, 1, 60.0)
    elapsed = time.monotonic() - started
    # Two timeouts of 0.3 s and a retry delay, not the 20 s the hung calls take.
    assert elapsed < 15, f"the partition waited for the hung model ({elapsed:.1f} s)"
    assert got.pop("hangs")["error"]["code"] == "MODEL_TIMEOUT"
    assert {r["status"] for r in got.values()} == {"OK"}
    assert letter["request_id"] == "hangs"
    assert letter["error"]["code"] == "MODEL_TIMEOUT"
    assert letter["error"]["retriable"] is True
    assert letter["attempt"] == 2
    results.close()
    failed.close()


async def test_hold_key_keeps_a_keys_order_across_a_retry(
    stack: Stack, models: ModelSettings
) -> None:
    policy = FailureSettings(
        retry_delays_s=[0.5], retries=1, jitter=0.0, crash_guard=False, ordering="hold-key"
    )
    items = [request("k-0", "k", [FLAKY, 0, 0, 0])]
    items += [request(f"k-{i}", "k") for i in range(1, 6)]
    items += [request(f"other-{i}", "other") for i in range(3)]
    publish(stack, items)
    results = Reader(stack, stack.topics.results)
    runtime = MarkedRuntime()
    runtime.flaky_calls = 1  # fails once: one retry
    async with running(stack, models, loader_of(runtime), failure=policy, max_batch_size=1):
        got = await in_thread(results.until, 9, 60.0)
    keyed = [r["request_id"] for r in got if r["routing_key"] == "k"]
    assert keyed == [f"k-{i}" for i in range(6)], keyed
    assert {r["status"] for r in got} == {"OK"}
    by_id = {r["request_id"]: r for r in got}
    assert [s["kind"] for s in by_id["k-0"]["history"]] == ["retry"]
    # Waiting, perhaps more than once (it may come back while k-0 is still being computed).
    assert {s["kind"] for s in by_id["k-3"]["history"]} == {"hold"}
    assert by_id["k-3"]["attempt"] == 1  # waiting is not another attempt
    assert by_id["other-0"]["history"] == []  # other keys never wait
    results.close()
