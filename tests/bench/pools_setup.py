"""The bulkhead part's set-up (`tests.bench.pools`): its two models, their pools, and the worker
processes of each pool, on the local stack's own topics.

* Models: `bench-steady` (a 4 -> 8 -> 2 net, as cheap as a model gets) and `bench-noisy` (a
  4 -> 1024 -> ... -> 2 net of `NOISY_LAYERS` 1024 x 1024 layers, one weight matrix reused,
  about 5 ms a row on one onnxruntime thread), written as packages under `RUN_DIR` and registered
  and promoted as `tidegate models register` / `promote` do (idempotent: a re-run finds them).
* Pools: `bench-steady` and `bench-noisy`, declared with `tidegate pools declare`, each model
  placed in its own. They stay declared and placed after the run; no other part uses them.
* Workers: `tidegate worker --pool P --processes 1`, as users run them, spawned like the other
  parts' workers (`tidegate.cli.procs`), and for the crash loop `tests.bench.pools_crash`.
"""

from __future__ import annotations

import asyncio
import hashlib
import os
import signal
import subprocess
import sys
import time
from contextlib import suppress
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from tests.bench.pools_crash import SIGNATURE
from tests.bench.pools_load import in_cgroup, on_core
from tidegate.cli.demo_lifecycle import wait_group_settled
from tidegate.cli.procs import Child, spawn, wait_http
from tidegate.core.pools import pool_group, pool_topics
from tidegate.core.settings import KafkaSettings, TopicSettings
from tidegate.models.manifest import Manifest
from tidegate.schemas.tensors import from_numpy

__all__ = [
    "NOISY",
    "PIN",
    "QUOTA",
    "RUN_DIR",
    "STEADY",
    "PoolWorker",
    "cgroup_of",
    "core_of",
    "prepare",
    "record",
    "skip_backlog",
    "stop_leftover_crash_loop",
    "version_of",
]

RUN_DIR = Path("var/bench/pools")
STEADY = "bench-steady"
NOISY = "bench-noisy"
"""Each name is both a model's and the pool it is placed in."""
PARTITIONS = 4
NOISY_WIDTH = 1024
NOISY_LAYERS = 80
ACTOR = "local:bench"
SHAPES = {STEADY: (8, 1), NOISY: (NOISY_WIDTH, NOISY_LAYERS)}
"""(width, hidden layers) of each model; its version is named after them, so a change of shape
registers a new version rather than clashing with the stored one."""
PIN = os.environ.get("TIDEGATE_BENCH_POOLS_PIN", "0") not in ("", "0")
"""Each pool's workers on a core of their own, as an operator would with `taskset` (off by
default, so that runs stay comparable with the unpinned ones)."""
CORES = {STEADY: 0, NOISY: 1}
QUOTA = float(os.environ.get("TIDEGATE_BENCH_POOLS_QUOTA", "0") or 0)
"""CPUs each pool's processes may use, as a Kubernetes CPU limit on each pool's Deployment sets
it (0: no limit, the default)."""


def cgroup_of(name: str) -> str | None:
    """The CPU group of the pool (or of another part's processes) under `QUOTA`, else None."""
    return f"tidegate-bench-{name}" if QUOTA > 0 else None


def core_of(pool: str) -> int | None:
    """The core the pool's processes are pinned to, or None without pinning."""
    return CORES[pool] if PIN else None


def version_of(model: str) -> str:
    width, layers = SHAPES[model]
    return f"w{width}-l{layers}"


