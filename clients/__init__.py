"""Client libraries a producer application imports: the Python producer, JSON Lines requests
and the open-loop load generator. They need only the ground and the schemas."""

__all__: list[str] = []
