"""A registry on this host is reached with the local stack's credentials (`make up` writes them),
as the local PostgreSQL is with its password; a registry elsewhere needs its own."""

from __future__ import annotations

from pathlib import Path

import pytest

from tidegate.core.settings import SchemaRegistrySettings


@pytest.fixture
def stack_file(tmp_path: Path) -> Path:
    path = tmp_path / "client.env"
    path.write_text(
        "TIDEGATE_SCHEMA_REGISTRY_BASIC_AUTH_USER=k1d\n"
        "TIDEGATE_SCHEMA_REGISTRY_BASIC_AUTH_PASSWORD=s3cret\n"
    )
    return path


@pytest.fixture(autouse=True)
def no_credentials_in_env(monkeypatch: pytest.MonkeyPatch) -> None:
    for name in ("BASIC_AUTH_USER", "BASIC_AUTH_PASSWORD", "URL", "LOCAL_CREDENTIALS"):
        monkeypatch.delenv(f"TIDEGATE_SCHEMA_REGISTRY_{name}", raising=False)


def test_a_registry_on_this_host_gets_the_stacks_credentials(stack_file: Path) -> None:
    settings = SchemaRegistrySettings(url="http://127.0.0.1:8081", local_credentials=stack_file)
    assert settings.client_config()["basic.auth.user.info"] == "k1d:s3cret"
    assert "s3cret" not in repr(settings)


def test_a_registry_elsewhere_never_gets_the_stacks(
    stack_file: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    (tmp_path / "var" / "registry").mkdir(parents=True)
    stack_file.rename(tmp_path / "var" / "registry" / "client.env")
    monkeypatch.chdir(tmp_path)
    assert SchemaRegistrySettings().basic_auth_user == "k1d", "the default file, on this host"
    remote = SchemaRegistrySettings(url="https://sr.example.com")
    assert "basic.auth.user.info" not in remote.client_config()


def test_credentials_given_win_and_a_missing_file_means_none(
    stack_file: Path, tmp_path: Path
) -> None:
    given = SchemaRegistrySettings(
        url="http://localhost:8081",
        basic_auth_user="mine",
        basic_auth_password="pw",
        local_credentials=stack_file,
    )
    assert given.client_config()["basic.auth.user.info"] == "mine:pw"
    missing = SchemaRegistrySettings(local_credentials=tmp_path / "none.env")
    assert missing.basic_auth_user is None


def test_a_file_named_explicitly_is_read_for_a_registry_anywhere(stack_file: Path) -> None:
    compose = SchemaRegistrySettings(url="http://registry:8081", local_credentials=stack_file)
    assert compose.client_config()["basic.auth.user.info"] == "k1d:s3cret"
