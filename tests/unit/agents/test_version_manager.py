"""VersionManager: what a worker keeps loaded, when it says so, and what it never serves."""

from __future__ import annotations

import asyncio
from typing import Any

import numpy as np
import numpy.typing as npt
import pytest

from tests.unit.agents.dataplane_support import (
    SIGNATURE,
    Reports,
    Tables,
    lifecycle_state,
    registered,
    run,
    task,
    until,
)
from tidegate.agents import worker_metrics as metrics
from tidegate.agents.inference.inference_service import InferenceService
from tidegate.agents.inference.loaded import LoadedModel, ModelCache
from tidegate.agents.inference.version_manager import Report, VersionManager
from tidegate.core.errors import ModelUnavailableError
from tidegate.lifecycle.domain import events as ev
from tidegate.lifecycle.domain.routing import RoutingTable
from tidegate.models.manifest import ModelPackage
from tidegate.models.runtime.contract import Arrays, ModelRuntime

WORKER = "w-test"


class Runtime(ModelRuntime):
    def __init__(self, mib: int = 0) -> None:
        self.unloaded = False
        # Written, so that its pages are resident: the process's RSS grows by about `mib`.
        self.ballast: npt.NDArray[Any] | None = np.ones(mib * 2**20, np.uint8) if mib else None

    async def load(self, package: ModelPackage) -> None:
        """Nothing to load."""

    async def infer(self, inputs: Arrays) -> dict[str, npt.NDArray[Any]]:
        x = inputs["features"]
        return {"probabilities": x[:, :2], "score": x[:, 0]}

    async def on_unload(self) -> None:
        self.unloaded = True
        self.ballast = None


class Loader:
    """Loads fake versions; a version with a gate waits for it (a slow fetch and warm-up)."""

    def __init__(self, broken: set[str] | None = None, mib: int = 0) -> None:
        self.broken = broken or set()
        self.mib = mib
        self.gates: dict[str, asyncio.Event] = {}
        self.loads: list[str] = []
        self.runtimes: dict[str, Runtime] = {}

    async def __call__(self, name: str, version: str) -> LoadedModel:
        self.loads.append(version)
        gate = self.gates.get(version)
        if gate is not None:
            await gate.wait()
        if version in self.broken:
            raise OSError(f"the artifact of {version} is corrupt")
        runtime = self.runtimes[version] = Runtime(self.mib)
        return LoadedModel(name, version, SIGNATURE, runtime)


class Harness:
    def __init__(
        self,
        *payloads: ev.Payload,
        max_loaded: int = 8,
        report: Report | None = None,
        retry_after_s: float = 30.0,
        retry_loads_s: float = 10.0,
        pool: str | None = None,
        budget_mib: int | None = None,
        busy_s: float = 0.0,
        leave_idle_s: float = 0.0,
        **loader: Any,
    ) -> None:
        self.loader = Loader(**loader)
        self.reports = Reports()
        self.tables = Tables()
        self.use(*payloads)
        self.manager = VersionManager(
            ModelCache(self.loader, retry_after_s=retry_after_s),
            self.tables,
            report or self.reports,
            worker_id=WORKER,
            max_loaded=max_loaded,
            unload_grace_s=0.0,
            retry_report_s=0.05,
            retry_loads_s=retry_loads_s,
            pool=pool,
            budget_bytes=budget_mib * 2**20 if budget_mib else None,
            busy_s=busy_s,
            leave_idle_s=leave_idle_s,
        )

    def use(self, *payloads: ev.Payload) -> None:
        self.state = lifecycle_state("fraud", *payloads)
        self.tables.tables["fraud"] = RoutingTable.from_state(self.state)

    def change(self, *payloads: ev.Payload) -> None:
        """A new table, as the feed's listener would announce it."""
        self.use(*payloads)
        self.manager.changed(self.state)

    def loaded(self) -> set[str]:
        return {v for _, v in self.manager.cache.loaded()}

    def reported(self, kind: type[ev.Payload]) -> list[tuple[str, str]]:
        out = []
        for payload in self.reports.of(kind):
            assert isinstance(payload, ev.VersionLoaded | ev.VersionUnloaded)
            assert payload.worker_id == WORKER
            extra = payload.reason if isinstance(payload, ev.VersionUnloaded) else ""
            out.append((payload.version, extra))
        return out


BASE = (*registered("1", "2", "3", "4", loaded_on=None), ev.Promoted("1"))


