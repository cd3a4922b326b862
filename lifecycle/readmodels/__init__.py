"""Read models of the lifecycle: every model's state folded from the `model-lifecycle` topic,
and the queries over the indexed lineage."""

__all__: list[str] = []
