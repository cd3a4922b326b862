"""The worker's Kafka hot path (`InferenceWorker`): a confluent-kafka batch consumer on a thread of
its own, feeding one batch queue per model on the event loop, with results delivered in offset
order and committed only once delivered (or in a transaction, exactly-once). One topic per worker.
Threads, commits, revoke and stop: docs/worker.md ("Threads and the event loop", "Results,
offsets and commits", "Pausing, revoking and stopping").
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import Callable, Mapping, Sequence
from contextlib import AbstractAsyncContextManager, nullcontext
from typing import Any

from confluent_kafka import Consumer, KafkaException, Message, TopicPartition

from tidegate.agents import worker_metrics as metrics
from tidegate.agents.inference.batching import KeyedBatcher
from tidegate.agents.inference.inference_service import InferenceService
from tidegate.agents.kafka_io.consumer_cycle import ConsumerCycle, highest_offsets
from tidegate.agents.kafka_io.crash_guard import CrashGuard
from tidegate.agents.kafka_io.delivery import ResultPublisher
from tidegate.agents.kafka_io.failures import FailureRouter, default_router
from tidegate.agents.kafka_io.membership import check_membership, consumer_options, prepare_group
from tidegate.agents.kafka_io.partition import PartitionPipeline, Slot, hand_over
from tidegate.agents.kafka_io.report_poller import ReportPoller
from tidegate.agents.kafka_io.sinks import AckedSink, ResultSink, TransactionalSink
from tidegate.agents.kafka_io.solo_lane import SoloLane
from tidegate.agents.kafka_io.worker_producers import Transactions, start_publisher, worker_producer
from tidegate.agents.tasks.decoding import RequestDecoder
from tidegate.agents.tasks.worker_tracing import batch_span, consumed
from tidegate.agents.worker_settings import WorkerSettings
from tidegate.core.aio import OwnerThread, cancel_and_wait
from tidegate.core.errors import RetriableError
from tidegate.core.kafka import make_consumer
from tidegate.core.settings import KafkaSettings, TopicSettings
from tidegate.core.telemetry import get_logger
from tidegate.core.tracing import TRACING_OFF, Tracing
from tidegate.dlq.retry_relay import RetryRelay
from tidegate.schemas.catalog import INFERENCE_REQUEST, load_schema
from tidegate.schemas.codec import AvroDecoder, Registry, registry_client
from tidegate.schemas.records import ResultRecord

__all__ = ["InferenceWorker"]

log = get_logger(__name__)

_FETCH_MAX = 500
# Committing on every poll cycle sent hundreds of commit requests a second per worker; a commit
# every 100 ms bounds redelivery after a crash to that much work (at-least-once either way).
_COMMIT_EVERY_S = 0.1
_RETRY_DECODE_S = 1.0


class InferenceWorker:
    def __init__(
        self,
        service: InferenceService,
        *,
        settings: WorkerSettings,
        kafka: KafkaSettings,
        topics: TopicSettings,
        registry: Registry,
        drain_timeout_s: float | None = None,
        poll_timeout_s: float = 0.1,
        consumer_extra: Mapping[str, Any] | None = None,
        tracing: Tracing = TRACING_OFF,
        failures: FailureRouter | None = None,
        crash_guard: CrashGuard | None = None,
        relay: RetryRelay | None = None,
        requests_topic: str | None = None,
        lane: Callable[[], AbstractAsyncContextManager[None]] = nullcontext,
    ) -> None:
        self.service = service
        self.failures = failures or default_router(topics, settings.worker_id)
        self._guard = crash_guard
        self._relay = relay
        self._tracing = tracing
        self.settings = settings
        self.topics = topics
        self.requests_topic = requests_topic or topics.requests
        self._lane = lane
        self._kafka = kafka
        self._registry = registry
        self._drain_timeout = drain_timeout_s or settings.drain_timeout_s
        self._poll_timeout = poll_timeout_s
        self._consumer_extra = {**consumer_options(settings), **(consumer_extra or {})}
        self._exactly_once = settings.delivery == "exactly-once"
        self._pipelines: dict[int, PartitionPipeline] = {}
        self._commit_at = 0.0
        self._committed: dict[int, int] = {}
        self._txn_positions: dict[int, int] = {}
        # Where the next poll cycle seeks each partition first (decode retries, rewinds); the
        # epoch counts rewinds, so a batch fetched across one is known to be stale.
        self._seeks: dict[int, int] = {}
        self._epoch = 0
        self._tasks: list[asyncio.Task[None]] = []
        self._reports: ReportPoller | None = None
        # Set once `stop()` has drained: the revoke that `close()` triggers must not wait again.
        self._drained = False

    @property
    def transactional_id(self) -> str:
        return self.settings.transactional_id or (
            f"{self.settings.group_id}-{self.settings.worker_id}"
        )

    async def start(self) -> None:
        """Connect, subscribe and start consuming; models should be loaded before this."""
        self._loop = asyncio.get_running_loop()
        self._stopping = asyncio.Event()
        self._failed: asyncio.Future[None] = self._loop.create_future()
        client = registry_client(self._registry)
        client_id = f"{self._kafka.client_id}-{self.settings.worker_id}"
        transactions = (
            Transactions(self.transactional_id, self.settings.transaction_timeout_ms)
            if self._exactly_once
            else None
        )
        producer = worker_producer(self._kafka, client_id, transactions)
        self._publisher = ResultPublisher(producer, client, self.topics)
        self._decoder = RequestDecoder(
            AvroDecoder(client, load_schema(INFERENCE_REQUEST)), self._publisher.reply_refusal
        )
        await asyncio.to_thread(start_publisher, self._publisher, self._kafka, self._exactly_once)
        self._sink = self._new_sink()
        if self._relay is not None:
            await asyncio.to_thread(self._relay.start)
        self._batcher: KeyedBatcher[Slot, ResultRecord] = KeyedBatcher(
            self._compute,
            self._delivered,
            max_batch_size=self.settings.max_batch_size,
            max_batch_delay_ms=self.settings.max_batch_delay_ms,
            observer=metrics.PrometheusBatchObserver(),
        )
        self._thread = OwnerThread("kafka-consumer")
        self._thread.start()
        self._reports = ReportPoller(self._publisher, self._loop, self.fail)
        self._reports.start()
        await asyncio.to_thread(prepare_group, self._kafka, self.settings)
        extra = {"client.id": client_id, **self._consumer_extra}
        self._consumer: Consumer = make_consumer(self._kafka, self.settings.group_id, extra)
        self._cycler = ConsumerCycle(
            self._consumer,
            poll_timeout_s=self._poll_timeout,
            group_metadata=self._exactly_once,
            fetch_window_s=self.settings.fetch_window_ms / 1000.0,
            fetch_idle_s=self.settings.fetch_idle_ms / 1000.0,
        )
        self._consumer.subscribe(
            [self.requests_topic],
            on_assign=self._on_assign,
            on_revoke=self._on_revoke,
            on_lost=self._on_lost,
        )
        self._tasks = [self._loop.create_task(self._fetch(), name="kafka-fetch")]
        self._solo: SoloLane | None = None
        if self._guard is not None:
            self._solo = SoloLane(
                self._guard, self._pipelines, self._compute_now, self._delivered, self._reread
            )
            self._tasks.insert(0, self._solo.start())
        if isinstance(self._sink, TransactionalSink):
            self._tasks.insert(0, self._loop.create_task(self._transact(), name="transactions"))
        for task in self._tasks:
            task.add_done_callback(self._watch)

    def _new_sink(self) -> ResultSink:
        if self._exactly_once:
            return TransactionalSink(
                self._publisher,
                worker_id=self.settings.worker_id,
                on_fatal=self.fail,
                positions=self._positions,
                group_metadata=lambda: self._cycler.group_metadata,
                on_committed=self._transaction_committed,
                on_aborted=self._rewind,
                timeout_s=self.settings.transaction_timeout_ms / 2000.0,
                traced=self._tracing.enabled,
            )
        return AckedSink(
            self._publisher,
            worker_id=self.settings.worker_id,
            on_fatal=self.fail,
            traced=self._tracing.enabled,
        )

    @property
    def publisher(self) -> ResultPublisher:
        """The worker's producer (after `start`); side records such as shadow comparisons use it
        too, so a worker keeps one producer."""
        return self._publisher

    @property
    def stopped(self) -> bool:
        """Whether the worker has stopped, or failed (`wait` raises what made it fail)."""
        return self._failed.done()

    async def wait(self) -> None:
        """Return when the worker stops; raise what made it fail, if anything did."""
        await asyncio.shield(self._failed)

    async def stop(self) -> None:
        self._stopping.set()
        fetch = self._tasks[-1]
        await asyncio.gather(fetch, return_exceptions=True)
        drained = await asyncio.gather(
            *(p.drain(self._drain_timeout) for p in self._pipelines.values())
        )
        self._drained = True
        if not all(drained):
            log.warning("stopping with undelivered results; they are redone after a restart")
        commits = [] if self._exactly_once else self._positions()
        await self._end_transaction()
        await self._thread.call(self._cycler.close, commits)
        if self._guard is not None:
            await self._guard.released(list(self._pipelines))
        for pipeline in list(self._pipelines.values()):
            pipeline.close()
        self._pipelines.clear()
        await self._batcher.stop()
        if self._reports is not None:
            self._reports.stop()  # the flush serves the last reports, on its own thread
        left = await asyncio.to_thread(self._publisher.flush, 10.0)
        if left:
            log.warning("%d messages not acknowledged at shutdown", left)
        await cancel_and_wait(self._tasks)
        await asyncio.to_thread(self._thread.stop)
        if self._relay is not None:
            await asyncio.to_thread(self._relay.stop)
        metrics.IN_FLIGHT.set(0)
        if not self._failed.done():
            self._failed.set_result(None)

    async def _end_transaction(self) -> None:
        """Exactly-once: commit what a healthy worker produced, abort what a failing one did."""
        sink = self._sink
        if not isinstance(sink, TransactionalSink):
            return
        if self._failed.done():
            await sink.abort()
            return
        with contextlib.suppress(Exception):
            await sink.commit()

    # -- event loop side --------------------------------------------------------------------

    def _watch(self, task: asyncio.Task[None]) -> None:
        # A loop that dies would leave the worker up but consuming nothing: fail it instead, so
        # `wait()` raises and the process exits for its supervisor to restart.
        if task.cancelled():
            return
        exc = task.exception()
        if exc is not None:
            self.fail(exc)
        elif not self._stopping.is_set():
            self.fail(RuntimeError(f"the worker's {task.get_name()} loop ended"))

    def fail(self, exc: BaseException) -> None:
        """Stop the worker: `wait()` raises `exc` (a lane fails its process's other lanes)."""
        log.error("worker failing: %s", exc)
        self._stopping.set()
        if not self._failed.done():
            self._failed.set_exception(exc)

    async def _fetch(self) -> None:
        while not self._stopping.is_set():
            if self._relay is not None and self._relay.failed is not None:
                raise self._relay.failed
            in_flight = sum(p.tracker.in_flight for p in self._pipelines.values())
            if self._solo is not None:
                in_flight += self._solo.backlog
            metrics.IN_FLIGHT.set(in_flight)
            pause = in_flight >= self.settings.max_in_flight or (
                self._cycler.paused and in_flight > self.settings.max_in_flight // 2
            )
            room = max(1, min(_FETCH_MAX, self.settings.max_in_flight - in_flight))
            now = time.monotonic()
            commits: list[TopicPartition] = []
            if not self._exactly_once and now - self._commit_at >= _COMMIT_EVERY_S:
                self._commit_at = now
                commits = self._commits()
            seeks, self._seeks = self._seeks, {}
            rewind = [TopicPartition(self.requests_topic, p, o) for p, o in seeks.items()]
            epoch = self._epoch
            batch = await self._thread.call(self._cycler.run, commits, pause, rewind, room)
            if self._guard is not None and batch:
                await self._guard.consumed(highest_offsets(batch))
            if epoch != self._epoch:
                self._refetch(batch)  # read before a rewind: read again after it
            elif self._ingest(batch):
                await asyncio.sleep(_RETRY_DECODE_S)

    async def _transact(self) -> None:
        assert isinstance(self._sink, TransactionalSink)  # noqa: S101 - started only then
        interval = self.settings.transaction_interval_ms / 1000.0
        while not self._stopping.is_set():
            await asyncio.sleep(interval)
            if not self._stopping.is_set():  # a failing worker's transaction is aborted instead
                await self._sink.commit()

    def _rewind(self) -> None:
        """The open transaction was aborted: every partition starts again from the position its
        last committed transaction carried; what it had in flight is dropped, results and all."""
        self._epoch += 1
        for partition, pipeline in list(self._pipelines.items()):
            target = self._txn_positions.get(partition, pipeline.first_offset)
            pipeline.close()
            self._pipelines[partition] = self._new_pipeline(partition)
            if target is not None:
                self._seeks[partition] = target
        log.warning("transaction aborted: partitions %s rewound", sorted(self._seeks))

    def _reread(self, partition: int, offset: int) -> None:
        self._seeks[partition] = min(self._seeks.get(partition, offset), offset)

    def _refetch(self, batch: list[Message]) -> None:
        for msg in batch:
            partition = msg.partition()
            if partition is not None and partition in self._pipelines and not msg.error():
                offset = int(msg.offset() or 0)
                self._seeks[partition] = min(self._seeks.get(partition, offset), offset)

    def _transaction_committed(self, offsets: list[TopicPartition]) -> None:
        self._txn_positions.update((tp.partition, tp.offset) for tp in offsets)

    def _ingest(self, batch: list[Message]) -> bool:
        """Hand messages to their partitions and queue their requests by model; True when a
        transient error means a partition must be read again from a message on."""
        rewind = self._seeks
        submit = self._batcher.submit
        tracer = self._tracing.tracer  # None unless tracing is on: then no header is read
        for msg in batch:
            err = msg.error()
            partition = msg.partition()
            if err is not None:
                check_membership(err, self.settings)
                log.warning("consumer error: %s", err)
                continue
            if partition is None or partition in rewind:
                continue  # behind a message that must be read again
            pipeline = self._pipelines.get(partition)
            if pipeline is None:
                continue  # revoked meanwhile
            solo = self._solo
            if solo is not None and solo.takes(partition, int(msg.offset() or 0)):
                solo.put(msg)
                continue
            try:
                slot = pipeline.accept(msg)
            except RetriableError as exc:
                log.warning(
                    "cannot decode %s[%s]@%s yet: %s", msg.topic(), partition, msg.offset(), exc
                )
                rewind[partition] = int(msg.offset() or 0)
                continue
            if slot is not None:
                if tracer is not None:
                    consumed(tracer, msg, slot.task)
                submit(slot.task.model, slot)
        metrics.QUEUE_WAITS.flush()
        self._sink.flush()  # the poison pills' dead letters
        return bool(rewind)

    async def _compute(self, slots: Sequence[Slot], waits: Sequence[float]) -> list[ResultRecord]:
        solo = self._solo
        async with self._lane():
            if solo is None:
                return await self._compute_now(slots, waits)
            async with solo.gate.shared():  # a suspect running alone holds batches back
                return await self._compute_now(slots, waits)

    async def _compute_now(
        self, slots: Sequence[Slot], waits: Sequence[float]
    ) -> list[ResultRecord]:
        tasks = [slot.task for slot in slots]
        tracer = self._tracing.tracer
        if tracer is None:
            return await self.service.process(tasks, waits)
        with batch_span(tracer, tasks):
            return await self.service.process(tasks, waits)

    def _delivered(
        self, slots: Sequence[Slot], outcome: Sequence[ResultRecord] | BaseException
    ) -> None:
        hand_over(slots, outcome, worker_id=self.settings.worker_id)
        self._sink.flush()
        if self._reports is not None:
            self._reports.flushed()

    def _positions(self) -> list[TopicPartition]:
        return [
            TopicPartition(self.requests_topic, p, pipeline.tracker.position)
            for p, pipeline in self._pipelines.items()
            if pipeline.tracker.position is not None
        ]

    def _commits(self) -> list[TopicPartition]:
        """Positions that moved since they were last committed."""
        commits = []
        for partition, pipeline in self._pipelines.items():
            position = pipeline.tracker.committable()
            if position is not None and self._committed.get(partition) != position:
                self._committed[partition] = position
                commits.append(TopicPartition(self.requests_topic, partition, position))
        return commits

    def _new_pipeline(self, partition: int) -> PartitionPipeline:
        return PartitionPipeline(
            self.requests_topic,
            partition,
            decoder=self._decoder,
            sink=self._sink,
            failures=self.failures,
        )

    async def _assigned(self, partitions: list[int]) -> None:
        for partition in partitions:
            if partition not in self._pipelines:
                self._pipelines[partition] = self._new_pipeline(partition)
        if self._guard is not None:
            await self._guard.assigned(partitions)
        log.info("assigned partitions %s", sorted(partitions))

    async def _revoked(self, partitions: list[int], drain: bool) -> list[TopicPartition]:
        pipelines = [self._pipelines[p] for p in partitions if p in self._pipelines]
        if self._exactly_once:
            await self._revoked_in_transaction()
        elif drain and not self._drained:
            await asyncio.gather(*(p.drain(self._drain_timeout) for p in pipelines))
        pipelines = [self._pipelines[p] for p in partitions if p in self._pipelines]
        for partition in partitions:
            self._seeks.pop(partition, None)
        commits = []
        for pipeline in pipelines:
            position = pipeline.tracker.position if drain else None
            if position is not None and not self._exactly_once:
                commits.append(TopicPartition(self.requests_topic, pipeline.partition, position))
            pipeline.close()
            del self._pipelines[pipeline.partition]
            self._committed.pop(pipeline.partition, None)
            with contextlib.suppress(KeyError):
                metrics.CONSUMER_LAG.remove(self.requests_topic, str(pipeline.partition))
        if self._guard is not None and self._solo is not None:
            self._solo.forget(partitions)
            # Lost partitions may already have a new owner writing marks under the same key.
            await self._guard.released(partitions, clear=drain)
        log.info("%s partitions %s", "revoked" if drain else "lost", sorted(partitions))
        return commits

    async def _revoked_in_transaction(self) -> None:
        """Exactly-once: a rebalance aborts the open transaction, which may hold results of
        partitions that go, and every partition rewinds to its last committed position. A
        commit here would have to reach the group coordinator in the middle of the rebalance;
        the abort costs at most one transaction interval of work, redone."""
        sink = self._sink
        assert isinstance(sink, TransactionalSink)  # noqa: S101 - exactly-once only
        if self._failed.done() or self._drained:
            return
        await sink.abort()
        self._rewind()

    # -- consumer thread side (rebalance callbacks) ---------------------------------------

    def _on_assign(self, _consumer: Consumer, partitions: list[TopicPartition]) -> None:
        self._cycler.stale_metadata()
        parts = [tp.partition for tp in partitions]
        asyncio.run_coroutine_threadsafe(self._assigned(parts), self._loop).result()

    def _on_revoke(self, consumer: Consumer, partitions: list[TopicPartition]) -> None:
        self._cycler.stale_metadata()
        parts = [tp.partition for tp in partitions]
        future = asyncio.run_coroutine_threadsafe(self._revoked(parts, True), self._loop)
        commits = future.result(timeout=self._drain_timeout + 30)
        if commits:
            try:
                consumer.commit(offsets=commits, asynchronous=False)
            except KafkaException as exc:
                log.warning("commit on revoke failed; the next owner redoes from the last: %s", exc)

    def _on_lost(self, _consumer: Consumer, partitions: list[TopicPartition]) -> None:
        self._cycler.stale_metadata()
        parts = [tp.partition for tp in partitions]
        asyncio.run_coroutine_threadsafe(self._revoked(parts, False), self._loop).result()
