"""What the gateway knows of the load, as numbers admission can decide on in O(1).

Two sources, both measured rather than configured:

* `ModelLoad`, per model: this replica's calls in flight (real-time and batch lanes apart), the
  rate at which their results come back (the observed service rate, an exponentially weighted
  average over about a second), and the in-flight limit, adapted once per tick by AIMD on the
  latency the calls saw (judged over 20 calls, or a second's when fewer come): over the SLO
  (aiming at 80% of it) for more than `slo_miss_ratio` of them, the limit drops to what Little's
  law says the SLO allows (service rate x SLO) or by a fifth, whichever is lower (by half at
  most), but only when the calls in flight came within half of the limit (slow calls beside a
  limit far from reached were not slowed by admission); while calls fit and the limit is nearly
  used, it grows by a twentieth (at least one), and one left far from used after a cut grows
  back towards its initial value by a quarter per judgement.
  The queueing delay ahead of a new call is its lane's calls ahead divided by the service rate.
* `KafkaBacklog`: the workers' consumer lag on the requests topic and the rate at which their
  committed offsets move, read on a thread (`tidegate.gateway.lag_probe`) every ~0.5 s, not per
  request. It sees work that this replica did not send: other replicas' and producers' straight to
  Kafka. Its delay is the lag over the workers' capacity, the highest consumption rate seen lately
  (decaying slowly), so that a burst after an idle spell is not read as stalled workers.

Samples are counted per call (an increment and a comparison); every division, exponential and
limit change happens once per tick, for the whole model. A tick in which nothing came back
never raises a limit: with the workers gone, calls time out, count as slow, and the limit falls.
"""

from __future__ import annotations

import math
import time

__all__ = ["KafkaBacklog", "LoopLag", "ModelLoad"]

# The service rate averages over about this long; the workers' capacity forgets over this long.
_RATE_WINDOW_S = 1.0
_CAPACITY_MEMORY_S = 30.0
_DECREASE = 0.8
# The limit counts as reached when a judging period's peak in flight came this close to it.
_BINDING = 0.5
_RECOVER = 1.25
_INCREASE = 0.05
# The limit aims below the SLO, so that its probing upward between decreases stays within it.
_AIM = 0.8
# Below this many results per second the rate says too little to divide by.
_MIN_RATE = 1.0
# The SLO is judged over at least this many calls (1 slow call of 5 is no p99), or a second's.
_JUDGE_CALLS = 20
_JUDGE_S = 1.0


class ModelLoad:
    """One model's calls in this replica, its service rate and in-flight limit."""

    __slots__ = (
        "answered",
        "batch",
        "done",
        "initial",
        "judged_at",
        "last_tick",
        "late",
        "limit",
        "lost",
        "max_limit",
        "min_limit",
        "peak",
        "rate",
        "realtime",
        "seen",
        "slow",
    )

    def __init__(self, initial: int, min_limit: int, max_limit: int, now: float) -> None:
        self.realtime = 0
        self.batch = 0
        self.done = 0
        self.slow = 0
        self.lost = 0
        self.peak = 0
        self.rate = 0.0
        self.min_limit = float(min_limit)
        self.max_limit = float(max_limit)
        self.limit = float(min(max(initial, min_limit), max_limit))
        self.initial = self.limit
        self.last_tick = now
        # Calls seen and late since the SLO was last judged, and when it was.
        self.seen = 0
        self.late = 0
        self.answered = 0
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

    def leave(self, batch: bool, latency_s: float | None, slo_s: float) -> None:
        """A call ended: with its latency when its result came (a service sample), or None."""
        if batch:
            self.batch -= 1
        else:
            self.realtime -= 1
        if latency_s is not None:
            self.done += 1
            if latency_s > _AIM * slo_s:
                self.slow += 1

    def timed_out(self) -> None:
        """A call left without its result, after the SLO: the latency was at least that. It is
        judged as a slow call, but it is no completion: the service rate does not count it."""
        self.lost += 1

    def tick(self, now: float, slo_s: float, miss_ratio: float, saturated: bool = False) -> None:
        """Bring the rate and the limit up to date; `saturated`: the gateway's own event loop
        ran late this tick, so its calls wait before they are even read."""
        dt = now - self.last_tick
        if dt <= 0:
            return
        alpha = 1.0 - math.exp(-dt / _RATE_WINDOW_S)
        self.rate += alpha * (self.done / dt - self.rate)
        self.answered += self.done
        self.seen += self.done + self.lost
        self.late += self.slow + self.lost
        self.done = self.slow = self.lost = 0
        self.last_tick = now
        ready = self.seen >= _JUDGE_CALLS or (self.seen and now - self.judged_at >= _JUDGE_S)
        if not (saturated or ready):
            return
        # Slow calls while the limit was far from reached were not slowed by the calls admitted
        # with them (a host stall, a model load): cutting the limit would not speed them up, and
        # on a busy host it would pin the limit at its floor and refuse ordinary bursts.
        # A late event loop (calls unread in the socket, which no latency shows) cuts the limit
        # once there is concurrency to cut: at least as many calls in flight as the floor.
        binding = self.peak >= _BINDING * self.limit
        fitting = self.late <= miss_ratio * self.seen
        cut = (saturated and self.peak >= self.min_limit) or (binding and not fitting)
        if cut:
            # Little's law may cut at most by half a tick: the rate lags a sudden load by ~1 s.
            little = max(self.rate * _AIM * slo_s, self.limit / 2)
            self.limit = max(self.min_limit, min(self.limit * _DECREASE, little))
        elif not (ready and self.answered):
            pass  # a judgement with nothing back raises no limit
        elif fitting and self.peak >= 0.8 * self.limit:
            # Nearly used and fitting: probe upwards.
            self.limit = min(self.max_limit, self.limit + max(1.0, self.limit * _INCREASE))
        elif not binding and self.limit < self.initial:
            # Left far from used after a cut (slow or not, its calls were not slowed by it): the
            # overload is over, back towards the start.
            self.limit = min(self.initial, self.limit * _RECOVER)
        self.seen = self.late = self.answered = 0
        self.judged_at = now
        self.peak = self.realtime + self.batch

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
    """How late the event loop runs a timer: `step` is called every few milliseconds (by a
    `tidegate.core.aio.Periodic`), and `take` answers the worst lateness since it last did.

    A saturated gateway is the bottleneck of issue 12: its calls then wait in the socket before
    the protocol reads them, a delay no call's own latency shows.
    """

    __slots__ = ("_due", "_every_s", "worst")

    def __init__(self, every_s: float) -> None:
        self._every_s = every_s
        self._due: float | None = None
        self.worst = 0.0

    async def step(self) -> None:
        now = time.monotonic()
        if self._due is not None and now - self._due > self.worst:
            self.worst = now - self._due
        self._due = now + self._every_s

    def take(self) -> float:
        worst, self.worst = self.worst, 0.0
        return worst
