"""Shadow runs (`ShadowRunner`): a candidate version computes on the very inputs the primary served,
and the two outputs are compared and published to the shadow topic, never returned to anyone.
A shadow neither delays nor changes a primary result.
How: docs/lifecycle.md ("Rollout").
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any, Protocol

import numpy as np
import numpy.typing as npt

from tidegate.agents import worker_metrics as metrics
from tidegate.agents.inference.compare import Kind, compare, compared_outputs
from tidegate.agents.inference.loaded import LoadedModel
from tidegate.core.aio import cancel_and_wait
from tidegate.core.errors import InvalidInputError, ModelExecutionError, RetriableError
from tidegate.core.telemetry import get_logger

__all__ = ["CandidateSource", "Publish", "ShadowJob", "ShadowRequest", "ShadowRunner"]

log = get_logger(__name__)

Arrays = dict[str, npt.NDArray[Any]]
Publish = Callable[[dict[str, Any]], None]
"""Hand one ShadowComparison record to Kafka (fire and forget; the producer retries)."""


class _RowCountError(ModelExecutionError):
    """The candidate gave a different number of rows than it was given."""


# Errors about the call, not about one input: bisecting would only repeat them.
_WHOLE_CALL_ERRORS = (_RowCountError, RetriableError, InvalidInputError)


class CandidateSource(Protocol):
    """Loaded versions only: a shadow never triggers a load (`VersionManager` is one)."""

    def peek(self, model: str, version: str) -> LoadedModel | None: ...


@dataclass(slots=True, eq=False)
class ShadowRequest:
    request_id: str
    inputs: Mapping[str, npt.NDArray[Any]]
    rows: int
    primary: Arrays
    """Every output of the primary, this request's rows only."""


@dataclass(slots=True, eq=False)
class ShadowJob:
    """The requests of one primary sub-batch that are sampled for one candidate."""

    model: str
    primary_version: str
    candidate: str
    kind: Kind
    primary_ms: float
    requests: list[ShadowRequest]


@dataclass(slots=True, eq=False)
class _Outcome:
    request: ShadowRequest
    outputs: Arrays | None
    error: str | None
    compute_ms: float


class ShadowRunner:
    def __init__(
        self, models: CandidateSource, publish: Publish, *, worker_id: str, max_in_flight: int
    ) -> None:
        self._models = models
        self._publish = publish
        self._worker_id = worker_id
        self._max = max_in_flight
        self._tasks: set[asyncio.Task[None]] = set()

    @property
    def in_flight(self) -> int:
        return len(self._tasks)

    def submit(self, jobs: Iterable[ShadowJob]) -> None:
        """Start the jobs that fit; never waits and never raises."""
        loop = asyncio.get_running_loop()
        for job in jobs:
            if len(self._tasks) >= self._max:
                skipped = metrics.SHADOW_SKIPPED.labels(job.model, job.candidate, "full")
                skipped.inc(len(job.requests))
                continue
            task = loop.create_task(self._run(job), name=f"shadow-{job.model}-{job.candidate}")
            self._tasks.add(task)
            task.add_done_callback(self._tasks.discard)

    async def stop(self) -> None:
        """Abandon the running comparisons (they are samples; none is owed to anyone)."""
        await cancel_and_wait(list(self._tasks))

    async def _run(self, job: ShadowJob) -> None:
        # The first step of this task was scheduled before the results it follows were handed
        # to their waiting deliveries; yielding once puts the candidate behind those deliveries.
        await asyncio.sleep(0)
        candidate = self._models.peek(job.model, job.candidate)
        if candidate is None:
            skipped = metrics.SHADOW_SKIPPED.labels(job.model, job.candidate, "cold")
            skipped.inc(len(job.requests))
            return
        try:
            outcomes = await self._infer(candidate, job.requests)
            for outcome in outcomes:
                self._publish(self._record(job, outcome))
            metrics.SHADOW_COMPARED.labels(job.model, job.candidate).inc(len(outcomes))
        except Exception:
            log.exception("shadow run of %s version %s failed", job.model, job.candidate)

    async def _infer(self, candidate: LoadedModel, requests: list[ShadowRequest]) -> list[_Outcome]:
        if len(requests) == 1:
            inputs = dict(requests[0].inputs)
        else:
            names = requests[0].inputs.keys()
            inputs = {n: np.concatenate([r.inputs[n] for r in requests]) for n in names}
        rows = sum(r.rows for r in requests)
        started = time.perf_counter()
        try:
            outputs = await candidate.runtime.infer(inputs)
            bad = [n for n, a in outputs.items() if a.ndim == 0 or a.shape[0] != rows]
            if bad:
                raise _RowCountError(f"output {bad[0]!r} does not have {rows} rows")
        except Exception as exc:
            compute_ms = (time.perf_counter() - started) * 1000.0
            if len(requests) == 1 or isinstance(exc, _WHOLE_CALL_ERRORS):
                error = f"{type(exc).__name__}: {exc}"
                return [_Outcome(r, None, error, compute_ms) for r in requests]
            half = len(requests) // 2
            first = await self._infer(candidate, requests[:half])
            return first + await self._infer(candidate, requests[half:])
        compute_ms = (time.perf_counter() - started) * 1000.0
        outcomes, start = [], 0
        for request in requests:
            stop = start + request.rows
            mine = {name: array[start:stop] for name, array in outputs.items()}
            outcomes.append(_Outcome(request, mine, None, compute_ms))
            start = stop
        return outcomes

    def _record(self, job: ShadowJob, outcome: _Outcome) -> dict[str, Any]:
        """A `dev.tidegate.lifecycle.ShadowComparison` record."""
        request = outcome.request
        record: dict[str, Any] = {
            "model": job.model,
            "primary_version": job.primary_version,
            "candidate_version": job.candidate,
            "request_id": request.request_id,
            "kind": job.kind,
            "rows": request.rows,
            "agree_rows": None,
            "abs_diff_sum": 0.0,
            "values": 0,
            "cosine_sum": None,
            "primary_ms": job.primary_ms,
            "candidate_ms": outcome.compute_ms,
            "candidate_error": outcome.error,
            "worker_id": self._worker_id,
            "compared_at": datetime.now(UTC),
        }
        if outcome.outputs is None:
            return record
        names = compared_outputs(request.primary, outcome.outputs)
        try:
            found = compare(job.kind, request.primary, outcome.outputs, names)
        except ValueError as exc:
            record["candidate_error"] = f"not comparable: {exc}"
            return record
        record.update(
            agree_rows=found.agree_rows,
            abs_diff_sum=found.abs_diff_sum,
            values=found.values,
            cosine_sum=found.cosine_sum,
        )
        return record
