"""Shadow runs: the comparison arithmetic against direct numpy, and the service hook that must
never delay or change a primary result."""

from __future__ import annotations

import asyncio
import math
import struct
from datetime import datetime
from typing import Any, cast

import numpy as np
import numpy.typing as npt
import pytest
from prometheus_client import REGISTRY

from tests.unit.agents.batching_support import Outbox
from tests.unit.agents.dataplane_support import (
    SIGNATURE,
    FakeRuntime,
    Reports,
    Tables,
    fraud_table,
    run,
    task,
    until,
)
from tidegate.agents.inference.batching import BatchQueue
from tidegate.agents.inference.compare import compare, guess_task, task_of
from tidegate.agents.inference.inference_service import InferenceService
from tidegate.agents.inference.loaded import LoadedModel, ModelCache
from tidegate.agents.inference.shadow import ShadowRunner
from tidegate.agents.inference.version_manager import VersionManager
from tidegate.agents.tasks.inference_task import InferenceTask
from tidegate.core.errors import ModelExecutionError
from tidegate.lifecycle.domain import events as ev
from tidegate.models.manifest import Manifest, ModelPackage
from tidegate.models.runtime.contract import Arrays, ModelRuntime
from tidegate.schemas.records import ResultRecord
from tidegate.schemas.signature import Signature, TensorSpec

Record = dict[str, Any]


# -- the arithmetic -----------------------------------------------------------------------------


def test_classifier_comparison_matches_numpy() -> None:
    rng = np.random.default_rng(7)
    p = rng.random((50, 3)).astype(np.float32)
    c = (p + rng.normal(0, 0.2, p.shape)).astype(np.float32)
    sp, sc = rng.random(50).astype(np.float32), rng.random(50).astype(np.float32)
    found = compare(
        "classifier",
        {"probabilities": p, "score": sp},
        {"probabilities": c, "score": sc},
        ["probabilities", "score"],
    )
    assert found.rows == 50
    assert found.agree_rows == int(np.sum(np.argmax(p, axis=1) == np.argmax(c, axis=1)))
    assert 0 < found.agree_rows < 50
    direct = np.abs(p.astype(np.float64) - c).sum() + np.abs(sp.astype(np.float64) - sc).sum()
    assert found.abs_diff_sum == pytest.approx(float(direct), rel=1e-12)
    assert found.values == 50 * 3 + 50
    assert found.cosine_sum is None


def test_embedding_comparison_matches_a_row_by_row_cosine() -> None:
    rng = np.random.default_rng(11)
    p = rng.normal(size=(20, 8)).astype(np.float32)
    c = (p + rng.normal(0, 0.5, p.shape)).astype(np.float32)
    c[3] = 0.0  # a zero vector agrees with nothing
    found = compare("embedding", {"embedding": p}, {"embedding": c}, ["embedding"])
    expected = 0.0
    for a, b in zip(p.astype(np.float64), c.astype(np.float64), strict=True):
        norms = math.sqrt(float(a @ a)) * math.sqrt(float(b @ b))
        expected += float(a @ b) / norms if norms else 0.0
    assert found.cosine_sum == pytest.approx(expected, rel=1e-9)
    assert found.abs_diff_sum == pytest.approx(float(np.abs(p.astype(np.float64) - c).sum()))
    assert (found.rows, found.values, found.agree_rows) == (20, 160, None)


def test_outputs_of_different_shapes_are_not_comparable() -> None:
    p, c = np.zeros((2, 3), np.float32), np.zeros((2, 4), np.float32)
    with pytest.raises(ValueError, match="probabilities"):
        compare("classifier", {"probabilities": p}, {"probabilities": c}, ["probabilities"])


def spec(name: str, shape: tuple[int, ...], datatype: str = "FP32") -> TensorSpec:
    return TensorSpec(name=name, datatype=datatype, shape=shape)


@pytest.mark.parametrize(
    ("output", "kind"),
    [
        (spec("probabilities", (-1, 2)), "classifier"),
        (spec("logits", (-1, 10)), "classifier"),
        (spec("sentence_embedding", (-1, 384)), "embedding"),
        (spec("score", (-1,)), "other"),
        (spec("probabilities", (-1, 1)), "other"),
    ],
)
def test_the_task_is_guessed_from_the_first_output(output: TensorSpec, kind: str) -> None:
    signature = Signature(inputs=(spec("x", (-1, 4)),), outputs=(output,))
    assert guess_task(signature) == kind


def test_the_manifest_task_wins_over_the_guess() -> None:
    signature = Signature(inputs=(spec("x", (-1, 4)),), outputs=(spec("y", (-1, 16)),))
    body = {
        "name": "m",
        "version": "1",
        "runtime": "onnx",
        "entrypoint": "model.onnx",
        "files": {"model.onnx": "0" * 64},
        "signature": signature,
    }
    assert task_of(Manifest.model_validate(body)) == "other"  # a manifest from before `task`
    assert task_of(Manifest.model_validate({**body, "task": "embedding"})) == "embedding"


