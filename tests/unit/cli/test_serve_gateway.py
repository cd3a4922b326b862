"""`tidegate gateway`: a supervisor of one serving child by default, the server itself with
`--no-supervise` (the supervisor's own behaviour: test_worker_pool.py)."""

from __future__ import annotations

import os
import socket
import sys
from typing import Any

import pytest
import typer
from typer.testing import CliRunner

from tests.unit.cli.supervision import RecordedSupervisor
from tidegate.cli import serve_gateway


class Recorder(RecordedSupervisor):
    """Stands in for the Supervisor, and for the server of `--no-supervise`."""

    def __init__(self, monkeypatch: pytest.MonkeyPatch) -> None:
        super().__init__()
        self.served: list[dict[str, Any]] = []
        monkeypatch.setattr(serve_gateway, "Supervisor", self)
        monkeypatch.setattr(serve_gateway, "configure_logging", lambda: None)
        monkeypatch.setattr("tidegate.gateway.serving.serve", self.served.append)
        for name in [n for n in os.environ if n.startswith("TIDEGATE_GATEWAY_")]:
            monkeypatch.delenv(name)


def invoke(*args: str) -> Any:
    app = typer.Typer()
    app.command()(serve_gateway.gateway)
    return CliRunner().invoke(app, list(args))


def test_the_gateway_serves_from_a_supervised_child_that_keeps_its_name(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    recorder = Recorder(monkeypatch)
    result = invoke("--port", "9181", "--workers", "2", "--no-admin")
    assert result.exit_code == 0, result.output
    assert recorder.served == [], "the supervisor itself serves nothing"
    (slot,) = recorder.slots
    argv = list(slot.argv)
    assert argv[:5] == [sys.executable, "-m", "tidegate.cli", "gateway", "--no-supervise"]
    assert argv[5:] == ["--port", "9181", "--workers", "2", "--no-admin"]
    # The same name across restarts: a restarted child takes its own reply partition back.
    assert slot.env == {"TIDEGATE_GATEWAY_REPLICA_ID": f"{socket.gethostname()}-gateway-9181"}
    assert recorder.stop_timeout_s == 10 + serve_gateway.STOP_MARGIN_S

    monkeypatch.setenv("TIDEGATE_GATEWAY_REPLICA_ID", "edge-a")
    assert invoke().exit_code == 0
    assert recorder.slots[0].env == {"TIDEGATE_GATEWAY_REPLICA_ID": "edge-a"}


def test_no_supervise_serves_in_this_process(monkeypatch: pytest.MonkeyPatch) -> None:
    recorder = Recorder(monkeypatch)
    result = invoke("--no-supervise", "--port", "9182")
    assert result.exit_code == 0, result.output
    assert recorder.served == [{"port": 9182}]
    assert recorder.slots == []
