"""Settings of the connections every component shares, one pydantic-settings class each.

Each component keeps its own settings class next to its code (`WorkerSettings` in
`tidegate.agents.worker_settings`, and so on), built with `settings_config` so that all of them
behave alike.

Every field is documented, secrets are `SecretStr`, and unknown fields are refused
(`extra="forbid"`). librdkafka configuration dicts are derived from these classes in
`tidegate.core.kafka`; nobody writes them by hand.
"""

from __future__ import annotations

import ipaddress
import os
import socket
from pathlib import Path
from typing import Literal
from urllib.parse import quote, urlsplit

from pydantic import Field, SecretStr, field_validator, model_validator
from pydantic_settings import BaseSettings, SettingsConfigDict

from tidegate.core.errors import ConfigurationError

__all__ = [
    "COMPATIBILITY_LEVELS",
    "CompatibilityLevel",
    "KafkaSettings",
    "PostgresSettings",
    "RedisSettings",
    "RegistryServerSettings",
    "SchemaRegistrySettings",
    "TopicSettings",
    "instance_id",
    "is_loopback",
    "read_env_file",
    "secure_url",
    "settings_config",
]

CompatibilityLevel = Literal[
    "NONE",
    "BACKWARD",
    "BACKWARD_TRANSITIVE",
    "FORWARD",
    "FORWARD_TRANSITIVE",
    "FULL",
    "FULL_TRANSITIVE",
]
COMPATIBILITY_LEVELS: tuple[str, ...] = CompatibilityLevel.__args__  # type: ignore[attr-defined]


def secure_url(value: str, name: str) -> str:
    """`value` as a URL a credential may travel to: https, or plain http to this host only (a
    test issuer, a local proxy). Anything else (http elsewhere, file:, ftp:) is refused."""
    parsed = urlsplit(value)
    loopback = parsed.hostname in ("127.0.0.1", "localhost", "::1")
    if parsed.scheme == "https" or (parsed.scheme == "http" and loopback):
        return value
    raise ValueError(f"{name} must be an https:// URL (http:// only to this host)")


def settings_config(prefix: str) -> SettingsConfigDict:
    return SettingsConfigDict(env_prefix=prefix, extra="forbid", validate_default=True)


_TLS_PROTOCOLS = ("SSL", "SASL_SSL")


