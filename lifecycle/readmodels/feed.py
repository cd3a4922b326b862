"""Every model's state, kept current from the `model-lifecycle` topic.

Workers and gateways route from this: the topic is the event log, so reading it from its first
offset and folding each model's events with `tidegate.lifecycle.domain.state.apply` gives the same
state the store has, without a database connection on the hot path.

The consumer is `assign`ed every partition at OFFSET_BEGINNING under a throwaway group id and
never commits: each process replays the whole history and no group rebalances. It runs on its own
thread; states and routing tables are swapped in whole (readers on any thread see a consistent
pair), and listeners run on the event loop given to `start`.

Duplicates (the outbox republishes after a crash between publishing and marking) are dropped by
sequence. A sequence gap means an event never reached the topic: it is logged as an error and
the later event still applied, since the feed cannot recover the missing one by itself. Bytes that
are not a readable event are logged and skipped, so one bad message never stalls the feed; a
registry outage, which would skip good events, is retried instead.
"""

from __future__ import annotations

import asyncio
import contextlib
import inspect
import logging
import threading
from collections.abc import Awaitable, Callable, Iterable
from dataclasses import dataclass
from types import TracebackType
from typing import Any

from confluent_kafka import (
    OFFSET_BEGINNING,
    Consumer,
    KafkaError,
    KafkaException,
    Message,
    TopicPartition,
)

from tidegate.core.errors import LifecycleError, LifecycleUnavailableError, TidegateError
from tidegate.core.kafka import consume_ready, make_reader
from tidegate.core.settings import KafkaSettings, TopicSettings
from tidegate.lifecycle.domain.events import RecordedEvent
from tidegate.lifecycle.domain.routing import RoutingTable
from tidegate.lifecycle.domain.state import ModelState, apply
from tidegate.lifecycle.eventstore.event_codec import LifecycleCodec
from tidegate.schemas.codec import Registry, registry_client

__all__ = ["FeedStats", "LifecycleFeed", "Listener"]

_log = logging.getLogger(__name__)
_BATCH = 500
_RETRY_S = 1.0

Listener = Callable[[ModelState], Awaitable[None] | None]


@dataclass(frozen=True)
class FeedStats:
    """What the feed has read: events applied, duplicates dropped, gaps seen, messages skipped."""

    applied: int = 0
    duplicates: int = 0
    gaps: int = 0
    skipped: int = 0


@dataclass(frozen=True)
class _Entry:
    state: ModelState
    table: RoutingTable


