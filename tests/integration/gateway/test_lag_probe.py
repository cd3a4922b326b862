"""The lag readers outlive a Kafka outage, against a broker of the test's own.

librdkafka aborts a process whose admin requests time out across a broker restart (librdkafka
issues 4605 and 3663): a gateway died that way in a 15 s outage. The gateway's probe and the
controller's `GroupLag` now read offsets through a consumer that never joins the workers' group.
Here both run in a process of their own, every 50 ms (so dozens of reads time out while the
broker is away), the broker is SIGKILLed twice and started again: the process must live through
both, and both must read the lag again each time.
"""

from __future__ import annotations

import functools
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

from tests.integration.own_broker import Broker
from tests.support import wait_for
from tidegate.core.kafka import make_producer

PROBE = """
import asyncio, sys, time
from tidegate.core.settings import KafkaSettings
from tidegate.gateway.admission.admission_settings import AdmissionSettings
from tidegate.gateway.admission.lag_probe import LagProbe
from tidegate.lifecycle.control.group_lag import GroupLag

kafka = KafkaSettings(bootstrap_servers=sys.argv[1], client_id="lag-probe-test")


async def main() -> None:
    probe = LagProbe(
        kafka,
        "inference-requests",
        AdmissionSettings(probe_interval_s=0.05, worker_group="lag-probe-test"),
    )
    probe.start(lambda lag, committed: print("lag", lag, committed, time.time(), flush=True))
    # The controller's reader of the same lag, every 50 ms too.
    group = GroupLag(kafka, "lag-probe-test", "inference-requests", every_s=0.05)
    refresh = group.refresh

    def refreshed():
        lag = refresh()
        print("group", lag, time.time(), flush=True)
        return lag

    group.refresh = refreshed
    group.start()
    await asyncio.sleep(float(sys.argv[2]))
    await group.stop()
    probe.stop()


asyncio.run(main())
"""


class Lines:
    """The probe process's output, read on a thread: when it last read the lag."""

    def __init__(self, process: subprocess.Popen[str]) -> None:
        self.seen: list[str] = []
        self.last_lag = 0.0
        self.last_group = 0.0
        self._thread = threading.Thread(target=self._read, args=(process,), daemon=True)
        self._thread.start()

    def _read(self, process: subprocess.Popen[str]) -> None:
        assert process.stdout is not None
        for line in process.stdout:
            self.seen.append(line.rstrip())
            if line.startswith("lag "):
                self.last_lag = time.time()
            elif line.startswith("group "):
                self.last_group = time.time()

    def read_since(self, when: float) -> bool:
        """Both readers read the lag after `when`."""
        return min(self.last_lag, self.last_group) > when


def passed(since: float, seconds: float) -> bool:
    return time.time() - since > seconds


# The broker's start (180 s at most) and two outages (330 s each at most): more than the default.
@pytest.mark.timeout(1000)
def test_the_lag_probe_lives_through_broker_restarts(broker: Broker, tmp_path: Path) -> None:
    producer = make_producer(broker.settings)
    producer.produce("inference-requests", key=b"k", value=b"v")
    assert producer.flush(30) == 0
    process = subprocess.Popen(
        [sys.executable, "-c", PROBE, broker.settings.bootstrap_servers, "600"],
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )
    lines = Lines(process)
    try:
        wait_for(lambda: lines.read_since(0), timeout=60, what="the first probe")
        for outage in (1, 2):
            broker.kill()
            down = time.time()
            wait_for(
                lambda: any("could not be read" in line for line in lines.seen[-50:]),
                timeout=30,
                what="the probe to see the broker gone",
            )
            # The outage lasts 8 s, probes timing out (1 s each) all along: the abort came in
            # exactly this window.
            wait_for(functools.partial(passed, down, 8.0), timeout=20, what="an 8 s outage")
            assert process.poll() is None, "\n".join(lines.seen[-30:])
            broker.stack("up")
            back = time.time()
            wait_for(
                functools.partial(lines.read_since, back),
                timeout=90,
                what=f"the lag read again after outage {outage}",
            )
            assert process.poll() is None, "\n".join(lines.seen[-30:])
    finally:
        process.terminate()
        process.wait(timeout=20)
