"""The supervisor of `tidegate worker --processes N`, with tiny Python children instead of workers.

The supervisor runs in the test's main thread, as in the CLI (signal handlers need it); a driver
thread waits for what the children write into a folder and signals this process, as an operator
or an orchestrator would signal the supervisor.
"""

from __future__ import annotations

import itertools
import os
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import typer
from typer.testing import CliRunner

from tests.support import wait_for
from tests.unit.cli.supervision import RecordedSupervisor
from tidegate.cli import serve_worker
from tidegate.cli.worker_pool import Backoff, Slot, Supervisor, worker_slots

# Supervises child processes.
pytestmark = pytest.mark.slow

# Writes PID.up, then on SIGTERM or SIGINT writes PID.stop (the signal's name) and exits 0.
SERVE = """
import os, pathlib, signal, sys
out = pathlib.Path(sys.argv[1])
def stop(signum, frame):
    (out / f"{os.getpid()}.stop").write_text(signal.Signals(signum).name)
    sys.exit(0)
signal.signal(signal.SIGTERM, stop)
signal.signal(signal.SIGINT, stop)
(out / f"{os.getpid()}.up").write_text(os.environ.get("SLOT", ""))
while True:
    signal.pause()
"""
# Appends the time it started, then fails.
CRASH = """
import pathlib, sys, time
with (pathlib.Path(sys.argv[1]) / "starts").open("a") as f:
    f.write(f"{time.time()}\\n")
sys.exit(3)
"""
# Ignores SIGTERM, as a worker stuck in its drain would.
STUBBORN = """
import os, pathlib, signal, sys, time
signal.signal(signal.SIGTERM, signal.SIG_IGN)
(pathlib.Path(sys.argv[1]) / f"{os.getpid()}.up").write_text("")
while True:
    time.sleep(1)
"""


def slot(script: str, out: Path, name: str = "child", **env: str) -> Slot:
    return Slot(name, [sys.executable, "-c", script, str(out)], env)


def supervise(supervisor: Supervisor, driver: Callable[[], None]) -> int:
    """Run the supervisor here while `driver` runs in a thread; a failing driver stops it."""
    errors: list[BaseException] = []

    def drive() -> None:
        try:
            driver()
        except BaseException as exc:
            errors.append(exc)
            os.kill(os.getpid(), signal.SIGTERM)

    thread = threading.Thread(target=drive, daemon=True)
    thread.start()
    code = supervisor.run()
    thread.join(10)
    if errors:
        raise errors[0]
    return code


def ups(out: Path, count: int) -> list[int]:
    found = sorted(int(p.stem) for p in out.glob("*.up"))
    return found if len(found) >= count else []


def alive(pid: int) -> bool:
    return Path(f"/proc/{pid}").exists()


@pytest.mark.parametrize("signum", [signal.SIGTERM, signal.SIGINT])
def test_a_signal_reaches_every_child_and_a_clean_stop_exits_0(
    tmp_path: Path, signum: signal.Signals
) -> None:
    before = {s: signal.getsignal(s) for s in (signal.SIGTERM, signal.SIGINT, signal.SIGCHLD)}
    supervisor = Supervisor(
        [slot(SERVE, tmp_path, SLOT=str(k)) for k in (1, 2, 3)], stop_timeout_s=10
    )
    pids: list[int] = []

    def driver() -> None:
        pids.extend(wait_for(lambda: ups(tmp_path, 3), timeout=20, what="3 children up"))
        os.kill(os.getpid(), signum)

    assert supervise(supervisor, driver) == 0
    assert sorted((tmp_path / f"{pid}.up").read_text() for pid in pids) == ["1", "2", "3"]
    assert {(tmp_path / f"{pid}.stop").read_text() for pid in pids} == {signum.name}
    assert not any(alive(pid) for pid in pids)
    assert {s: signal.getsignal(s) for s in before} == before, "handlers not restored"