class LifecycleFeed:
    def __init__(
        self,
        kafka: KafkaSettings,
        topics: TopicSettings,
        registry: Registry,
        *,
        name: str,
        poll_s: float = 0.1,
        timeout_s: float = 10.0,
    ) -> None:
        client = registry_client(registry)
        self.name = name
        self.topic = topics.lifecycle
        self._kafka = kafka
        self._codec = LifecycleCodec(client, topics)
        self._poll_s = poll_s
        self._timeout_s = timeout_s
        self._entries: dict[str, _Entry] = {}
        self._listeners: list[Listener] = []
        self._tasks: set[asyncio.Future[Any]] = set()
        self._loop: asyncio.AbstractEventLoop | None = None
        self._thread: threading.Thread | None = None
        self._stopping = threading.Event()
        self._caught = threading.Event()
        self._lock = threading.Lock()
        self._waiters: list[tuple[asyncio.AbstractEventLoop, asyncio.Future[None]]] = []
        self._targets: dict[int, int] = {}  # partition: high watermark read at assignment
        self._reached: dict[int, int] = {}  # partition: next offset to read
        self._stats = FeedStats()
        self._problem = "not started"

    # lifecycle of the feed itself

    def start(self, loop: asyncio.AbstractEventLoop | None = None) -> None:
        """Start reading. Listeners run on `loop`, by default the running loop; with no loop at
        all they run on the feed's thread (then they must be synchronous)."""
        if self._thread is not None:
            raise LifecycleError(f"lifecycle feed {self.name} already started")
        if loop is None:
            try:
                loop = asyncio.get_running_loop()
            except RuntimeError:
                loop = None
        self._loop = loop
        self._problem = "starting"
        self._thread = threading.Thread(
            target=self._run, name=f"lifecycle-feed-{self.name}", daemon=True
        )
        self._thread.start()

    def stop(self) -> None:
        """Stop the thread and close the consumer; listener tasks already scheduled still run."""
        self._stopping.set()
        if self._thread is not None:
            self._thread.join()

    async def __aenter__(self) -> LifecycleFeed:
        self.start()
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        await asyncio.to_thread(self.stop)

    async def caught_up(self, timeout_s: float) -> None:
        """Return once the feed has read up to the end offsets it saw when it was assigned the
        topic (at once for an empty topic); raise `LifecycleUnavailableError` after `timeout_s`."""
        if self._caught.is_set():
            return
        loop = asyncio.get_running_loop()
        future: asyncio.Future[None] = loop.create_future()
        with self._lock:
            if self._caught.is_set():
                return
            self._waiters.append((loop, future))
        try:
            await asyncio.wait_for(future, timeout_s)
        except TimeoutError:
            raise self._not_caught_up(timeout_s) from None
        finally:
            with self._lock:
                if (loop, future) in self._waiters:
                    self._waiters.remove((loop, future))

    def wait_caught_up(self, timeout_s: float) -> None:
        """`caught_up` for threads without an event loop."""
        if not self._caught.wait(timeout_s):
            raise self._not_caught_up(timeout_s)

    @property
    def is_caught_up(self) -> bool:
        return self._caught.is_set()

    @property
    def stats(self) -> FeedStats:
        return self._stats

    # reading the state

    def state(self, model: str) -> ModelState | None:
        entry = self._entries.get(model)
        return entry.state if entry is not None else None

    def states(self) -> dict[str, ModelState]:
        return {model: entry.state for model, entry in self._entries.items()}

    def table(self, model: str) -> RoutingTable | None:
        """The model's routing table, built once per change of its state."""
        entry = self._entries.get(model)
        return entry.table if entry is not None else None

    def add_listener(self, listener: Listener) -> None:
        """Call `listener(state)` after each change of a model's state: once per model per batch
        read, with the latest state. It is not called for changes before it was added."""
        self._listeners.append(listener)

    def remove_listener(self, listener: Listener) -> None:
        self._listeners.remove(listener)

    # the thread

    def _run(self) -> None:
        try:
            consumer = make_reader(self._kafka, f"lifecycle-feed-{self.name}")
        except KafkaException as exc:  # a configuration librdkafka refuses
            self._set_problem(f"cannot create a consumer: {exc}")
            return
        try:
            while not self._stopping.is_set():
                if not self._targets and not self._assign(consumer):
                    self._stopping.wait(_RETRY_S)
                    continue
                try:
                    messages = consume_ready(consumer, _BATCH, self._poll_s)
                except KafkaException as exc:
                    _log.warning("lifecycle feed %s: %s", self.name, exc)
                    self._stopping.wait(_RETRY_S)
                    continue
                self._consume(messages)
        except Exception:
            _log.exception("lifecycle feed %s stopped on an unexpected error", self.name)
            self._problem = "the feed's thread failed (see the log)"
        finally:
            consumer.close()

    def _assign(self, consumer: Consumer) -> bool:
        try:
            meta = consumer.list_topics(self.topic, timeout=self._timeout_s).topics.get(self.topic)
            if meta is None or meta.error is not None or not meta.partitions:
                reason = meta.error if meta is not None else "missing"
                self._set_problem(f"topic {self.topic!r} is not readable: {reason}")
                return False
            targets: dict[int, int] = {}
            for partition in sorted(meta.partitions):
                tp = TopicPartition(self.topic, partition)
                low, high = consumer.get_watermark_offsets(tp, timeout=self._timeout_s)
                targets[partition] = high if high > low else -1  # -1: nothing to read
            consumer.assign(
                [TopicPartition(self.topic, p, OFFSET_BEGINNING) for p in sorted(targets)]
            )
        except KafkaException as exc:
            self._set_problem(f"cannot read {self.topic!r}: {exc}")
            return False
        self._targets = targets
        self._problem = f"reading {self.topic!r} up to offsets {targets}"
        _log.info("lifecycle feed %s replays %s up to %s", self.name, self.topic, targets)
        self._check_caught_up()
        return True

    def _consume(self, messages: Iterable[Message]) -> None:
        entries = self._entries
        changed: dict[str, ModelState] = {}
        reached: dict[int, int] = {}
        for msg in messages:
            error = msg.error()
            partition = msg.partition() or 0
            offset = msg.offset() or 0
            if error is not None:
                if error.code() == KafkaError._PARTITION_EOF:
                    reached[partition] = max(reached.get(partition, 0), offset)
                else:
                    _log.warning("lifecycle feed %s: %s", self.name, error)
                continue
            reached[partition] = max(reached.get(partition, 0), offset + 1)
            event = self._decode(msg)
            if event is None:
                continue
            current = changed.get(event.stream)
            if current is None:
                entry = entries.get(event.stream)
                current = entry.state if entry is not None else ModelState(event.stream)
            new = self._apply(current, event)
            if new is not current:
                changed[event.stream] = new
        if changed:
            updated = dict(entries)
            for model, state in changed.items():
                updated[model] = _Entry(state, RoutingTable.from_state(state))
            self._entries = updated  # one reference swap: readers see old or new, never a mix
            self._notify(list(changed.values()))
        for partition, offset in reached.items():
            self._reached[partition] = max(self._reached.get(partition, 0), offset)
        self._check_caught_up()

    def _decode(self, msg: Message) -> RecordedEvent | None:
        delay = 0.1
        while not self._stopping.is_set():
            try:
                return self._codec.decode(msg.value())
            except TidegateError as exc:
                if not exc.retriable:
                    self._count(skipped=1)
                    _log.error(
                        "lifecycle feed %s skips the unreadable message at %s[%s]@%s: %s",
                        self.name,
                        msg.topic(),
                        msg.partition(),
                        msg.offset(),
                        exc,
                    )
                    return None
                _log.warning("lifecycle feed %s retries a decode: %s", self.name, exc)
                self._stopping.wait(delay)
                delay = min(delay * 2, 5.0)
        return None

    def _apply(self, state: ModelState, event: RecordedEvent) -> ModelState:
        if event.sequence <= state.sequence:
            self._count(duplicates=1)
            return state
        if event.sequence > state.sequence + 1:
            self._count(gaps=1)
            _log.error(
                "lifecycle feed %s: model %r jumps from sequence %d to %d; events are missing",
                self.name,
                event.stream,
                state.sequence,
                event.sequence,
            )
        try:
            new = apply(state, event)
        except Exception:
            # A bug folding one event must not stop every model's updates.
            self._count(skipped=1)
            _log.exception("lifecycle feed %s cannot apply %s", self.name, event)
            return state
        self._count(applied=1)
        return new

    def _count(self, **delta: int) -> None:
        s = self._stats
        self._stats = FeedStats(
            s.applied + delta.get("applied", 0),
            s.duplicates + delta.get("duplicates", 0),
            s.gaps + delta.get("gaps", 0),
            s.skipped + delta.get("skipped", 0),
        )

    def _check_caught_up(self) -> None:
        if self._caught.is_set() or not self._targets:
            return
        if any(self._reached.get(p, 0) < high for p, high in self._targets.items()):
            return
        with self._lock:
            self._caught.set()
            waiters, self._waiters = self._waiters, []
        self._problem = "caught up"
        _log.info("lifecycle feed %s caught up with %s", self.name, self.topic)
        for loop, future in waiters:
            with contextlib.suppress(RuntimeError):  # that loop is closed: nobody waits any more
                loop.call_soon_threadsafe(_resolve, future)

    def _set_problem(self, problem: str) -> None:
        if problem != self._problem:
            _log.warning("lifecycle feed %s: %s", self.name, problem)
        self._problem = problem

    def _not_caught_up(self, timeout_s: float) -> LifecycleUnavailableError:
        return LifecycleUnavailableError(
            f"lifecycle feed {self.name} did not catch up with {self.topic!r} within "
            f"{timeout_s}s: {self._problem}"
        )

    # listeners

    def _notify(self, states: list[ModelState]) -> None:
        if not self._listeners:
            return
        if self._loop is None:
            self._call_listeners(states)
            return
        try:
            self._loop.call_soon_threadsafe(self._call_listeners, states)
        except RuntimeError:  # the loop is closed: its listeners are gone with it
            _log.debug("lifecycle feed %s: event loop closed, listeners not called", self.name)

    def _call_listeners(self, states: list[ModelState]) -> None:
        for state in states:
            for listener in list(self._listeners):
                try:
                    result = listener(state)
                except Exception:
                    _log.exception("lifecycle feed %s: listener %r failed", self.name, listener)
                    continue
                if inspect.isawaitable(result):
                    self._schedule(listener, result)

    def _schedule(self, listener: Listener, result: Awaitable[None]) -> None:
        if self._loop is None:
            _log.error("lifecycle feed %s: async listener %r needs a loop", self.name, listener)
            if inspect.iscoroutine(result):
                result.close()
            return
        task = asyncio.ensure_future(result, loop=self._loop)
        self._tasks.add(task)
        task.add_done_callback(self._finished)

    def _finished(self, task: asyncio.Future[Any]) -> None:
        self._tasks.discard(task)
        if not task.cancelled() and task.exception() is not None:
            _log.error("lifecycle feed %s: a listener failed", self.name, exc_info=task.exception())


def _resolve(future: asyncio.Future[None]) -> None:
    if not future.done():
        future.set_result(None)
