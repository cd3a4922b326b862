"""`/admin/dlq`: the dead-letter queue over HTTP (`install_dlq`), the same operations and JSON views
as `tidegate dlq ...`; a redrive runs as a background job (`RedriveJob`) of this replica. Every
route needs `admin` and is audited.
The routes, the jobs and their errors: docs/dlq.md ("The HTTP API").
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator, Callable, Coroutine
from dataclasses import dataclass, field
from datetime import datetime
from typing import Annotated, Any

from confluent_kafka.schema_registry import SchemaRegistryClient
from fastapi import APIRouter, Depends, FastAPI, Path, Query, Request
from fastapi.responses import JSONResponse, Response
from fastapi.routing import APIRoute
from pydantic import BaseModel, ConfigDict, Field

from tidegate.core.errors import InvalidInputError, InvalidTransitionError
from tidegate.core.settings import KafkaSettings, SchemaRegistrySettings, TopicSettings
from tidegate.dlq.inspect import dead_letter_topics, find_letter, letter_stats, list_letters
from tidegate.dlq.letters import LetterFilter, letter_view
from tidegate.dlq.redrive import Redrive, redrive_source
from tidegate.dlq.redrive_report import (
    DEFAULT_RATE,
    MAX_RATE,
    RedriveOptions,
    RedriveReport,
    new_run_id,
)
from tidegate.gateway.auth.audit_hooks import answered
from tidegate.gateway.auth.identity import Permission
from tidegate.gateway.auth.permissions import guarded
from tidegate.gateway.http_errors import RequestNotFoundError
from tidegate.lifecycle.domain.parse import parse_at

__all__ = [
    "DeadLetterNotFoundError",
    "DlqService",
    "RedriveBody",
    "RedriveJob",
    "install_dlq",
    "router",
]

_KEPT_JOBS = 50


class DeadLetterNotFoundError(RequestNotFoundError):
    """No dead letter at that position, or no redrive job of that id in this replica."""

    code = "DEAD_LETTER_NOT_FOUND"


class _DlqRoute(APIRoute):
    """Answers errors as problems within the router, whichever app mounts it (as /admin's), and
    writes every call to the audit trail: each needs `admin`."""

    def get_route_handler(self) -> Callable[[Request], Coroutine[Any, Any, Response]]:
        return answered(self, super().get_route_handler(), "dlq")


@dataclass
class RedriveJob:
    redrive: Redrive
    task: asyncio.Task[RedriveReport]

    def view(self, *, outcomes: bool = False) -> dict[str, Any]:
        report = self.redrive.report
        if not self.task.done():
            state = "stopping" if self.redrive.stopping else "running"
        elif self.task.cancelled():
            state = "stopped"
        elif self.task.exception() is not None:
            state = "failed"
        else:
            state = "stopped" if report.stopped else "done"
        view = {"state": state, **report.view(outcomes=outcomes and self.task.done())}
        if state == "failed":
            exc = self.task.exception()
            view["error"] = {"message": str(exc), "code": getattr(exc, "code", "INTERNAL")}
        return view


@dataclass
class DlqService:
    """What the routes read and run with: the gateway's settings, and this replica's jobs."""

    kafka: KafkaSettings
    topics: TopicSettings
    registry: SchemaRegistrySettings | SchemaRegistryClient
    jobs: dict[str, RedriveJob] = field(default_factory=dict)

    def start(self, options: RedriveOptions) -> RedriveJob:
        current = self.jobs.get(options.run_id)
        if current is not None and not current.task.done():
            raise InvalidTransitionError(f"redrive {options.run_id!r} is already running here")
        run = Redrive(self.kafka, self.topics, self.registry, options)
        job = RedriveJob(run, asyncio.create_task(run.run(), name=f"redrive-{options.run_id}"))
        job.task.add_done_callback(_consume_outcome)
        self.jobs.pop(options.run_id, None)
        self.jobs[options.run_id] = job
        for run_id in [r for r, j in self.jobs.items() if j.task.done()][:-_KEPT_JOBS]:
            del self.jobs[run_id]
        return job

    def job(self, run_id: str) -> RedriveJob:
        found = self.jobs.get(run_id)
        if found is None:
            raise DeadLetterNotFoundError(f"no redrive {run_id!r} in this gateway replica")
        return found

    async def stop_all(self) -> None:
        running = [j for j in self.jobs.values() if not j.task.done()]
        for job in running:
            job.redrive.stop()
        await asyncio.gather(*(j.task for j in running), return_exceptions=True)


def _consume_outcome(task: asyncio.Task[RedriveReport]) -> None:
    """The job view reports a failure; this only keeps asyncio from logging it as unretrieved."""
    if not task.cancelled():
        task.exception()


@contextlib.asynccontextmanager
async def _lifespan(app: FastAPI) -> AsyncIterator[None]:
    yield
    service: DlqService | None = getattr(app.state, "dlq", None)
    if service is not None:
        await service.stop_all()


router = APIRouter(prefix="/admin/dlq", route_class=_DlqRoute, tags=["dlq"], lifespan=_lifespan)
ADMIN = guarded(Permission.ADMIN)
"""Every dead-letter route needs `admin`: letters carry whole request payloads."""


def install_dlq(app: FastAPI, service: DlqService | None = None) -> None:
    """Mount /admin/dlq on `app`. Without `service`, the routes use the gateway replica's
    settings (`app.state.gateway.config`), else those of the environment."""
    if service is not None:
        app.state.dlq = service
    app.include_router(router)


def _service(request: Request) -> DlqService:
    state = request.app.state
    service: DlqService | None = getattr(state, "dlq", None)
    if service is None:
        runtime = getattr(state, "gateway", None)
        config = getattr(runtime, "config", None)
        if config is not None:
            service = DlqService(config.kafka, config.topics, config.registry)
        else:
            service = DlqService(KafkaSettings(), TopicSettings(), SchemaRegistrySettings())
        state.dlq = service
    return service


Service = Annotated[DlqService, Depends(_service)]


def _moment(value: str | None, name: str) -> datetime | None:
    if value is None:
        return None
    try:
        return parse_at(value)
    except ValueError as exc:
        raise InvalidInputError(str(exc), field=name) from None


class FilterParams(BaseModel):
    """The filters of the reads, as query parameters."""

    topic: str = "all"
    model: list[str] = Field(default_factory=list)
    version: list[str] = Field(default_factory=list)
    code: list[str] = Field(default_factory=list)
    since: str | None = None
    until: str | None = None

    def letters(self) -> LetterFilter:
        return LetterFilter.build(
            models=self.model,
            versions=self.version,
            codes=self.code,
            since=_moment(self.since, "since"),
            until=_moment(self.until, "until"),
        )


def _filters(
    topic: str = "all",
    model: Annotated[list[str] | None, Query()] = None,
    version: Annotated[list[str] | None, Query()] = None,
    code: Annotated[list[str] | None, Query()] = None,
    since: str | None = None,
    until: str | None = None,
) -> FilterParams:
    return FilterParams(
        topic=topic,
        model=model or [],
        version=version or [],
        code=code or [],
        since=since,
        until=until,
    )


Filters = Annotated[FilterParams, Depends(_filters)]


class RedriveBody(BaseModel):
    model_config = ConfigDict(extra="forbid")

    source: str = Field("failed", description="failed or poison (or either topic's name).")
    model: list[str] = Field(default_factory=list)
    version: list[str] = Field(default_factory=list)
    code: list[str] = Field(default_factory=list)
    since: str | None = None
    until: str | None = None
    rate: float = Field(DEFAULT_RATE, gt=0, le=MAX_RATE, description="Messages per second.")
    limit: int | None = Field(None, ge=1)
    dry_run: bool = False
    run_id: str | None = Field(None, max_length=100)
    resume: bool = False
    wait: bool = Field(False, description="Answer when the run ends, with its report.")


# -- reads ----------------------------------------------------------------------------------------


@router.get("/messages", **ADMIN)
async def messages(
    service: Service,
    filters: Filters,
    limit: Annotated[int, Query(ge=0, le=100_000)] = 100,
) -> dict[str, Any]:
    names = dead_letter_topics(service.topics, filters.topic)
    found, more = await list_letters(
        service.kafka, service.registry, names, filters.letters(), limit=limit or None
    )
    views = [letter_view(letter) for letter in found]
    return {"topics": names, "count": len(views), "truncated": more, "messages": views}


@router.get("/messages/{topic}/{partition}/{offset}", **ADMIN)
async def message(
    topic: str,
    partition: Annotated[int, Path(ge=0)],
    offset: Annotated[int, Path(ge=0)],
    service: Service,
) -> dict[str, Any]:
    dead_letter_topics(service.topics, topic)
    letter = await find_letter(service.kafka, service.registry, topic, partition, offset)
    if letter is None:
        raise DeadLetterNotFoundError(f"no dead letter at {topic}:{partition}:{offset}")
    return letter_view(letter, full=True)


@router.get("/stats", **ADMIN)
async def stats(service: Service, filters: Filters) -> dict[str, Any]:
    names = dead_letter_topics(service.topics, filters.topic)
    view = (await letter_stats(service.kafka, service.registry, names, filters.letters())).view()
    view["topics"] = names
    return view


# -- redrive --------------------------------------------------------------------------------------


@router.post("/redrive", **ADMIN)
async def start_redrive(body: RedriveBody, service: Service, request: Request) -> JSONResponse:
    if body.resume and body.run_id is None:
        raise InvalidInputError("resume needs the run_id of the run to resume", field="run_id")
    options = RedriveOptions(
        source=redrive_source(service.topics, body.source),
        letters=LetterFilter.build(
            models=body.model,
            versions=body.version,
            codes=body.code,
            since=_moment(body.since, "since"),
            until=_moment(body.until, "until"),
        ),
        run_id=body.run_id or new_run_id(),
        rate=body.rate,
        dry_run=body.dry_run,
        resume=body.resume,
        limit=body.limit,
    )
    job = service.start(options)
    if body.wait:
        await asyncio.wait([job.task])
        failure = None if job.task.cancelled() else job.task.exception()
        if failure is not None:
            raise failure
        return JSONResponse(job.view(outcomes=True))
    location = str(request.url_for("redrive_status", run_id=options.run_id).path)
    return JSONResponse(job.view(), status_code=202, headers={"Location": location})


@router.get("/redrive", **ADMIN)
async def redrive_jobs(service: Service) -> list[dict[str, Any]]:
    return [job.view() for job in service.jobs.values()]


@router.get("/redrive/{run_id}", name="redrive_status", **ADMIN)
async def redrive_status(run_id: str, service: Service, outcomes: bool = False) -> dict[str, Any]:
    return service.job(run_id).view(outcomes=outcomes)


@router.delete("/redrive/{run_id}", **ADMIN)
async def stop_redrive(run_id: str, service: Service) -> dict[str, Any]:
    job = service.job(run_id)
    job.redrive.stop()
    await asyncio.wait([job.task])
    return job.view()
