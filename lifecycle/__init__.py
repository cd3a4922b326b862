"""The event-sourced model lifecycle: register, shadow, canary, promote, retire and rollback,
stored in PostgreSQL and published to `model-lifecycle`. Built in the lifecycle issue."""

__all__: list[str] = []