@pytest.mark.skipif(sys.platform != "linux", reason="PR_SET_PDEATHSIG is Linux's")
def test_a_supervisor_killed_outright_takes_its_children_with_it(tmp_path: Path) -> None:
    # A supervisor of its own, in a process this test can SIGKILL.
    run = (
        "import sys; from tidegate.cli.worker_pool import Slot, Supervisor; "
        f"Supervisor([Slot('child', [sys.executable, '-c', {SERVE!r}, {str(tmp_path)!r}])], "
        "stop_timeout_s=10).run()"
    )
    parent = subprocess.Popen([sys.executable, "-c", run])
    try:
        (child,) = wait_for(lambda: ups(tmp_path, 1), timeout=20, what="the child up")
        parent.kill()
        parent.wait(10)
        wait_for(lambda: not alive(child), timeout=20, what="the orphaned child to stop")
        assert (tmp_path / f"{child}.stop").read_text() == "SIGTERM"
    finally:
        parent.kill()


def test_a_failing_child_is_restarted_in_its_slot_with_growing_delays(tmp_path: Path) -> None:
    backoff = Backoff(first_s=0.2, max_s=0.8, reset_after_s=60)
    supervisor = Supervisor(
        [slot(CRASH, tmp_path), slot(SERVE, tmp_path)], stop_timeout_s=10, backoff=backoff
    )
    starts = tmp_path / "starts"
    serving: list[int | None] = []

    def driver() -> None:
        wait_for(lambda: ups(tmp_path, 1), timeout=20, what="the serving child")
        serving.append(supervisor.pids()[1])
        wait_for(
            lambda: starts.exists() and len(starts.read_text().split()) >= 5,
            timeout=20,
            what="5 starts of the failing child",
        )
        # The 5th child fails on its own within 0.1 s of its start: the stop must come while the
        # slot waits for its restart (0.8 s), not while that child still runs.
        wait_for(
            lambda: supervisor.pids()[0] is None,
            timeout=20,
            interval=0.02,
            what="the failing slot waiting for its restart",
        )
        serving.append(supervisor.pids()[1])
        os.kill(os.getpid(), signal.SIGTERM)

    assert supervise(supervisor, driver) == 0, "a slot waiting for its restart is no failure"
    times = [float(t) for t in starts.read_text().split()][:5]
    gaps = [b - a for a, b in itertools.pairwise(times)]
    for gap, delay in zip(gaps, [0.2, 0.4, 0.8, 0.8], strict=True):
        assert delay <= gap < delay + 2.0, gaps
    assert serving[0] == serving[1], "the healthy slot was restarted too"


def test_a_killed_child_gets_a_new_process_in_its_slot(tmp_path: Path) -> None:
    supervisor = Supervisor(
        [slot(SERVE, tmp_path), slot(SERVE, tmp_path)],
        stop_timeout_s=10,
        backoff=Backoff(first_s=0.05),
    )
    seen: list[list[int | None]] = []

    def driver() -> None:
        wait_for(lambda: ups(tmp_path, 2), timeout=20, what="2 children up")
        seen.append(supervisor.pids())
        victim = seen[0][0]
        assert victim is not None
        os.kill(victim, signal.SIGKILL)
        wait_for(lambda: ups(tmp_path, 3), timeout=20, what="the slot's new child")
        seen.append(supervisor.pids())
        os.kill(os.getpid(), signal.SIGTERM)

    assert supervise(supervisor, driver) == 0
    (victim, kept), (new, still) = seen
    assert new not in (None, victim)
    assert still == kept, "the other slot's child was replaced too"
    assert not any(alive(pid) for pid in (victim, new, kept) if pid is not None)


def test_a_child_that_ignores_the_signal_is_killed_after_the_bound_and_the_exit_is_1(
    tmp_path: Path,
) -> None:
    supervisor = Supervisor([slot(STUBBORN, tmp_path), slot(SERVE, tmp_path)], stop_timeout_s=1)
    signalled: list[float] = []
    pids: list[int] = []

    def driver() -> None:
        pids.extend(wait_for(lambda: ups(tmp_path, 2), timeout=20, what="2 children up"))
        signalled.append(time.monotonic())
        os.kill(os.getpid(), signal.SIGTERM)

    assert supervise(supervisor, driver) == 1
    assert 1.0 <= time.monotonic() - signalled[0] < 5.0
    assert not any(alive(pid) for pid in pids)


def test_backoff_doubles_to_its_cap_and_starts_over_after_a_healthy_run() -> None:
    backoff = Backoff()  # 1 s doubling to 30 s, reset after 60 s up
    delays = [backoff.after(0.0, 0.1)]
    for _ in range(6):
        delays.append(backoff.after(delays[-1], 0.1))
    assert delays == [1, 2, 4, 8, 16, 30, 30]
    assert backoff.after(30.0, 59.9) == 30
    assert backoff.after(30.0, 60.0) == 1


