"""A request in flight: the `InferenceTask`, decoding a Kafka message into one, and its spans.
Every other part of the worker reads it."""

__all__: list[str] = []
