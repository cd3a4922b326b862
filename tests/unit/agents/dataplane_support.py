"""The agents' and the gateway's unit tests' shared fakes and builders: a fake runtime,
lifecycle states and routing tables, an inference service over them, and its tasks."""

from __future__ import annotations

import asyncio
import struct
import time
from collections.abc import Callable, Collection
from typing import Any

import numpy as np
import numpy.typing as npt

from tests.support import eventually
from tests.unit.lifecycle_events import recorded, registered_and_validated
from tidegate.agents.inference.inference_service import InferenceService
from tidegate.agents.inference.loaded import LoadedModel, ModelCache
from tidegate.agents.inference.version_manager import VersionManager
from tidegate.agents.tasks.inference_task import InferenceTask
from tidegate.core.errors import (
    ModelExecutionError,
    ModelNotFoundError,
    ModelUnavailableError,
)
from tidegate.lifecycle.domain import events as ev
from tidegate.lifecycle.domain.routing import RoutingTable
from tidegate.lifecycle.domain.state import ModelState, fold
from tidegate.models.manifest import ModelPackage
from tidegate.models.runtime.contract import Arrays, ModelRuntime
from tidegate.schemas.records import ErrorRecord, RequestRecord, ResultRecord
from tidegate.schemas.signature import Signature, TensorSpec

__all__ = [
    "POISON",
    "SIGNATURE",
    "FakeRuntime",
    "Reports",
    "Tables",
    "error_of",
    "fraud_table",
    "lifecycle_state",
    "lifecycle_table",
    "make_service",
    "manager",
    "registered",
    "run",
    "task",
    "until",
]


SIGNATURE = Signature(
    inputs=(TensorSpec(name="features", datatype="FP32", shape=(-1, 4)),),
    outputs=(
        TensorSpec(name="probabilities", datatype="FP32", shape=(-1, 2)),
        TensorSpec(name="score", datatype="FP32", shape=(-1,)),
    ),
)


POISON = -1.0  # a first feature of -1 makes FakeRuntime fail the whole call


class FakeRuntime(ModelRuntime):
    def __init__(
        self,
        version: str,
        *,
        drop_row: bool = False,
        unavailable: bool = False,
        compute_s: float = 0.0,
    ) -> None:
        self.version = version
        self.calls: list[int] = []
        self.drop_row = drop_row
        self.unavailable = unavailable
        self.compute_s = compute_s

    async def load(self, package: ModelPackage) -> None:
        """Nothing to load."""

    async def infer(self, inputs: Arrays) -> dict[str, npt.NDArray[Any]]:
        x = inputs["features"]
        self.calls.append(len(x))
        if self.compute_s:
            await asyncio.sleep(self.compute_s)  # the model's own compute time
        if self.unavailable:
            raise ModelUnavailableError("unloading")
        if (x[:, 0] == POISON).any():
            raise ModelExecutionError("the model cannot take a -1")
        rows = x[:-1] if self.drop_row else x
        total = rows.sum(axis=1, dtype=np.float32)
        probabilities = np.stack([total, total + float(self.version)], axis=1)
        return {"probabilities": probabilities.astype(np.float32), "score": total}


def registered(
    *versions: str, loaded_on: str | None = "w-other", **registration: str
) -> list[ev.Payload]:
    """Register and validate each version; report it warm on another worker. `registration`:
    the `signature_json` and `runtime` the versions are registered with."""
    return registered_and_validated(*versions, loaded_on=loaded_on, **registration)


def lifecycle_state(model: str, *payloads: ev.Payload) -> ModelState:
    return fold(model, recorded(model, list(payloads)))


def lifecycle_table(model: str, *payloads: ev.Payload) -> RoutingTable:
    return RoutingTable.from_state(lifecycle_state(model, *payloads))


def fraud_table(*extra: ev.Payload) -> RoutingTable:
    """fraud 1 (primary) and 2 (validated, no traffic), then `extra`."""
    return lifecycle_table("fraud", *registered("1", "2"), ev.Promoted("1"), *extra)


class Tables:
    """The routing tables of a `LifecycleFeed`, set by the test."""

    def __init__(self, *tables: RoutingTable) -> None:
        self.tables = {t.model: t for t in tables}

    def table(self, model: str) -> RoutingTable | None:
        return self.tables.get(model)


class Reports:
    """Collects what a VersionManager appends to the lifecycle log."""

    def __init__(self) -> None:
        self.events: list[tuple[str, ev.Payload]] = []

    async def __call__(self, stream: str, events: Any) -> None:
        self.events.extend((stream, e.payload) for e in events)

    def of(self, kind: type[ev.Payload]) -> list[ev.Payload]:
        return [p for _, p in self.events if isinstance(p, kind)]


def make_service(
    table: RoutingTable | None = None, *, broken: Collection[str] = (), **runtime_options: Any
) -> tuple[InferenceService, dict[str, FakeRuntime]]:
    """fraud versions 1 and 2 on fake runtimes; loading a `broken` version fails."""
    runtimes = {v: FakeRuntime(v, **runtime_options) for v in ("1", "2")}

    async def loader(name: str, version: str) -> LoadedModel:
        if name != "fraud" or version not in runtimes:
            raise ModelNotFoundError(f"no {name} {version}")
        if version in broken:
            raise OSError(f"{name} {version} is corrupt")
        return LoadedModel(name, version, SIGNATURE, runtimes[version])

    tables = Tables(table or fraud_table())
    versions = VersionManager(
        ModelCache(loader), tables, Reports(), worker_id="w-test", max_loaded=8
    )
    return InferenceService(tables, versions, worker_id="w-test"), runtimes


def manager(service: InferenceService) -> VersionManager:
    assert isinstance(service.models, VersionManager)
    return service.models


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
    tenant: str = "t1",
    key: str | None = None,
) -> InferenceTask:
    values = features if features is not None else [1.0, 2.0, 3.0, 4.0]
    request: RequestRecord = {
        "request_id": rid,
        "model": model,
        "model_version": version,
        "tenant": tenant,
        "routing_key": key if key is not None else f"key-{rid}",
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
        # timestamp-millis are whole milliseconds.
        "deadline": None if deadline_ms is None else int(deadline_ms),
        "created_at": int(time.time() * 1000.0) - 5,
        "reply_to": None,
    }
    return InferenceTask(request, source={"topic": "req", "partition": 3, "offset": 42})


async def until(probe: Callable[[], object], limit_s: float = 5.0) -> None:
    """Poll `probe` on the event loop until it is truthy; fail after `limit_s`. Every 5 ms: the
    fakes here answer within a few turns of the loop."""
    await eventually(probe, timeout=limit_s, interval=0.005)


async def run(service: InferenceService, tasks: list[InferenceTask]) -> list[ResultRecord]:
    return await service.process(tasks, [1.5] * len(tasks))


def error_of(result: ResultRecord) -> ErrorRecord:
    """The error of a result that must carry one."""
    error = result.get("error")
    assert error is not None, f"result {result['request_id']} carries no error"
    return error