class KafkaSettings(BaseSettings):
    """How to reach the Kafka cluster (env prefix `TIDEGATE_KAFKA_`).

    Authentication is one of: none, SASL PLAIN or SCRAM (user and password), SASL OAUTHBEARER
    through OIDC client credentials (librdkafka fetches and refreshes the token itself), or mutual
    TLS (a client certificate and key). TLS checks the broker's certificate against
    `ssl_ca_location` (or the system's CAs) and its host name. Combinations that would be silently
    ignored, such as a client certificate over PLAINTEXT, are refused here rather than discovered
    in production. docs/kafka-security.md shows each.
    """

    # A refused combination must not print the input it was given: it holds the secrets.
    model_config = SettingsConfigDict(
        **settings_config("TIDEGATE_KAFKA_"), hide_input_in_errors=True
    )

    bootstrap_servers: str = Field(
        "127.0.0.1:9092", description="Comma-separated host:port list of bootstrap brokers."
    )
    client_id: str = Field("tidegate", description="client.id reported to the brokers.")
    security_protocol: Literal["PLAINTEXT", "SSL", "SASL_PLAINTEXT", "SASL_SSL"] = Field(
        "PLAINTEXT", description="librdkafka security.protocol."
    )
    sasl_mechanism: Literal["PLAIN", "SCRAM-SHA-256", "SCRAM-SHA-512", "OAUTHBEARER"] | None = (
        Field(None, description="SASL mechanism, required with a SASL security protocol.")
    )
    sasl_username: str | None = Field(None, description="SASL user name (PLAIN, SCRAM).")
    sasl_password: SecretStr | None = Field(None, description="SASL password (PLAIN, SCRAM).")
    sasl_oauthbearer_token_endpoint_url: str | None = Field(
        None, description="OAUTHBEARER: the OIDC token endpoint (client-credentials grant)."
    )
    sasl_oauthbearer_client_id: str | None = Field(
        None, description="OAUTHBEARER: the OIDC client id."
    )
    sasl_oauthbearer_client_secret: SecretStr | None = Field(
        None, description="OAUTHBEARER: the OIDC client secret."
    )
    sasl_oauthbearer_scope: str | None = Field(
        None, description="OAUTHBEARER: scope(s) to request, space-separated, if the issuer needs."
    )
    sasl_oauthbearer_extensions: dict[str, str] = Field(
        default_factory=dict,
        description="OAUTHBEARER: SASL extensions sent with the token (JSON object in the env), "
        'e.g. Confluent Cloud\'s {"logicalCluster": "lkc-...", "identityPoolId": "pool-..."}.',
    )
    ssl_ca_location: str | None = Field(
        None, description="Path of the CA bundle for SSL (unset: the system's CAs)."
    )
    ssl_certificate_location: str | None = Field(
        None, description="Mutual TLS: path of the client certificate (PEM)."
    )
    ssl_key_location: str | None = Field(
        None, description="Mutual TLS: path of the client's private key (PEM)."
    )
    ssl_key_password: SecretStr | None = Field(
        None, description="Mutual TLS: password of an encrypted private key."
    )
    ssl_endpoint_identification: bool = Field(
        True,
        description="Check that the broker's certificate names the host connected to "
        "(off only for brokers whose certificates cannot be fixed).",
    )
    request_timeout_ms: int = Field(
        30_000, gt=0, description="Timeout of admin and metadata requests, in milliseconds."
    )

    @field_validator("bootstrap_servers")
    @classmethod
    def _check_servers(cls, value: str) -> str:
        hosts = [h.strip() for h in value.split(",") if h.strip()]
        if not hosts or any(":" not in h for h in hosts):
            raise ValueError("bootstrap_servers must be a comma-separated list of host:port")
        return ",".join(hosts)

    @field_validator("sasl_oauthbearer_token_endpoint_url")
    @classmethod
    def _check_endpoint(cls, value: str | None) -> str | None:
        # The client secret travels to it: never in clear across a network.
        return None if value is None else secure_url(value, "sasl_oauthbearer_token_endpoint_url")

    @field_validator("sasl_oauthbearer_extensions")
    @classmethod
    def _check_extensions(cls, value: dict[str, str]) -> dict[str, str]:
        # librdkafka takes them as one `k=v,k=v` string: neither may hold a separator.
        if any(sep in item for pair in value.items() for item in pair for sep in ",="):
            raise ValueError("sasl_oauthbearer_extensions keys and values cannot hold ',' or '='")
        return value

    @property
    def uses_tls(self) -> bool:
        """The connection is encrypted (SSL or SASL_SSL)."""
        return self.security_protocol in _TLS_PROTOCOLS

    @model_validator(mode="after")
    def _check_sasl(self) -> KafkaSettings:
        sasl = self.security_protocol.startswith("SASL")
        oauth = self.sasl_mechanism == "OAUTHBEARER"
        if sasl and not self.sasl_mechanism:
            raise ValueError("a SASL security protocol needs sasl_mechanism")
        if self.sasl_mechanism and not sasl:
            raise ValueError(
                f"sasl_mechanism needs a SASL security protocol, not {self.security_protocol}"
            )
        # A user and password without PLAIN or SCRAM are let be: one Secret of credentials serves
        # every deployment (deploy/k8s/secret.example.yaml), and only some of them use them.
        if sasl and not oauth and not (self.sasl_username and self.sasl_password):
            raise ValueError(f"SASL {self.sasl_mechanism} needs sasl_username and sasl_password")
        oidc = {
            "sasl_oauthbearer_token_endpoint_url": self.sasl_oauthbearer_token_endpoint_url,
            "sasl_oauthbearer_client_id": self.sasl_oauthbearer_client_id,
            "sasl_oauthbearer_client_secret": self.sasl_oauthbearer_client_secret,
        }
        if oauth:
            if missing := [name for name, value in oidc.items() if not value]:
                raise ValueError(f"SASL OAUTHBEARER (OIDC) needs {', '.join(missing)}")
        elif any(oidc.values()) or self.sasl_oauthbearer_scope or self.sasl_oauthbearer_extensions:
            raise ValueError("sasl_oauthbearer_* settings need sasl_mechanism OAUTHBEARER")
        return self

    @model_validator(mode="after")
    def _check_tls(self) -> KafkaSettings:
        tls = {
            "ssl_ca_location": self.ssl_ca_location,
            "ssl_certificate_location": self.ssl_certificate_location,
            "ssl_key_location": self.ssl_key_location,
            "ssl_key_password": self.ssl_key_password,
        }
        if not self.uses_tls and (given := [name for name, value in tls.items() if value]):
            raise ValueError(f"{', '.join(given)} need security_protocol SSL or SASL_SSL")
        if bool(self.ssl_certificate_location) != bool(self.ssl_key_location):
            raise ValueError("mutual TLS needs both ssl_certificate_location and ssl_key_location")
        if self.ssl_key_password is not None and not self.ssl_key_location:
            raise ValueError("ssl_key_password needs ssl_key_location")
        return self


