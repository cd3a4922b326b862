"""Worker agents: consume `inference-requests`, micro-batch per partition, run models, publish
`inference-results`. Built in the inference-path issue."""

__all__: list[str] = []
