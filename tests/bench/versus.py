"""Side by side with the peers (`python -m tests.bench versus`, part of `make bench`).

On the same `fraud` ONNX model and the same open-loop rate steps, in rounds whose order alternates
(these 2 cores are noisy; each contender's best round counts):

* tidegate: as `tidegate demo --keep` runs it: the controller (lineage on), 2 `tidegate worker`
  processes and 1 gateway with authentication on and an `infer` key; its Kafka path (Avro
  requests from `KafkaLoad`) and its HTTP path (V2 JSON through the gateway, Kafka and back);
* naive: 2 processes of the confluent-kafka loop a user writes (`tests.bench.peers.naive`);
* quix: 2 processes of a quixstreams app, one model call per message (`tests.bench.peers.quix_app`);
* mlserver: MLServer 1.7 in one process, a custom onnxruntime `MLModel`, adaptive batching 32 /
  5 ms, `parallel_workers` 0 (the best of 0, 1 and 2 on 2 cores, by
  `python -m tests.bench.mlserver.peer`).

HTTP load comes from vegeta for both HTTP contenders (`TIDEGATE_BENCH_HTTP_GENERATOR=python` for the
Python generator), Kafka load from the Python generators. One contender runs at a time. A rate is
sustained while p99 <= 100 ms with nothing lost or failed; a sweep stops at the first rate that
misses. The JSON generator's ceiling against a bare relay is
measured first: a peer sustained at that ceiling is limited by the generator, not by itself. Then
tidegate's Kafka path runs uncounted at-least-once, then exactly-once,
`TIDEGATE_BENCH_BROKER_WARM_S` (30) seconds each, so that no round meets a request path the
broker's JIT has not compiled yet (docs/benchmarks.md, "Exactly-once on a cold broker"). CPU per
request is counted per process (from /proc): the contender's own and, for every contender that
goes through Kafka, the broker's (with its KRaft controller: one process here), and for tidegate
also PostgreSQL's, Redis's and the registry's; the load generator alone is left out. Each step
prints them, and the broker's requests per call by API (`tests.bench.broker_requests`); the
report shows them at 250/s, the rate of the CPU-per-call bar, and at the last sustained rate.
"""

from __future__ import annotations

import asyncio
import functools
import math
import os
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from tests.bench import vegeta
from tests.bench.bench_keys import infer_headers
from tests.bench.broker_requests import BrokerRequests, broker_pid
from tests.bench.mlserver import peer as mlserver
from tests.bench.peers import jsonload, run_peers
from tests.bench.pipeline import BARS, STEP_S, kafka_attempt, wait_group_settled
from tests.bench.proc_cpu import cpu_seconds, pid_file, process_tree
from tests.support import free_port, unique
from tidegate.agents.worker_settings import WorkerSettings
from tidegate.cli.demo import fraud_body, fraud_record
from tidegate.cli.procs import spawn, stop_recorded, wait_http
from tidegate.clients.loadgen import KafkaLoad, LoadResult, http_load
from tidegate.gateway.gateway_settings import GatewaySettings

__all__ = ["python_warm", "run", "serve_examples", "uses_vegeta"]

RATES = [250, 500, 750, 1000, 1500, 2000, 2500, 3000, 3500, 4000]
ROUNDS = int(os.environ.get("TIDEGATE_BENCH_ROUNDS", "2"))
RUN_DIR = Path("var/bench")
WARM_S = 2.0
# The broker's JIT compiles a request path in the first minute it serves it (decision 030): a
# sweep whose first steps meet an uncompiled path measures the compiler, not the contender.
BROKER_WARM_S = float(os.environ.get("TIDEGATE_BENCH_BROKER_WARM_S", "30"))
BROKER_WARM_RATE = 500.0

CpuReaders = dict[str, Callable[[], float]]


def stack_cpu() -> CpuReaders:
    """CPU readers of the local stack's servers: the broker (and its KRaft controller), and
    PostgreSQL, Redis and the registry, which only tidegate uses."""
    return {
        "broker": lambda: cpu_seconds(process_tree(broker_pid())),
        "postgres": lambda: cpu_seconds(process_tree(pid_file("postgres"))),
        "redis": lambda: cpu_seconds(process_tree(pid_file("redis"))),
        "registry": lambda: cpu_seconds(process_tree(pid_file("registry"))),
    }


