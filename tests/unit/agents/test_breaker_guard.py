"""The inference service with breakers: what counts as a model failure, refusing calls to an open
version, the declared fallback (and the caller's veto), the half-open probes on a fake clock."""

from __future__ import annotations

import asyncio
from typing import Any

from prometheus_client import REGISTRY

from tests.unit.agents.dataplane_support import (
    POISON,
    SIGNATURE,
    FakeRuntime,
    Reports,
    Tables,
    error_of,
    lifecycle_table,
    registered,
    run,
    task,
)
from tidegate.agents.breakers.breaker_board import BreakerBoard
from tidegate.agents.breakers.breaker_settings import BreakerSettings, ModelBreakerPolicy
from tidegate.agents.inference.inference_service import NOT_BEFORE, InferenceService
from tidegate.agents.inference.loaded import LoadedModel, ModelCache
from tidegate.agents.inference.version_manager import VersionManager
from tidegate.core.errors import ModelExecutionError, ModelNotFoundError
from tidegate.lifecycle.domain import events as ev
from tidegate.models.runtime.contract import Arrays


class Clock:
    def __init__(self) -> None:
        self.now = 50.0

    def __call__(self) -> float:
        return self.now


class Broken(FakeRuntime):
    """Fails every call with a model error (not retriable), until mended."""

    def __init__(self, version: str) -> None:
        super().__init__(version)
        self.broken = True

    async def infer(self, inputs: Arrays) -> dict[str, Any]:
        if self.broken:
            self.calls.append(len(inputs["features"]))
            raise ModelExecutionError("the model's weights are garbage")
        return await super().infer(inputs)


class Setup:
    def __init__(self, *, fallback: bool = True, lite_loaded: bool = True) -> None:
        self.clock = Clock()
        self.published: list[tuple[str, dict[str, Any] | None]] = []
        self.fraud = Broken("1")
        self.lite = FakeRuntime("7")
        fraud_events: list[ev.Payload] = [*registered("1"), ev.Promoted("1")]
        if fallback:
            fraud_events.append(ev.FallbackSet("fraud-lite"))
        self.tables = Tables(
            lifecycle_table("fraud", *fraud_events),
            lifecycle_table("fraud-lite", *registered("7"), ev.Promoted("7")),
        )
        runtimes = {"fraud": self.fraud, "fraud-lite": self.lite}

        async def loader(name: str, version: str) -> LoadedModel:
            if name not in runtimes:
                raise ModelNotFoundError(name)
            return LoadedModel(name, version, SIGNATURE, runtimes[name])

        self.versions = VersionManager(
            ModelCache(loader), self.tables, Reports(), worker_id="w-test", max_loaded=8
        )
        self.lite_loaded = lite_loaded
        settings = BreakerSettings(models={"fraud": ModelBreakerPolicy(probes=2)})
        self.board = BreakerBoard(
            settings,
            worker_id="w-test",
            publish=lambda key, record: self.published.append((key, record)),
            clock=self.clock,
            wall=lambda: 1_000_000.0 + self.clock.now,
        )
        self.service = InferenceService(
            self.tables, self.versions, worker_id="w-test", breakers=self.board
        )

    async def start(self) -> None:
        await self.versions.get("fraud", "1")
        if self.lite_loaded:
            await self.versions.get("fraud-lite", "7")

    async def trip(self) -> None:
        """20 requests alone, each a failed call of the broken version: the breaker opens."""
        for i in range(20):
            (result,) = await run(self.service, [task(f"trip-{i}")])
            assert result["status"] == "ERROR"
        assert self.board.state("fraud", "1") == "open"


def sample(name: str, **labels: str) -> float:
    return REGISTRY.get_sample_value(name, labels) or 0.0


async def test_a_failing_version_opens_and_its_requests_go_to_the_fallback_marked() -> None:
    s = Setup()
    await s.start()
    before = sample(
        "tidegate_worker_fallbacks_total",
        model="fraud",
        fallback="fraud-lite",
        reason="breaker-open",
    )
    await s.trip()
    calls = len(s.fraud.calls)
    results = await run(s.service, [task(f"r{i}") for i in range(4)])
    assert len(s.fraud.calls) == calls  # the open version was not called
    assert [r["status"] for r in results] == ["OK"] * 4
    assert {r["routing_rule"] for r in results} == {"fallback:breaker-open@fraud/1"}
    assert {(r["model"], r["model_version"]) for r in results} == {("fraud-lite", "7")}
    assert s.lite.calls == [4]  # one batch on the fallback
    after = sample(
        "tidegate_worker_fallbacks_total",
        model="fraud",
        fallback="fraud-lite",
        reason="breaker-open",
    )
    assert after - before == 4
    assert sample("tidegate_worker_breaker_state", model="fraud", version="1") == 2.0
    key, record = s.published[-1]
    assert key == "fraud/1/w-test"
    assert record is not None
    assert (record["state"], record["trips"]) == ("open", 1)


