"""Admission from measured load, on an injected clock: the service rate, the estimated queueing
delay and the adaptive in-flight limit of `tidegate.gateway.admission.load_estimate`, as `Admission`
uses them, against a simulated single-queue server of known capacity."""

from __future__ import annotations

import heapq
from collections.abc import Callable
from typing import Any

import pytest

from tidegate.core.errors import OverloadedError
from tidegate.gateway.admission.admission_control import BATCH, REALTIME, Admission
from tidegate.gateway.admission.admission_settings import AdmissionSettings
from tidegate.gateway.admission.load_estimate import KafkaBacklog, LoopLag
from tidegate.schemas.records import ResultRecord

SLO_S = 0.1


def result(request_id: str) -> ResultRecord:
    """A minimal result of `request_id` (admission reads only its id)."""
    return {"request_id": request_id, "model": "m", "status": "OK", "completed_at": 0}


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


class Server:
    """One FIFO queue served at `capacity` calls/s: a call's result comes when the calls before
    it are done and its own service time has passed."""

    def __init__(
        self,
        admission: Admission,
        clock: Clock,
        capacity: float,
        extra: Callable[[float], float] = lambda _t: 0.0,
    ) -> None:
        """`extra(t)`: seconds every call takes on top at time t, queueing for nothing: a
        slow host, a cold JVM, a cold page cache."""
        self.admission = admission
        self.clock = clock
        self.capacity = capacity
        self.slowness = extra
        self.started = clock.now
        self.free_at = clock.now
        self.due: list[tuple[float, str]] = []
        self.latencies: list[float] = []
        self.refused = 0
        self.count = 0

    def deliver(self) -> None:
        while self.due and self.due[0][0] <= self.clock.now:
            _, rid = heapq.heappop(self.due)
            self.admission.on_result(result(rid))

    def offer(
        self, rate: float, seconds: float, wait_s: float = 1.0, lane: str = REALTIME
    ) -> tuple[int, int]:
        """Calls at `rate`/s for `seconds`; (admitted, refused)."""
        admitted = refused = 0
        end = self.clock.now + seconds
        while self.clock.now < end:
            self.deliver()
            rid = f"c{self.count}"
            self.count += 1
            try:
                self.admission.admit(rid, model="m", wait_s=wait_s, lane=lane)
            except OverloadedError:
                refused += 1
            else:
                admitted += 1
                self.free_at = max(self.free_at, self.clock.now) + 1 / self.capacity
                done = self.free_at + self.slowness(self.clock.now - self.started)
                heapq.heappush(self.due, (done, rid))
                self.latencies.append(done - self.clock.now)
            self.clock.now += 1 / rate
        return admitted, refused

    def idle(self, seconds: float) -> None:
        end = self.clock.now + seconds
        while self.clock.now < end:
            self.deliver()
            self.clock.now += 0.01


def p99(values: list[float]) -> float:
    ordered = sorted(values)
    return ordered[int(0.99 * (len(ordered) - 1))]


def admission(clock: Clock, **settings: Any) -> Admission:
    return Admission(
        4096,
        AdmissionSettings.model_validate({"slo_s": SLO_S, **settings, "probe": False}),
        clock=clock,
    )


def test_at_three_times_capacity_accepted_calls_keep_the_slo_and_the_capacity_is_used() -> None:
    clock = Clock()
    server = Server(admission(clock), clock, capacity=250)
    server.offer(250 * 3, seconds=2)  # the limit finds its level
    server.latencies.clear()
    admitted, refused = server.offer(250 * 3, seconds=20)
    assert admitted / 20 >= 0.9 * 250, f"goodput {admitted / 20:.0f}/s of 250/s"
    assert p99(server.latencies) <= SLO_S, f"p99 {p99(server.latencies) * 1000:.0f} ms"
    assert refused > admitted  # two thirds of the offer cannot be served: it is refused


def test_below_capacity_nothing_is_refused() -> None:
    clock = Clock()
    server = Server(admission(clock), clock, capacity=250)
    admitted, refused = server.offer(200, seconds=10)
    assert refused == 0
    assert admitted >= 1990


