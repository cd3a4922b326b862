"""Admission control from measured load: a call that could not be served within its budget, or
that would take a model past the in-flight limit its measured service rate allows, is refused at
once (503, `OverloadedError`) instead of queued.

Three checks, each O(1) on numbers kept up to date once per tick (`tidegate.gateway.load_estimate`):

* this replica's calls in flight, past `limit` (`GatewaySettings.max_in_flight`), whatever model;
* a model's calls in flight, past its adaptive limit (the gradient of its calls' latency over
  its no-load latency, as Netflix's Gradient2: decision 020); the batch lane may use only
  `batch_share` of it, so it is refused first;
* the estimated queueing delay (this replica's calls ahead over the model's service rate, or the
  workers' Kafka lag over their capacity, whichever is longer) past the call's wait budget, half of
  it for the batch lane.

The gateway itself may be the bottleneck (measured at 0.6-0.9 cores): then calls wait in
the socket before they are read, which no call's latency shows. So the event loop's lateness is
watched too (`loop_lag`, stepped every `LOOP_CHECK_S` by the app): a tick in which it ran later
than half the SLO on two checks in a row shrinks every model's limit, as queueing calls do (one
late check is the host descheduling the process, not a queue).

`refusal` answers why a call would be refused, without raising: the HTTP protocol layer
(`tidegate.gateway.slow_clients`) asks it before a request's body is read or any middleware runs.

Synchronous calls leave when they are answered or time out. Asynchronous ones leave when their
result arrives, or at their expiry, so a request whose result never comes cannot hold a slot
forever. A result is a service sample (its latency); a call that left without one after the SLO
counts with the time it waited, so workers that stop answering shrink the limit rather than grow
it.
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable
from typing import Any

from tidegate.core.errors import OverloadedError
from tidegate.gateway import http_metrics as metrics
from tidegate.gateway.admission_settings import AdmissionSettings
from tidegate.gateway.load_estimate import KafkaBacklog, LoopLag, ModelLoad

__all__ = ["ADMISSION_STATE", "BATCH", "LANES", "LOOP_CHECK_S", "REALTIME", "Admission"]

# The key of the replica's `Admission` in the app's lifespan state, where the protocol finds it.
ADMISSION_STATE = "tidegate.admission"
# The event loop is checked this often; late by more than this share of the SLO, it is saturated.
LOOP_CHECK_S = 0.02
_LOOP_SHARE = 0.5

REALTIME = "realtime"
BATCH = "batch"
LANES = (REALTIME, BATCH)


class _Call:
    __slots__ = ("batch", "load", "started", "until")

    def __init__(self, until: float, started: float, load: ModelLoad | None, batch: bool) -> None:
        self.until = until
        self.started = started
        self.load = load
        self.batch = batch


class Admission:
    def __init__(
        self,
        limit: int,
        settings: AdmissionSettings | None = None,
        *,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self._limit = limit
        self._clock = clock
        self._calls: dict[str, _Call] = {}
        self._models: dict[str, ModelLoad] = {}
        self._next_tick = 0.0
        self.loop_lag = LoopLag(LOOP_CHECK_S)
        # Models whose refused calls may go to a declared fallback instead: the HTTP protocol
        # leaves their calls to the app, which can divert them (`tidegate.gateway.infer`).
        self.diverts: Callable[[str], bool] = lambda _model: False
        self.configure(settings or AdmissionSettings())

    def configure(self, settings: AdmissionSettings) -> None:
        """Take these settings (before any call is admitted)."""
        self._settings = settings
        self.backlog = KafkaBacklog(settings.lag_floor)

    @property
    def in_flight(self) -> int:
        return len(self._calls)

    def model_load(self, model: str) -> ModelLoad | None:
        return self._models.get(model)

    def refusal(
        self, model: str | None = None, wait_s: float | None = None, lane: str = REALTIME
    ) -> str | None:
        """Why a call for `model` with `wait_s` to wait would be refused now; None: admitted."""
        now = self._clock()
        if now >= self._next_tick:
            self._tick(now)
        if len(self._calls) >= self._limit:
            self._prune(now)
            if len(self._calls) >= self._limit:
                return f"{len(self._calls)} requests are in flight, the most this replica takes"
        batch = lane == BATCH
        load = self._models.get(model) if model is not None else None
        delay = self.backlog.delay_s
        if load is not None:
            cap = load.limit * self._settings.batch_share if batch else load.limit
            if load.in_flight >= cap:
                return (
                    f"{load.in_flight} calls of {model} are in flight, the most its latency "
                    "allows before they queue" + (" on the batch lane" if batch else "")
                )
            delay = max(delay, load.delay_s(batch))
        if wait_s is not None:
            budget = wait_s / 2 if batch else wait_s
            if delay > budget:
                return (
                    f"the estimated queueing delay, {delay:.2f}s, exceeds this call's "
                    f"{budget:g}s" + (" (half its wait, on the batch lane)" if batch else "")
                )
        return None

    def retry_after_s(self, model: str | None = None) -> int:
        """Whole seconds after which a refused call may find room: the estimated delay, >= 1."""
        load = self._models.get(model) if model is not None else None
        delay = max(self.backlog.delay_s, load.delay_s(True) if load is not None else 0.0)
        return max(1, math.ceil(delay))

    def check(
        self, model: str | None = None, wait_s: float | None = None, lane: str = REALTIME
    ) -> None:
        """Raise `OverloadedError` if `refusal` says no."""
        reason = self.refusal(model, wait_s, lane)
        if reason is not None:
            metrics.SHED.inc()
            raise OverloadedError(reason, retry_after_s=self.retry_after_s(model))

    def admit(
        self,
        request_id: str,
        ttl_s: float | None = None,
        *,
        model: str | None = None,
        wait_s: float | None = None,
        lane: str = REALTIME,
    ) -> None:
        """Take a slot until `release` or the result, or for `ttl_s` seconds at most when given."""
        self.check(model, wait_s, lane)
        self.release(request_id)
        now = self._clock()
        load = None
        if model is not None:
            load = self._models.get(model)
            if load is None:
                s = self._settings
                load = ModelLoad(s.initial_limit, s.min_limit, self._limit, now)
                self._models[model] = load
            load.enter(lane == BATCH)
        until = math.inf if ttl_s is None else now + ttl_s
        self._calls[request_id] = _Call(until, now, load, lane == BATCH)
        metrics.IN_FLIGHT.inc()

    def release(self, request_id: str) -> None:
        """The call left without its result (timed out, failed to publish, cancelled)."""
        call = self._calls.pop(request_id, None)
        if call is None:
            return
        metrics.IN_FLIGHT.dec()
        if call.load is not None:
            call.load.leave(call.batch, None)
            waited = self._clock() - call.started
            if waited > self._settings.slo_s:
                call.load.timed_out(waited)

    def on_result(self, result: dict[str, Any]) -> None:
        call = self._calls.pop(str(result["request_id"]), None)
        if call is None:
            return
        metrics.IN_FLIGHT.dec()
        if call.load is not None:
            call.load.leave(call.batch, self._clock() - call.started)

    def observe_kafka(self, lag: int, committed: int) -> None:
        """The workers' lag and committed offsets, from the lag probe's thread."""
        self.backlog.observe(lag, committed, self._clock())

    def _tick(self, now: float) -> None:
        s = self._settings
        self._next_tick = now + s.tick_s
        # An asynchronous call whose result never came leaves at its expiry, whatever the load:
        # else its model's slots could fill with calls that will never end. Once per tick.
        self._prune(now)
        saturated = self.loop_lag.take() > _LOOP_SHARE * s.slo_s
        for model, load in self._models.items():
            load.tick(now, s.slo_s, s.latency_tolerance, saturated)
            metrics.set_admission(model, load.limit, load.delay_s(False))
        metrics.KAFKA_LAG.set(self.backlog.lag)

    def _prune(self, now: float) -> None:
        for request_id in [rid for rid, call in self._calls.items() if call.until <= now]:
            self.release(request_id)
