"""The bulkhead between model pools (`python -m tests.bench pools`, part of `make bench`).

The bulkhead's bar: one pool's model crash-looping, or flooded at 3x, leaves another pool's p99
within 20% of its value alone, as a ratio.

Two pools on the local stack, each with its model and its own `tidegate worker --pool P
--processes 1` (`tests.bench.pools_setup`), the controller running as the demo runs it. The
Kafka path: Avro requests from `KafkaLoad` (the producer app of the other Kafka parts) to each
model's pool's requests topic, where `TidegateProducer(placement=...)` sends them; latency from
when each request was due (open loop) to its result, read from the shared results topic.

* **alone**: `RATE`/s of `bench-steady` for `SECONDS`; the noisy pool's worker idles.
* **flood**: the same, while `bench-noisy` is offered `FACTOR` x what its worker was measured to
  serve (a backlog of `CAPACITY_COUNT` requests drained alone at the start of the run, from its
  first answer to its last), open
  loop from a process of its own (`tests.bench.pools_load`), from `LEAD_S` before the steady load
  until it ends.
* **crash-loop**: the same, while the noisy pool's worker is the worker supervisor over a worker
  whose model kills it on each request (`tests.bench.pools_crash`; restarts after 1 s, doubling,
  as shipped; the crash guard on), and `RATE`/s of such requests keep arriving.

After a flood or a crash loop, the noisy pool's workers are stopped, its group moved past what
the arm left queued, and its own worker started again, so no arm inherits another's backlog.
Each arm starts `QUIET_S` after the last process started. A warm-up arm (alone) runs first,
uncounted; then `ROUNDS` rounds of the three arms, their order reversed every other round. The
ratios: each round's flood and crash-loop p99 over its alone p99, and of each arm's best round.
CPU, in cores over each arm's window, of every process: both pools' workers (a supervisor with
its restarted children), both loads, the controller, the broker, PostgreSQL, Redis, the registry,
"others" (the rest of the host: what no reader names) and the host as a whole. An arm waits
(up to 2 minutes) until the others use under `OTHERS_MAX` cores: these hosts are shared.

With `TIDEGATE_BENCH_POOLS_PIN=1`, each pool's processes run on a core of their own, as an
operator would pin them with `taskset`: the steady pool's worker on core 0; the noisy pool's
worker (the crash supervisor and its restarted workers too) and the noisy load on core 1. The
broker, controller, PostgreSQL, Redis, registry and the steady load stay unpinned. Each arm
reports the CPUs each process may run on.

With `TIDEGATE_BENCH_POOLS_QUOTA=CORES`, each pool's processes (the crash supervisor's restarted
workers too) run in one CPU group limited to CORES by CFS bandwidth control, as the `limits.cpu`
of a pool's pod would on Kubernetes with one pod per pool (deploy/k8s/worker); the noisy load,
which stands for callers on other hosts, in a group of its own with the same limit. The broker,
controller, PostgreSQL, Redis, registry and the steady load stay unlimited. Needs root and
cgroup v1's `cpu` controller. `TIDEGATE_BENCH_POOLS_QUOTA_PERIOD_MS` sets the limits' CFS period
(100 ms, Kubernetes' default, unless set).
"""

from __future__ import annotations

import math
import os
import time
from dataclasses import dataclass, field
from typing import Any

from tests.bench.broker_requests import broker_pid
from tests.bench.pools_load import (
    QUOTA_PERIOD_MS,
    CpuReaders,
    NoisyLoad,
    allowed_cpus,
    cpu_limit,
    host_busy,
    own_cpu,
    remove_cgroup,
    with_reaped,
)
from tests.bench.pools_setup import (
    NOISY,
    PIN,
    QUOTA,
    RUN_DIR,
    STEADY,
    PoolWorker,
    cgroup_of,
    core_of,
    prepare,
    record,
    skip_backlog,
    stop_leftover_crash_loop,
)
from tests.bench.proc_cpu import cpu_seconds, process_tree
from tests.bench.versus import stack_cpu
from tests.support import unique
from tidegate.cli.procs import Child, spawn, stop_recorded
from tidegate.clients.loadgen import KafkaLoad, LoadResult
from tidegate.core.pools import pool_topics
from tidegate.core.settings import TopicSettings

