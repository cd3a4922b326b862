"""Kafka security settings: which combinations are refused, the librdkafka options derived from
each (SCRAM, mutual TLS, OAUTHBEARER through OIDC), that librdkafka itself takes them, and that no
secret leaks through a repr, a dump or a redacted dict."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import pytest
from confluent_kafka import KafkaException, Producer
from pydantic import ValidationError

from tests.tls_support import self_signed
from tidegate.core.kafka import (
    SECRET_OPTIONS,
    admin_config,
    connection_config,
    consumer_config,
    producer_config,
    redacted,
)
from tidegate.core.settings import KafkaSettings

ROOT = Path(__file__).resolve().parents[3]
SECRETS = ("scram-secret-1", "oidc-secret-2", "key-secret-3")
OIDC: dict[str, Any] = {
    "security_protocol": "SASL_SSL",
    "sasl_mechanism": "OAUTHBEARER",
    "sasl_oauthbearer_token_endpoint_url": "https://login.example.com/oauth2/token",
    "sasl_oauthbearer_client_id": "tidegate-worker",
    "sasl_oauthbearer_client_secret": SECRETS[1],
}


def scram(**extra: Any) -> KafkaSettings:
    return KafkaSettings(
        security_protocol="SASL_SSL",
        sasl_mechanism="SCRAM-SHA-512",
        sasl_username="tidegate",
        sasl_password=SECRETS[0],
        ssl_ca_location="/etc/kafka/ca.crt",
        **extra,
    )


def mtls(**extra: Any) -> KafkaSettings:
    return KafkaSettings(
        security_protocol="SSL",
        ssl_ca_location="/etc/kafka/ca.crt",
        ssl_certificate_location="/etc/kafka/client.crt",
        ssl_key_location="/etc/kafka/client.key",
        ssl_key_password=SECRETS[2],
        **extra,
    )


def test_plaintext_sets_no_security_options() -> None:
    conf = connection_config(KafkaSettings())
    assert conf["security.protocol"] == "PLAINTEXT"
    assert not [k for k in conf if k.startswith(("sasl.", "ssl."))]


def test_scram_over_tls_checks_the_broker_and_its_name() -> None:
    conf = connection_config(scram())
    assert conf["security.protocol"] == "SASL_SSL"
    assert conf["sasl.mechanism"] == "SCRAM-SHA-512"
    assert (conf["sasl.username"], conf["sasl.password"]) == ("tidegate", SECRETS[0])
    assert conf["ssl.ca.location"] == "/etc/kafka/ca.crt"
    assert conf["ssl.endpoint.identification.algorithm"] == "https"
    assert "ssl.certificate.location" not in conf
    assert not [k for k in conf if k.startswith("sasl.oauthbearer")]


def test_mutual_tls_gives_the_certificate_key_and_password() -> None:
    conf = connection_config(mtls())
    assert conf["security.protocol"] == "SSL"
    assert conf["ssl.certificate.location"] == "/etc/kafka/client.crt"
    assert conf["ssl.key.location"] == "/etc/kafka/client.key"
    assert conf["ssl.key.password"] == SECRETS[2]
    assert not [k for k in conf if k.startswith("sasl.")]
    relaxed = connection_config(mtls(ssl_endpoint_identification=False))
    assert relaxed["ssl.endpoint.identification.algorithm"] == "none"


def test_oauthbearer_uses_librdkafkas_own_oidc_flow() -> None:
    settings = KafkaSettings(
        **OIDC,
        sasl_oauthbearer_scope="kafka",
        sasl_oauthbearer_extensions={"logicalCluster": "lkc-1", "identityPoolId": "pool-2"},
    )
    conf = connection_config(settings)
    assert conf["sasl.mechanism"] == "OAUTHBEARER"
    assert conf["sasl.oauthbearer.method"] == "oidc"
    assert (
        conf["sasl.oauthbearer.token.endpoint.url"] == OIDC["sasl_oauthbearer_token_endpoint_url"]
    )
    assert conf["sasl.oauthbearer.client.id"] == "tidegate-worker"
    assert conf["sasl.oauthbearer.client.secret"] == SECRETS[1]
    assert conf["sasl.oauthbearer.scope"] == "kafka"
    assert conf["sasl.oauthbearer.extensions"] == "logicalCluster=lkc-1,identityPoolId=pool-2"
    assert "sasl.username" not in conf
    assert "sasl.password" not in conf


def test_oauthbearer_extensions_come_from_the_env_as_json(monkeypatch: pytest.MonkeyPatch) -> None:
    for key, value in OIDC.items():
        monkeypatch.setenv(f"TIDEGATE_KAFKA_{key.upper()}", value)
    monkeypatch.setenv("TIDEGATE_KAFKA_SASL_OAUTHBEARER_EXTENSIONS", '{"logicalCluster": "lkc-9"}')
    conf = connection_config(KafkaSettings())
    assert conf["sasl.oauthbearer.extensions"] == "logicalCluster=lkc-9"


@pytest.mark.parametrize(
    ("fields", "message"),
    [
        ({"security_protocol": "SASL_SSL"}, "needs sasl_mechanism"),
        ({"sasl_mechanism": "SCRAM-SHA-512"}, "needs a SASL security protocol"),
        (
            {
                "security_protocol": "SASL_SSL",
                "sasl_mechanism": "SCRAM-SHA-256",
                "sasl_username": "u",
            },
            "SCRAM-SHA-256 needs sasl_username and sasl_password",
        ),
        ({**OIDC, "sasl_oauthbearer_token_endpoint_url": None}, "token_endpoint_url"),
        ({**OIDC, "sasl_oauthbearer_client_secret": None}, "needs sasl_oauthbearer_client_secret"),
        ({**OIDC, "sasl_oauthbearer_token_endpoint_url": "login.example.com"}, "https://"),
        # The client secret would cross the network in clear.
        (
            {**OIDC, "sasl_oauthbearer_token_endpoint_url": "http://login.example.com/token"},
            "https://",
        ),
        ({**OIDC, "sasl_oauthbearer_extensions": {"a": "b,c"}}, "cannot hold"),
        (
            {
                "security_protocol": "SASL_SSL",
                "sasl_mechanism": "PLAIN",
                "sasl_username": "u",
                "sasl_password": "p",
                "sasl_oauthbearer_scope": "kafka",
            },
            "need sasl_mechanism OAUTHBEARER",
        ),
        ({"ssl_ca_location": "/ca.crt"}, "need security_protocol SSL or SASL_SSL"),
        (
            {
                "security_protocol": "SASL_PLAINTEXT",
                "sasl_mechanism": "PLAIN",
                "sasl_username": "u",
                "sasl_password": "p",
                "ssl_certificate_location": "/c.crt",
                "ssl_key_location": "/c.key",
            },
            "ssl_certificate_location, ssl_key_location need security_protocol SSL",
        ),
        ({"security_protocol": "SSL", "ssl_certificate_location": "/c.crt"}, "both"),
        ({"security_protocol": "SSL", "ssl_key_location": "/c.key"}, "both"),
        ({"security_protocol": "SSL", "ssl_key_password": "p"}, "needs ssl_key_location"),
    ],
)
def test_combinations_that_would_be_ignored_are_refused(
    fields: dict[str, Any], message: str
) -> None:
    with pytest.raises(ValidationError, match=re.escape(message)):
        KafkaSettings(**fields)


def test_every_client_role_carries_the_security() -> None:
    settings = scram()
    for conf in (producer_config(settings), consumer_config(settings, "g"), admin_config(settings)):
        assert conf["security.protocol"] == "SASL_SSL"
        assert conf["sasl.password"] == SECRETS[0]
        assert conf["ssl.ca.location"] == "/etc/kafka/ca.crt"


def test_no_secret_leaks_through_repr_dump_or_redacted() -> None:
    everything = [scram(), mtls(), KafkaSettings(**OIDC)]
    for settings in everything:
        shown = " ".join([repr(settings), str(settings), settings.model_dump_json()])
        conf = producer_config(settings)
        safe = repr(redacted(conf))
        for secret in SECRETS:
            assert secret not in shown
            assert secret not in safe
        held = {k for k, v in conf.items() if v in SECRETS}
        assert held, "the dict librdkafka gets must hold the secrets"
        assert held <= SECRET_OPTIONS, "a secret option is missing from SECRET_OPTIONS"
        assert redacted(conf).keys() == conf.keys()


def test_a_refused_combination_does_not_print_its_secrets() -> None:
    with pytest.raises(ValidationError) as refused:
        KafkaSettings(sasl_password=SECRETS[0], ssl_key_password=SECRETS[2])
    assert not [secret for secret in SECRETS if secret in str(refused.value)]


def client_settings(cert: Path, key: Path, password: str) -> KafkaSettings:
    # Port 1: nothing answers, and nothing needs to: librdkafka loads the files when it starts.
    return KafkaSettings(
        bootstrap_servers="127.0.0.1:1",
        security_protocol="SSL",
        ssl_ca_location=str(cert),
        ssl_certificate_location=str(cert),
        ssl_key_location=str(key),
        ssl_key_password=password,
    )


def test_librdkafka_loads_the_client_key_with_its_password(tmp_path: Path) -> None:
    cert, key = self_signed(tmp_path, SECRETS[2].encode())
    Producer(producer_config(client_settings(cert, key, SECRETS[2]))).flush(0)
    with pytest.raises(KafkaException, match=r"ssl\.key"):
        Producer(producer_config(client_settings(cert, key, "not-the-password")))


def test_librdkafka_takes_the_oidc_options() -> None:
    # librdkafka refuses unknown or incomplete OIDC options when the client is made.
    settings = KafkaSettings(
        **{**OIDC, "sasl_oauthbearer_token_endpoint_url": "http://127.0.0.1:1/token"},
        bootstrap_servers="127.0.0.1:1",
        sasl_oauthbearer_scope="kafka",
        sasl_oauthbearer_extensions={"logicalCluster": "lkc-1"},
    )
    Producer(producer_config(settings)).flush(0)
    incomplete = {**producer_config(settings)}
    del incomplete["sasl.oauthbearer.client.id"]
    with pytest.raises(KafkaException, match=r"client\.id"):
        Producer(incomplete)


CLIENT = re.compile(r"\b(Producer|Consumer|AdminClient|AIOKafkaProducer|AIOKafkaConsumer)\(")
PACKAGES = (
    *("agents", "cli", "clients", "core", "dlq", "examples"),
    *("gateway", "lifecycle", "models", "schemas"),
)


def test_every_kafka_client_is_made_from_connection_config() -> None:
    """No client and no librdkafka dict is written by hand: each would miss the security."""
    found = []
    for package in PACKAGES:
        for path in sorted((ROOT / package).rglob("*.py")):
            if path == ROOT / "core" / "kafka.py":
                continue
            text = path.read_text()
            if CLIENT.search(text) or '"bootstrap.servers"' in text:
                found.append(str(path.relative_to(ROOT)))
    assert found == [], "make clients with tidegate.core.kafka (make_producer, ...)"
