"""The ground layer: connection settings, the error tree, the Kafka client factory, the
database pool, telemetry and asyncio helpers. It imports no other package of tidegate."""

__all__: list[str] = []
