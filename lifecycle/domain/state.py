"""A model's state, folded from its events alone.

`fold` is the one definition of what the events mean: the PostgreSQL projections, the workers'
routing tables, `models state --at` and the canary controller all call it, so they cannot drift.
It is pure: the same events give the same state, whoever folds them and whenever.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterable
from dataclasses import dataclass
from datetime import datetime
from enum import StrEnum

from tidegate.core.pool_names import DEFAULT_POOL
from tidegate.lifecycle.domain import events as ev

__all__ = [
    "CanaryState",
    "ModelState",
    "Rule",
    "VersionState",
    "VersionStatus",
    "apply",
    "fold",
]


class VersionStatus(StrEnum):
    REGISTERED = "registered"
    VALIDATED = "validated"
    FAILED = "failed"
    RETIRED = "retired"


@dataclass(frozen=True, slots=True)
class VersionState:
    version: str
    status: VersionStatus
    registered_at: datetime
    runtime: str = ""
    artifact_uri: str = ""
    sha256: tuple[tuple[str, str], ...] = ()
    registered_by: str = "system"
    signature_json: str = "{}"
    """The V2 signature the version was registered with (`ModelRegistered.signature_json`): what
    the gateway checks requests against, so it never reads the artifact store."""
    weight: int = 0
    shadow_rate: float | None = None
    loaded_on: frozenset[str] = frozenset()
    loaded_in: frozenset[tuple[str, str]] = frozenset()
    """(worker, pool) for each worker that has it loaded; the default pool is `DEFAULT_POOL`."""
    load_ms: float | None = None
    """How long the latest worker load of the version took (`VersionLoaded.load_ms`): what a
    new worker of its pool waits before it serves it."""
    reason: str = ""
    updated_at: datetime | None = None

    @property
    def servable(self) -> bool:
        """Validated and not retired: may take traffic (and be asked for explicitly)."""
        return self.status is VersionStatus.VALIDATED

    @property
    def ready(self) -> bool:
        """At least one worker reported it loaded and warmed up."""
        return bool(self.loaded_on)


@dataclass(frozen=True, slots=True)
class Rule:
    """A tenant pin (`version`) or an experiment (`weights`), for `tenant` or, if None, everyone."""

    rule_id: str
    tenant: str | None
    version: str | None
    weights: tuple[tuple[str, int], ...] = ()

    @property
    def kind(self) -> str:
        return "pin" if self.version is not None else "experiment"


@dataclass(frozen=True, slots=True)
class CanaryState:
    version: str
    baseline: str | None
    steps: tuple[int, ...]
    dwell_s: float
    thresholds: tuple[tuple[str, float], ...]
    started_at: datetime
    step: int = -1
    """Index into `steps` of the weight now in force; -1 while waiting for the version to warm."""
    step_at: datetime | None = None


@dataclass(frozen=True, slots=True)
class ModelState:
    model: str
    sequence: int = 0
    """The stream version: the sequence of the last event folded in (0 for no events)."""
    versions: tuple[VersionState, ...] = ()
    primary: str | None = None
    previous_primary: str | None = None
    canary: CanaryState | None = None
    rules: tuple[Rule, ...] = ()
    updated_at: datetime | None = None
    fallback_model: str | None = None
    """The declared fallback model (`FallbackSet`): it serves while this model's breaker is
    open. Not to be confused with `fallback()`, the version an unwarmed version's share goes to."""
    pool: str | None = None
    """The pool the model is placed in (`PoolAssigned`); None is the default pool."""

    def version(self, name: str) -> VersionState | None:
        for v in self.versions:
            if v.version == name:
                return v
        return None

    def intended_weights(self) -> dict[str, int]:
        return {v.version: v.weight for v in self.versions if v.weight > 0}

    def fallback(self) -> str | None:
        """Where the share of an unwarmed version goes: the primary once some worker reported it
        warm, else the previous primary (a promotion waits for the new primary to warm up)."""
        for name in (self.primary, self.previous_primary):
            state = self.version(name) if name else None
            if state is not None and state.ready and state.servable:
                return state.version
        return None

    def effective_weights(self) -> dict[str, int]:
        """The intended weights, with the share of every version no worker has reported warm
        given to the fallback: no weight reaches a version before it is loaded."""
        weights = self.intended_weights()
        fallback = self.fallback()
        if fallback is None:
            return weights
        out: dict[str, int] = {}
        for name, weight in weights.items():
            state = self.version(name)
            ready = state is not None and state.ready and state.servable
            target = name if ready else fallback
            out[target] = out.get(target, 0) + weight
        return out

    def shadows(self) -> dict[str, float]:
        return {
            v.version: v.shadow_rate
            for v in self.versions
            if v.shadow_rate is not None and v.servable
        }

    def warm_in(self, pool: str | None) -> bool:
        """Whether a worker of `pool` (None: the default pool) has every version that takes
        traffic loaded: a model moving there may take its requests without a cold load."""
        name = pool or DEFAULT_POOL
        taking = self.intended_weights()
        return all(
            any(p == name for _, p in v.loaded_in) for v in self.versions if v.version in taking
        )

    def wanted(self) -> frozenset[str]:
        """The versions workers keep loaded: any with weight, shadowed, canaried or in a rule,
        and the previous primary, so that a rollback lands on a warm version."""
        names = set(self.intended_weights()) | set(self.shadows())
        names.update(n for n in (self.primary, self.previous_primary) if n)
        if self.canary is not None:
            names.add(self.canary.version)
        for rule in self.rules:
            if rule.version:
                names.add(rule.version)
            names.update(n for n, w in rule.weights if w > 0)
        return frozenset(n for n in names if (s := self.version(n)) is not None and s.servable)


