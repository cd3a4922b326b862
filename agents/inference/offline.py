"""The workers' data plane run offline, on versions the operator names (`OfflineScorer`): what
`tidegate replay` and `tidegate backtest` compute with. A request's deadline is dropped on purpose
(a replay is not the caller's call), and the timings are the replay's own.
How: docs/replay.md ("Replay").
"""

from __future__ import annotations

import time
from collections.abc import Sequence

from tidegate.agents.inference.inference_service import InferenceService
from tidegate.agents.inference.loaded import LoadedModel, ModelCache, ModelLoader, store_loader
from tidegate.agents.tasks.inference_task import InferenceTask
from tidegate.dlq.replay_reader import SourceRecord
from tidegate.lifecycle.domain.routing import RoutingTable
from tidegate.models.model_settings import ModelSettings
from tidegate.schemas.records import ResultRecord

__all__ = ["ChosenVersions", "OfflineScorer"]


class ChosenVersions:
    """Routing tables and loaded versions for offline runs: a model's table serves every version
    chosen for it so far, and only those; nothing takes traffic by weight."""

    def __init__(self, cache: ModelCache) -> None:
        self.cache = cache
        self._tables: dict[str, RoutingTable] = {}

    def choose(self, model: str, version: str) -> None:
        table = self._tables.get(model)
        if table is not None and version in table.servable:
            return
        versions = frozenset({version, *(table.servable if table else ())})
        self._tables[model] = RoutingTable(
            model=model,
            sequence=0,
            primary=None,
            fallbacks=(),
            weights=(),
            shadows=(),
            rules=(),
            servable=versions,
            known=versions,
            wanted=versions,
        )

    def table(self, model: str) -> RoutingTable | None:
        return self._tables.get(model)

    def ready(self, model: str, version: str) -> bool:
        return True  # a cold version is loaded on first use: offline, only the run waits

    async def get(self, model: str, version: str) -> LoadedModel:
        return await self.cache.get(model, version)


class OfflineScorer:
    """Implements `tidegate.dlq.replay_run.Scorer` (and the backtest's `task` lookup)."""

    def __init__(self, loader: ModelLoader, *, worker_id: str) -> None:
        self._versions = ChosenVersions(ModelCache(loader))
        self._service = InferenceService(self._versions, self._versions, worker_id=worker_id)

    @classmethod
    def from_settings(cls, models: ModelSettings, *, worker_id: str) -> OfflineScorer:
        return cls(store_loader(models), worker_id=worker_id)

    async def score(self, items: Sequence[tuple[SourceRecord, str]]) -> list[ResultRecord]:
        """One `InferenceResult` record per (record, version), in order, computed in the
        batches the items make (callers pass one chunk at a time, so batches are
        reproducible)."""
        tasks = []
        now_ms = time.time() * 1000.0
        for record, version in items:
            if record.request is None:
                raise ValueError("only decoded requests can be scored")
            request = record.request.copy()
            request["model_version"] = version
            request["deadline"] = None
            self._versions.choose(str(request["model"]), version)
            tasks.append(InferenceTask(request, source=record.position.copy(), received_ms=now_ms))
        results = await self._service.process(tasks, [0.0] * len(tasks))
        for result in results:
            timings = result["timings"]
            timings["queue_ms"] = 0.0
            timings["total_ms"] = timings["batch_ms"] + timings["compute_ms"]
        return results

    async def task(self, model: str, version: str) -> str:
        """What the version's outputs mean (its manifest's `task`, or the shadow's guess)."""
        return (await self._versions.get(model, version)).task

    async def close(self) -> None:
        await self._versions.cache.close()
