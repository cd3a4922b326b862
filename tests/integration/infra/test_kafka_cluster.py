"""The 3-node KRaft cluster of `make up KAFKA_NODES=3`, for real, and a broker dying under load.

The rest of the suite runs against the single-node stack, so this test starts a cluster of its
own with infra/stack.sh (Kafka only, a temp folder, free ports, small heaps) and always stops it.
An idempotent acks=all producer and a consumer group run while the broker leading every partition
of the test topic is SIGKILLed: every acknowledged message must be read back once, unchanged,
at its acknowledged offset; acknowledgements and consumption must go on without that broker; and
the broker, started again by `stack.sh up`, must rejoin the ISR of every partition.
"""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import tempfile
import threading
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

import pytest
from confluent_kafka import Consumer, KafkaError, Message, Producer
from confluent_kafka.admin import (  # type: ignore[attr-defined]
    AdminClient,
    ConfigResource,
    NewTopic,
    ResourceType,
)

from tests.support import alive, free_ports, unique, wait_for
from tidegate.core.kafka import consume_ready, make_admin, make_consumer, make_producer
from tidegate.core.settings import KafkaSettings, TopicSettings

REPO = Path(__file__).resolve().parents[3]
STACK = ["bash", str(REPO / "infra" / "stack.sh")]
NODES = (1, 2, 3)
# The broker that leads every partition of the test topic, and dies: node 1 is the one every
# client of the real stack bootstraps from (127.0.0.1:9092), the harshest node to lose.
VICTIM = 1
PARTITIONS = 3
# Messages per second the producer keeps up: load, yet little CPU on a 2-core machine.
RATE = 400


@dataclass
class Cluster:
    env: dict[str, str]
    var: Path
    ports: list[int]

    @property
    def settings(self) -> KafkaSettings:
        return KafkaSettings(
            bootstrap_servers=",".join(f"127.0.0.1:{p}" for p in self.ports),
            client_id="cluster-test",
        )

    def pid(self, node: int) -> int:
        return int((self.var / "run" / f"kafka-{node}.pid").read_text().split()[0])

    def stack(self, command: str, timeout: float = 120) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            [*STACK, command],
            env=self.env,
            capture_output=True,
            text=True,
            timeout=timeout,
            check=False,
        )


def broker_pids(var: Path) -> list[int]:
    """The live brokers of this cluster: their cwd is inside its folder, so none is another's."""
    found = []
    for pidfile in (var / "run").glob("kafka-*.pid"):
        pid = int(pidfile.read_text().split()[0])
        try:
            cwd = os.readlink(f"/proc/{pid}/cwd")
        except OSError:
            continue
        if alive(pid) and cwd.startswith(str(var)):
            found.append(pid)
    return found


@pytest.fixture
def cluster() -> Iterator[Cluster]:
    var = Path(tempfile.mkdtemp(prefix="tidegate-cluster-"))
    ports = free_ports(6)
    env = {
        **os.environ,
        "KAFKA_NODES": "3",
        "TIDEGATE_STACK_VAR": str(var),
        "TIDEGATE_STACK_SERVICES": "kafka",
        "TIDEGATE_STACK_KAFKA_PORTS": ",".join(map(str, ports[:3])),
        "TIDEGATE_STACK_CONTROLLER_PORTS": ",".join(map(str, ports[3:])),
        "TIDEGATE_STACK_KAFKA_HEAP": "256m",
        # C1 only: the JVMs boot in about half the time and CPU, and 400 messages a second need
        # no C2-compiled broker.
        "JAVA_TOOL_OPTIONS": f"{os.environ.get('JAVA_TOOL_OPTIONS', '')} -XX:TieredStopAtLevel=1",
        "TIDEGATE_STACK_STOP_TIMEOUT": "20",
        # A dead broker is fenced, and its partitions' leaders moved, after 4 s instead of 9 (a
        # heartbeat a second keeps the default's margin of missed beats); 3 offsets partitions
        # instead of 50 spare the small JVMs 141 replicas.
        "TIDEGATE_STACK_KAFKA_CONFIG": "broker.session.timeout.ms=4000\n"
        "broker.heartbeat.interval.ms=1000\noffsets.topic.num.partitions=3",
        # The stack's topics, with few partitions: they are checked, not loaded.
        "TIDEGATE_TOPICS_PARTITIONS": "2",
        "TIDEGATE_TOPICS_REPLY_PARTITIONS": "1",
        "TIDEGATE_TOPICS_DLQ_PARTITIONS": "1",
    }
    try:
        yield Cluster(env, var, ports[:3])
    finally:
        seen = set(broker_pids(var))
        try:
            subprocess.run([*STACK, "down"], env=env, capture_output=True, timeout=60, check=False)
        finally:
            # Whatever `down` managed, no JVM of this cluster outlives the test.
            for pid in seen | set(broker_pids(var)):
                if alive(pid):
                    os.kill(pid, signal.SIGKILL)
            shutil.rmtree(var, ignore_errors=True)


