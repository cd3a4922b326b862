"""A dead worker's partitions move to the survivor, with the real Kafka: two `tidegate worker`
processes share steady load, one is SIGKILLed, and the time until the survivor answers requests
of every partition the dead one held is measured from the results' own timestamps. It comes
before the old 10 s session could have expired, so the short session is in effect. Nothing is
lost: every request gets a result (at-least-once: a request the dead worker had consumed but not
committed is redone, and counted).

`tests/bench/takeover.py` runs the same kill, several times, for the old and the new settings,
and holds the new ones to the 3 s bar: a bar of speed, which a loaded machine may miss.
"""

from __future__ import annotations

import pytest

from tests.integration.agents.takeover_support import (
    CLASSIC_OLD,
    FAST,
    KIP848,
    kill_and_measure,
)
from tests.integration.workers import Stack
from tidegate.models.model_settings import ModelSettings

# The settings before decision 015: a takeover sooner than this is the new settings' doing.
OLD_SESSION_S = int(CLASSIC_OLD["TIDEGATE_WORKER_SESSION_TIMEOUT_MS"]) / 1000


@pytest.mark.parametrize("env", [FAST, KIP848], ids=["classic", "consumer"])
def test_a_killed_workers_partitions_move_before_the_old_session_ends_and_nothing_is_lost(
    stack: Stack, models: ModelSettings, env: dict[str, str]
) -> None:
    found = kill_and_measure(stack, models, env)
    (took,) = found.seconds
    print(
        f"takeover {took:.2f} s ({found.protocols}); {found.requests} requests, every one "
        f"answered, {found.duplicates} redone"
    )
    assert found.protocols == {env["TIDEGATE_WORKER_GROUP_PROTOCOL"]}
    assert took < OLD_SESSION_S, f"the survivor took over after {took:.2f} s"
