"""A worker process whose model kills the process on one input (`python -m
tests.integration.crash_worker`, configured by the environment like `tidegate worker`): the
crash-loop test runs it again and again."""

from __future__ import annotations

import asyncio
import os
import signal
from typing import Any

import numpy as np

from tests.integration.workers import SIGNATURE
from tidegate.agents.assembly import WorkerConfig, running_worker
from tidegate.agents.inference.loaded import LoadedModel
from tidegate.models.runtime.contract import Arrays, ModelRuntime

CRASH = 666.0
CRASH_EXIT = 3


class CrashingRuntime(ModelRuntime):
    """Sums each row; a row whose first feature is CRASH ends the process at once, as a
    segfault in a native kernel would."""

    async def load(self, package: Any) -> None:
        """Nothing to load."""

    async def infer(self, inputs: Arrays) -> dict[str, Any]:
        x = inputs["features"]
        if (x[:, 0] == CRASH).any():
            os._exit(CRASH_EXIT)
        total = x.sum(axis=1, keepdims=True, dtype=np.float32)
        return {"probabilities": np.concatenate([total, -total], axis=1)}


async def loader(name: str, version: str) -> LoadedModel:
    return LoadedModel(name, version, SIGNATURE, CrashingRuntime())


async def main() -> None:
    stop = asyncio.Event()
    asyncio.get_running_loop().add_signal_handler(signal.SIGTERM, stop.set)
    async with running_worker(WorkerConfig(), loader=loader):
        await stop.wait()


if __name__ == "__main__":
    asyncio.run(main())