def test_a_slow_host_is_not_shed() -> None:
    clock = Clock()
    # Every call 300 ms slower than the objective allows, none of it queueing: a noisy host.
    server = Server(admission(clock), clock, capacity=250, extra=lambda _t: 0.3)
    admitted, refused = server.offer(200, seconds=10, wait_s=10)
    assert refused == 0, f"{refused} of {admitted + refused} refused on a slow host"


def test_a_cold_start_is_not_shed_and_a_later_overload_is() -> None:
    clock = Clock()

    def cold(t: float) -> float:  # 1 s slower at first, warm after 5 s
        return max(0.0, 1.0 - t / 5)

    server = Server(admission(clock), clock, capacity=250, extra=cold)
    admitted, refused = server.offer(200, seconds=10, wait_s=10)
    assert refused == 0, f"{refused} of {admitted + refused} refused while the stack warmed"
    server.offer(250 * 3, seconds=3, wait_s=10)
    server.latencies.clear()
    admitted, refused = server.offer(250 * 3, seconds=10, wait_s=10)
    assert admitted / 10 >= 0.9 * 250, f"goodput {admitted / 10:.0f}/s of 250/s"
    assert p99(server.latencies) <= SLO_S, f"p99 {p99(server.latencies) * 1000:.0f} ms"


def test_a_service_that_turns_slower_under_overload_gets_its_capacity_back() -> None:
    clock = Clock()
    slower_at = 5.0

    def slower(t: float) -> float:  # every call 300 ms slower from 5 s on: no queue, a slower model
        return 0.3 if t >= slower_at else 0.0

    server = Server(admission(clock), clock, capacity=250, extra=slower)
    server.offer(300, seconds=slower_at + 30, wait_s=10)
    admitted, _ = server.offer(300, seconds=5, wait_s=10)
    assert admitted / 5 >= 0.8 * 250, f"goodput {admitted / 5:.0f}/s of 250/s"


def test_the_limit_recovers_once_the_overload_ends() -> None:
    clock = Clock()
    adm = admission(clock)
    server = Server(adm, clock, capacity=250)
    server.offer(750, seconds=5)
    squeezed = adm.model_load("m").limit  # type: ignore[union-attr]
    server.idle(1)
    _, refused = server.offer(200, seconds=5)
    assert refused == 0, f"{refused} refused at 200/s after the overload"
    assert squeezed < 64


def test_a_call_whose_budget_the_queue_exceeds_is_refused_at_once() -> None:
    clock = Clock()
    adm = admission(clock, initial_limit=1000, slo_s=60)
    server = Server(adm, clock, capacity=100)
    # A slow model with a lax SLO: the queue grows, and so does the estimated delay.
    server.offer(300, seconds=2, wait_s=30)
    load = adm.model_load("m")
    assert load is not None
    assert load.delay_s(False) > 0.5
    assert adm.refusal("m", wait_s=0.5) is not None
    assert "estimated queueing delay" in (adm.refusal("m", wait_s=0.5) or "")
    assert adm.refusal("m", wait_s=60) is None
    assert adm.retry_after_s("m") >= 1


def test_the_batch_lane_is_refused_first() -> None:
    clock = Clock()
    adm = admission(clock, initial_limit=10, min_limit=1, batch_share=0.5)
    for i in range(5):
        adm.admit(f"b{i}", model="m", wait_s=10, lane=BATCH)
    with pytest.raises(OverloadedError, match="batch lane"):
        adm.admit("b5", model="m", wait_s=10, lane=BATCH)
    for i in range(5):
        adm.admit(f"r{i}", model="m", wait_s=10, lane=REALTIME)
    with pytest.raises(OverloadedError):
        adm.admit("r5", model="m", wait_s=10)


