"""The bulkhead part's instruments: the noisy pool's load, from a process of its own, and the
CPU readers of every process an arm runs.

The noisy load (`python -m tests.bench.pools_load MODEL RATE [--crash]`) is open loop: request i
is due at `go + i / RATE`, whatever the broker or the worker did. It runs in its own process so
that its encoding never holds the GIL of the steady load's generator, whose timing is what the
part measures. It publishes Avro requests to the model's pool's requests topic, as
`TidegateProducer(placement=...)` does, and reads no results. Protocol on stdin/stdout: it
connects and warms every partition up, prints `ready`, starts on a `go` line, stops on a `stop`
line and prints a JSON summary.
"""

from __future__ import annotations

import json
import os
import resource
import select
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager, suppress
from pathlib import Path
from typing import Any

from tests.bench.proc_cpu import cpu_seconds, process_tree

__all__ = [
    "CpuReaders",
    "NoisyLoad",
    "allowed_cpus",
    "cpu_limit",
    "host_busy",
    "in_cgroup",
    "on_core",
    "own_cpu",
    "remove_cgroup",
    "with_reaped",
]

CpuReaders = dict[str, Callable[[], float]]
_TICK = os.sysconf("SC_CLK_TCK")


def own_cpu() -> float:
    """This process's CPU seconds, every thread (the steady load's generator and reader)."""
    used = resource.getrusage(resource.RUSAGE_SELF)
    return used.ru_utime + used.ru_stime


def with_reaped(pid: int) -> float:
    """CPU seconds of `pid`'s tree, plus what its children that exited used (a supervisor's
    crashed workers, counted in its cutime and cstime once it reaps them)."""
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except OSError:
        return 0.0
    reaped = (int(fields[13]) + int(fields[14])) / _TICK
    return cpu_seconds(process_tree(pid)) + reaped


def host_busy() -> tuple[float, float]:
    """(busy, all) CPU seconds of the whole host since boot, from /proc/stat (busy: neither
    idle nor waiting for I/O; steal counts as busy: those cores were not ours)."""
    values = [int(v) for v in Path("/proc/stat").read_text().split("\n", 1)[0].split()[1:]]
    everything = sum(values[:8])
    return (everything - values[3] - values[4]) / _TICK, everything / _TICK


@contextmanager
def on_core(core: int | None) -> Iterator[None]:
    """Processes started inside run on `core` only, as under `taskset -c CORE`: they inherit the
    affinity of the thread that starts them (Linux keeps it per thread, so this thread's alone
    is changed, and restored after). None: no pinning."""
    if core is None:
        yield
        return
    before = os.sched_getaffinity(0)
    os.sched_setaffinity(0, {core})
    try:
        yield
    finally:
        os.sched_setaffinity(0, before)


_CPU_CGROUPS = Path("/sys/fs/cgroup/cpu")
QUOTA_PERIOD_MS = float(os.environ.get("TIDEGATE_BENCH_POOLS_QUOTA_PERIOD_MS", "100") or 100)
"""The CFS period of `TIDEGATE_BENCH_POOLS_QUOTA`'s limits, in milliseconds (Kubernetes' default
is 100 ms; a shorter one cuts a limited pool's bursts into shorter slices)."""


@contextmanager
def in_cgroup(name: str | None, cores: float, period_ms: float = QUOTA_PERIOD_MS) -> Iterator[None]:
    """Processes started inside run in the cgroup-v1 CPU group `name`, limited to `cores` CPUs by
    CFS bandwidth control, as a Kubernetes CPU limit limits a pod: `cores` times `period_ms` of
    CPU time in each period of `period_ms` (the kubelet's `cpuCFSQuotaPeriod`, 100 ms by
    default). The thread that starts them joins the group (its children inherit it) and goes
    back to its own after. None: no limit. Needs root and cgroup v1's `cpu` controller, as the
    project's machines have."""
    if name is None or cores <= 0:
        yield
        return
    home = _cpu_cgroup(Path("/proc/thread-self/cgroup"))
    if home is None:
        raise RuntimeError("no cgroup-v1 cpu controller: TIDEGATE_BENCH_POOLS_QUOTA needs one")
    group = _CPU_CGROUPS / name
    group.mkdir(exist_ok=True)
    period_us = round(period_ms * 1000)
    # Lower the quota first: the kernel refuses a period whose quota would exceed the parent's.
    (group / "cpu.cfs_quota_us").write_text("-1")
    (group / "cpu.cfs_period_us").write_text(str(period_us))
    # The kernel's least quota is 1 ms a period.
    (group / "cpu.cfs_quota_us").write_text(str(max(1000, round(cores * period_us))))
    tid = str(threading.get_native_id())
    (group / "tasks").write_text(tid)
    try:
        yield
    finally:
        (home / "tasks").write_text(tid)


def remove_cgroup(name: str) -> None:
    """Remove a group `in_cgroup` made, once its processes are gone (kept if some are not)."""
    with suppress(OSError):
        (_CPU_CGROUPS / name).rmdir()


def _cpu_cgroup(listing: Path) -> Path | None:
    """The cgroup-v1 CPU group a `/proc/.../cgroup` file names, or None without that controller."""
    for line in listing.read_text().splitlines():
        _, controllers, path = line.split(":", 2)
        if "cpu" in controllers.split(","):
            return _CPU_CGROUPS / path.lstrip("/")
    return None


