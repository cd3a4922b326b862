"""The `tidegate controller` process: outbox relay, lineage indexer, canary controller, the
pruning of expired lineage rows (`tidegate.lifecycle.control.retention`) and the workers' lag on
every partition (`tidegate.lifecycle.control.group_lag`).

Exactly one instance acts per database schema. Each instance holds a dedicated connection and
tries `pg_try_advisory_lock` on it; the holder runs the components, the others wait and
try again every `takeover_poll_s`. The lock is the session's, so it goes when the holder's
connection does, whether the process stopped, crashed or lost the network: a waiting instance then
takes over within one poll. The holder checks its lock connection every `lock_check_s`; if that
connection is lost it stops acting at once (another instance may already hold the lock) and goes
back to waiting.

On start the live windows are seeded from `served_requests`, so an instance that takes over in
the middle of a canary step judges the whole step.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from typing import Any

import psycopg
from confluent_kafka.schema_registry import SchemaRegistryClient
from prometheus_client import Gauge

from tidegate.core.db import make_pool
from tidegate.core.errors import LifecycleUnavailableError
from tidegate.core.settings import (
    KafkaSettings,
    PostgresSettings,
    SchemaRegistrySettings,
    TopicSettings,
)
from tidegate.lifecycle.control.canary import CanaryController
from tidegate.lifecycle.control.group_lag import GroupLag
from tidegate.lifecycle.control.indexer import DEFAULT_GROUP_ID, Indexer, seed_windows
from tidegate.lifecycle.control.pool_demand import PoolDemandExport
from tidegate.lifecycle.control.retention import lineage_pruner
from tidegate.lifecycle.domain.windows import LiveWindows
from tidegate.lifecycle.eventstore.event_codec import LifecycleCodec
from tidegate.lifecycle.eventstore.event_store import EventStore
from tidegate.lifecycle.eventstore.outbox import OutboxRelay
from tidegate.lifecycle.lifecycle_settings import LifecycleSettings

__all__ = ["LOCK_NAME", "ControllerConfig", "ControllerService"]

_log = logging.getLogger(__name__)

LOCK_NAME = "tidegate.lifecycle.controller."
"""Prefix of the advisory lock key, completed by the schema: one active instance per schema."""

_TRY_LOCK = "SELECT pg_try_advisory_lock(hashtext(%s || current_schema()))"

_ACTIVE = Gauge(
    "tidegate_controller_active", "1 while this instance holds the controller lock and acts."
)


@dataclass(frozen=True)
class ControllerConfig:
    postgres: PostgresSettings = field(default_factory=PostgresSettings)
    lifecycle: LifecycleSettings = field(default_factory=LifecycleSettings)
    kafka: KafkaSettings = field(default_factory=KafkaSettings)
    topics: TopicSettings = field(default_factory=TopicSettings)
    registry: SchemaRegistrySettings = field(default_factory=SchemaRegistrySettings)
    group_id: str = DEFAULT_GROUP_ID
    """Consumer group of the lineage indexer."""
    takeover_poll_s: float = 1.0
    """How often a waiting instance tries the lock."""
    lock_check_s: float = 2.0
    """How often the active instance checks that its lock connection is alive."""
    window_horizon_s: float = 3600.0
    """How far back the live canary windows keep (and are seeded with) results."""


class ControllerService:
    """`run(stop)` waits for the lock, acts while holding it and returns once `stop` is set."""

    def __init__(self, config: ControllerConfig) -> None:
        self.config = config
        self.active = asyncio.Event()
        """Set while this instance holds the lock and its components run."""
        self.waiting = asyncio.Event()
        """Set while another instance holds the lock and this one waits to take over."""
        self.acquisitions = 0
        """How many times this instance took the lock."""
        self.lock_pid: int | None = None
        """The server process id of the connection holding the lock, while held."""

    async def run(self, stop: asyncio.Event) -> None:
        while not stop.is_set():
            lock = await self._acquire(stop)
            if lock is None:
                return
            try:
                await self._serve(lock, stop)
            except (psycopg.OperationalError, LifecycleUnavailableError) as exc:
                _log.warning("controller lost PostgreSQL, standing down: %s", exc)
                await _wait(stop, self.config.takeover_poll_s)
            finally:
                self.lock_pid = None
                with contextlib.suppress(psycopg.Error):
                    await lock.close()  # releases the lock if the server still has it

    async def _acquire(self, stop: asyncio.Event) -> psycopg.AsyncConnection[Any] | None:
        """A connection holding the lock, or None when `stop` was set while waiting."""
        conninfo = self.config.postgres.conninfo()
        conn: psycopg.AsyncConnection[Any] | None = None
        waiting_logged = False
        while not stop.is_set():
            try:
                if conn is None or conn.closed:
                    conn = await psycopg.AsyncConnection.connect(
                        conninfo,
                        autocommit=True,
                        keepalives=1,
                        keepalives_idle=5,
                        keepalives_interval=2,
                        keepalives_count=3,
                    )
                cur = await conn.execute(_TRY_LOCK, (LOCK_NAME,))
                row = await cur.fetchone()
                if row is not None and row[0]:
                    _log.info("controller lock acquired for schema %s", self._schema)
                    self.waiting.clear()
                    self.acquisitions += 1
                    self.lock_pid = conn.info.backend_pid
                    return conn
                self.waiting.set()
                if not waiting_logged:
                    _log.info("another controller is active on %s; waiting", self._schema)
                    waiting_logged = True
            except psycopg.OperationalError as exc:
                _log.warning("controller cannot reach PostgreSQL, retrying: %s", exc)
                conn = None
            await _wait(stop, self.config.takeover_poll_s)
        if conn is not None:
            await conn.close()
        return None

    async def _serve(self, lock: psycopg.AsyncConnection[Any], stop: asyncio.Event) -> None:
        cfg = self.config
        pool = make_pool(cfg.postgres, cfg.lifecycle)
        await pool.open(wait=True)
        registry = SchemaRegistryClient(cfg.registry.client_config())
        windows = LiveWindows(horizon_s=cfg.window_horizon_s)
        relay = OutboxRelay(
            pool,
            cfg.kafka,
            cfg.topics.lifecycle,
            LifecycleCodec(registry, cfg.topics).encode,
            poll_s=cfg.lifecycle.outbox_poll_s,
        )
        indexer = Indexer(
            pool,
            cfg.kafka,
            cfg.topics,
            registry,
            group_id=cfg.group_id,
            windows=windows,
            gather_s=cfg.lifecycle.indexer_gather_s,
        )
        controller = CanaryController(EventStore(pool), windows.stats, cfg.lifecycle)
        started: list[Any] = []
        try:
            pruner = lineage_pruner(pool, cfg.lifecycle, min_retention_s=cfg.window_horizon_s)
            since = datetime.now(UTC) - timedelta(seconds=cfg.window_horizon_s)
            seeded = await seed_windows(pool, windows, since)
            _log.info("live windows seeded with %d indexed results", seeded)
            await relay.start()
            started.append(relay)
            await indexer.start()
            started.append(indexer)
            controller.start()
            started.append(controller)
            if pruner is not None:
                pruner.start()
                started.append(pruner)
            lag = GroupLag(
                cfg.kafka,
                cfg.lifecycle.workers_group_id,
                cfg.topics.requests,
                every_s=cfg.lifecycle.group_lag_every_s,
            )
            lag.start()
            started.append(lag)
            demand = PoolDemandExport(pool, EventStore(pool), cfg.lifecycle)
            demand.start()
            started.append(demand)
            self.active.set()
            _ACTIVE.set(1)
            await self._hold(lock, stop, indexer)
        finally:
            self.active.clear()
            _ACTIVE.set(0)
            for component in reversed(started):
                if component is relay:
                    await _last_flush(relay)
                try:
                    await component.stop()
                except Exception:
                    _log.exception("stopping %s failed", type(component).__name__)
            await pool.close()

    async def _hold(
        self, lock: psycopg.AsyncConnection[Any], stop: asyncio.Event, indexer: Indexer
    ) -> None:
        """Until `stop`, the loss of the lock connection, or the indexer failing (raised)."""
        failed = asyncio.ensure_future(indexer.wait())
        stopped = asyncio.ensure_future(stop.wait())
        try:
            while not stop.is_set():
                await asyncio.wait(
                    {failed, stopped},
                    timeout=self.config.lock_check_s,
                    return_when=asyncio.FIRST_COMPLETED,
                )
                if failed.done():
                    failed.result()  # raises the indexer's error; the process exits non-zero
                    return
                try:
                    # Bounded: on a half-open connection the check would hang, and the lock may
                    # already be another instance's.
                    await asyncio.wait_for(lock.execute("SELECT 1"), self.config.lock_check_s)
                except (psycopg.Error, TimeoutError) as exc:
                    _log.error("controller lock connection lost, standing down: %r", exc)
                    return
        finally:
            failed.cancel()
            stopped.cancel()

    @property
    def _schema(self) -> str:
        return self.config.postgres.db_schema


async def _last_flush(relay: OutboxRelay) -> None:
    """Publish the controller's last events now rather than when the next instance starts (the
    relay's own lock keeps this safe beside another instance's relay)."""
    try:
        await relay.flush(wait=False)
    except Exception as exc:  # they stay in the outbox for the next relay
        _log.warning("final outbox flush failed: %s", exc)


async def _wait(stop: asyncio.Event, seconds: float) -> None:
    with contextlib.suppress(TimeoutError):
        await asyncio.wait_for(stop.wait(), seconds)