def _onnx(width: int, layers: int) -> bytes:
    """softmax(tanh(... tanh(x @ W_in @ W) ... @ W) @ W_out): `layers` MatMuls share one W, so a
    slow model stays a small file."""
    from onnx import TensorProto, helper, numpy_helper

    rng = np.random.default_rng(7)
    weights = {
        "W_in": rng.normal(size=(4, width)) / 2,
        "W": rng.normal(size=(width, width)) / np.sqrt(width),
        "W_out": rng.normal(size=(width, 2)) / np.sqrt(width),
    }
    nodes = [helper.make_node("MatMul", ["features", "W_in"], ["h0"])]
    for i in range(layers):
        nodes.append(helper.make_node("MatMul", [f"h{i}", "W"], [f"m{i}"]))
        nodes.append(helper.make_node("Tanh", [f"m{i}"], [f"h{i + 1}"]))
    nodes.append(helper.make_node("MatMul", [f"h{layers}", "W_out"], ["logits"]))
    nodes.append(helper.make_node("Softmax", ["logits"], ["probabilities"], axis=1))
    graph = helper.make_graph(
        nodes,
        "bench",
        [helper.make_tensor_value_info("features", TensorProto.FLOAT, [None, 4])],
        [helper.make_tensor_value_info("probabilities", TensorProto.FLOAT, [None, 2])],
        [numpy_helper.from_array(w.astype(np.float32), n) for n, w in weights.items()],
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 9
    data: bytes = model.SerializeToString()
    return data


def _package(model: str) -> Path:
    """The model's package directory, written once."""
    path = RUN_DIR / "packages" / model / version_of(model)
    if (path / "manifest.json").exists():
        return path
    data = _onnx(*SHAPES[model])
    path.mkdir(parents=True, exist_ok=True)
    (path / "model.onnx").write_bytes(data)
    manifest = Manifest(
        name=model,
        version=version_of(model),
        runtime="onnx",
        entrypoint="model.onnx",
        files={"model.onnx": hashlib.sha256(data).hexdigest()},
        signature=SIGNATURE,
        task="classifier",
    )
    (path / "manifest.json").write_text(manifest.model_dump_json(exclude_none=True))
    return path


_PARTITIONS = ("--partitions", str(PARTITIONS))


def _declare(pool: str) -> None:
    """`tidegate pools declare POOL` as an operator runs it (existing topics are kept)."""
    done = subprocess.run(
        [sys.executable, "-m", "tidegate.cli", "pools", "declare", pool, *_PARTITIONS],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    if done.returncode != 0:
        raise RuntimeError(f"pools declare {pool} failed:\n{done.stdout}{done.stderr}")


def prepare() -> None:
    """Both pools declared, both models registered, promoted and placed in their pools. The
    controller must be running: its outbox relay is what brings the events to the workers."""
    from tidegate.lifecycle.operations.commands import LifecycleCommands
    from tidegate.lifecycle.operations.sessions import command_session

    for pool in (STEADY, NOISY):
        _declare(pool)
    packages = {model: _package(model) for model in (STEADY, NOISY)}

    async def go(c: LifecycleCommands) -> None:
        for model, path in packages.items():
            version = version_of(model)
            await c.register(path, actor=ACTOR)
            state = await c.status(model)
            if state.primary != version:
                await c.promote(model, version, actor=ACTOR, force=True)
            if state.pool != model:
                await c.place(model, model, actor=ACTOR, reason="bench part pools")

    async def session() -> None:
        async with command_session(write=True) as commands:
            await go(commands)

    asyncio.run(session())


def record(model: str, i: int, tag: str, first: float = 1.0) -> dict[str, Any]:
    """One request of 1 row; `first` is its first feature (`pools_crash.CRASH` kills)."""
    row = np.asarray([[first, 0.5 + (i % 7) / 10, -0.25, 1.0]], dtype=np.float32)
    return {
        "request_id": f"{tag}-{i}",
        "model": model,
        "routing_key": f"k-{i % 64}",
        "inputs": [from_numpy("features", row)],
    }


@dataclass
class PoolWorker:
    """A running pool worker: `tidegate worker --pool POOL --processes 1`, or with `crash` the
    crash loop (`tests.bench.pools_crash`: the worker supervisor over a worker whose model
    kills it)."""

    pool: str
    child: Child

    @property
    def pid(self) -> int:
        return self.child.process.pid

    @classmethod
    def start(cls, pool: str, *, crash: bool = False) -> PoolWorker:
        from tests.support import free_port

        worker_id = f"{pool}-{'crash' if crash else 'w1'}"
        port = 0
        # Pinned and limited from the start, threads and children included: the crash
        # supervisor's restarted workers inherit its core and its CPU group.
        with on_core(core_of(pool)), in_cgroup(cgroup_of(pool), QUOTA):
            if crash:
                child = _spawn_module(
                    "crash", "tests.bench.pools_crash", {"TIDEGATE_WORKER_POOL": pool}, worker_id
                )
            else:
                port = free_port()
                args = ["worker", "--pool", pool, "--processes", "1", "--worker-id", worker_id]
                child = spawn(pool, [*args, "--metrics-port", str(port)], RUN_DIR)
        found = cls(pool, child)
        try:
            if port:
                wait_http(f"http://127.0.0.1:{port}/metrics", child, 180)
            # Loaded, by its own report (the placement may reach it after it started), then in
            # its group.
            found.wait_loaded(worker_id)
            found.wait_settled()
        except BaseException:
            found.stop()  # not left serving when the caller never gets hold of it
            raise
        return found

    def wait_loaded(self, worker_id: str, timeout_s: float = 180.0) -> None:
        """Until the lifecycle says its pool's model is loaded on `worker_id`; early, with its
        log, if the process exits."""
        from tidegate.lifecycle.operations.sessions import command_session

        async def loaded() -> bool:
            async with command_session(write=False) as commands:
                found = (await commands.status(self.pool)).version(version_of(self.pool))
            return found is not None and worker_id in found.loaded_on

        deadline = time.monotonic() + timeout_s
        while not asyncio.run(loaded()):
            if self.child.process.poll() is not None:
                raise RuntimeError(f"{self.child.name} exited:\n{self.child.tail()}")
            if time.monotonic() > deadline:
                raise RuntimeError(f"{self.pool} not loaded on {worker_id}:\n{self.child.tail()}")
            time.sleep(0.5)

    def wait_settled(self) -> None:
        """Until the pool's group is stable with this one member holding its partitions: a
        worker loads its pool's models before it joins."""
        from tidegate.agents.worker_settings import WorkerSettings

        if self.child.process.poll() is not None:
            raise RuntimeError(f"{self.child.name} exited:\n{self.child.tail()}")
        wait_group_settled(pool_group(WorkerSettings().group_id, self.pool), members=1)

    def stop(self) -> None:
        self.child.stop(60)


def _spawn_module(name: str, module: str, env: dict[str, str], worker_id: str) -> Child:
    """`python -m MODULE` in its own session, logged and recorded like `procs.spawn`'s."""
    RUN_DIR.mkdir(parents=True, exist_ok=True)
    log, pidfile = RUN_DIR / f"{name}.log", RUN_DIR / f"{name}.pid"
    extra = {"TIDEGATE_WORKER_WORKER_ID": worker_id, "TIDEGATE_WORKER_METRICS_PORT": "0"}
    with log.open("ab") as out:
        process = subprocess.Popen(
            [sys.executable, "-m", module],
            stdout=out,
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
            env={**os.environ, **env, **extra},
            start_new_session=True,
        )
    pidfile.write_text(str(process.pid))
    return Child(name, process, log, pidfile)


def stop_leftover_crash_loop() -> None:
    """An interrupted run's crash supervisor (`procs.stop_recorded` stops only `tidegate.cli`
    processes): its session, if the pid is still that module's."""
    pidfile = RUN_DIR / "crash.pid"
    try:
        pid = int(pidfile.read_text().strip())
        cmdline = Path(f"/proc/{pid}/cmdline").read_bytes()
    except (OSError, ValueError):
        pidfile.unlink(missing_ok=True)
        return
    if b"tests.bench.pools_crash" in cmdline:
        with suppress(ProcessLookupError):
            os.killpg(pid, signal.SIGKILL)
    pidfile.unlink(missing_ok=True)


def skip_backlog(pool: str, timeout_s: float = 60.0) -> int:
    """Move the pool's group to the end of its requests topic, so that what an arm left queued is
    not served during the next one. The group must have no member (its workers stopped); until
    it has none the commit is refused, and is tried again. Returns the records skipped."""
    from confluent_kafka import ConsumerGroupTopicPartitions, TopicPartition

    from tidegate.agents.worker_settings import WorkerSettings
    from tidegate.core.kafka import make_admin, make_offset_reader

    group = pool_group(WorkerSettings().group_id, pool)
    topic = pool_topics(TopicSettings(), pool).requests
    reader = make_offset_reader(KafkaSettings(), group)
    try:
        parts = [TopicPartition(topic, p) for p in range(PARTITIONS)]
        committed = {tp.partition: tp.offset for tp in reader.committed(parts, timeout=10)}
        ends = [
            TopicPartition(topic, p, reader.get_watermark_offsets(tp, timeout=10)[1])
            for p, tp in enumerate(parts)
        ]
    finally:
        reader.close()
    skipped = sum(tp.offset - max(committed.get(tp.partition, 0), 0) for tp in ends)
    admin = make_admin(KafkaSettings())
    deadline = time.monotonic() + timeout_s
    while True:
        request = [ConsumerGroupTopicPartitions(group, ends)]
        try:
            admin.alter_consumer_group_offsets(request)[group].result(timeout=15)
            return skipped
        except Exception:
            if time.monotonic() > deadline:
                raise
            time.sleep(0.5)  # the stopped worker has not left the group yet
