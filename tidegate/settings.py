"""Settings, one pydantic-settings class per component, each with its own env prefix.

Every field is documented, secrets are `SecretStr`, and unknown fields are refused
(`extra="forbid"`). librdkafka configuration dicts are derived from these classes in
`tidegate.kafka`; nobody writes them by hand.
"""

from __future__ import annotations

import os
import socket
from pathlib import Path
from typing import Literal

from pydantic import Field, SecretStr, field_validator, model_validator
from pydantic_settings import BaseSettings, SettingsConfigDict

__all__ = [
    "COMPATIBILITY_LEVELS",
    "CompatibilityLevel",
    "GatewaySettings",
    "KafkaSettings",
    "LifecycleSettings",
    "ModelSettings",
    "PostgresSettings",
    "RedisSettings",
    "RegistryServerSettings",
    "SchemaRegistrySettings",
    "TelemetrySettings",
    "TopicSettings",
    "WorkerSettings",
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


def _config(prefix: str) -> SettingsConfigDict:
    return SettingsConfigDict(env_prefix=prefix, extra="forbid", validate_default=True)


class KafkaSettings(BaseSettings):
    """How to reach the Kafka cluster (env prefix `TIDEGATE_KAFKA_`)."""

    model_config = _config("TIDEGATE_KAFKA_")

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

    model_config = _config("TIDEGATE_TOPICS_")

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


class SchemaRegistrySettings(BaseSettings):
    """Where clients find the schema registry (env prefix `TIDEGATE_SCHEMA_REGISTRY_`).

    Any Confluent-compatible registry works: tidegate's own, Confluent Schema Registry, Karapace or
    Apicurio's ccompat API.
    """

    model_config = _config("TIDEGATE_SCHEMA_REGISTRY_")

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

    model_config = _config("TIDEGATE_REGISTRY_")

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

    model_config = _config("TIDEGATE_POSTGRES_")

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

    model_config = _config("TIDEGATE_REDIS_")

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

    model_config = _config("TIDEGATE_TELEMETRY_")

    log_level: Literal["DEBUG", "INFO", "WARNING", "ERROR"] = Field(
        "INFO", description="Root log level."
    )
    log_json: bool = Field(False, description="Log one JSON object per line instead of text.")


def _instance_id() -> str:
    return f"{socket.gethostname()}-{os.getpid()}"


class ModelSettings(BaseSettings):
    """The artifact store and the model runtimes (env prefix `TIDEGATE_MODELS_`)."""

    model_config = _config("TIDEGATE_MODELS_")

    store_dir: Path = Field(Path("var/models"), description="Root of the local artifact store.")
    device: Literal["auto", "cpu", "cuda"] = Field(
        "auto", description="auto picks CUDA when present, the CPU otherwise."
    )
    intra_op_threads: int = Field(
        1, ge=1, le=256, description="Threads inside one operator (onnxruntime and torch)."
    )
    inter_op_threads: int = Field(1, ge=1, le=256, description="Threads across operators.")


class WorkerSettings(BaseSettings):
    """Worker agents (env prefix `TIDEGATE_WORKER_`)."""

    model_config = _config("TIDEGATE_WORKER_")

    group_id: str = Field("tidegate-workers", description="Consumer group all workers share.")
    worker_id: str = Field(default_factory=_instance_id, description="This worker's name.")
    max_batch_size: int = Field(32, ge=1, le=4096, description="Most requests in one batch.")
    max_batch_delay_ms: float = Field(
        5.0, ge=0, le=10_000, description="Longest wait for a batch to fill, in milliseconds."
    )
    metrics_port: int = Field(
        9100, ge=0, le=65535, description="Port of the Prometheus /metrics endpoint (0: none)."
    )
    max_in_flight: int = Field(
        2048, ge=1, description="Most consumed-but-unfinished requests before consuming pauses."
    )
    session_timeout_ms: int = Field(
        10_000,
        ge=1000,
        description="How soon the group notices a dead worker and moves its partitions.",
    )
    drain_timeout_s: float = Field(
        30.0,
        gt=0,
        description="How long revoked partitions and shutdown may finish in-flight work.",
    )
    max_loaded_versions: int = Field(
        8,
        ge=1,
        le=1024,
        description="Most model versions kept loaded; the least recently used unwanted one goes.",
    )
    shadow_max_in_flight: int = Field(
        4,
        ge=0,
        description="Shadow sub-batches running at once; more are skipped and counted (0: none).",
    )


class LifecycleSettings(BaseSettings):
    """The model lifecycle: event store, outbox relay and rollout controller
    (env prefix `TIDEGATE_LIFECYCLE_`)."""

    model_config = _config("TIDEGATE_LIFECYCLE_")

    pool_min_size: int = Field(1, ge=0, le=100, description="Connections the pool keeps open.")
    pool_max_size: int = Field(4, ge=1, le=100, description="Most connections in the pool.")
    outbox_poll_s: float = Field(
        0.5, gt=0, le=60, description="How often the relay looks for unpublished events."
    )
    promote_min_agreement: float = Field(
        0.9,
        ge=0,
        le=1,
        description="Least shadow class agreement (or cosine similarity) `promote` accepts.",
    )
    promote_min_samples: int = Field(
        100, ge=0, description="Fewest shadow comparisons before the agreement gate can pass."
    )
    canary_steps: tuple[int, ...] = Field(
        (10, 50, 100), description="Default canary weights in percent, ending at 100."
    )
    canary_dwell_s: float = Field(60.0, gt=0, description="Default time at each canary step.")
    canary_max_error_rate: float = Field(
        0.05, ge=0, le=1, description="Roll back when the candidate's error rate exceeds this."
    )
    canary_max_error_rate_increase: float = Field(
        0.02,
        ge=0,
        le=1,
        description="Roll back when the candidate's error rate exceeds the baseline's by this.",
    )
    canary_max_p99_ratio: float = Field(
        2.0, gt=0, description="Roll back when the candidate's p99 exceeds baseline's times this."
    )
    canary_min_requests: int = Field(
        20, ge=1, description="Candidate results needed before thresholds are judged."
    )
    canary_confidence_z: float = Field(
        1.645,
        ge=0,
        le=5,
        description="Error rates are judged by the lower bound of their Wilson interval at this "
        "z (1.645: one-sided 95%), so a handful of errors in a small sample does not roll back.",
    )
    canary_warm_timeout_s: float = Field(
        600.0,
        gt=0,
        description="Roll a canary back when no worker has warmed its candidate in this time.",
    )
    canary_min_latency_samples: int = Field(
        100, ge=1, description="Results each side needs before the p99 ratio is judged."
    )
    canary_min_p99_gap_ms: float = Field(
        10.0, ge=0, description="A p99 regression must also exceed the baseline's by this much."
    )
    controller_tick_s: float = Field(
        0.5, gt=0, le=60, description="How often the canary controller evaluates."
    )
    lineage_retention_days: float = Field(
        30.0,
        ge=0,
        le=36500,
        description="The controller deletes `served_requests` and `shadow_comparisons` rows older "
        "than this (0: keep them forever). Never less than the canary windows' horizon.",
    )
    lineage_prune_every_s: float = Field(
        600.0, gt=0, description="How often the controller deletes expired lineage rows."
    )


class GatewaySettings(BaseSettings):
    """The V2 HTTP facade (env prefix `TIDEGATE_GATEWAY_`)."""

    model_config = _config("TIDEGATE_GATEWAY_")

    host: str = Field("127.0.0.1", description="Address to listen on.")
    port: int = Field(8080, ge=1, le=65535, description="Port to listen on.")
    replica_id: str = Field(default_factory=_instance_id, description="This replica's name.")
    default_timeout_s: float = Field(
        10.0, gt=0, description="How long a synchronous call waits for its result by default."
    )
    max_timeout_s: float = Field(120.0, gt=0, description="Longest timeout a caller may ask for.")
    max_body_bytes: int = Field(
        16 * 1024 * 1024, ge=1024, description="Larger request bodies are refused with 413."
    )
    max_in_flight: int = Field(
        4096, ge=1, description="Requests awaiting results before new ones are shed with 503."
    )
    result_ttl_s: int = Field(3600, ge=1, description="How long results are kept in Redis.")
    reply_lease_s: int = Field(
        15, ge=2, description="Lease on this replica's reply partition, renewed at a third of it."
    )
