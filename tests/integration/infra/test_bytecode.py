"""`make bytecode` (run by `make setup`): with PYTHONDONTWRITEBYTECODE set, as on this project's
machines, a process starting a worker, a gateway or the controller loads every tidegate module
from bytecode instead of compiling its source again."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[3]
STARTS = (
    "import tidegate.cli, tidegate.cli.serve_worker, tidegate.agents.assembly, "
    "tidegate.gateway.serving, tidegate.lifecycle.control.process"
)


def test_every_module_a_process_starts_with_loads_from_bytecode() -> None:
    subprocess.run(["make", "-s", "bytecode"], cwd=REPO, check=True, timeout=300)
    env = {**os.environ, "PYTHONDONTWRITEBYTECODE": "1"}
    verbose = subprocess.run(
        [sys.executable, "-v", "-c", STARTS],
        cwd=REPO,
        env=env,
        capture_output=True,
        text=True,
        check=True,
        timeout=120,
    ).stderr
    loaded = [line for line in verbose.splitlines() if line.startswith("# code object from")]
    ours = [line for line in loaded if f"{REPO}/tidegate/" in line]
    assert len(ours) > 100, f"only {len(ours)} tidegate modules imported"
    compiled = [line for line in ours if not line.rstrip("'").endswith(".pyc")]
    assert compiled == [], f"{len(compiled)} compiled from source, e.g. {compiled[:3]}"
