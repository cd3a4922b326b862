"""Running a replay: read the planned records, run each on its version, produce the results to the
run's target topic, and checkpoint what Kafka acknowledged.

It runs in the operator's process, beside the live workers and never through them: the reader
assigns partitions and commits nothing (`dlq.replay_reader`), compute is the workers' own data
plane run offline (`Scorer`, implemented by `tidegate.agents.inference.offline`), and results go
to one topic only, never to replies or the dead-letter topics. The live results topic is refused
unless the caller passes `live=True` (`tidegate replay --to-topic inference-results --live`).

Each result carries the request's lineage: its history plus a `replay` step naming this run and
the record it came from, the request's first position as `origin`, its delivery attempt, and the
request's schema id and digest, computed exactly as the worker does.
"""

from __future__ import annotations

import asyncio
import threading
import time
from collections import deque
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol

from aiolimiter import AsyncLimiter
from confluent_kafka import KafkaError, Message
from confluent_kafka.schema_registry import SchemaRegistryClient

from tidegate.core.errors import ConfigurationError, StackError
from tidegate.core.kafka import make_producer
from tidegate.core.settings import KafkaSettings, TopicSettings
from tidegate.core.telemetry import get_logger
from tidegate.dlq.redelivery import step
from tidegate.dlq.replay_reader import Chunk, Decoder, RangeReader, SourceRecord
from tidegate.dlq.replay_settings import ReplaySettings
from tidegate.dlq.replay_state import ReplayCheckpoint, Summary
from tidegate.schemas.catalog import INFERENCE_RESULT, load_schema
from tidegate.schemas.codec import AvroEncoder
from tidegate.schemas.records import ResultRecord

__all__ = ["Progress", "ReplayRunner", "Scorer", "ServedVersions", "check_target", "stamp"]

log = get_logger(__name__)

Progress = Callable[[int, int], None]
"""`(offsets done, offsets planned)`, after every chunk."""


class Scorer(Protocol):
    async def score(self, items: Sequence[tuple[SourceRecord, str]]) -> list[ResultRecord]:
        """One `InferenceResult` record per (record, version), in order; the records' requests
        are decoded."""
        ...


class ServedVersions(Protocol):
    async def versions(self, request_ids: Sequence[str]) -> dict[str, str]: ...


def check_target(target: str, topics: TopicSettings, *, live: bool) -> None:
    """A replay writes results only: never where requests, replies, dead letters or lifecycle
    events live, and to the live results topic only when asked to."""
    forbidden = {
        topics.requests,
        topics.replies,
        topics.failed,
        topics.poison,
        topics.lifecycle,
        topics.shadow,
        topics.audit,
        *topics.retry_topics(),
    }
    if target in forbidden:
        raise ConfigurationError(f"a replay cannot write results to {target!r}")
    if target == topics.results and not live:
        raise ConfigurationError(
            f"{target!r} is the live results topic: its consumers would see the replay; "
            "pass --live to write there anyway"
        )


def stamp(result: ResultRecord, record: SourceRecord, run_id: str, at_ms: int) -> None:
    """The replay's lineage fields on a result."""
    result["source"] = record.position.copy()
    result["origin"] = record.origin.copy()
    result["attempt"] = record.attempt
    result["history"] = [
        *record.history,
        step("replay", at_ms, source=record.position, run_id=run_id),
    ]
    result["request_schema_id"] = record.schema_id
    result["request_digest"] = record.digest


@dataclass(slots=True)
class _Pending:
    end: int
    left: int
    delta: Summary


class _Acks:
    """Per source partition, the chunks whose results Kafka has not all acknowledged yet. A
    partition's checkpoint moves to the end of its oldest chunks once each is fully acked, in
    order; the chunk's counts join the summary at that moment, so the saved summary always
    matches the saved positions."""

    def __init__(self, checkpoint: ReplayCheckpoint) -> None:
        self._checkpoint = checkpoint
        self._chunks: dict[int, deque[_Pending]] = {}
        self._lock = threading.Lock()
        self.failure: KafkaError | None = None

    def add(self, partition: int, end: int, count: int, delta: Summary) -> Callable[..., None]:
        pending = _Pending(end, count, delta)
        with self._lock:
            self._chunks.setdefault(partition, deque()).append(pending)
            self._advance(partition)

        def ack(err: KafkaError | None, msg: Message) -> None:
            with self._lock:
                if err is not None:
                    self.failure = self.failure or err
                    return
                pending.left -= 1
                self._advance(partition)

        return ack

    def _advance(self, partition: int) -> None:
        queue = self._chunks[partition]
        summary = self._checkpoint.summary
        while queue and queue[0].left == 0:
            done = queue.popleft()
            self._checkpoint.positions[partition] = done.end
            delta = done.delta
            summary.read += delta.read
            summary.filtered += delta.filtered
            summary.replayed += delta.replayed
            summary.ok += delta.ok
            summary.errors.update(delta.errors)
            summary.skipped.update(delta.skipped)


