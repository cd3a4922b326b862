"""Settings validation and the librdkafka dicts derived from them."""

from __future__ import annotations

import pytest
from psycopg.conninfo import conninfo_to_dict
from pydantic import SecretStr, ValidationError

from tidegate.core.errors import ConfigurationError
from tidegate.core.kafka import consumer_config, producer_config
from tidegate.core.settings import (
    KafkaSettings,
    PostgresSettings,
    RedisSettings,
    RegistryServerSettings,
    SchemaRegistrySettings,
    TopicSettings,
)


def test_env_prefix_is_read(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("TIDEGATE_KAFKA_BOOTSTRAP_SERVERS", "a:1, b:2")
    monkeypatch.setenv("TIDEGATE_TOPICS_PARTITIONS", "8")
    monkeypatch.setenv("TIDEGATE_SCHEMA_REGISTRY_URL", "http://registry:8081/")
    assert KafkaSettings().bootstrap_servers == "a:1,b:2"
    assert TopicSettings().partitions == 8
    assert SchemaRegistrySettings().url == "http://registry:8081"


def test_unknown_fields_are_refused() -> None:
    with pytest.raises(ValidationError, match="extra"):
        KafkaSettings(bootstrap_server="typo:9092")  # type: ignore[call-arg]


@pytest.mark.parametrize("servers", ["", "no-port", "a:1,b"])
def test_bad_bootstrap_servers(servers: str) -> None:
    with pytest.raises(ValidationError, match="host:port"):
        KafkaSettings(bootstrap_servers=servers)


def test_sasl_needs_credentials() -> None:
    with pytest.raises(ValidationError, match="SASL"):
        KafkaSettings(security_protocol="SASL_SSL")
    ok = KafkaSettings(
        security_protocol="SASL_SSL",
        sasl_mechanism="PLAIN",
        sasl_username="u",
        sasl_password="hunter2-secret",
    )
    conf = producer_config(ok)
    assert conf["sasl.password"] == "hunter2-secret"
    assert "hunter2" not in repr(ok)  # SecretStr keeps it out of logs


def test_derived_librdkafka_dicts_are_safe_by_default() -> None:
    settings = KafkaSettings()
    prod = producer_config(settings, {"linger.ms": 5})
    assert prod["enable.idempotence"] is True
    assert prod["acks"] == "all"
    assert prod["linger.ms"] == 5
    cons = consumer_config(settings, "g")
    assert cons["enable.auto.commit"] is False
    assert cons["isolation.level"] == "read_committed"
    assert cons["group.id"] == "g"


@pytest.mark.parametrize(
    ("cls", "kwargs"),
    [
        (TopicSettings, {"partitions": 0}),
        (RegistryServerSettings, {"port": 70000}),
        (RegistryServerSettings, {"default_compatibility": "SIDEWAYS"}),
        (SchemaRegistrySettings, {"url": "ftp://x"}),
        (RedisSettings, {"url": "http://x"}),
        (PostgresSettings, {"port": 0}),
    ],
)
def test_invalid_values_are_refused(cls: type, kwargs: dict[str, object]) -> None:
    with pytest.raises(ValidationError):
        cls(**kwargs)


def test_registry_client_config_carries_basic_auth() -> None:
    conf = SchemaRegistrySettings(
        basic_auth_user="u",
        basic_auth_password="s3cret",
    ).client_config()
    assert conf["basic.auth.user.info"] == "u:s3cret"


def test_postgres_conninfo_has_the_secret_only_when_asked() -> None:
    settings = PostgresSettings(password=SecretStr("s3cret"))
    assert "password=s3cret" in settings.conninfo()
    assert "s3cret" not in str(settings.password)


def test_postgres_without_a_password_reaches_only_the_local_stack() -> None:
    assert "password=tidegate" in PostgresSettings().conninfo()
    with pytest.raises(ConfigurationError, match="TIDEGATE_POSTGRES_PASSWORD"):
        PostgresSettings(host="db.example.com").conninfo()


def test_postgres_values_are_quoted_not_formatted_in() -> None:
    """A password with spaces, quotes or `key=value` text stays one value: it cannot add or
    change a connection parameter (e.g. `sslmode`)."""
    tricky = "a b' sslmode=disable host=evil"
    settings = PostgresSettings(password=SecretStr(tricky), user="u@x")
    parsed = conninfo_to_dict(settings.conninfo())
    assert parsed["password"] == tricky
    assert parsed["host"] == "127.0.0.1"
    assert "sslmode" not in parsed
    assert parsed["options"] == "-c search_path=public"
    assert settings.url().startswith("postgresql+psycopg://u%40x:a%20b%27%20sslmode%3Ddisable")
