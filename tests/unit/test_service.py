"""The inference service with fake runtimes: answers without compute, sub-batching, bisection."""

from __future__ import annotations

import struct
import time
from typing import Any

import numpy as np
import numpy.typing as npt
import pytest

from agents.loaded import LoadedModel, ModelCache
from agents.manifest import ModelPackage
from agents.runtime.base import Arrays, ModelRuntime
from agents.service import InferenceService
from agents.serving import EXPLICIT, SERVING_CONFIG, ServingResolver, load_serving_table
from agents.signature import Signature, TensorSpec
from agents.tasks import InferenceTask
from tidegate.errors import (
    ConfigurationError,
    InvalidInputError,
    ModelExecutionError,
    ModelNotFoundError,
    ModelUnavailableError,
)

SIGNATURE = Signature(
    inputs=(TensorSpec(name="features", datatype="FP32", shape=(-1, 4)),),
    outputs=(
        TensorSpec(name="probabilities", datatype="FP32", shape=(-1, 2)),
        TensorSpec(name="score", datatype="FP32", shape=(-1,)),
    ),
)
POISON = -1.0  # a first feature of -1 makes FakeRuntime fail the whole call


class FakeRuntime(ModelRuntime):
    def __init__(self, version: str, *, drop_row: bool = False, unavailable: bool = False) -> None:
        self.version = version
        self.calls: list[int] = []
        self.drop_row = drop_row
        self.unavailable = unavailable

    async def load(self, package: ModelPackage) -> None:
        """Nothing to load."""

    async def infer(self, inputs: Arrays) -> dict[str, npt.NDArray[Any]]:
        x = inputs["features"]
        self.calls.append(len(x))
        if self.unavailable:
            raise ModelUnavailableError("unloading")
        if (x[:, 0] == POISON).any():
            raise ModelExecutionError("the model cannot take a -1")
        rows = x[:-1] if self.drop_row else x
        total = rows.sum(axis=1, dtype=np.float32)
        probabilities = np.stack([total, total + float(self.version)], axis=1)
        return {"probabilities": probabilities.astype(np.float32), "score": total}


class FakeStore:
    def __init__(self, versions: dict[str, list[str]]) -> None:
        self._versions = versions

    async def versions(self, name: str) -> list[str]:
        return self._versions.get(name, [])


def make_service(**runtime_options: Any) -> tuple[InferenceService, dict[str, FakeRuntime]]:
    runtimes = {v: FakeRuntime(v, **runtime_options) for v in ("1", "2")}

    async def loader(name: str, version: str) -> LoadedModel:
        if name != "fraud" or version not in runtimes:
            raise ModelNotFoundError(f"no {name} {version}")
        return LoadedModel(name, version, SIGNATURE, runtimes[version])

    resolver = ServingResolver({"fraud": "1"}, FakeStore({"fraud": ["1", "2"]}))
    return InferenceService(resolver, ModelCache(loader), worker_id="w-test"), runtimes


def task(
    rid: str,
    features: list[float] | None = None,
    *,
    model: str = "fraud",
    version: str | None = None,
    shape: list[int] | None = None,
    name: str = "features",
    deadline_ms: float | None = None,
    outputs: list[str] | None = None,
) -> InferenceTask:
    values = features if features is not None else [1.0, 2.0, 3.0, 4.0]
    request: dict[str, Any] = {
        "request_id": rid,
        "model": model,
        "model_version": version,
        "tenant": "t1",
        "routing_key": f"key-{rid}",
        "inputs": [
            {
                "name": name,
                "datatype": "FP32",
                "shape": shape or [1, len(values)],
                "data": struct.pack(f"<{len(values)}f", *values),
                "parameters": {},
            }
        ],
        "outputs": outputs or [],
        "parameters": {},
        "deadline": deadline_ms,
        "created_at": time.time() * 1000.0 - 5.0,
        "reply_to": None,
    }
    return InferenceTask(request, source={"topic": "req", "partition": 3, "offset": 42})


