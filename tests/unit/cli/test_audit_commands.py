"""`tidegate audit` without servers: usage errors name the option before anything connects, and
the filters and output formats reach the reader and the terminal (the real Kafka is in
tests/integration/clients/test_audit_trail.py)."""

from __future__ import annotations

import json
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from types import TracebackType
from typing import Any

import pytest
from typer.testing import CliRunner

from tidegate.cli import app, audit_commands
from tidegate.clients.audit import build_event
from tidegate.clients.audit_reader import AuditFilter, AuditUnavailableError

ENV = {"TIDEGATE_KAFKA_BOOTSTRAP_SERVERS": "127.0.0.1:1", "COLUMNS": "200"}
AT = datetime(2026, 12, 1, 15, 0, 0, 250000, tzinfo=UTC)


def test_the_audit_command_is_registered() -> None:
    result = CliRunner().invoke(app, ["audit", "--help"], env=ENV)
    assert result.exit_code == 0
    for option in ("--since", "--until", "--actor", "--action", "--outcome", "--json", "--follow"):
        assert option in result.output


@pytest.mark.parametrize(
    ("args", "option"),
    [
        (["audit", "--since", "last tuesday"], "--since"),
        (["audit", "--until", "soon"], "--until"),
        (["audit", "--since", "-1m", "--until", "-1h"], "--until"),
        (["audit", "--limit", "-1"], "--limit"),
    ],
)
def test_bad_input_is_a_usage_error_naming_the_option(args: list[str], option: str) -> None:
    result = CliRunner().invoke(app, args, env=ENV)
    assert result.exit_code == 2, result.output
    assert option in result.output


class FakeReader:
    """Stands in for AuditReader: remembers the filter and answers two entries."""

    asked: list[tuple[AuditFilter, int | None]] = []
    fail = False

    def __init__(self, *args: Any) -> None:
        self.skipped = 0

    def __enter__(self) -> FakeReader:
        return self

    def __exit__(
        self, et: type[BaseException] | None, e: BaseException | None, tb: TracebackType | None
    ) -> None:
        pass

    def read(self, where: AuditFilter, *, limit: int | None = None) -> list[dict[str, Any]]:
        if FakeReader.fail:
            raise AuditUnavailableError("kafka is down")
        FakeReader.asked.append((where, limit))
        return [
            build_event(
                "auth.failed",
                actor="anonymous",
                outcome="denied",
                service="gateway",
                source="10.0.0.9:4242",
                target="/admin/models",
                details={"reason": "no credentials"},
                at=AT,
            ),
            build_event("keys.create", actor="alice", outcome="success", service="cli", at=AT),
        ]

    def follow(
        self, where: AuditFilter, *, limit: int | None = None, stop: Any = None
    ) -> Iterator[dict[str, Any]]:
        FakeReader.asked.append((where, limit))
        yield from self.read(where, limit=limit)


@pytest.fixture
def reader(monkeypatch: pytest.MonkeyPatch) -> type[FakeReader]:
    FakeReader.asked = []
    FakeReader.fail = False
    monkeypatch.setattr(audit_commands, "AuditReader", FakeReader)
    return FakeReader


def test_filters_reach_the_reader_and_json_lines_come_out(reader: type[FakeReader]) -> None:
    result = CliRunner().invoke(
        app,
        [
            *("audit", "--json", "--since", "-1h", "--actor", "anonymous"),
            *("--action", "auth.", "--outcome", "denied", "--limit", "5"),
        ],
        env=ENV,
    )
    assert result.exit_code == 0, result.output
    ((where, limit),) = reader.asked
    assert (where.actor, where.action, where.outcome, limit) == ("anonymous", "auth.", "denied", 5)
    assert where.since is not None
    assert abs(datetime.now(UTC) - timedelta(hours=1) - where.since) < timedelta(minutes=1)
    first, second = (json.loads(line) for line in result.output.splitlines())
    assert first["at"] == "2026-12-01T15:00:00.250+00:00"
    assert (first["actor"], first["action"], first["outcome"]) == (
        "anonymous",
        "auth.failed",
        "denied",
    )
    assert (first["source"], first["details"]) == ("10.0.0.9:4242", {"reason": "no credentials"})
    assert second["service"] == "cli"


def test_the_table_shows_who_what_when_where_and_the_outcome(reader: type[FakeReader]) -> None:
    result = CliRunner().invoke(app, ["audit", "--limit", "0"], env=ENV)
    assert result.exit_code == 0, result.output
    assert reader.asked[0][1] is None, "--limit 0 reads everything"
    for text in ("anonymous", "auth.failed", "/admin/models", "denied", "10.0.0.9:4242"):
        assert text in result.output
    assert "2026-12-01T15:00:00.250" in result.output
    assert "reason=no credentials" in result.output


def test_an_unreachable_kafka_exits_1(reader: type[FakeReader]) -> None:
    reader.fail = True
    result = CliRunner().invoke(app, ["audit", "--json"], env=ENV)
    assert result.exit_code == 1
    assert json.loads(result.output)["code"] == "AUDIT_UNAVAILABLE"


def test_follow_prints_one_line_per_entry(reader: type[FakeReader]) -> None:
    result = CliRunner().invoke(app, ["audit", "--follow", "--action", "auth."], env=ENV)
    assert result.exit_code == 0, result.output
    first, second = result.output.splitlines()
    assert first.split()[:5] == [
        "2026-12-01T15:00:00.250+00:00",
        "anonymous",
        "auth.failed",
        "/admin/models",
        "denied",
    ]
    assert first.endswith("reason=no credentials")
    assert "keys.create" in second