# -- the service hook ---------------------------------------------------------------------------


class Candidate(ModelRuntime):
    """Disagrees with FakeRuntime("1") on rows whose second feature exceeds 2; fails on rows
    whose first feature is 7; waits for `gate` when one is set."""

    def __init__(self) -> None:
        self.calls: list[int] = []
        self.gate: asyncio.Event | None = None

    async def load(self, package: ModelPackage) -> None:
        """Nothing to load."""

    async def infer(self, inputs: Arrays) -> dict[str, npt.NDArray[Any]]:
        x = inputs["features"]
        self.calls.append(len(x))
        if self.gate is not None:
            await self.gate.wait()
        if (x[:, 0] == 7).any():
            raise ModelExecutionError("the candidate cannot take a 7")
        total = x.sum(axis=1, dtype=np.float32)
        flip = (x[:, 1] > 2).astype(np.float32) * 10
        probabilities = np.stack([total + flip, total + 1.5], axis=1).astype(np.float32)
        return {"probabilities": probabilities, "score": total * 0.5}


class Shadowed:
    """fraud 1 serves, fraud 2 (a `Candidate`) shadows every split request."""

    def __init__(self, *extra: ev.Payload, max_in_flight: int = 4, load_candidate: bool = True):
        self.primary = FakeRuntime("1")
        self.candidate = Candidate()
        self.records: list[Record] = []
        runtimes: dict[str, ModelRuntime] = {"1": self.primary, "2": self.candidate}

        async def loader(name: str, version: str) -> LoadedModel:
            if version == "2" and not load_candidate:
                raise OSError("not this time")
            return LoadedModel(name, version, SIGNATURE, runtimes[version], "classifier")

        self.tables = Tables(fraud_table(ev.ShadowStarted("2"), *extra))
        self.versions = VersionManager(
            ModelCache(loader), self.tables, Reports(), worker_id="w-test", max_loaded=8
        )
        self.runner = ShadowRunner(
            self.versions, self.records.append, worker_id="w-test", max_in_flight=max_in_flight
        )
        self.service = InferenceService(
            self.tables, self.versions, worker_id="w-test", shadow=self.runner
        )

    async def __aenter__(self) -> Shadowed:
        await self.versions.start(["fraud"])
        return self

    async def __aexit__(self, *_exc: object) -> None:
        await self.runner.stop()
        await self.versions.stop()

    async def records_for(self, count: int) -> list[Record]:
        await until(lambda: len(self.records) >= count)
        return self.records


def rows_task(rid: str, rows: list[list[float]], **options: Any) -> InferenceTask:
    flat = [v for row in rows for v in row]
    return task(rid, flat, shape=[len(rows), 4], **options)


def features(t: InferenceTask) -> npt.NDArray[np.float32]:
    data = t.request["inputs"][0]
    values = struct.unpack(f"<{len(data['data']) // 4}f", data["data"])
    return np.array(values, dtype=np.float32).reshape(data["shape"])


async def test_comparisons_match_a_direct_computation_of_both_versions() -> None:
    tasks = [
        rows_task("a", [[1, 1, 1, 1]]),
        rows_task("b", [[1, 3, 0, 0], [2, 2, 2, 2], [0, 5, 1, 1]]),
        rows_task("c", [[4, 0, 0, 1], [1, 9, 9, 9]]),
    ]
    async with Shadowed() as s:
        results = await run(s.service, tasks)
        records = await s.records_for(3)
    assert [r["status"] for r in results] == ["OK"] * 3
    by_id = {r["request_id"]: r for r in records}
    for t in tasks:
        x = features(t)
        p = await FakeRuntime("1").infer({"features": x})
        c = await Candidate().infer({"features": x})
        record = by_id[t.request_id]
        assert record["rows"] == len(x)
        assert record["agree_rows"] == int(
            np.sum(p["probabilities"].argmax(axis=1) == c["probabilities"].argmax(axis=1))
        )
        direct = sum(float(np.abs(p[n].astype(np.float64) - c[n]).sum()) for n in p)
        assert record["abs_diff_sum"] == pytest.approx(direct)
        assert record["values"] == sum(p[n].size for n in p)
        assert record["cosine_sum"] is None
        assert record["kind"] == "classifier"
        assert (record["model"], record["primary_version"]) == ("fraud", "1")
        assert record["candidate_version"] == "2"
        assert record["worker_id"] == "w-test"
        assert record["candidate_error"] is None
        assert record["primary_ms"] > 0
        assert record["candidate_ms"] > 0
        assert isinstance(record["compared_at"], datetime)
        assert record["compared_at"].tzinfo is not None
    assert by_id["b"]["agree_rows"] == 1  # rows 1 and 3 have a second feature above 2
    assert s.candidate.calls == [6], "the sampled requests ran as one candidate batch"


