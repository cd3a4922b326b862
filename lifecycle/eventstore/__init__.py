"""The write side of the lifecycle: the PostgreSQL event store with its projections, the
transactional outbox, the Kafka codec of the events and the log writers append through."""

__all__: list[str] = []
