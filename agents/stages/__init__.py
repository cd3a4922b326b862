"""The stages in front of the data plane: pre-routing, the prediction cache and enrichment from
the online feature store."""

__all__: list[str] = []
