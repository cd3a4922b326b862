"""Settings of the V2 HTTP facade.

The edge's limits (docs/gateway-hardening.md) are here too: how long a client may take to send
its headers and its body, how many connections one address may hold open, and the certificate the
gateway serves TLS with when no proxy terminates it.
"""

from __future__ import annotations

from pathlib import Path

from pydantic import Field, SecretStr, model_validator
from pydantic_settings import BaseSettings

from tidegate.core.settings import instance_id, settings_config

__all__ = ["JSON_BODY_FACTOR", "GatewaySettings"]

JSON_BODY_FACTOR = 8
"""The default body limit, in request records: JSON text is rarely more than 8 times the bytes
its elements take in a record."""


class GatewaySettings(BaseSettings):
    """The V2 HTTP facade (env prefix `TIDEGATE_GATEWAY_`)."""

    model_config = settings_config("TIDEGATE_GATEWAY_")

    host: str = Field("127.0.0.1", description="Address to listen on.")
    port: int = Field(8080, ge=1, le=65535, description="Port to listen on.")
    workers: int = Field(
        1,
        ge=1,
        le=256,
        description="Gateway processes serving the port, each a replica with its own reply "
        "partition (so at most the replies topic's partition count).",
    )
    admin: bool = Field(
        True, description="Serve the lifecycle operations under /admin (needs PostgreSQL)."
    )
    access_log: bool = Field(
        False, description="Log one line per HTTP request (uvicorn's access log) at INFO."
    )
    replica_id: str = Field(
        default_factory=instance_id,
        description="This replica's name (host and process id by default). With several "
        "workers, each process appends its own process id to a name given here.",
    )
    default_timeout_s: float = Field(
        10.0, gt=0, description="How long a synchronous call waits for its result by default."
    )
    max_timeout_s: float = Field(120.0, gt=0, description="Longest timeout a caller may ask for.")
    async_deadline_s: float | None = Field(
        None,
        gt=0,
        description="Deadline of an asynchronous call (`Prefer: respond-async`) that sends no "
        "`Request-Timeout`, in seconds from its arrival; unset, such a call has none and is "
        "computed however long it waits. A synchronous call's deadline is its timeout.",
    )
    publish_timeout_s: float = Field(
        5.0,
        ge=0.1,
        le=300,
        description="Longest time Kafka may take to acknowledge a request (librdkafka's "
        "`message.timeout.ms` for the gateway's producer): past it the publish fails, and the "
        "request is not in Kafka. An asynchronous call is answered within it.",
    )
    publish_linger_ms: float = Field(
        20.0,
        ge=0,
        le=1000,
        description="How long the gateway holds a request for others to share its "
        "ProduceRequest (its publish window; librdkafka lingers 2 ms more, for the window's "
        "requests to be enqueued); the window's requests are encoded and enqueued in one pass, "
        "and those without a routing key go to one sticky partition. Every call's batch then "
        "costs one produce, one worker "
        "fetch, one batch of the model and one result and reply produce: measured on `tidegate "
        "demo --keep`'s processes at 250 calls/s, 20 ms gave 2.7-2.8 ms of machine CPU per call "
        "against 3.1-3.3 ms at 10 ms, for 7 ms more median latency; 30 ms put the p99 at 500 "
        "calls/s over 100 ms (docs/benchmarks.md).",
    )
    kafka_probe_s: float = Field(
        0.5,
        gt=0,
        le=30,
        description="While no Kafka broker is reachable (calls are refused with 503 at once), "
        "how often the gateway asks the brokers for metadata to learn they are back.",
    )
    max_record_bytes: int = Field(
        1_000_000,
        ge=1000,
        description="Largest request record the gateway publishes (librdkafka's "
        "`message.max.bytes`); the requests topic's `max.message.bytes` lowers it when smaller. "
        "Larger requests are refused with 413.",
    )
    max_body_bytes: int | None = Field(
        None,
        ge=1024,
        description="Larger request bodies are refused with 413, before they are read whole. "
        f"Unset: {JSON_BODY_FACTOR} times `max_record_bytes`, room for any JSON body whose "
        "tensors a request record can hold (an element takes 1 to 8 bytes in the record and "
        "rarely more than 8 times that as JSON text), and for a binary one with its JSON header.",
    )
    max_in_flight: int = Field(
        4096, ge=1, description="Requests awaiting results before new ones are shed with 503."
    )
    result_ttl_s: int = Field(3600, ge=1, description="How long results are kept in Redis.")
    max_kept_results: int = Field(
        100_000,
        ge=1,
        description="Requests whose results this replica remembers to store in Redis when they "
        "come (asynchronous calls, and synchronous ones answered 504), for `result_ttl_s` at "
        "most. Past it the oldest are forgotten: their results are then stored only if Redis "
        "still holds their request, at the cost of one more check.",
    )
    reply_lease_s: int = Field(
        15, ge=2, description="Lease on this replica's reply partition, renewed at a third of it."
    )
    shutdown_timeout_s: int = Field(
        10,
        ge=1,
        description="On SIGTERM, how long open connections may finish before they are closed.",
    )
    header_timeout_s: float = Field(
        10.0,
        gt=0,
        description="How long a connection may take to send a request's line and headers (from "
        "when it opens, or from the first byte of a later request on it): past it the "
        "connection is closed, with a 408 if a request had begun.",
    )
    max_header_bytes: int = Field(
        64 * 1024,
        ge=1024,
        description="Largest request line and headers together; larger ones are answered 431.",
    )
    body_timeout_s: float = Field(
        30.0,
        gt=0,
        description="How long a request's whole body may take to arrive after its headers: "
        "past it the call is answered 408 and the connection closed.",
    )
    max_connections_per_client: int = Field(
        256,
        ge=1,
        description="Connections one client address may hold open on each gateway process; "
        "more are answered 429 and closed. Behind a proxy every client shares the proxy's "
        "address: raise it there and let the proxy cap clients.",
    )
    forwarded_allow_ips: str = Field(
        "127.0.0.1",
        description="Comma-separated addresses (or `*`) of proxies whose X-Forwarded-For and "
        "X-Forwarded-Proto are believed: a call from one of them is taken to come from the "
        "client the proxy names.",
    )
    tls_certfile: Path | None = Field(
        None, description="PEM certificate chain to serve HTTPS with (with `tls_keyfile`)."
    )
    tls_keyfile: Path | None = Field(
        None, description="PEM private key of `tls_certfile`; unset, the gateway serves HTTP."
    )
    tls_keyfile_password: SecretStr | None = Field(
        None, description="Password of an encrypted `tls_keyfile`."
    )

    @model_validator(mode="after")
    def _tls_pair(self) -> GatewaySettings:
        # A certificate without its key (or the reverse) would silently serve plain HTTP.
        if (self.tls_certfile is None) != (self.tls_keyfile is None):
            raise ValueError("tls_certfile and tls_keyfile are set together, or neither")
        return self

    @property
    def body_limit(self) -> int:
        """The largest request body read: `max_body_bytes`, else what the record cap implies."""
        if self.max_body_bytes is not None:
            return self.max_body_bytes
        return JSON_BODY_FACTOR * self.max_record_bytes
