"""The V2 endpoints: health, server and model metadata, inference, results by id, metrics.

Thin adapters: each route finds this replica's `GatewayRuntime` and hands over to the catalog, or,
for inference and results by id, to the HTTP edge (`tidegate.gateway.v2api.v2_http`) over the data
plane (`tidegate.gateway.v2api.infer`)."""

from __future__ import annotations

from typing import Any

from fastapi import APIRouter, Request
from fastapi.responses import JSONResponse, Response
from prometheus_client import CONTENT_TYPE_LATEST, generate_latest

import tidegate
from tidegate.gateway.auth.identity import Permission
from tidegate.gateway.auth.permissions import guarded, request_identity
from tidegate.gateway.problems import problem
from tidegate.gateway.v2api import v2_http
from tidegate.gateway.v2api.gateway_runtime import GatewayRuntime

__all__ = ["EXTENSIONS", "INSECURE_HEADER", "router"]

EXTENSIONS = ["binary_tensor_data", "parameters"]
INSECURE_HEADER = "X-Tidegate-Insecure"

router = APIRouter()


def _runtime(request: Request) -> GatewayRuntime:
    runtime: GatewayRuntime = request.app.state.gateway
    return runtime


# Routes are matched in order, one regular expression each: inference, the hot path, goes first.
@router.post("/v2/models/{model}/infer", **guarded(Permission.INFER, model_from="model"))
async def infer(request: Request, model: str) -> Response:
    return await v2_http.infer(_runtime(request).inference, request, model, None)


@router.post(
    "/v2/models/{model}/versions/{version}/infer",
    **guarded(Permission.INFER, model_from="model"),
)
async def infer_version(request: Request, model: str, version: str) -> Response:
    return await v2_http.infer(_runtime(request).inference, request, model, version)


@router.get("/v2/health/live", **guarded(Permission.PUBLIC, closable="health"))
async def live() -> dict[str, bool]:
    return {"live": True}


@router.get("/v2/health/ready", **guarded(Permission.PUBLIC, closable="health"))
async def ready(request: Request) -> Response:
    missing = _runtime(request).not_ready()
    if missing:
        return problem(
            503,
            "not ready: " + "; ".join(missing),
            instance=request.url.path,
            code="UNAVAILABLE",
            ready=False,
        )
    response = JSONResponse({"ready": True})
    authenticator = getattr(request.app.state, "authenticator", None)
    if authenticator is not None and authenticator.insecure:
        # Loud on purpose: a probe or an operator sees that this gateway lets anyone in.
        response.headers[INSECURE_HEADER] = "authentication is off (--insecure)"
    return response


@router.get("/v2", **guarded(Permission.READ))
async def server_metadata() -> dict[str, Any]:
    return {"name": "tidegate", "version": tidegate.__version__, "extensions": EXTENSIONS}


@router.get("/v2/models/{model}", **guarded(Permission.READ, model_from="model"))
async def model_metadata(request: Request, model: str) -> dict[str, Any]:
    return await _runtime(request).services.catalog.metadata(model)


@router.get("/v2/models/{model}/versions/{version}", **guarded(Permission.READ, model_from="model"))
async def version_metadata(request: Request, model: str, version: str) -> dict[str, Any]:
    return await _runtime(request).services.catalog.metadata(model, version)


@router.get("/v2/models/{model}/ready", **guarded(Permission.READ, model_from="model"))
async def model_ready(request: Request, model: str) -> dict[str, Any]:
    await _runtime(request).services.catalog.check_ready(model)
    return {"name": model, "ready": True}


@router.get(
    "/v2/models/{model}/versions/{version}/ready",
    **guarded(Permission.READ, model_from="model"),
)
async def version_ready(request: Request, model: str, version: str) -> dict[str, Any]:
    await _runtime(request).services.catalog.check_ready(model, version)
    return {"name": model, "version": version, "ready": True}


@router.get("/v2/requests/{request_id}", **guarded(Permission.INFER))
async def fetch(request: Request, request_id: str) -> Response:
    """A result kept by id: its caller's own (or any, for an unscoped admin); else 404."""
    return await v2_http.fetch(_runtime(request).inference, request_id, request_identity(request))


@router.get("/metrics", **guarded(Permission.PUBLIC, closable="metrics"))
async def prometheus() -> Response:
    return Response(generate_latest(), media_type=CONTENT_TYPE_LATEST)
