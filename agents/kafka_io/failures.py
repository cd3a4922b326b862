"""Where a partition's failures go (`FailureRouter`): the worker's side of the failure policy
(`dlq.policy`): answered, dead-lettered, quarantined or retried, with `hold-key` ordering.
The policy and retries: docs/failures.md ("The failure policy (`dlq/policy.py`)", "Retries").
"""

from __future__ import annotations

import time
from collections import deque
from dataclasses import dataclass, field

from tidegate.agents import worker_metrics as metrics
from tidegate.agents.kafka_io.offsets import OffsetTracker
from tidegate.agents.kafka_io.sinks import ResultSink, SinkEntry
from tidegate.agents.tasks.decoding import KafkaMessage
from tidegate.agents.tasks.inference_task import InferenceTask
from tidegate.core.settings import TopicSettings
from tidegate.dlq.envelopes import dead_letter, source_position
from tidegate.dlq.failure_settings import FailureSettings
from tidegate.dlq.policy import ConfiguredPolicy, FailurePolicy, Verdict
from tidegate.dlq.redelivery import retries_since_redrive
from tidegate.schemas.records import ErrorRecord

__all__ = ["HELD_BEHIND_KEY", "FailureRouter", "KeyHolds", "default_router"]

HELD_BEHIND_KEY = "HELD_BEHIND_KEY"


@dataclass(slots=True)
class _Hold:
    waiting: deque[str] = field(default_factory=deque)
    level: int = 1
    retry_at_ms: int = 0


class KeyHolds:
    """The keys of one partition with a request waiting for a retry, oldest request first."""

    def __init__(self) -> None:
        self._holds: dict[bytes, _Hold] = {}

    def __len__(self) -> int:
        return len(self._holds)

    def blocking(self, key: bytes, request_id: str) -> _Hold | None:
        """The hold `request_id` must wait behind; None when it may be computed."""
        hold = self._holds.get(key)
        if hold is None or (hold.waiting and hold.waiting[0] == request_id):
            return None
        return hold

    def retried(self, key: bytes, request_id: str, level: int, retry_at_ms: int) -> None:
        hold = self._holds.setdefault(key, _Hold())
        if request_id not in hold.waiting:
            hold.waiting.append(request_id)
        if hold.waiting[0] == request_id:
            hold.level, hold.retry_at_ms = level, retry_at_ms

    def held(self, key: bytes, request_id: str) -> None:
        hold = self._holds[key]
        if request_id not in hold.waiting:
            hold.waiting.append(request_id)

    def release(self, key: bytes) -> None:
        """Forget the key's hold (its head was quarantined: nothing of it comes back)."""
        self._holds.pop(key, None)

    def finished(self, key: bytes, request_id: str) -> None:
        hold = self._holds.get(key)
        if hold is None:
            return
        try:
            hold.waiting.remove(request_id)
        except ValueError:
            return
        if not hold.waiting:
            del self._holds[key]


