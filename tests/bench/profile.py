"""`python -m tests.bench profile` (part of `make bench`): where a worker's and the gateway's time
goes, under load.

py-spy samples only the threads holding the GIL (`--gil`), so time spent waiting in a poll, a
select or a model's native code without the GIL does not count: what remains is the Python work
per request. One of 2 workers is sampled while the Kafka load runs at
`TIDEGATE_BENCH_PROFILE_KAFKA_RATE` requests/s (default 2000), then the gateway while the HTTP load
runs at `TIDEGATE_BENCH_PROFILE_HTTP_RATE` (default 500). The raw stacks of each go to
var/bench/profiles/, and the top frames by own and by inclusive samples are printed.
"""

from __future__ import annotations

import asyncio
import os
import subprocess
import sys
from collections import Counter
from pathlib import Path

from tests.bench.bench_keys import infer_headers
from tests.bench.versus import RUN_DIR, serve_examples, tidegate_workers
from tests.support import unique
from tidegate.cli.demo import fraud_body, fraud_record
from tidegate.cli.procs import spawn, stop_recorded, wait_http
from tidegate.clients.loadgen import KafkaLoad, http_load
from tidegate.gateway.gateway_settings import GatewaySettings

__all__ = ["run", "summary"]

OUT = RUN_DIR / "profiles"
SECONDS = 12
PY_SPY = str(Path(sys.executable).with_name("py-spy"))


def record(pid: int, name: str) -> subprocess.Popen[bytes]:
    """py-spy on `pid` for SECONDS; its raw collapsed stacks go to OUT/<name>.txt (flame graph
    tools such as speedscope and inferno read them)."""
    OUT.mkdir(parents=True, exist_ok=True)
    # --subprocesses: the gateway serves from a child of its supervisor.
    args = ["record", "--gil", "--nonblocking", "--subprocesses", "-p", str(pid)]
    args += ["-d", str(SECONDS)]
    return subprocess.Popen(
        [PY_SPY, *args, "-f", "raw", "-o", str(OUT / f"{name}.txt")],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )


def summary(raw: Path, top: int = 25) -> str:
    """The frames with the most own and inclusive samples, as text."""
    own: Counter[str] = Counter()
    inclusive: Counter[str] = Counter()
    total = 0
    for line in raw.read_text().splitlines():
        stack, _, count = line.rpartition(" ")
        if not stack or not count.isdigit():
            continue
        n = int(count)
        total += n
        frames = stack.split(";")
        own[frames[-1]] += n
        for frame in set(frames):
            inclusive[frame] += n
    lines = [f"{raw.name}: {total} samples holding the GIL ({total / SECONDS:.0f}/s of 100/s)"]
    lines.append("  own time:")
    lines += [f"    {n / total:6.1%}  {frame}" for frame, n in own.most_common(top)]
    lines.append("  inclusive, tidegate frames:")
    ours = [(f, n) for f, n in inclusive.most_common() if "tidegate/" in f][:top]
    lines += [f"    {n / total:6.1%}  {frame}" for frame, n in ours]
    return "\n".join(lines)


def run() -> None:
    kafka_rate = float(os.environ.get("TIDEGATE_BENCH_PROFILE_KAFKA_RATE", "2000"))
    http_rate = float(os.environ.get("TIDEGATE_BENCH_PROFILE_HTTP_RATE", "500"))
    stop_recorded(RUN_DIR)
    gw = GatewaySettings()
    base = f"http://{gw.host}:{gw.port}"
    print(f"\nprofile: a worker at {kafka_rate:g}/s on Kafka, the gateway at {http_rate:g}/s")
    serve_examples()
    with tidegate_workers() as workers:
        load = KafkaLoad()
        load.start(lambda i: fraud_record(i, unique("warm")))
        with load:
            spy = record(workers[0], "worker")
            tag = unique("profile")
            count = int(kafka_rate * (SECONDS + 2))
            result = load.run(
                "profile", lambda i: fraud_record(i, tag), rate=kafka_rate, count=count
            )
            spy.wait(30)
        print(
            f"  kafka: p99 {result.p(0.99):.1f} ms, lost {result.lost}, "
            f"batch {result.mean_batch:.1f}"
        )
        headers = infer_headers()  # as deployed: authentication on
        gateway = spawn("gateway", ["gateway", "--no-admin"], RUN_DIR)
        try:
            wait_http(f"{base}/v2/health/ready", gateway, 120)
            spy = record(gateway.process.pid, "gateway")
            url = f"{base}/v2/models/fraud/infer"
            count = int(http_rate * (SECONDS + 2))
            result = asyncio.run(
                http_load("profile", url, fraud_body, rate=http_rate, count=count, headers=headers)
            )
            spy.wait(30)
            print(f"  http: p99 {result.p(0.99):.1f} ms, lost {result.lost}, {result.statuses}")
            if result.errors:
                raise SystemExit(f"profile: {result.errors} calls failed: not a profile of serving")
        finally:
            gateway.stop()
    for name in ("worker", "gateway"):
        raw = OUT / f"{name}.txt"
        if raw.exists():
            print(summary(raw))
