"""HTTP adapters of tidegate."""

__all__: list[str] = []
