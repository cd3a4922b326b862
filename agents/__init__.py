"""Worker agents: consume `inference-requests`, batch per model across partitions, run models,
publish `inference-results` in per-key order, at least once or exactly once."""

__all__: list[str] = []
