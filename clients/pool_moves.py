"""Keeping one key's requests in order while their model moves between pools (`MoveGuard`).

A producer that sees a model's placement change holds that model's new requests. Once the old
pool's workers have committed past every request this producer had sent to the old pool's
topics, it sends the held ones, in the order they came, to the new pool. Within one producer a
key's requests therefore never run in the new pool before its earlier ones ran in the old pool
(Kafka orders only what one producer sends; docs/pools.md, "Moving a model"). A publisher that
folds the lifecycle also waits for the new pool to have the model loaded.

What it costs: per record, two dictionary reads (`settled`) and a set insertion before the send,
and a set removal and a dictionary store on delivery (the offsets the fence is made of). A lock,
and the callbacks a held record is sent by later, only for a model that is moving.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from functools import partial
from typing import Any

from confluent_kafka import ConsumerGroupTopicPartitions, KafkaException, Message, TopicPartition
from confluent_kafka.admin import AdminClient

from tidegate.core.errors import OverloadedError
from tidegate.core.kafka import make_admin
from tidegate.core.pools import pool_group, pool_topics
from tidegate.core.settings import KafkaSettings, TopicSettings

__all__ = ["DEFAULT_DRAIN_S", "MAX_HELD", "MoveGuard"]

_log = logging.getLogger(__name__)

DEFAULT_DRAIN_S = 30.0
"""How long a moving model's requests are held at most. Past it they are sent anyway: an old
pool whose workers are down (often why a model moves) must not stop the model for good."""
MAX_HELD = 10_000
"""Requests held per moving model at most; past it a publish is refused (`OverloadedError`)."""

Warm = Callable[[str, str | None], bool]
"""Whether a worker of the pool (None: the default pool) has the model loaded."""
Send = Callable[[], None]
Fail = Callable[[Exception], None]
_UNSEEN = object()


@dataclass(eq=False)
class _Move:
    model: str
    old: str | None
    new: str | None
    earlier: set[object]
    """This producer's records not yet delivered when the move was seen."""
    held: list[tuple[Send, Fail]] = field(default_factory=list)


