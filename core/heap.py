"""The garbage collector of a long-running server process, set once its start-up is done.

Profiled on `tidegate demo --keep` at 250 calls/s, CPython's cyclic collector took about a tenth
of the gateway's event loop: each call allocates a few thousand container objects, so the
youngest generation (700 by default) was collected several times per call, and every older
collection walked the whole start-up heap (FastAPI's routes, pydantic's models, the settings)
again. `settle()` moves what start-up built into the permanent generation (`gc.freeze`, as
CPython's documentation advises for servers) and collects the youngest generation less often.
Cycles are still collected; reference counting frees everything else at once, as before.

The worker (once its models are loaded) and the controller settle too. After start-up a worker
holds about 156k objects (torch, onnxruntime, pydantic, the settings), the controller about 92k.
At 2,000 requests/s on the Kafka path a full collection walked them every few seconds and held a
worker's event loop for 70-120 ms (the controller's for 140-155 ms), which alone put the p99 over
100 ms.
"""

from __future__ import annotations

import gc

__all__ = ["YOUNG_THRESHOLD", "settle"]

YOUNG_THRESHOLD = 10_000
"""Allocations between two collections of the youngest generation (CPython's default: 700)."""


def settle(young_threshold: int = YOUNG_THRESHOLD) -> None:
    """Freeze the heap built so far and collect the young generation every `young_threshold`
    allocations. Call once, when start-up is over (models loaded, app built)."""
    gc.collect()
    gc.freeze()
    _, middle, old = gc.get_threshold()
    gc.set_threshold(young_threshold, middle, old)
