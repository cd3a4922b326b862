"""`tidegate replay`'s options: what a new run may be asked, refused as usage errors (exit 2)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import typer
from typer.testing import CliRunner

from tidegate.cli import app
from tidegate.cli.replay_commands import select
from tidegate.core.settings import TopicSettings
from tidegate.dlq.replay_settings import ReplaySettings

TOPICS = TopicSettings()


def chosen(**options: Any) -> Any:
    defaults: dict[str, Any] = {
        "from_": None,
        "to": None,
        "offsets": None,
        "request_ids": [],
        "ids_file": None,
        "dlq": False,
        "model": None,
        "version": None,
        "to_topic": None,
        "live": False,
        "topics": TOPICS,
        "settings": ReplaySettings(),
    }
    return select(**{**defaults, **options})


@pytest.mark.parametrize(
    ("options", "why"),
    [
        ({}, "say what to replay"),
        ({"offsets": "0:1-2", "from_": "-1h"}, "not both"),
        ({"from_": "-1h", "version": "2"}, "give --model too"),
        ({"from_": "-1h", "to": "-2h"}, "before --from"),
        ({"from_": "yesterday"}, "ISO-8601"),
        ({"offsets": "0:9-1"}, "ends before"),
        ({"from_": "-1h", "to_topic": "inference-results"}, "pass --live"),
        ({"from_": "-1h", "to_topic": "inference-requests", "live": True}, "cannot write"),
        ({"from_": "-1h", "to_topic": "inference-replies"}, "cannot write"),
        ({"from_": "-1h", "to_topic": "inference-failed-requests"}, "cannot write"),
        ({"from_": "-1h", "to_topic": "inference-retry-1"}, "cannot write"),
    ],
)
def test_bad_option_combinations_are_usage_errors(options: dict[str, Any], why: str) -> None:
    with pytest.raises(typer.BadParameter, match=why):
        chosen(**options)


def test_a_run_defaults_to_the_replay_topic_and_the_served_version(tmp_path: Path) -> None:
    ids = tmp_path / "ids.txt"
    ids.write_text("r2\n\nr3\nr1\n")
    selection = chosen(from_="2026-12-01T10:00:00Z", request_ids=["r1"], ids_file=ids)
    assert selection.target == "inference-results-replay"
    assert selection.version is None
    assert selection.request_ids == ("r1", "r2", "r3")
    assert selection.from_ms == 1_796_119_200_000
    assert selection.source == "requests"
    live = chosen(dlq=True, to_topic="inference-results", live=True, model="m", version="2")
    assert (live.source, live.target, live.version) == ("dlq", "inference-results", "2")


def test_the_command_refuses_before_touching_kafka(tmp_path: Path) -> None:
    result = CliRunner().invoke(
        app, ["replay", "--from", "-1h", "--to-topic", "inference-results"], env={"COLUMNS": "200"}
    )
    assert result.exit_code == 2
    assert "--live" in result.output
    missing = CliRunner().invoke(app, ["replay", "--resume", "nope", "--state-dir", str(tmp_path)])
    assert missing.exit_code == 1
    assert "no replay checkpoint" in missing.output
