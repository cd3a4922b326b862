"""What the stages in front of the inference service share: the service's shape, and the routing
decision they need before it is taken (a cache key and a feature list belong to one version).

They route exactly as `InferenceService` does, over the same tables and the same warm versions,
so they agree with it unless a version is loaded or unloaded in between: each stage checks the
version the result names (the cache stores under it; enrichment retries a request whose served
version declares other features).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Protocol

from tidegate.agents.inference.version_manager import TableSource
from tidegate.agents.tasks.inference_task import InferenceTask
from tidegate.lifecycle.domain.routing import Decision
from tidegate.schemas.records import ResultRecord

__all__ = ["Ready", "Service", "pre_route"]


class Service(Protocol):
    """`InferenceService.process`: one result per task, in order."""

    async def process(
        self, tasks: Sequence[InferenceTask], waits_ms: Sequence[float]
    ) -> list[ResultRecord]: ...


class Ready(Protocol):
    """Whether this worker has a version warm (`InferenceService`'s `Versions.ready`)."""

    def ready(self, model: str, version: str) -> bool: ...


def pre_route(tables: TableSource, models: Ready, task: InferenceTask) -> Decision | None:
    """The version `InferenceService` would route `task` to; None when it would not compute it
    at all (rejected while decoding, unknown model or version): the service answers those."""
    if task.rejection is not None:
        return None
    table = tables.table(task.model)
    if table is None:
        return None
    request = task.request
    try:
        return table.route(
            tenant=request.get("tenant") or "default",
            key=request.get("routing_key") or task.request_id,
            requested=request.get("model_version"),
            ready=lambda version: models.ready(task.model, version),
        )
    except Exception:
        return None  # the service raises the same error and answers it
