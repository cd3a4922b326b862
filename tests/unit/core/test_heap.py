"""The collector of a server process, once its start-up is done (run in a child interpreter:
the test process keeps its own collector as it is)."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from tidegate.core.heap import YOUNG_THRESHOLD

_CHILD = """
import gc, json
from tidegate.core.heap import settle
before = gc.get_threshold()
built = [{"start-up": i} for i in range(1000)]
settle()
print(json.dumps({"before": before, "after": gc.get_threshold(), "frozen": gc.get_freeze_count()}))
"""


@pytest.mark.slow  # a fresh interpreter, in a subprocess
def test_settle_freezes_the_start_up_heap_and_collects_the_young_less_often() -> None:
    out = subprocess.run(
        [sys.executable, "-c", _CHILD], capture_output=True, text=True, check=True, timeout=60
    )
    seen = json.loads(out.stdout)
    assert seen["before"][0] == 700, "CPython's default, which the gateway paid per call"
    assert seen["after"] == [YOUNG_THRESHOLD, *seen["before"][1:]]
    assert seen["frozen"] >= 1000, "the start-up objects are in the permanent generation"
