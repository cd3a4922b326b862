"""Where a request refused by an open circuit breaker goes: the model's declared fallback.

A refused request is moved to the fallback only when all of these hold: the model declares one
(`tidegate models fallback`), the caller did not refuse it (`parameters.fallback=false`) nor ask
for the refused version by name (a deliberate choice is not swapped for another model), and
the version the fallback's own routing table picks is loaded and warm on this worker with its
own breaker letting it through. One hop only: a fallback's fallback is never followed. Anything
else is answered with `refused_error`, a retriable UNAVAILABLE.
"""

from __future__ import annotations

from tidegate.agents.breakers.breaker_board import BreakerBoard
from tidegate.agents.inference.loaded import LoadedModel, Versions
from tidegate.agents.inference.version_manager import TableSource
from tidegate.agents.tasks.inference_task import InferenceTask
from tidegate.core.errors import ModelUnavailableError, TidegateError
from tidegate.lifecycle.domain.routing import EXPLICIT
from tidegate.schemas.requests import fallback_allowed

__all__ = ["FALLBACK_RULE", "allows_fallback", "fallback_for", "refused_error"]

FALLBACK_RULE = "fallback:breaker-open@{model}/{version}"
"""The routing rule of a result the fallback served, naming the version whose breaker was open."""


def allows_fallback(task: InferenceTask, rule: str) -> bool:
    """The caller's say (`parameters.fallback`, true unless false) and the routing's: a version
    asked for by name is never replaced."""
    if rule == EXPLICIT or rule.startswith("fallback:"):
        return False
    return fallback_allowed(task.request.get("parameters"))


async def fallback_for(
    board: BreakerBoard,
    tables: TableSource,
    models: Versions,
    model: LoadedModel,
    task: InferenceTask,
    rule: str = "",
) -> tuple[LoadedModel, str] | None:
    """The fallback's loaded version for a request `model`'s breaker refused, and the rule to
    record; None when the request may not or cannot fall back."""
    table = tables.table(model.name)
    name = table.fallback_model if table is not None else None
    if name is None or name == model.name or not allows_fallback(task, rule):
        return None
    target = tables.table(name)
    if target is None:
        return None
    request = task.request
    try:
        decision = target.route(
            tenant=request.get("tenant") or "default",
            key=request.get("routing_key") or task.request_id,
            ready=lambda version: models.ready(name, version),
        )
    except TidegateError:
        return None
    # Never a cold load for a fallback: it is there to answer at once.
    if not models.ready(name, decision.version) or not board.admit(name, decision.version, 1):
        return None
    loaded = await models.get(name, decision.version)
    return loaded, FALLBACK_RULE.format(model=model.name, version=model.version)


def refused_error(model: LoadedModel) -> ModelUnavailableError:
    return ModelUnavailableError(
        f"{model.name} version {model.version} is failing: its circuit breaker is open and no "
        "fallback served the request"
    )
