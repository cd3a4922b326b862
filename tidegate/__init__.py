"""tidegate: event-driven streaming inference over Apache Kafka.

The package root only. Its subpackages are the repository's top-level folders, each a layer that
imports only the layers below it (docs/architecture.md): `tidegate.core`, `tidegate.schemas`,
`tidegate.models`, `tidegate.clients`, `tidegate.lifecycle`, `tidegate.dlq`, `tidegate.agents`,
`tidegate.gateway`, `tidegate.examples` and `tidegate.cli`.
"""

__all__ = ["__version__"]

__version__ = "0.1.0"