class FailureRouter:
    """One per worker; partitions pass it their failures and their sink entries' tracker."""

    def __init__(
        self,
        policy: FailurePolicy,
        topics: TopicSettings,
        *,
        worker_id: str,
        hold_keys: bool = False,
    ) -> None:
        self.policy = policy
        self.hold_keys = hold_keys
        self._topics = topics
        self._worker_id = worker_id

    def quarantine(
        self,
        sink: ResultSink,
        tracker: OffsetTracker,
        msg: KafkaMessage,
        offset: int,
        error: ErrorRecord,
        task: InferenceTask | None,
    ) -> None:
        self._letter(sink, tracker, self._topics.poison, msg, offset, error, task)

    def failed(
        self,
        sink: ResultSink,
        tracker: OffsetTracker,
        msg: KafkaMessage,
        offset: int,
        task: InferenceTask,
        error: ErrorRecord,
        version: str | None = None,
    ) -> tuple[int, int] | None:
        """Route a failed result's request. None: publish its result; when it is retried
        instead, its retry level and due time. The version that failed, if one was chosen, goes
        into the envelope's error details, so dead letters can be filtered by it."""
        if version is not None:
            error = error.copy()
            error["details"] = {**(error.get("details") or {}), "version": version}
        history = task.lineage.history if task.lineage is not None else []
        verdict = self.policy.decide(task.model, error, retries_since_redrive(history))
        if verdict.action == "retry":
            waited = _after_breaker(error, verdict)
            due = self.retry(sink, tracker, msg, offset, task, error, verdict, waited)
            return verdict.level, due
        if verdict.action == "dead-letter":
            self._letter(sink, tracker, self._topics.failed, msg, offset, error, task)
        elif verdict.action == "quarantine":
            self._letter(sink, tracker, self._topics.poison, msg, offset, error, task)
        return None

    def retry(
        self,
        sink: ResultSink,
        tracker: OffsetTracker,
        msg: KafkaMessage,
        offset: int,
        task: InferenceTask,
        error: ErrorRecord,
        verdict: Verdict,
        retry_at_ms: int | None = None,
    ) -> int:
        """Send the request to wait on the retry topic of `verdict.level`; returns when it is
        due."""
        due = retry_at_ms or int(time.time() * 1000 + verdict.delay_s * 1000)
        topic = self._topics.retry_topic(verdict.level)
        key = msg.key() or (task.request.get("routing_key") or task.request_id).encode()
        self._letter(sink, tracker, topic, msg, offset, error, task, retry_at_ms=due, key=key)
        metrics.RETRIES.labels(task.model, str(error.get("code")), str(verdict.level)).inc()
        return due

    def hold(
        self,
        sink: ResultSink,
        tracker: OffsetTracker,
        msg: KafkaMessage,
        offset: int,
        task: InferenceTask,
        level: int,
        retry_at_ms: int,
    ) -> None:
        """Send a request to wait behind an earlier one of its key, due just after it."""
        error: ErrorRecord = {
            "code": HELD_BEHIND_KEY,
            "message": "an earlier request of the same key is waiting for a retry",
            "error_class": "",
            "retriable": True,
            "field": None,
            "details": {},
        }
        topic = self._topics.retry_topic(level)
        key = msg.key() or (task.request.get("routing_key") or task.request_id).encode()
        self._letter(
            sink, tracker, topic, msg, offset, error, task, retry_at_ms=retry_at_ms, key=key
        )

    def _letter(
        self,
        sink: ResultSink,
        tracker: OffsetTracker,
        topic: str,
        msg: KafkaMessage,
        offset: int,
        error: ErrorRecord,
        task: InferenceTask | None,
        *,
        retry_at_ms: int | None = None,
        key: bytes | None = None,
    ) -> None:
        source = task.source if task is not None and task.source else None
        if source is None:
            source = source_position(str(msg.topic()), msg.partition() or 0, offset)
        lineage = task.lineage if task is not None else None
        now = int(time.time() * 1000)
        ts_type, ts = msg.timestamp()
        envelope = dead_letter(
            source=source,
            error=error,
            key=msg.key(),
            value=msg.value(),
            headers=msg.headers(),
            timestamp_ms=ts if ts_type and ts >= 0 else None,
            failed_at_ms=now,
            first_failed_at_ms=(lineage.first_failed_at_ms if lineage else None) or now,
            attempt=lineage.attempt if lineage is not None else 1,
            request_id=task.request_id if task is not None else None,
            model=task.model if task is not None else None,
            worker_id=self._worker_id,
            origin=lineage.origin if lineage is not None else None,
            history=lineage.history if lineage is not None else (),
            retry_at_ms=retry_at_ms,
        )
        # Keyed like the request's results: a request and those held behind it share a retry
        # partition even when the request itself had no Kafka key.
        sink.add(SinkEntry(tracker, offset, key or msg.key(), letter=(topic, envelope)))
        if retry_at_ms is None:
            metrics.DEAD_LETTERS.labels(topic, str(error["code"])).inc()


def default_router(
    topics: TopicSettings, worker_id: str, settings: FailureSettings | None = None
) -> FailureRouter:
    """The router of the configured policy (`TIDEGATE_FAILURE_*` by default)."""
    settings = settings or FailureSettings()
    policy = ConfiguredPolicy(settings, topics)
    return FailureRouter(
        policy, topics, worker_id=worker_id, hold_keys=settings.ordering == "hold-key"
    )


def _after_breaker(error: ErrorRecord, verdict: Verdict) -> int | None:
    """A request an open breaker refused waits the open period out: its retry delay counts from
    when probes go again, so a breaker open for minutes does not burn the retry budget in
    seconds. None: an ordinary failure, whose delay counts from now."""
    reopens = int((error.get("details") or {}).get("retry_not_before_ms") or 0)
    return int(reopens + verdict.delay_s * 1000) if reopens > time.time() * 1000 else None
