"""The `tidegate controller` process: the outbox relay loop, the canary controller, the lineage
indexer and retention."""

__all__: list[str] = []
