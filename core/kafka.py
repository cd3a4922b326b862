"""The Kafka client factory: librdkafka config dicts derived from `KafkaSettings`.

Like quixstreams' `ConnectionConfig`, the connection part is derived once from the settings and
every client adds only its role's options: security (SASL PLAIN/SCRAM, OAUTHBEARER through OIDC,
TLS with or without a client certificate) is written in one place, so no client can be the one
that forgot it. Defaults lean to safety: idempotent producers with
acks=all, consumers that never auto-commit.

Producers and consumers log through Python logging (the `librdkafka` logger), where
`tidegate.core.telemetry`'s filters summarise a reconnect storm; librdkafka would otherwise write
each line to stderr itself. Such lines are served by the client's `poll`, which every producer and
consumer here calls all along; admin clients are polled only now and then, so theirs stay on
stderr rather than pile up unserved.
"""

from __future__ import annotations

import logging
import threading
import time
import uuid
from collections.abc import Mapping
from typing import Any, Literal

from confluent_kafka import Consumer, KafkaException, Message, Producer
from confluent_kafka.admin import (  # type: ignore[attr-defined]
    AdminClient,
    AlterConfigOpType,
    ConfigEntry,
    ConfigResource,
    ResourceType,
)
from pydantic import SecretStr

from tidegate.core.settings import KafkaSettings
from tidegate.core.telemetry import RDKAFKA_LOGGER

__all__ = [
    "SECRET_OPTIONS",
    "GroupProtocol",
    "admin_config",
    "close_within",
    "connection_config",
    "consume_ready",
    "consumer_config",
    "make_admin",
    "make_consumer",
    "make_offset_reader",
    "make_producer",
    "make_reader",
    "membership_config",
    "producer_config",
    "redacted",
    "set_group_timeouts",
]

GroupProtocol = Literal["classic", "consumer"]

_log = logging.getLogger(__name__)


def connection_config(settings: KafkaSettings) -> dict[str, Any]:
    """Options every client shares: brokers, identity and security.

    The dict holds secrets in clear (librdkafka needs them so): it is handed to a client and never
    logged; `redacted` gives a copy fit for a log line.
    """
    conf: dict[str, Any] = {
        "bootstrap.servers": settings.bootstrap_servers,
        "client.id": settings.client_id,
        "security.protocol": settings.security_protocol,
        # Requests and results are small; Nagle's algorithm would hold them back for the peer's
        # delayed ACK (tens of milliseconds) on a quiet connection.
        "socket.nagle.disable": True,
    }
    conf.update(_sasl_config(settings))
    conf.update(_tls_config(settings))
    return conf


def _sasl_config(settings: KafkaSettings) -> dict[str, Any]:
    if settings.sasl_mechanism is None:
        return {}
    conf: dict[str, Any] = {"sasl.mechanism": settings.sasl_mechanism}
    if settings.sasl_mechanism != "OAUTHBEARER":
        conf["sasl.username"] = settings.sasl_username
        conf["sasl.password"] = _secret(settings.sasl_password)
        return conf
    # librdkafka's own OIDC client-credentials flow: it fetches the token from the endpoint and
    # refreshes it before expiry, with no Python callback on the hot path.
    conf.update(
        {
            "sasl.oauthbearer.method": "oidc",
            "sasl.oauthbearer.token.endpoint.url": settings.sasl_oauthbearer_token_endpoint_url,
            "sasl.oauthbearer.client.id": settings.sasl_oauthbearer_client_id,
            "sasl.oauthbearer.client.secret": _secret(settings.sasl_oauthbearer_client_secret),
        }
    )
    if settings.sasl_oauthbearer_scope:
        conf["sasl.oauthbearer.scope"] = settings.sasl_oauthbearer_scope
    if settings.sasl_oauthbearer_extensions:
        conf["sasl.oauthbearer.extensions"] = ",".join(
            f"{k}={v}" for k, v in settings.sasl_oauthbearer_extensions.items()
        )
    return conf


