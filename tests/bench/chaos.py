"""Faults against what users run (`python -m tests.bench chaos`): `tidegate demo --keep`'s
processes, as shipped (authentication on, the default objective, a supervised gateway).

1. **A worker SIGKILLed under HTTP load**: 100 synchronous calls/s with `Request-Timeout: 10`
   for 30 s; worker 1 is killed at 10 s and started again at 20 s. Bar: every call answered
   (200, or 504 at its deadline) within its timeout plus 1 s.
2. **Kafka SIGKILLed for 15 s**, then started again (`make up`), under 20 synchronous calls/s
   and one asynchronous call a second. Bars: no tidegate process dies, the gateway is ready for
   `fraud` within 10 s of the broker answering again, and every accepted asynchronous call is
   answered.

It stops the demo's processes at the end (`tidegate demo-stop`).
"""

from __future__ import annotations

import asyncio
import os
import re
import signal
import subprocess
import sys
import threading
import time
from collections import Counter
from pathlib import Path

import httpx
from confluent_kafka import Producer

from tidegate.cli.demo import RUN_DIR, fraud_body
from tidegate.cli.procs import spawn
from tidegate.clients.loadgen import http_load
from tidegate.core.kafka import connection_config
from tidegate.core.settings import KafkaSettings

__all__ = ["run"]

BASE = "http://127.0.0.1:8080"
URL = f"{BASE}/v2/models/fraud/infer"
WORKER_1 = ["worker", "--processes", "1", "--worker-id", "demo-w1", "--metrics-port", "9101"]
_KAFKA_PID = Path("var/run/kafka.pid")


def _demo_key() -> str:
    done = subprocess.run(
        [sys.executable, "-m", "tidegate.cli", "demo", "--keep", "--scale", "0.2"],
        capture_output=True,
        text=True,
        timeout=900,
        check=False,
        env={**os.environ, "COLUMNS": "200"},
    )
    found = re.search(r"infer\s+(tg_[A-Za-z0-9_-]+)", done.stdout)
    if done.returncode != 0 or found is None:
        raise RuntimeError(f"tidegate demo --keep failed:\n{done.stdout[-3000:]}{done.stderr}")
    return found.group(1)


def _tree(pid: int) -> list[int]:
    try:
        kids = Path(f"/proc/{pid}/task/{pid}/children").read_text().split()
    except OSError:
        return [pid]
    return [pid, *(p for k in kids for p in _tree(int(k)))]


def _pids() -> dict[str, list[int]]:
    return {p.stem: _tree(int(p.read_text().split()[0])) for p in sorted(RUN_DIR.glob("*.pid"))}


def _worker_kill(headers: dict[str, str]) -> None:
    def chaos() -> None:
        time.sleep(10)
        pid = int((RUN_DIR / "worker-1.pid").read_text().split()[0])
        os.kill(pid, signal.SIGKILL)
        time.sleep(10)
        spawn("worker-1", WORKER_1, RUN_DIR)

    threading.Thread(target=chaos, daemon=True).start()
    timed = {**headers, "Request-Timeout": "10"}
    result = asyncio.run(http_load("kill", URL, fraud_body, rate=100, count=3000, headers=timed))
    slowest = result.p(1.0) / 1000
    answered = set(result.statuses) <= {"OK", "HTTP 504"}
    verdict = "met" if answered and slowest <= 11 else "missed"
    print(f"worker SIGKILLed: {result.statuses}, p99 {result.p(0.99):.0f} ms, slowest "
          f"{slowest:.2f} s (bar: all answered within 11 s: {verdict})")  # fmt: skip


def _broker_answers(probe: Producer) -> bool:
    """Whether the broker answers a metadata request (a producer's: no admin call, whose
    requests can abort librdkafka in an outage, docs/overload.md)."""
    try:
        probe.list_topics(timeout=1)
    except Exception:
        return False
    return True


def _kafka_outage(headers: dict[str, str]) -> None:
    before = _pids()
    marks: dict[str, float] = {}
    accepted: list[str] = []
    refused: Counter[str] = Counter()

    def chaos() -> None:
        time.sleep(8)
        os.kill(int(_KAFKA_PID.read_text().split()[0]), signal.SIGKILL)
        time.sleep(15)
        starting = subprocess.Popen(["make", "up"], stdout=subprocess.DEVNULL)
        # Quiet: librdkafka logs every refused connection while the broker is down.
        probe = Producer({**connection_config(KafkaSettings()), "log_level": 0})
        while not _broker_answers(probe):
            time.sleep(0.2)
        marks["broker"] = time.monotonic()
        while True:
            try:
                ready = httpx.get(f"{BASE}/v2/models/fraud/ready", headers=headers, timeout=2)
                if ready.status_code == 200:
                    break
            except httpx.HTTPError:
                pass
            time.sleep(0.2)
        marks["ready"] = time.monotonic()
        starting.wait(120)

    def async_calls() -> None:
        with httpx.Client(timeout=15) as client:
            for i in range(50):
                async_headers = {**headers, "Prefer": "respond-async"}
                try:
                    resp = client.post(URL, json=fraud_body(i), headers=async_headers)
                except httpx.HTTPError as exc:
                    refused[type(exc).__name__] += 1
                else:
                    if resp.status_code == 202:
                        accepted.append(resp.headers["Location"])
                    else:
                        refused[f"HTTP {resp.status_code}"] += 1
                time.sleep(1)

    threads = [threading.Thread(target=f, daemon=True) for f in (chaos, async_calls)]
    for thread in threads:
        thread.start()
    timed = {**headers, "Request-Timeout": "10"}
    sync = asyncio.run(http_load("outage", URL, fraud_body, rate=20, count=1200, headers=timed))
    for thread in threads:
        thread.join(180)
    died = [n for n, pids in before.items() if not all(Path(f"/proc/{p}").exists() for p in pids)]
    answers: Counter[int] = Counter()
    pending = list(accepted)
    deadline = time.monotonic() + 60
    with httpx.Client(timeout=10) as client:
        while pending and time.monotonic() < deadline:
            for location in list(pending):
                got = client.get(f"{BASE}{location}", headers=headers)
                if got.status_code != 202:
                    answers[got.status_code] += 1
                    pending.remove(location)
            time.sleep(1)
    ready_s = marks["ready"] - marks["broker"] if "ready" in marks else float("inf")
    print(f"Kafka SIGKILLed for 15 s: processes that died {died or 'none'}; gateway ready "
          f"{ready_s:.1f} s after the broker answered (bar 10 s); sync calls {sync.statuses}; "
          f"async accepted {len(accepted)}, answered {dict(answers)}, never answered "
          f"{len(pending)}, refused {dict(refused)}")  # fmt: skip


def run() -> None:
    print("chaos: faults against tidegate demo --keep's processes")
    headers = {"Authorization": f"Bearer {_demo_key()}"}
    try:
        _worker_kill(headers)
        _kafka_outage(headers)
    finally:
        subprocess.run([sys.executable, "-m", "tidegate.cli", "demo-stop"], check=False)
