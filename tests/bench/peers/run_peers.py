"""Start and stop the benchmark peers, each as processes in one consumer group, on fresh topics.

* `json_topics(prefix)`: a fresh request and result topic (32 partitions, as inference-requests
  has), deleted when the block ends;
* `start_naive` / `start_quix` / `start_relay`: N processes of a peer in one group, returned once
  the group is stable with every member holding partitions;
* `json_fraud_record(i, tag)`: the JSON form of the fraud request tidegate's benchmark sends.

`python -m tests.bench.peers.run_peers` is a self-check against the local stack: the generator's
ceiling, then each peer at 500/s and 2000/s for 5 s, then a check that no peer process is left.
"""

from __future__ import annotations

import asyncio
import functools
import os
import shutil
import subprocess
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from tests.bench.peers.jsonload import JsonLoad, ceiling
from tests.bench.peers.venvs import quix_python
from tests.support import unique
from tidegate.cli.demo import fraud_body
from tidegate.cli.procs import Child
from tidegate.clients.loadgen import LoadResult
from tidegate.core.settings import KafkaSettings

__all__ = [
    "Peers",
    "fraud_model_path",
    "json_fraud_record",
    "json_topics",
    "start_naive",
    "start_quix",
    "start_relay",
]

REPO = Path(__file__).resolve().parents[3]
RUN_DIR = REPO / "var" / "bench" / "peers"
QUIX_APP = Path(__file__).with_name("quix_app.py")
# What names a peer process in `ps`: the self-check looks for leftovers by these.
MARKERS = ("tests.bench.peers.naive", "tests.bench.peers.jsonload", str(QUIX_APP))


@dataclass
class Peers:
    """The processes of one peer, all in consumer group `group`."""

    name: str
    group: str
    children: list[Child] = field(default_factory=list)
    scratch: list[Path] = field(default_factory=list)
    """Directories the processes write to, removed once they have stopped."""

    def stop(self) -> None:
        for child in self.children:
            child.stop()
        for path in self.scratch:
            shutil.rmtree(path, ignore_errors=True)

    def __enter__(self) -> Peers:
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()


def fraud_model_path() -> Path:
    """The fraud v1 ONNX graph in the local artifact store (`make models` builds it)."""
    from tidegate.models.model_settings import ModelSettings
    from tidegate.models.store import LocalArtifactStore

    package = asyncio.run(LocalArtifactStore(ModelSettings()).fetch("fraud", "1"))
    return package.path(package.manifest.entrypoint).resolve()


def json_fraud_record(i: int, tag: str) -> dict[str, Any]:
    """Request i of run `tag`: the 64 features tidegate's fraud requests carry, keyed by card."""
    return {
        "request_id": f"{tag}-fraud-{i}",
        "features": fraud_body(i)["inputs"][0]["data"],
        "key": f"card-{i % 64}",
    }


@contextmanager
def json_topics(prefix: str, partitions: int = 32) -> Iterator[tuple[str, str]]:
    """(source, sink): fresh topics for one peer's requests and results, deleted afterwards."""
    from confluent_kafka.admin import NewTopic  # type: ignore[attr-defined]

    from tidegate.core.kafka import make_admin

    admin = make_admin(KafkaSettings())
    topics = (unique(f"{prefix}-in"), unique(f"{prefix}-out"))
    for fut in admin.create_topics([NewTopic(t, partitions, 1) for t in topics]).values():
        fut.result(30)
    try:
        yield topics
    finally:
        for fut in admin.delete_topics(list(topics)).values():
            fut.result(30)


def start_naive(
    source: str,
    sink: str,
    *,
    n: int = 2,
    group: str | None = None,
    model: Path | None = None,
    timeout_s: float = 120.0,
) -> Peers:
    """N processes of the naive confluent-kafka loop (`tests.bench.peers.naive`) in one group."""
    group = group or unique("peer-naive")
    args = ["--bootstrap", KafkaSettings().bootstrap_servers, "--source", source, "--sink", sink]
    args += ["--group", group, "--model", str(model or fraud_model_path())]
    command = [sys.executable, "-m", "tests.bench.peers.naive", *args]
    return _start("naive", group, [command] * n, None, timeout_s)


def start_quix(
    source: str,
    sink: str,
    *,
    n: int = 2,
    group: str | None = None,
    model: Path | None = None,
    timeout_s: float = 180.0,
) -> Peers:
    """N processes of the quixstreams app, in its own venv (built on first use), in one group."""
    group = group or unique("peer-quix")
    python = quix_python(REPO / "var" / "bench" / "venvs" / "quix")
    args = ["--bootstrap", KafkaSettings().bootstrap_servers, "--source", source, "--sink", sink]
    args += ["--group", group, "--model", str(model or fraud_model_path())]
    states = [RUN_DIR / f"{group}-{k}-state" for k in range(1, n + 1)]
    commands = [[str(python), str(QUIX_APP), *args, "--state-dir", str(s)] for s in states]
    # Nothing of the project's environment may leak into the foreign venv's imports.
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "VIRTUAL_ENV")}
    return _start("quix", group, commands, env, timeout_s, scratch=states)


