"""The offline scorer: the workers' data plane on the versions a replay or backtest names."""

from __future__ import annotations

import struct
from datetime import UTC, datetime, timedelta
from typing import Any

import numpy as np
import numpy.typing as npt

from tidegate.agents.inference.loaded import LoadedModel
from tidegate.agents.inference.offline import OfflineScorer
from tidegate.dlq.envelopes import source_position
from tidegate.dlq.replay_reader import SourceRecord
from tidegate.models.manifest import ModelPackage
from tidegate.models.runtime.contract import Arrays, ModelRuntime
from tidegate.schemas.records import RequestRecord, Timestamp
from tidegate.schemas.signature import Signature, TensorSpec
from tidegate.schemas.tensors import to_numpy

SIGNATURE = Signature(
    inputs=(TensorSpec(name="features", datatype="FP32", shape=(-1, 2)),),
    outputs=(TensorSpec(name="probabilities", datatype="FP32", shape=(-1, 2)),),
)


class Scaled(ModelRuntime):
    """Multiplies the inputs by its version number; counts the rows of each call."""

    def __init__(self, factor: float) -> None:
        self.factor = factor
        self.calls: list[int] = []

    async def load(self, package: ModelPackage) -> None:
        """Nothing to load."""

    async def infer(self, inputs: Arrays) -> dict[str, npt.NDArray[Any]]:
        x = inputs["features"]
        self.calls.append(len(x))
        return {"probabilities": (x * self.factor).astype(np.float32)}


def record(
    rid: str, offset: int, *, model_version: str | None = None, deadline: Timestamp | None = None
) -> SourceRecord:
    request: RequestRecord = {
        "request_id": rid,
        "model": "m",
        "model_version": model_version,
        "tenant": "default",
        "routing_key": None,
        "inputs": [
            {
                "name": "features",
                "datatype": "FP32",
                "shape": [1, 2],
                "data": struct.pack("<2f", offset, 1.0),
                "parameters": {},
            }
        ],
        "outputs": [],
        "created_at": datetime.now(UTC),
    }
    if deadline is not None:
        request["deadline"] = deadline
    position = source_position("requests", 0, offset)
    return SourceRecord(position, None, b"", [], None, request, None, position)


def scorer() -> tuple[OfflineScorer, dict[str, Scaled]]:
    runtimes = {"1": Scaled(1.0), "2": Scaled(2.0)}

    async def loader(name: str, version: str) -> LoadedModel:
        return LoadedModel(name, version, SIGNATURE, runtimes[version], "classifier")

    return OfflineScorer(loader, worker_id="replay:test"), runtimes


async def test_each_request_runs_on_its_chosen_version_whatever_it_asked_for() -> None:
    offline, runtimes = scorer()
    past = datetime.now(UTC) - timedelta(hours=1)
    items = [
        (record("a", 3, model_version="1"), "2"),
        (record("b", 4, deadline=past), "2"),
        (record("c", 5), "1"),
    ]
    results = await offline.score(items)
    assert [(r["request_id"], r["status"], r["model_version"]) for r in results] == [
        ("a", "OK", "2"),
        ("b", "OK", "2"),  # a replay is not bound by the caller's deadline
        ("c", "OK", "1"),
    ]
    got = [to_numpy(r["outputs"][0])[0, 0] for r in results]
    assert got == [6.0, 8.0, 5.0]
    assert runtimes["2"].calls == [2], "requests of one version are one model call"
    assert runtimes["1"].calls == [1]
    assert results[0]["source"] == source_position("requests", 0, 3)
    assert results[0]["worker_id"] == "replay:test"
    timings = results[0]["timings"]
    assert timings["queue_ms"] == 0.0
    assert timings["total_ms"] == timings["batch_ms"] + timings["compute_ms"]
    first = items[0][0].request
    assert first is not None
    assert first["model_version"] == "1", "the record itself is left as it was read"

    assert await offline.task("m", "2") == "classifier"
    await offline.close()


async def test_an_invalid_request_is_answered_without_failing_its_batch() -> None:
    offline, runtimes = scorer()
    bad = record("bad", 1)
    assert bad.request is not None
    bad.request["inputs"][0]["shape"] = [1, 3]
    results = await offline.score([(record("ok", 0), "1"), (bad, "1")])
    assert [r["status"] for r in results] == ["OK", "INVALID"]
    assert runtimes["1"].calls == [1]
    await offline.close()
