"""The overload benchmark's instruments: an open-loop HTTP generator that keeps each answer's
status and latency apart (accepted calls and refusals are judged by different bars), and a
sampler of the processes' memory and the workers' Kafka lag while the load runs.

Like `tidegate.clients.loadgen.http_load`, aiohttp and open loop: each call is due at
`start + i / rate` whatever the earlier ones did, and its latency counts from when it was due.
"""

from __future__ import annotations

import asyncio
import itertools
import json
import threading
import time
from collections import Counter
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from tests.bench.proc_cpu import process_tree
from tidegate.clients.loadgen import percentile
from tidegate.core.kafka import make_offset_reader
from tidegate.core.settings import KafkaSettings
from tidegate.gateway.admission.lag_probe import read_lag

__all__ = ["Answers", "Sampler", "http_overload", "rss_mb", "workers_lag"]


@dataclass
class Answers:
    """Latencies (seconds from when each call was due) by HTTP status, or an exception's name."""

    seconds: float
    by_status: dict[str, list[float]] = field(default_factory=dict)
    # (seconds since the start, status) per call, for the shed timeline.
    timeline: list[tuple[float, str]] = field(default_factory=list)
    # How late the generator itself began each call (its share of every latency on a shared host).
    started_late: list[float] = field(default_factory=list)

    def count(self, status: str) -> int:
        return len(self.by_status.get(status, []))

    def p(self, status: str, q: float) -> float:
        """The q-quantile of `status`'s latencies, in ms (nan when none)."""
        return percentile(self.by_status.get(status, []), q) * 1000

    def within(self, status: str, bound_s: float) -> int:
        return sum(1 for v in self.by_status.get(status, []) if v <= bound_s)

    @property
    def sent(self) -> int:
        return sum(len(v) for v in self.by_status.values())

    def first(self, status: str) -> float | None:
        """Seconds after the start when the first `status` answer was due."""
        return next((at for at, s in self.timeline if s == status), None)

    def longest_silence(self) -> float:
        """The longest stretch in which no due call was answered within a second (the gateway
        "answered nothing"): the gap between consecutive calls whose latency was under 1 s."""
        quick = sorted(at for at, _ in self.timeline)
        gaps = [b - a for a, b in itertools.pairwise(quick)]
        return max(gaps, default=0.0)


async def http_overload(
    url: str,
    make_body: Callable[[int], dict[str, Any]],
    *,
    rate: float,
    seconds: float,
    headers: Mapping[str, str],
    timeout_s: float = 30.0,
) -> Answers:
    import aiohttp

    answers = Answers(seconds)
    count = int(rate * seconds)
    sent_headers = {**headers, "Content-Type": "application/json"}
    connector = aiohttp.TCPConnector(limit=2048)
    timeout = aiohttp.ClientTimeout(total=timeout_s)
    async with aiohttp.ClientSession(connector=connector, timeout=timeout) as session:
        loop = asyncio.get_running_loop()
        start = loop.time()

        async def one(i: int, at: float) -> None:
            answers.started_late.append(loop.time() - at)
            body = json.dumps(make_body(i)).encode()
            try:
                async with session.post(url, data=body, headers=sent_headers) as resp:
                    await resp.read()
                    status = str(resp.status)
            except (aiohttp.ClientError, TimeoutError) as exc:
                status = type(exc).__name__
            latency = loop.time() - at
            answers.by_status.setdefault(status, []).append(latency)
            if latency < 1.0:
                answers.timeline.append((at - start, status))

        tasks = []
        for i in range(count):
            at = start + i / rate
            delay = at - loop.time()
            if delay > 0:
                await asyncio.sleep(delay)
            tasks.append(asyncio.create_task(one(i, at)))
        await asyncio.gather(*tasks)
    return answers


def rss_mb(pid: int) -> float:
    """Resident memory of a process, from /proc (0 when it is gone)."""
    try:
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) / 1024
    except OSError:
        pass
    return 0.0


def workers_lag(group: str, topic: str) -> Callable[[], int]:
    """A reader of `group`'s lag on `topic` (one consumer that never joins it, reused)."""
    from confluent_kafka import TopicPartition

    reader = make_offset_reader(KafkaSettings(), group)
    meta = reader.list_topics(topic, timeout=10).topics[topic]
    partitions = [TopicPartition(topic, p) for p in sorted(meta.partitions)]

    def read() -> int:
        lag, _ = read_lag(reader, partitions, 10.0)
        return lag

    return read


class Sampler:
    """Once a second, on a thread: each process's RSS and the workers' lag."""

    def __init__(self, pids: Mapping[str, int], lag: Callable[[], int]) -> None:
        self._pids = dict(pids)
        self._lag = lag
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="overload-sampler", daemon=True)
        self.rss: dict[str, list[float]] = {name: [] for name in pids}
        self.lags: list[tuple[float, int]] = []
        self.errors: Counter[str] = Counter()

    def __enter__(self) -> Sampler:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join(10)

    def _run(self) -> None:
        start = time.monotonic()
        while not self._stop.wait(0 if not self.lags else 1.0):
            for name, pid in self._pids.items():
                self.rss[name].append(sum(rss_mb(p) for p in process_tree(pid)))
            try:
                self.lags.append((time.monotonic() - start, self._lag()))
            except Exception as exc:  # a slow admin answer under load: the sample is skipped
                self.errors[type(exc).__name__] += 1
                self.lags.append((time.monotonic() - start, -1))

    def max_lag(self) -> int:
        return max((lag for _, lag in self.lags), default=0)
