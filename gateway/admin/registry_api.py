"""HTTP adapter of the schema registry (`create_app`): Confluent Schema Registry's REST API over
`SchemaRegistry`, with Confluent's error shapes. Only this module knows HTTP; every route but the
root and the health check needs the permission it declares.
Errors and bodies: docs/overview.md ("Schemas and the registry"); who may do what:
docs/security.md ("The schema registry authenticates too").
"""

from __future__ import annotations

import json
import logging
import math
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Annotated, Any

from fastapi import Depends, FastAPI, Request
from fastapi.concurrency import run_in_threadpool
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse, Response
from starlette.exceptions import HTTPException as StarletteHTTPException

from tidegate.core.errors import (
    AuthenticationError,
    InvalidSchemaError,
    OverloadedError,
    RateLimitedError,
    RegistryUnavailableError,
    SchemaRegistryError,
    TidegateError,
)
from tidegate.gateway.auth.authn import Authenticator
from tidegate.gateway.auth.identity import Permission
from tidegate.gateway.auth.permissions import guarded
from tidegate.gateway.problems import registry_status_for_error
from tidegate.schemas.registry import (
    SUPPORTED_SCHEMA_TYPES,
    BadRequestError,
    SchemaRegistry,
    SchemaVersion,
)

__all__ = ["CONTENT_TYPE", "RegistryJSONResponse", "create_app"]

CONTENT_TYPE = "application/vnd.schemaregistry.v1+json"
REALM = 'Basic realm="tidegate schema registry"'

_log = logging.getLogger(__name__)


class RegistryJSONResponse(JSONResponse):
    media_type = CONTENT_TYPE


def _error(status: int, error_code: int, message: str) -> RegistryJSONResponse:
    return RegistryJSONResponse({"error_code": error_code, "message": message}, status_code=status)


def _flag(request: Request, name: str) -> bool:
    # confluent-kafka's client writes some flags with Python's spelling ("True"), others as "true".
    return request.query_params.get(name, "false").strip().lower() == "true"


async def _json_body(request: Request) -> dict[str, Any]:
    raw = await request.body()
    try:
        body = json.loads(raw or b"null")
    except (json.JSONDecodeError, UnicodeDecodeError) as exc:
        raise BadRequestError(f"the request body is not valid JSON: {exc}") from None
    if not isinstance(body, dict):
        raise BadRequestError("the request body must be a JSON object")
    return body


JsonBody = Annotated[dict[str, Any], Depends(_json_body)]


def _schema_of(body: dict[str, Any]) -> tuple[object, str | None]:
    """(schema, schemaType) of a schema request, refusing what this registry does not support."""
    if body.get("references"):
        raise InvalidSchemaError("schema references are not supported by tidegate's registry")
    if body.get("metadata") or body.get("ruleSet"):
        raise InvalidSchemaError("schema metadata and rule sets are not supported")
    schema_type = body.get("schemaType")
    return body.get("schema"), None if schema_type is None else str(schema_type)


def _version_json(found: SchemaVersion) -> dict[str, Any]:
    out: dict[str, Any] = {
        "subject": found.subject,
        "version": found.version,
        "id": found.schema_id,
        "schema": found.schema,
    }
    if found.schema_type != "AVRO":
        out["schemaType"] = found.schema_type
    return out


def _compatibility_json(request: Request, problems: list[str]) -> dict[str, Any]:
    out: dict[str, Any] = {"is_compatible": not problems}
    if _flag(request, "verbose"):
        out["messages"] = problems
    return out


def create_app(
    registry: SchemaRegistry, *, authenticator: Authenticator, startup_timeout_s: float = 60.0
) -> FastAPI:
    """The registry's FastAPI app, whose callers `authenticator` names; its lifespan opens the
    authenticator, starts the registry and waits until it is loaded."""

    @asynccontextmanager
    async def lifespan(_: FastAPI) -> AsyncIterator[None]:
        async with authenticator, _started(registry, startup_timeout_s):
            yield

    app = FastAPI(
        title="tidegate schema registry",
        default_response_class=RegistryJSONResponse,
        lifespan=lifespan,
    )
    app.state.authenticator = authenticator
    _add_error_handlers(app)
    _add_routes(app, registry)
    return app


