"""The redrive's pure parts: the headers a redriven request carries (read back as the worker reads
them), where it is sent, the options it refuses, the checkpoint's watermark and the topic
choices of the reads."""

from __future__ import annotations

import json
from datetime import UTC, datetime
from typing import Any

import pytest

from tidegate.core.errors import InvalidInputError
from tidegate.core.settings import TopicSettings
from tidegate.dlq.inspect import dead_letter_topics
from tidegate.dlq.letters import Letter, LetterFilter
from tidegate.dlq.redelivery import HISTORY, read_lineage, step
from tidegate.dlq.redrive import redrive_headers, redrive_source, target_topic
from tidegate.dlq.redrive_checkpoint import Checkpoint, fingerprint
from tidegate.dlq.redrive_report import (
    FAILED,
    REDRIVEN,
    MessageOutcome,
    RedriveOptions,
    RedriveProgress,
    RedriveReport,
    check_run_id,
    new_run_id,
)

TOPICS = TopicSettings()
FIRST = datetime(2026, 3, 1, 12, 0, tzinfo=UTC)


def retried_letter() -> Letter:
    """A letter that was retried once before it died, with stale lineage headers of its own."""
    envelope: dict[str, Any] = {
        "original_key": b"card-1",
        "original_value": b"\x00\x00\x00\x00\x07payload",
        "original_headers": [
            {"key": "traceparent", "value": b"00-trace"},
            {"key": "tidegate-attempt", "value": b"2"},
            {"key": "tidegate-history", "value": b"[]"},
        ],
        "source": {"topic": "inference-retry-1", "partition": 0, "offset": 4},
        "origin": {"topic": "inference-requests", "partition": 5, "offset": 99},
        "attempt": 2,
        "first_failed_at": FIRST,
        "failed_at": FIRST,
        "history": [
            {
                "kind": "retry",
                "at": FIRST,
                "from": {"topic": "inference-requests", "partition": 5, "offset": 99},
                "id": None,
                "reason": "UNAVAILABLE",
            }
        ],
        "error": {"code": "MODEL_ERROR", "details": {}},
        "request_id": "r1",
        "model": "fraud",
    }
    return Letter(TOPICS.failed, 2, 41, None, envelope)


def test_a_redriven_request_carries_its_history_plus_the_redrive() -> None:
    letter = retried_letter()
    headers = redrive_headers(letter, run_id="fix-1", at_ms=1_800_000_000_000)
    keys = [k for k, _ in headers]
    assert keys.count("tidegate-attempt") == 1, "stale lineage headers are replaced"
    assert ("traceparent", b"00-trace") in headers
    lineage = read_lineage(headers)
    assert lineage is not None
    assert lineage.attempt == 3
    assert lineage.origin == {"topic": "inference-requests", "partition": 5, "offset": 99}
    assert lineage.first_failed_at_ms == int(FIRST.timestamp() * 1000)
    assert [s["kind"] for s in lineage.history] == ["retry", "redrive"]
    assert lineage.history[0]["at"] == int(FIRST.timestamp() * 1000)
    assert lineage.history[-1] == step(
        "redrive",
        1_800_000_000_000,
        source={"topic": TOPICS.failed, "partition": 2, "offset": 41},
        run_id="fix-1",
    )
    raw = json.loads(dict(headers)[HISTORY] or b"")
    assert raw[-1]["from"] == f"{TOPICS.failed}:2:41"


def test_a_first_failure_becomes_attempt_two_with_its_source_as_origin() -> None:
    envelope: dict[str, Any] = {
        "original_headers": [],
        "source": {"topic": "inference-requests", "partition": 1, "offset": 7},
        "origin": None,
        "attempt": 1,
        "first_failed_at": FIRST,
        "history": [],
    }
    headers = redrive_headers(Letter(TOPICS.failed, 0, 3, None, envelope), run_id="r", at_ms=1)
    lineage = read_lineage(headers)
    assert lineage is not None
    assert (lineage.attempt, lineage.origin) == (2, envelope["source"])
    assert len(lineage.history) == 1


def test_requests_go_back_to_where_they_were_first_read() -> None:
    letter = retried_letter()
    assert target_topic(letter.envelope or {}, TOPICS) == "inference-requests"
    custom = {"source": {"topic": "tenant-a-requests", "partition": 0, "offset": 1}}
    assert target_topic(custom, TOPICS) == "tenant-a-requests"
    from_retry = {"source": {"topic": TOPICS.retry_topic(2), "partition": 0, "offset": 1}}
    assert target_topic(from_retry, TOPICS) == TOPICS.requests
    assert target_topic({}, TOPICS) == TOPICS.requests


