"""The supervisor of `tidegate worker --processes N`: N child processes of one command each.

Children are started with subprocess (fork and exec at once), never forked to run a worker: a
worker holds librdkafka threads, and a fork copies none of them but all of their locks. The
supervisor forwards SIGTERM and SIGINT to every child, waits for them within a bound and kills
what is left; a child that exits while no signal came is restarted in its slot, with the same
command line (so the same worker id), after a growing delay, as gunicorn restarts its workers. It
sleeps on a wake-up socket that every signal writes to, SIGCHLD included, so it reacts to an exit
at once and does not poll. On Linux each child is SIGTERMed when the supervisor dies, even by
SIGKILL, so that none serves on unsupervised.
"""

from __future__ import annotations

import logging
import os
import select
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from contextlib import contextmanager, suppress
from dataclasses import dataclass, field

__all__ = ["Backoff", "Slot", "Supervisor", "worker_slots"]

_log = logging.getLogger(__name__)


@dataclass(frozen=True)
class Backoff:
    """Restart delays: `first_s`, doubling up to `max_s`; a child that stayed up `reset_after_s`
    counts as healthy, and its next restart waits `first_s` again."""

    first_s: float = 1.0
    max_s: float = 30.0
    reset_after_s: float = 60.0

    def after(self, previous_s: float, uptime_s: float) -> float:
        """The wait before restarting a slot whose child ran `uptime_s`; `previous_s` is the
        slot's last wait (0: it never restarted)."""
        if previous_s <= 0 or uptime_s >= self.reset_after_s:
            return self.first_s
        return min(previous_s * 2, self.max_s)


@dataclass(frozen=True)
class Slot:
    """One child: its name in the logs, its command line, and variables over the environment."""

    name: str
    argv: Sequence[str]
    env: Mapping[str, str] = field(default_factory=dict)


@dataclass
class _Running:
    slot: Slot
    process: subprocess.Popen[bytes] | None = None
    started: float = 0.0
    delay_s: float = 0.0
    due: float = 0.0  # when a slot whose child exited starts again


def worker_slots(
    count: int,
    *,
    base_id: str,
    metrics_port: int,
    options: Sequence[str],
    transactional_id: str | None = None,
) -> list[Slot]:
    """`tidegate worker --processes 1 OPTIONS` for k = 1..count, as worker `<base_id>-k` with
    /metrics on `metrics_port + k - 1` (0 stays 0). The id belongs to the slot, not the process:
    exactly-once derives the transactional.id from it, so a restarted slot fences its dead
    predecessor at once. An explicit transactional id gets the same `-k` suffix, since children
    sharing one would fence each other."""
    slots = []
    for k in range(1, count + 1):
        port = metrics_port + k - 1 if metrics_port else 0
        argv = [sys.executable, "-m", "tidegate.cli", "worker", "--processes", "1"]
        argv += ["--worker-id", f"{base_id}-{k}", "--metrics-port", str(port), *options]
        env = {"TIDEGATE_WORKER_TRANSACTIONAL_ID": f"{transactional_id}-{k}"}
        slots.append(Slot(f"worker {base_id}-{k}", argv, env if transactional_id else {}))
    return slots


def _describe(code: int) -> str:
    if code >= 0:
        return f"code {code}"
    try:
        return f"signal {signal.Signals(-code).name}"
    except ValueError:  # a real-time signal has no name of its own
        return f"signal {-code}"


def _die_with_parent() -> None:
    """In the child, before exec: SIGTERM when the supervisor dies, however it dies (SIGKILL
    included), so that no child serves on unsupervised (Linux's PR_SET_PDEATHSIG)."""
    import ctypes

    pr_set_pdeathsig = 1
    ctypes.CDLL(None, use_errno=True).prctl(pr_set_pdeathsig, signal.SIGTERM)


