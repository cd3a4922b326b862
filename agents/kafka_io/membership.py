"""How a worker joins its consumer group, so a dead worker's partitions move within seconds.

Both group protocols get the worker's `session_timeout_ms` and `heartbeat_interval_ms`: the classic
one from the consumer's own options, KIP-848 (`group_protocol="consumer"`) from the group's config
on the brokers, which `prepare_group` sets before the worker joins. docs/takeover.md and decision
015 say how soon each moves the partitions of a killed worker.
"""

from __future__ import annotations

from typing import Any

from confluent_kafka import KafkaError, KafkaException

from tidegate.agents.worker_settings import WorkerSettings
from tidegate.core.errors import ConfigurationError
from tidegate.core.kafka import make_admin, membership_config, set_group_timeouts
from tidegate.core.settings import KafkaSettings
from tidegate.core.telemetry import get_logger

__all__ = ["check_membership", "consumer_options", "prepare_group"]

log = get_logger(__name__)


def consumer_options(settings: WorkerSettings) -> dict[str, Any]:
    """The worker consumer's group options (protocol, assignor, session, heartbeat)."""
    return membership_config(
        settings.group_protocol, settings.session_timeout_ms, settings.heartbeat_interval_ms
    )


def prepare_group(kafka: KafkaSettings, settings: WorkerSettings) -> None:
    """KIP-848 groups: write the session timeout and heartbeat interval into the group's config
    (every worker does at start: the same values each time, and the last start's win). A refusal
    is logged, not raised: the worker still serves, only a dead peer's partitions wait for the
    brokers' default session timeout (`group.consumer.session.timeout.ms`, 45 s unless changed)."""
    if settings.group_protocol != "consumer":
        return
    admin = make_admin(kafka)
    try:
        set_group_timeouts(
            admin, settings.group_id, settings.session_timeout_ms, settings.heartbeat_interval_ms
        )
    except KafkaException as exc:
        log.warning(
            "cannot set the session timeout of group %s to %d ms; a dead worker's partitions "
            "move after the brokers' default instead: %s",
            settings.group_id,
            settings.session_timeout_ms,
            exc,
        )


def check_membership(error: KafkaError, settings: WorkerSettings) -> None:
    """Raise when the brokers refuse the worker's session timeout: the consumer would otherwise
    retry its join for ever, alive and consuming nothing."""
    if error.code() == KafkaError.INVALID_SESSION_TIMEOUT:
        raise ConfigurationError(
            f"the brokers refuse session_timeout_ms={settings.session_timeout_ms} "
            "(TIDEGATE_WORKER_SESSION_TIMEOUT_MS): it is outside their group.min.session."
            "timeout.ms .. group.max.session.timeout.ms; lower their floor (docs/takeover.md) "
            "or raise the setting"
        )