@dataclass
class Sweep:
    """One contender's sweep in one round: the highest sustained rate, and at that rate the mean
    batch and the CPU per request of each group of its processes."""

    sustained: float = 0.0
    mean_batch: float = 0.0
    cpu_ms: dict[str, float] = field(default_factory=dict)
    """CPU per request by process group at the sustained rate; "all" is their sum."""
    requests: dict[str, float] = field(default_factory=dict)
    """The broker's requests per call by API at the sustained rate."""
    first: dict[str, float] = field(default_factory=dict)
    """CPU per request by process group at the first step (250/s), met or not."""
    first_requests: dict[str, float] = field(default_factory=dict)
    runs: list[LoadResult] = field(default_factory=list)


def sweep(
    label: str,
    attempt: Callable[[float], LoadResult],
    cpu: CpuReaders,
    broker: BrokerRequests | None = None,
    warm: Callable[[float], object] | None = None,
) -> Sweep:
    """Each step at `rate`: `warm(rate)` first when given (not counted), then `attempt(rate)`
    counted, its CPU and broker requests read around it."""
    out = Sweep()
    for rate in RATES:
        if warm is not None:
            warm(float(rate))
        before = {name: read() for name, read in cpu.items()}
        asked = broker.read() if broker is not None else {}
        result = attempt(float(rate))
        calls = max(result.sent, 1)
        used = {name: 1000 * (read() - before[name]) / calls for name, read in cpu.items()}
        used["all"] = sum(used.values())
        requests = broker.per_call(asked, broker.read(), calls) if broker is not None else {}
        out.runs.append(result)
        if not out.first:
            out.first, out.first_requests = used, requests
        ok = not result.lost and not result.errors and result.p(0.99) <= BARS["fraud"] * 1000
        shown = "  ".join(f"{name} {ms:.2f}" for name, ms in used.items())
        asked_for = "  ".join(f"{api} {n:.2f}" for api, n in requests.items())
        print(
            f"  {label:<15} {rate:>5}/s  p50 {result.p(0.5):6.1f}  p99 {result.p(0.99):7.1f} ms"
            f"  lost {result.lost}  err {result.errors}  cpu ms/req: {shown}"
            f"{'  broker requests/call: ' + asked_for if asked_for else ''}"
            f"  {'ok' if ok else 'over the bar'}"
        )
        if not ok:
            break
        out.sustained, out.mean_batch, out.cpu_ms = float(rate), result.mean_batch, used
        out.requests = requests
    return out


def http_attempt(
    label: str,
    url: str,
    body: Callable[[int], dict[str, Any]],
    rate: float,
    headers: dict[str, str] | None = None,
) -> LoadResult:
    if uses_vegeta():
        answers = vegeta.attack(url, body, rate=rate, seconds=STEP_S, headers=headers or {})
        return vegeta.load_result(label, answers)
    count = max(1, int(rate * STEP_S))
    return asyncio.run(http_load(label, url, body, rate=rate, count=count, headers=headers))


def http_warm(
    url: str,
    body: Callable[[int], dict[str, Any]],
    rate: float,
    headers: dict[str, str] | None = None,
) -> None:
    """`WARM_S` of calls at `rate` before a step is counted, as the peers get (the Kafka
    contenders' loads warm up in `KafkaLoad.run`)."""
    if uses_vegeta():
        vegeta.attack(url, body, rate=rate, seconds=WARM_S, headers=headers or {})
        return
    python_warm(url, body, rate, headers)


def python_warm(
    url: str,
    body: Callable[[int], dict[str, Any]],
    rate: float,
    headers: dict[str, str] | None = None,
) -> None:
    """`http_warm` with the Python generator, whichever the HTTP contenders get."""
    count = warmed(rate)
    asyncio.run(http_load("warm-up", url, body, rate=rate, count=count, headers=headers))


def uses_vegeta() -> bool:
    """Whether the HTTP contenders' generator is vegeta (installed by `make bench`), as it is
    unless TIDEGATE_BENCH_HTTP_GENERATOR says "python". The Python generator shares the 2 cores
    with what it measures and starts calls late under load (tests/bench/vegeta.py); both HTTP
    contenders always get the same one."""
    generator = os.environ.get("TIDEGATE_BENCH_HTTP_GENERATOR", "vegeta")
    if generator not in ("vegeta", "python"):
        raise SystemExit(
            f"versus: TIDEGATE_BENCH_HTTP_GENERATOR is vegeta or python, not {generator!r}"
        )
    if generator == "python":
        return False
    if not vegeta.available():
        raise SystemExit("versus: vegeta is not installed: run `bash infra/bench-tools.sh`")
    return True


