"""The README's first command, `make demo`, run as a user would against the running stack."""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]


def test_make_demo_round_trips_requests() -> None:
    done = subprocess.run(
        ["make", "demo"],
        cwd=REPO,
        env={**os.environ, "COLUMNS": "200"},  # rich wraps tables at 80 columns without a tty
        capture_output=True,
        text=True,
        timeout=600,
        check=False,
    )
    out = done.stdout + done.stderr
    assert done.returncode == 0, out[-4000:]
    # the schema table and the round-trip summary both appear, and nothing was lost
    assert "inference-requests-value" in out
    assert "read back" in out
    lost_row = [line for line in out.splitlines() if "│" in line and "500" in line]
    assert lost_row, out[-2000:]
    assert lost_row[-1].split("│")[-2].strip() == "0"
