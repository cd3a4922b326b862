"""Planning pools: which models go in which pool, from each version's measured memory and each
model's request rate (`plan`). Pure: the CLI gathers the facts and records the plan.
How a plan is made and applied: docs/pools.md ("Planning").
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

__all__ = ["ModelDemand", "Plan", "PlannedPool", "plan"]


@dataclass(frozen=True, slots=True)
class ModelDemand:
    """What one model needs of a worker: the memory of the versions it keeps loaded, and its
    request rate."""

    model: str
    version_bytes: Mapping[str, int]
    """Each wanted version's resident size (its measured RSS growth at load)."""
    rate_per_s: float = 0.0
    estimated: frozenset[str] = frozenset()
    """Versions never measured: their size is the average of the measured ones."""

    @property
    def bytes(self) -> int:
        return sum(self.version_bytes.values())


@dataclass(frozen=True, slots=True)
class PlannedPool:
    name: str
    models: tuple[str, ...]
    bytes: int
    rate_per_s: float
    workers: int
    """ceil(rate / one worker's rate), at least one: every worker holds all the pool's models."""


@dataclass(frozen=True, slots=True)
class Plan:
    budget_bytes: int
    worker_rate_per_s: float
    pools: tuple[PlannedPool, ...]
    unplaced: tuple[str, ...] = ()
    """Models (or families) larger than one worker's budget: no pool can hold them."""
    placement: Mapping[str, str] = field(default_factory=dict)
    """Model to pool name."""


def plan(
    demands: Sequence[ModelDemand],
    *,
    budget_bytes: int,
    worker_rate_per_s: float,
    families: Mapping[str, Sequence[str]] | None = None,
    prefix: str = "pool",
    headroom: float = 0.05,
) -> Plan:
    """Pack models into the fewest pools whose models all fit one worker's memory budget (less
    `headroom`, as the workers keep it): first fit, largest first. A family's models (`families`,
    name to models) go in one pool together. Each pool gets the workers its summed rate needs."""
    if budget_bytes <= 0 or worker_rate_per_s <= 0:
        raise ValueError("the worker's budget and rate must be positive")
    limit = int(budget_bytes * (1 - headroom))
    by_model = {d.model: d for d in demands}
    units: list[tuple[str, list[ModelDemand]]] = []
    grouped: set[str] = set()
    for family, names in sorted((families or {}).items()):
        found = [by_model[m] for m in names if m in by_model and m not in grouped]
        grouped.update(d.model for d in found)
        if found:
            units.append((family, found))
    units += [(d.model, [d]) for d in demands if d.model not in grouped]
    units.sort(key=lambda unit: (-sum(d.bytes for d in unit[1]), unit[0]))

    bins: list[list[ModelDemand]] = []
    unplaced: list[str] = []
    for name, members in units:
        size = sum(d.bytes for d in members)
        if size > limit:
            unplaced.append(name)
            continue
        for placed in bins:
            if sum(d.bytes for d in placed) + size <= limit:
                placed.extend(members)
                break
        else:
            bins.append(list(members))

    pools = []
    placement: dict[str, str] = {}
    for index, members in enumerate(bins, start=1):
        name = f"{prefix}-{index}"
        rate = sum(d.rate_per_s for d in members)
        models = tuple(sorted(d.model for d in members))
        placement.update(dict.fromkeys(models, name))
        pools.append(
            PlannedPool(
                name,
                models,
                sum(d.bytes for d in members),
                rate,
                max(1, math.ceil(rate / worker_rate_per_s)),
            )
        )
    return Plan(budget_bytes, worker_rate_per_s, tuple(pools), tuple(unplaced), placement)
