"""Child processes of tidegate's own commands (workers, gateways) for the demo and benchmarks:
started with a log file and a PID file, stopped by that PID file only."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from collections.abc import Mapping
from contextlib import suppress
from dataclasses import dataclass
from pathlib import Path

import httpx

__all__ = ["Child", "spawn", "stop_recorded", "wait_http"]


@dataclass
class Child:
    name: str
    process: subprocess.Popen[bytes]
    log: Path
    pidfile: Path

    def stop(self, timeout_s: float = 20.0) -> None:
        if self.process.poll() is None:
            self.process.send_signal(signal.SIGTERM)
            try:
                self.process.wait(timeout_s)
            except subprocess.TimeoutExpired:
                # The whole session: a supervisor killed here leaves no child of its own behind.
                with suppress(ProcessLookupError):
                    os.killpg(self.process.pid, signal.SIGKILL)
                # A child started in its parent's session (a benchmark's peer) has no group of
                # its own to kill: it alone.
                if self.process.poll() is None:
                    self.process.kill()
                self.process.wait(5)
        self.pidfile.unlink(missing_ok=True)

    def tail(self, lines: int = 30) -> str:
        try:
            return "\n".join(self.log.read_text(errors="replace").splitlines()[-lines:])
        except OSError:
            return "(no log)"


def spawn(name: str, args: list[str], run_dir: Path, env: dict[str, str] | None = None) -> Child:
    """Start `tidegate ARGS...` in its own session, logging to RUN_DIR/NAME.log."""
    run_dir.mkdir(parents=True, exist_ok=True)
    log = run_dir / f"{name}.log"
    pidfile = run_dir / f"{name}.pid"
    with log.open("ab") as out:
        process = subprocess.Popen(  # noqa: S603 - our own CLI, arguments built by us
            [sys.executable, "-m", "tidegate.cli", *args],
            stdout=out,
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
            env={**os.environ, **(env or {})},
            start_new_session=True,
        )
    pidfile.write_text(str(process.pid))
    return Child(name, process, log, pidfile)


def stop_recorded(run_dir: Path, timeout_s: float = 20.0) -> list[str]:
    """Stop the processes whose PID files are in RUN_DIR, if they are still ours."""
    stopped = []
    for pidfile in sorted(run_dir.glob("*.pid")):
        try:
            pid = int(pidfile.read_text().strip())
            cmdline = Path(f"/proc/{pid}/cmdline").read_bytes()
        except (OSError, ValueError):
            pidfile.unlink(missing_ok=True)
            continue
        if b"tidegate.cli" not in cmdline:  # the PID was reused by someone else's process
            pidfile.unlink(missing_ok=True)
            continue
        os.kill(pid, signal.SIGTERM)
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline and Path(f"/proc/{pid}").exists():
            time.sleep(0.1)
        if Path(f"/proc/{pid}").exists():
            with suppress(ProcessLookupError):
                os.killpg(pid, signal.SIGKILL)  # its session: spawn started it in its own
        pidfile.unlink(missing_ok=True)
        stopped.append(pidfile.stem)
    return stopped


def wait_http(
    url: str, child: Child, timeout_s: float, headers: Mapping[str, str] | None = None
) -> None:
    """Poll URL (with `headers`, e.g. a key) until it answers 200, failing early (with the log)
    if the child dies."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if child.process.poll() is not None:
            raise RuntimeError(f"{child.name} exited ({child.process.returncode}):\n{child.tail()}")
        try:
            if httpx.get(url, timeout=2, headers=headers).status_code == 200:
                return
        except httpx.HTTPError:
            pass
        time.sleep(0.2)
    raise RuntimeError(f"{child.name} not ready at {url} after {timeout_s}s:\n{child.tail()}")