async def test_wanted_versions_load_before_start_returns_and_are_reported_once_warm() -> None:
    h = Harness(*BASE, ev.ShadowStarted("2"))
    h.loader.gates["2"] = gate = asyncio.Event()
    starting = asyncio.ensure_future(h.manager.start(["fraud"]))
    await until(lambda: "2" in h.loader.loads)
    assert h.manager.ready("fraud", "1")
    assert not h.manager.ready("fraud", "2"), "ready before its warm-up finished"
    assert not starting.done()
    assert h.reported(ev.VersionLoaded) == []
    gate.set()
    assert await starting == {}
    assert h.reported(ev.VersionLoaded) == [("1", ""), ("2", "")]
    loaded = h.reports.of(ev.VersionLoaded)[1]
    assert isinstance(loaded, ev.VersionLoaded)
    assert loaded.load_ms > 0

    # A table change wants version 3: it loads in the background, reported only once warm.
    h.loader.gates["3"] = late = asyncio.Event()
    h.change(*BASE, ev.ShadowStarted("2"), ev.ShadowStarted("3"))
    await until(lambda: "3" in h.loader.loads)
    await asyncio.sleep(0.05)
    assert not h.manager.ready("fraud", "3")
    assert ("3", "") not in h.reported(ev.VersionLoaded)
    late.set()
    await until(lambda: ("3", "") in h.reported(ev.VersionLoaded))
    assert h.manager.ready("fraud", "3")
    await h.manager.stop()


async def test_lru_evicts_the_least_recently_used_unwanted_version_never_a_wanted_one() -> None:
    h = Harness(*BASE, max_loaded=2)
    await h.manager.start(["fraud"])
    assert h.loaded() == {"1"}
    await h.manager.get("fraud", "2")  # an explicit old version, loaded on demand
    await h.manager.get("fraud", "1")  # 2 is now the least recently used
    await h.manager.get("fraud", "3")
    assert h.loaded() == {"1", "3"}
    await h.manager.get("fraud", "4")  # 1 is the least recently used, but wanted
    assert h.loaded() == {"1", "4"}
    await until(lambda: len(h.reported(ev.VersionUnloaded)) == 2)
    assert h.reported(ev.VersionUnloaded) == [("2", "evicted"), ("3", "evicted")]
    assert [v for v, _ in h.reported(ev.VersionLoaded)] == ["1", "2", "3", "4"]
    await until(lambda: h.loader.runtimes["3"].unloaded)
    assert h.loader.runtimes["2"].unloaded
    assert not h.loader.runtimes["1"].unloaded
    await h.manager.stop()


async def test_wanted_versions_stay_loaded_past_the_maximum() -> None:
    h = Harness(*BASE, ev.TrafficShifted({"1": 50, "2": 50}), ev.ShadowStarted("3"), max_loaded=1)
    await h.manager.start(["fraud"])
    assert h.loaded() == {"1", "2", "3"}
    assert h.reported(ev.VersionUnloaded) == []
    await h.manager.stop()


async def test_an_explicit_old_version_is_loaded_for_the_request_that_asks() -> None:
    h = Harness(*BASE)
    await h.manager.start(["fraud"])
    service = InferenceService(h.tables, h.manager, worker_id=WORKER)
    cold = metrics.COLD_LOADS.labels("fraud", "3")
    before = cold._value.get()
    routed, explicit = await run(service, [task("a"), task("b", version="3")])
    assert (routed["model_version"], explicit["model_version"]) == ("1", "3")
    assert explicit["status"] == "OK"
    assert h.loader.loads == ["1", "3"]
    assert cold._value.get() == before + 1, "the request that waited on a load is counted"
    await run(service, [task("c", version="3")])
    assert cold._value.get() == before + 1
    await until(lambda: ("3", "") in h.reported(ev.VersionLoaded))
    await h.manager.stop()


async def test_a_pool_worker_keeps_only_its_pools_models_loaded() -> None:
    h = Harness(*BASE, pool="tabular")
    await h.manager.start(["fraud"])
    assert h.loaded() == set(), "fraud is in the default pool, not this worker's"
    h.change(*BASE, ev.PoolAssigned("tabular"))
    await until(lambda: h.loaded() == {"1"})
    await until(lambda: h.reported(ev.VersionLoaded) == [("1", "")])
    # Moved to another pool: its workers load it, and this one unloads it at once.
    h.change(*BASE, ev.PoolAssigned("tabular"), ev.PoolAssigned("vision"))
    assert h.loaded() == set()
    await until(lambda: h.reported(ev.VersionUnloaded) == [("1", "placed in vision")])
    # A request routed before the move is still served: its version loads cold.
    assert (await h.manager.get("fraud", "1")).version == "1"
    await h.manager.stop()


