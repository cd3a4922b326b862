"""`tidegate gateway` as a user runs it: supervised, so that a gateway process that dies is
started again and takes back its reply partition and the replies that came meanwhile; with
`--workers 2`, two processes on one port, each a replica leasing its own reply partition, both
answering calls through the port, and all of them gone soon after SIGTERM to the parent. A fake
worker answers on the test's own topics."""

from __future__ import annotations

import os
import signal
import socket
import time
from collections.abc import Sized
from pathlib import Path
from typing import TypeVar

import httpx
import redis

from tests.integration.fakes import FakeWorker
from tests.integration.gateway.gateway_fixtures import fraud_body, spawn_gateway, topic_env
from tests.support import alive, free_port, unique, wait_for
from tidegate.cli.procs import Child, spawn, wait_http
from tidegate.core.settings import RedisSettings, TopicSettings
from tidegate.gateway.roundtrip.lease import lease_key

_STOP_S = 30.0
T = TypeVar("T", bound=Sized)


def children(pid: int) -> set[int]:
    """Every process below `pid`: the supervised gateway, and its own workers."""
    try:
        direct = {int(c) for c in Path(f"/proc/{pid}/task/{pid}/children").read_text().split()}
    except OSError:
        return set()
    return direct.union(*(children(c) for c in direct))


def spawned(pids: set[int]) -> set[int]:
    """The worker processes among `pids`, not multiprocessing's resource tracker."""
    return {pid for pid in pids if b"spawn_main" in Path(f"/proc/{pid}/cmdline").read_bytes()}


def leases(client: redis.Redis, topics: TopicSettings) -> dict[int, str]:
    """Reply partition -> the replica that holds its lease."""
    held = {}
    for partition in range(topics.reply_partitions):
        owner = client.get(lease_key(topics.replies, partition))
        if isinstance(owner, bytes):
            held[partition] = owner.decode()
    return held


def two(found: T) -> T | None:
    return found if len(found) == 2 else None


def stop_within(child: Child, pids: set[int], timeout_s: float) -> float:
    """SIGTERM to the parent alone; how long until it and every process it started are gone."""
    started = time.monotonic()
    child.process.send_signal(signal.SIGTERM)
    wait_for(
        lambda: child.process.poll() is not None and all(not alive(pid) for pid in pids),
        timeout=timeout_s,
        what="the gateway and its workers to stop",
    )
    return time.monotonic() - started


def test_workers_share_the_port_each_on_its_own_reply_partition(
    topics: TopicSettings, lifecycle: None, worker: FakeWorker, tmp_path: Path
) -> None:
    port = free_port()
    env = {**topic_env(topics), "TIDEGATE_GATEWAY_PORT": str(port)}
    # Not about authentication (test_auth.py is): the workers run without it.
    child = spawn(
        "gateway", ["gateway", "--workers", "2", "--no-admin", "--insecure"], tmp_path, env
    )
    client = redis.Redis.from_url(RedisSettings().url)
    workers: set[int] = set()
    everyone: set[int] = set()
    try:
        wait_http(f"http://127.0.0.1:{port}/v2/health/ready", child, 120)
        workers = wait_for(
            lambda: two(spawned(children(child.process.pid))),
            timeout=60,
            what="two worker processes",
        )
        everyone = children(child.process.pid)
        held = wait_for(
            lambda: two(leases(client, topics)),
            timeout=60,
            what="both workers to lease a reply partition",
        )
        # Each worker is its own replica: the lease owner's name ends with its process id.
        assert {int(owner.rsplit("-", 1)[1]) for owner in held.values()} == workers
        assert socket.gethostname() in next(iter(held.values()))

        def both_serve() -> bool:
            # A fresh connection per call, so that either worker may accept it.
            resp = httpx.post(
                f"http://127.0.0.1:{port}/v2/models/fraud/infer",
                json=fraud_body(id=unique("mp")),
                timeout=30,
            )
            assert resp.status_code == 200, resp.text
            assert resp.json()["outputs"][0]["data"] == [6, 3, 22, 7]
            return {r["reply_to"]["partition"] for r in worker.seen} == set(held)

        wait_for(both_serve, timeout=60, interval=0, what="calls through the port to reach both")
        assert all(r["reply_to"]["topic"] == topics.replies for r in worker.seen)

        took = stop_within(child, everyone, _STOP_S)
        assert took < _STOP_S
        assert leases(client, topics) == {}, "each worker released its lease on the way out"
        log = child.log.read_text(errors="replace")
        assert "POST /v2/models/fraud/infer" not in log, "no access log unless asked"
    finally:
        child.stop()
        for pid in everyone:
            if alive(pid):  # the parent was killed before it could stop them
                os.kill(pid, signal.SIGKILL)
        client.close()


def test_a_gateway_process_that_dies_is_restarted_and_keeps_the_replies_it_missed(
    topics: TopicSettings, lifecycle: None, worker: FakeWorker, tmp_path: Path
) -> None:
    # Not about authentication: the caller is the same one before and after the restart.
    child, base = spawn_gateway(topics, tmp_path, "--no-admin", "--insecure")
    client = redis.Redis.from_url(RedisSettings().url)
    try:
        wait_http(f"{base}/v2/health/ready", child, 120)
        (served,) = children(child.process.pid)
        held = leases(client, topics)
        assert len(held) == 1
        request_id = unique("kept")
        accepted = httpx.post(
            f"{base}/v2/models/fraud/infer",
            json=fraud_body(id=request_id, parameters={"fake_delay_s": 1.0}),
            headers={"Prefer": "respond-async"},
            timeout=30,
        )
        assert accepted.status_code == 202, accepted.text
        os.kill(served, signal.SIGKILL)  # as a crash in librdkafka, or the OOM killer, would

        def restarted() -> int | None:
            now = children(child.process.pid) - {served}
            return next(iter(now)) if now else None

        again = wait_for(restarted, timeout=60, what="the supervisor to start the gateway again")
        wait_http(f"{base}/v2/health/ready", child, 120)
        ready_at = time.monotonic()
        assert worker.answered[request_id] < ready_at, "the reply came while nobody read it"
        assert leases(client, topics) == held, "the same replica took its own partition back"

        def fetched() -> httpx.Response | None:
            resp = httpx.get(f"{base}{accepted.headers['Location']}", timeout=10)
            assert resp.status_code in (200, 202), resp.text
            return resp if resp.status_code == 200 else None

        result = wait_for(fetched, timeout=30, what="the result, fetched after the restart")
        assert result.json()["outputs"][0]["data"] == [6, 3, 22, 7]
        assert child.process.poll() is None, "the supervisor is still up"
        assert "exited with signal SIGKILL" in child.log.read_text(errors="replace")
        assert alive(again)
    finally:
        child.stop()
        client.close()