__all__ = ["run"]

RATE = 150.0
SECONDS = 20.0
WARM_S = 10.0
LEAD_S = 2.0
QUIET_S = 3.0
FACTOR = 3
CAPACITY_COUNT = 2000
ROUNDS = max(int(os.environ.get("TIDEGATE_BENCH_ROUNDS", "3")), 2)
BAR = 1.20
OTHERS_MAX = 0.15
ARMS = ("alone", "flood", "crash-loop")


@dataclass
class Arm:
    name: str
    result: LoadResult
    cores: dict[str, float]
    """CPU over the arm's window, in cores, by process; "host" is the whole machine's."""
    noisy: dict[str, Any] = field(default_factory=dict)
    """The noisy side: its load's summary, what it left queued, the crashes."""
    cpus: dict[str, str] = field(default_factory=dict)
    """The CPUs each process may run on, at the window's end: pinned or not."""

    @property
    def p99(self) -> float:
        return self.result.p(0.99)

    def line(self) -> str:
        r = self.result
        cores = "  ".join(f"{name} {c:.2f}" for name, c in self.cores.items())
        noisy = "  ".join(f"{k} {v}" for k, v in self.noisy.items())
        cpus = "  ".join(f"{k} {v}" for k, v in self.cpus.items())
        return (
            f"  {self.name:<10} p50 {r.p(0.5):6.1f}  p99 {r.p(0.99):6.1f} ms  sent {r.sent}"
            f"  lost {r.lost}  errors {r.errors}\n      cores: {cores}"
            + (f"\n      noisy: {noisy}" if noisy else "")
            + f"\n      on CPUs: {cpus}"
        )


