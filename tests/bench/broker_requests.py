"""The Kafka broker's own count of requests by API, for requests per call in `make bench`.

The local stack's broker runs without a JMX port; `jcmd <pid> ManagementAgent.start` opens one
on the running JVM (loopback only, no restart), and `jmx/RequestCounts.java`, run as a
single-file Java program, reads `kafka.network:type=RequestMetrics,name=RequestsPerSec` for every
API. Two readings around a load step give the requests each call cost, by API.
"""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

from tests.support import free_port

__all__ = ["BrokerRequests", "broker_pid"]

_SOURCE = Path(__file__).parent / "jmx" / "RequestCounts.java"
_PID_FILE = Path("var/run/kafka.pid")
# The APIs that follow the load (exactly-once's transactions too); heartbeats and metadata are
# the group's and the controller's.
SHOWN = (
    "Produce",
    "Fetch",
    "OffsetCommit",
    "ListOffsets",
    "OffsetFetch",
    "Heartbeat",
    "AddPartitionsToTxn",
    "AddOffsetsToTxn",
    "TxnOffsetCommit",
    "EndTxn",
)


def broker_pid() -> int | None:
    """The local stack's broker process, from its PID file."""
    try:
        return int(_PID_FILE.read_text().split()[0])
    except (OSError, ValueError, IndexError):
        return None


class BrokerRequests:
    """`read()` gives the broker's request counts by API since it started; {} where the JDK
    tools (jcmd, java) or the broker are missing, so a bench still runs without them."""

    def __init__(self) -> None:
        self._port: int | None = None
        pid = broker_pid()
        if pid is None or shutil.which("jcmd") is None or shutil.which("java") is None:
            return
        port = free_port()
        started = subprocess.run(
            [
                "jcmd",
                str(pid),
                "ManagementAgent.start",
                f"jmxremote.port={port}",
                f"jmxremote.rmi.port={port}",
                "jmxremote.authenticate=false",
                "jmxremote.ssl=false",
                "jmxremote.host=127.0.0.1",
            ],
            capture_output=True,
            text=True,
            check=False,
        )
        if started.returncode == 0 and "successfully" in started.stdout:
            self._port = port
        else:  # already started by an earlier part of this run: find its port again
            self._port = _running_port(pid)

    def read(self) -> dict[str, int]:
        if self._port is None:
            return {}
        out = subprocess.run(
            ["java", str(_SOURCE), str(self._port)],
            capture_output=True,
            text=True,
            timeout=60,
            check=False,
        ).stdout
        counts: dict[str, int] = {}
        for line in out.splitlines():
            name, _, value = line.partition(" ")
            if value.strip().isdigit():
                counts[name] = int(value)
        return counts

    @staticmethod
    def per_call(before: dict[str, int], after: dict[str, int], calls: int) -> dict[str, float]:
        return {
            api: (after.get(api, 0) - before.get(api, 0)) / max(calls, 1)
            for api in SHOWN
            if after.get(api, 0) > before.get(api, 0)
        }


def _running_port(pid: int) -> int | None:
    status = subprocess.run(
        ["jcmd", str(pid), "ManagementAgent.status"], capture_output=True, text=True, check=False
    ).stdout
    for line in status.splitlines():
        key, _, value = line.strip().partition("=")
        if key.strip() == "com.sun.management.jmxremote.port" and value.strip().isdigit():
            return int(value.strip())
    return None
