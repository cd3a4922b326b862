"""The inference service (`InferenceService`): the one core that turns decoded requests into
`InferenceResult` records: routing, answers that need no compute, one model call per version and
shape, bisection of failing batches, breakers and fallbacks, shadows.
How a batch is served: docs/worker.md ("The inference service").
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable, Hashable, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import numpy.typing as npt
from opentelemetry.trace import Tracer

from tidegate.agents import worker_metrics as metrics
from tidegate.agents.breakers.breaker_board import BreakerBoard
from tidegate.agents.inference.breaker_guard import fallback_for, refused_error
from tidegate.agents.inference.loaded import LoadedModel, Versions
from tidegate.agents.inference.result_builders import Timings, error_result, ok_result
from tidegate.agents.inference.shadow import ShadowJob, ShadowRequest, ShadowRunner
from tidegate.agents.inference.signature_checks import SignatureChecks
from tidegate.agents.inference.version_manager import TableSource
from tidegate.agents.tasks.inference_task import InferenceTask
from tidegate.agents.tasks.worker_tracing import compute_span
from tidegate.core.errors import (
    DeadlineExceededError,
    InvalidInputError,
    ModelExecutionError,
    ModelNotFoundError,
    ModelTimeoutError,
    RetriableError,
    TidegateError,
)
from tidegate.lifecycle.domain.routing import Decision
from tidegate.schemas.records import ResultRecord
from tidegate.schemas.requests import diverted_from
from tidegate.schemas.tensors import from_numpy, to_numpy

__all__ = [
    "NOT_BEFORE",
    "SHADOWED_RULES",
    "InferenceService",
    "RowCountError",
]

# Only requests the traffic split served are shadowed: pinned and explicit ones are someone's
# deliberate choice, not a sample of live traffic.
SHADOWED_RULES = ("split@", "warming-fallback@")
NOT_BEFORE = "retry_not_before_ms"
"""The error detail of a request refused by an open breaker: when the breaker lets probes
through again (epoch ms), so a retry is not spent before then."""
# (successes, model failures, failures isolated alone by bisection, client errors) of a call.
_Outcome = tuple[int, int, int, int]


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
    shadows: tuple[str, ...] = ()


class InferenceService:
    def __init__(
        self,
        tables: TableSource,
        models: Versions,
        *,
        worker_id: str,
        shadow: ShadowRunner | None = None,
        tracer: Tracer | None = None,
        timeout_s: Callable[[str], float] | None = None,
        breakers: BreakerBoard | None = None,
    ) -> None:
        self.tables = tables
        self.models = models
        self.worker_id = worker_id
        self.shadow = shadow
        # Each model call is a span when tracing is on (under the worker's batch span).
        self.tracer = tracer
        # A model's batch timeout (the failure policy's); None: no timeout.
        self.timeout_s = timeout_s
        self.breakers = breakers
        self._checks = SignatureChecks()
        # Recent model-call time per model (a moving average, ms): a request whose deadline
        # passes before a call would finish is answered now rather than computed for nobody.
        self._compute_ms: dict[str, float] = {}

    async def process(
        self, tasks: Sequence[InferenceTask], waits_ms: Sequence[float]
    ) -> list[ResultRecord]:
        """One result per task, in order."""
        results: list[ResultRecord | None] = [None] * len(tasks)
        groups: dict[Hashable, tuple[LoadedModel, list[_Member]]] = {}
        loaded: dict[tuple[str, str], LoadedModel] = {}
        now_ms = time.time() * 1000.0
        for index, (task, waited) in enumerate(zip(tasks, waits_ms, strict=True)):
            decision: Decision | None = None
            try:
                if task.rejection is not None:
                    raise task.rejection
                deadline = task.deadline_ms
                if deadline is not None and deadline <= now_ms + self._compute_ms.get(
                    task.model, 0.0
                ):
                    raise DeadlineExceededError(_too_late(now_ms, deadline))
                decision, shadows = self._route(task)
                # A batch holds one model, mostly one version: look each up once.
                name = (task.model, decision.version)
                model = loaded.get(name) or await self.models.get(*name)
                loaded[name] = model
                member = _member(index, task, model, waited, decision.rule, self._checks)
                member.shadows = shadows
            except Exception as exc:
                version = decision.version if decision else None
                rule = decision.rule if decision else None
                results[index] = self._failed(task, exc, version, Timings(batch_ms=waited), rule)
                continue
            groups.setdefault(_group_key(model, member), (model, []))[1].append(member)
        if self.breakers is not None:
            groups = await self._guard(self.breakers, groups, results)
        jobs: list[ShadowJob] = []
        if len(groups) == 1:
            (model, members), *_ = groups.values()
            await self._call(model, members, results, jobs)
        elif groups:
            await asyncio.gather(
                *(self._call(m, members, results, jobs) for m, members in groups.values())
            )
        if jobs and self.shadow is not None:
            self.shadow.submit(jobs)
        done = [r for r in results if r is not None]
        self._observe(done)
        return done

    def _route(self, task: InferenceTask) -> tuple[Decision, tuple[str, ...]]:
        """The version that serves the request, why, and the shadow versions it is copied to."""
        table = self.tables.table(task.model)
        if table is None:
            raise ModelNotFoundError(f"model {task.model!r} is not served")
        request = task.request
        decision = table.route(
            tenant=request.get("tenant") or "default",
            key=request.get("routing_key") or task.request_id,
            requested=request.get("model_version"),
            ready=lambda version: self.models.ready(task.model, version),
        )
        diverted = diverted_from(request.get("parameters"))
        if diverted is not None:
            # A gateway sent it here instead of its own model: the result says so.
            decision = Decision(decision.version, f"fallback:{diverted}")
        shadows: tuple[str, ...] = ()
        if table.shadows and decision.rule.startswith(SHADOWED_RULES):
            shadows = tuple(table.shadow_targets(task.request_id, decision.version))
        return decision, shadows

    async def _guard(
        self,
        board: BreakerBoard,
        groups: dict[Hashable, tuple[LoadedModel, list[_Member]]],
        results: list[ResultRecord | None],
    ) -> dict[Hashable, tuple[LoadedModel, list[_Member]]]:
        """The groups each version's breaker lets run; the refused members go to the fallback's
        groups, or are answered. Per request only for refused members, which run nothing."""
        out: dict[Hashable, tuple[LoadedModel, list[_Member]]] = {}
        refused: list[tuple[LoadedModel, _Member]] = []
        for key, (model, members) in groups.items():
            allowed = board.admit(model.name, model.version, len(members))
            if allowed:
                out[key] = (model, members[:allowed])
            refused.extend((model, m) for m in members[allowed:])
        for model, member in refused:
            found = await fallback_for(
                board, self.tables, self.models, model, member.task, member.rule
            )
            moved = None
            if found is not None:
                target, rule = found
                try:
                    moved = _member(
                        member.index, member.task, target, member.waited_ms, rule, self._checks
                    )
                except TidegateError:
                    moved = None  # the fallback cannot take this request: the breaker answers
            if moved is None:
                result = self._failed_member(model, member, refused_error(model), 0)
                reopens = board.reopens_at_ms(model.name, model.version)
                error = result.get("error")
                if error is not None:
                    error["details"] = {NOT_BEFORE: str(reopens), "breaker": "open"}
                results[member.index] = result
                continue
            metrics.FALLBACKS.labels(model.name, target.name, "breaker-open").inc()
            out.setdefault(_group_key(target, moved), (target, []))[1].append(moved)
        return out

    async def _call(
        self,
        model: LoadedModel,
        members: list[_Member],
        results: list[ResultRecord | None],
        jobs: list[ShadowJob],
    ) -> None:
        """Run one group and tell its version's breaker how the calls went."""
        ok, failed, isolated, client = await self._attempt(model, members, results, jobs)
        if self.breakers is None:
            return
        # A request that failed alone while its batch-mates succeeded failed on its input, not
        # on the model; when nothing succeeded, the model is what fails.
        if ok:
            self.breakers.record(model.name, model.version, ok, failed, isolated + client)
        else:
            self.breakers.record(model.name, model.version, 0, failed + isolated, client)

    async def _attempt(
        self,
        model: LoadedModel,
        members: list[_Member],
        results: list[ResultRecord | None],
        jobs: list[ShadowJob],
    ) -> _Outcome:
        for member in members:
            member.task.attempts += 1
        try:
            outputs, compute_ms = await self._infer(model, members)
        except (RowCountError, RetriableError) as exc:
            for member in members:
                results[member.index] = self._failed_member(model, member, exc, len(members))
            if isinstance(exc, ModelTimeoutError) and len(members) > 1:
                # One hanging input times out its whole batch: one call failed for sure, the
                # rest are unknown until they run alone (`_timed_out_before`).
                return 0, 1, 0, len(members) - 1
            return 0, len(members), 0, 0
        except Exception as exc:
            if len(members) == 1:
                results[members[0].index] = self._failed_member(model, members[0], exc, 1)
                if isinstance(exc, InvalidInputError | DeadlineExceededError):
                    return 0, 0, 0, 1
                return 0, 0, 1, 0
            half = len(members) // 2
            first = await self._attempt(model, members[:half], results, jobs)
            second = await self._attempt(model, members[half:], results, jobs)
            return (
                first[0] + second[0],
                first[1] + second[1],
                first[2] + second[2],
                first[3] + second[3],
            )
        if any(member.shadows for member in members):
            jobs.extend(_shadow_jobs(model, members, outputs, compute_ms))
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
            if model.name != member.task.model:
                result["model"] = model.name  # a fallback answered: say which model did
            results[member.index] = result
        return len(members), 0, 0, 0

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
        if self.tracer is None:
            outputs = await self._run(model, inputs)
        else:
            with compute_span(self.tracer, model.name, model.version, rows, len(members)):
                outputs = await self._run(model, inputs)
        seconds = time.perf_counter() - started
        recent = self._compute_ms.get(model.name)
        ms = seconds * 1000.0
        self._compute_ms[model.name] = ms if recent is None else 0.8 * recent + 0.2 * ms
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

    async def _run(
        self, model: LoadedModel, inputs: dict[str, npt.NDArray[Any]]
    ) -> dict[str, npt.NDArray[Any]]:
        if self.timeout_s is None:
            return await model.runtime.infer(inputs)
        limit = self.timeout_s(model.name)
        try:
            return await asyncio.wait_for(model.runtime.infer(inputs), limit)
        except TimeoutError:
            # The call may still hold the runtime's thread: the runtime gets a fresh one, so
            # the version's next batches do not queue behind a call that never returns.
            model.runtime.abandon()
            metrics.MODEL_TIMEOUTS.labels(model.name, model.version).inc()
            raise ModelTimeoutError(
                f"{model.name} version {model.version} ran past its {limit:.3g} s timeout"
            ) from None

    def _failed_member(
        self, model: LoadedModel, member: _Member, exc: BaseException, size: int
    ) -> ResultRecord:
        if not isinstance(exc, TidegateError):
            exc = ModelExecutionError(f"{type(exc).__name__}: {exc}")
        timings = Timings(member.waited_ms, 0.0, size)
        result = self._failed(member.task, exc, model.version, timings, member.rule)
        if model.name != member.task.model:
            result["model"] = model.name
        return result

    def _failed(
        self,
        task: InferenceTask,
        exc: BaseException,
        version: str | None,
        timings: Timings,
        rule: str | None,
    ) -> ResultRecord:
        return error_result(
            task, exc, worker_id=self.worker_id, version=version, timings=timings, rule=rule
        )

    def _observe(self, results: list[ResultRecord]) -> None:
        """The batch's metrics: one increment per (model, version, status) it holds."""
        counts: dict[tuple[str, str, str], int] = {}
        seconds: dict[str, list[float]] = {}
        for result in results:
            model, version = result["model"], result["model_version"]
            if version is None and self.tables.table(model) is None:
                model = "_unknown"  # names from requests must not grow the label set unbounded
            label: tuple[str, str, str] = (model, version or "", result["status"])
            counts[label] = counts.get(label, 0) + 1
            seconds.setdefault(model, []).append(result["timings"]["total_ms"] / 1000.0)
        for label, count in counts.items():
            metrics.requests(*label).inc(count)
        for model, amounts in seconds.items():
            metrics.observe_all(metrics.end_to_end(model), amounts)