def cpu_limit(pids: list[int]) -> str:
    """The CPU limit of the groups the processes run in, e.g. "0.50" or "none"."""
    limits: set[str] = set()
    for pid in pids:
        with suppress(OSError, ValueError):
            group = _cpu_cgroup(Path(f"/proc/{pid}/cgroup"))
            if group is not None:
                quota = int((group / "cpu.cfs_quota_us").read_text())
                period = int((group / "cpu.cfs_period_us").read_text())
                limits.add("none" if quota < 0 else f"{quota / period:.2f}")
    return ",".join(sorted(limits)) or "-"


def allowed_cpus(pids: list[int]) -> str:
    """The CPUs any thread of the processes may run on, e.g. "1" or "0,1" ("-": none alive)."""
    found: set[int] = set()
    for pid in pids:
        for task in Path(f"/proc/{pid}/task").glob("[0-9]*"):
            with suppress(OSError):  # a thread or process that just exited
                found |= os.sched_getaffinity(int(task.name))
    return ",".join(str(c) for c in sorted(found)) or "-"


class NoisyLoad:
    """The parent's handle on one noisy load process (on `core` only, and in the CPU group
    `cgroup` limited to `cores`, if given)."""

    def __init__(
        self,
        model: str,
        rate: float,
        *,
        crash: bool,
        log: Path,
        core: int | None = None,
        cgroup: str | None = None,
        cores: float = 0.0,
    ) -> None:
        argv = [sys.executable, "-m", "tests.bench.pools_load", model, f"{rate:g}"]
        with log.open("ab") as err, on_core(core), in_cgroup(cgroup, cores):
            self.process = subprocess.Popen(
                [*argv, *(["--crash"] if crash else [])],
                stdin=subprocess.PIPE,
                stdout=subprocess.PIPE,
                stderr=err,
                text=True,
            )
        self._expect("ready", 60)

    @property
    def pid(self) -> int:
        return self.process.pid

    def _expect(self, word: str, timeout_s: float) -> str:
        out = self.process.stdout
        assert out is not None
        ready, _, _ = select.select([out], [], [], timeout_s)
        line = out.readline().strip() if ready else ""
        if not line.startswith(word):
            self.process.kill()
            raise RuntimeError(f"the noisy load said {line!r}, not {word!r} (log: stderr)")
        return line

    def _say(self, word: str) -> None:
        assert self.process.stdin is not None
        self.process.stdin.write(word + "\n")
        self.process.stdin.flush()

    def go(self) -> None:
        self._say("go")

    def stop(self) -> dict[str, Any]:
        """Stop it; its summary: sent, seconds, late_p99_ms (how late it began its sends)."""
        self._say("stop")
        summary: dict[str, Any] = json.loads(self._expect("{", 60))
        self.process.wait(30)
        return summary


def _main(argv: list[str]) -> int:
    from tests.bench.pools_crash import CRASH
    from tests.bench.pools_setup import PARTITIONS, record
    from tidegate.clients.loadgen import AvroWire, percentile
    from tidegate.core.kafka import make_producer
    from tidegate.core.pools import pool_topics
    from tidegate.core.settings import KafkaSettings, TopicSettings

    model, rate, crash = argv[0], float(argv[1]), "--crash" in argv[2:]
    wire = AvroWire(pool_topics(TopicSettings(), model))
    producer = make_producer(KafkaSettings())
    tag = f"noisy-{os.getpid()}-{int(time.time())}"

    def send(rec: dict[str, Any], key: str) -> None:
        while True:
            try:
                producer.produce(wire.source, key=key, value=wire.encode(rec))
                break
            except BufferError:  # the local queue is full: let deliveries drain it
                producer.poll(0.05)
        producer.poll(0)

    # Every partition's first message waits for the producer's id and sequence state: not in
    # the measured window. Unmarked, so that a crashing worker answers them.
    for i in range(16 * PARTITIONS):
        warm = record(model, i, f"{tag}-warm")
        send(warm, warm["request_id"])
    producer.flush(30)
    print("ready", flush=True)
    if sys.stdin.readline().strip() != "go":
        return 1
    stop = threading.Event()

    def until_stop() -> None:
        sys.stdin.readline()
        stop.set()

    threading.Thread(target=until_stop, daemon=True).start()
    first = CRASH if crash else 1.0
    late: list[float] = []
    cpu0, start = own_cpu(), time.monotonic()
    i = 0
    while not stop.is_set():
        due = start + i / rate
        delay = due - time.monotonic()
        if delay > 0 and stop.wait(delay):
            break
        late.append(max(0.0, time.monotonic() - due))
        rec = record(model, i, tag, first)
        send(rec, rec["routing_key"])
        i += 1
    elapsed = time.monotonic() - start
    producer.flush(30)
    summary = {
        "sent": i,
        "seconds": round(elapsed, 2),
        "late_p99_ms": round(percentile(late, 0.99) * 1000, 1),
        "cpu_s": round(own_cpu() - cpu0, 2),
    }
    print(json.dumps(summary), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(_main(sys.argv[1:]))
