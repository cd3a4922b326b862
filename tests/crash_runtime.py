"""A worker whose model ends the process on one input, as a segfault in a native kernel would:
the crash-loop test (`tests.integration.crash_worker`) and the bulkhead bench's crash loop
(`tests.bench.pools_crash`) run it. No shipped runtime crashes on demand, so it is the worker as
`tidegate worker` assembles it (`running_worker`, configured by the same environment) with this
runtime in place of onnxruntime. It imports no more than a worker does: the bench restarts it
again and again, and the restarts are what it measures."""

from __future__ import annotations

import asyncio
import os
import signal
from typing import Any

import numpy as np

from tidegate.agents.assembly import WorkerConfig, running_worker
from tidegate.agents.inference.loaded import LoadedModel
from tidegate.models.runtime.contract import Arrays, ModelRuntime
from tidegate.schemas.signature import Signature, TensorSpec

__all__ = ["CRASH", "CRASH_EXIT", "SIGNATURE", "CrashingRuntime", "run_crashing_worker"]

CRASH = 666.0
"""A row whose first feature is this ends the worker."""
CRASH_EXIT = 3
SIGNATURE = Signature(
    inputs=(TensorSpec(name="features", datatype="FP32", shape=(-1, 4)),),
    outputs=(TensorSpec(name="probabilities", datatype="FP32", shape=(-1, 2)),),
)
"""The tests' small classifiers' signature (tests.integration.workers has the same)."""


class CrashingRuntime(ModelRuntime):
    """Sums each row; a batch with a row whose first feature is CRASH ends the process at once
    (warm-up inputs are zeros, so the worker starts and joins its group first)."""

    async def load(self, package: Any) -> None:
        """Nothing to load."""

    async def infer(self, inputs: Arrays) -> dict[str, Any]:
        x = inputs["features"]
        if (x[:, 0] == CRASH).any():
            os._exit(CRASH_EXIT)
        total = x.sum(axis=1, keepdims=True, dtype=np.float32)
        return {"probabilities": np.concatenate([total, -total], axis=1)}


async def _loader(name: str, version: str) -> LoadedModel:
    return LoadedModel(name, version, SIGNATURE, CrashingRuntime())


async def run_crashing_worker() -> None:
    """Serve every model with `CrashingRuntime` until SIGTERM or SIGINT."""
    stop = asyncio.Event()
    for sig in (signal.SIGTERM, signal.SIGINT):
        asyncio.get_running_loop().add_signal_handler(sig, stop.set)
    async with running_worker(WorkerConfig(), loader=_loader):
        await stop.wait()