def _member(
    index: int,
    task: InferenceTask,
    model: LoadedModel,
    waited: float,
    rule: str,
    checks: SignatureChecks,
) -> _Member:
    """Check a request against the model signature and gather what its sub-batch needs."""
    request = task.request
    wanted = checks.outputs(model, request)
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
    return _Member(index, task, arrays, rows, wanted, waited, rule)


def _shadow_jobs(
    model: LoadedModel,
    members: list[_Member],
    outputs: dict[str, npt.NDArray[Any]],
    compute_ms: float,
) -> list[ShadowJob]:
    """One job per candidate, with the sampled members' inputs and their rows of every output."""
    jobs: dict[str, ShadowJob] = {}
    start = 0
    for member in members:
        stop = start + member.rows
        for candidate in member.shadows:
            job = jobs.get(candidate)
            if job is None:
                job = ShadowJob(model.name, model.version, candidate, model.task, compute_ms, [])
                jobs[candidate] = job
            primary = {name: array[start:stop] for name, array in outputs.items()}
            job.requests.append(
                ShadowRequest(member.task.request_id, member.arrays, member.rows, primary)
            )
        start = stop
    return list(jobs.values())


def _group_key(model: LoadedModel, member: _Member) -> Hashable:
    if not model.batchable or _timed_out_before(member.task):
        return (model.name, model.version, member.index)
    shapes = tuple(sorted((name, a.shape[1:]) for name, a in member.arrays.items()))
    return (model.name, model.version, shapes)


def _timed_out_before(task: InferenceTask) -> bool:
    """A request retried after a timeout runs alone: whichever input of its batch hung the model,
    it cannot time out the same batch-mates again."""
    lineage = task.lineage
    if lineage is None:
        return False
    for step in reversed(lineage.history):
        if step.get("kind") in ("redrive", "replay"):
            return False  # a fresh start after a fix: batched like any request
        if step.get("reason") == ModelTimeoutError.code:
            return True
    return False


def _too_late(now_ms: float, deadline_ms: float) -> str:
    if deadline_ms <= now_ms:
        return f"the deadline passed {now_ms - deadline_ms:.0f} ms before compute"
    return (
        f"the deadline is {deadline_ms - now_ms:.0f} ms away, less than the model's recent "
        "call time: it would pass before the answer"
    )
