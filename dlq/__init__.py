"""Failure handling: retry topics, the dead-letter queue, the poison-pill quarantine and replay.
Envelopes use the `DeadLetterEnvelope` schema in `schemas/avro`."""

__all__: list[str] = []