class TopicSettings(BaseSettings):
    """Topic names and layout (env prefix `TIDEGATE_TOPICS_`)."""

    model_config = settings_config("TIDEGATE_TOPICS_")

    requests: str = Field(
        "inference-requests",
        description="Topic producers publish requests to: the real-time lane (docs/lanes.md).",
    )
    requests_batch: str = Field(
        "inference-requests-batch",
        description="The batch lane's requests topic: workers serve it when the real-time lane "
        "leaves them room, and give it at least `TIDEGATE_WORKER_BATCH_SHARE` of their time.",
    )
    results: str = Field("inference-results", description="Topic workers publish results to.")
    replies: str = Field(
        "inference-replies",
        description="Where workers also deliver results for gateway replicas, one partition each.",
    )
    reply_partitions: int = Field(
        16, ge=1, le=10_000, description="Partitions of the replies topic: the most replicas."
    )
    reply_retention_ms: int = Field(
        3600 * 1000, ge=-1, description="Retention of the replies topic."
    )
    failed: str = Field(
        "inference-failed-requests", description="Dead-letter topic for requests that failed."
    )
    poison: str = Field(
        "inference-poison-pill", description="Quarantine for messages that cannot be decoded."
    )
    retry_prefix: str = Field(
        "inference-retry",
        description="Retry topics are `<prefix>-1` .. `<prefix>-<retry_levels>`, one per delay.",
    )
    retry_levels: int = Field(
        3, ge=0, le=10, description="Retry topics to create: the most retries a policy may use."
    )
    lifecycle: str = Field("model-lifecycle", description="Event log of the model lifecycle.")
    audit: str = Field("audit-log", description="Audit trail of operator actions.")
    shadow: str = Field(
        "shadow-comparisons",
        description="Per-request comparisons of a shadow version's outputs with the primary's.",
    )
    breakers: str = Field(
        "model-breakers",
        description="Compacted: each worker's latest circuit-breaker state per model version.",
    )
    partitions: int = Field(
        32, ge=1, le=10_000, description="Partition count of the requests and results topics."
    )
    dlq_partitions: int = Field(
        4, ge=1, le=10_000, description="Partition count of the failed and poison topics."
    )
    replication_factor: int = Field(1, ge=1, description="Replication factor of every topic.")
    retention_ms: int = Field(
        7 * 24 * 3600 * 1000,
        ge=-1,
        description="Retention of the request, result and audit topics (-1 keeps forever).",
    )
    dlq_retention_ms: int = Field(
        30 * 24 * 3600 * 1000,
        ge=-1,
        description="Retention of the failed and poison topics, long enough to replay them.",
    )

    def retry_topic(self, level: int) -> str:
        """The retry topic of delay level `level` (1-based)."""
        return f"{self.retry_prefix}-{level}"

    def retry_topics(self) -> list[str]:
        return [self.retry_topic(level) for level in range(1, self.retry_levels + 1)]


