"""`/admin`: the model lifecycle commands over HTTP, as JSON (`install_admin`), the same
`LifecycleCommands` and views as `tidegate models ...`. The actor is always the authenticated
identity (`request_actor`), never a header a caller writes.
The routes, their permissions and their errors: docs/lifecycle.md ("Processes").
"""

from __future__ import annotations

from collections.abc import Callable, Coroutine
from contextlib import AbstractAsyncContextManager
from pathlib import Path
from typing import Annotated, Any

import psycopg
from fastapi import APIRouter, Depends, FastAPI, Request
from fastapi.responses import JSONResponse, Response
from fastapi.routing import APIRoute
from pydantic import BaseModel, ConfigDict, Field

from tidegate.core.errors import (
    ConfigurationError,
    InvalidInputError,
    InvalidTransitionError,
    LifecycleUnavailableError,
    ModelNotFoundError,
    PermissionDeniedError,
)
from tidegate.core.pool_names import check_pool
from tidegate.gateway.admin.dlq_api import install_dlq
from tidegate.gateway.auth.audit_hooks import answered, audit_denied
from tidegate.gateway.auth.identity import Permission
from tidegate.gateway.auth.permissions import guarded, request_identity
from tidegate.gateway.gateway_services import GatewayConfig, GatewayServices
from tidegate.lifecycle.domain.parse import parse_at
from tidegate.lifecycle.domain.render import event_view, iso, state_view, summary_view, table_view
from tidegate.lifecycle.domain.routing import RoutingTable
from tidegate.lifecycle.operations.commands import LifecycleCommands
from tidegate.lifecycle.operations.sessions import command_session

__all__ = [
    "AdminFactory",
    "AdminRoute",
    "install_admin",
    "lifecycle_admin",
    "request_actor",
    "router",
]


class AdminRoute(APIRoute):
    """Answers errors as problems within the router, so /admin behaves the same whichever app
    mounts it, and writes each call of a `deploy` or `admin` route to the audit trail."""

    def get_route_handler(self) -> Callable[[Request], Coroutine[Any, Any, Response]]:
        return answered(self, _storable(super().get_route_handler()), "lifecycle")


def _storable(
    handler: Callable[[Request], Coroutine[Any, Any, Response]],
) -> Callable[[Request], Coroutine[Any, Any, Response]]:
    """A value PostgreSQL cannot hold or compare (a NUL character in a model name, a tenant or
    a request id) is the caller's invalid input: 400, not the 500 of an unexpected error."""

    async def handle(request: Request) -> Response:
        try:
            return await handler(request)
        except psycopg.DataError as exc:
            raise InvalidInputError(f"a value PostgreSQL cannot hold: {exc}") from None

    return handle


router = APIRouter(prefix="/admin", route_class=AdminRoute, tags=["admin"])


def request_actor(request: Request) -> str:
    """Who acts: the subject of the identity the route's permission check authenticated
    (`key:<id>`, `jwt:<issuer>/<sub>`, `local:insecure`). An `X-Tidegate-Actor` header is
    ignored: a caller never names who it is recorded as."""
    return request_identity(request).subject


def _commands(request: Request) -> LifecycleCommands:
    commands: LifecycleCommands | None = getattr(request.app.state, "admin_commands", None)
    if commands is None:
        raise LifecycleUnavailableError("the lifecycle commands are not started yet")
    return commands


def install_admin(app: FastAPI, commands: LifecycleCommands | None = None) -> None:
    """Mount /admin on `app`. It serves `app.state.admin_commands`: `commands` if given (their
    owner starts and stops them), else what the app's lifespan sets there."""
    if commands is not None:
        app.state.admin_commands = commands
    app.include_router(router)
    install_dlq(app)


AdminFactory = Callable[[GatewayConfig], AbstractAsyncContextManager[LifecycleCommands]]
"""What `create_app(admin=...)` takes: opens the commands for the app's lifetime."""


def lifecycle_admin(config: GatewayConfig) -> AbstractAsyncContextManager[LifecycleCommands]:
    """The real commands: the event store in the gateway's PostgreSQL, publishing through
    the outbox to the gateway's Kafka, the artifact store of TIDEGATE_MODELS_*, and
    TIDEGATE_LIFECYCLE_*.

    The pool opens without waiting for PostgreSQL: the V2 inference path does not need the
    event store, so its absence makes /admin answer 503, not the gateway fail to start.
    """
    return command_session(
        write=True,
        kafka=config.kafka,
        topics=config.topics,
        registry=config.registry,
        postgres=config.postgres,
        wait_for_store=False,
    )


Commands = Annotated[LifecycleCommands, Depends(_commands)]
Actor = Annotated[str, Depends(request_actor)]


class _Body(BaseModel):
    model_config = ConfigDict(extra="forbid")

    expected_sequence: int | None = Field(
        None, ge=0, description="Act only if the model is still at this sequence (else 409)."
    )


