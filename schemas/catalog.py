"""The project's Avro schemas, loaded from `schemas/avro/`.

Each named type lives in its own `<fullname>.avsc` file, so shared types (Tensor, ErrorInfo,
SourcePosition) are written once. fastavro inlines the references when it loads a file, which gives
the self-contained schema text that a registry accepts without schema references.

Subjects come in two kinds: topic subjects (`{topic}-value`, TopicNameStrategy), which the
producers and consumers of a topic use, and one subject per lifecycle event type under its full
name (RecordNameStrategy), so each event type evolves under its own compatibility rules even though
events travel inside the `ModelLifecycleEvent` envelope.
"""

from __future__ import annotations

import functools
import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import fastavro.schema

from tidegate.core.pools import pool_topic_names, pool_topics
from tidegate.core.settings import TopicSettings

__all__ = [
    "AUDIT_EVENT",
    "BREAKER_STATE",
    "DEAD_LETTER_ENVELOPE",
    "EVENT_SUBJECT_COMPATIBILITY",
    "INFERENCE_REQUEST",
    "INFERENCE_RESULT",
    "LIFECYCLE_NAMESPACE",
    "MODEL_LIFECYCLE_EVENT",
    "SCHEMA_DIR",
    "SHADOW_COMPARISON",
    "ProjectSchema",
    "event_schemas",
    "event_subjects",
    "load_schema",
    "pool_subjects",
    "topic_subjects",
]

SCHEMA_DIR = Path(__file__).parent / "avro"

INFERENCE_REQUEST = "dev.tidegate.inference.InferenceRequest"
INFERENCE_RESULT = "dev.tidegate.inference.InferenceResult"
LIFECYCLE_NAMESPACE = "dev.tidegate.lifecycle"
MODEL_LIFECYCLE_EVENT = f"{LIFECYCLE_NAMESPACE}.ModelLifecycleEvent"
SHADOW_COMPARISON = f"{LIFECYCLE_NAMESPACE}.ShadowComparison"
DEAD_LETTER_ENVELOPE = "dev.tidegate.dlq.DeadLetterEnvelope"
AUDIT_EVENT = "dev.tidegate.audit.AuditEvent"
BREAKER_STATE = "dev.tidegate.agents.BreakerState"

# Each event type evolves on its own: a new reader must read every event ever appended, since the
# lifecycle topic is replayed from the beginning.
EVENT_SUBJECT_COMPATIBILITY = "BACKWARD"


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
        f"{topics.requests_batch}-value": INFERENCE_REQUEST,
        f"{topics.results}-value": INFERENCE_RESULT,
        f"{topics.replies}-value": INFERENCE_RESULT,
        f"{topics.failed}-value": DEAD_LETTER_ENVELOPE,
        f"{topics.poison}-value": DEAD_LETTER_ENVELOPE,
        **{f"{topic}-value": DEAD_LETTER_ENVELOPE for topic in topics.retry_topics()},
        f"{topics.lifecycle}-value": MODEL_LIFECYCLE_EVENT,
        f"{topics.shadow}-value": SHADOW_COMPARISON,
        f"{topics.audit}-value": AUDIT_EVENT,
        f"{topics.breakers}-value": BREAKER_STATE,
    }


def pool_subjects(topics: TopicSettings, pool: str) -> dict[str, str]:
    """`topic_subjects` of the topics a pool has of its own (its requests and retry topics)."""
    layout = pool_topics(topics, pool)
    own = set(pool_topic_names(topics, pool))
    return {s: f for s, f in topic_subjects(layout).items() if s.removesuffix("-value") in own}


def event_schemas(directory: Path = SCHEMA_DIR) -> list[str]:
    """Full names of the lifecycle event types: the branches of the envelope's payload union.

    Read from the envelope file itself, so a type added to the union is registered without
    another list to keep in step.
    """
    doc = json.loads((directory / f"{MODEL_LIFECYCLE_EVENT}.avsc").read_text())
    payload = next(f for f in doc["fields"] if f["name"] == "payload")
    names: list[str] = []
    for branch in payload["type"]:
        name = branch if isinstance(branch, str) else branch["name"]
        names.append(name if "." in name else f"{LIFECYCLE_NAMESPACE}.{name}")
    return names


def event_subjects(directory: Path = SCHEMA_DIR) -> dict[str, str]:
    """Subject (RecordNameStrategy: the full name) to schema full name, per lifecycle event type."""
    return {name: name for name in event_schemas(directory)}
