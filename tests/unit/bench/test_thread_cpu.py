"""The threads part reads CPU by thread name, over a process and its children."""

from __future__ import annotations

import os
import threading

from tests.bench.thread_cpu import thread_seconds
from tests.support import wait_for


def test_a_busy_thread_is_counted_under_its_own_name() -> None:
    done = threading.Event()

    def spin() -> None:
        # A native name, as librdkafka's threads have ("rdk:broker1").
        with open(f"/proc/self/task/{threading.get_native_id()}/comm", "w") as comm:
            comm.write("busy-one")
        while not done.is_set():
            sum(range(1000))

    worker = threading.Thread(target=spin, daemon=True)
    worker.start()
    try:
        groups = {"me": [os.getpid()]}
        wait_for(
            lambda: thread_seconds(groups).get(("me", "busy-one"), 0.0) >= 0.05,
            timeout=10,
            interval=0.02,
            what="the spinning thread's CPU under its own name",
        )
        assert thread_seconds({"nobody": []}) == {}
    finally:
        done.set()
        worker.join(5)
