"""The worker's Kafka side: the consumer cycle, group membership, per-partition order and
offsets, priority lanes, the crash guard and its solo lane, where failures go, and producing
results (delivery, sinks)."""

__all__: list[str] = []
