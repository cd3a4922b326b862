"""`tidegate dlq ...` against the real Kafka and registry: the JSON views match what was
written, `show` finds a listed letter, and `redrive` prints its progress and summary and sends
every letter."""

from __future__ import annotations

import json
import time
from typing import Any

from typer.testing import CliRunner

from tests.integration.dlq.dlq_fixtures import DlqStack, read_all
from tidegate.cli import app
from tidegate.core.errors import ModelExecutionError


def env(stack: DlqStack) -> dict[str, str]:
    return {
        "TIDEGATE_TOPICS_REQUESTS": stack.topics.requests,
        "TIDEGATE_TOPICS_FAILED": stack.topics.failed,
        "TIDEGATE_TOPICS_POISON": stack.topics.poison,
        "TIDEGATE_TOPICS_RETRY_PREFIX": stack.topics.retry_prefix,
    }


def write(stack: DlqStack, count: int) -> None:
    now = int(time.time() * 1000)
    letters: list[tuple[dict[str, Any] | bytes, int]] = []
    for i in range(count):
        model = "fraud" if i % 3 else "minilm"
        envelope = stack.envelope(
            exc=ModelExecutionError("boom"),
            failed_at_ms=now - count + i,
            key=f"k{i}".encode(),
            value=stack.request_bytes(f"c{i:02d}", model),
            rid=f"c{i:02d}",
            model=model,
            offset=i,
        )
        letters.append((envelope, now - count + i))
    stack.produce_letters(stack.topics.failed, letters)


def test_list_show_stats_and_redrive(dlq_stack: DlqStack) -> None:
    write(dlq_stack, 30)
    runner = CliRunner()
    stats = runner.invoke(app, ["dlq", "stats", "--json"], env=env(dlq_stack))
    assert stats.exit_code == 0, stats.output
    view = json.loads(stats.stdout)
    assert view["count"] == 30
    assert {k: v["count"] for k, v in view["by_model"].items()} == {"fraud": 20, "minilm": 10}

    listed = runner.invoke(
        app, ["dlq", "list", "--model", "minilm", "--limit", "0", "--json"], env=env(dlq_stack)
    )
    assert listed.exit_code == 0, listed.output
    messages = json.loads(listed.stdout)["messages"]
    assert len(messages) == 10
    first = messages[0]
    position = f"{first['topic']}:{first['partition']}:{first['offset']}"
    shown = runner.invoke(app, ["dlq", "show", position, "--json"], env=env(dlq_stack))
    assert shown.exit_code == 0, shown.output
    assert json.loads(shown.stdout)["request"]["request_id"] == first["request_id"]
    table = runner.invoke(app, ["dlq", "stats"], env=env(dlq_stack))
    assert "by error code" in table.stdout
    assert "MODEL_ERROR" in table.stdout

    dry = runner.invoke(
        app, ["dlq", "redrive", "--dry-run", "--code", "MODEL_ERROR", "--json"], env=env(dlq_stack)
    )
    assert dry.exit_code == 0, dry.output
    assert json.loads(dry.stdout)["counts"]["would_redrive"] == 30

    done = runner.invoke(
        app, ["dlq", "redrive", "--rate", "1000", "--run-id", "cli-run"], env=env(dlq_stack)
    )
    assert done.exit_code == 0, done.output
    assert "redrive cli-run" in done.stderr  # the progress bar
    assert "redriven" in done.stdout
    assert "30" in done.stdout
    arrived = read_all(dlq_stack, dlq_stack.topics.requests, 30)
    assert len(arrived) == 30
    missing = runner.invoke(
        app, ["dlq", "show", f"{dlq_stack.topics.failed}:0:9999"], env=env(dlq_stack)
    )
    assert missing.exit_code == 1