class SchemaRegistrySettings(BaseSettings):
    """Where clients find the schema registry (env prefix `TIDEGATE_SCHEMA_REGISTRY_`).

    Any Confluent-compatible registry works: tidegate's own, Confluent Schema Registry, Karapace or
    Apicurio's ccompat API.
    """

    model_config = settings_config("TIDEGATE_SCHEMA_REGISTRY_")

    url: str = Field("http://127.0.0.1:8081", description="Base URL of the registry.")
    basic_auth_user: str | None = Field(
        None,
        description="User for HTTP basic auth: for tidegate's registry, an API key's id (the "
        "part between `tg_` and the next `_`), with its secret as the password.",
    )
    basic_auth_password: SecretStr | None = Field(None, description="Password for basic auth.")
    local_credentials: Path = Field(
        Path("var/registry/client.env"),
        description="Where `make up` leaves the local stack's registry credentials (an API key "
        "that may read and register schemas): used when no user is set and the registry is on "
        "this host, as the local PostgreSQL's password is; a file set here explicitly is used "
        "for a registry anywhere (docker-compose shares one with every service).",
    )
    cache_capacity: int = Field(1000, ge=1, description="Schemas cached by the client.")
    timeout_s: float = Field(10.0, gt=0, description="HTTP timeout of registry calls, seconds.")

    @field_validator("url")
    @classmethod
    def _check_url(cls, value: str) -> str:
        if not value.startswith(("http://", "https://")):
            raise ValueError("url must start with http:// or https://")
        return value.rstrip("/")

    @model_validator(mode="after")
    def _local_stack(self) -> SchemaRegistrySettings:
        # The default file is the local stack's, for a registry on this host only; a file
        # named explicitly (docker-compose's shared volume) is read wherever the registry is.
        named = "local_credentials" in self.model_fields_set
        local = is_loopback(urlsplit(self.url).hostname or "")
        if self.basic_auth_user is not None or not (named or local):
            return self
        found = read_env_file(self.local_credentials, str(self.model_config["env_prefix"]))
        user, password = found.get("basic_auth_user"), found.get("basic_auth_password")
        if user and password:
            self.basic_auth_user, self.basic_auth_password = user, SecretStr(password)
        return self

    def client_config(self) -> dict[str, object]:
        """The config dict of confluent-kafka's `SchemaRegistryClient`."""
        conf: dict[str, object] = {
            "url": self.url,
            "cache.capacity": self.cache_capacity,
            "timeout": self.timeout_s,
        }
        if self.basic_auth_user and self.basic_auth_password:
            secret = self.basic_auth_password.get_secret_value()
            conf["basic.auth.user.info"] = f"{self.basic_auth_user}:{secret}"
        return conf


class RegistryServerSettings(BaseSettings):
    """tidegate's embedded schema registry service (env prefix `TIDEGATE_REGISTRY_`)."""

    model_config = settings_config("TIDEGATE_REGISTRY_")

    host: str = Field("127.0.0.1", description="Address the registry listens on.")
    port: int = Field(8081, ge=1, le=65535, description="Port the registry listens on.")
    topic: str = Field("_schemas", description="Compacted topic that stores the registry state.")
    default_compatibility: CompatibilityLevel = Field(
        "BACKWARD", description="Compatibility level of subjects without their own."
    )
    startup_timeout_s: float = Field(
        60.0, gt=0, description="How long to wait for Kafka while rebuilding state on start."
    )
    write_timeout_s: float = Field(
        15.0, gt=0, description="How long a write may wait for Kafka to acknowledge it."
    )


