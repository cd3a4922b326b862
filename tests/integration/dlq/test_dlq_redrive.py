"""The redrive against the real Kafka and registry: a 10,000-letter backlog is listed and redriven
at the configured rate with progress, and every request arrives again with its key, bytes,
request id and the redrive in its history; a run stopped by its limit resumes where it stopped;
a dry run sends nothing; filters skip what they leave out; the poison topic redrives its bytes."""

from __future__ import annotations

import json
import time
from typing import Any, cast

import pytest
from confluent_kafka import Message

from tests.integration.dlq.dlq_fixtures import DlqStack, backlog, read_all
from tidegate.core.errors import InvalidInputError, WireFormatError
from tidegate.dlq.inspect import list_letters
from tidegate.dlq.letters import LetterFilter
from tidegate.dlq.redelivery import ATTEMPT, HISTORY, ORIGIN
from tidegate.dlq.redrive import Redrive
from tidegate.dlq.redrive_report import RedriveOptions, RedriveProgress


def headers_of(msg: Message) -> dict[str, bytes]:
    pairs = cast(list[tuple[str, bytes | None]], msg.headers() or [])
    return {k: v or b"" for k, v in pairs}


def redriven_ids(stack: DlqStack, messages: list[Message]) -> list[str]:
    return [stack.decode_request(m.value())["request_id"] for m in messages]


async def test_a_10k_backlog_is_listed_and_redriven_at_the_rate_with_progress(
    dlq_stack: DlqStack,
) -> None:
    stack, count, rate = dlq_stack, 10_000, 5_000.0
    values = backlog(stack, count)
    listed, more = await list_letters(
        stack.kafka, stack.registry, [stack.topics.failed], LetterFilter(), limit=None
    )
    assert (len(listed), more) == (count, False)

    seen: list[tuple[int, int, int]] = []

    def progress(p: RedriveProgress) -> None:
        seen.append((p.scanned, p.redriven, p.total))

    options = RedriveOptions(source=stack.topics.failed, run_id="it-10k", rate=rate)
    report = await Redrive(
        stack.kafka, stack.topics, stack.registry, options, on_progress=progress
    ).run()

    assert report.ok
    assert (report.progress.redriven, report.progress.failed, report.progress.skipped) == (
        count,
        0,
        0,
    )
    # Paced: never faster than the rate (beyond the first burst of 1/20 s). How close it comes to
    # the rate is a matter of the machine's speed: `python -m tests.bench redrive` measures it.
    burst = rate / 20
    assert report.send_s >= (count - burst) / rate * 0.98, report.send_s
    achieved = report.achieved_rate
    assert achieved is not None
    assert achieved <= rate * 1.08, achieved
    # Progress moved forward in many steps, to the total.
    assert len(seen) >= 20
    assert [s[0] for s in seen] == sorted(s[0] for s in seen)
    assert seen[-1] == (count, count, count)
    assert report.checkpoint == {p: o + 1 for p, o in _last_offsets(listed).items()}

    arrived = read_all(stack, stack.topics.requests, count)
    assert len(arrived) == count
    position_of = {o.request_id: o.position for o in report.outcomes}
    key_of = {x.request_id: (x.envelope or {})["original_key"] for x in listed}
    for msg in arrived:
        rid = stack.decode_request(msg.value())["request_id"]
        assert msg.value() == values[rid]
        assert msg.key() == key_of[rid]
        headers = headers_of(msg)
        assert headers["traceparent"].startswith(b"00-0af7651916cd43dd")
        assert headers[ATTEMPT] == b"2"
        assert headers[ORIGIN].startswith(stack.topics.requests.encode())
        last = json.loads(headers[HISTORY])[-1]
        where = position_of[rid]
        assert last["kind"] == "redrive"
        assert last["id"] == "it-10k"
        assert last["from"] == f"{where['topic']}:{where['partition']}:{where['offset']}"
    assert sorted(redriven_ids(stack, arrived)) == sorted(values)


def _last_offsets(letters: list[Any]) -> dict[int, int]:
    last: dict[int, int] = {}
    for x in letters:
        last[x.partition] = max(last.get(x.partition, -1), x.offset)
    return last


