"""`dlq list / show / stats` against the real Kafka and registry: a known mix of dead letters
(several models, versions and codes, both topics, one record that is not an envelope) is counted
exactly, every filter selects what it should, and reading commits nothing anywhere."""

from __future__ import annotations

import time
from collections import Counter
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

import pytest
from confluent_kafka.admin import AdminClient

from tests.integration.dlq.dlq_fixtures import DlqStack
from tidegate.core.errors import (
    DeadlineExceededError,
    InvalidInputError,
    ModelExecutionError,
    TidegateError,
    UnknownSchemaError,
    WireFormatError,
)
from tidegate.dlq.inspect import DeadLetterReader, find_letter, letter_stats, list_letters
from tidegate.dlq.letters import UNKNOWN, UNREADABLE, LetterFilter, letter_view

MINUTE = 60_000


@dataclass(frozen=True)
class Spec:
    topic: str  # failed or poison
    model: str | None
    version: str | None  # what the letter should say
    code: str
    at_ms: int
    rid: str | None


def mix(base_ms: int) -> list[Spec]:
    """The letters: 17 failed, 6 poison, one per minute from `base_ms`."""
    rows = (
        [("failed", "fraud", "2", "MODEL_ERROR")] * 3  # pinned version 2 in the request
        + [("failed", "fraud", None, "MODEL_ERROR")] * 4  # routed: version unknown
        + [("failed", "fraud", "1", "INVALID_INPUT")] * 3  # version named in the error
        + [("failed", "minilm", None, "MODEL_ERROR")] * 5
        + [("failed", "minilm", None, "DEADLINE_EXCEEDED")] * 2
        + [("poison", None, None, "WIRE_FORMAT")] * 4
        + [("poison", None, None, "UNKNOWN_SCHEMA")] * 2
    )
    return [
        Spec(topic, model, version, code, base_ms + i * MINUTE, f"r{i:02d}" if model else None)
        for i, (topic, model, version, code) in enumerate(rows)
    ]


ERRORS: dict[str, TidegateError] = {
    "MODEL_ERROR": ModelExecutionError("the model failed"),
    "INVALID_INPUT": InvalidInputError("bad features", field="features"),
    "DEADLINE_EXCEEDED": DeadlineExceededError("too late"),
    "WIRE_FORMAT": WireFormatError("unknown magic byte 7; expected 0"),
    "UNKNOWN_SCHEMA": UnknownSchemaError(999_999),
}


def write(stack: DlqStack, specs: list[Spec]) -> None:
    by_topic: dict[str, list[tuple[dict[str, Any] | bytes, int]]] = {"failed": [], "poison": []}
    for i, spec in enumerate(specs):
        if spec.model is None:
            value: bytes = b"\x07garbage" if spec.code == "WIRE_FORMAT" else b"\x00\x00\x0f\x42\x3f"
        else:
            pinned = spec.version if spec.code == "MODEL_ERROR" else None
            value = stack.request_bytes(spec.rid or "", spec.model, pinned)
        details = {"version": spec.version or ""} if spec.code == "INVALID_INPUT" else None
        envelope = stack.envelope(
            exc=ERRORS[spec.code],
            failed_at_ms=spec.at_ms,
            key=f"key-{i % 5}".encode(),
            value=value,
            rid=spec.rid,
            model=spec.model,
            details=details,
            offset=i,
        )
        by_topic[spec.topic].append((envelope, spec.at_ms))
    stack.produce_letters(stack.topics.failed, by_topic["failed"])
    stack.produce_letters(stack.topics.poison, by_topic["poison"])


@pytest.fixture
def written(dlq_stack: DlqStack) -> list[Spec]:
    specs = mix(int(time.time() * 1000) - 3 * 3600 * 1000)
    write(dlq_stack, specs)
    # One record of the failed topic that is not an envelope at all.
    dlq_stack.produce_letters(dlq_stack.topics.failed, [(b"not an envelope", specs[-1].at_ms)])
    return specs


def both(stack: DlqStack) -> list[str]:
    return [stack.topics.failed, stack.topics.poison]


def counts(groups: dict[str, dict[str, Any]]) -> dict[str, int]:
    return {key: value["count"] for key, value in groups.items()}


async def test_stats_count_exactly_what_was_produced(
    dlq_stack: DlqStack, written: list[Spec]
) -> None:
    stack = dlq_stack
    view = (await letter_stats(stack.kafka, stack.registry, both(stack), LetterFilter())).view()
    topic_of = {"failed": stack.topics.failed, "poison": stack.topics.poison}
    assert view["count"] == len(written) + 1
    assert view["unreadable"] == 1
    assert counts(view["by_topic"]) == {
        stack.topics.failed: 18,
        stack.topics.poison: 6,
    }
    assert counts(view["by_topic"]) == dict(
        Counter(topic_of[s.topic] for s in written) + Counter({stack.topics.failed: 1})
    )
    assert counts(view["by_model"]) == {"fraud": 10, "minilm": 7, UNKNOWN: 7}
    assert counts(view["by_code"]) == {
        **Counter(s.code for s in written),
        UNREADABLE: 1,
    }
    assert counts(view["by_version"]) == {
        "fraud:2": 3,
        "fraud:unknown": 4,
        "fraud:1": 3,
        "minilm:unknown": 7,
        "unknown:unknown": 7,
    }
    oldest = datetime.fromtimestamp(written[0].at_ms / 1000, UTC)
    newest = datetime.fromtimestamp(written[-1].at_ms / 1000, UTC)
    assert view["oldest"] == oldest.isoformat(timespec="milliseconds")
    assert view["newest"] == newest.isoformat(timespec="milliseconds")
    fraud = view["by_model"]["fraud"]
    assert fraud["newest"] == datetime.fromtimestamp(written[9].at_ms / 1000, UTC).isoformat(
        timespec="milliseconds"
    )


