"""Every route declares the permission it needs in one place, `guarded(...)`: the dependency
`requires(...)` that enforces it, and `x-tidegate-permission` in its OpenAPI operation. A unit
test fails on any route without both.
How routes are authorized: docs/security.md ("Roles and permissions").
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import Any, Literal

from fastapi import Depends, FastAPI, Request
from fastapi.routing import APIRoute

from tidegate.core.errors import AuthenticationError, ConfigurationError, PermissionDeniedError
from tidegate.gateway.auth.audit_hooks import (
    PERMISSION_KEY,
    audit_auth_failure,
    audit_denied,
    client_address,
)
from tidegate.gateway.auth.authn import Authenticator
from tidegate.gateway.auth.identity import Identity, Permission

__all__ = [
    "PERMISSION_KEY",
    "Closable",
    "close_public_routes",
    "guarded",
    "request_identity",
    "requires",
    "route_permission",
]

Closable = Literal["health", "metrics"]
Requirement = Callable[[Request], Awaitable[Identity | None]]


def requires(
    permission: Permission, *, model_from: str | None = None, closable: Closable | None = None
) -> Requirement:
    """The dependency that enforces `permission`; it returns the caller's identity (None on an
    open public route, which does not authenticate at all)."""

    async def dependency(request: Request) -> Identity | None:
        state = request.app.state
        authenticator: Authenticator | None = getattr(state, "authenticator", None)
        if authenticator is None:
            raise ConfigurationError("no authenticator is installed on this app")
        needed = permission
        if needed is Permission.PUBLIC:
            if closable is None or authenticator.is_open(closable):
                return None
            needed = Permission.READ
        try:
            identity = await authenticator.authenticate(request)
        except AuthenticationError as exc:
            audit_auth_failure(request, exc.reason)
            raise
        if identity.kind == "anonymous":
            audit_auth_failure(request, "no credentials")
            raise AuthenticationError("credentials are required", "no credentials")
        request.state.identity = identity
        model = request.path_params.get(model_from) if model_from is not None else None
        if not identity.allows(needed, model):
            audit_denied(request, identity, needed, model)
            on = f" on model {model!r}" if model is not None else ""
            raise PermissionDeniedError(f"{identity.subject} may not {needed.value}{on}")
        if needed is Permission.INFER:
            limiter = getattr(state, "rate_limiter", None)
            if limiter is not None:
                await limiter.check(identity, model, client=client_address(request))
        return identity

    dependency.permission = permission  # type: ignore[attr-defined]
    dependency.closable = closable  # type: ignore[attr-defined]
    return dependency


def guarded(
    permission: Permission, *, model_from: str | None = None, closable: Closable | None = None
) -> dict[str, Any]:
    """The route decorator's keyword arguments that declare and enforce `permission`."""
    return {
        "dependencies": [Depends(requires(permission, model_from=model_from, closable=closable))],
        "openapi_extra": {PERMISSION_KEY: permission.value},
    }


def route_permission(route: APIRoute) -> tuple[Permission | None, Permission | None]:
    """What `route` declares in its document and what its dependencies enforce (None: nothing),
    so a test can check that every route declares one and that both agree."""
    declared = (route.openapi_extra or {}).get(PERMISSION_KEY)
    enforced = next(
        (
            getattr(dep.call, "permission", None)
            for dep in route.dependant.dependencies
            if getattr(dep.call, "permission", None) is not None
        ),
        None,
    )
    return (Permission(declared) if declared else None), enforced


def request_identity(request: Request) -> Identity:
    """The identity `requires` authenticated for this request (the lifecycle's actor)."""
    identity: Identity | None = getattr(request.state, "identity", None)
    if identity is None:
        raise AuthenticationError("credentials are required", "route without an identity")
    return identity


def close_public_routes(app: FastAPI, authenticator: Authenticator) -> None:
    """Document `read` on the closable public routes that the settings close."""
    for route in app.routes:
        if not isinstance(route, APIRoute):
            continue
        for dep in route.dependant.dependencies:
            closable = getattr(dep.call, "closable", None)
            if closable is not None and not authenticator.is_open(closable):
                route.openapi_extra = {
                    **(route.openapi_extra or {}),
                    PERMISSION_KEY: Permission.READ.value,
                }