class RegisterBody(_Body):
    path: str = Field(description="A package directory on the gateway's host.")
    version: str | None = None


class ShadowBody(_Body):
    version: str
    sample_rate: float = Field(1.0, gt=0, le=1)
    stop: bool = False


class CanaryBody(_Body):
    version: str
    steps: list[int] | None = None
    dwell_s: float | None = None
    thresholds: dict[str, float] = Field(default_factory=dict)


class PromoteBody(_Body):
    version: str
    force: bool = False


class RollbackBody(_Body):
    version: str | None = None


class RetireBody(_Body):
    version: str


class PinBody(_Body):
    tenant: str
    version: str
    rule_id: str | None = None


class UnpinBody(_Body):
    rule_id: str


class FallbackBody(_Body):
    # None clears the fallback.
    fallback: str | None
    reason: str = "operator"


class PoolBody(_Body):
    # None places the model back in the default pool.
    pool: str | None = Field(description="The pool, declared first; null: the default pool.")
    reason: str = "operator"


class ExperimentBody(_Body):
    weights: dict[str, int]
    tenant: str | None = None
    rule_id: str | None = None


# -- reads ----------------------------------------------------------------------------------------


@router.get("/models", **guarded(Permission.READ))
async def list_models(commands: Commands, request: Request) -> list[dict[str, Any]]:
    """The models the caller may read: all of them, or those its grants name."""
    identity = request_identity(request)
    summaries = await commands.models()
    return [summary_view(s) for s in summaries if identity.allows(Permission.READ, s.model)]


@router.get("/models/{name}", **guarded(Permission.READ, model_from="name"))
async def status(name: str, commands: Commands) -> dict[str, Any]:
    return state_view(await commands.status(name))


@router.get("/models/{name}/history", **guarded(Permission.READ, model_from="name"))
async def history(name: str, commands: Commands) -> list[dict[str, Any]]:
    return [event_view(e) for e in await commands.history(name)]


@router.get("/models/{name}/state", **guarded(Permission.READ, model_from="name"))
async def state_at(name: str, commands: Commands, at: str | None = None) -> dict[str, Any]:
    """The routing table and state as they were at `at` (ISO-8601 or a time ago like -5m)."""
    moment = None
    if at is not None and at.strip().lower() != "now":
        try:
            moment = parse_at(at)
        except ValueError as exc:
            raise InvalidInputError(str(exc), field="at") from None
    then = await commands.state(name, moment)
    return {
        "at": iso(moment) if moment else "now",
        "table": table_view(RoutingTable.from_state(then)),
        "state": state_view(then),
    }


@router.get("/models/{name}/compare", **guarded(Permission.READ, model_from="name"))
async def compare(name: str, candidate: str, commands: Commands) -> dict[str, Any]:
    return await commands.compare(name, candidate)


@router.get("/requests/{request_id}/served", **guarded(Permission.READ))
async def served(request_id: str, commands: Commands, request: Request) -> dict[str, Any]:
    """The lineage of a served request, if the caller may read its model; else 404, as for an
    unknown request (whether it exists is not told)."""
    view = await commands.served(request_id)
    model = (view.get("request") or {}).get("model")
    if not isinstance(model, str) or not request_identity(request).allows(Permission.READ, model):
        raise ModelNotFoundError(
            f"no served request {request_id!r} is indexed "
            "(unknown, not indexed yet, or older than the lineage retention)"
        )
    return view


# -- writes ---------------------------------------------------------------------------------------


@router.post("/models/{name}/versions", **guarded(Permission.DEPLOY, model_from="name"))
async def register(name: str, body: RegisterBody, commands: Commands, actor: Actor) -> JSONResponse:
    """Register a package from a path under the gateway's packages root: 201 when a version
    was registered (validated or failed, see `status`), 200 when it already was."""
    result = await commands.register(
        Path(body.path),
        actor=actor,
        name=name,
        version=body.version,
        expected_sequence=body.expected_sequence,
        root=commands.model_settings.packages_root,
    )
    return JSONResponse(result.to_dict(), status_code=201 if result.action == "registered" else 200)


@router.post("/models/{name}/shadow", **guarded(Permission.DEPLOY, model_from="name"))
async def shadow(name: str, body: ShadowBody, commands: Commands, actor: Actor) -> dict[str, Any]:
    result = await commands.shadow(
        name,
        body.version,
        actor=actor,
        sample_rate=body.sample_rate,
        stop=body.stop,
        expected_sequence=body.expected_sequence,
    )
    return result.to_dict()


@router.post("/models/{name}/canary", **guarded(Permission.DEPLOY, model_from="name"))
async def canary(name: str, body: CanaryBody, commands: Commands, actor: Actor) -> dict[str, Any]:
    result = await commands.canary(
        name,
        body.version,
        actor=actor,
        steps=body.steps,
        dwell_s=body.dwell_s,
        thresholds=body.thresholds,
        expected_sequence=body.expected_sequence,
    )
    return result.to_dict()


