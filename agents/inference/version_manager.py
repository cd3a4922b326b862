"""Which model versions this worker keeps loaded, and telling the lifecycle so (`VersionManager`):
wanted versions are loaded and warmed up before they are reported, so routed traffic never meets
a cold model. Create and use it on one event loop.
Loading, eviction and reports: docs/lifecycle.md ("Routing").
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import Awaitable, Callable, Iterable, Sequence
from typing import Protocol

from tidegate.agents import worker_metrics as metrics
from tidegate.agents.inference.loaded import LoadedModel, ModelCache, VersionKey, unload
from tidegate.core.aio import cancel_and_wait
from tidegate.core.errors import ModelUnavailableError, TidegateError
from tidegate.core.telemetry import get_logger
from tidegate.lifecycle.domain.events import NewEvent, Payload, VersionLoaded, VersionUnloaded
from tidegate.lifecycle.domain.routing import RoutingTable
from tidegate.lifecycle.domain.state import ModelState

__all__ = ["Report", "TableSource", "VersionManager"]

log = get_logger(__name__)

Report = Callable[[str, Sequence[NewEvent]], Awaitable[object]]
"""Append events to a model's stream (`LifecycleLog.append` without an expected version)."""

_STOP_REPORT_S = 5.0
_HEADROOM = 0.05
"""The share of the memory budget kept free: a load's real size may exceed its prediction."""
_REFIT_MIN_S = 0.05


class TableSource(Protocol):
    """The part of `tidegate.lifecycle.readmodels.feed.LifecycleFeed` the worker routes with."""

    def table(self, model: str) -> RoutingTable | None: ...