@dataclass
class Load:
    """An idempotent acks=all producer sending RATE messages a second from its own thread."""

    producer: Producer
    topic: str
    sent: dict[str, bytes] = field(default_factory=dict)
    # key: (partition, offset)
    acked: dict[str, tuple[int | None, int | None]] = field(default_factory=dict)
    failed: list[str] = field(default_factory=list)
    count: int = 0
    stop: threading.Event = field(default_factory=threading.Event)
    lock: threading.Lock = field(default_factory=threading.Lock)

    def _delivered(self, err: KafkaError | None, msg: Message) -> None:
        key = (msg.key() or b"").decode()
        with self.lock:
            if err is not None:
                self.failed.append(f"{key}: {err}")
            else:
                self.acked[key] = (msg.partition(), msg.offset())

    def run(self) -> None:
        step = 0.02
        while not self.stop.is_set():
            for _ in range(int(RATE * step)):
                key = f"m{self.count:07d}"
                value = f"{key}:{os.urandom(24).hex()}".encode()
                with self.lock:
                    self.sent[key] = value
                self.producer.produce(self.topic, value, key, on_delivery=self._delivered)
                self.count += 1
            self.producer.poll(0)
            self.stop.wait(step)  # paces the load; set() ends it at once

    def acked_after(self, index: int) -> int:
        """Acknowledged messages among those produced after the first `index`."""
        with self.lock:
            return sum(1 for key in self.acked if int(key[1:]) >= index)


@dataclass
class Reader:
    """A consumer group member reading the topic from its start in its own thread."""

    consumer: Consumer
    seen: dict[str, list[tuple[int | None, int | None, bytes]]] = field(default_factory=dict)
    stop: threading.Event = field(default_factory=threading.Event)
    lock: threading.Lock = field(default_factory=threading.Lock)

    def run(self) -> None:
        while not self.stop.is_set():
            for msg in consume_ready(self.consumer, 500, 0.2):
                if msg.error() is not None:
                    continue  # transient errors (a leader gone) are logged by librdkafka
                key = (msg.key() or b"").decode()
                with self.lock:
                    self.seen.setdefault(key, []).append(
                        (msg.partition(), msg.offset(), msg.value() or b"")
                    )

    def count_from(self, index: int) -> int:
        with self.lock:
            return sum(1 for key in self.seen if int(key[1:]) >= index)


def leaders_and_isrs(admin: AdminClient, topic: str) -> dict[int, tuple[int, list[int]]]:
    meta = admin.list_topics(topic, timeout=10).topics[topic]
    return {p.id: (p.leader, sorted(p.isrs)) for p in meta.partitions.values()}


def config(admin: AdminClient, kind: ResourceType, name: str) -> dict[str, str]:
    resource = ConfigResource(kind, name)
    entries = admin.describe_configs([resource], request_timeout=15)[resource].result()
    return {k: v.value for k, v in entries.items()}


