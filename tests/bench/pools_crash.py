"""The crash loop of the bulkhead part (`python -m tests.bench.pools_crash`): the worker
supervisor of `tidegate worker --processes N` (`tidegate.cli.worker_pool.Supervisor`, its
restart back-off as shipped) over one worker whose model ends the process on every request
marked `CRASH`, as a segfault in a native kernel would.

No shipped runtime crashes on demand, so the child is the worker as `tidegate worker` assembles
it (`running_worker`, configured by the same environment: pool, group, crash guard on) with the
runtime of tests/crash_runtime.py in place of onnxruntime.
"""

from __future__ import annotations

import asyncio
import sys

from tests.crash_runtime import CRASH, CRASH_EXIT, SIGNATURE, run_crashing_worker
from tidegate.agents.assembly import WorkerConfig
from tidegate.cli.serve_worker import STOP_MARGIN_S
from tidegate.cli.worker_pool import Slot, Supervisor
from tidegate.core.telemetry import configure_logging

__all__ = ["CRASH", "CRASH_EXIT", "SIGNATURE"]


def main(argv: list[str]) -> int:
    configure_logging()
    if argv == ["--child"]:
        asyncio.run(run_crashing_worker())
        return 0
    config = WorkerConfig()
    argv_child = [sys.executable, "-m", "tests.bench.pools_crash", "--child"]
    slot = Slot(f"worker {config.worker.worker_id}", argv_child)
    stop_s = config.worker.drain_timeout_s + STOP_MARGIN_S
    return Supervisor([slot], stop_timeout_s=stop_s).run()


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
