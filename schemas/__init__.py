"""Avro schemas of tidegate and the codec that speaks the Confluent wire format."""

from tidegate.schemas.catalog import (
    DEAD_LETTER_ENVELOPE,
    INFERENCE_REQUEST,
    INFERENCE_RESULT,
    MODEL_LIFECYCLE_EVENT,
    ProjectSchema,
    load_schema,
    topic_subjects,
)
from tidegate.schemas.codec import AvroDecoder, AvroEncoder
from tidegate.schemas.wire import MAGIC_BYTE, pack, unpack

__all__ = [
    "DEAD_LETTER_ENVELOPE",
    "INFERENCE_REQUEST",
    "INFERENCE_RESULT",
    "MAGIC_BYTE",
    "MODEL_LIFECYCLE_EVENT",
    "AvroDecoder",
    "AvroEncoder",
    "ProjectSchema",
    "load_schema",
    "pack",
    "topic_subjects",
    "unpack",
]