# pytest-timeout counts the fixture's three-node start (120 s) too; the waits below add 350 s.
@pytest.mark.timeout(600)
def test_a_broker_killed_under_load_loses_no_acknowledged_message(cluster: Cluster) -> None:
    up = cluster.stack("up")
    assert up.returncode == 0, up.stdout + up.stderr
    assert "kafka: 3 nodes healthy" in up.stdout, up.stdout
    settings = cluster.settings
    # Quiet: its failures surface as exceptions, and it outlives the cluster until the test ends.
    admin = make_admin(settings, {"log_level": 0})
    assert sorted(admin.list_topics(timeout=10).brokers) == list(NODES)

    # What `make up KAFKA_NODES=3` promises: 3 replicas and min.insync.replicas=2 for the stack's
    # topics and for the internal ones (the brokers' defaults; the offsets topic is made on demand).
    requests = TopicSettings().requests
    assert {
        len(p.replicas) for p in admin.list_topics(requests).topics[requests].partitions.values()
    } == {3}
    assert config(admin, ResourceType.TOPIC, requests)["min.insync.replicas"] == "2"
    broker = config(admin, ResourceType.BROKER, "1")
    assert broker["offsets.topic.replication.factor"] == "3"
    assert broker["transaction.state.log.replication.factor"] == "3"
    assert broker["transaction.state.log.min.isr"] == "2"

    # Every partition led by VICTIM (first in each replica list), so one kill takes every leader.
    topic = unique("failover")
    others = [n for n in NODES if n != VICTIM]
    assignment = [[VICTIM, *(others if p % 2 else others[::-1])] for p in range(PARTITIONS)]
    admin.create_topics(
        [NewTopic(topic, num_partitions=PARTITIONS, replica_assignment=assignment)]
    )[topic].result(timeout=30)
    wait_for(
        lambda: all(
            leader == VICTIM and isr == list(NODES)
            for leader, isr in leaders_and_isrs(admin, topic).values()
        ),
        timeout=20,
        what=f"node {VICTIM} leading every partition of {topic} with all 3 in sync",
    )

    load = Load(make_producer(settings, {"log_level": 3}), topic)
    group = unique("failover-group")
    reader = Reader(make_consumer(settings, group, {"log_level": 3}))
    reader.consumer.subscribe([topic])
    threads = [threading.Thread(target=t.run, daemon=True) for t in (load, reader)]
    for thread in threads:
        thread.start()
    try:
        wait_for(lambda: len(load.acked) >= RATE, timeout=20, what="a second of acknowledgements")
        wait_for(lambda: reader.count_from(0) >= RATE // 2, timeout=20, what="the reader reading")

        victim_pid = cluster.pid(VICTIM)
        os.kill(victim_pid, signal.SIGKILL)
        wait_for(lambda: not alive(victim_pid), timeout=10, what=f"node {VICTIM} gone")
        killed_at = load.count

        # The controller fences the dead broker (broker.session.timeout.ms) and elects the
        # followers; the producer's retries land there: writes go on being acknowledged, and
        # read, with two brokers of three.
        wait_for(
            lambda: load.acked_after(killed_at) >= RATE,
            timeout=40,
            what="acknowledgements of messages produced after the kill",
        )
        moved = leaders_and_isrs(admin, topic)
        assert all(leader != VICTIM and VICTIM not in isr for leader, isr in moved.values()), moved
        wait_for(
            lambda: reader.count_from(killed_at) >= RATE,
            timeout=30,
            what="messages produced after the kill read back",
        )

        again = cluster.stack("up")
        assert again.returncode == 0, again.stdout + again.stderr
        assert f"kafka-{VICTIM}: starting" in again.stdout, again.stdout
        for node in others:
            assert f"kafka-{node}: already running (pid {cluster.pid(node)})" in again.stdout
        wait_for(
            lambda: all(isr == list(NODES) for _, isr in leaders_and_isrs(admin, topic).values()),
            timeout=60,
            interval=0.5,
            what=f"node {VICTIM} back in the ISR of every partition",
        )

        load.stop.set()
        threads[0].join(timeout=10)
        assert load.producer.flush(30) == 0, "messages still unacknowledged"
        assert load.failed == [], load.failed[:5]
        assert len(load.acked) == load.count > killed_at
        wait_for(
            lambda: len(reader.seen) >= len(load.acked),
            timeout=30,
            what="every acknowledged message read back",
        )
    finally:
        # Whatever failed, no client thread outlives the test to poll a cluster that is gone.
        load.stop.set()
        reader.stop.set()
        for thread in threads:
            thread.join(timeout=10)
    assert set(reader.seen) == set(load.acked)
    for key, (partition, offset) in load.acked.items():
        assert reader.seen[key] == [(partition, offset, load.sent[key])], key

    # The consumer group's offsets live in the internal offsets topic, itself on 3 replicas.
    reader.consumer.commit(asynchronous=False)
    reader.consumer.close()
    offsets = admin.list_topics("__consumer_offsets", timeout=10).topics["__consumer_offsets"]
    assert {len(p.replicas) for p in offsets.partitions.values()} == {3}
    assert config(admin, ResourceType.TOPIC, "__consumer_offsets")["min.insync.replicas"] == "2"