def test_the_batch_lane_waits_behind_real_time_and_gets_half_the_budget() -> None:
    clock = Clock()
    adm = admission(clock, initial_limit=1000, slo_s=60)
    server = Server(adm, clock, capacity=100)
    server.offer(150, seconds=2, wait_s=30)
    load = adm.model_load("m")
    assert load is not None
    delay = load.delay_s(False)
    assert load.delay_s(True) >= delay > 0
    # Within the budget for a real-time call, over half of it for a batch one.
    assert adm.refusal("m", wait_s=delay * 1.5) is None
    assert adm.refusal("m", wait_s=delay * 1.5, lane=BATCH) is not None


def test_calls_that_time_out_shrink_the_limit() -> None:
    clock = Clock()
    adm = admission(clock, initial_limit=32, min_limit=4)
    limits = []
    # Workers gone: nothing comes back, and every call leaves at its deadline.
    for _ in range(6):
        held: list[str] = []
        while adm.refusal("m", wait_s=1) is None:
            held.append(f"c{len(held)}-{clock.now}")
            adm.admit(held[-1], model="m", wait_s=1)
        clock.now += 1
        for rid in held:
            adm.release(rid)
        clock.now += 0.2
        adm.refusal("m")
        load = adm.model_load("m")
        assert load is not None
        limits.append(load.limit)
    assert limits == sorted(limits, reverse=True)
    assert limits[-1] == 4  # min_limit: at most 4 calls are risked while nothing answers


def test_a_late_event_loop_shrinks_the_limits_once_calls_crowd() -> None:
    clock = Clock()
    adm = admission(clock, initial_limit=32)
    # One call in flight: a late loop is the host's stall, and cutting the limit would help no
    # one (but leave it at its floor, refusing the next ordinary burst).
    adm.admit("c", model="m", wait_s=1)
    clock.now += 0.01
    adm.on_result(result("c"))
    adm.loop_lag.worst = 0.08  # the loop ran 80 ms late: the gateway itself is saturated
    clock.now += 0.2
    adm.refusal("m")
    load = adm.model_load("m")
    assert load is not None
    assert load.limit == 32
    # More calls in flight than the floor (16): the gateway is what they wait for. (Budgets
    # of a minute: 20 calls ahead at the one result's 5/s are no queue this test is about.)
    for i in range(20):
        adm.admit(f"c{i}", model="m", wait_s=60)
    adm.loop_lag.worst = 0.08
    clock.now += 0.2
    adm.refusal("m")
    assert load.limit < 32


def test_slow_calls_far_below_the_limit_leave_it_alone_and_a_cut_limit_recovers() -> None:
    clock = Clock()
    adm = admission(clock, initial_limit=64)
    load = None
    for i in range(40):  # slow calls (a stalled host), never more than one in flight
        adm.admit(f"s{i}", model="m", wait_s=5)
        clock.now += 0.3
        adm.on_result(result(f"s{i}"))
        load = adm.model_load("m")
    assert load is not None
    assert load.limit == 64
    load.limit = 16.0  # as a real overload leaves it
    for i in range(100):  # fast calls, one at a time: unused, the limit grows back
        adm.admit(f"f{i}", model="m", wait_s=5)
        clock.now += 0.1
        adm.on_result(result(f"f{i}"))
        adm.refusal("m")
    assert load.limit == 64


def test_a_workers_backlog_refuses_a_call_it_would_delay_past_its_budget() -> None:
    clock = Clock()
    adm = admission(clock)
    # Workers consuming 200/s, then a backlog of 1,000 from producers straight to Kafka.
    adm.observe_kafka(lag=0, committed=0)
    clock.now += 1
    adm.observe_kafka(lag=0, committed=200)
    clock.now += 0.5
    adm.observe_kafka(lag=1000, committed=300)
    assert adm.backlog.delay_s == pytest.approx(1000 / 200, rel=0.05)
    assert adm.refusal("m", wait_s=1) is not None
    assert adm.retry_after_s("m") == 5
    # Drained: admitted again.
    clock.now += 0.5
    adm.observe_kafka(lag=10, committed=1390)
    assert adm.refusal("m", wait_s=1) is None