def warmed(rate: float) -> int:
    return max(1, int(rate * WARM_S))


def json_attempt(load: KafkaLoad, label: str, rate: float) -> LoadResult:
    record = functools.partial(run_peers.json_fraud_record, tag=unique(f"{label}-{rate:g}"))
    return load.run(label, record, rate=rate, count=max(1, int(rate * STEP_S)))


@contextmanager
def tidegate_workers(env: dict[str, str] | None = None) -> Iterator[list[int]]:
    """2 `tidegate worker` processes in the group, settled; yields their pids."""
    ports = (free_port(), free_port())
    children = [
        spawn(
            f"worker-{k}",
            ["worker", "--processes", "1", "--worker-id", f"bench-w{k}", "--metrics-port", str(p)],
            RUN_DIR,
            env,
        )
        for k, p in enumerate(ports, start=1)
    ]
    try:
        for child, port in zip(children, ports, strict=True):
            wait_http(f"http://127.0.0.1:{port}/metrics", child, 180)
        wait_group_settled(WorkerSettings().group_id, members=2)
        yield [c.process.pid for c in children]
    finally:
        for child in children:
            child.stop()


def kafka_sweep(label: str, cpu: CpuReaders, load: KafkaLoad | None = None) -> Sweep:
    """The Kafka path's sweep with `load` (by default a `KafkaLoad` of the environment's)."""
    load = load or KafkaLoad()
    load.start(lambda i: fraud_record(i, unique("warm")))
    with load:

        def warm(rate: float) -> None:
            load.run(
                "warm-up", lambda i: fraud_record(i, unique("w")), rate=rate, count=warmed(rate)
            )

        attempt = functools.partial(kafka_attempt, load, "fraud", unique("v"))
        return sweep(label, attempt, cpu, BROKER(), warm)


@functools.cache
def _broker_requests() -> BrokerRequests:
    return BrokerRequests()


BROKER = _broker_requests


@contextmanager
def controller() -> Iterator[list[int]]:
    """The lifecycle controller as the demo runs it (lineage indexer, canary, lag); its pids."""
    child = spawn("controller", ["controller", "--migrate"], RUN_DIR)
    try:
        yield [child.process.pid]
    finally:
        child.stop()


def tidegate_cpu(
    workers: list[int], ctl: list[int], gateway: list[int] | None = None
) -> CpuReaders:
    # Each process with everything below it, read when counted: the gateway serves from a child
    # of its supervisor, which a restart replaces.
    def trees(pids: list[int]) -> list[int]:
        return [p for pid in pids for p in process_tree(pid)]

    cpu: CpuReaders = {}
    if gateway is not None:
        cpu["gateway"] = lambda: cpu_seconds(trees(gateway))
    cpu["workers"] = lambda: cpu_seconds(trees(workers))
    cpu["controller"] = lambda: cpu_seconds(trees(ctl))
    return {**cpu, **stack_cpu()}


def measure_tidegate() -> dict[str, Sweep]:
    stop_recorded(RUN_DIR)
    gw = GatewaySettings()
    base = f"http://{gw.host}:{gw.port}"
    with controller() as ctl, tidegate_workers() as workers:
        kafka = kafka_sweep("tidegate kafka", tidegate_cpu(workers, ctl))
        # As `tidegate demo --keep` runs it: authentication on, an `infer` key on every call,
        # the default admission objective.
        headers = infer_headers()
        gateway_child = spawn("gateway", ["gateway"], RUN_DIR)
        try:
            wait_http(f"{base}/v2/health/ready", gateway_child, 120)
            wait_http(f"{base}/v2/models/fraud/ready", gateway_child, 120, headers)
            gateway = [gateway_child.process.pid]
            url = f"{base}/v2/models/fraud/infer"
            http = sweep(
                "tidegate http",
                functools.partial(http_attempt, "tidegate http", url, fraud_body, headers=headers),
                tidegate_cpu(workers, ctl, gateway),
                BROKER(),
                functools.partial(http_warm, url, fraud_body, headers=headers),
            )
        finally:
            gateway_child.stop()
    return {"tidegate kafka": kafka, "tidegate http": http}


EXACTLY_ONCE = {"TIDEGATE_WORKER_DELIVERY": "exactly-once"}