@asynccontextmanager
async def _started(registry: SchemaRegistry, startup_timeout_s: float) -> AsyncIterator[None]:
    try:
        await run_in_threadpool(registry.start)
    except TidegateError as exc:
        _log.error("the schema registry cannot start: %s", exc)
        raise
    try:
        if not await run_in_threadpool(registry.wait_ready, startup_timeout_s):
            message = f"the registry state did not load within {startup_timeout_s}s"
            _log.error("the schema registry cannot start: %s", message)
            raise RegistryUnavailableError(message)
        yield
    finally:
        await run_in_threadpool(registry.stop)


def _add_error_handlers(app: FastAPI) -> None:
    @app.exception_handler(SchemaRegistryError)
    async def on_registry_error(_: Request, exc: SchemaRegistryError) -> Response:
        return _error(registry_status_for_error(exc), exc.error_code, str(exc))

    @app.exception_handler(TidegateError)
    async def on_refused(_: Request, exc: TidegateError) -> Response:
        # Authentication and authorization, in Confluent's shape: 40101, 40301, 42901, 50301.
        status = registry_status_for_error(exc)
        answer = _error(status, status * 100 + 1, str(exc))
        if isinstance(exc, AuthenticationError):
            answer.headers["WWW-Authenticate"] = REALM
        retry_after = getattr(exc, "retry_after_s", None)
        if isinstance(exc, RateLimitedError | OverloadedError) and retry_after is not None:
            answer.headers["Retry-After"] = str(max(1, math.ceil(retry_after)))
        return answer

    @app.exception_handler(StarletteHTTPException)
    async def on_http_error(_: Request, exc: StarletteHTTPException) -> Response:
        return _error(exc.status_code, exc.status_code, f"HTTP {exc.status_code} {exc.detail}")

    @app.exception_handler(RequestValidationError)
    async def on_invalid_request(_: Request, exc: RequestValidationError) -> Response:
        where = "; ".join(
            f"{'.'.join(str(p) for p in e.get('loc', ()))}: {e.get('msg', '')}"
            for e in exc.errors()
        )
        return _error(422, 422, f"invalid request: {where}")

    @app.exception_handler(Exception)
    async def on_unexpected(_: Request, exc: Exception) -> Response:
        # The traceback goes to the log, never to the client.
        _log.error("registry request failed", exc_info=exc)
        return _error(500, 50001, f"internal error of the schema registry ({type(exc).__name__})")


