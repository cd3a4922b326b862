"""The model lifecycle end to end: real workers, controller and PostgreSQL, the real fraud models,
operated through the `tidegate models` CLI. Each test registers the fraud packages under a model
name of its own, so the tests' lifecycles never meet."""

from __future__ import annotations

import asyncio
import re
import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from datetime import datetime
from typing import Any

import httpx
import numpy as np
import onnxruntime as ort
import pytest

from tests.e2e.conftest import Pipeline
from tests.support import unique, wait_for
from tidegate.clients.loadgen import KafkaLoad, LoadResult
from tidegate.core.settings import TopicSettings
from tidegate.models.model_settings import ModelSettings
from tidegate.schemas.tensors import from_numpy

RNG = np.random.default_rng(11)


def _session(version: str) -> ort.InferenceSession:
    from tidegate.models.store import LocalArtifactStore

    package = asyncio.run(LocalArtifactStore(ModelSettings()).fetch("fraud", version))
    return ort.InferenceSession(
        str(package.path(package.manifest.entrypoint)), providers=["CPUExecutionProvider"]
    )


@contextmanager
def _load(pipeline: Pipeline) -> Iterator[KafkaLoad]:
    topics = pipeline.topics
    load = KafkaLoad(TopicSettings(requests=topics["requests"], results=topics["results"]),
                     keep_records=True)  # fmt: skip
    load.start(lambda i: _record("fraud", f"warm-{unique('w')}", RNG.normal(size=64), i))
    with load:
        yield load


def _record(model: str, request_id: str, row: Any, i: int) -> dict[str, Any]:
    features = np.asarray([row], dtype=np.float32)
    return {
        "request_id": request_id,
        "model": model,
        "routing_key": f"card-{i}",
        "inputs": [from_numpy("features", features)],
    }


def _traffic(model: str, rows: np.ndarray, run: str) -> Callable[[int], dict[str, Any]]:
    return lambda i: _record(model, f"{run}-{i}", rows[i % len(rows)], i)


def _setup(pipeline: Pipeline, prefix: str, *versions: str) -> str:
    """A fresh model named after `prefix`, with the fraud versions given, the first promoted and
    warm on both workers."""
    model = unique(prefix)
    for version in versions:
        pipeline.register(f"fraud/{version}", model, version)
    pipeline.cli("models", "promote", model, versions[0])
    _wait_loaded(pipeline, model, versions[0])
    return model


def _status(pipeline: Pipeline, model: str) -> dict[str, Any]:
    found = pipeline.cli("models", "status", model)
    assert isinstance(found, dict)
    return found


def _wait_loaded(pipeline: Pipeline, model: str, version: str) -> None:
    workers = set(pipeline.metrics_ports)

    def loaded() -> bool:
        versions = _status(pipeline, model)["versions"]
        return any(v["version"] == version and workers <= set(v["loaded_on"]) for v in versions)

    wait_for(loaded, timeout=120, interval=0.5, what=f"{model} {version} loaded on {workers}")


def _history(pipeline: Pipeline, model: str) -> list[dict[str, Any]]:
    found = pipeline.cli("models", "history", model)
    assert isinstance(found, list)
    return found


def _cold_loads(pipeline: Pipeline, model: str) -> float:
    """Requests that waited on a load of any version of `model`, over every worker."""
    total = 0.0
    pattern = re.compile(
        rf'^tidegate_worker_cold_loads_total\{{model="{re.escape(model)}".*\}} (\S+)$'
    )
    for port in pipeline.metrics_ports.values():
        text = httpx.get(f"http://127.0.0.1:{port}/metrics", timeout=10).text
        total += sum(float(m.group(1)) for line in text.splitlines() if (m := pattern.match(line)))
    return total


def _answered(result: LoadResult) -> None:
    assert result.lost == 0, f"{result.lost} of {result.sent} requests got no result"
    assert len(result.records) == result.sent


