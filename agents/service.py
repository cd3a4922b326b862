"""The inference service: the one core that turns decoded requests into `InferenceResult` records.

For a batch (one partition's, in the worker) it answers without compute what needs none: requests
rejected while decoding, past their deadline, for unknown models or versions, or with inputs that do
not match the model signature. The rest is split by (model, version) — and by the shape of the
non-batch dimensions, which must agree to be stacked — and each sub-batch runs as one model call:
inputs concatenated along dim 0, outputs split back by each request's rows.

When a model call fails, the sub-batch is bisected until the failing requests are alone, so one bad
input never fails its batch-mates. Errors that are not about an input (the model is unavailable,
or it returned the wrong number of rows) fail the sub-batch at once, every member explicitly.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Hashable, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import numpy.typing as npt

from agents import metrics
from agents.loaded import LoadedModel, ModelCache
from agents.results import Timings, error_result, ok_result
from agents.serving import Resolution, ServingResolver
from agents.signature import validate_inputs
from agents.tasks import InferenceTask
from agents.tensors import from_numpy, to_numpy
from tidegate.errors import (
    DeadlineExceededError,
    InvalidInputError,
    ModelExecutionError,
    RetriableError,
    TidegateError,
)

__all__ = ["InferenceService", "RowCountError"]

Result = dict[str, Any]


class RowCountError(ModelExecutionError):
    """The model returned a different number of rows than it was given: no member can be trusted."""


@dataclass(slots=True, eq=False)
class _Member:
    index: int
    task: InferenceTask
    arrays: dict[str, npt.NDArray[Any]]
    rows: int
    outputs: tuple[str, ...]
    waited_ms: float
    rule: str


class InferenceService:
    def __init__(self, resolver: ServingResolver, models: ModelCache, *, worker_id: str) -> None:
        self.resolver = resolver
        self.models = models
        self.worker_id = worker_id

    async def start(self) -> dict[tuple[str, str], str]:
        """Load and warm up every serving version; returns the ones that failed, and why."""
        return await self.models.preload(self.resolver.serving())

    async def stop(self) -> None:
        await self.models.close()

    async def process(
        self, tasks: Sequence[InferenceTask], waits_ms: Sequence[float]
    ) -> list[Result]:
        """One result per task, in order."""
        results: list[Result | None] = [None] * len(tasks)
        groups: dict[Hashable, tuple[LoadedModel, list[_Member]]] = {}
        resolved: dict[tuple[str, str | None], Resolution | TidegateError] = {}
        now_ms = time.time() * 1000.0
        for index, (task, waited) in enumerate(zip(tasks, waits_ms, strict=True)):
            resolution: Resolution | None = None
            try:
                if task.rejection is not None:
                    raise task.rejection
                deadline = task.deadline_ms
                if deadline is not None and deadline <= now_ms:
                    raise DeadlineExceededError(
                        f"the deadline passed {now_ms - deadline:.0f} ms before compute"
                    )
                resolution = await self._resolve(task, resolved)
                model = await self.models.get(task.model, resolution.version)
                member = _member(index, task, model, waited, resolution.rule)
            except Exception as exc:
                version = resolution.version if resolution else None
                rule = resolution.rule if resolution else None
                results[index] = self._failed(task, exc, version, Timings(batch_ms=waited), rule)
                continue
            groups.setdefault(_group_key(model, member), (model, []))[1].append(member)
        await asyncio.gather(
            *(self._attempt(model, members, results) for model, members in groups.values())
        )
        return [r for r in results if r is not None]

    async def _resolve(
        self, task: InferenceTask, seen: dict[tuple[str, str | None], Resolution | TidegateError]
    ) -> Resolution:
        key = (task.model, task.request.get("model_version"))
        found = seen.get(key)
        if found is None:
            try:
                found = await self.resolver.resolve(*key)
            except TidegateError as exc:
                found = exc
            seen[key] = found
        if isinstance(found, TidegateError):
            raise found
        return found

    async def _attempt(
        self, model: LoadedModel, members: list[_Member], results: list[Result | None]
    ) -> None:
        for member in members:
            member.task.attempts += 1
        try:
            outputs, compute_ms = await self._infer(model, members)
        except (RowCountError, RetriableError) as exc:
            for member in members:
                results[member.index] = self._failed_member(model, member, exc, len(members))
            return
        except Exception as exc:
            if len(members) == 1:
                results[members[0].index] = self._failed_member(model, members[0], exc, 1)
                return
            half = len(members) // 2
            await self._attempt(model, members[:half], results)
            await self._attempt(model, members[half:], results)
            return
        start = 0
        for member in members:
            stop = start + member.rows
            tensors = [from_numpy(name, outputs[name][start:stop]) for name in member.outputs]
            start = stop
            timings = Timings(member.waited_ms, compute_ms, len(members))
            result = ok_result(
                member.task,
                tensors,
                version=model.version,
                timings=timings,
                worker_id=self.worker_id,
                rule=member.rule,
            )
            results[member.index] = self._observed(result)

    async def _infer(
        self, model: LoadedModel, members: list[_Member]
    ) -> tuple[dict[str, npt.NDArray[Any]], float]:
        if len(members) == 1:
            inputs = members[0].arrays
        else:
            names = members[0].arrays.keys()
            inputs = {n: np.concatenate([m.arrays[n] for m in members]) for n in names}
        rows = sum(m.rows for m in members)
        started = time.perf_counter()
        outputs = await model.runtime.infer(inputs)
        seconds = time.perf_counter() - started
        metrics.compute(model.name, model.version).observe(seconds)
        metrics.sub_batch_size(model.name, model.version).observe(len(members))
        for name, array in outputs.items():
            if array.ndim == 0 or array.shape[0] != rows:
                got = array.shape[0] if array.ndim else "no"
                raise RowCountError(f"output {name!r} has {got} rows for {rows} input rows")
        missing = {n for m in members for n in m.outputs} - outputs.keys()
        if missing:
            raise RowCountError(f"the model gave no output {sorted(missing)[0]!r}")
        return outputs, seconds * 1000.0

    def _failed_member(
        self, model: LoadedModel, member: _Member, exc: BaseException, size: int
    ) -> Result:
        if not isinstance(exc, TidegateError):
            exc = ModelExecutionError(f"{type(exc).__name__}: {exc}")
        timings = Timings(member.waited_ms, 0.0, size)
        return self._failed(member.task, exc, model.version, timings, member.rule)

    def _failed(
        self,
        task: InferenceTask,
        exc: BaseException,
        version: str | None,
        timings: Timings,
        rule: str | None,
    ) -> Result:
        result = error_result(
            task, exc, worker_id=self.worker_id, version=version, timings=timings, rule=rule
        )
        return self._observed(result)

    def _observed(self, result: Result) -> Result:
        model, version = result["model"], result["model_version"]
        if version is None and model not in self.resolver.table:
            model = "_unknown"  # names from requests must not grow the label set without bound
        metrics.requests(model, version or "", result["status"]).inc()
        metrics.end_to_end(model).observe(result["timings"]["total_ms"] / 1000.0)
        return result


def _member(
    index: int, task: InferenceTask, model: LoadedModel, waited: float, rule: str
) -> _Member:
    """Check a request against the model signature and gather what its sub-batch needs."""
    request = task.request
    validate_inputs(model.signature, request["inputs"])
    arrays = task.arrays if task.arrays is not None else {}
    if not arrays:
        arrays = {t["name"]: to_numpy(t) for t in request["inputs"]}
    sizes = {name: int(array.shape[0]) for name, array in arrays.items()}
    rows = next(iter(sizes.values()))
    for name, size in sizes.items():
        if size != rows:
            raise InvalidInputError(f"inputs disagree on the batch size: {sizes}", name)
    if rows == 0:
        raise InvalidInputError("the request has no rows", next(iter(sizes)))
    known = [spec.name for spec in model.signature.outputs]
    wanted = tuple(request.get("outputs") or known)
    for name in wanted:
        if name not in known:
            raise InvalidInputError(f"unknown output {name!r}; the model gives {known}", name)
    return _Member(index, task, arrays, rows, wanted, waited, rule)


def _group_key(model: LoadedModel, member: _Member) -> Hashable:
    if not model.batchable:
        return (model.name, model.version, member.index)
    shapes = tuple(sorted((name, a.shape[1:]) for name, a in member.arrays.items()))
    return (model.name, model.version, shapes)
