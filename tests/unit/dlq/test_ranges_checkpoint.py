"""The checkpoint a replay resumes from: it only ever points past acknowledged work."""

from __future__ import annotations

from pathlib import Path

import pytest

from tidegate.core.errors import ConfigurationError
from tidegate.dlq.ranges import PartitionRange, ReadPlan
from tidegate.dlq.replay_run import _Acks
from tidegate.dlq.replay_state import ReplayCheckpoint, Summary, checkpoint_path, new_run_id

PLAN = ReadPlan("requests", (PartitionRange(0, 0, 100), PartitionRange(1, 10, 20)))


def checkpoint() -> ReplayCheckpoint:
    return ReplayCheckpoint(new_run_id(), PLAN, "replays", version="2", model="fraud")


def test_a_partition_advances_only_past_chunks_whose_results_were_all_acked() -> None:
    cp = checkpoint()
    acks = _Acks(cp)
    first = acks.add(0, 32, 2, Summary(read=32, replayed=2, ok=2))
    second = acks.add(0, 64, 1, Summary(read=32, replayed=1, ok=1))
    second(None, None)  # the later chunk is acked first: nothing moves yet
    assert cp.position(0) == 0
    first(None, None)
    assert cp.position(0) == 0, "one result of the first chunk is still unacknowledged"
    first(None, None)
    assert cp.position(0) == 64
    assert (cp.summary.read, cp.summary.replayed, cp.summary.ok) == (64, 3, 3)
    # A chunk without results (all filtered) is done at once, behind nothing.
    acks.add(1, 20, 0, Summary(read=10, filtered=10))
    assert cp.position(1) == 20
    assert cp.summary.filtered == 10


def test_a_failed_delivery_stops_the_partition_where_it_was() -> None:
    cp = checkpoint()
    acks = _Acks(cp)
    ack = acks.add(0, 32, 1, Summary(read=32, replayed=1))
    ack("broker gone", None)
    assert acks.failure == "broker gone"
    assert cp.position(0) == 0
    assert cp.summary.read == 0


def test_the_checkpoint_file_round_trips_and_names_are_checked(tmp_path: Path) -> None:
    cp = checkpoint()
    cp.positions = {0: 40}
    cp.summary.errors["MODEL_ERROR"] = 2
    cp.summary.skipped["no served version"] = 1
    path = checkpoint_path(tmp_path, cp.run_id)
    cp.save(path)
    back = ReplayCheckpoint.load(path)
    assert back.to_json() == cp.to_json()
    assert (back.position(0), back.position(1)) == (40, 10)
    assert list(tmp_path.iterdir()) == [path], "no temporary file is left behind"
    with pytest.raises(ConfigurationError, match="not a replay run id"):
        checkpoint_path(tmp_path, "../etc")
    with pytest.raises(ConfigurationError, match="no replay checkpoint"):
        ReplayCheckpoint.load(tmp_path / "missing.json")
