"""The agents' unit tests' fixtures. `harness` here is the worker harness, not the gateway's of
the same name (tests/unit/gateway_harness.py): a conftest's fixture wins in its folder."""

from __future__ import annotations

from collections.abc import AsyncIterator

import pytest

from tests.unit.agents.worker_support import Harness


@pytest.fixture
async def harness(monkeypatch: pytest.MonkeyPatch) -> AsyncIterator[Harness]:
    built = Harness(monkeypatch)
    yield built
    if built.worker is not None and not built.stopped:
        await built.stop()