class Bench:
    """The processes of one run, and the arms run on them."""

    def __init__(self, controller: Child, load: KafkaLoad) -> None:
        self.controller = controller
        self.load = load
        self.steady = PoolWorker.start(STEADY)
        try:
            self.noisy = PoolWorker.start(NOISY)
        except BaseException:
            self.steady.stop()
            raise
        self.flood_rate = 0.0

    def stop(self) -> None:
        self.noisy.stop()
        self.steady.stop()

    def capacity(self) -> float:
        """Requests a second the noisy pool's worker serves, alone: a backlog of
        `CAPACITY_COUNT` published at once, answered from the first answer to the last."""
        load = KafkaLoad(pool_topics(TopicSettings(), NOISY), keep_records=True)
        load.start(lambda i: record(NOISY, i, unique("cap-warm")))
        rate = 10_000.0
        with load:
            tag = unique("cap")
            found = load.run(
                "capacity",
                lambda i: record(NOISY, i, tag),
                rate=rate,
                count=CAPACITY_COUNT,
                timeout_s=300,
            )
        if found.lost or found.errors:
            raise RuntimeError(f"capacity: {found.lost} lost, {found.statuses}")
        # Each answer's arrival: when its request was due (i / rate after the first) plus its
        # latency; records and latencies are kept in the same order.
        arrivals = [
            int(r["request_id"].rsplit("-", 1)[1]) / rate + latency
            for r, latency in zip(found.records, found.latencies, strict=True)
        ]
        return (len(arrivals) - 1) / (max(arrivals) - min(arrivals))

    def _readers(self, noise: NoisyLoad | None) -> CpuReaders:
        steady, noisy, ctl = self.steady.pid, self.noisy.pid, self.controller.process.pid
        return {
            "steady worker": lambda: cpu_seconds(process_tree(steady)),
            "noisy worker": lambda: with_reaped(noisy),
            "steady load": own_cpu,
            "noisy load": (lambda: cpu_seconds([noise.pid])) if noise else (lambda: 0.0),
            "controller": lambda: cpu_seconds(process_tree(ctl)),
            **stack_cpu(),
        }

    def _cpus(self, noise: NoisyLoad | None) -> dict[str, str]:
        """Where each process may run, and under which CPU limit: the pinned or limited ones
        and, for contrast, some left alone."""
        pids = {
            "steady worker": process_tree(self.steady.pid),
            "noisy worker": process_tree(self.noisy.pid),
            "noisy load": [noise.pid] if noise else [],
            "steady load": [os.getpid()],
            "controller": process_tree(self.controller.process.pid),
            "broker": process_tree(broker_pid()),
        }
        return {
            name: f"{allowed_cpus(found)}{f' limit {cpu_limit(found)}' if QUOTA > 0 else ''}"
            for name, found in pids.items()
        }

    def arm(self, name: str, seconds: float = SECONDS) -> Arm:
        crash = name == "crash-loop"
        if crash:
            self.noisy.stop()
            self.noisy = PoolWorker.start(NOISY, crash=True)
        noise = None
        if name != "alone":
            rate = RATE if crash else self.flood_rate
            log = RUN_DIR / "noisy-load.log"
            noise = NoisyLoad(
                NOISY,
                rate,
                crash=crash,
                log=log,
                core=core_of(NOISY),
                cgroup=cgroup_of(f"{NOISY}-load"),
                cores=QUOTA,
            )
        time.sleep(QUIET_S)  # what just started is done starting: not in the window
        readers = self._readers(noise)
        _wait_quiet(readers)
        restarts = _restarts()
        if noise is not None:
            noise.go()
            time.sleep(LEAD_S)  # the flood queued, the crash loop begun, before we measure
        before = {n: read() for n, read in readers.items()}
        host_before, began = host_busy()[0], time.monotonic()
        tag = unique(f"steady-{name}")
        result = self.load.run(
            name, lambda i: record(STEADY, i, tag), rate=RATE, count=int(RATE * seconds)
        )
        wall = time.monotonic() - began
        cores = {n: (read() - before[n]) / wall for n, read in readers.items()}
        host = (host_busy()[0] - host_before) / wall
        cores["others"] = max(0.0, host - sum(cores.values()))
        cores["host"] = host
        cpus = self._cpus(noise)
        noisy: dict[str, Any] = {}
        if noise is not None:
            summary = noise.stop()
            sent, spent = summary["sent"], summary["seconds"]
            noisy["offered/s"] = round(sent / spent)
            noisy["sent"] = sent
            noisy["its generator late p99 ms"] = summary["late_p99_ms"]
            if crash:
                noisy["worker restarts"] = _restarts() - restarts
            # Its backlog is skipped rather than served during the next arm.
            self.noisy.stop()
            left = skip_backlog(NOISY)
            noisy["left queued"] = left
            noisy["served/s"] = round(max(0, sent - left) / spent)
            self.noisy = PoolWorker.start(NOISY)
        return Arm(name, result, cores, noisy, cpus)


def _restarts() -> int:
    """Workers the crash loop's supervisor has started so far (each exit after the first within
    a minute is held back from its log as a repeat, each start is not)."""
    try:
        return (RUN_DIR / "crash.log").read_text(errors="replace").count(" started worker ")
    except OSError:
        return 0


def _wait_quiet(readers: CpuReaders, limit_s: float = 120.0) -> None:
    """Until processes other than the arm's (another tenant's tests, say) use under
    `OTHERS_MAX` cores over 2 s, for at most `limit_s`: they are not what is measured."""
    deadline = time.monotonic() + limit_s
    while True:
        before = sum(read() for read in readers.values())
        host, began = host_busy()[0], time.monotonic()
        time.sleep(2.0)
        wall = time.monotonic() - began
        mine = sum(read() for read in readers.values()) - before
        others = (host_busy()[0] - host - mine) / wall
        if others < OTHERS_MAX:
            return
        if time.monotonic() > deadline:
            print(f"  (other processes still use {others:.2f} cores: measuring anyway)")
            return


def _ratio(a: float, b: float) -> float:
    return a / b if b else math.nan


