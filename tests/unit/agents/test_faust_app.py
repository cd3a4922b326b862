"""`tidegate worker` runs its agent on the event loop its settings name, and settles its heap once
its models are loaded."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Any

import pytest
import uvloop

from tidegate.agents import faust_app
from tidegate.agents.assembly import WorkerConfig
from tidegate.agents.faust_app import InferenceAgent, run_worker
from tidegate.agents.worker_settings import WorkerSettings


class _Worker:
    """Stands in for faust's Worker: records the loop it is given instead of running."""

    loops: list[Any] = []

    def __init__(self, app: Any, *, loop: Any = None, **options: Any) -> None:
        self.loop = loop

    def execute_from_commandline(self) -> None:
        type(self).loops.append((self.loop, asyncio.get_event_loop_policy().get_event_loop()))


@pytest.mark.parametrize(("kind", "uv"), [("auto", True), ("uvloop", True), ("asyncio", False)])
def test_the_worker_runs_on_the_loop_its_settings_name(
    monkeypatch: pytest.MonkeyPatch, kind: str, uv: bool
) -> None:
    monkeypatch.setattr("faust.worker.Worker", _Worker)
    _Worker.loops.clear()
    run_worker(WorkerConfig(worker=WorkerSettings(event_loop=kind)))
    [(given, current)] = _Worker.loops
    try:
        assert isinstance(given, uvloop.Loop) is uv
        assert current is given  # faust's services that look the loop up find the same one
    finally:
        given.close()
        asyncio.set_event_loop(None)


async def test_the_worker_settles_its_heap_once_its_models_are_loaded(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    events: list[str] = []

    @asynccontextmanager
    async def running(config: WorkerConfig) -> AsyncIterator[object]:
        events.append("loaded")
        yield object()
        events.append("stopped")

    monkeypatch.setattr(faust_app, "running_worker", running)
    # The test process keeps its collector as it is.
    monkeypatch.setattr(faust_app, "settle", lambda: events.append("settled"))
    agent = InferenceAgent(WorkerConfig(worker=WorkerSettings(metrics_port=0, stall_exit_s=0)))
    await agent.on_start()
    await agent.on_stop()
    assert events == ["loaded", "settled", "stopped"]
