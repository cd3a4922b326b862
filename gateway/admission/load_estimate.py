"""What the gateway knows of the load, as numbers admission decides on in O(1): `ModelLoad` (calls
in flight, service rate, the adaptive limit per model), `KafkaBacklog` (the workers' lag and
capacity) and `LoopLag` (the event loop's sustained lateness).
How each is measured and the limit adapted: docs/overload.md ("What the gateway measures",
"When a call is refused").
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable

__all__ = ["KafkaBacklog", "LoopLag", "ModelLoad"]

# The service rate averages over about this long; the workers' capacity forgets over this long.
_RATE_WINDOW_S = 1.0
_CAPACITY_MEMORY_S = 30.0
# The limit binds when a judging period's peak in flight came this close to it.
_BINDING = 0.5
_RECOVER = 1.25
# Gradient2's bounds: a judgement cuts the limit by half at most, and never raises it by more
# than its square root.
_MIN_GRADIENT = 0.5
# Latency under this share of the objective is never cut for, whatever the baseline.
_QUIET = 0.5
# The no-load latency averages over about this many calls (Gradient2's long window), and falls
# by this factor a judgement when calls run at least twice as fast.
_BASELINE_CALLS = 600
_BOUND_CALLS = 6000
_BASELINE_DROP = 0.9
# Below this many results per second the rate says too little to divide by.
_MIN_RATE = 1.0
# The latency is judged over at least this many calls, or a second's.
_JUDGE_CALLS = 20
_JUDGE_S = 1.0


class ModelLoad:
    """One model's calls in this replica, its service rate and in-flight limit."""

    __slots__ = (
        "answered",
        "baseline",
        "batch",
        "done",
        "fastest",
        "first_results",
        "initial",
        "judged_at",
        "last_tick",
        "limit",
        "lost",
        "max_limit",
        "min_limit",
        "peak",
        "rate",
        "realtime",
        "seen",
        "timeouts",
        "total_s",
    )

    def __init__(self, initial: int, min_limit: int, max_limit: int, now: float) -> None:
        self.realtime = 0
        self.batch = 0
        self.done = 0
        self.lost = 0
        self.peak = 0
        self.rate = 0.0
        # When results began to come, and how many came since, for the rate's first second.
        self.first_results: tuple[float, int] | None = None
        self.min_limit = float(min_limit)
        self.max_limit = float(max_limit)
        self.limit = float(min(max(initial, min_limit), max_limit))
        self.initial = self.limit
        self.last_tick = now
        # The no-load latency; None until a call came back.
        self.baseline: float | None = None
        # Since the last judgement: calls judged (timed out ones too), answered and timed out,
        # the sum of their latencies and the fastest answer.
        self.seen = 0
        self.answered = 0
        self.timeouts = 0
        self.total_s = 0.0
        self.fastest = math.inf
        self.judged_at = now

    @property
    def in_flight(self) -> int:
        return self.realtime + self.batch

    def enter(self, batch: bool) -> None:
        if batch:
            self.batch += 1
        else:
            self.realtime += 1
        in_flight = self.realtime + self.batch
        if in_flight > self.peak:
            self.peak = in_flight

    def leave(self, batch: bool, latency_s: float | None) -> None:
        """A call ended: with its latency when its result came (a service sample), or None."""
        if batch:
            self.batch -= 1
        else:
            self.realtime -= 1
        if latency_s is not None:
            self.done += 1
            self.total_s += latency_s
            if latency_s < self.fastest:
                self.fastest = latency_s

    def timed_out(self, waited_s: float) -> None:
        """A call left without its result after waiting `waited_s`: its latency was at least
        that. It is judged with the others, but it is no completion: the service rate and the
        no-load latency do not count it."""
        self.lost += 1
        self.total_s += waited_s

    def tick(self, now: float, slo_s: float, tolerance: float, saturated: bool = False) -> None:
        """Bring the rate and the limit up to date; `saturated`: the gateway's own event loop
        ran late this tick, so its calls wait before they are even read."""
        dt = now - self.last_tick
        if dt <= 0:
            return
        if self.first_results is None and self.done:
            self.first_results = (self.last_tick, 0)
        if self.first_results is not None and now - self.first_results[0] < _RATE_WINDOW_S:
            # The first second of results is averaged plainly: an average grown from nothing
            # read a cold start's first answers as a stalled service, and its calls as a queue.
            since, count = self.first_results
            self.first_results = (since, count + self.done)
            self.rate = (count + self.done) / (now - since)
        else:
            alpha = 1.0 - math.exp(-dt / _RATE_WINDOW_S)
            self.rate += alpha * (self.done / dt - self.rate)
        self.answered += self.done
        self.timeouts += self.lost
        self.seen += self.done + self.lost
        self.done = self.lost = 0
        self.last_tick = now
        ready = self.seen >= _JUDGE_CALLS or (self.seen and now - self.judged_at >= _JUDGE_S)
        if saturated or ready:
            self._judge(slo_s, tolerance, saturated)

    def _judge(self, slo_s: float, tolerance: float, saturated: bool) -> None:
        binding = self.peak >= _BINDING * self.limit
        if self.answered:
            self._learn_baseline(binding)
        gradient = 1.0
        if self.seen:
            allowed = _QUIET * slo_s
            if self.baseline is not None:
                allowed = max(allowed, tolerance * self.baseline)
            mean = self.total_s / self.seen
            gradient = max(_MIN_GRADIENT, min(1.0, allowed / mean)) if mean > 0 else 1.0
        # A late event loop (calls unread in the socket, which no latency shows) cuts the limit
        # once there is concurrency to cut: at least as many calls in flight as the floor.
        if saturated and self.peak >= self.min_limit:
            gradient = _MIN_GRADIENT
            binding = True
        if binding:
            # Probing upwards needs answers: while the workers answer nothing, none.
            probe = 0.0 if self.timeouts >= self.answered else math.sqrt(self.limit)
            if gradient < 1.0 or self.answered:
                target = self.limit * gradient + probe
                self.limit = max(self.min_limit, min(self.max_limit, target))
        elif self.limit < self.initial:
            # Left far from used after a cut: the overload is over, back towards the start.
            self.limit = min(self.initial, self.limit * _RECOVER)
        self.seen = self.answered = self.timeouts = 0
        self.total_s = 0.0
        self.fastest = math.inf
        self.judged_at = self.last_tick
        self.peak = self.realtime + self.batch

    def _learn_baseline(self, binding: bool) -> None:
        fastest = self.fastest
        if self.baseline is None:
            self.baseline = fastest
        elif fastest * 2 < self.baseline:
            # Recovering (a cold start warming up, a slow spell over): fall back quickly.
            self.baseline = max(fastest, self.baseline * _BASELINE_DROP)
        else:
            # While the limit binds, a standing queue may be what the fastest call waited for:
            # learned ten times more slowly, it cannot drift into the baseline within an
            # overload, yet a service that did turn slower is followed within half a minute.
            calls = _BASELINE_CALLS if fastest < self.baseline or not binding else _BOUND_CALLS
            weight = 1.0 - (1.0 - 1.0 / calls) ** self.answered
            self.baseline += weight * (fastest - self.baseline)

    def delay_s(self, batch: bool) -> float:
        """Estimated queueing delay of a new call of this lane: the calls ahead of it over the
        service rate. Real-time calls wait only behind real-time ones (workers serve that lane
        first); batch calls wait behind both. 0 while the rate is too low to say."""
        if self.rate < _MIN_RATE:
            return 0.0
        ahead = self.realtime + self.batch if batch else self.realtime
        return ahead / self.rate


