"""`tidegate worker --processes 2` against the real Kafka, schema registry and PostgreSQL.

The supervisor runs as an operator starts it, `python -m tidegate.cli worker`, on the worker
tests' set-up (tests/integration/workers.py: unique topics of 4 partitions, a group and a database
schema per test, the tiny ONNX model promoted). Its children are found through /proc (their parent
is the supervisor, their command line names their slot), the group through the admin client.
"""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import time
import urllib.request
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest
from confluent_kafka import ConsumerGroupState
from confluent_kafka.admin import AdminClient

from tests.integration.workers import ROOT, Reader, Stack, publish, request
from tests.support import unique, wait_for
from tidegate.models.model_settings import ModelSettings


@dataclass
class Pool:
    process: subprocess.Popen[bytes]
    base: str
    log: Path

    def ids(self) -> set[str]:
        return {f"{self.base}-1", f"{self.base}-2"}

    def children(self) -> dict[str, int]:
        """The supervisor's live children, by worker id."""
        found = {}
        for proc in Path("/proc").iterdir():
            try:
                fields = (proc / "stat").read_text().rsplit(")", 1)[-1].split()
                argv = (proc / "cmdline").read_bytes().split(b"\0")
            except OSError:
                continue  # not a process, or gone meanwhile
            if fields[0] != "Z" and int(fields[1]) == self.process.pid and b"--worker-id" in argv:
                found[argv[argv.index(b"--worker-id") + 1].decode()] = int(proc.name)
        return found

    def tail(self) -> str:
        return "\n".join(self.log.read_text(errors="replace").splitlines()[-40:])


def consecutive_free_ports() -> int:
    """A port p such that nothing listens on p nor on p + 1 right now."""
    for _ in range(50):
        with socket.socket() as first, socket.socket() as second:
            first.bind(("127.0.0.1", 0))
            port = int(first.getsockname()[1])
            try:
                second.bind(("127.0.0.1", port + 1))
            except OSError:
                continue
            return port
    raise AssertionError("no two consecutive free ports")


@pytest.fixture
def start(stack: Stack, models: ModelSettings, tmp_path: Path) -> Iterator[Callable[..., Pool]]:
    started: list[Pool] = []

    def launch(*options: str) -> Pool:
        base = unique("pool")
        log = tmp_path / f"{base}.log"
        argv = [sys.executable, "-m", "tidegate.cli", "worker", "--processes", "2"]
        with log.open("wb") as out:
            process = subprocess.Popen(
                [*argv, "--worker-id", base, *options],
                # A killed child's successor joins as soon as the group forgets the dead member.
                env=stack.env(models, TIDEGATE_WORKER_SESSION_TIMEOUT_MS="6000"),
                cwd=ROOT,
                stdin=subprocess.DEVNULL,
                stdout=out,
                stderr=subprocess.STDOUT,
                start_new_session=True,  # its own process group: the clean-up kills it whole
            )
        started.append(Pool(process, base, log))
        return started[-1]

    yield launch
    for pool in started:
        if pool.process.poll() is None:
            os.killpg(pool.process.pid, signal.SIGKILL)
            pool.process.wait(10)


def members(admin: AdminClient, stack: Stack) -> dict[str, str]:
    """The group's members: member id to client id."""
    found = admin.describe_consumer_groups([stack.group])[stack.group].result(timeout=10)
    return {m.member_id: m.client_id for m in found.members}


def settled(admin: AdminClient, stack: Stack, pool: Pool, gone: frozenset[str]) -> bool:
    """The group is stable with both slots as members, each holding partitions (their consumers'
    client.id ends with the worker id), and none of the `gone` members is left in it. A killed
    child's member keeps its client.id and its partitions until its session times out, so a
    group that still holds it looks settled by client ids alone."""
    found = admin.describe_consumer_groups([stack.group])[stack.group].result(timeout=10)
    if any(m.member_id in gone for m in found.members):
        return False
    owners = {m.client_id for m in found.members if m.assignment.topic_partitions}
    slots = {i for i in pool.ids() if any(c.endswith(f"-{i}") for c in owners)}
    return found.state == ConsumerGroupState.STABLE and len(owners) == 2 and slots == pool.ids()


