"""Which calls get in: admission control from measured load, the workers' lag probe, the 503
the protocol answers for a refused call, and rate limits per client and model
(docs/overload.md, docs/rate-limits.md)."""

__all__: list[str] = []