class MoveGuard:
    """`send_or_hold` on the publishing thread, `delivered` on the one serving delivery
    reports; a daemon thread per move waits for the old pool and sends what was held."""

    def __init__(
        self,
        kafka: KafkaSettings,
        topics: TopicSettings,
        worker_group: str,
        *,
        drain_s: float = DEFAULT_DRAIN_S,
        poll_s: float = 0.1,
        max_held: int = MAX_HELD,
        warm: Warm | None = None,
    ) -> None:
        """`worker_group`: the workers' consumer group (`TIDEGATE_WORKER_GROUP_ID`), whose pool
        groups' committed offsets say how far each pool has come. `warm`, when the publisher
        folds the lifecycle (the gateway does): the held requests also wait for a worker of the
        new pool to have the model loaded, so the first of them meets no cold load."""
        self._warm = warm
        self._kafka = kafka
        self._topics = topics
        self._group = worker_group
        self._drain_s = drain_s
        self._poll_s = poll_s
        self._max_held = max_held
        self._last: dict[str, object] = {}  # model -> the pool its last record went to
        self._moves: dict[str, _Move] = {}
        self._lock = threading.Lock()
        self._pending: set[object] = set()
        self._offsets: dict[tuple[str, int], int] = {}
        self._admin: AdminClient | None = None
        self.moves = 0
        """Moves seen, and of them those whose old pool did not drain within `drain_s`."""
        self.timeouts = 0

    # -- the publishing thread ---------------------------------------------------------------

    def settled(self, model: str, pool: str | None) -> bool:
        """Whether the record goes out now with no more ado: its model is not moving and its pool
        is the one its last record went to. False: ask `hold`."""
        return model not in self._moves and self._last.get(model, _UNSEEN) == pool

    def hold(self, model: str, pool: str | None, send: Send, fail: Fail) -> bool:
        """Whether the record is held (`send` is then called later, or `fail` with why not);
        False: send it now."""
        if model not in self._moves:
            last = self._last.get(model, _UNSEEN)
            if last == pool:
                return False
            self._last[model] = pool
            if last is _UNSEEN:
                return False
            self._start(model, last, pool)  # type: ignore[arg-type]  # a pool name or None
        with self._lock:
            move = self._moves.get(model)
            if move is None:
                return False  # released meanwhile: what was held is sent, this one follows
            if len(move.held) >= self._max_held:
                raise OverloadedError(
                    f"{len(move.held)} requests of {model} wait for its old pool to drain"
                )
            move.held.append((send, fail))
            return True

    def send_or_hold(
        self, model: str, pool: str | None, token: object, produce: Send, fail: Fail
    ) -> None:
        """Produce now, or hold until the model's old pool has drained (`hold`); `token` is
        the record's delivery callback, passed to `delivered` when it is reported."""
        if self.settled(model, pool) or not self.hold(
            model, pool, partial(self.send_tracked, token, produce), fail
        ):
            self.send_tracked(token, produce)

    def send_tracked(self, token: object, produce: Callable[..., None], *args: Any) -> None:
        """`produce(*args)`, with what is in flight known (a later move's fence is made of it).
        A publisher that checked `settled` calls this itself, so that the common path makes no
        callback object for a hold."""
        self._pending.add(token)
        try:
            produce(*args)
        except BaseException:
            self._pending.discard(token)  # no delivery will be reported
            raise

    # -- the delivery reports' thread --------------------------------------------------------

    def delivered(self, token: object, msg: Message | None) -> None:
        self._pending.discard(token)
        if msg is not None and msg.error() is None:
            offset = msg.offset()
            if offset is not None and offset >= 0:
                self._offsets[msg.topic(), msg.partition()] = offset  # type: ignore[index]

    # -- the drain ---------------------------------------------------------------------------

    def _start(self, model: str, old: str | None, new: str | None) -> None:
        move = _Move(model, old, new, earlier=set(self._pending))
        with self._lock:
            self._moves[model] = move
        self.moves += 1
        name = f"move-{model}"
        threading.Thread(target=self._drain, args=(move,), name=name, daemon=True).start()

    def _drain(self, move: _Move) -> None:
        deadline = time.monotonic() + self._drain_s
        try:
            drained = self._wait(move, deadline)
        except Exception:  # the held requests must go out whatever failed here
            _log.exception("waiting for %s's old pool failed", move.model)
            drained = False
        if not drained:
            self.timeouts += 1
            _log.warning(
                "%s moved from pool %s to %s: the old pool did not drain, or the new one did not "
                "load it, in %.0f s; its held requests are sent now, and a key's may run before "
                "its earlier ones or meet a cold load",
                move.model,
                move.old or "default",
                move.new or "default",
                self._drain_s,
            )
        with self._lock:
            for send, fail in move.held:
                try:
                    send()
                except Exception as exc:  # reported to its publisher, as a failed delivery
                    fail(exc)
            del self._moves[move.model]

    def _wait(self, move: _Move, deadline: float) -> bool:
        # First the records sent before the move: their offsets are part of the fence.
        while move.earlier & self._pending:
            if time.monotonic() >= deadline:
                return False
            time.sleep(self._poll_s / 5)
        layout = pool_topics(self._topics, move.old)
        old_topics = {layout.requests, layout.requests_batch}
        fence = {tp: o for tp, o in dict(self._offsets).items() if tp[0] in old_topics}
        group = pool_group(self._group, move.old)
        while fence:
            try:
                committed = self._committed(group, list(fence))
            except KafkaException as exc:
                _log.warning("cannot read pool group %s's offsets: %s", group, exc)
                committed = {}
            # A committed offset is the next record to read: past the fence's own record.
            fence = {tp: o for tp, o in fence.items() if committed.get(tp, -1) <= o}
            _log.debug("%s: waiting for %s past %s (at %s)", move.model, group, fence, committed)
            if not fence:
                break
            if time.monotonic() >= deadline:
                return False
            time.sleep(self._poll_s)
        while self._warm is not None and not self._warm(move.model, move.new):
            _log.debug("%s: waiting for pool %s to load it", move.model, move.new or "default")
            if time.monotonic() >= deadline:
                return False
            time.sleep(self._poll_s)
        return True

    def _committed(self, group: str, parts: list[tuple[str, int]]) -> dict[tuple[str, int], int]:
        if self._admin is None:
            self._admin = make_admin(self._kafka)
        wanted = [TopicPartition(topic, partition) for topic, partition in parts]
        request = [ConsumerGroupTopicPartitions(group, wanted)]
        found = self._admin.list_consumer_group_offsets(request)[group].result(timeout=5)
        return {
            (tp.topic, tp.partition): tp.offset
            for tp in found.topic_partitions or []
            if tp.error is None
        }