def test_shadow_stats_of_v2_match_a_direct_comparison_with_v1(pipeline: Pipeline) -> None:
    model = _setup(pipeline, "shadow", "1", "2")
    pipeline.cli("models", "shadow", model, "2", "--rate", "1.0")
    _wait_loaded(pipeline, model, "2")
    rows = RNG.normal(size=(300, 64)).astype(np.float32)
    with _load(pipeline) as load:
        result = load.run("shadow", _traffic(model, rows, unique("s")), rate=150, count=len(rows))
    _answered(result)
    assert {r["model_version"] for r in result.records} == {"1"}, (
        "a shadow's outputs are never returned"
    )

    def compared() -> dict[str, Any] | None:
        found = pipeline.cli("models", "compare", model, "--candidate", "2")
        assert isinstance(found, dict)
        return found if found["stats"]["samples"] >= len(rows) else None

    stats = wait_for(compared, timeout=60, interval=1, what="every shadow comparison")["stats"]
    v1 = _session("1").run(None, {"features": rows})[0]
    v2 = _session("2").run(None, {"features": rows})[0]
    assert stats["samples"] == len(rows)
    assert stats["rows"] == len(rows)
    assert stats["agreement"] == pytest.approx(
        float(np.mean(v1.argmax(1) == v2.argmax(1))), abs=1e-12
    )
    assert stats["mean_abs_diff"] == pytest.approx(float(np.mean(np.abs(v1 - v2))), rel=1e-5)
    assert stats["candidate_errors"] == 0
    assert stats["primary_p99_ms"] is not None
    assert stats["candidate_p99_ms"] is not None


def test_a_faulty_canary_rolls_back_by_itself_and_no_request_is_lost(pipeline: Pipeline) -> None:
    model = _setup(pipeline, "canary", "1", "3")
    pipeline.cli("models", "canary", model, "3", "--steps", "10,50,100", "--dwell", "5",
                 "--max-error-rate", "0.05", "--min-requests", "20")  # fmt: skip
    rows = RNG.normal(size=(400, 64)).astype(np.float32)
    results: list[LoadResult] = []

    def rolled_back() -> dict[str, Any] | None:
        return next((e for e in _history(pipeline, model) if e["type"] == "RolledBack"), None)

    with _load(pipeline) as load:
        event = None
        for chunk in range(30):
            traffic = _traffic(model, rows, unique(f"c{chunk}"))
            results.append(load.run(f"canary-{chunk}", traffic, rate=100, count=200))
            if (event := rolled_back()) is not None:
                break
        assert event is not None, "the controller never rolled the faulty canary back"
        after = load.run("after", _traffic(model, rows, unique("after")), rate=100, count=200)

    for result in [*results, after]:
        _answered(result)
    served_by_3 = [r for res in results for r in res.records if r["model_version"] == "3"]
    assert served_by_3, "the canary never got traffic"
    assert any(r["status"] != "OK" for r in served_by_3), "fraud 3 should fail some inputs"
    payload = event["payload"]
    assert payload["to_version"] == "1"
    assert payload["metrics"]["candidate_error_rate"] > 0.05
    assert payload["metrics"]["candidate_requests"] >= 20
    assert event["actor"] != "test"
    state = _status(pipeline, model)
    assert (state["primary"], state["canary"], state["weights"]) == ("1", None, {"1": 100})
    assert {r["model_version"] for r in after.records} == {"1"}
    assert {r["status"] for r in after.records} == {"OK"}


def test_a_promotion_under_load_never_makes_a_request_wait_on_a_model_load(
    pipeline: Pipeline,
) -> None:
    model = _setup(pipeline, "warm", "1", "2")
    rows = RNG.normal(size=(200, 64)).astype(np.float32)
    before = _cold_loads(pipeline, model)
    with _load(pipeline) as load:
        box: list[LoadResult] = []
        runner = threading.Thread(
            target=lambda: box.append(
                load.run("promotion", _traffic(model, rows, unique("p")), rate=100, count=1200)
            )
        )
        runner.start()
        wait_for(lambda: len(load._due) > 0, timeout=10, what="traffic to start")
        promoted = pipeline.cli("models", "promote", model, "2", "--force")
        runner.join(120)
        assert box, "the load run did not finish"
    result = box[0]
    _answered(result)
    assert {r["status"] for r in result.records} == {"OK"}
    versions = [r["model_version"] for r in sorted(result.records, key=lambda r: r["completed_at"])]
    assert versions[0] == "1"
    assert versions[-1] == "2", "the promoted version never took traffic"
    assert _cold_loads(pipeline, model) == before, "a request waited on a model load"
    assert isinstance(promoted, dict)
    assert promoted["events"][0]["payload"]["forced"] is True
    loaded = [e for e in _history(pipeline, model) if e["type"] == "VersionLoaded"
              and e["payload"]["version"] == "2"]  # fmt: skip
    assert {e["payload"]["worker_id"] for e in loaded} == set(pipeline.metrics_ports)


