"""`tidegate controller` runs on the event loop its settings name, with its heap settled."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest
import uvloop

from tidegate.cli.serve_controller import controller


class _Service:
    """Stands in for the controller's service: records the loop it ran on, then returns."""

    loops: list[asyncio.AbstractEventLoop] = []

    def __init__(self, config: Any) -> None:
        self.config = config

    async def run(self, stop: asyncio.Event) -> None:
        type(self).loops.append(asyncio.get_running_loop())


@pytest.mark.parametrize(("kind", "uv"), [("auto", True), ("uvloop", True), ("asyncio", False)])
def test_the_controller_runs_on_the_loop_its_settings_name(
    monkeypatch: pytest.MonkeyPatch, kind: str, uv: bool
) -> None:
    monkeypatch.setenv("TIDEGATE_LIFECYCLE_CONTROLLER_EVENT_LOOP", kind)
    monkeypatch.setattr("tidegate.lifecycle.control.process.ControllerService", _Service)
    monkeypatch.setattr("tidegate.cli.serve_controller.configure_logging", lambda: None)
    settled: list[int] = []
    # The test process keeps its collector as it is; the controller's heap is settled before it
    # runs.
    monkeypatch.setattr(
        "tidegate.cli.serve_controller.settle", lambda: settled.append(len(_Service.loops))
    )
    _Service.loops.clear()
    controller(group_id=None, metrics_port=0, migrate=False)
    [loop] = _Service.loops
    assert isinstance(loop, uvloop.Loop) is uv
    assert settled == [0]
