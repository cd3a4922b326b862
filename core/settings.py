"""Settings of the connections every component shares, one pydantic-settings class each.

Each component keeps its own settings class next to its code (`WorkerSettings` in
`tidegate.agents.worker_settings`, and so on), built with `settings_config` so that all of them
behave alike.

Every field is documented, secrets are `SecretStr`, and unknown fields are refused
(`extra="forbid"`). librdkafka configuration dicts are derived from these classes in
`tidegate.core.kafka`; nobody writes them by hand.
"""

from __future__ import annotations

import os
import socket
from typing import Literal

from pydantic import Field, SecretStr, field_validator, model_validator
from pydantic_settings import BaseSettings, SettingsConfigDict

__all__ = [
    "COMPATIBILITY_LEVELS",
    "CompatibilityLevel",
    "KafkaSettings",
    "PostgresSettings",
    "RedisSettings",
    "RegistryServerSettings",
    "SchemaRegistrySettings",
    "TelemetrySettings",
    "TopicSettings",
    "TracingSettings",
    "instance_id",
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


def settings_config(prefix: str) -> SettingsConfigDict:
    return SettingsConfigDict(env_prefix=prefix, extra="forbid", validate_default=True)


class KafkaSettings(BaseSettings):
    """How to reach the Kafka cluster (env prefix `TIDEGATE_KAFKA_`)."""

    model_config = settings_config("TIDEGATE_KAFKA_")

    bootstrap_servers: str = Field(
        "127.0.0.1:9092", description="Comma-separated host:port list of bootstrap brokers."
    )
    client_id: str = Field("tidegate", description="client.id reported to the brokers.")
    security_protocol: Literal["PLAINTEXT", "SSL", "SASL_PLAINTEXT", "SASL_SSL"] = Field(
        "PLAINTEXT", description="librdkafka security.protocol."
    )
    sasl_mechanism: Literal["PLAIN", "SCRAM-SHA-256", "SCRAM-SHA-512"] | None = Field(
        None, description="SASL mechanism, required with a SASL security protocol."
    )
    sasl_username: str | None = Field(None, description="SASL user name.")
    sasl_password: SecretStr | None = Field(None, description="SASL password.")
    ssl_ca_location: str | None = Field(None, description="Path of the CA bundle for SSL.")
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

    @model_validator(mode="after")
    def _check_sasl(self) -> KafkaSettings:
        if self.security_protocol.startswith("SASL") and not (
            self.sasl_mechanism and self.sasl_username and self.sasl_password
        ):
            raise ValueError("a SASL security protocol needs sasl_mechanism, username and password")
        return self


class TopicSettings(BaseSettings):
    """Topic names and layout (env prefix `TIDEGATE_TOPICS_`)."""

    model_config = settings_config("TIDEGATE_TOPICS_")

    requests: str = Field("inference-requests", description="Topic producers publish requests to.")
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
    basic_auth_user: str | None = Field(None, description="User for HTTP basic auth, if any.")
    basic_auth_password: SecretStr | None = Field(None, description="Password for basic auth.")
    cache_capacity: int = Field(1000, ge=1, description="Schemas cached by the client.")
    timeout_s: float = Field(10.0, gt=0, description="HTTP timeout of registry calls, seconds.")

    @field_validator("url")
    @classmethod
    def _check_url(cls, value: str) -> str:
        if not value.startswith(("http://", "https://")):
            raise ValueError("url must start with http:// or https://")
        return value.rstrip("/")

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


class PostgresSettings(BaseSettings):
    """PostgreSQL connection (env prefix `TIDEGATE_POSTGRES_`)."""

    model_config = settings_config("TIDEGATE_POSTGRES_")

    host: str = Field("127.0.0.1", description="Server host.")
    port: int = Field(5432, ge=1, le=65535, description="Server port.")
    user: str = Field("tidegate", description="Role to connect as.")
    password: SecretStr = Field(SecretStr("tidegate"), description="Password of the role.")
    dbname: str = Field("tidegate", description="Database name.")
    db_schema: str = Field(
        "public",
        pattern=r"^[a-z_][a-z0-9_]{0,62}$",
        description="Schema holding tidegate's tables (tests give each run its own).",
    )

    def conninfo(self) -> str:
        """A libpq connection string (psycopg), with `db_schema` first on the search path."""
        pw = self.password.get_secret_value()
        return (
            f"host={self.host} port={self.port} user={self.user} password={pw} "
            f"dbname={self.dbname} options='-c search_path={self.db_schema}'"
        )

    def url(self) -> str:
        """A URL for migration tools (yoyo uses the psycopg 3 driver)."""
        pw = self.password.get_secret_value()
        return f"postgresql+psycopg://{self.user}:{pw}@{self.host}:{self.port}/{self.dbname}"


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


class TelemetrySettings(BaseSettings):
    """Logging and metrics (env prefix `TIDEGATE_TELEMETRY_`)."""

    model_config = settings_config("TIDEGATE_TELEMETRY_")

    log_level: Literal["DEBUG", "INFO", "WARNING", "ERROR"] = Field(
        "INFO", description="Root log level."
    )
    log_json: bool = Field(
        False,
        description="Log one JSON object per line instead of text, with the trace and span ids "
        "of the current span and the request id of records that name one.",
    )
    log_max_bytes: int = Field(
        2048,
        ge=0,
        description="Longest message of one record, in UTF-8 bytes; the rest is cut and counted "
        "(0: no limit).",
    )
    log_repeat_interval_s: float = Field(
        30.0,
        ge=0,
        description="A warning or error that repeats (digits aside) within this many seconds is "
        "held back and counted; the next one after the interval says how many were (0: off).",
    )


class TracingSettings(BaseSettings):
    """OpenTelemetry tracing, exported over OTLP (env prefix `TIDEGATE_TRACING_`). Off by default:
    then no span is made and no header is read or written."""

    model_config = settings_config("TIDEGATE_TRACING_")

    enabled: bool = Field(False, description="Trace requests through the gateway and workers.")
    endpoint: str = Field(
        "http://127.0.0.1:4318",
        description="The OTLP collector: the base URL for http/protobuf (/v1/traces is appended "
        "unless the URL has a path), host:port or URL for grpc.",
    )
    protocol: Literal["http/protobuf", "grpc"] = Field(
        "http/protobuf",
        description="OTLP transport; grpc needs the `otlp-grpc` extra (its exporter package).",
    )
    sample_ratio: float = Field(
        1.0,
        ge=0.0,
        le=1.0,
        description="Share of new traces sampled; a request that arrives with a trace keeps its "
        "caller's decision (parent-based).",
    )
    service_name: str | None = Field(
        None,
        description="service.name of this process's spans (default: tidegate-<component>, e.g. "
        "tidegate-gateway, tidegate-worker).",
    )
    export_timeout_s: float = Field(
        10.0, gt=0, description="How long one export to the collector may take."
    )


def instance_id() -> str:
    return f"{socket.gethostname()}-{os.getpid()}"
