"""The inference service with fake runtimes: routing by the lifecycle's table, answers without
compute, sub-batching, bisection.

The routing tables are folded from lifecycle events (`tidegate.lifecycle.domain.state.fold`),
exactly as the worker's feed folds them; `lifecycle_table` and `Tables` are shared with the other
agent tests.
"""

from __future__ import annotations

import struct
import time
from collections import Counter
from typing import Any

import pytest

from tests.unit.agents.dataplane_support import (
    POISON,
    error_of,
    fraud_table,
    lifecycle_table,
    make_service,
    manager,
    registered,
    run,
    task,
)
from tidegate.agents.inference.loaded import LoadedModel, ModelCache
from tidegate.core.errors import (
    InvalidInputError,
    ModelUnavailableError,
)
from tidegate.lifecycle.domain import events as ev
from tidegate.lifecycle.domain.routing import EXPLICIT
from tidegate.schemas.requests import FALLBACK_OF


async def test_a_batch_runs_as_one_call_and_is_split_back_per_request() -> None:
    service, runtimes = make_service()
    results = await run(service, [task("a"), task("b", [1, 1, 1, 1]), task("c", [0, 0, 0, 2])])
    assert runtimes["1"].calls == [3]
    assert [r["status"] for r in results] == ["OK"] * 3
    a, _, c = results
    assert a["request_id"] == "a"
    assert a["model_version"] == "1"
    assert a["routing_rule"] == "split@7"  # the sequence of the table's last event
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
    assert error_of(bad)["field"] == "logits"


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
    assert error_of(bad)["code"] == "INVALID_INPUT"
    assert error_of(bad)["error_class"] == "InvalidInputError"
    assert error_of(bad)["field"] == field
    assert runtimes["1"].calls == [1]


async def test_unknown_models_and_versions_are_not_found_without_compute() -> None:
    service, runtimes = make_service(fraud_table(ev.Retired("2")))
    results = await run(
        service, [task("a", model="nope"), task("b", version="9"), task("c", version="2")]
    )
    assert [r["status"] for r in results] == ["NOT_FOUND"] * 3
    assert [r["model_version"] for r in results] == [None] * 3
    assert error_of(results[0])["code"] == "NOT_FOUND"
    assert "retired" in error_of(results[2])["message"]
    assert runtimes["1"].calls == []
    assert runtimes["2"].calls == []


async def test_a_model_with_no_version_taking_traffic_is_not_found() -> None:
    table = lifecycle_table("fraud", *registered("1"))  # validated, never promoted
    service, _ = make_service(table)
    (result,) = await run(service, [task("a")])
    assert result["status"] == "NOT_FOUND"
    (explicit,) = await run(service, [task("b", version="1")])
    assert explicit["status"] == "OK"
    assert explicit["routing_rule"] == EXPLICIT


async def test_an_explicit_version_is_honoured_and_sub_batched_apart() -> None:
    service, runtimes = make_service()
    results = await run(
        service, [task("a"), task("b", version="2"), task("c"), task("d", version="1")]
    )
    assert [r["model_version"] for r in results] == ["1", "2", "1", "1"]
    assert [r["routing_rule"] for r in results] == ["split@7", EXPLICIT, "split@7", EXPLICIT]
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
    assert error_of(late)["code"] == "DEADLINE_EXCEEDED"
    assert late["outputs"] == []
    assert timely["status"] == "OK"
    assert runtimes["1"].calls == [1]


async def test_a_request_whose_deadline_passes_during_the_call_is_not_computed() -> None:
    # A 200 ms model: a request with 50 ms left would be answered after its deadline, for
    # nobody; one with a minute left is computed.
    service, runtimes = make_service(compute_s=0.2)
    await run(service, [task("warm")])
    soon = time.time() * 1000.0 + 50
    later = time.time() * 1000.0 + 60_000
    late, timely = await run(
        service, [task("soon", deadline_ms=soon), task("ok", deadline_ms=later)]
    )
    assert late["status"] == "DEADLINE_EXCEEDED"
    assert "less than the model's recent call time" in error_of(late)["message"]
    assert timely["status"] == "OK"
    assert runtimes["1"].calls == [1, 1]


async def test_bisection_isolates_one_bad_input_among_eight() -> None:
    service, runtimes = make_service()
    tasks = [task(f"r{i}", [POISON if i == 5 else 1.0, 1, 1, 1]) for i in range(8)]
    results = await run(service, tasks)
    statuses = {r["request_id"]: r["status"] for r in results}
    assert statuses.pop("r5") == "ERROR"
    assert set(statuses.values()) == {"OK"}
    bad = results[5]
    assert error_of(bad)["code"] == "MODEL_ERROR"
    assert "-1" in error_of(bad)["message"]
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
    assert all("rows" in error_of(r)["message"] for r in results)
    assert runtimes["1"].calls == [4]


