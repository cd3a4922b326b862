"""The crash loop of the bulkhead part (`python -m tests.bench.pools_crash`): the worker
supervisor of `tidegate worker --processes N` (`tidegate.cli.worker_pool.Supervisor`, its
restart back-off as shipped) over one worker whose model ends the process on every request
marked `CRASH`, as a segfault in a native kernel would.

No shipped runtime crashes on demand, so the child is the worker as `tidegate worker` assembles
it (`running_worker`, configured by the same environment: pool, group, crash guard on) with this
module's runtime in place of onnxruntime, as tests/integration/crash_worker.py does.
"""

from __future__ import annotations

import asyncio
import os
import signal
import sys
from typing import Any

import numpy as np

from tidegate.agents.assembly import WorkerConfig, running_worker
from tidegate.agents.inference.loaded import LoadedModel
from tidegate.cli.serve_worker import STOP_MARGIN_S
from tidegate.cli.worker_pool import Slot, Supervisor
from tidegate.core.telemetry import configure_logging
from tidegate.models.runtime.contract import Arrays, ModelRuntime
from tidegate.schemas.signature import Signature, TensorSpec

__all__ = ["CRASH", "CRASH_EXIT", "SIGNATURE"]

CRASH = 666.0
CRASH_EXIT = 3
SIGNATURE = Signature(
    inputs=(TensorSpec(name="features", datatype="FP32", shape=(-1, 4)),),
    outputs=(TensorSpec(name="probabilities", datatype="FP32", shape=(-1, 2)),),
)
"""Both bench models' (defined here, where the crashing worker needs it, so that its restarts
import no more than a worker does)."""


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


async def _worker() -> None:
    stop = asyncio.Event()
    for sig in (signal.SIGTERM, signal.SIGINT):
        asyncio.get_running_loop().add_signal_handler(sig, stop.set)
    async with running_worker(WorkerConfig(), loader=_loader):
        await stop.wait()


def main(argv: list[str]) -> int:
    configure_logging()
    if argv == ["--child"]:
        asyncio.run(_worker())
        return 0
    config = WorkerConfig()
    argv_child = [sys.executable, "-m", "tests.bench.pools_crash", "--child"]
    slot = Slot(f"worker {config.worker.worker_id}", argv_child)
    stop_s = config.worker.drain_timeout_s + STOP_MARGIN_S
    return Supervisor([slot], stop_timeout_s=stop_s).run()


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