def test_worker_slots_name_each_slot_and_give_it_its_own_metrics_port() -> None:
    slots = worker_slots(3, base_id="host-7", metrics_port=9100, options=["--group-id", "g"])
    assert [s.name for s in slots] == ["worker host-7-1", "worker host-7-2", "worker host-7-3"]
    first = list(slots[0].argv)
    assert first[:6] == [sys.executable, "-m", "tidegate.cli", "worker", "--processes", "1"]
    assert first[6:] == ["--worker-id", "host-7-1", "--metrics-port", "9100", "--group-id", "g"]
    assert [s.argv[s.argv.index("--metrics-port") + 1] for s in slots] == ["9100", "9101", "9102"]
    assert all(s.env == {} for s in slots)

    quiet = worker_slots(2, base_id="w", metrics_port=0, options=[], transactional_id="tx")
    assert [s.argv[s.argv.index("--metrics-port") + 1] for s in quiet] == ["0", "0"]
    assert [s.env for s in quiet] == [
        {"TIDEGATE_WORKER_TRANSACTIONAL_ID": "tx-1"},
        {"TIDEGATE_WORKER_TRANSACTIONAL_ID": "tx-2"},
    ]


class Recorder(RecordedSupervisor):
    """Stands in for the Supervisor (and the in-process worker) in `tidegate worker`."""

    def __init__(self, monkeypatch: pytest.MonkeyPatch) -> None:
        super().__init__()
        self.in_process: list[Any] = []
        monkeypatch.setattr(serve_worker, "Supervisor", self)
        monkeypatch.setattr(serve_worker, "configure_logging", lambda: None)
        monkeypatch.setattr("tidegate.agents.faust_app.run_worker", self.in_process.append)
        for name in [n for n in os.environ if n.startswith("TIDEGATE_WORKER_")]:
            monkeypatch.delenv(name)


def invoke(*args: str) -> Any:
    app = typer.Typer()
    app.command()(serve_worker.worker)
    return CliRunner().invoke(app, list(args))


def test_the_command_passes_its_options_to_each_child(monkeypatch: pytest.MonkeyPatch) -> None:
    recorder = Recorder(monkeypatch)
    monkeypatch.setenv("TIDEGATE_WORKER_DRAIN_TIMEOUT_S", "5")
    result = invoke(
        "--processes", "2", "--worker-id", "w", "--metrics-port", "9200", "--group-id", "g",
        "--max-batch-size", "8",
    )  # fmt: skip
    assert result.exit_code == 0, result.output
    assert recorder.in_process == []
    passed = ["--group-id", "g", "--max-batch-size", "8"]
    assert [list(s.argv[4:]) for s in recorder.slots] == [
        ["--processes", "1", "--worker-id", "w-1", "--metrics-port", "9200", *passed],
        ["--processes", "1", "--worker-id", "w-2", "--metrics-port", "9201", *passed],
    ]
    assert recorder.stop_timeout_s == 5 + serve_worker.STOP_MARGIN_S


def test_one_process_per_core_by_default_and_one_runs_in_process(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    recorder = Recorder(monkeypatch)
    assert serve_worker.default_processes() == len(os.sched_getaffinity(0))
    monkeypatch.setattr(serve_worker, "default_processes", lambda: 3)
    assert invoke().exit_code == 0
    assert len(recorder.slots) == 3
    assert recorder.in_process == []
    ids = [s.argv[s.argv.index("--worker-id") + 1] for s in recorder.slots]
    base = ids[0].removesuffix("-1")
    assert ids == [f"{base}-1", f"{base}-2", f"{base}-3"]
    assert [s.argv[s.argv.index("--metrics-port") + 1] for s in recorder.slots] == [
        "9100",
        "9101",
        "9102",
    ]

    recorder.slots = []
    assert invoke("--processes", "1", "--worker-id", "solo").exit_code == 0
    assert recorder.slots == []
    (config,) = recorder.in_process
    assert config.worker.worker_id == "solo"


def test_metrics_ports_past_65535_are_refused(monkeypatch: pytest.MonkeyPatch) -> None:
    recorder = Recorder(monkeypatch)
    result = invoke("--processes", "4", "--metrics-port", "65534")
    assert result.exit_code == 2
    assert "65535" in result.output
    assert recorder.slots == []
