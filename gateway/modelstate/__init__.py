"""What the gateway knows of the models it serves, read from what others publish: the served
versions and their signatures (the lifecycle feed), the workers' breaker states, and the
prediction cache."""

__all__: list[str] = []
