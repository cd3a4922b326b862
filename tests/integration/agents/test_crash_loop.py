"""A message that kills its worker every time is quarantined after `crash_limit` kills, with
the real Kafka and Redis: the worker process is started again after each crash, as its
supervisor would, and the crash count lives in Redis."""

from __future__ import annotations

import subprocess
import sys
import time

from tests.integration.crash_worker import CRASH, CRASH_EXIT
from tests.integration.workers import ROOT, Reader, Stack, publish, request, stop_workers
from tests.support import unique, wait_for
from tidegate.models.model_settings import ModelSettings


def test_a_message_that_kills_the_worker_every_time_is_quarantined_and_the_partition_moves_on(
    stack: Stack, models: ModelSettings
) -> None:
    items = [request(f"before-{i}", "one-key") for i in range(5)]
    items.append(request("killer", "one-key", [CRASH, 0, 0, 0]))
    items += [request(f"after-{i}", "one-key") for i in range(5)]
    publish(stack, items)
    env = stack.env(
        models,
        TIDEGATE_FAILURE_CRASH_LIMIT="3",
        TIDEGATE_WORKER_SESSION_TIMEOUT_MS="6000",
        TIDEGATE_WORKER_ID=unique("crash"),
    )
    results, poison = Reader(stack, stack.topics.results), Reader(stack, stack.topics.poison)
    crashes = 0
    deadline = time.monotonic() + 240
    proc: subprocess.Popen[bytes] | None = None

    def crashed_or_quarantined() -> bool:
        assert proc is not None
        results.poll()
        return proc.poll() is not None or bool(poison.poll())

    try:
        while True:
            proc = subprocess.Popen(
                [sys.executable, "-m", "tests.integration.crash_worker"],
                env=env,
                cwd=ROOT,
                stdout=subprocess.DEVNULL,
                stderr=(models.store_dir.parent / f"{unique('crash')}.log").open("wb"),
            )
            wait_for(
                crashed_or_quarantined,
                timeout=deadline - time.monotonic(),
                interval=0,
                what=f"the worker to crash or quarantine the killer (after {crashes} crashes)",
            )
            if proc.poll() is None:
                break  # it quarantined the killer and keeps serving
            assert proc.returncode == CRASH_EXIT, f"the worker failed otherwise: {proc.returncode}"
            crashes += 1
            assert crashes <= 3, "the killer was not quarantined after 3 crashes"
        assert crashes == 3
        (letter,) = poison.until(1, timeout=30)
        got = {r["request_id"] for r in results.until(10, timeout=60)}
    finally:
        if proc is not None:
            stop_workers(proc)
    assert letter["error"]["code"] == "CRASH_LOOP"
    assert letter["error"]["details"]["crashes"] == "3"
    assert letter["source"]["topic"] == stack.topics.requests
    assert letter["original_value"]  # the request's bytes, kept for a redrive after a fix
    # Everything else was answered, before and after the killer. Requests a crashed worker had
    # answered but not committed yet are answered again (at-least-once), never the killer.
    assert got == {f"before-{i}" for i in range(5)} | {f"after-{i}" for i in range(5)}
    assert {r["status"] for r, _ in results.records} == {"OK"}
    results.close()
    poison.close()