async def test_results_are_the_same_with_and_without_a_shadow() -> None:
    def batch() -> list[InferenceTask]:
        return [rows_task(f"r{i}", [[i, 3, 1, 0]]) for i in range(6)]

    async with Shadowed() as s:
        shadowed = await run(s.service, batch())
        await s.records_for(6)
        plain = InferenceService(Tables(fraud_table()), s.versions, worker_id="w-test")
        unshadowed = await run(plain, batch())
    assert len(s.records) == 6, "the plain service shadowed"
    for a, b in zip(shadowed, unshadowed, strict=True):
        assert (a["status"], a["model_version"], a["outputs"]) == (
            b["status"],
            b["model_version"],
            b["outputs"],
        )


async def test_a_shadow_starts_only_after_the_primary_results_are_handed_over() -> None:
    async with Shadowed() as s:
        s.candidate.gate = asyncio.Event()  # the candidate never finishes until the end
        outbox = Outbox()
        queue: BatchQueue[InferenceTask, ResultRecord] = BatchQueue(
            s.service.process, outbox, max_batch_size=4, max_batch_delay_ms=1
        )
        queue.start()
        seen_by_consumer: list[int] = []
        tasks = [rows_task(f"r{i}", [[1, 3, 1, 1]]) for i in range(4)]
        futures = [outbox.expect(task) for task in tasks]
        for task in tasks:
            queue.submit(task)
        for future in futures:
            future.add_done_callback(lambda _f: seen_by_consumer.append(len(s.candidate.calls)))
        results = await asyncio.wait_for(asyncio.gather(*futures), 2.0)
        assert [cast(ResultRecord, r)["status"] for r in results] == ["OK"] * 4
        assert seen_by_consumer == [0, 0, 0, 0], "the candidate ran before results were out"
        await until(lambda: s.candidate.calls)
        assert s.runner.in_flight == 1
        assert s.records == []
        more = await asyncio.wait_for(
            s.service.process([rows_task("late", [[1, 1, 1, 1]])], [0]), 2
        )
        assert more[0]["status"] == "OK", "a stuck candidate held up the primary"
        s.candidate.gate.set()
        await s.records_for(5)
        await queue.stop()


def skipped(reason: str) -> float:
    labels = {"model": "fraud", "candidate": "2", "reason": reason}
    return REGISTRY.get_sample_value("tidegate_worker_shadow_skipped_total", labels) or 0.0


async def test_shadow_runs_are_bounded_and_skips_are_counted() -> None:
    async with Shadowed(max_in_flight=1) as s:
        s.candidate.gate = asyncio.Event()
        before = skipped("full")
        await run(s.service, [rows_task("a", [[1, 1, 1, 1]]), rows_task("b", [[2, 1, 1, 1]])])
        await run(s.service, [rows_task(f"c{i}", [[1, 1, 1, 1]]) for i in range(3)])
        assert s.runner.in_flight == 1
        assert skipped("full") - before == 3
        s.candidate.gate.set()
        records = await s.records_for(2)
        assert sorted(r["request_id"] for r in records) == ["a", "b"]


async def test_a_failing_candidate_is_recorded_per_request_and_never_raised() -> None:
    tasks = [rows_task(f"r{i}", [[7 if i == 2 else 1, 1, 1, 1]]) for i in range(4)]
    async with Shadowed() as s:
        results = await run(s.service, tasks)
        records = await s.records_for(4)
    assert [r["status"] for r in results] == ["OK"] * 4
    errors = {r["request_id"]: r["candidate_error"] for r in records}
    assert errors.pop("r2") == "ModelExecutionError: the candidate cannot take a 7"
    assert set(errors.values()) == {None}, "a bad input blamed its batch-mates"
    failed = next(r for r in records if r["request_id"] == "r2")
    assert (failed["agree_rows"], failed["values"], failed["abs_diff_sum"]) == (None, 0, 0.0)


async def test_only_sampled_split_traffic_is_shadowed() -> None:
    pin = ev.RoutingRuleSet("acme", tenant="acme", version="1")
    async with Shadowed(ev.ShadowStarted("2", sample_rate=0.5), pin) as s:
        table = s.tables.table("fraud")
        assert table is not None
        split = [task(f"s{i}") for i in range(40)]
        others = [task("pinned", tenant="acme"), task("explicit", version="1")]
        results = await run(s.service, split + others)
        sampled = {t.request_id for t in split if table.shadow_targets(t.request_id, "1")}
        assert 5 < len(sampled) < 35
        await s.records_for(len(sampled))
        await asyncio.sleep(0.05)
    assert {r["routing_rule"] for r in results[-2:]} == {"pin:acme", "explicit-version"}
    assert {r["request_id"] for r in s.records} == sampled


async def test_a_candidate_not_loaded_here_is_skipped_not_loaded() -> None:
    async with Shadowed(load_candidate=False) as s:
        before = skipped("cold")
        results = await run(s.service, [task("a"), task("b")])
        await until(lambda: skipped("cold") - before == 2)
    assert [r["status"] for r in results] == ["OK", "OK"]
    assert s.records == []
    assert s.candidate.calls == []