def _add_routes(app: FastAPI, registry: SchemaRegistry) -> None:
    @app.get("/", **guarded(Permission.PUBLIC))
    def root() -> dict[str, Any]:
        return {}

    @app.get("/_health", **guarded(Permission.PUBLIC))
    def health() -> Response:
        if not registry.ready:
            return _error(503, 50003, "the schema registry is still loading its state")
        return RegistryJSONResponse({"status": "ready"})

    @app.get("/schemas/types", **guarded(Permission.READ))
    def schema_types() -> list[str]:
        return list(SUPPORTED_SCHEMA_TYPES)

    @app.get("/schemas/ids/{schema_id}", **guarded(Permission.READ))
    def schema_by_id(schema_id: int, request: Request) -> dict[str, Any]:
        schema, schema_type = registry.get_schema(schema_id)
        out: dict[str, Any] = {"schema": schema}
        if schema_type != "AVRO":
            out["schemaType"] = schema_type
        if _flag(request, "fetchMaxId"):
            out["maxId"] = registry.max_id()
        return out

    @app.get("/schemas/ids/{schema_id}/schema", **guarded(Permission.READ))
    def raw_schema_by_id(schema_id: int) -> Response:
        return Response(registry.get_schema(schema_id)[0], media_type=CONTENT_TYPE)

    @app.get("/schemas/ids/{schema_id}/versions", **guarded(Permission.READ))
    def schema_versions(schema_id: int, request: Request) -> list[dict[str, Any]]:
        found = registry.usages(schema_id, deleted=_flag(request, "deleted"))
        return [{"subject": v.subject, "version": v.version} for v in found]

    @app.get("/schemas/ids/{schema_id}/subjects", **guarded(Permission.READ))
    def schema_subjects(schema_id: int, request: Request) -> list[str]:
        found = registry.usages(schema_id, deleted=_flag(request, "deleted"))
        return list(dict.fromkeys(v.subject for v in found))

    @app.get("/subjects", **guarded(Permission.READ))
    def subjects(request: Request) -> list[str]:
        return registry.subjects(
            deleted=_flag(request, "deleted"),
            deleted_only=_flag(request, "deleted_only"),
            prefix=request.query_params.get("subjectPrefix"),
        )

    @app.post("/subjects/{subject}", **guarded(Permission.READ))
    def lookup(subject: str, request: Request, body: JsonBody) -> dict[str, Any]:
        schema, schema_type = _schema_of(body)
        found = registry.lookup(subject, schema, schema_type, deleted=_flag(request, "deleted"))
        return _version_json(found)

    @app.delete("/subjects/{subject}", **guarded(Permission.ADMIN))
    def delete_subject(subject: str, request: Request) -> list[int]:
        return registry.delete_subject(subject, permanent=_flag(request, "permanent"))

    @app.get("/subjects/{subject}/versions", **guarded(Permission.READ))
    def versions(subject: str, request: Request) -> list[int]:
        return registry.versions(
            subject, deleted=_flag(request, "deleted"), deleted_only=_flag(request, "deleted_only")
        )

    @app.post("/subjects/{subject}/versions", **guarded(Permission.DEPLOY))
    def register(subject: str, body: JsonBody) -> dict[str, Any]:
        schema, schema_type = _schema_of(body)
        return _version_json(registry.register(subject, schema, schema_type))

    @app.get("/subjects/{subject}/versions/{version}", **guarded(Permission.READ))
    def get_version(subject: str, version: str, request: Request) -> dict[str, Any]:
        found = registry.get_version(subject, version, deleted=_flag(request, "deleted"))
        return _version_json(found)

    @app.get(
        "/subjects/{subject}/versions/{version}/schema",
        **guarded(Permission.READ),
    )
    def get_raw_version(subject: str, version: str, request: Request) -> Response:
        found = registry.get_version(subject, version, deleted=_flag(request, "deleted"))
        return Response(found.schema, media_type=CONTENT_TYPE)

    @app.get(
        "/subjects/{subject}/versions/{version}/referencedby",
        **guarded(Permission.READ),
    )
    def referenced_by(subject: str, version: str) -> list[int]:
        registry.get_version(subject, version)
        return []  # schema references are not supported, so nothing can refer to a version

    @app.delete("/subjects/{subject}/versions/{version}", **guarded(Permission.ADMIN))
    def delete_version(subject: str, version: str, request: Request) -> int:
        return registry.delete_version(subject, version, permanent=_flag(request, "permanent"))

    @app.post(
        "/compatibility/subjects/{subject}/versions/{version}",
        **guarded(Permission.READ),
    )
    def test_version(subject: str, version: str, request: Request, body: JsonBody) -> Any:
        schema, schema_type = _schema_of(body)
        problems = registry.test_compatibility(subject, schema, schema_type, version)
        return _compatibility_json(request, problems)

    @app.post("/compatibility/subjects/{subject}/versions", **guarded(Permission.READ))
    def test_all(subject: str, request: Request, body: JsonBody) -> Any:
        schema, schema_type = _schema_of(body)
        problems = registry.test_compatibility(subject, schema, schema_type)
        return _compatibility_json(request, problems)

    @app.get("/config", **guarded(Permission.READ))
    def get_global_config() -> dict[str, str]:
        return {"compatibilityLevel": registry.get_compatibility()}

    @app.put("/config", **guarded(Permission.ADMIN))
    def put_global_config(body: JsonBody) -> dict[str, str]:
        return {"compatibility": registry.set_compatibility(None, _level_of(body))}

    @app.delete("/config", **guarded(Permission.ADMIN))
    def delete_global_config() -> dict[str, str]:
        return {"compatibilityLevel": registry.delete_compatibility(None)}

    @app.get("/config/{subject}", **guarded(Permission.READ))
    def get_config(subject: str, request: Request) -> dict[str, str]:
        level = registry.get_compatibility(
            subject, default_to_global=_flag(request, "defaultToGlobal")
        )
        return {"compatibilityLevel": level}

    @app.put("/config/{subject}", **guarded(Permission.ADMIN))
    def put_config(subject: str, body: JsonBody) -> dict[str, str]:
        return {"compatibility": registry.set_compatibility(subject, _level_of(body))}

    @app.delete("/config/{subject}", **guarded(Permission.ADMIN))
    def delete_config(subject: str) -> dict[str, str]:
        return {"compatibilityLevel": registry.delete_compatibility(subject)}


def _level_of(body: dict[str, Any]) -> object:
    unsupported = sorted(
        k for k, v in body.items() if k not in ("compatibility", "compatibilityLevel") and v
    )
    if unsupported:
        raise BadRequestError(f"unsupported config field(s): {', '.join(unsupported)}")
    return body.get("compatibility", body.get("compatibilityLevel"))