async def test_an_unavailable_model_answers_unavailable_without_bisecting() -> None:
    service, runtimes = make_service(unavailable=True)
    results = await run(service, [task(f"r{i}") for i in range(4)])
    assert [r["status"] for r in results] == ["UNAVAILABLE"] * 4
    assert error_of(results[0])["retriable"] is True
    assert runtimes["1"].calls == [4]


async def test_a_rejected_request_is_invalid_and_its_batch_mates_are_served() -> None:
    service, runtimes = make_service()
    rejected = task("bad")
    rejected.rejection = InvalidInputError("tensor 'features' needs 16 bytes, got 3", "features")
    results = await run(service, [rejected, task("good")])
    assert [r["status"] for r in results] == ["INVALID", "OK"]
    assert error_of(results[0])["field"] == "features"
    assert runtimes["1"].calls == [1]


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


async def test_the_split_is_sticky_per_routing_key_and_follows_the_weights() -> None:
    service, runtimes = make_service(fraud_table(ev.TrafficShifted({"1": 70, "2": 30})))
    await manager(service).start(["fraud"])  # both are wanted: loaded before any request
    keys = [f"card-{i}" for i in range(400)]
    first = await run(service, [task(f"a{i}", key=k) for i, k in enumerate(keys)])
    again = await run(service, [task(f"b{i}", key=k) for i, k in enumerate(keys)])
    assert {r["status"] for r in first + again} == {"OK"}
    served = [r["model_version"] for r in first]
    assert served == [r["model_version"] for r in again], "a key changed version"
    share = Counter(served)["2"] / len(served)
    assert 0.24 < share < 0.36, share
    assert {r["routing_rule"] for r in first} == {"split@8"}
    assert runtimes["2"].calls, "version 2 never served"
    await manager(service).stop()


async def test_no_routing_key_routes_by_request_id() -> None:
    service, _ = make_service(fraud_table(ev.TrafficShifted({"1": 50, "2": 50})))
    await manager(service).start(["fraud"])
    ids = [f"r{i}" for i in range(60)]
    first = await run(service, [task(rid, key="") for rid in ids])
    again = await run(service, [task(rid, key="") for rid in ids])
    assert [r["model_version"] for r in first] == [r["model_version"] for r in again]
    assert {r["model_version"] for r in first} == {"1", "2"}
    await manager(service).stop()


async def test_a_tenant_pin_overrides_the_split_and_others_are_unaffected() -> None:
    pin = ev.RoutingRuleSet("acme-on-2", tenant="acme", version="2")
    service, _ = make_service(fraud_table(pin))
    pinned, other = await run(service, [task("a", tenant="acme"), task("b", tenant="zeta")])
    assert (pinned["model_version"], pinned["routing_rule"]) == ("2", "pin:acme-on-2")
    assert (other["model_version"], other["routing_rule"]) == ("1", "split@8")


async def test_split_traffic_never_reaches_a_version_this_worker_has_not_warmed() -> None:
    # Another worker reported 2 warm, so the table gives it weight; this worker's load of 2
    # failed, so its share falls back to the primary here.
    table = fraud_table(ev.TrafficShifted({"1": 50, "2": 50}))
    service, runtimes = make_service(table, broken={"2"})
    failures = await manager(service).start(["fraud"])
    assert list(failures) == [("fraud", "2")]
    assert not service.models.ready("fraud", "2")
    results = await run(service, [task(f"r{i}", key=f"k{i}") for i in range(40)])
    assert {r["model_version"] for r in results} == {"1"}
    assert {r["routing_rule"] for r in results} == {"split@8", "warming-fallback@8"}
    assert runtimes["2"].calls == []
    await manager(service).stop()


async def test_a_request_a_gateway_diverted_to_this_model_says_so_in_its_rule() -> None:
    service, runtimes = make_service()
    diverted = task("a")
    diverted.request["parameters"] = {FALLBACK_OF: "overloaded@fraud-heavy"}
    results = await run(service, [diverted, task("b")])
    assert [r["routing_rule"] for r in results] == ["fallback:overloaded@fraud-heavy", "split@7"]
    assert [r["status"] for r in results] == ["OK", "OK"]
    assert runtimes["1"].calls == [2]  # the mark changes the rule, not the batch
