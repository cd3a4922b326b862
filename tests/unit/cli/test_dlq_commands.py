"""`tidegate dlq ...` refuses bad input as usage errors (exit 2, naming the option) before it
connects to anything; the commands against the real Kafka are in
tests/integration/dlq/test_dlq_cli.py."""

from __future__ import annotations

import pytest
from typer.testing import CliRunner

from tidegate.cli import app

# Nothing listens here: a command that reached Kafka would not exit 2 at once.
ENV = {"TIDEGATE_KAFKA_BOOTSTRAP_SERVERS": "127.0.0.1:1"}


def test_the_dlq_commands_are_registered() -> None:
    result = CliRunner().invoke(app, ["dlq", "--help"], env=ENV)
    assert result.exit_code == 0
    for command in ("list", "show", "stats", "redrive"):
        assert command in result.output


@pytest.mark.parametrize(
    ("args", "option"),
    [
        (["dlq", "list", "--topic", "inference-results"], "--topic"),
        (["dlq", "list", "--since", "last tuesday"], "--since"),
        (["dlq", "stats", "--since", "-1m", "--until", "-1h"], "--since"),
        (["dlq", "show", "no-position"], "POSITION"),
        (["dlq", "show", "inference-results:0:1"], "POSITION"),
        (["dlq", "redrive", "--from", "inference-retry-1"], "--from"),
        (["dlq", "redrive", "--rate", "0"], "--rate"),
        (["dlq", "redrive", "--run-id", "has space"], "--run-id"),
        (["dlq", "redrive", "--resume"], "--run-id"),
        (["dlq", "redrive", "--limit", "0"], "--limit"),
    ],
)
def test_bad_input_is_a_usage_error_naming_the_option(args: list[str], option: str) -> None:
    result = CliRunner().invoke(app, args, env=ENV)
    assert result.exit_code == 2, result.output
    assert option in result.output