async def test_a_model_moved_away_stays_loaded_while_its_requests_drain_here() -> None:
    h = Harness(
        *BASE, ev.PoolAssigned("tabular"), pool="tabular", retry_loads_s=0.05, leave_idle_s=0.3
    )
    await h.manager.start(["fraud"])
    await h.manager.get("fraud", "1")  # a request of the model's, just now
    h.change(*BASE, ev.PoolAssigned("tabular"), ev.PoolAssigned("vision"))
    assert h.loaded() == {"1"}, "a model in use is not unloaded under its last requests"
    # Its requests left in this pool's topics are served warm, and keep it loaded.
    for _ in range(3):
        await asyncio.sleep(0.1)  # requests arriving while the old pool drains
        assert (await h.manager.get("fraud", "1")).version == "1"
        assert h.loaded() == {"1"}
    assert h.loader.loads == ["1"], "no cold load while it drains"
    # Idle past `leave_idle_s`: the periodic reconcile unloads it.
    await until(lambda: h.reported(ev.VersionUnloaded) == [("1", "placed in vision")])
    assert h.loaded() == set()
    await h.manager.stop()


async def test_a_default_pool_worker_lets_a_model_placed_elsewhere_go() -> None:
    h = Harness(*BASE)
    await h.manager.start(["fraud"])
    assert h.loaded() == {"1"}
    h.change(*BASE, ev.PoolAssigned("tabular"))
    assert h.loaded() == set()
    await until(lambda: h.reported(ev.VersionUnloaded) == [("1", "placed in tabular")])
    await h.manager.stop()


async def test_a_memory_budget_evicts_idle_versions_unwanted_first_as_measured() -> None:
    # Each version takes 40 MiB of resident memory; the budget (less 5%) holds two.
    h = Harness(*BASE, ev.ShadowStarted("2"), budget_mib=100, mib=40)
    evicted = metrics.EVICTIONS.labels("fraud", "3", "memory")
    before = evicted._value.get()
    await h.manager.start(["fraud"])
    assert h.loaded() == {"1", "2"}
    measured = h.manager.loaded_bytes()
    assert 70 * 2**20 < measured <= 95 * 2**20, "each load counts as its measured RSS growth"
    # Room for 3 only by evicting a wanted version: a request waits on it, so one goes.
    await h.manager.get("fraud", "3")
    assert h.loaded() == {"2", "3"}, "1 was the least recently used"
    await h.manager.get("fraud", "4")  # 3 is unwanted: it goes before wanted 2
    assert h.loaded() == {"2", "4"}
    assert evicted._value.get() == before + 1
    assert h.manager.loaded_bytes() <= 95 * 2**20
    await until(lambda: ("3", "evicted: memory budget") in h.reported(ev.VersionUnloaded))
    # The evicted versions' runtimes are released (their memory with them).
    await until(lambda: h.loader.runtimes["3"].unloaded and h.loader.runtimes["1"].unloaded)
    await h.manager.stop()


async def test_wanted_versions_past_the_budget_load_on_demand_not_at_start() -> None:
    h = Harness(*BASE, ev.ShadowStarted("2"), ev.ShadowStarted("3"), budget_mib=100, mib=40)
    await h.manager.start(["fraud"])
    assert len(h.loaded()) == 2, "a third wanted version does not fit; it waits for a request"
    assert h.reported(ev.VersionUnloaded) == []
    await h.manager.stop()


async def test_a_version_in_use_is_never_evicted_for_another() -> None:
    h = Harness(*BASE, budget_mib=100, mib=40, busy_s=60.0)
    await h.manager.start(["fraud"])
    await h.manager.get("fraud", "2")
    with pytest.raises(ModelUnavailableError, match="memory budget"):
        await h.manager.get("fraud", "3")
    assert h.loaded() == {"1", "2"}
    assert "3" not in h.loader.loads
    await h.manager.stop()