def test_a_redrive_reads_the_failed_or_the_poison_topic_only() -> None:
    assert redrive_source(TOPICS, None) == TOPICS.failed
    assert redrive_source(TOPICS, "poison") == TOPICS.poison
    assert redrive_source(TOPICS, TOPICS.poison) == TOPICS.poison
    with pytest.raises(InvalidInputError) as caught:
        redrive_source(TOPICS, TOPICS.retry_topic(1))
    assert caught.value.field == "from"


def test_the_reads_take_dead_letter_topics_only() -> None:
    assert dead_letter_topics(TOPICS, None) == [TOPICS.failed, TOPICS.poison]
    assert dead_letter_topics(TOPICS, "failed") == [TOPICS.failed]
    assert dead_letter_topics(TOPICS, TOPICS.retry_topic(3)) == [TOPICS.retry_topic(3)]
    with pytest.raises(InvalidInputError, match="not a dead-letter topic"):
        dead_letter_topics(TOPICS, "inference-results")


@pytest.mark.parametrize(
    ("changes", "field"),
    [
        ({"rate": 0}, "rate"),
        ({"rate": 1e9}, "rate"),
        ({"limit": 0}, "limit"),
        ({"run_id": "has space"}, "run_id"),
        ({"run_id": "-leading-dash"}, "run_id"),
        ({"delivery_timeout_s": 0}, "timeout"),
    ],
)
def test_bad_options_are_refused_naming_the_field(changes: dict[str, Any], field: str) -> None:
    with pytest.raises(InvalidInputError) as caught:
        RedriveOptions(source=TOPICS.failed, **changes)
    assert caught.value.field == field


def test_run_ids_are_generated_valid_and_distinct() -> None:
    first, second = new_run_id(), new_run_id()
    assert first != second
    assert check_run_id(first) == first


def test_the_checkpoint_stops_at_the_first_letter_not_done() -> None:
    cp = Checkpoint("failed", "fp")
    cp.start(1, 10)
    assert cp.positions() == {1: 10}
    for offset in (10, 11, 12, 13):
        cp.read(1, offset)
    cp.done(1, 12)  # acknowledged out of order
    assert cp.positions() == {1: 10}
    cp.done(1, 10)
    assert cp.positions() == {1: 11}, "11 is not acknowledged yet"
    cp.done(1, 11)
    assert cp.positions() == {1: 13}
    cp.done(1, 13)
    assert cp.positions() == {1: 14}


def test_a_failed_letter_pins_the_checkpoint_so_a_resume_sends_it_again() -> None:
    cp = Checkpoint("failed", "fp")
    for offset in range(5):
        cp.read(0, offset)
    for offset in (0, 1, 3, 4):
        cp.done(0, offset)
    assert cp.positions() == {0: 2}


def test_the_checkpoint_saves_only_what_moved_with_its_fingerprint() -> None:
    cp = Checkpoint("failed", "fp")
    cp.read(0, 0)
    cp.read(1, 0)
    cp.done(0, 0)
    first = cp.unsaved()
    assert [(tp.partition, tp.offset, tp.metadata) for tp in first] == [(0, 1, "fp"), (1, 0, "fp")]
    cp.saved(first)
    assert cp.unsaved() == []
    cp.done(1, 0)
    assert [(tp.partition, tp.offset) for tp in cp.unsaved()] == [(1, 1)]


def test_the_fingerprint_changes_with_the_source_and_the_filters() -> None:
    base = fingerprint("failed", LetterFilter.build(models=["a"]).view())
    assert base == fingerprint("failed", LetterFilter.build(models=["a"]).view())
    assert base != fingerprint("poison", LetterFilter.build(models=["a"]).view())
    assert base != fingerprint("failed", LetterFilter.build(models=["b"]).view())


def test_the_report_says_what_happened_and_how_fast() -> None:
    options = RedriveOptions(source=TOPICS.failed, run_id="r", rate=100)
    progress = RedriveProgress(total=3, scanned=3, redriven=2, failed=1)
    position = {"topic": TOPICS.failed, "partition": 0, "offset": 0}
    report = RedriveReport(
        options,
        progress,
        started_ms=0,
        finished_ms=2_000,
        send_s=2.0,
        outcomes=[MessageOutcome(position, REDRIVEN), MessageOutcome(position, FAILED)],
    )
    view = report.view()
    assert view["achieved_rate"] == 1.5
    assert view["counts"]["redriven"] == 2
    assert [o["outcome"] for o in view["outcomes"]] == ["redriven", "failed"]
    assert not report.ok
    assert "outcomes" not in report.view(outcomes=False)