def measure_tidegate_exactly_once() -> dict[str, Sweep]:
    stop_recorded(RUN_DIR)
    with controller() as ctl, tidegate_workers(EXACTLY_ONCE) as workers:
        return {"tidegate kafka eos": kafka_sweep("tidegate kafka eos", tidegate_cpu(workers, ctl))}


@contextmanager
def json_peer(
    name: str, start: Callable[[str, str], run_peers.Peers]
) -> Iterator[tuple[KafkaLoad, list[int]]]:
    with (
        run_peers.json_topics(f"bench-{name}") as (source, sink),
        start(source, sink) as peers,
        jsonload.JsonLoad(source, sink) as load,
    ):
        load.start(functools.partial(run_peers.json_fraud_record, tag=unique("warm")))
        yield load, [c.process.pid for c in peers.children]


def measure_json(name: str, start: Callable[[str, str], run_peers.Peers]) -> dict[str, Sweep]:
    with json_peer(name, start) as (load, pids):
        cpu: CpuReaders = {
            "peer": lambda: cpu_seconds(pids),
            "broker": lambda: cpu_seconds(process_tree(broker_pid())),
        }

        def warm(rate: float) -> None:
            record = functools.partial(run_peers.json_fraud_record, tag=unique(f"{name}-warm"))
            load.run("warm-up", record, rate=rate, count=warmed(rate))

        attempt = functools.partial(json_attempt, load, name)
        return {name: sweep(name, attempt, cpu, BROKER(), warm)}


def measure_mlserver() -> dict[str, Sweep]:
    port = free_port()
    with mlserver.start(0, port) as server:
        url = f"{server.url}/v2/models/{mlserver.MODEL}/infer"
        attempt = functools.partial(http_attempt, "mlserver", url, mlserver.mlserver_body)
        warm = functools.partial(http_warm, url, mlserver.mlserver_body)
        return {"mlserver": sweep("mlserver", attempt, {"server": server.cpu_seconds}, None, warm)}


CONTENDERS: list[tuple[str, Callable[[], dict[str, Sweep]]]] = [
    ("tidegate", measure_tidegate),
    ("tidegate exactly-once", measure_tidegate_exactly_once),
    ("naive", functools.partial(measure_json, "naive", run_peers.start_naive)),
    ("quix", functools.partial(measure_json, "quix", run_peers.start_quix)),
    ("mlserver", measure_mlserver),
]


# TIDEGATE_BENCH_VERSUS=tidegate,mlserver runs only those contenders (names as above).
_ONLY = {n.strip() for n in os.environ.get("TIDEGATE_BENCH_VERSUS", "").split(",") if n.strip()}
if _ONLY:
    CONTENDERS = [(name, measure) for name, measure in CONTENDERS if name in _ONLY]


def best(rounds: list[dict[str, Sweep]], name: str) -> Sweep:
    found = [r[name] for r in rounds if name in r]
    return max(found, key=lambda s: s.sustained) if found else Sweep()


def serve_examples() -> None:
    """Workers serve what the lifecycle says: register the example models and make the served
    ones primary, as `tidegate demo` does (a part run alone would otherwise measure 404s)."""
    from rich.console import Console

    from tidegate.cli.demo_lifecycle import bootstrap
    from tidegate.models.model_settings import ModelSettings

    bootstrap(ModelSettings().store_dir.parent / "packages", Console())


def ratio(a: float, b: float) -> float:
    return a / b if b else math.nan


def warm_broker() -> None:
    """Before round 1, uncounted: tidegate's Kafka path at-least-once, then exactly-once, at
    `BROKER_WARM_RATE` for `BROKER_WARM_S` each. The peers' paths (produce, fetch, commit) are
    the at-least-once path's; only tidegate exactly-once uses the transactional requests."""
    names = {name for name, _ in CONTENDERS}
    if BROKER_WARM_S <= 0 or names <= {"mlserver"}:
        return
    phases: list[tuple[str, dict[str, str]]] = [("at-least-once", {})]
    if "tidegate exactly-once" in names:
        phases.append(("exactly-once", EXACTLY_ONCE))
    for label, env in phases:
        stop_recorded(RUN_DIR)
        with controller(), tidegate_workers(env):
            load = KafkaLoad()
            load.start(lambda i: fraud_record(i, unique("warm")))
            with load:
                result = load.run(
                    "broker warm-up",
                    lambda i: fraud_record(i, unique("bw")),
                    rate=BROKER_WARM_RATE,
                    count=int(BROKER_WARM_RATE * BROKER_WARM_S),
                )
        p99 = result.p(0.99)
        print(f"  {label:<14} {BROKER_WARM_S:g} s at {BROKER_WARM_RATE:g}/s, p99 {p99:.1f} ms")