async def test_a_load_larger_than_predicted_is_brought_back_within_the_budget_once_idle() -> None:
    h = Harness(*BASE, budget_mib=100, mib=40, busy_s=0.3)
    await h.manager.start(["fraud"])
    await h.manager.get("fraud", "1")  # in use: it cannot go for the next 0.3 s
    h.loader.mib = 70  # predicted at 40 MiB (the average measured), it takes 70
    await h.manager.get("fraud", "3")
    assert h.loaded() == {"1", "3"}, "a version in use is not evicted"
    assert h.manager.loaded_bytes() > 95 * 2**20
    # Once 1 has gone idle, the budget holds again as measured, without another load: the
    # unwanted version goes first, as at any eviction.
    await until(lambda: h.manager.loaded_bytes() <= 95 * 2**20)
    assert h.loaded() == {"1"}
    await until(lambda: ("3", "evicted: memory budget") in h.reported(ev.VersionUnloaded))
    await h.manager.stop()


async def test_retired_versions_are_unloaded_and_reported() -> None:
    h = Harness(*BASE, ev.ShadowStarted("2"))
    await h.manager.start(["fraud"])
    await h.manager.get("fraud", "3")
    h.change(*BASE, ev.ShadowStarted("2"), ev.Retired("2"), ev.Retired("3"))
    assert not h.manager.ready("fraud", "2")
    assert h.loaded() == {"1"}
    await until(lambda: len(h.reported(ev.VersionUnloaded)) == 2)
    assert sorted(h.reported(ev.VersionUnloaded)) == [("2", "retired"), ("3", "retired")]
    await until(lambda: h.loader.runtimes["2"].unloaded and h.loader.runtimes["3"].unloaded)
    await h.manager.stop()


async def test_a_version_retired_while_it_loads_is_dropped_once_loaded() -> None:
    h = Harness(*BASE)
    await h.manager.start(["fraud"])
    h.loader.gates["2"] = gate = asyncio.Event()
    h.change(*BASE, ev.ShadowStarted("2"))
    await until(lambda: "2" in h.loader.loads)
    h.change(*BASE, ev.ShadowStarted("2"), ev.Retired("2"))
    gate.set()
    await until(lambda: ("2", "retired") in h.reported(ev.VersionUnloaded))
    assert h.loaded() == {"1"}
    await h.manager.stop()


async def test_a_version_that_fails_to_load_is_never_ready_nor_reported() -> None:
    h = Harness(*BASE, ev.ShadowStarted("2"), broken={"2"})
    failures = await h.manager.start(["fraud"])
    assert list(failures) == [("fraud", "2")]
    assert "corrupt" in failures[("fraud", "2")]
    assert not h.manager.ready("fraud", "2")
    assert h.reported(ev.VersionLoaded) == [("1", "")]
    # Table changes within the retry window do not hammer the broken artifact.
    h.change(*BASE, ev.ShadowStarted("2"), ev.TrafficShifted({"1": 100}))
    await asyncio.sleep(0.05)
    assert h.loader.loads.count("2") == 1
    assert not h.manager.ready("fraud", "2")
    await h.manager.stop()


async def test_a_failed_load_is_tried_again_in_the_background_once_forgotten() -> None:
    h = Harness(*BASE, ev.ShadowStarted("2"), broken={"2"}, retry_after_s=0.2, retry_loads_s=0.05)
    failures = await h.manager.start(["fraud"])
    assert list(failures) == [("fraud", "2")]
    h.loader.broken.clear()  # e.g. the store's disk came back
    await until(lambda: h.manager.ready("fraud", "2"))
    assert h.loader.loads.count("2") == 2, "no table change and no request asked for it"
    await until(lambda: ("2", "") in h.reported(ev.VersionLoaded))
    await h.manager.stop()


async def test_stop_reports_an_unload_for_every_loaded_version() -> None:
    h = Harness(*BASE, ev.ShadowStarted("2"))
    await h.manager.start(["fraud"])
    await h.manager.get("fraud", "3")
    await h.manager.stop()
    assert sorted(h.reported(ev.VersionUnloaded)) == [
        ("1", "worker stopping"),
        ("2", "worker stopping"),
        ("3", "worker stopping"),
    ]
    assert all(r.unloaded for r in h.loader.runtimes.values())
    assert h.loaded() == set()


async def test_reports_are_retried_while_the_lifecycle_log_is_unreachable() -> None:
    failures = 3
    reports = Reports()

    async def flaky(stream: str, events: Any) -> None:
        nonlocal failures
        if failures:  # the log comes back after three attempts
            failures -= 1
            raise ConnectionError("postgres is down")
        await reports(stream, events)

    h = Harness(*BASE, report=flaky)
    h.reports = reports
    await h.manager.start(["fraud"])
    assert h.manager.ready("fraud", "1"), "serving does not wait for the log"
    await until(lambda: h.reported(ev.VersionLoaded) == [("1", "")])
    assert failures == 0
    await h.manager.stop()
