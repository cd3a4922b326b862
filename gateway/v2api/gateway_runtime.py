"""The running state of one gateway replica, started and stopped by the app's lifespan."""

from __future__ import annotations

from tidegate.gateway.admission.admission_control import Admission
from tidegate.gateway.gateway_services import GatewayConfig, GatewayServices
from tidegate.gateway.roundtrip.reply_router import ReplyRouter
from tidegate.gateway.v2api.infer import Inference

__all__ = ["GatewayRuntime"]


class GatewayRuntime:
    """Services, router and admission of one replica. Create and start it on its event loop."""

    def __init__(self, config: GatewayConfig, services: GatewayServices) -> None:
        self.config = config
        self.services = services
        settings = config.gateway
        self.router = ReplyRouter(
            services.store,
            keep_s=settings.result_ttl_s,
            max_kept=settings.max_kept_results,
            tracer=services.tracing.tracer,
        )
        self.admission = Admission(settings.max_in_flight, config.admission)
        self.router.listeners.append(self.admission.on_result)
        self.admission.diverts = services.catalog.has_fallback
        self.admission.pool_of = services.catalog.pool
        self.inference = Inference(settings, services, self.router, self.admission)

    async def start(self) -> None:
        try:
            await self.services.publisher.start()
            await self.services.feed.start(self.router.deliver)
        except BaseException:
            await self.services.publisher.stop()
            await self.services.close()
            raise

    async def stop(self) -> None:
        try:
            await self.services.feed.stop()
            await self.router.drain()
            await self.services.publisher.stop()
        finally:
            await self.services.close()

    def not_ready(self) -> list[str]:
        """What keeps this replica from serving; empty when it is ready."""
        missing = []
        if not self.services.publisher.connected:
            missing.append("the Kafka producer is not connected")
        if not self.services.feed.ready:
            missing.append("no reply partition is leased and assigned")
        return missing
