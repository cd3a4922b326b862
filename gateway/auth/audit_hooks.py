"""What the gateway writes to the audit trail (`request.app.state.audit`): admin actions
(`audit_action`) and refused credentials, rate-limited by `RefusalBudget`. Recording never
blocks nor raises, so a broken audit topic cannot refuse calls.
What is recorded and why: docs/audit.md ("What is recorded", "Writing: `tidegate.clients.audit`").
"""

from __future__ import annotations

import asyncio
import json
import logging
from collections.abc import Callable, Coroutine
from typing import Any

from fastapi import Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import Response
from fastapi.routing import APIRoute

from tidegate.clients.audit import DENIED, FAILURE, SUCCESS, AuditTrail
from tidegate.core.errors import TidegateError
from tidegate.gateway import http_metrics as metrics
from tidegate.gateway.auth.client_budget import ClientBudget
from tidegate.gateway.auth.identity import ANONYMOUS, Identity, Permission
from tidegate.gateway.problems import error_problem, validation_problem

__all__ = [
    "AUDITED",
    "PERMISSION_KEY",
    "RefusalBudget",
    "answered",
    "audit_action",
    "audit_auth_failure",
    "audit_denied",
    "client_address",
    "outcome_of",
    "start_trail",
]

_log = logging.getLogger(__name__)

PERMISSION_KEY = "x-tidegate-permission"
"""Where a route's `openapi_extra` declares its permission (`tidegate.gateway.auth.permissions`)."""

AUDITED = frozenset({Permission.DEPLOY, Permission.ADMIN})
"""Routes needing these permissions are admin actions, each recorded."""


def _trail(request: Request) -> AuditTrail | None:
    trail: AuditTrail | None = getattr(request.app.state, "audit", None)
    return trail


def client_address(request: Request) -> str | None:
    """The client's host (what a rate limit counts an anonymous caller by)."""
    return request.client.host if request.client is not None else None


def _source(request: Request) -> str | None:
    client = request.client
    return f"{client.host}:{client.port}" if client is not None else None


def outcome_of(status: int) -> str:
    if status < 400:
        return SUCCESS
    if status in (401, 403):
        return DENIED
    return FAILURE


class RefusalBudget:
    """How many refusal entries (`auth.failed`, `auth.denied`) the trail takes: at most
    `per_source` a second from one client host, and `overall` a second in all, a fixed window
    each (the `limits` library). Past either, an entry is dropped and counted
    (`tidegate_gateway_audit_refusals_dropped_total`): anonymous callers cannot flood the audit
    topic, nor crowd out the entries of admin actions that were allowed, which are never limited
    (a refused call of an admin route counts as a refusal)."""

    def __init__(self, per_source: int = 5, overall: int = 50) -> None:
        self._per_source = ClientBudget(per_source, "refusal entries")
        self._overall = ClientBudget(overall, "refusal entries")

    def take(self, action: str, source: str | None) -> bool:
        allowed = self._per_source.allows(source) and self._overall.allows(None)
        if not allowed:
            metrics.AUDIT_DROPPED.labels(action).inc()
        return allowed


_BUDGET = "audit_refusal_budget"


def _budget(request: Request) -> RefusalBudget:
    state = request.app.state
    budget: RefusalBudget | None = getattr(state, _BUDGET, None)
    if budget is None:
        budget = RefusalBudget()
        setattr(state, _BUDGET, budget)
    return budget


def audit_auth_failure(request: Request, reason: str) -> None:
    trail = _trail(request)
    if trail is None or not _budget(request).take("auth.failed", client_address(request)):
        return
    trail.record(
        "auth.failed",
        actor=ANONYMOUS.subject,
        outcome=DENIED,
        source=_source(request),
        target=request.url.path,
        details={"reason": reason, "method": request.method},
    )


def audit_denied(
    request: Request, identity: Identity, needed: Permission, model: str | None
) -> None:
    trail = _trail(request)
    if trail is None or not _budget(request).take("auth.denied", client_address(request)):
        return
    details = {
        "permission": needed.value,
        "method": request.method,
        "roles": ",".join(identity.roles),
    }
    if model is not None:
        details["model"] = model
    trail.record(
        "auth.denied",
        actor=identity.subject,
        outcome=DENIED,
        source=_source(request),
        target=request.url.path,
        details=details,
    )


def _target(request: Request) -> str | None:
    params = request.path_params
    model = params.get("name") or params.get("model")
    version = params.get("version")
    if version is None:
        # The body FastAPI already read for the route (Starlette caches it on the request).
        body = getattr(request, "_body", None)
        if body:
            try:
                parsed: Any = json.loads(body)
            except ValueError:
                parsed = None
            if isinstance(parsed, dict) and isinstance(parsed.get("version"), str):
                version = parsed["version"]
    if model is None:
        return params.get("run_id") or None
    return f"{model}@{version}" if version else str(model)


def audit_action(request: Request, action: str, status: int) -> None:
    """Record one call of an admin route, after it answered `status`."""
    trail = _trail(request)
    if trail is None:
        return
    outcome = outcome_of(status)
    # A refused call of an admin route is a refusal like the others: limited, counted.
    if outcome == DENIED and not _budget(request).take(action, client_address(request)):
        return
    identity: Identity = getattr(request.state, "identity", ANONYMOUS)
    trail.record(
        action,
        actor=identity.subject,
        outcome=outcome,
        source=_source(request),
        target=_target(request),
        details={"status": str(status), "method": request.method, "path": request.url.path},
    )


async def start_trail(trail: AuditTrail | None) -> None:
    """Start a trail that needs starting (`KafkaAuditTrail` looks its schema up in the registry).
    One that cannot start is logged as an error, and each entry it then loses is logged and
    counted by the trail: the gateway keeps serving rather than turn a broken audit topic into
    an outage of inference."""
    start = getattr(trail, "start", None)
    if start is None:
        return
    try:
        await asyncio.to_thread(start)
    except Exception as exc:  # the registry or Kafka: whatever it is, inference goes on
        _log.error("the audit trail could not start, entries will be lost: %s", exc)


def answered(
    route: APIRoute, handler: Callable[[Request], Coroutine[Any, Any, Response]], area: str
) -> Callable[[Request], Coroutine[Any, Any, Response]]:
    """`handler` with errors answered as problems and, for admin actions, audited as
    `<area>.<route name>`."""
    declared = (route.openapi_extra or {}).get(PERMISSION_KEY)
    audited = declared is not None and Permission(declared) in AUDITED
    action = f"{area}.{route.name}"

    async def guarded_handler(request: Request) -> Response:
        try:
            response = await handler(request)
        except TidegateError as exc:
            response = error_problem(exc, instance=request.url.path)
        except RequestValidationError as exc:
            response = validation_problem(exc, instance=request.url.path)
        except Exception:
            if audited:
                audit_action(request, action, 500)
            raise
        if audited:
            audit_action(request, action, response.status_code)
        return response

    return guarded_handler