async def test_without_a_fallback_an_open_version_answers_unavailable_at_once() -> None:
    s = Setup(fallback=False)
    await s.start()
    await s.trip()
    calls = len(s.fraud.calls)
    results = await run(s.service, [task(f"r{i}") for i in range(3)])
    assert len(s.fraud.calls) == calls
    assert [r["status"] for r in results] == ["UNAVAILABLE"] * 3
    error = error_of(results[0])
    assert (error["code"], error["retriable"]) == ("UNAVAILABLE", True)
    assert "circuit breaker is open" in error["message"]
    # When probes go again, for the retry not to be spent before then.
    assert int(error["details"][NOT_BEFORE]) == int((1_000_000.0 + s.clock.now + 1.0) * 1000)
    assert (results[0]["model"], results[0]["model_version"]) == ("fraud", "1")


async def test_the_caller_may_refuse_the_fallback_and_an_explicit_version_never_gets_it() -> None:
    s = Setup()
    await s.start()
    await s.trip()
    refusing = task("no")
    refusing.request["parameters"] = {"fallback": False}
    results = await run(s.service, [refusing, task("named", version="1"), task("any")])
    assert [r["status"] for r in results] == ["UNAVAILABLE", "UNAVAILABLE", "OK"]
    assert results[2]["routing_rule"] == "fallback:breaker-open@fraud/1"


async def test_a_fallback_not_loaded_here_is_not_loaded_for_the_request() -> None:
    s = Setup(lite_loaded=False)
    await s.start()
    await s.trip()
    (result,) = await run(s.service, [task("r")])
    assert result["status"] == "UNAVAILABLE"
    assert s.lite.calls == []
    assert not s.versions.ready("fraud-lite", "7")


async def test_half_open_probes_close_it_once_the_model_recovers() -> None:
    s = Setup()
    await s.start()
    await s.trip()
    s.clock.now += 1.0
    s.fraud.broken = False
    # Two probes go to the version (probes=2 for fraud); the rest of the batch falls back.
    results = await run(s.service, [task(f"p{i}") for i in range(5)])
    rules = [r["routing_rule"] for r in results]
    assert rules[:2] == ["split@5", "split@5"]
    assert set(rules[2:]) == {"fallback:breaker-open@fraud/1"}
    assert s.board.state("fraud", "1") == "closed"
    assert [r["state"] for _, r in s.published if r] == ["open", "half_open", "closed"]
    results = await run(s.service, [task(f"n{i}") for i in range(5)])
    assert {r["routing_rule"] for r in results} == {"split@5"}


async def test_a_failed_probe_doubles_the_open_period() -> None:
    s = Setup(fallback=False)
    await s.start()
    await s.trip()
    for period in (1.0, 2.0, 4.0):
        s.clock.now += period - 0.01
        (early,) = await run(s.service, [task("early")])
        assert early["status"] == "UNAVAILABLE"
        s.clock.now += 0.01
        (probe,) = await run(s.service, [task("probe")])
        assert probe["status"] == "ERROR"  # the probe ran, and failed
    trips = [r["trips"] for _, r in s.published if r and r["state"] == "open"]
    assert trips == [1, 2, 3, 4]


async def test_one_bad_input_isolated_by_bisection_is_not_a_model_failure() -> None:
    s = Setup()
    s.fraud.broken = False
    await s.start()
    for i in range(30):
        batch = [task(f"b{i}-{j}", [POISON if j == 0 else 1.0, 1, 1, 1]) for j in range(2)]
        results = await run(s.service, batch)
        assert [r["status"] for r in results] == ["ERROR", "OK"]
    assert s.board.state("fraud", "1") == "closed"


async def test_invalid_inputs_never_reach_the_breaker() -> None:
    s = Setup()
    await s.start()
    for i in range(30):
        (result,) = await run(s.service, [task(f"bad{i}", [1.0, 2.0])])  # 2 features, not 4
        assert result["status"] == "INVALID"
    assert s.board.state("fraud", "1") == "closed"
    assert s.fraud.calls == []


class Hanging(FakeRuntime):
    async def infer(self, inputs: Arrays) -> dict[str, Any]:
        self.calls.append(len(inputs["features"]))
        await asyncio.sleep(5)
        return await super().infer(inputs)


async def test_a_timed_out_batch_is_one_failure_since_one_input_may_have_hung_it() -> None:
    s = Setup()
    await s.start()
    hanging = Hanging("1")
    loaded = await s.versions.get("fraud", "1")
    object.__setattr__(loaded, "runtime", hanging)
    s.service.timeout_s = lambda model: 0.01
    for i in range(5):
        results = await run(s.service, [task(f"h{i}-{j}") for j in range(5)])
        assert {error_of(r)["code"] for r in results} == {"MODEL_TIMEOUT"}
    # 25 requests timed out in 5 calls: 5 failures, below the minimum of 20.
    assert s.board.state("fraud", "1") == "closed"
    for i in range(15):
        await run(s.service, [task(f"alone-{i}")])
    assert s.board.state("fraud", "1") == "open"  # 20 calls that timed out


async def test_an_unavailable_batch_fails_every_member() -> None:
    s = Setup()
    s.fraud.broken = False
    s.fraud.unavailable = True
    await s.start()
    results = await run(s.service, [task(f"u{j}") for j in range(20)])
    assert {r["status"] for r in results} == {"UNAVAILABLE"}
    assert s.board.state("fraud", "1") == "open"
