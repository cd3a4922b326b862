"""Stopping a child for sure: one that ignores SIGTERM is killed, whether or not it leads a
session of its own (a benchmark's peers run in their parent's)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from tidegate.cli.procs import Child

pytestmark = pytest.mark.slow  # starts processes

_DEAF = (
    "import signal, time; signal.signal(signal.SIGTERM, signal.SIG_IGN);"
    " print('up', flush=True); time.sleep(60)"
)


@pytest.mark.parametrize("own_session", [True, False])
def test_a_child_deaf_to_sigterm_is_killed(tmp_path: Path, own_session: bool) -> None:
    process = subprocess.Popen(
        [sys.executable, "-c", _DEAF],
        stdout=subprocess.PIPE,
        start_new_session=own_session,
    )
    assert process.stdout is not None
    assert process.stdout.readline() == b"up\n"  # its handler is in place
    pidfile = tmp_path / "deaf.pid"
    pidfile.write_text(str(process.pid))
    Child("deaf", process, tmp_path / "deaf.log", pidfile).stop(timeout_s=0.2)
    assert process.returncode is not None
    assert not pidfile.exists()