def test_served_and_state_at_answer_for_requests_before_and_after_a_promotion(
    pipeline: Pipeline,
) -> None:
    model = _setup(pipeline, "lineage", "1", "2")
    rows = RNG.normal(size=(1, 64)).astype(np.float32)
    with _load(pipeline) as load:
        first = load.run("before", _traffic(model, rows, unique("a")), rate=10, count=1)
        pipeline.cli("models", "promote", model, "2", "--force")
        _wait_loaded(pipeline, model, "2")
        second = load.run("after", _traffic(model, rows, unique("b")), rate=10, count=1)
    a, b = first.records[0], second.records[0]
    assert (a["model_version"], b["model_version"]) == ("1", "2")

    for record, version in ((a, "1"), (b, "2")):

        def served(record: dict[str, Any] = record) -> Any:
            return pipeline.lookup("served", record["request_id"])

        found = wait_for(served, timeout=60, interval=1, what=f"{record['request_id']} indexed")
        request = found["request"]
        assert request["version"] == version
        assert request["worker_id"] == record["worker_id"]
        assert request["routing_rule"] == record["routing_rule"]
        assert request["routing_rule"].startswith("split@")
        assert found["state"]["primary"] == version
        assert f"split@{found['table']['sequence']}" == request["routing_rule"]
        assert found["lineage"]["version"] == version
        assert found["lineage"]["sha256"]
        at = _iso(record["completed_at"])
        then = pipeline.cli("models", "state", model, "--at", at)
        assert isinstance(then, dict)
        assert then["table"]["primary"] == version
        assert then["table"]["weights"] == {version: 100}
        assert f"split@{then['table']['sequence']}" == request["routing_rule"]


def _iso(moment: datetime) -> str:
    return moment.isoformat()


def test_served_shows_the_request_schema_id_its_source_and_a_replay_that_produced_it(
    pipeline: Pipeline,
) -> None:
    model = _setup(pipeline, "replayed", "1", "2")
    rows = RNG.normal(size=(1, 64)).astype(np.float32)
    with _load(pipeline) as load:
        served = load.run("live", _traffic(model, rows, unique("r")), rate=10, count=1)
    record = served.records[0]
    request_id = record["request_id"]

    def indexed() -> Any:
        found = pipeline.lookup("served", request_id)
        assert found is None or isinstance(found, dict), found
        return found

    request = wait_for(indexed, timeout=60, interval=1, what="the result indexed")["request"]
    assert (request["version"], request["routing_rule"]) == ("1", record["routing_rule"])
    assert request["request_schema_id"] == record["request_schema_id"] > 0
    assert request["source"] == record["source"]
    assert request["source"]["topic"] == pipeline.topics["requests"]
    assert request["history"] == []

    # Replayed on version 2 into the live results topic (asked for explicitly): the index then
    # shows the replay's result, with the replay in its history.
    summary = pipeline.cli(
        "replay", "--request-id", request_id, "--model", model, "--version", "2",
        "--to-topic", pipeline.topics["results"], "--live", "--no-progress",
    )  # fmt: skip
    assert isinstance(summary, dict)
    run_id = summary["run_id"]

    def replayed() -> Any:
        found = indexed()
        return found if found and found["request"]["history"] else None

    again = wait_for(replayed, timeout=60, interval=1, what="the replay indexed")["request"]
    assert again["version"] == "2"
    assert again["routing_rule"] == "replay:version"
    assert [(s["kind"], s["id"]) for s in again["history"]] == [("replay", run_id)]
    assert again["history"][0]["from"] == record["source"]
    assert again["request_schema_id"] == record["request_schema_id"]
    assert again["request_digest"] == record["request_digest"]
    assert not again.get("conflicts")