def _tls_config(settings: KafkaSettings) -> dict[str, Any]:
    if not settings.uses_tls:
        return {}
    conf: dict[str, Any] = {
        "ssl.endpoint.identification.algorithm": (
            "https" if settings.ssl_endpoint_identification else "none"
        ),
    }
    if settings.ssl_ca_location:
        conf["ssl.ca.location"] = settings.ssl_ca_location
    if settings.ssl_certificate_location:
        conf["ssl.certificate.location"] = settings.ssl_certificate_location
        conf["ssl.key.location"] = settings.ssl_key_location
    if settings.ssl_key_password is not None:
        conf["ssl.key.password"] = _secret(settings.ssl_key_password)
    return conf


def _secret(value: SecretStr | None) -> str | None:
    return None if value is None else value.get_secret_value()


SECRET_OPTIONS = frozenset({"sasl.password", "sasl.oauthbearer.client.secret", "ssl.key.password"})
"""The librdkafka options of `connection_config` that hold a secret."""


def redacted(conf: Mapping[str, Any]) -> dict[str, Any]:
    """A copy of a librdkafka dict with every secret replaced, for logs and error messages."""
    return {k: "**********" if k in SECRET_OPTIONS else v for k, v in conf.items()}


def producer_config(
    settings: KafkaSettings, extra: Mapping[str, Any] | None = None
) -> dict[str, Any]:
    """An idempotent, acks=all producer; `extra` holds librdkafka options by their own names."""
    conf = connection_config(settings)
    conf.update(
        {
            "enable.idempotence": True,
            "acks": "all",
            "linger.ms": 2,
            "compression.type": "lz4",
            "logger": logging.getLogger(RDKAFKA_LOGGER),
        }
    )
    conf.update(extra or {})
    return conf


def consumer_config(
    settings: KafkaSettings, group_id: str, extra: Mapping[str, Any] | None = None
) -> dict[str, Any]:
    """A consumer that commits only what its owner says is done, reading committed data only."""
    conf = connection_config(settings)
    conf.update(
        {
            "group.id": group_id,
            "enable.auto.commit": False,
            "auto.offset.reset": "earliest",
            "isolation.level": "read_committed",
            "logger": logging.getLogger(RDKAFKA_LOGGER),
        }
    )
    conf.update(extra or {})
    return conf


def membership_config(
    protocol: GroupProtocol, session_timeout_ms: int, heartbeat_interval_ms: int
) -> dict[str, Any]:
    """A group member's options for `protocol`, with how soon a silent member loses its
    partitions: classic groups take the session timeout and heartbeat interval from each member
    (cooperative-sticky, so a rebalance moves only the partitions that change owner); KIP-848
    (`consumer`) groups have them as the group's own config on the brokers (`set_group_timeouts`)
    and assign on the brokers too, so librdkafka refuses these options there."""
    if protocol == "consumer":
        return {"group.protocol": "consumer"}
    return {
        "group.protocol": "classic",
        "partition.assignment.strategy": "cooperative-sticky",
        "session.timeout.ms": session_timeout_ms,
        "heartbeat.interval.ms": heartbeat_interval_ms,
    }


def set_group_timeouts(
    admin: AdminClient,
    group_id: str,
    session_timeout_ms: int,
    heartbeat_interval_ms: int,
    timeout_s: float = 10.0,
) -> None:
    """Set a KIP-848 group's session timeout and heartbeat interval (the group config
    `consumer.session.timeout.ms` and `consumer.heartbeat.interval.ms`); the group need not exist
    yet. Raises `KafkaException` when the brokers refuse: values below their floors
    (`group.consumer.min.session.timeout.ms`, `group.consumer.min.heartbeat.interval.ms`) or no
    ALTER_CONFIGS permission on the group."""
    entries = [
        ConfigEntry(name, str(value), incremental_operation=AlterConfigOpType.SET)
        for name, value in (
            ("consumer.session.timeout.ms", session_timeout_ms),
            ("consumer.heartbeat.interval.ms", heartbeat_interval_ms),
        )
    ]
    resource = ConfigResource(ResourceType.GROUP, group_id, incremental_configs=entries)
    for future in admin.incremental_alter_configs([resource], request_timeout=timeout_s).values():
        future.result(timeout=timeout_s)


def admin_config(settings: KafkaSettings, extra: Mapping[str, Any] | None = None) -> dict[str, Any]:
    conf = connection_config(settings)
    conf.update(extra or {})
    return conf


