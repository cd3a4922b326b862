"""The CLI's side of identities: `tidegate auth keys` arguments, and the named local identity
every operator command acts as (`--as`, TIDEGATE_CLI_ACTOR, the login name)."""

from __future__ import annotations

import getpass
from datetime import UTC, datetime, timedelta

import pytest
import typer
from typer.testing import CliRunner

from tidegate.cli import app
from tidegate.cli.auth_commands import parse_expiry, parse_grant
from tidegate.cli.lifecycle_session import ACTOR_ENV, actor
from tidegate.gateway.auth.identity import Grant

NOW = datetime(2026, 1, 1, tzinfo=UTC)


def test_grants_are_a_role_over_all_or_named_models() -> None:
    assert parse_grant("infer") == Grant("infer")
    assert parse_grant("deploy:fraud, minilm") == Grant("deploy", frozenset({"fraud", "minilm"}))
    for bad in ("root", "infer:", "infer:,"):
        with pytest.raises(typer.BadParameter):
            parse_grant(bad)


def test_expiry_is_a_duration_or_a_future_time() -> None:
    assert parse_expiry("30d", NOW) == NOW + timedelta(days=30)
    assert parse_expiry("90m", NOW) == NOW + timedelta(minutes=90)
    assert parse_expiry("2026-02-01T00:00:00", NOW) == datetime(2026, 2, 1, tzinfo=UTC)
    for bad in ("soon", "2025-01-01T00:00:00+00:00", "-5m"):
        with pytest.raises(typer.BadParameter):
            parse_expiry(bad, NOW)


def test_the_cli_acts_as_a_named_local_identity(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv(ACTOR_ENV, raising=False)
    monkeypatch.delenv("TIDEGATE_ACTOR", raising=False)
    assert actor() == f"local:{getpass.getuser()}"
    monkeypatch.setenv(ACTOR_ENV, "alice")
    assert actor() == "local:alice"
    monkeypatch.setenv(ACTOR_ENV, "local:bob")
    assert actor() == "local:bob"


def test_as_names_the_identity_for_the_command(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(ACTOR_ENV, "before")  # restored afterwards
    result = CliRunner().invoke(
        app, ["--as", "carol", "auth", "keys", "create", "x", "--role", "root"]
    )
    assert result.exit_code == 2  # the role is refused before anything is written
    assert actor() == "local:carol"
