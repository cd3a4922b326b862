"""The project's Avro schemas, loaded from `schemas/avro/`.

Each named type lives in its own `<fullname>.avsc` file, so shared types (Tensor, ErrorInfo,
SourcePosition) are written once. fastavro inlines the references when it loads a file, which gives
the self-contained schema text that a registry accepts without schema references.
"""

from __future__ import annotations

import functools
import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import fastavro.schema

from tidegate.settings import TopicSettings

__all__ = [
    "DEAD_LETTER_ENVELOPE",
    "INFERENCE_REQUEST",
    "INFERENCE_RESULT",
    "MODEL_LIFECYCLE_EVENT",
    "SCHEMA_DIR",
    "ProjectSchema",
    "load_schema",
    "topic_subjects",
]

SCHEMA_DIR = Path(__file__).parent / "avro"

INFERENCE_REQUEST = "dev.tidegate.inference.InferenceRequest"
INFERENCE_RESULT = "dev.tidegate.inference.InferenceResult"
MODEL_LIFECYCLE_EVENT = "dev.tidegate.lifecycle.ModelLifecycleEvent"
DEAD_LETTER_ENVELOPE = "dev.tidegate.dlq.DeadLetterEnvelope"


@dataclass(frozen=True)
class ProjectSchema:
    """One top-level schema: its full name, registrable text and fastavro-parsed form."""

    fullname: str
    text: str
    parsed: Any


@functools.cache
def load_schema(fullname: str, directory: Path = SCHEMA_DIR) -> ProjectSchema:
    path = directory / f"{fullname}.avsc"
    expanded = fastavro.schema.load_schema(str(path), _write_hint=False)
    text = json.dumps(expanded, separators=(",", ":"))
    return ProjectSchema(fullname, text, fastavro.parse_schema(expanded))


def topic_subjects(topics: TopicSettings) -> dict[str, str]:
    """Subject (TopicNameStrategy, `{topic}-value`) to schema full name, for every project topic."""
    return {
        f"{topics.requests}-value": INFERENCE_REQUEST,
        f"{topics.results}-value": INFERENCE_RESULT,
        f"{topics.replies}-value": INFERENCE_RESULT,
        f"{topics.failed}-value": DEAD_LETTER_ENVELOPE,
        f"{topics.poison}-value": DEAD_LETTER_ENVELOPE,
        f"{topics.lifecycle}-value": MODEL_LIFECYCLE_EVENT,
    }
