"""`python -m tests.bench threads` (part of `make bench`): where the HTTP path's CPU goes, by
thread, on the processes `tidegate demo --keep` runs (controller, 2 workers, 1 gateway with
authentication on).

At each rate of `TIDEGATE_BENCH_THREADS_RATES` (default 250 and 500 calls/s): 2 s of warm-up,
then `SECONDS` counted, open loop. It prints CPU per call by process and by thread name (from
/proc; Python's own threads are all named `python`, librdkafka's `rdk:*`, the broker's JVM
threads by their pool), and the broker's requests per call by API. With
`TIDEGATE_BENCH_THREADS_STRACE=1` each rate then gets one more step, not counted, with the
serving gateway process's system calls per call (`strace -c -f`, which slows what it watches).
Last, unless `TIDEGATE_BENCH_THREADS_IDLE=0`, `SECONDS` with no calls: each process's and
thread's cores, and the broker's requests a second, that every call at a low rate shares.
"""

from __future__ import annotations

import asyncio
import os
import shutil
import subprocess
import time
from pathlib import Path

from tests.bench.bench_keys import infer_headers
from tests.bench.broker_requests import BrokerRequests, broker_pid
from tests.bench.proc_cpu import pid_file, process_tree
from tests.bench.versus import (
    RUN_DIR,
    controller,
    python_warm,
    serve_examples,
    tidegate_workers,
)
from tidegate.cli.demo import fraud_body
from tidegate.cli.procs import spawn, stop_recorded, wait_http
from tidegate.clients.loadgen import LoadResult, http_load
from tidegate.gateway.gateway_settings import GatewaySettings

__all__ = ["run", "thread_seconds"]

SECONDS = 10.0
_TICK = os.sysconf("SC_CLK_TCK")
_TOP = 12


def thread_seconds(groups: dict[str, list[int]]) -> dict[tuple[str, str], float]:
    """CPU seconds so far by (group, thread name), over each group's process trees."""
    out: dict[tuple[str, str], float] = {}
    for group, pids in groups.items():
        for pid in (p for root in pids for p in process_tree(root)):
            for task in Path(f"/proc/{pid}/task").glob("*"):
                try:
                    raw = (task / "stat").read_text()
                except OSError:
                    continue  # the thread ended meanwhile
                name = raw[raw.index("(") + 1 : raw.rindex(")")]
                fields = raw.rsplit(")", 1)[1].split()
                seconds = (int(fields[11]) + int(fields[12])) / _TICK
                out[group, name] = out.get((group, name), 0.0) + seconds
    return out


def _strace(pid: int, seconds: float, out: Path) -> subprocess.Popen[bytes] | None:
    tool = shutil.which("strace")
    if tool is None:
        print("  (strace not found: no system call counts)")
        return None
    limit = ["timeout", "-s", "INT", f"{seconds:g}"]
    return subprocess.Popen(
        [*limit, tool, "-c", "-f", "-o", str(out), "-p", str(pid)],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )


def _load(url: str, rate: float, headers: dict[str, str]) -> LoadResult:
    count = int(rate * SECONDS)
    return asyncio.run(
        http_load("threads", url, fraud_body, rate=rate, count=count, headers=headers)
    )


def _step(url: str, rate: float, headers: dict[str, str], groups: dict[str, list[int]]) -> None:
    # Warmed with the generator that measures the step (part versus warms with vegeta).
    python_warm(url, fraud_body, rate, headers)
    broker = BrokerRequests()
    asked = broker.read()
    before = thread_seconds(groups)
    result = _load(url, rate, headers)
    after = thread_seconds(groups)
    calls = max(result.sent, 1)
    used = {key: 1000 * (after[key] - before.get(key, 0.0)) / calls for key in after}
    by_group: dict[str, float] = {}
    for (group, _), ms in used.items():
        by_group[group] = by_group.get(group, 0.0) + ms
    print(
        f"  {rate:>5g}/s  p50 {result.p(0.5):6.1f}  p99 {result.p(0.99):7.1f} ms  "
        f"{dict(result.statuses)}"
    )
    print("    ms per call: " + "  ".join(f"{g} {ms:.2f}" for g, ms in by_group.items()))
    print(f"    all {sum(by_group.values()):.2f}")
    requests = broker.per_call(asked, broker.read(), calls)
    print("    broker requests per call: " + "  ".join(f"{a} {n:.2f}" for a, n in requests.items()))
    for (group, name), ms in sorted(used.items(), key=lambda kv: -kv[1])[:_TOP]:
        print(f"      {group:<10} {name:<16} {ms:.3f}")