class KafkaBacklog:
    """The workers' lag and capacity, updated by the lag probe's thread.

    `observe` runs on the probe's thread and only swaps floats; `delay_s` is read by the event
    loop. A torn read between the two costs one stale estimate, never a wrong type.
    """

    __slots__ = ("_committed", "_floor", "_last", "capacity", "delay_s", "lag")

    def __init__(self, lag_floor: int) -> None:
        self._floor = lag_floor
        self._committed: int | None = None
        self._last = 0.0
        self.lag = 0
        self.capacity = 0.0
        self.delay_s = 0.0

    def observe(self, lag: int, committed: int, now: float) -> None:
        """`lag`: end offsets minus committed ones; `committed`: the committed offsets' sum."""
        previous, last = self._committed, self._last
        self._committed, self._last = committed, now
        self.lag = lag
        if previous is not None and now > last:
            rate = max(0, committed - previous) / (now - last)
            decayed = self.capacity * math.exp(-(now - last) / _CAPACITY_MEMORY_S)
            self.capacity = max(rate, decayed)
        if lag <= self._floor:
            self.delay_s = 0.0
        elif self.capacity >= _MIN_RATE:
            self.delay_s = lag / self.capacity
        else:
            # A backlog, and workers never seen consuming: unknown, so no refusal on its account.
            self.delay_s = 0.0


class LoopLag:
    """How late the event loop runs a timer, sustained: `step` is called every few milliseconds
    (by a `tidegate.core.aio.Periodic`), and `take` answers the worst lateness since it last did
    that two checks in a row both showed.

    A saturated gateway is a bottleneck of its own: its calls then wait in the socket before the
    protocol reads them, a delay no call's own latency shows, and every check runs late. A host
    that deschedules the process once (a noisy neighbour, a page fault, a collection) makes one
    check late and the next on time: that is no queue, and counting it could cut a model's
    limit on a busy machine until a load it serves was shed.
    """

    __slots__ = ("_clock", "_due", "_every_s", "_previous", "worst")

    def __init__(self, every_s: float, clock: Callable[[], float] = time.monotonic) -> None:
        self._every_s = every_s
        self._clock = clock
        self._due: float | None = None
        self._previous = 0.0
        self.worst = 0.0

    async def step(self) -> None:
        now = self._clock()
        if self._due is not None:
            late = max(0.0, now - self._due)
            sustained = min(late, self._previous)
            if sustained > self.worst:
                self.worst = sustained
            self._previous = late
        self._due = now + self._every_s

    def take(self) -> float:
        worst, self.worst = self.worst, 0.0
        return worst
