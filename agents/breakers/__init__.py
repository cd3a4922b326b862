"""Circuit breakers: one breaker per model version, the board that holds them and publishes
their states, and their settings."""

__all__: list[str] = []
