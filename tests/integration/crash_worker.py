"""A worker process whose model kills the process on one input (`python -m
tests.integration.crash_worker`, configured by the environment like `tidegate worker`): the
crash-loop test runs it again and again."""

from __future__ import annotations

import asyncio

from tests.crash_runtime import CRASH, CRASH_EXIT, run_crashing_worker

__all__ = ["CRASH", "CRASH_EXIT"]

if __name__ == "__main__":
    asyncio.run(run_crashing_worker())
