"""The gateway app (`create_app`): the V2 HTTP facade over Kafka, one replica per process. The
lifespan builds and starts its services on the server's event loop, and hands admission to the
HTTP protocol, which refuses an overloaded model's calls before any middleware runs.
Its parts: docs/architecture.md ("The gateway's sub-packages"); who may call: docs/security.md
("Roles and permissions"); refusals: docs/overload.md ("Refused before anything else runs").
"""

from __future__ import annotations

import logging
from collections.abc import AsyncIterator
from contextlib import AsyncExitStack, asynccontextmanager
from functools import partial
from typing import TYPE_CHECKING, Any

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import Response
from starlette.exceptions import HTTPException as StarletteHTTPException

import tidegate
from tidegate.core.aio import Periodic
from tidegate.core.errors import TidegateError
from tidegate.core.pools import pool_group, pool_topics
from tidegate.gateway.admission.admission_control import ADMISSION_STATE, LOOP_CHECK_S, Admission
from tidegate.gateway.admission.lag_probe import LagProbe
from tidegate.gateway.admission.rate_limits import RateLimiter
from tidegate.gateway.auth.audit_hooks import start_trail
from tidegate.gateway.auth.authn import Authenticator, install_authenticator
from tidegate.gateway.auth.permissions import close_public_routes
from tidegate.gateway.gateway_services import GatewayConfig, ServicesFactory, kafka_services
from tidegate.gateway.openapi.openapi_docs import install_openapi
from tidegate.gateway.problems import error_problem, problem, validation_problem
from tidegate.gateway.v2api.gateway_runtime import GatewayRuntime
from tidegate.gateway.v2api.infer_fast_path import GatewayApp
from tidegate.gateway.v2api.routes import router

if TYPE_CHECKING:
    from tidegate.gateway.admin.lifecycle_api import AdminFactory

__all__ = ["create_app"]

_log = logging.getLogger(__name__)


def _watch_pool(probe: LagProbe, config: GatewayConfig, admission: Admission, pool: str) -> None:
    """Measure `pool`'s backlog too: its workers' group on its real-time topic."""
    topic = pool_topics(config.topics, pool).requests
    group = pool_group(config.admission.worker_group, pool)
    probe.watch(topic, group, partial(admission.observe_kafka, pool=pool))


def create_app(
    config: GatewayConfig | None = None,
    services: ServicesFactory = kafka_services,
    admin: AdminFactory | None = None,
    authenticator: Authenticator | None = None,
) -> FastAPI:
    """`authenticator` defaults to the one `config.auth` describes (on by default: API keys
    from `config.postgres`, JWTs when an issuer is set; `enabled=False` is `--insecure`)."""
    config = config or GatewayConfig()
    auth = authenticator or Authenticator.from_settings(config.auth, config.postgres)

    @asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[dict[str, Any]]:
        async with AsyncExitStack() as stack:
            await stack.enter_async_context(auth)
            if admin is not None:
                app.state.admin_commands = await stack.enter_async_context(admin(config))
            runtime = GatewayRuntime(config, services(config))
            await runtime.start()
            stack.push_async_callback(runtime.stop)
            if runtime.services.lag_probe is not None:
                runtime.services.lag_probe.start(runtime.admission.observe_kafka)
                runtime.admission.probe_pool = partial(
                    _watch_pool, runtime.services.lag_probe, config, runtime.admission
                )
            loop_lag = Periodic(
                runtime.admission.loop_lag.step, LOOP_CHECK_S, name="gateway-loop-lag"
            )
            loop_lag.start()
            stack.push_async_callback(loop_lag.stop)
            app.state.gateway = runtime
            app.state.audit = runtime.services.audit
            await start_trail(app.state.audit)
            app.state.rate_limiter = RateLimiter(config.rate_limits, config.redis)
            stack.push_async_callback(app.state.rate_limiter.close)
            _log.info("gateway replica %s started", config.gateway.replica_id)
            # The lifespan state reaches the HTTP protocol (uvicorn's `app_state`), which refuses
            # an overloaded model's calls before any middleware or body read.
            yield {ADMISSION_STATE: runtime.admission}

    app = GatewayApp(title="tidegate gateway", version=tidegate.__version__, lifespan=lifespan)
    install_authenticator(app, auth)
    app.include_router(router)
    if admin is not None:
        # Imported only here: a gateway without /admin never loads the lifecycle's database code.
        from tidegate.gateway.admin.lifecycle_api import install_admin

        install_admin(app)
    close_public_routes(app, auth)
    install_openapi(app)

    @app.exception_handler(TidegateError)
    async def _tidegate_error(request: Request, exc: TidegateError) -> Response:
        return error_problem(exc, instance=request.url.path)

    @app.exception_handler(StarletteHTTPException)
    async def _http_error(request: Request, exc: StarletteHTTPException) -> Response:
        return problem(
            exc.status_code, str(exc.detail), instance=request.url.path, headers=exc.headers
        )

    @app.exception_handler(RequestValidationError)
    async def _validation_error(request: Request, exc: RequestValidationError) -> Response:
        return validation_problem(exc, instance=request.url.path)

    @app.exception_handler(Exception)
    async def _unexpected(request: Request, exc: Exception) -> Response:
        _log.exception("unexpected error on %s", request.url.path)
        return problem(500, "internal error", instance=request.url.path, code="INTERNAL")

    return app