# The password `infra/postgres.sh` gives the local stack's role: used only for a server on this
# host, when none is set.
_LOCAL_STACK_PASSWORD = "tidegate"  # noqa: S105 - the local stack's, never a remote server's


class PostgresSettings(BaseSettings):
    """PostgreSQL connection (env prefix `TIDEGATE_POSTGRES_`)."""

    model_config = settings_config("TIDEGATE_POSTGRES_")

    host: str = Field("127.0.0.1", description="Server host.")
    port: int = Field(5432, ge=1, le=65535, description="Server port.")
    user: str = Field("tidegate", description="Role to connect as.")
    password: SecretStr | None = Field(
        None,
        description="Password of the role. Unset, only a server on this host (the local stack "
        "of `make up`) is reached, with that stack's password; any other host needs one.",
    )
    dbname: str = Field("tidegate", description="Database name.")
    db_schema: str = Field(
        "public",
        pattern=r"^[a-z_][a-z0-9_]{0,62}$",
        description="Schema holding tidegate's tables (tests give each run its own).",
    )

    def secret(self) -> str:
        """The role's password: the one set, else the local stack's, on a loopback host only."""
        if self.password is not None:
            return self.password.get_secret_value()
        if is_loopback(self.host):
            return _LOCAL_STACK_PASSWORD
        raise ConfigurationError(
            f"TIDEGATE_POSTGRES_PASSWORD is unset, and {self.host!r} is no local stack: set it"
        )

    def conninfo(self) -> str:
        """A libpq connection string (psycopg), with `db_schema` first on the search path; each
        value quoted by libpq's own rules (`make_conninfo`), whatever characters it holds."""
        # Imported here: the producer client's install (the base, no extras) has no psycopg.
        from psycopg.conninfo import make_conninfo

        return make_conninfo(
            host=self.host,
            port=self.port,
            user=self.user,
            password=self.secret(),
            dbname=self.dbname,
            options=f"-c search_path={self.db_schema}",
        )

    def url(self) -> str:
        """A URL for migration tools (yoyo uses the psycopg 3 driver), user and password
        percent-encoded."""
        user, pw = quote(self.user, safe=""), quote(self.secret(), safe="")
        return f"postgresql+psycopg://{user}:{pw}@{self.host}:{self.port}/{self.dbname}"


def is_loopback(host: str) -> bool:
    """Whether `host` is this machine only: `localhost`, or a loopback address (brackets of an
    IPv6 literal allowed). Any other name may resolve to anything, so it is not."""
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host.strip("[]")).is_loopback
    except ValueError:
        return False


class RedisSettings(BaseSettings):
    """Redis connection (env prefix `TIDEGATE_REDIS_`)."""

    model_config = settings_config("TIDEGATE_REDIS_")

    url: str = Field("redis://127.0.0.1:6379/0", description="redis:// or rediss:// URL.")
    password: SecretStr | None = Field(None, description="Password, if not in the URL.")

    @field_validator("url")
    @classmethod
    def _check_url(cls, value: str) -> str:
        if not value.startswith(("redis://", "rediss://", "unix://")):
            raise ValueError("url must start with redis://, rediss:// or unix://")
        return value


def instance_id() -> str:
    return f"{socket.gethostname()}-{os.getpid()}"


def read_env_file(path: Path, prefix: str) -> dict[str, str]:
    """The `PREFIX_NAME=value` lines of a KEY=VALUE file, by lower-case name; none when the
    file cannot be read."""
    try:
        text = path.read_text()
    except OSError:
        return {}
    found: dict[str, str] = {}
    for line in text.splitlines():
        key, sep, value = line.strip().partition("=")
        if sep and key.startswith(prefix):
            found[key.removeprefix(prefix).lower()] = value
    return found