@contextmanager
def _wakeups(on_stop: Callable[[int], None]) -> Iterator[socket.socket]:
    """SIGTERM and SIGINT call `on_stop`; every one of them and SIGCHLD also write to the socket
    yielded, which the caller sleeps on. The previous handlers come back on exit."""
    reader, writer = socket.socketpair()
    reader.setblocking(False)
    writer.setblocking(False)
    caught = (signal.SIGTERM, signal.SIGINT, signal.SIGCHLD)
    previous = {sig: signal.getsignal(sig) for sig in caught}
    previous_fd = signal.set_wakeup_fd(writer.fileno(), warn_on_full_buffer=False)

    try:
        for sig in (signal.SIGTERM, signal.SIGINT):
            signal.signal(sig, lambda signum, _frame: on_stop(signum))
        # A Python handler, even one that does nothing, is what makes SIGCHLD reach the socket.
        signal.signal(signal.SIGCHLD, lambda _signum, _frame: None)
        yield reader
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, signal.SIG_DFL if handler is None else handler)
        signal.set_wakeup_fd(previous_fd)
        reader.close()
        writer.close()


class Supervisor:
    """Runs one child per slot until SIGTERM or SIGINT (`run`, from the main thread)."""

    def __init__(
        self, slots: Sequence[Slot], *, stop_timeout_s: float, backoff: Backoff | None = None
    ) -> None:
        self._slots = [_Running(slot) for slot in slots]
        self._stop_timeout_s = stop_timeout_s
        self._backoff = backoff or Backoff()
        self._signal: int | None = None

    def pids(self) -> list[int | None]:
        """Each slot's running child, None while it waits for a restart."""
        return [s.process.pid if s.process else None for s in self._slots]

    def run(self) -> int:
        """Start every slot, restart what dies, and on SIGTERM or SIGINT forward it and wait.
        Returns 0 when every child then stopped cleanly (code 0, or killed by that signal before
        it could install a handler), else 1."""
        with _wakeups(self._on_stop) as wake:
            try:
                for running in self._slots:
                    self._start(running)
                while self._signal is None:
                    self._sleep(wake)
                    self._reap()
                    self._restart_due()
                return self._shutdown(self._signal)
            finally:
                # Reached with children alive only if the supervisor itself failed.
                for running in self._slots:
                    if running.process is not None and running.process.poll() is None:
                        running.process.kill()
                        running.process.wait()

    def _on_stop(self, signum: int) -> None:
        if self._signal is None:
            self._signal = signum

    def _start(self, running: _Running) -> None:
        env = {**os.environ, **running.slot.env}
        running.process = subprocess.Popen(  # noqa: S603 - our own CLI, arguments built by us
            list(running.slot.argv),
            env=env,
            stdin=subprocess.DEVNULL,
            preexec_fn=_die_with_parent if sys.platform == "linux" else None,
        )
        running.started = time.monotonic()
        _log.info("started %s (pid %d)", running.slot.name, running.process.pid)

    def _sleep(self, wake: socket.socket) -> None:
        due = [s.due for s in self._slots if s.process is None]
        timeout = max(0.0, min(due) - time.monotonic()) if due else None
        select.select([wake], [], [], timeout)
        with suppress(BlockingIOError):  # woken by the timeout, not by a signal
            wake.recv(4096)

    def _reap(self) -> None:
        now = time.monotonic()
        for running in self._slots:
            if running.process is None or (code := running.process.poll()) is None:
                continue
            uptime = now - running.started
            running.delay_s = self._backoff.after(running.delay_s, uptime)
            running.due = now + running.delay_s
            _log.error(
                "%s (pid %d) exited with %s after %.1f s; restarting it in %.1f s",
                running.slot.name,
                running.process.pid,
                _describe(code),
                uptime,
                running.delay_s,
            )
            running.process = None

    def _restart_due(self) -> None:
        now = time.monotonic()
        for running in self._slots:
            if running.process is None and running.due <= now:
                self._start(running)

    def _shutdown(self, signum: int) -> int:
        live = [
            (s.slot, s.process)
            for s in self._slots
            if s.process is not None and s.process.poll() is None
        ]
        _log.info("%s: stopping %d processes", signal.Signals(signum).name, len(live))
        for _, process in live:
            process.send_signal(signum)
        deadline = time.monotonic() + self._stop_timeout_s
        clean = True
        for slot, process in live:
            try:
                code = process.wait(max(0.0, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                _log.error(
                    "%s still running %.0f s later: killing it", slot.name, self._stop_timeout_s
                )
                process.kill()
                process.wait()
                clean = False
                continue
            if code not in (0, -signum):
                _log.error("%s stopped with %s", slot.name, _describe(code))
                clean = False
        return 0 if clean else 1