class ReplayRunner:
    """One run; `stop()` (Ctrl-C) ends it after the chunk in hand, checkpointed."""

    def __init__(
        self,
        checkpoint: ReplayCheckpoint,
        path: Path,
        *,
        kafka: KafkaSettings,
        registry: SchemaRegistryClient,
        requests: Decoder,
        scorer: Scorer,
        settings: ReplaySettings,
        envelopes: Decoder | None = None,
        served: ServedVersions | None = None,
        rate: float | None = None,
        progress: Progress | None = None,
    ) -> None:
        if checkpoint.version is None and served is None:
            raise ConfigurationError("without a version, a replay needs the served versions")
        self.checkpoint = checkpoint
        self.path = path
        self._kafka = kafka
        self._requests = requests
        self._envelopes = envelopes
        self._scorer = scorer
        self._served = served
        self._settings = settings
        self._limiter = AsyncLimiter(rate, 1.0) if rate else None
        self._progress = progress
        self._encoder = AvroEncoder(registry, load_schema(INFERENCE_RESULT))
        self._stopping = False
        self._read_to = {
            r.partition: checkpoint.position(r.partition) for r in checkpoint.plan.ranges
        }

    def stop(self) -> None:
        self._stopping = True

    async def run(self) -> Summary:
        """Replay what is left of the plan; the checkpoint is saved on every way out."""
        cp = self.checkpoint
        schema_id = self._encoder.schema_id(f"{cp.target_topic}-value")
        reader = RangeReader(
            self._kafka,
            cp.plan,
            cp.positions,
            requests=self._requests,
            envelopes=self._envelopes,
            group_id=f"{self._settings.group_prefix}-{cp.run_id}",
            batch_size=cp.batch_size,
            select=self._selector(),
            stall_timeout_s=self._settings.stall_timeout_s,
        )
        producer = make_producer(self._kafka)
        acks = _Acks(cp)
        cp.status = "running"
        saved_at = 0.0
        left_over = False  # chunks read but not run: the plan is not done even if all was read
        try:
            while not reader.done and not self._stopping:
                chunks = await asyncio.to_thread(reader.poll, 0.5)
                for index, chunk in enumerate(chunks):
                    await self._chunk(chunk, producer, acks, schema_id)
                    if self._stopping:
                        left_over = index + 1 < len(chunks)
                        break
                producer.poll(0)
                if acks.failure is not None:
                    raise StackError(f"Kafka did not take a replayed result: {acks.failure}")
                if time.monotonic() - saved_at >= self._settings.checkpoint_every_s:
                    cp.save(self.path)
                    saved_at = time.monotonic()
            cp.status = "done" if reader.done and not left_over else "interrupted"
        except BaseException:
            cp.status = "failed"
            raise
        finally:
            left = await asyncio.to_thread(producer.flush, 30.0)
            if left or acks.failure is not None:
                cp.status = "failed"
            cp.save(self.path)
            await asyncio.to_thread(reader.close)
        return cp.summary

    def _selector(self) -> Callable[[SourceRecord], bool]:
        model, ids = self.checkpoint.model, frozenset(self.checkpoint.request_ids)

        def select(record: SourceRecord) -> bool:
            if model is not None and record.model != model:
                return False
            return not ids or record.request_id in ids

        return select

    async def _chunk(self, chunk: Chunk, producer: Any, acks: _Acks, schema_id: int) -> None:
        cp = self.checkpoint
        delta = Summary(read=chunk.read, filtered=chunk.read - len(chunk.records))
        if chunk.gave_up:
            delta.skipped["stalled before the planned end"] += chunk.gave_up
        items = await self._versions(chunk.records, delta)
        if items and self._limiter is not None:
            left: float = len(items)
            while left > 0:
                # At most the bucket's size at a time (a larger acquire never succeeds); a rate
                # below 1/s takes fractions of a request.
                take = min(left, self._limiter.max_rate)
                await self._limiter.acquire(take)
                left -= take
        results = await self._scorer.score(items) if items else []
        at_ms = int(time.time() * 1000)
        rule = "replay:version" if cp.version else "replay:served"
        encoded: list[tuple[bytes | None, bytes]] = []
        for (record, _), result in zip(items, results, strict=True):
            stamp(result, record, cp.run_id, at_ms)
            result["routing_rule"] = rule
            delta.replayed += 1
            if result["status"] == "OK":
                delta.ok += 1
            else:
                error = result.get("error")
                delta.errors[(error["code"] if error else "") or result["status"]] += 1
            encoded.append((record.key, self._encoder.encode(result, schema_id)))
        ack = acks.add(chunk.partition, chunk.end, len(encoded), delta)
        for key, value in encoded:
            while True:
                try:
                    producer.produce(cp.target_topic, key=key, value=value, on_delivery=ack)
                    break
                except BufferError:
                    await asyncio.to_thread(producer.poll, 0.1)
        if self._progress is not None:
            self._progress(self._done(chunk), cp.plan.total)

    async def _versions(
        self, records: Sequence[SourceRecord], delta: Summary
    ) -> list[tuple[SourceRecord, str]]:
        decoded = []
        for record in records:
            if record.request is None:
                code = record.error.code if record.error is not None else "UNDECODABLE"
                delta.errors[code] += 1
            else:
                decoded.append(record)
        version = self.checkpoint.version
        if version is not None:
            return [(r, version) for r in decoded]
        if self._served is None:
            raise ConfigurationError("without a version, a replay needs the served versions")
        served = await self._served.versions([str(r.request_id) for r in decoded])
        items = []
        for record in decoded:
            found = served.get(str(record.request_id))
            if found is None:
                delta.skipped["no served version"] += 1
            else:
                items.append((record, found))
        return items

    def _done(self, chunk: Chunk) -> int:
        """Offsets read so far (acknowledged or not), for the progress bar."""
        self._read_to[chunk.partition] = chunk.end
        return sum(
            max(0, min(self._read_to.get(r.partition, r.start), r.end) - r.start)
            for r in self.checkpoint.plan.ranges
        )