def fold(model: str, events: Iterable[ev.RecordedEvent]) -> ModelState:
    state = ModelState(model)
    for event in events:
        state = apply(state, event)
    return state


def apply(state: ModelState, event: ev.RecordedEvent) -> ModelState:
    """The state after one more event. Events at or below the state's sequence are duplicates
    (an outbox republish) and change nothing."""
    if event.sequence <= state.sequence:
        return state
    new = _apply(state, event.payload, event)
    return dataclasses.replace(new, sequence=event.sequence, updated_at=event.occurred_at)


def _apply(s: ModelState, p: ev.Payload, e: ev.RecordedEvent) -> ModelState:
    at = e.occurred_at
    if isinstance(p, ev.ModelRegistered):
        version = VersionState(
            p.version,
            VersionStatus.REGISTERED,
            registered_at=at,
            runtime=p.runtime,
            artifact_uri=p.artifact_uri,
            sha256=tuple(sorted(p.sha256.items())),
            registered_by=e.actor,
            signature_json=p.signature_json,
            updated_at=at,
        )
        return _put(s, version)
    if isinstance(p, ev.ArtifactValidated):
        return _update(s, p.version, at, status=VersionStatus.VALIDATED, reason="")
    if isinstance(p, ev.ValidationFailed):
        s = _update(s, p.version, at, status=VersionStatus.FAILED, reason=p.reason)
        return _update(s, p.version, at, weight=0, shadow_rate=None)
    if isinstance(p, ev.ShadowStarted):
        return _update(s, p.version, at, shadow_rate=p.sample_rate)
    if isinstance(p, ev.ShadowStopped):
        return _update(s, p.version, at, shadow_rate=None)
    if isinstance(p, ev.CanaryStarted):
        canary = CanaryState(
            p.version,
            p.baseline or s.primary,
            tuple(p.steps),
            p.dwell_s,
            tuple(sorted(p.thresholds.items())),
            started_at=at,
        )
        # A candidate taking live traffic is no longer shadowed: copies of the baseline's
        # requests would queue on its compute ahead of its own canary requests.
        s = _update(s, p.version, at, shadow_rate=None)
        return dataclasses.replace(s, canary=canary)
    if isinstance(p, ev.TrafficShifted):
        s = _weights(s, p.weights, at)
        if s.canary is not None:
            share = p.weights.get(s.canary.version, 0)
            if share in s.canary.steps:
                canary = dataclasses.replace(s.canary, step=s.canary.steps.index(share), step_at=at)
                s = dataclasses.replace(s, canary=canary)
        return s
    if isinstance(p, ev.Promoted):
        previous = s.primary if s.primary != p.version else s.previous_primary
        s = _weights(s, {p.version: 100}, at)
        s = _update(s, p.version, at, shadow_rate=None)
        return dataclasses.replace(s, primary=p.version, previous_primary=previous, canary=None)
    if isinstance(p, ev.RolledBack):
        target = p.to_version or (s.canary.baseline if s.canary else None) or s.previous_primary
        left = s.canary if s.canary is None or s.canary.version != p.version else None
        primary, previous = s.primary, s.previous_primary
        if target is not None:
            s = _weights(s, {target: 100}, at)
            if primary == p.version:
                primary, previous = target, None
        s = _update(s, p.version, at, shadow_rate=None)
        return dataclasses.replace(s, canary=left, primary=primary, previous_primary=previous)
    if isinstance(p, ev.Retired):
        s = _update(s, p.version, at, status=VersionStatus.RETIRED, weight=0, shadow_rate=None)
        kept = None if s.canary and s.canary.version == p.version else s.canary
        previous = None if s.previous_primary == p.version else s.previous_primary
        primary = None if s.primary == p.version else s.primary
        return dataclasses.replace(s, canary=kept, previous_primary=previous, primary=primary)
    if isinstance(p, ev.RoutingRuleSet):
        rules = [r for r in s.rules if r.rule_id != p.rule_id]
        if p.version is not None or p.weights:
            weights = tuple(sorted((k, int(w)) for k, w in p.weights.items()))
            rules.append(Rule(p.rule_id, p.tenant, p.version, () if p.version else weights))
        return dataclasses.replace(s, rules=tuple(sorted(rules, key=lambda r: r.rule_id)))
    if isinstance(p, ev.FallbackSet):
        return dataclasses.replace(s, fallback_model=p.fallback)
    if isinstance(p, ev.PoolAssigned):
        return dataclasses.replace(s, pool=p.pool)
    if isinstance(p, ev.VersionLoaded):
        current = s.version(p.version)
        if current is None:
            return s
        loaded_on = current.loaded_on | {p.worker_id}
        loaded_in = current.loaded_in | {(p.worker_id, p.pool or DEFAULT_POOL)}
        return _update(
            s, p.version, at, loaded_on=loaded_on, loaded_in=loaded_in, load_ms=p.load_ms
        )
    if isinstance(p, ev.VersionUnloaded):
        current = s.version(p.version)
        if current is None:
            return s
        loaded_in = frozenset(w for w in current.loaded_in if w[0] != p.worker_id)
        loaded_on = current.loaded_on - {p.worker_id}
        return _update(s, p.version, at, loaded_on=loaded_on, loaded_in=loaded_in)
    return s


def _put(s: ModelState, version: VersionState) -> ModelState:
    others = [v for v in s.versions if v.version != version.version]
    return dataclasses.replace(s, versions=(*others, version))


def _update(s: ModelState, name: str, at: datetime, **changes: object) -> ModelState:
    current = s.version(name)
    if current is None:
        return s  # an event about an unknown version: the command layer never appends one
    return _put_in_place(s, dataclasses.replace(current, updated_at=at, **changes))  # type: ignore[arg-type]


def _put_in_place(s: ModelState, version: VersionState) -> ModelState:
    versions = tuple(version if v.version == version.version else v for v in s.versions)
    return dataclasses.replace(s, versions=versions)


def _weights(s: ModelState, weights: dict[str, int], at: datetime) -> ModelState:
    versions = []
    for v in s.versions:
        weight = int(weights.get(v.version, 0)) if v.servable else 0
        versions.append(
            v if v.weight == weight else dataclasses.replace(v, weight=weight, updated_at=at)
        )
    return dataclasses.replace(s, versions=tuple(versions))
