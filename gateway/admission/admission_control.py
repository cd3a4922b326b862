"""Admission control from measured load: `Admission` refuses at once (503, `OverloadedError`) a call
that could not be served within its budget, or that would take a model past its adaptive
in-flight limit. `refusal` answers why without raising, for the HTTP protocol layer.
Which checks, lanes and the event loop's lateness: docs/overload.md ("When a call is refused",
"Lanes", "Refused before anything else runs").
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable

from tidegate.core.errors import OverloadedError
from tidegate.gateway import http_metrics as metrics
from tidegate.gateway.admission.admission_settings import AdmissionSettings
from tidegate.gateway.admission.load_estimate import KafkaBacklog, LoopLag, ModelLoad
from tidegate.schemas.records import ResultRecord

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
        # leaves their calls to the app, which can divert them (`tidegate.gateway.v2api.infer`).
        self.diverts: Callable[[str], bool] = lambda _model: False
        # The pool a model is placed in (None: the default pool): a model of another pool
        # queues on that pool's topic, so its own backlog, never the default pool's, refuses
        # its calls (docs/pools.md). `probe_pool` starts measuring a pool's backlog, once.
        self.pool_of: Callable[[str], str | None] = lambda _model: None
        self.probe_pool: Callable[[str], None] = lambda _pool: None
        self.pool_backlogs: dict[str, KafkaBacklog] = {}
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
        delay = self._backlog_delay_s(model)
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
        backlog = self._backlog_delay_s(model)
        delay = max(backlog, load.delay_s(True) if load is not None else 0.0)
        return max(1, math.ceil(delay))

    def _backlog_delay_s(self, model: str | None) -> float:
        """How long the workers' backlog would hold a call of `model`: the default pool's, for
        a model placed there, else its own pool's (none known until its probe reads it)."""
        pool = self.pool_of(model) if model is not None else None
        if pool is None:
            return self.backlog.delay_s
        backlog = self.pool_backlogs.get(pool)
        if backlog is None:
            backlog = self.pool_backlogs[pool] = KafkaBacklog(self._settings.lag_floor)
            self.probe_pool(pool)
        return backlog.delay_s

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

    def on_result(self, result: ResultRecord) -> None:
        call = self._calls.pop(str(result["request_id"]), None)
        if call is None:
            return
        metrics.IN_FLIGHT.dec()
        if call.load is not None:
            call.load.leave(call.batch, self._clock() - call.started)

    def observe_kafka(self, lag: int, committed: int, pool: str | None = None) -> None:
        """The workers' lag and committed offsets (of `pool`'s workers on its topic, or the
        default pool's), from the lag probe's thread."""
        backlog = self.backlog if pool is None else self.pool_backlogs.get(pool)
        if backlog is not None:
            backlog.observe(lag, committed, self._clock())

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
