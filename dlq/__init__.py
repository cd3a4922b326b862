"""Failure handling: retry topics, the dead-letter queue, the poison-pill quarantine and replay.
Envelopes use the `DeadLetterEnvelope` schema in `schemas/avro`."""

from tidegate.dlq.envelopes import dead_letter, error_info, source_position

__all__ = ["dead_letter", "error_info", "source_position"]