def run() -> None:
    if any(name in ("tidegate", "mlserver") for name, _ in CONTENDERS):
        shown = "vegeta" if uses_vegeta() else "the Python generator"
        print(f"\nversus: HTTP load from {shown}")
    print("\nversus: the JSON generator's ceiling (bare relay, no model)")
    ceiling = jsonload.ceiling(
        progress=lambda r, rate: print(
            f"  generator {rate:>6g}/s  p99 {r.p(0.99):7.1f} ms  lost {r.lost}"
        )
    )
    print(f"  ceiling {ceiling.rate:,.0f}/s")
    serve_examples()
    print("\nversus: the broker's warm-up (uncounted)")
    warm_broker()
    rounds: list[dict[str, Sweep]] = []
    for k in range(ROUNDS):
        order = CONTENDERS if k % 2 == 0 else CONTENDERS[::-1]
        found: dict[str, Sweep] = {}
        for name, measure in order:
            print(f"versus: round {k + 1}, {name}")
            found.update(measure())
        rounds.append(found)
        print(
            "  round sustained: " + ", ".join(f"{n} {s.sustained:,.0f}/s" for n, s in found.items())
        )

    names = ["tidegate kafka", "tidegate kafka eos", "naive", "quix", "tidegate http", "mlserver"]
    top = {name: best(rounds, name) for name in names}
    print("\nversus: best round of each (sustained at p99 <= 100 ms, nothing lost)")
    for name in names:
        s = top[name]
        every = [r[name].sustained for r in rounds if name in r]
        cpu = ", ".join(f"{g} {ms:.2f}" for g, ms in s.cpu_ms.items())
        asked = ", ".join(f"{api} {n:.2f}" for api, n in s.requests.items())
        print(
            f"  {name:<15} {s.sustained:>7,.0f}/s  rounds {every}  batch {s.mean_batch:4.1f}"
            f"  cpu ms/req {cpu}{'  broker requests/call ' + asked if asked else ''}"
        )
    # A bar is met only when every round meets it: the worst round is the one shown.
    print(f"\nversus: CPU per call at {RATES[0]}/s by process, worst round (highest total)")
    for name in names:
        firsts = [r[name] for r in rounds if name in r and r[name].first]
        if not firsts:
            continue
        low = max(firsts, key=lambda f: f.first.get("all", math.inf))
        cpu = ", ".join(f"{g} {ms:.2f}" for g, ms in low.first.items())
        asked = ", ".join(f"{api} {n:.2f}" for api, n in low.first_requests.items())
        print(f"  {name:<15} {cpu}{'  broker requests/call ' + asked if asked else ''}")
    print(f"  generator ceiling (JSON) {ceiling.rate:,.0f}/s")
    t = {name: top[name].sustained for name in names}
    http_rounds = [r for r in rounds if "tidegate http" in r]
    print("versus ratios and bars (CPU bars: the worst round)")
    for label, value, bar in (
        ("tidegate Kafka / naive loop", ratio(t["tidegate kafka"], t["naive"]), ">= 1.0"),
        ("tidegate Kafka / quixstreams", ratio(t["tidegate kafka"], t["quix"]), ">= 1.5"),
        (
            "exactly-once / at-least-once",
            ratio(t["tidegate kafka eos"], t["tidegate kafka"]),
            ">= 0.5",
        ),
        ("tidegate HTTP / MLServer", ratio(t["tidegate http"], t["mlserver"]), ">= 1.0"),
        (
            f"HTTP CPU ms per call at {RATES[0]}/s",
            max(
                (r["tidegate http"].first.get("all", math.inf) for r in http_rounds),
                default=math.nan,
            ),
            "<= 2.5",
        ),
        (
            f"controller cores at {RATES[0]}/s",
            max(
                (
                    r["tidegate http"].first.get("controller", math.inf) * RATES[0] / 1000
                    for r in http_rounds
                ),
                default=math.nan,
            ),
            "<= 0.05",
        ),
    ):
        print(f"  {label:<30} = {value:5.2f}  bar {bar}")
