"""The operator commands of the lifecycle (register, shadow, canary, promote, rollback, retire,
pin, experiment, inspect), shared by the CLI and `/admin`."""

__all__: list[str] = []