class VersionManager:
    """Create and use on one event loop; `start` before routing, `stop` after the last request."""

    def __init__(
        self,
        cache: ModelCache,
        tables: TableSource,
        report: Report,
        *,
        worker_id: str,
        max_loaded: int,
        unload_grace_s: float = 2.0,
        retry_report_s: float = 2.0,
        retry_loads_s: float = 10.0,
        pool: str | None = None,
        budget_bytes: int | None = None,
        busy_s: float = 0.25,
        leave_idle_s: float = 5.0,
    ) -> None:
        """`pool`: the pool this worker serves; it keeps only the models placed there loaded
        (a request for another model still loads it cold, so a stale placement loses nothing).
        `budget_bytes`: the resident memory the loaded versions may account for (None: only
        `max_loaded` counts); a version a request took in the last `busy_s` is never evicted.
        A model placed in another pool stays loaded here until no request took it for
        `leave_idle_s`: its requests already in this pool's topics drain on a warm model."""
        self.cache = cache
        self.pool = pool
        self._budget = budget_bytes
        self._busy_s = busy_s
        self._leave_idle_s = leave_idle_s
        # Each version's measured size (RSS growth at its load), kept after it is unloaded: the
        # prediction for its next load.
        self._sizes: dict[VersionKey, int] = {}
        self.worker_id = worker_id
        self._tables = tables
        self._report = report
        self._max = max_loaded
        self._grace = unload_grace_s
        self._retry_report = retry_report_s
        self._pending: dict[VersionKey, None] = {}  # an ordered set of versions to load
        self._announced: set[VersionKey] = set()
        self._outbox: list[tuple[str, Payload]] = []
        self._unloads: set[asyncio.Task[None]] = set()
        self._hurry = asyncio.Event()
        self._wake = asyncio.Event()
        self._task: asyncio.Task[None] | None = None
        self._stopped = False
        self._models: set[str] = set()
        self._retry_loads = retry_loads_s
        self._refit: asyncio.TimerHandle | None = None

    # -- the router's side ------------------------------------------------------------------

    def ready(self, model: str, version: str) -> bool:
        """Loaded and warmed up here. A version whose load failed never is."""
        return self.cache.peek(model, version) is not None

    def peek(self, model: str, version: str) -> LoadedModel | None:
        return self.cache.peek(model, version)

    async def get(self, model: str, version: str) -> LoadedModel:
        """The loaded version; a cold one is loaded now, and the caller waits for it."""
        if self.cache.peek(model, version) is not None:
            return await self.cache.get(model, version)
        metrics.COLD_LOADS.labels(model, version).inc()
        self._evict(keep=None, limit=self._max - 1)
        if not self._make_room((model, version), wanted_too=True):
            raise ModelUnavailableError(
                f"{model} version {version} does not fit this worker's memory budget now: "
                "every loaded version is in use"
            )
        loaded = await self.cache.get(model, version)
        self._loaded(loaded)
        return loaded

    # -- the lifecycle's side ---------------------------------------------------------------

    def changed(self, state: ModelState) -> None:
        """The feed's listener: a model's table changed."""
        if self._stopped:
            return  # the feed outlives the manager by a moment at shutdown
        self._models.add(state.model)
        self._reconcile(state.model)
        self._wake.set()

    async def start(self, models: Iterable[str]) -> dict[VersionKey, str]:
        """Load every wanted version of `models` now, report them, then follow table changes in
        the background. Returns the versions that failed to load, and why."""
        for model in models:
            self._models.add(model)
            self._reconcile(model)
        failures = await self._load_pending()
        await self._flush()
        self._task = asyncio.get_running_loop().create_task(self._run(), name="version-manager")
        return failures

    async def stop(self) -> None:
        """Unload everything, reporting `VersionUnloaded` for each version (bounded wait)."""
        self._stopped = True
        self._pending.clear()
        if self._refit is not None:
            self._refit.cancel()
            self._refit = None
        if self._task is not None:
            await cancel_and_wait([self._task])
            self._task = None
        for name, version in self.cache.loaded():
            self._drop((name, version), "worker stopping")
        self._hurry.set()  # unload now, not after the grace period
        await asyncio.gather(*self._unloads, return_exceptions=True)
        try:
            await asyncio.wait_for(self._flush(), _STOP_REPORT_S)
        except TimeoutError:
            log.warning("the lifecycle log did not take the unload reports in time")
        if self._outbox:
            log.warning("%d version reports not recorded at stop", len(self._outbox))
        await self.cache.close()

    # -- internals --------------------------------------------------------------------------

    def _reconcile(self, model: str) -> None:
        table = self._tables.table(model)
        servable = table.servable if table is not None else frozenset()
        for name, version in self.cache.loaded():
            if name == model and version not in servable:
                why = "retired" if table is not None and version in table.known else "unknown"
                self._drop((name, version), why)
        if table is None:
            return
        if table.pool != self.pool:
            # Placed in another pool: its workers load it, and this one frees the memory once
            # the model's requests left in this pool's topics are served (the periodic
            # reconcile in `_run` looks again).
            idle_since = time.monotonic() - self._leave_idle_s
            for key in self.cache.loaded():
                if key[0] == model and self.cache.used_at(key) < idle_since:
                    self._drop(key, f"placed in {table.pool or 'the default pool'}")
            return
        for version in sorted(table.wanted):
            key = (model, version)
            if self.cache.peek(*key) is None and self.cache.failure(*key) is None:
                self._pending[key] = None

    def _wanted(self, key: VersionKey) -> bool:
        table = self._tables.table(key[0])
        return table is not None and table.pool == self.pool and key[1] in table.wanted

    async def _run(self) -> None:
        while True:
            self._wake.clear()  # before the work: a change during it sets it again
            try:
                await self._load_pending()
                await self._flush()
            except Exception:
                # Loads and reports handle their own errors; anything else is a bug, and the
                # manager must keep following table changes regardless.
                log.exception("the version manager's cycle failed")
                await asyncio.sleep(self._retry_report)
            if self._pending:
                continue
            timeout = self._retry_report if self._outbox else self._retry_loads
            try:
                await asyncio.wait_for(self._wake.wait(), timeout)
            except TimeoutError:
                # A wanted version whose load failed is tried again once its failure is
                # forgotten, without waiting for the next table change (nor for a request).
                for model in sorted(self._models):
                    self._reconcile(model)

    async def _load_pending(self) -> dict[VersionKey, str]:
        failures: dict[VersionKey, str] = {}
        while self._pending:
            key = next(iter(self._pending))
            del self._pending[key]
            if not self._wanted(key):
                continue  # the table changed again meanwhile
            if self.cache.peek(*key) is None:
                self._evict(keep=None, limit=self._max - 1)
                if not self._make_room(key, wanted_too=False):
                    # Only wanted or busy versions fill the budget: this one loads when a
                    # request asks for it, in place of the least recently used idle one.
                    log.debug("%s version %s left to load on demand: memory budget full", *key)
                    continue
            try:
                loaded = await self.cache.get(*key)
            except TidegateError as exc:
                failures[key] = str(exc)
                log.error("%s version %s cannot serve from this worker: %s", *key, exc)
                continue
            self._loaded(loaded)
        return failures

    def _loaded(self, model: LoadedModel) -> None:
        key = (model.name, model.version)
        if model.rss_bytes is not None:
            self._sizes[key] = model.rss_bytes
        # Measured, the load may be larger than predicted: the budget holds as measured.
        if not self._fit(0, keep=key, wanted_too=True):
            self._refit_later()
        metrics.LOADED_BYTES.set(self.loaded_bytes())
        if key not in self._announced:
            self._announced.add(key)
            loaded = VersionLoaded(
                model.version, self.worker_id, model.load_ms, model.rss_bytes, self.pool
            )
            self._queue(model.name, loaded)
        table = self._tables.table(model.name)
        if table is None or model.version not in table.servable:
            self._drop(key, "retired")  # retired while it loaded
            return
        self._evict(keep=key, limit=self._max)
        metrics.LOADED_VERSIONS.set(len(self.cache))

    def _evict(self, *, keep: VersionKey | None, limit: int) -> None:
        """Unload the least recently used versions nobody wants until at most `limit` remain."""
        over = len(self.cache) - max(limit, 0)
        for key in self.cache.by_recency():
            if over <= 0:
                return
            if key != keep and not self._wanted(key):
                metrics.EVICTIONS.labels(*key, "count").inc()
                self._drop(key, "evicted")
                over -= 1

    # -- the memory budget ------------------------------------------------------------------

    def _size(self, key: VersionKey) -> int:
        """A version's measured size; else the average of the measured ones (0 for none)."""
        size = self._sizes.get(key)
        if size is not None:
            return size
        known = self._sizes.values()
        return sum(known) // len(known) if known else 0

    def loaded_bytes(self) -> int:
        """The resident memory the loaded versions account for."""
        return sum(self._size(key) for key in self.cache.loaded())

    def _make_room(self, key: VersionKey, *, wanted_too: bool) -> bool:
        """Whether `key` fits the budget (less its headroom) once idle versions are evicted,
        least recently used first: those no table wants, then, with `wanted_too`, wanted ones
        (a request waits on this load; they load again on their next request)."""
        return self._fit(self._size(key), keep=key, wanted_too=wanted_too)

    def _refit_later(self) -> None:
        """Versions in use kept the loaded ones over the budget: evict again once they may have
        gone idle, rather than stay over it until the next load."""
        if self._refit is None and not self._stopped:
            delay = max(self._busy_s, _REFIT_MIN_S)
            self._refit = asyncio.get_running_loop().call_later(delay, self._fit_again)

    def _fit_again(self) -> None:
        self._refit = None
        if self._stopped:
            return
        if not self._fit(0, keep=None, wanted_too=True):
            self._refit_later()
        metrics.LOADED_BYTES.set(self.loaded_bytes())

    def _fit(self, need: int, *, keep: VersionKey | None, wanted_too: bool) -> bool:
        """Evict idle versions other than `keep` until the loaded ones and `need` more bytes fit
        the budget; whether they do."""
        if self._budget is None:
            return True
        limit = int(self._budget * (1 - _HEADROOM))
        if self.loaded_bytes() + need <= limit:
            return True
        busy_since = time.monotonic() - self._busy_s
        idle = [
            k for k in self.cache.by_recency() if k != keep and self.cache.used_at(k) < busy_since
        ]
        victims = [k for k in idle if not self._wanted(k)]
        if wanted_too:
            victims += [k for k in idle if self._wanted(k)]
        for victim in victims:
            metrics.EVICTIONS.labels(*victim, "memory").inc()
            self._drop(victim, "evicted: memory budget")
            if self.loaded_bytes() + need <= limit:
                return True
        return False

    def _drop(self, key: VersionKey, reason: str) -> None:
        model = self.cache.pop(*key)
        if model is None:
            return
        log.info("unloading %s version %s (%s)", key[0], key[1], reason)
        if key in self._announced:
            self._announced.discard(key)
            self._queue(key[0], VersionUnloaded(key[1], self.worker_id, reason))
        task = asyncio.get_running_loop().create_task(self._unload_later(model))
        self._unloads.add(task)
        task.add_done_callback(self._unloads.discard)
        metrics.LOADED_VERSIONS.set(len(self.cache))
        metrics.LOADED_BYTES.set(self.loaded_bytes())

    async def _unload_later(self, model: LoadedModel) -> None:
        # Requests routed just before the drop may still hold the version: give them time.
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(self._hurry.wait(), self._grace)
        await unload(model)

    def _queue(self, model: str, payload: Payload) -> None:
        self._outbox.append((model, payload))
        self._wake.set()

    async def _flush(self) -> None:
        """Append the queued reports, per model in order; what fails stays queued."""
        batch, self._outbox = self._outbox, []
        failed: list[tuple[str, Payload]] = []
        for model in dict.fromkeys(m for m, _ in batch):
            payloads = [p for m, p in batch if m == model]
            events = [NewEvent(p, actor=f"worker:{self.worker_id}") for p in payloads]
            try:
                await self._report(model, events)
            except Exception as exc:
                log.warning(
                    "cannot report %d version event(s) of %s yet: %s", len(events), model, exc
                )
                failed.extend((model, p) for p in payloads)
        self._outbox = failed + self._outbox
