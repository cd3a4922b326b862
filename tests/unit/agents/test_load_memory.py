"""The cache measures what a load costs in resident memory, for placement and for the lifecycle's
`VersionLoaded` (decision 027): the growth of the process's RSS across the load, and nothing
when two loads overlap, whose growth cannot be told apart, nor for the first load of a runtime
class, which also pays the runtime's own start."""

from __future__ import annotations

import asyncio

import numpy as np

from tests.unit.agents.dataplane_support import SIGNATURE, FakeRuntime
from tidegate.agents.inference.loaded import LoadedModel, ModelCache, resident_bytes
from tidegate.lifecycle.domain import events as ev
from tidegate.lifecycle.domain.views import describe

MIB = 2**20


class HeavyRuntime(FakeRuntime):
    """Holds `size` bytes of touched memory, as a model's weights would."""

    def __init__(self, size: int) -> None:
        super().__init__("heavy")
        self.weights = np.ones(size, dtype=np.uint8)  # written, so resident


async def test_a_load_reports_how_much_resident_memory_it_took() -> None:
    async def load(name: str, version: str) -> LoadedModel:
        return LoadedModel(name, version, SIGNATURE, HeavyRuntime(64 * MIB))

    before = resident_bytes()
    assert before is not None, "this test needs /proc (Linux), as the workers' hosts have"
    cache = ModelCache(load)
    first = await cache.get("m", "1")
    assert first.rss_bytes is None, "the runtime's first load also paid for its own start"
    model = await cache.get("m", "2")
    assert model.rss_bytes is not None
    # The weights are resident: the growth is at least most of them, and not wildly more.
    assert 48 * MIB <= model.rss_bytes <= 160 * MIB


async def test_overlapping_loads_report_no_size() -> None:
    release = asyncio.Event()

    async def load(name: str, version: str) -> LoadedModel:
        if version != "0":
            await release.wait()
        return LoadedModel(name, version, SIGNATURE, HeavyRuntime(8 * MIB))

    cache = ModelCache(load)
    await cache.get("m", "0")  # the runtime's first load, never measured
    first = asyncio.create_task(cache.get("m", "1"))
    second = asyncio.create_task(cache.get("m", "2"))
    await asyncio.sleep(0)  # both loads are under way
    release.set()
    models = await asyncio.gather(first, second)
    assert [m.rss_bytes for m in models] == [None, None]
    # Alone again, the next load is measured.
    third = await cache.get("m", "3")
    assert third.rss_bytes is not None


def test_the_lifecycle_history_shows_the_measured_size() -> None:
    assert "+64 MiB resident" in describe(ev.VersionLoaded("1", "w-1", 1200.0, 64 * MIB))
    assert "resident" not in describe(ev.VersionLoaded("1", "w-1", 1200.0))