def test_each_pools_backlog_refuses_only_its_own_models_calls() -> None:
    clock = Clock()
    adm = admission(clock)
    adm.pool_of = {"bert": "nlp"}.get
    probed: list[str] = []
    adm.probe_pool = probed.append
    adm.observe_kafka(lag=0, committed=0)
    clock.now += 1
    adm.observe_kafka(lag=5000, committed=200)  # 25 s of backlog on the default pool's topic
    assert adm.refusal("m", wait_s=1) is not None
    assert adm.refusal("bert", wait_s=1) is None, "bert's pool has its own topic and workers"
    assert adm.retry_after_s("bert") == 1
    assert probed == ["nlp"], "the first call of a pool starts measuring its backlog, once"
    # nlp's own backlog: 10 s at its workers' 100/s. It refuses bert, and leaves the default be.
    adm.observe_kafka(lag=0, committed=0, pool="nlp")
    adm.observe_kafka(lag=0, committed=0)
    clock.now += 1
    adm.observe_kafka(lag=1000, committed=100, pool="nlp")
    adm.observe_kafka(lag=0, committed=400)
    assert adm.refusal("bert", wait_s=1) is not None
    assert adm.retry_after_s("bert") == 10
    assert adm.refusal("m", wait_s=1) is None
    assert probed == ["nlp"]
    adm.observe_kafka(lag=5, committed=0, pool="unknown")  # a pool no call asked for: ignored


def test_backlog_capacity_outlives_an_idle_spell_and_small_lag_is_no_backlog() -> None:
    backlog = KafkaBacklog(lag_floor=64)
    backlog.observe(0, 0, 0.0)
    backlog.observe(0, 500, 1.0)  # 500/s
    backlog.observe(0, 500, 6.0)  # idle for 5 s
    backlog.observe(1000, 500, 6.5)  # a burst arrives before any is committed
    assert 1.0 < backlog.delay_s < 4.0  # read as 1,000 at the remembered capacity, not stalled
    backlog.observe(50, 1450, 7.5)
    assert backlog.delay_s == 0.0


def test_a_backlog_without_any_consumption_seen_refuses_nothing() -> None:
    backlog = KafkaBacklog(lag_floor=0)
    backlog.observe(5000, 0, 0.0)
    backlog.observe(5000, 0, 1.0)
    assert backlog.delay_s == 0.0


def test_an_async_call_whose_result_never_comes_leaves_at_its_expiry_under_any_load() -> None:
    clock = Clock()
    adm = admission(clock, initial_limit=2, min_limit=1)
    adm.admit("a1", ttl_s=5, model="m")
    adm.admit("a2", ttl_s=5, model="m")
    assert adm.refusal("m") is not None  # the model's 2 slots are taken
    clock.now += 6  # both expired, with 2 of 4,096 replica slots used
    assert adm.refusal("m") is None
    load = adm.model_load("m")
    assert load is not None
    assert (adm.in_flight, load.in_flight) == (0, 0)


def test_calls_that_time_out_are_slow_but_no_service_rate() -> None:
    clock = Clock()
    adm = admission(clock)
    for i in range(30):
        adm.admit(f"t{i}", model="m", wait_s=1)
    clock.now += 1.0
    for i in range(30):
        adm.release(f"t{i}")  # left without a result, after the SLO
    clock.now += 0.2
    adm.refusal("m")
    load = adm.model_load("m")
    assert load is not None
    assert load.rate == 0.0  # nothing was served
    assert load.delay_s(False) == 0.0


async def test_the_loop_counts_as_late_only_when_two_checks_in_a_row_are() -> None:
    clock = Clock()
    lag = LoopLag(0.02, clock=clock)
    await lag.step()
    # One check 200 ms late, the next on time: the host descheduled the process once.
    clock.now += 0.22
    await lag.step()
    clock.now += 0.02
    await lag.step()
    assert lag.take() == 0.0
    # Every check late (a loop busy with its own work): sustained, the smaller of the two.
    clock.now += 0.09
    await lag.step()
    clock.now += 0.08
    await lag.step()
    assert lag.take() == pytest.approx(0.06)
    assert lag.take() == 0.0