def _pinning() -> str:
    limits = (
        f"; CPU limit {QUOTA:g} cores on each pool's processes and on the noisy load"
        f" (CFS period {QUOTA_PERIOD_MS:g} ms)"
        if QUOTA > 0
        else ""
    )
    if not PIN:
        return f"pinning off (every process on every core){limits}"
    return (
        f"pinning on: {STEADY}'s worker on core {core_of(STEADY)}; {NOISY}'s worker, crash "
        f"supervisor and load on core {core_of(NOISY)}; the rest unpinned{limits}"
    )


def _report(rounds: list[dict[str, Arm]], capacity: float, flood: float) -> None:
    print(
        f"\npools: {STEADY} at {RATE:.0f}/s for {SECONDS:.0f} s per arm; flood {flood:.0f}/s "
        f"({FACTOR}x the noisy worker's {capacity:.0f}/s); crash loop with {RATE:.0f}/s "
        f"requests that kill; {_pinning()}"
    )
    print(
        "  round   alone p99   flood p99   crash p99   flood/alone   crash/alone"
        "   others' cores (alone, flood, crash)"
    )
    for k, r in enumerate(rounds, start=1):
        a, f, c = (r[n].p99 for n in ARMS)
        others = ", ".join(f"{r[n].cores['others']:.2f}" for n in ARMS)
        print(
            f"  {k:>5}  {a:8.1f} ms {f:8.1f} ms {c:8.1f} ms   {_ratio(f, a):9.2f}x"
            f"   {_ratio(c, a):9.2f}x   {others}"
        )
    best = {n: min((r[n] for r in rounds), key=lambda arm: arm.p99) for n in ARMS}
    a = best["alone"].p99
    verdicts = []
    for n in ARMS[1:]:
        value = _ratio(best[n].p99, a)
        every = [_ratio(r[n].p99, r["alone"].p99) for r in rounds]
        met = value <= BAR
        verdicts.append(met)
        print(
            f"  {n:<10} p99 / alone p99, best rounds = {value:.2f}x (bar <= {BAR:.2f}: "
            f"{'met' if met else 'missed'}); every round {', '.join(f'{v:.2f}' for v in every)}"
        )
    print("  CPU per steady request (ms), each arm's best round:")
    for n in ARMS:
        cores = best[n].cores
        shown = "  ".join(f"{p} {c * 1000 / RATE:.2f}" for p, c in cores.items())
        print(f"    {n:<10} {shown}")
    print(f"pools: bulkhead bar {'met' if all(verdicts) else 'missed'} ({_pinning()})")


def run() -> None:
    stop_recorded(RUN_DIR)
    stop_leftover_crash_loop()
    started = time.monotonic()
    print("\npools: set-up (the controller, both pools, both models, both workers)")
    print(f"pools: {_pinning()}")
    controller = spawn("controller", ["controller", "--migrate"], RUN_DIR)
    bench: Bench | None = None
    try:
        prepare()
        load = KafkaLoad(pool_topics(TopicSettings(), STEADY))
        load.start(lambda i: record(STEADY, i, unique("warm")))
        with load:
            bench = Bench(controller, load)
            capacity = bench.capacity()
            bench.flood_rate = FACTOR * capacity
            print(f"pools: the noisy worker serves {capacity:.0f}/s alone; flood at {FACTOR}x")
            print(bench.arm("alone", WARM_S).line().replace("alone", "warm-up", 1))
            rounds: list[dict[str, Arm]] = []
            for k in range(ROUNDS):
                order = ARMS if k % 2 == 0 else ARMS[::-1]
                print(f"pools: round {k + 1} ({', '.join(order)})")
                found = {}
                for name in order:
                    found[name] = bench.arm(name)
                    print(found[name].line())
                rounds.append(found)
        _report(rounds, capacity, bench.flood_rate)
        print(f"pools: took {time.monotonic() - started:.0f} s")
    finally:
        if bench is not None:
            bench.stop()
        controller.stop()
        for name in (STEADY, NOISY, f"{NOISY}-load"):
            if (group := cgroup_of(name)) is not None:
                remove_cgroup(group)
