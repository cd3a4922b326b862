"""A redrive after the fix, end to end with the real worker: requests that failed on a broken
model are dead-lettered, the model is fixed, the redrive brings every dead letter to an OK
result under its own request id, and each result's lineage shows the redrive and its run."""

from __future__ import annotations

from typing import Any

import numpy as np

from tests.integration.workers import (
    SIGNATURE,
    Reader,
    Stack,
    in_thread,
    publish,
    request,
    running,
)
from tidegate.agents.inference.loaded import LoadedModel
from tidegate.core.errors import ModelExecutionError
from tidegate.dlq.redrive import Redrive
from tidegate.dlq.redrive_report import RedriveOptions
from tidegate.models.model_settings import ModelSettings
from tidegate.models.runtime.contract import Arrays, ModelRuntime


class NegativeShyRuntime(ModelRuntime):
    """Fails any call with a negative feature while `broken`, the bug the operator fixes."""

    def __init__(self) -> None:
        self.broken = True

    async def load(self, package: Any) -> None:
        """Nothing to load."""

    async def infer(self, inputs: Arrays) -> dict[str, Any]:
        x = inputs["features"]
        if self.broken and (x < 0).any():
            raise ModelExecutionError("negative feature")
        total = x.sum(axis=1, keepdims=True, dtype=np.float32)
        return {"probabilities": np.concatenate([total, -total], axis=1)}


async def test_a_redrive_after_the_fix_brings_every_dead_letter_to_a_result(
    stack: Stack, models: ModelSettings
) -> None:
    runtime = NegativeShyRuntime()

    async def loader(name: str, version: str) -> LoadedModel:
        return LoadedModel(name, version, SIGNATURE, runtime)

    bad = [request(f"neg-{i}", f"k{i}", [-1.0, 2.0, 3.0, 4.0]) for i in range(4)]
    publish(stack, [*bad, request("fine", "k9")])
    results, failed = Reader(stack, stack.topics.results), Reader(stack, stack.topics.failed)
    async with running(stack, models, loader):
        first = {r["request_id"]: r for r in await in_thread(results.until, 5)}
        letters = await in_thread(failed.until, 4)
    assert {first[b["request_id"]]["status"] for b in bad} == {"ERROR"}
    attempts = {e["request_id"]: e["attempt"] for e in letters}

    runtime.broken = False  # the fix
    options = RedriveOptions(source=stack.topics.failed, run_id="after-fix", rate=100)
    report = await Redrive(stack.kafka, stack.topics, stack.registry, options).run()
    assert report.progress.redriven == 4
    positions = {o.request_id: o.position for o in report.outcomes}

    async with running(stack, models, loader):
        again = [r for r in await in_thread(results.until, 9) if r not in first.values()]
    redriven = {r["request_id"]: r for r in again}
    assert set(redriven) == {b["request_id"] for b in bad}
    for rid, result in redriven.items():
        assert result["status"] == "OK"
        assert result["attempt"] == attempts[rid] + 1
        last = result["history"][-1]
        assert (last["kind"], last["id"]) == ("redrive", "after-fix")
        assert last["from"] == positions[rid]
        assert result["origin"]["topic"] == stack.topics.requests
    results.close()
    failed.close()
