"""HTTP adapters of tidegate: the V2 facade, the operator APIs and the server. The sub-packages
and their layers are drawn in docs/architecture.md."""

__all__: list[str] = []