async def run(service: InferenceService, tasks: list[InferenceTask]) -> list[dict[str, Any]]:
    return await service.process(tasks, [1.5] * len(tasks))


async def test_a_batch_runs_as_one_call_and_is_split_back_per_request() -> None:
    service, runtimes = make_service()
    results = await run(service, [task("a"), task("b", [1, 1, 1, 1]), task("c", [0, 0, 0, 2])])
    assert runtimes["1"].calls == [3]
    assert [r["status"] for r in results] == ["OK"] * 3
    a, _, c = results
    assert a["request_id"] == "a"
    assert a["model_version"] == "1"
    assert a["routing_rule"] == SERVING_CONFIG
    assert a["worker_id"] == "w-test"
    assert a["batch_size"] == 3
    assert a["timings"]["batch_ms"] == 1.5
    assert a["timings"]["compute_ms"] > 0
    assert a["timings"]["total_ms"] >= 5.0
    assert a["source"] == {"topic": "req", "partition": 3, "offset": 42}
    assert a["tenant"] == "t1"
    assert a["routing_key"] == "key-a"
    assert a["error"] is None
    probs = {r["request_id"]: r["outputs"][0] for r in results}
    assert probs["b"]["name"] == "probabilities"
    assert probs["b"]["shape"] == [1, 2]
    assert struct.unpack("<2f", probs["b"]["data"]) == (4.0, 5.0)
    assert struct.unpack("<2f", c["outputs"][0]["data"]) == (2.0, 3.0)
    assert [o["name"] for o in a["outputs"]] == ["probabilities", "score"]


async def test_requested_outputs_are_the_only_ones_returned() -> None:
    service, _ = make_service()
    (result,) = await run(service, [task("a", outputs=["score"])])
    assert [o["name"] for o in result["outputs"]] == ["score"]
    (bad,) = await run(service, [task("b", outputs=["logits"])])
    assert bad["status"] == "INVALID"
    assert bad["error"]["field"] == "logits"


@pytest.mark.parametrize(
    ("options", "field"),
    [
        ({"name": "feats"}, "feats"),
        ({"shape": [2, 2]}, "features"),
        ({"features": [1.0, 2.0, 3.0]}, "features"),
    ],
)
async def test_inputs_not_matching_the_signature_are_invalid_without_compute(
    options: dict[str, Any], field: str
) -> None:
    service, runtimes = make_service()
    good, bad = await run(service, [task("ok"), task("bad", **options)])
    assert good["status"] == "OK"
    assert bad["status"] == "INVALID"
    assert bad["error"]["code"] == "INVALID_INPUT"
    assert bad["error"]["error_class"] == "InvalidInputError"
    assert bad["error"]["field"] == field
    assert runtimes["1"].calls == [1]


async def test_unknown_models_and_versions_are_not_found_without_compute() -> None:
    service, runtimes = make_service()
    results = await run(service, [task("a", model="nope"), task("b", version="9")])
    assert [r["status"] for r in results] == ["NOT_FOUND", "NOT_FOUND"]
    assert [r["model_version"] for r in results] == [None, None]
    assert results[0]["error"]["code"] == "NOT_FOUND"
    assert runtimes["1"].calls == []
    assert runtimes["2"].calls == []


async def test_an_explicit_version_is_honoured_and_sub_batched_apart() -> None:
    service, runtimes = make_service()
    results = await run(
        service, [task("a"), task("b", version="2"), task("c"), task("d", version="1")]
    )
    assert [r["model_version"] for r in results] == ["1", "2", "1", "1"]
    assert [r["routing_rule"] for r in results] == [
        SERVING_CONFIG,
        EXPLICIT,
        SERVING_CONFIG,
        EXPLICIT,
    ]
    assert sorted(runtimes["1"].calls) == [3]
    assert runtimes["2"].calls == [1]
    assert [r["batch_size"] for r in results] == [3, 1, 3, 3]
    assert struct.unpack("<2f", results[1]["outputs"][0]["data"]) == (10.0, 12.0)