def _idle(groups: dict[str, list[int]]) -> None:
    """`SECONDS` with no calls at all: what each process and thread costs just by running, in
    cores, and the broker's requests a second. At 250 calls/s each 0.01 cores is 0.04 ms a
    call."""
    time.sleep(2.0)  # the last step's replies and commits settle
    broker = BrokerRequests()
    asked = broker.read()
    before = thread_seconds(groups)
    time.sleep(SECONDS)
    after = thread_seconds(groups)
    used = {key: (after[key] - before.get(key, 0.0)) / SECONDS for key in after}
    by_group: dict[str, float] = {}
    for (group, _), cores in used.items():
        by_group[group] = by_group.get(group, 0.0) + cores
    print("   idle   cores: " + "  ".join(f"{g} {c:.3f}" for g, c in by_group.items()))
    print(f"    all {sum(by_group.values()):.3f}")
    requests = broker.per_call(asked, broker.read(), int(SECONDS))
    print("    broker requests a second: " + "  ".join(f"{a} {n:.1f}" for a, n in requests.items()))
    for (group, name), cores in sorted(used.items(), key=lambda kv: -kv[1])[:_TOP]:
        print(f"      {group:<10} {name:<16} {cores:.4f}")


def _syscalls(url: str, rate: float, headers: dict[str, str], gateway: int) -> None:
    """Another step at `rate`, uncounted, with strace on the serving process (the supervisor's
    newest child) for its first SECONDS - 2 s: system calls per call."""
    out = RUN_DIR / f"strace-{rate:g}.txt"
    watched = SECONDS - 2
    tracer = _strace(process_tree(gateway)[-1], watched, out)
    if tracer is None:
        return
    _load(url, rate, headers)
    tracer.wait(SECONDS + 30)
    calls = rate * watched
    print(f"    system calls of the gateway per call at {rate:g}/s (strace -c, {out}):")
    for line in out.read_text().splitlines() if out.exists() else []:
        fields = line.split()
        if len(fields) >= 5 and fields[3].isdigit() and int(fields[3]) >= calls / 20:
            print(f"      {fields[-1]:<16} {int(fields[3]) / calls:6.2f}")  # 0.05 a call or more


def run() -> None:
    rates = [float(r) for r in os.environ.get("TIDEGATE_BENCH_THREADS_RATES", "250,500").split(",")]
    stop_recorded(RUN_DIR)
    gw = GatewaySettings()
    base = f"http://{gw.host}:{gw.port}"
    print("\nthreads: CPU per HTTP call by process and thread (demo --keep's processes)")
    serve_examples()
    with controller() as ctl, tidegate_workers() as workers:
        headers = infer_headers()
        gateway = spawn("gateway", ["gateway"], RUN_DIR)
        try:
            wait_http(f"{base}/v2/health/ready", gateway, 120)
            wait_http(f"{base}/v2/models/fraud/ready", gateway, 120, headers)
            groups = {
                "gateway": [gateway.process.pid],
                "workers": workers,
                "controller": ctl,
                "broker": [p for p in (broker_pid(),) if p is not None],
                "postgres": [p for p in (pid_file("postgres"),) if p is not None],
            }
            url = f"{base}/v2/models/fraud/infer"
            for rate in rates:
                _step(url, rate, headers, groups)
                if os.environ.get("TIDEGATE_BENCH_THREADS_STRACE") == "1":
                    _syscalls(url, rate, headers, gateway.process.pid)
            if os.environ.get("TIDEGATE_BENCH_THREADS_IDLE", "1") == "1":
                _idle(groups)
        finally:
            gateway.stop()