def wait_settled(
    admin: AdminClient, stack: Stack, pool: Pool, gone: frozenset[str] = frozenset()
) -> None:
    try:
        wait_for(
            lambda: settled(admin, stack, pool, gone), timeout=45, interval=0.5, what="2 members"
        )
    except AssertionError as exc:
        raise AssertionError(f"{exc}\n{pool.tail()}") from None


def served_by(stack: Stack, reader: Reader, prefix: str) -> set[str]:
    """Publish 40 requests over 16 keys (so over all 4 partitions) and return who answered them."""
    batch = [request(f"{prefix}-{i}", f"k{i % 16}") for i in range(40)]
    publish(stack, batch)
    wanted = {b["request_id"] for b in batch}
    wait_for(
        lambda: wanted <= {r["request_id"] for r, _ in reader.poll()},
        timeout=30,
        what=f"a result for each of the {prefix} requests",
    )
    return {r["worker_id"] for r, _ in reader.records if r["request_id"] in wanted}


def stop(pool: Pool) -> None:
    """SIGTERM the supervisor: it and both children are gone soon after, and it exits 0."""
    children = list(pool.children().values())
    assert len(children) == 2, pool.children()
    pool.process.send_signal(signal.SIGTERM)
    try:
        code = pool.process.wait(timeout=40)
    except subprocess.TimeoutExpired:
        raise AssertionError(f"the supervisor did not stop\n{pool.tail()}") from None
    assert code == 0, pool.tail()
    assert not any(Path(f"/proc/{pid}").exists() for pid in children)


def test_two_processes_share_the_group_and_stop_together_on_sigterm(
    admin: AdminClient, stack: Stack, start: Callable[..., Pool]
) -> None:
    port = consecutive_free_ports()
    pool = start("--metrics-port", str(port))
    reader = Reader(stack, stack.topics.results)
    try:
        wait_settled(admin, stack, pool)
        assert set(pool.children()) == pool.ids()
        assert served_by(stack, reader, "shared") == pool.ids(), "one process did all the work"
        for p in (port, port + 1):  # child k serves /metrics on the port + k - 1
            body = urllib.request.urlopen(f"http://127.0.0.1:{p}/metrics", timeout=5).read()
            assert b"tidegate_worker_requests_total" in body
        began = time.monotonic()
        stop(pool)
        assert time.monotonic() - began < 30
    finally:
        reader.close()


def test_a_killed_child_is_restarted_in_its_slot(
    admin: AdminClient, stack: Stack, start: Callable[..., Pool]
) -> None:
    pool = start("--metrics-port", "0")
    reader = Reader(stack, stack.topics.results)
    try:
        wait_settled(admin, stack, pool)
        before = pool.children()
        victim = before[f"{pool.base}-1"]
        dead = frozenset(
            m for m, c in members(admin, stack).items() if c.endswith(f"-{pool.base}-1")
        )
        assert len(dead) == 1, members(admin, stack)
        os.kill(victim, signal.SIGKILL)

        def replaced() -> dict[str, int] | None:
            now = pool.children()
            return now if now.get(f"{pool.base}-1") not in (None, victim) else None

        after = wait_for(replaced, timeout=15, what="a new process in slot 1")
        assert after[f"{pool.base}-2"] == before[f"{pool.base}-2"], "slot 2 was restarted too"
        assert "exited with signal SIGKILL" in pool.log.read_text()
        wait_settled(admin, stack, pool, gone=dead)
        assert served_by(stack, reader, "after") == pool.ids(), "the restarted slot does no work"
        stop(pool)
    finally:
        reader.close()