async def test_a_request_past_its_deadline_is_answered_without_compute() -> None:
    service, runtimes = make_service()
    past = time.time() * 1000.0 - 1.0
    future = time.time() * 1000.0 + 60_000
    late, timely = await run(
        service, [task("late", deadline_ms=past), task("ok", deadline_ms=future)]
    )
    assert late["status"] == "DEADLINE_EXCEEDED"
    assert late["error"]["code"] == "DEADLINE_EXCEEDED"
    assert late["outputs"] == []
    assert timely["status"] == "OK"
    assert runtimes["1"].calls == [1]


async def test_bisection_isolates_one_bad_input_among_eight() -> None:
    service, runtimes = make_service()
    tasks = [task(f"r{i}", [POISON if i == 5 else 1.0, 1, 1, 1]) for i in range(8)]
    results = await run(service, tasks)
    statuses = {r["request_id"]: r["status"] for r in results}
    assert statuses.pop("r5") == "ERROR"
    assert set(statuses.values()) == {"OK"}
    bad = results[5]
    assert bad["error"]["code"] == "MODEL_ERROR"
    assert "-1" in bad["error"]["message"]
    assert bad["model_version"] == "1"
    assert bad["outputs"] == []
    # 8 fails; 4 pass; 4 fail; of those, 2 fail (1 passes, 1 fails) and 2 pass.
    assert runtimes["1"].calls == [8, 4, 4, 2, 1, 1, 2]
    assert tasks[5].attempts == 4
    assert tasks[0].attempts == 2
    assert [r["request_id"] for r in results] == [f"r{i}" for i in range(8)]


async def test_a_wrong_row_count_fails_every_member_without_bisecting() -> None:
    service, runtimes = make_service(drop_row=True)
    results = await run(service, [task(f"r{i}") for i in range(4)])
    assert [r["status"] for r in results] == ["ERROR"] * 4
    assert all("rows" in r["error"]["message"] for r in results)
    assert runtimes["1"].calls == [4]


async def test_an_unavailable_model_answers_unavailable_without_bisecting() -> None:
    service, runtimes = make_service(unavailable=True)
    results = await run(service, [task(f"r{i}") for i in range(4)])
    assert [r["status"] for r in results] == ["UNAVAILABLE"] * 4
    assert results[0]["error"]["retriable"] is True
    assert runtimes["1"].calls == [4]


async def test_a_rejected_request_is_invalid_and_its_batch_mates_are_served() -> None:
    service, runtimes = make_service()
    rejected = task("bad")
    rejected.rejection = InvalidInputError("tensor 'features' needs 16 bytes, got 3", "features")
    results = await run(service, [rejected, task("good")])
    assert [r["status"] for r in results] == ["INVALID", "OK"]
    assert results[0]["error"]["field"] == "features"
    assert runtimes["1"].calls == [1]


async def test_start_loads_every_serving_version_and_reports_failures() -> None:
    service, _ = make_service()
    service.resolver.table["ghost"] = "3"
    failures = await service.start()
    assert failures == {("ghost", "3"): "no ghost 3"}
    assert service.models.loaded() == [("fraud", "1")]
    await service.stop()


async def test_a_failed_load_is_remembered_for_a_while() -> None:
    attempts = 0

    async def broken(name: str, version: str) -> LoadedModel:
        nonlocal attempts
        attempts += 1
        raise OSError("disk on fire")

    cache = ModelCache(broken, retry_after_s=60)
    for _ in range(3):
        with pytest.raises(ModelUnavailableError, match="disk on fire"):
            await cache.get("fraud", "1")
    assert attempts == 1


def test_the_serving_table_is_read_from_toml(tmp_path: Any) -> None:
    path = tmp_path / "serving.toml"
    path.write_text('[models.fraud]\nversion = "2"\n[models.minilm]\nversion = 1\n')
    assert load_serving_table(path) == {"fraud": "2", "minilm": "1"}
    path.write_text("[models.fraud]\nrevision = 2\n")
    with pytest.raises(ConfigurationError, match=r"models\.fraud"):
        load_serving_table(path)
    with pytest.raises(ConfigurationError):
        load_serving_table(tmp_path / "missing.toml")