def start_relay(source: str, sink: str, *, n: int = 1, group: str | None = None) -> Peers:
    """The bare consume->produce relay that `jsonload.ceiling` measures the generator against."""
    group = group or unique("peer-relay")
    args = ["--bootstrap", KafkaSettings().bootstrap_servers, "--source", source, "--sink", sink]
    command = [sys.executable, "-m", "tests.bench.peers.jsonload", *args, "--group", group]
    return _start("relay", group, [command] * n, None, 60.0)


def _start(
    name: str,
    group: str,
    commands: list[list[str]],
    env: dict[str, str] | None,
    timeout_s: float,
    scratch: list[Path] | None = None,
) -> Peers:
    RUN_DIR.mkdir(parents=True, exist_ok=True)
    peers = Peers(name, group, scratch=scratch or [])
    try:
        for k, command in enumerate(commands, start=1):
            log = RUN_DIR / f"{group}-{k}.log"
            with log.open("ab") as out:
                process = subprocess.Popen(
                    command,
                    cwd=REPO,
                    stdout=out,
                    stderr=subprocess.STDOUT,
                    stdin=subprocess.DEVNULL,
                    env=env,
                )
            pidfile = RUN_DIR / f"{group}-{k}.pid"
            pidfile.write_text(str(process.pid))
            peers.children.append(Child(f"{name}-{k}", process, log, pidfile))
        _wait_settled(peers, timeout_s)
    except BaseException:
        peers.stop()
        raise
    return peers


def _wait_settled(peers: Peers, timeout_s: float) -> None:
    """Until the group is stable with every process holding partitions: measuring while processes
    that just joined rebalance times the rebalance, not the peer (as in tests.bench.pipeline).
    Fails early, with the log, when a process dies."""
    from confluent_kafka import ConsumerGroupState

    from tidegate.core.kafka import make_admin

    admin = make_admin(KafkaSettings())
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        for child in peers.children:
            if child.process.poll() is not None:
                code = child.process.returncode
                raise RuntimeError(f"{child.name} exited ({code}):\n{child.tail()}")
        found = admin.describe_consumer_groups([peers.group])[peers.group].result(timeout=10)
        owners = [m for m in found.members if m.assignment.topic_partitions]
        if found.state == ConsumerGroupState.STABLE and len(owners) == len(peers.children):
            return
        time.sleep(0.5)
    logs = "\n".join(f"--- {c.name}\n{c.tail(10)}" for c in peers.children)
    raise RuntimeError(f"group {peers.group} of {peers.name} did not settle:\n{logs}")


def _line(result: LoadResult, rate: float) -> str:
    return (
        f"  {result.label:<18} {rate:>7,.0f}/s  p50 {result.p(0.5):7.1f} ms  "
        f"p99 {result.p(0.99):7.1f} ms  batch {result.mean_batch:5.1f}  "
        f"ok {result.ok}/{result.sent}  lost {result.lost}  errors {result.errors}"
    )


def _strays() -> list[str]:
    listing = subprocess.run(
        ["ps", "-eo", "pid=,args="], capture_output=True, text=True, check=True, timeout=10
    ).stdout
    own = str(os.getpid())
    return [
        line.strip()
        for line in listing.splitlines()
        if any(m in line for m in MARKERS) and line.split(maxsplit=1)[0] != own
    ]


def main() -> int:
    print("peers: generator ceiling against a bare JSON relay")
    limit = ceiling(progress=lambda result, rate: print(_line(result, rate)))
    print(f"  ceiling {limit.rate:,.0f}/s; generator cores per step: " + ", ".join(
        f"{result.throughput:,.0f}/s {cores:.2f}" for result, cores in
        zip(limit.runs, limit.cores, strict=True)))  # fmt: skip
    starters = {"naive": start_naive, "quix": start_quix}
    for name, start in starters.items():
        print(f"peers: {name}, 2 processes in one group")
        with (
            json_topics(f"peers-{name}") as (source, sink),
            start(source, sink) as peers,
            JsonLoad(source, sink) as load,
        ):
            load.start(functools.partial(json_fraud_record, tag=unique("warm")))
            for rate in (500.0, 2000.0):
                make = functools.partial(json_fraud_record, tag=unique(f"{name}-{rate:g}"))
                result = load.run(name, make, rate=rate, count=int(rate * 5))
                print(_line(result, rate))
        alive = [c.name for c in peers.children if c.process.poll() is None]
        if alive:
            print(f"  still running after stop: {alive}")
            return 1
    strays = _strays()
    print("peers: processes left: " + ("; ".join(strays) if strays else "none"))
    return 1 if strays else 0


if __name__ == "__main__":
    sys.exit(main())