def make_producer(settings: KafkaSettings, extra: Mapping[str, Any] | None = None) -> Producer:
    return Producer(producer_config(settings, extra))


def make_consumer(
    settings: KafkaSettings, group_id: str, extra: Mapping[str, Any] | None = None
) -> Consumer:
    return Consumer(consumer_config(settings, group_id, extra))


def make_reader(settings: KafkaSettings, purpose: str) -> Consumer:
    """A consumer for reading assigned partitions up to their end (partition EOF events) that
    never stores or commits an offset, under a throwaway group named after `purpose`: the
    inspection tools and feeds that must not join or move any group that matters."""
    group_id = f"tidegate-{purpose}-{uuid.uuid4().hex[:12]}"
    extra = {"enable.partition.eof": True, "enable.auto.offset.store": False}
    return make_consumer(settings, group_id, extra)


def make_offset_reader(settings: KafkaSettings, group_id: str) -> Consumer:
    """A consumer that reads `group_id`'s committed offsets (`committed`) and the partitions'
    offsets (`offsets_for_times`, -1 the end, -2 the start) without ever joining the group: it
    never subscribes, stores or commits. Lag readers use it rather than an `AdminClient`, whose
    requests abort the process when they time out across a broker restart (librdkafka issues
    4605 and 3663)."""
    extra = {"enable.auto.offset.store": False, "client.id": f"{settings.client_id}-offsets"}
    return make_consumer(settings, group_id, extra)


def close_within(consumer: Consumer, seconds: float, what: str) -> bool:
    """Close `consumer` on a thread of its own, waiting at most `seconds`; whether it closed.

    librdkafka's consumer close can block for good when the brokers go away while it runs
    (confluent-kafka-python issue 1667): a caller that waited would stall its own shutdown, or a
    prober its next probe. One that has not returned by then is left on its daemon thread."""

    def close() -> None:
        try:
            consumer.close()
        except (KafkaException, RuntimeError) as exc:
            _log.debug("closing %s: %s", what, exc)

    closer = threading.Thread(target=close, name=f"close-{what}", daemon=True)
    closer.start()
    closer.join(seconds)
    if closer.is_alive():
        _log.warning("%s did not close within %g s: left on its own thread", what, seconds)
        return False
    return True


def make_admin(settings: KafkaSettings, extra: Mapping[str, Any] | None = None) -> AdminClient:
    return AdminClient(admin_config(settings, extra))


# A poll answered this soon found its message already queued, not one that arrived meanwhile.
_QUEUED_S = 0.001


def consume_ready(
    consumer: Consumer,
    max_messages: int,
    timeout: float,
    window: float = 0.0,
    idle: float | None = None,
    since: float | None = None,
) -> list[Message]:
    """Wait up to `timeout` for one message and take whatever else is already there; when that
    was more than one, messages are arriving faster than they are read: collect more for up to
    `window` seconds; with `idle`, only when the first `idle` seconds of it bring more.

    `Consumer.consume(n, timeout)` waits the whole timeout unless n messages arrive, which adds that
    timeout to the latency of every message on a quiet topic; the window opens only under load.
    `idle` closes it early after a burst (one producer batch read at once), which would
    otherwise wait out the whole window for messages that are not coming.

    `since` (`time.monotonic()`) is when the caller took its previous batch. A message already
    queued when the poll starts may have waited from then, so the window counts from `since`:
    a caller that spent the whole window on the last batch takes what is queued at once.
    """
    polled = time.monotonic()
    first = consumer.poll(timeout)
    if first is None:
        return []
    if since is not None and window > 0:
        now = time.monotonic()
        if now - polled < _QUEUED_S:
            window -= now - since
    if max_messages <= 1:
        return [first]
    rest = consumer.consume(num_messages=max_messages - 1, timeout=0)
    room = max_messages - 1 - len(rest)
    if window <= 0 or not rest or room <= 0:
        return [first, *rest]
    if idle is not None and idle < window:
        # A burst read at once (one producer's batch) is followed by nothing: go after `idle`.
        more = consumer.consume(num_messages=room, timeout=idle)
        if not more:
            return [first, *rest]
        rest.extend(more)
        room -= len(more)
        window -= idle
    if room > 0:
        rest.extend(consumer.consume(num_messages=room, timeout=window))
    return [first, *rest]