async def test_a_run_stopped_by_its_limit_resumes_where_it_stopped(dlq_stack: DlqStack) -> None:
    stack = dlq_stack
    values = backlog(stack, 300)
    first = RedriveOptions(source=stack.topics.failed, run_id="it-resume", rate=2000, limit=120)
    report = await Redrive(stack.kafka, stack.topics, stack.registry, first).run()
    assert report.progress.redriven == 120
    again = RedriveOptions(source=stack.topics.failed, run_id="it-resume", rate=2000, resume=True)
    resumed = await Redrive(stack.kafka, stack.topics, stack.registry, again).run()
    assert resumed.resumed_from == report.checkpoint
    assert resumed.progress.redriven == 180
    arrived = read_all(stack, stack.topics.requests, 300)
    ids = redriven_ids(stack, arrived)
    assert sorted(ids) == sorted(values), "each letter exactly once over the two runs"
    # Nothing left: a third resume sends nothing.
    third = await Redrive(stack.kafka, stack.topics, stack.registry, again).run()
    assert third.progress.scanned == 0
    # A resume with other filters would skip letters they select: refused.
    other = RedriveOptions(
        source=stack.topics.failed,
        run_id="it-resume",
        resume=True,
        letters=LetterFilter.build(models=["fraud"]),
    )
    with pytest.raises(InvalidInputError, match="other filters"):
        await Redrive(stack.kafka, stack.topics, stack.registry, other).run()


async def test_a_dry_run_sends_nothing_and_filters_skip(dlq_stack: DlqStack) -> None:
    stack = dlq_stack
    backlog(stack, 40, models=("fraud", "minilm"))
    dry = RedriveOptions(
        source=stack.topics.failed,
        run_id="it-dry",
        dry_run=True,
        letters=LetterFilter.build(models=["minilm"]),
    )
    report = await Redrive(stack.kafka, stack.topics, stack.registry, dry).run()
    assert (report.progress.would_redrive, report.progress.skipped) == (20, 20)
    assert {o.target for o in report.outcomes if o.outcome == "would_redrive"} == {
        stack.topics.requests
    }
    assert report.checkpoint, "the positions are reported"
    real = RedriveOptions(
        source=stack.topics.failed,
        run_id="it-filtered",
        rate=1000,
        letters=LetterFilter.build(models=["minilm"]),
    )
    done = await Redrive(stack.kafka, stack.topics, stack.registry, real).run()
    assert (done.progress.redriven, done.progress.skipped) == (20, 20)
    arrived = read_all(stack, stack.topics.requests, 20)
    assert len(arrived) == 20, "the dry run sent nothing, the real one only the minilm letters"
    assert {stack.decode_request(m.value())["model"] for m in arrived} == {"minilm"}
    skipped = [o for o in done.outcomes if o.outcome == "skipped"]
    assert {o.reason for o in skipped} == {"filtered"}
    assert {o.model for o in skipped} == {"fraud"}


async def test_the_poison_topic_redrives_the_same_bytes(dlq_stack: DlqStack) -> None:
    stack = dlq_stack
    now = int(time.time() * 1000)
    good = stack.request_bytes("p1", "fraud")
    letters: list[tuple[dict[str, Any] | bytes, int]] = [
        (
            stack.envelope(
                exc=WireFormatError("registry was down"),
                failed_at_ms=now,
                key=b"k1",
                value=good,
                rid=None,
                model=None,
            ),
            now,
        ),
        (
            stack.envelope(
                exc=WireFormatError("null"),
                failed_at_ms=now,
                key=b"k2",
                value=None,
                rid=None,
                model=None,
            ),
            now,
        ),
    ]
    stack.produce_letters(stack.topics.poison, letters)
    options = RedriveOptions(source=stack.topics.poison, run_id="it-poison", rate=100)
    report = await Redrive(stack.kafka, stack.topics, stack.registry, options).run()
    assert (report.progress.redriven, report.progress.failed) == (1, 1)
    failed = next(o for o in report.outcomes if o.outcome == "failed")
    assert failed.reason == "the envelope holds no original value"
    (msg,) = read_all(stack, stack.topics.requests, 1)
    assert (msg.key(), msg.value()) == (b"k1", good)
    assert json.loads(headers_of(msg)[HISTORY])[-1]["from"].startswith(stack.topics.poison)