@router.post("/models/{name}/promote", **guarded(Permission.DEPLOY, model_from="name"))
async def promote(name: str, body: PromoteBody, commands: Commands, actor: Actor) -> dict[str, Any]:
    result = await commands.promote(
        name, body.version, actor=actor, force=body.force, expected_sequence=body.expected_sequence
    )
    return result.to_dict()


@router.post("/models/{name}/rollback", **guarded(Permission.DEPLOY, model_from="name"))
async def rollback(
    name: str, body: RollbackBody, commands: Commands, actor: Actor
) -> dict[str, Any]:
    result = await commands.rollback(
        name, actor=actor, version=body.version, expected_sequence=body.expected_sequence
    )
    return result.to_dict()


@router.post("/models/{name}/retire", **guarded(Permission.ADMIN, model_from="name"))
async def retire(name: str, body: RetireBody, commands: Commands, actor: Actor) -> dict[str, Any]:
    result = await commands.retire(
        name, body.version, actor=actor, expected_sequence=body.expected_sequence
    )
    return result.to_dict()


@router.post("/models/{name}/pin", **guarded(Permission.DEPLOY, model_from="name"))
async def pin(name: str, body: PinBody, commands: Commands, actor: Actor) -> dict[str, Any]:
    result = await commands.pin(
        name,
        body.tenant,
        body.version,
        actor=actor,
        rule_id=body.rule_id,
        expected_sequence=body.expected_sequence,
    )
    return result.to_dict()


@router.post("/models/{name}/unpin", **guarded(Permission.DEPLOY, model_from="name"))
async def unpin(name: str, body: UnpinBody, commands: Commands, actor: Actor) -> dict[str, Any]:
    result = await commands.unpin(
        name, body.rule_id, actor=actor, expected_sequence=body.expected_sequence
    )
    return result.to_dict()


@router.post("/models/{name}/experiment", **guarded(Permission.DEPLOY, model_from="name"))
async def experiment(
    name: str, body: ExperimentBody, commands: Commands, actor: Actor
) -> dict[str, Any]:
    result = await commands.experiment(
        name,
        body.weights,
        actor=actor,
        tenant=body.tenant,
        rule_id=body.rule_id,
        expected_sequence=body.expected_sequence,
    )
    return result.to_dict()


def _allowed_fallback(request: Request, body: FallbackBody) -> FallbackBody:
    """The body, once the caller may deploy on the fallback it names as well: the fallback
    takes this model's refused calls, so a key scoped to one model could otherwise send that
    model's traffic to any other."""
    identity = request_identity(request)
    if body.fallback is not None and not identity.allows(Permission.DEPLOY, body.fallback):
        audit_denied(request, identity, Permission.DEPLOY, body.fallback)
        raise PermissionDeniedError(
            f"{identity.subject} may not deploy on model {body.fallback!r}, the fallback named"
        )
    return body


@router.post("/models/{name}/fallback", **guarded(Permission.DEPLOY, model_from="name"))
async def fallback(
    name: str,
    body: Annotated[FallbackBody, Depends(_allowed_fallback)],
    commands: Commands,
    actor: Actor,
) -> dict[str, Any]:
    result = await commands.fallback(
        name,
        body.fallback,
        actor=actor,
        reason=body.reason,
        expected_sequence=body.expected_sequence,
    )
    return result.to_dict()


async def _declared_pool(request: Request, body: PoolBody) -> PoolBody:
    """The body, once its pool's topics exist: calls of a model placed in a pool without them
    could not be published."""
    if body.pool is None:
        return body
    runtime = getattr(request.app.state, "gateway", None)
    services: GatewayServices | None = getattr(runtime, "services", None)
    if services is None:
        raise LifecycleUnavailableError("the gateway's Kafka clients are not started yet")
    try:
        check_pool(body.pool)
    except ConfigurationError as exc:
        raise InvalidInputError(str(exc)) from None
    missing = await services.publisher.missing_pool_topics(body.pool)
    if missing:
        raise InvalidTransitionError(
            f"pool {body.pool!r} is not declared (missing {', '.join(missing)}): "
            f"run `tidegate pools declare {body.pool}` first"
        )
    return body


@router.post("/models/{name}/pool", **guarded(Permission.DEPLOY, model_from="name"))
async def pool(
    name: str,
    body: Annotated[PoolBody, Depends(_declared_pool)],
    commands: Commands,
    actor: Actor,
) -> dict[str, Any]:
    """Place the model in a pool (docs/pools.md): its calls go to the pool's topics, and the
    pool's workers load it."""
    result = await commands.place(
        name, body.pool, actor=actor, reason=body.reason, expected_sequence=body.expected_sequence
    )
    return result.to_dict()
