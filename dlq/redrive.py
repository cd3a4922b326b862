"""The redrive: send dead letters through the pipeline again, once their cause is fixed.

Each selected letter's original key, value and headers are republished, byte for byte, to the
topic the request was first read from (the envelope's `origin`, else its `source`; the requests
topic when that is a failure topic), with the lineage headers of `tidegate.dlq.redelivery`: the
next attempt number, the origin, and the history so far plus one `redrive` step whose `from` is
the dead letter's own position and whose `id` is the run id. So a redriven request keeps its
request id, and its result's lineage says it was redriven, from where and by which run.

A run reads its source topic as a snapshot (`tidegate.dlq.inspect`: up to the high watermarks it
found at the start), so the letters its own redriven requests may produce are not read back. It
sends at a bounded rate (`aiolimiter.AsyncLimiter`, with a burst of at most 1/20 s of the rate),
waits for Kafka's delivery report of every message, and reports each letter: redriven, skipped
(filtered out), or failed (not delivered, or nothing to redrive). A dry run reads and filters the
same way, at full speed, and produces nothing.

Running a redrive twice redrives twice (at-least-once). The run id names a checkpoint
(`tidegate.dlq.redrive_checkpoint`, saved about every second and at the end); `resume` starts
where the last run with that id stopped, so only what it had not finished is sent again.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable, Mapping, Sequence
from typing import Any

from aiolimiter import AsyncLimiter
from confluent_kafka import KafkaError, KafkaException, Message, Producer
from confluent_kafka.schema_registry import SchemaRegistryClient

from tidegate.core.errors import InvalidInputError
from tidegate.core.kafka import make_producer
from tidegate.core.settings import KafkaSettings, SchemaRegistrySettings, TopicSettings
from tidegate.dlq.inspect import DeadLetterReader, ReadCursor
from tidegate.dlq.letters import Letter, to_ms
from tidegate.dlq.redelivery import read_back, redelivery_headers, step
from tidegate.dlq.redrive_checkpoint import (
    Checkpoint,
    fingerprint,
    group_for,
    load_checkpoint,
    save_checkpoint,
)
from tidegate.dlq.redrive_report import (
    FAILED,
    REDRIVEN,
    SKIPPED,
    WOULD_REDRIVE,
    MessageOutcome,
    RedriveOptions,
    RedriveProgress,
    RedriveReport,
)

__all__ = ["Redrive", "redrive_headers", "redrive_source", "target_topic"]

ProgressListener = Callable[[RedriveProgress], None]
_SAVE_EVERY_S = 1.0
_BURST_S = 0.05


def redrive_source(topics: TopicSettings, name: str | None) -> str:
    """The topic a redrive reads: `failed` (the default), `poison`, or either's name."""
    choice = (name or "failed").strip()
    found = {"failed": topics.failed, "poison": topics.poison}.get(choice)
    if found is not None:
        return found
    if choice in (topics.failed, topics.poison):
        return choice
    raise InvalidInputError(
        f"a redrive reads the failed or the poison topic ({topics.failed}, {topics.poison}), "
        f"not {choice!r}",
        field="from",
    )


def target_topic(envelope: Mapping[str, Any], topics: TopicSettings) -> str:
    """Where the request was first read; the requests topic when that is unknown or is one of
    the failure topics (a retry's source)."""
    where = envelope.get("origin") or envelope.get("source") or {}
    topic = where.get("topic")
    failure_topics = {topics.failed, topics.poison, *topics.retry_topics()}
    if not topic or topic in failure_topics:
        return topics.requests
    return str(topic)


def redrive_headers(letter: Letter, *, run_id: str, at_ms: int) -> list[tuple[str, bytes | None]]:
    """The original headers with the lineage of one more delivery, a redrive by `run_id`."""
    envelope = letter.envelope or {}
    history = [read_back(item) for item in envelope.get("history") or ()]
    history.append(step("redrive", at_ms, source=letter.position, run_id=run_id))
    original = [(h["key"], h.get("value")) for h in envelope.get("original_headers") or ()]
    return redelivery_headers(
        original,
        attempt=int(envelope.get("attempt") or 1) + 1,
        origin=envelope.get("origin") or envelope.get("source") or letter.position,
        history=history,
        first_failed_at_ms=to_ms(envelope.get("first_failed_at")),
    )


