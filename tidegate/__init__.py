"""tidegate: event-driven streaming inference over Apache Kafka.

This package holds only cross-cutting code: settings, the error tree, the Kafka client factory,
telemetry and the CLI. The architecture lives in the top-level packages `agents`, `schemas`,
`gateway`, `lifecycle` and `dlq`.
"""

__all__ = ["__version__"]

__version__ = "0.1.0"