async def test_filters_select_by_model_version_code_topic_and_time(
    dlq_stack: DlqStack, written: list[Spec]
) -> None:
    stack = dlq_stack

    async def total(topics: list[str], **kw: Any) -> int:
        stats = await letter_stats(stack.kafka, stack.registry, topics, LetterFilter.build(**kw))
        return stats.total.count

    assert await total(both(stack), models=["fraud"]) == 10
    assert await total(both(stack), models=["fraud", "minilm"], codes=["MODEL_ERROR"]) == 12
    assert await total(both(stack), versions=["2"]) == 3
    assert await total(both(stack), models=["fraud"], versions=["1", "2"]) == 6
    assert await total([stack.topics.poison]) == 6
    assert await total([stack.topics.poison], codes=["unknown_schema"]) == 2
    # A window of whole minutes: letters 5..12 inclusive.
    since = datetime.fromtimestamp(written[5].at_ms / 1000, UTC)
    until = datetime.fromtimestamp(written[12].at_ms / 1000, UTC)
    assert await total(both(stack), since=since, until=until) == 8
    # `since` alone starts the read at that time (offsets_for_times) and still counts exactly.
    late = datetime.fromtimestamp(written[20].at_ms / 1000, UTC)
    expected = sum(1 for s in written if s.at_ms >= written[20].at_ms) + 1  # + the garbage
    assert await total(both(stack), since=late) == expected


async def test_list_is_oldest_first_per_partition_and_bounded(
    dlq_stack: DlqStack, written: list[Spec]
) -> None:
    stack = dlq_stack
    found, more = await list_letters(
        stack.kafka, stack.registry, both(stack), LetterFilter(), limit=5
    )
    assert (len(found), more) == (5, True)
    everything, more = await list_letters(
        stack.kafka, stack.registry, both(stack), LetterFilter(), limit=None
    )
    assert (len(everything), more) == (len(written) + 1, False)
    for partition in {(x.topic, x.partition) for x in everything}:
        offsets = [x.offset for x in everything if (x.topic, x.partition) == partition]
        assert offsets == sorted(offsets)
    pinned, _ = await list_letters(
        stack.kafka, stack.registry, both(stack), LetterFilter.build(versions=["2"]), limit=None
    )
    assert sorted(x.request_id or "" for x in pinned) == ["r00", "r01", "r02"]
    view = letter_view(pinned[0])
    assert (view["model"], view["version"], view["code"]) == ("fraud", "2", "MODEL_ERROR")
    assert view["source"]["topic"] == stack.topics.requests


async def test_show_gives_one_letter_whole(dlq_stack: DlqStack, written: list[Spec]) -> None:
    stack = dlq_stack
    everything, _ = await list_letters(
        stack.kafka, stack.registry, both(stack), LetterFilter(), limit=None
    )
    target = next(x for x in everything if x.request_id == "r07")
    letter = await find_letter(
        stack.kafka, stack.registry, target.topic, target.partition, target.offset
    )
    assert letter is not None
    full = letter_view(letter, full=True)
    assert full["request"]["request_id"] == "r07"
    assert full["request"]["inputs"] == [{"name": "features", "datatype": "FP32", "shape": [1, 4]}]
    assert full["error"]["field"] == "features"
    assert full["error"]["details"] == {"version": "1"}
    assert full["original_headers"][0]["key"] == "traceparent"
    assert full["original_key"]["text"] == "key-2"
    garbage = next(x for x in everything if not x.readable)
    shown = await find_letter(
        stack.kafka, stack.registry, garbage.topic, garbage.partition, garbage.offset
    )
    assert shown is not None
    assert shown.code == UNREADABLE
    assert (
        await find_letter(stack.kafka, stack.registry, target.topic, target.partition, 10_000)
        is None
    )
    assert await find_letter(stack.kafka, stack.registry, target.topic, 99, 0) is None


async def test_reading_joins_and_commits_no_group(
    dlq_stack: DlqStack, written: list[Spec], admin: AdminClient
) -> None:
    stack = dlq_stack
    with DeadLetterReader(stack.kafka, stack.registry) as reader:
        ranges = reader.plan(both(stack))
        cursor = reader.read(ranges)
        read = 0
        while not cursor.done:
            read += len(cursor.next_batch())
        group = reader.group_id
    assert read == len(written) + 1
    listed = admin.list_consumer_groups(request_timeout=10).result()
    assert group not in {g.group_id for g in listed.valid}