class Redrive:
    """One run. `run()` once; `stop()` (from the same loop) ends it early, after the messages
    already sent are acknowledged and the checkpoint saved."""

    def __init__(
        self,
        kafka: KafkaSettings,
        topics: TopicSettings,
        registry: SchemaRegistrySettings | SchemaRegistryClient,
        options: RedriveOptions,
        *,
        on_progress: ProgressListener | None = None,
        timeout_s: float = 10.0,
    ) -> None:
        self.options = options
        self.progress = RedriveProgress()
        self.report = RedriveReport(options, self.progress, started_ms=int(time.time() * 1000))
        self._kafka = kafka
        self._topics = topics
        self._registry = registry
        self._on_progress = on_progress
        self._timeout_s = timeout_s
        self._stopping = False
        burst = max(1.0, options.rate * _BURST_S)
        self._chunk = int(burst)
        self._limiter = AsyncLimiter(burst, burst / options.rate)
        self._selected = 0
        self._unacked: dict[tuple[int, int], tuple[Letter, str]] = {}
        self._first_send: float | None = None
        self._last_ack: float | None = None
        self._checkpoint = Checkpoint(
            options.source, fingerprint(options.source, options.letters.view())
        )

    def stop(self) -> None:
        self._stopping = True

    @property
    def stopping(self) -> bool:
        return self._stopping

    async def run(self) -> RedriveReport:
        options = self.options
        reader = DeadLetterReader(
            self._kafka,
            self._registry,
            group_id=group_for(options.run_id),
            timeout_s=self._timeout_s,
        )
        producer: Producer | None = None
        try:
            cursor = await asyncio.to_thread(self._open, reader)
            if not options.dry_run:
                producer = make_producer(
                    self._kafka, {"message.timeout.ms": int(options.delivery_timeout_s * 1000)}
                )
            await self._pump(reader, cursor, producer)
            if producer is not None:
                await self._drain(producer)
            if not options.dry_run:
                await asyncio.to_thread(save_checkpoint, reader.consumer, self._checkpoint)
        except asyncio.CancelledError:
            # Cancelled from outside: keep what Kafka acknowledged, so a resume skips it.
            if producer is not None:
                producer.flush(min(5.0, options.delivery_timeout_s))
            if not options.dry_run:
                save_checkpoint(reader.consumer, self._checkpoint)
            self.report.stopped = True
            raise
        finally:
            self._finish()
            reader.close()
        return self.report

    def _open(self, reader: DeadLetterReader) -> ReadCursor:
        options, source = self.options, self.options.source
        starts: dict[tuple[str, int], int] = {}
        if options.resume:
            partitions = reader.partitions(source)
            starts = load_checkpoint(
                reader.consumer,
                source,
                partitions,
                self._checkpoint.fingerprint,
                self._timeout_s,
            )
            self.report.resumed_from = {p: o for (_t, p), o in starts.items()}
        ranges = reader.plan([source], since_ms=options.letters.since_ms, starts=starts)
        for r in ranges:
            self._checkpoint.start(r.partition, r.start)
        cursor = reader.read(ranges, with_requests=options.letters.needs_request)
        self.progress.total = cursor.total
        return cursor

    async def _pump(
        self, reader: DeadLetterReader, cursor: ReadCursor, producer: Producer | None
    ) -> None:
        saved_at = time.monotonic()
        while not cursor.done and not self._halted:
            batch = await asyncio.to_thread(cursor.next_batch)
            for start in range(0, len(batch), self._chunk):
                if self._halted:
                    break
                await self._send(batch[start : start + self._chunk], producer)
                self._notify()
                if producer is not None and time.monotonic() - saved_at >= _SAVE_EVERY_S:
                    await asyncio.to_thread(save_checkpoint, reader.consumer, self._checkpoint)
                    saved_at = time.monotonic()
        self.report.stopped = self._stopping

    @property
    def _halted(self) -> bool:
        limit = self.options.limit
        return self._stopping or (limit is not None and self._selected >= limit)

    async def _send(self, letters: Sequence[Letter], producer: Producer | None) -> None:
        chosen: list[Letter] = []
        limit = self.options.limit
        for letter in letters:
            if limit is not None and self._selected >= limit:
                break  # not read as far as the checkpoint is concerned
            self.progress.scanned += 1
            self._checkpoint.read(letter.partition, letter.offset)
            reason = self._pass_over(letter)
            if reason is not None:
                outcome = SKIPPED if reason == "filtered" else FAILED
                self._outcome(letter, outcome, reason=reason)
                self._checkpoint.done(letter.partition, letter.offset)
                continue
            self._selected += 1
            chosen.append(letter)
        if not chosen:
            return
        if producer is None:
            for letter in chosen:
                self._outcome(letter, WOULD_REDRIVE, target=self._target(letter))
            return
        await self._limiter.acquire(len(chosen))
        if self._first_send is None:
            self._first_send = time.monotonic()
        at_ms = int(time.time() * 1000)
        for letter in chosen:
            self._produce(producer, letter, at_ms)
        producer.poll(0)

    def _pass_over(self, letter: Letter) -> str | None:
        """Why a letter is not redriven: filtered out, or nothing there to send again."""
        if not letter.readable:
            return f"not a dead-letter envelope: {letter.problem}"
        if not self.options.letters.matches(letter):
            return "filtered"
        if (letter.envelope or {}).get("original_value") is None:
            return "the envelope holds no original value"
        return None

    def _target(self, letter: Letter) -> str:
        return target_topic(letter.envelope or {}, self._topics)

    def _produce(self, producer: Producer, letter: Letter, at_ms: int) -> None:
        envelope = letter.envelope or {}
        target = self._target(letter)

        def delivered(err: KafkaError | None, _msg: Message) -> None:
            if self._unacked.pop((letter.partition, letter.offset), None) is None:
                return  # already reported as unacknowledged when the run gave up waiting
            self.progress.in_flight -= 1
            self._last_ack = time.monotonic()
            if err is not None:
                self._outcome(letter, FAILED, target=target, reason=f"not delivered: {err}")
                return
            self._outcome(letter, REDRIVEN, target=target)
            self._checkpoint.done(letter.partition, letter.offset)

        kwargs: dict[str, Any] = {
            "key": envelope.get("original_key"),
            "value": envelope.get("original_value"),
            "headers": redrive_headers(letter, run_id=self.options.run_id, at_ms=at_ms),
            "on_delivery": delivered,
        }
        while True:
            try:
                producer.produce(target, **kwargs)
            except BufferError:
                producer.poll(0.1)  # the local queue is full: let deliveries drain it
                continue
            except KafkaException as exc:
                self._outcome(letter, FAILED, target=target, reason=f"not produced: {exc}")
                return
            self.progress.in_flight += 1
            self._unacked[(letter.partition, letter.offset)] = (letter, target)
            return

    async def _drain(self, producer: Producer) -> None:
        deadline = time.monotonic() + self.options.delivery_timeout_s + 5.0
        while self.progress.in_flight > 0 and time.monotonic() < deadline:
            producer.poll(0)
            await asyncio.sleep(0.01)
        producer.poll(0)
        waited = self.options.delivery_timeout_s + 5.0
        for letter, target in self._unacked.values():
            reason = f"no delivery report within {waited:.0f} s (a resume sends it again)"
            self._outcome(letter, FAILED, target=target, reason=reason)
        self._unacked.clear()
        self.progress.in_flight = 0
        self._notify()

    def _outcome(
        self,
        letter: Letter,
        outcome: str,
        *,
        target: str | None = None,
        reason: str | None = None,
    ) -> None:
        self.progress.count(outcome)
        self.report.outcomes.append(
            MessageOutcome(
                letter.position,
                outcome,
                request_id=letter.request_id,
                model=letter.model,
                code=letter.code,
                target=target,
                reason=reason,
            )
        )

    def _notify(self) -> None:
        if self._on_progress is not None:
            self._on_progress(self.progress)

    def _finish(self) -> None:
        report = self.report
        report.finished_ms = int(time.time() * 1000)
        if self._first_send is not None and self._last_ack is not None:
            report.send_s = max(0.0, self._last_ack - self._first_send)
        report.checkpoint = self._checkpoint.positions()
        report.outcomes.sort(key=lambda o: (o.position["partition"], o.position["offset"]))
