"""The rules of the operator commands, as pure functions of a model's state.

Each function takes the state folded from the model's stream and the operator's arguments, and
either returns the event payload to append or refuses with an `InvalidTransitionError` (or
`ModelNotFoundError` for a model or version nobody registered). Nothing here reads a clock, a
database or a model: `tidegate.lifecycle.operations.commands` reads the state, calls a rule, and
appends what it returns with the state's sequence as the expected version, so a rule is judged on
exactly the state the append is conditional on.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime
from itertools import pairwise
from typing import Protocol

from tidegate.core.errors import (
    ConfigurationError,
    InvalidTransitionError,
    ModelNotFoundError,
    PromotionGateError,
)
from tidegate.core.pool_names import check_pool
from tidegate.lifecycle.domain import events as ev
from tidegate.lifecycle.domain.state import ModelState, VersionState, VersionStatus

__all__ = [
    "THRESHOLD_KEYS",
    "BacktestFacts",
    "GateResult",
    "canary",
    "check_weights",
    "evaluate_backtest",
    "evaluate_gate",
    "experiment",
    "fallback",
    "known_model",
    "known_version",
    "needs_gate",
    "pin",
    "place",
    "promote",
    "register",
    "retire",
    "rollback",
    "rollback_target",
    "rollback_window",
    "shadow_start",
    "shadow_stop",
    "unpin",
]

THRESHOLD_KEYS = (
    "max_error_rate",
    "max_error_rate_increase",
    "max_p99_ratio",
    "min_requests",
    "confidence_z",
    "min_latency_samples",
    "min_p99_gap_ms",
)


def known_model(state: ModelState) -> ModelState:
    if state.sequence == 0:
        raise ModelNotFoundError(f"no model {state.model!r} is registered")
    return state


def known_version(state: ModelState, version: str) -> VersionState:
    known_model(state)
    found = state.version(version)
    if found is None:
        raise ModelNotFoundError(f"model {state.model!r} has no version {version!r}")
    return found


def _servable(state: ModelState, version: str, action: str) -> VersionState:
    found = known_version(state, version)
    if not found.servable:
        why = f": {found.reason}" if found.reason else ""
        raise InvalidTransitionError(
            f"cannot {action} {state.model} version {version}: it is {found.status.value}{why}"
            " (only a validated version can take traffic)"
        )
    return found


def register(state: ModelState, version: str, sha256: Mapping[str, str]) -> str:
    """What registering this content as `version` takes: `register` (append `ModelRegistered`
    and validate), `validate` (the same content is registered but its validation was never
    recorded, e.g. the command was interrupted: validate only) or `unchanged` (a re-run is a
    no-op). A failed version may be registered again, fixed; any other version is immutable."""
    found = state.version(version)
    if found is None or found.status is VersionStatus.FAILED:
        return "register"
    if found.status is not VersionStatus.RETIRED and dict(found.sha256) == dict(sha256):
        return "validate" if found.status is VersionStatus.REGISTERED else "unchanged"
    raise InvalidTransitionError(
        f"{state.model} version {version} is already registered ({found.status.value}) with "
        "other content; versions are immutable, register a new version"
    )


def shadow_start(state: ModelState, version: str, sample_rate: float) -> ev.ShadowStarted:
    _servable(state, version, "shadow")
    if not 0.0 < sample_rate <= 1.0:
        raise InvalidTransitionError(f"sample rate must be in (0, 1], not {sample_rate}")
    if state.primary is None:
        raise InvalidTransitionError(
            f"{state.model} has no primary version to compare a shadow with; promote one first"
        )
    if state.primary == version:
        raise InvalidTransitionError(f"{state.model} version {version} is the primary")
    return ev.ShadowStarted(version, sample_rate)


def shadow_stop(state: ModelState, version: str, reason: str = "operator") -> ev.ShadowStopped:
    found = known_version(state, version)
    if found.shadow_rate is None:
        raise InvalidTransitionError(f"{state.model} version {version} is not being shadowed")
    return ev.ShadowStopped(version, reason)


def canary(
    state: ModelState,
    version: str,
    steps: list[int],
    dwell_s: float,
    thresholds: Mapping[str, float],
) -> ev.CanaryStarted:
    """Start a stepped shift from the primary to `version`; blue-green is `steps=[100]`."""
    _servable(state, version, "canary")
    if state.canary is not None:
        raise InvalidTransitionError(
            f"{state.model} already has a canary of version {state.canary.version} running; "
            "roll it back or let it finish first"
        )
    if state.primary is None:
        raise InvalidTransitionError(
            f"{state.model} has no primary to canary against; promote the first version instead"
        )
    if state.primary == version:
        raise InvalidTransitionError(f"{state.model} version {version} is already the primary")
    _check_steps(steps)
    if not math.isfinite(dwell_s) or dwell_s <= 0:
        raise InvalidTransitionError(f"dwell must be a positive number of seconds, not {dwell_s}")
    odd = sorted(k for k, v in thresholds.items() if not math.isfinite(v))
    if odd:
        raise InvalidTransitionError(f"thresholds must be finite numbers: {odd}")
    unknown = sorted(set(thresholds) - set(THRESHOLD_KEYS))
    if unknown:
        raise InvalidTransitionError(f"unknown thresholds {unknown}; known: {list(THRESHOLD_KEYS)}")
    negative = sorted(k for k, v in thresholds.items() if v < 0)
    if negative:
        raise InvalidTransitionError(f"thresholds must not be negative: {negative}")
    return ev.CanaryStarted(
        version, list(steps), float(dwell_s), dict(thresholds), baseline=state.primary
    )


def _check_steps(steps: list[int]) -> None:
    if not steps:
        raise InvalidTransitionError("a canary needs at least one step")
    if any(not 0 < s <= 100 for s in steps):
        raise InvalidTransitionError(f"canary steps are percentages in 1..100, not {steps}")
    if any(b <= a for a, b in pairwise(steps)):
        raise InvalidTransitionError(f"canary steps must increase, not {steps}")
    if steps[-1] != 100:
        raise InvalidTransitionError(f"the last canary step must be 100, not {steps[-1]}")


@dataclass(frozen=True, slots=True)
class GateResult:
    """The promotion gate's verdict on a candidate's shadow comparisons (or its backtest)."""

    passed: bool
    metric: str
    """`agreement` (classifiers), `cosine` (embeddings), `max_abs_diff` (a backtest of any other
    model) or `none` (no comparison yet)."""
    value: float | None
    samples: int
    reason: str


def evaluate_gate(
    agreement: float | None,
    mean_cosine: float | None,
    samples: int,
    *,
    min_agreement: float,
    min_samples: int,
) -> GateResult:
    """Classifiers are judged on class agreement, embeddings on mean cosine similarity; too
    few samples fail the gate whatever they say, since a handful can agree by chance."""
    metric, value = ("agreement", agreement) if agreement is not None else ("cosine", mean_cosine)
    if value is None:
        metric = "none"
    if samples < min_samples or value is None:
        reason = f"{samples} shadow comparisons, fewer than the {min_samples} the gate needs"
        return GateResult(False, metric, value, samples, reason)
    if value < min_agreement:
        reason = f"shadow {metric} {value:.4f} is below the gate {min_agreement:.4f}"
        return GateResult(False, metric, value, samples, reason)
    reason = f"shadow {metric} {value:.4f} >= {min_agreement:.4f} over {samples} comparisons"
    return GateResult(True, metric, value, samples, reason)


class BacktestFacts(Protocol):
    """What the backtest gate reads of a recorded backtest (`readmodels.backtests` has them)."""

    @property
    def created_at(self) -> datetime: ...
    @property
    def baseline_versions(self) -> Sequence[str]: ...
    @property
    def rows_compared(self) -> int: ...
    @property
    def agreement(self) -> float | None: ...
    @property
    def mean_cosine(self) -> float | None: ...
    @property
    def max_abs_diff(self) -> float | None: ...
    @property
    def error_rate(self) -> float: ...


def evaluate_backtest(
    found: BacktestFacts | None,
    *,
    primary: str | None,
    now: datetime,
    min_agreement: float,
    min_rows: int,
    max_age_h: float,
    max_error_rate: float,
    max_abs_diff: float | None,
) -> GateResult:
    """The backtest gate, on the candidate's latest backtest: recent, against the primary it
    would replace (results another version served say nothing about replacing this one), on
    enough rows, with few enough candidate errors, agreeing like the shadow gate demands, and
    within `max_abs_diff` when that is set. A model whose outputs are neither classes nor
    embeddings has only `max_abs_diff` to be judged by, so without it such a backtest fails."""
    if found is None:
        return GateResult(False, "none", None, 0, "no backtest of the candidate is recorded")
    rows = found.rows_compared
    metric, value = ("agreement", found.agreement)
    if value is None:
        metric, value = ("cosine", found.mean_cosine)
    age_h = (now - found.created_at).total_seconds() / 3600

    def fail(reason: str) -> GateResult:
        return GateResult(False, metric if value is not None else "none", value, rows, reason)

    if age_h > max_age_h:
        return fail(f"the latest backtest is {age_h:.1f} h old, older than {max_age_h:g} h")
    if primary is not None and primary not in found.baseline_versions:
        served = ", ".join(found.baseline_versions) or "no version"
        return fail(f"the latest backtest compared with {served}, not the primary {primary}")
    if rows < min_rows:
        return fail(f"the latest backtest compared {rows} rows, fewer than {min_rows}")
    if found.error_rate > max_error_rate:
        return fail(f"backtest error rate {found.error_rate:.4f} exceeds {max_error_rate:.4f}")
    if value is not None and value < min_agreement:
        return fail(f"backtest {metric} {value:.4f} is below the gate {min_agreement:.4f}")
    if max_abs_diff is not None:
        worst = found.max_abs_diff
        if worst is None or not worst <= max_abs_diff:
            return fail(f"backtest max abs diff {worst} exceeds {max_abs_diff:g}")
        if value is None:
            metric, value = "max_abs_diff", worst
    if value is None:
        return fail("the backtest has no agreement or cosine to judge; set a max abs diff")
    reason = f"backtest {metric} {value:.4f} passes over {rows} rows"
    return GateResult(True, metric, value, rows, reason)


def needs_gate(state: ModelState, version: str) -> bool:
    """Only a version replacing a primary is gated: the first version has nothing to agree with."""
    return state.primary is not None and state.primary != version


def promote(
    state: ModelState,
    version: str,
    gate: GateResult | None,
    *,
    force: bool,
    backtest: GateResult | None = None,
) -> ev.Promoted:
    """All traffic to `version`. `forced` is recorded only when `force` overrode a failed gate,
    the shadow gate or the backtest gate (`backtest`, when one is required).

    Promoting a version no worker has warmed is allowed: the routing table keeps sending its
    traffic to the previous primary until workers report it loaded (warm before route).
    The first version has no traffic to protect, so it needs no gate.
    """
    _servable(state, version, "promote")
    if state.primary == version:
        raise InvalidTransitionError(f"{state.model} version {version} is already the primary")
    if state.canary is not None and state.canary.version != version:
        raise InvalidTransitionError(
            f"{state.model} has a canary of version {state.canary.version} running; roll it "
            "back before promoting another version"
        )
    if not needs_gate(state, version):
        return ev.Promoted(version, forced=False, previous=None, agreement=None)
    if state.previous_primary is not None and not _primary_ready(state):
        # Another promotion would drop the only warm fallback, the previous primary.
        raise InvalidTransitionError(
            f"{state.model} is still warming up its new primary {state.primary}; promote again "
            "once a worker has loaded it"
        )
    if gate is None:
        raise InvalidTransitionError(f"promoting {state.model} {version} needs a gate verdict")
    failed = [g.reason for g in (gate, backtest) if g is not None and not g.passed]
    if failed and not force:
        raise PromotionGateError(
            f"refusing to promote {state.model} version {version}: {'; '.join(failed)}; "
            "use --force to promote anyway (the event records it)"
        )
    return ev.Promoted(version, forced=bool(failed), previous=state.primary, agreement=gate.value)


def rollback_target(state: ModelState) -> tuple[str, str]:
    """(version rolled back, version traffic returns to): a running canary goes back to its
    baseline; otherwise the primary goes back to the previous primary."""
    known_model(state)
    if state.canary is not None:
        if state.canary.baseline is None:
            raise InvalidTransitionError(f"{state.model}'s canary has no baseline to return to")
        return state.canary.version, state.canary.baseline
    if state.primary is None or state.previous_primary is None:
        raise InvalidTransitionError(
            f"{state.model} has nothing to roll back: no canary runs and no earlier primary"
        )
    return state.primary, state.previous_primary


def rollback_window(state: ModelState, events: Sequence[ev.RecordedEvent]) -> datetime | None:
    """Since when the live metrics of a rollback count: the canary's start, or the promotion
    of the primary being rolled back (None: all of its results)."""
    if state.canary is not None:
        return state.canary.started_at
    for event in reversed(events):
        if isinstance(event.payload, ev.Promoted) and event.payload.version == state.primary:
            return event.occurred_at
    return None


def rollback(
    state: ModelState,
    version: str | None = None,
    metrics: Mapping[str, float] | None = None,
    reason: str = "operator",
) -> ev.RolledBack:
    current, target = rollback_target(state)
    if version is not None and version != current:
        raise InvalidTransitionError(
            f"{state.model} would roll back version {current}, not {version}"
        )
    _servable(state, target, "roll back to")
    return ev.RolledBack(current, reason, dict(metrics or {}), to_version=target)


def _primary_ready(state: ModelState) -> bool:
    primary = state.version(state.primary) if state.primary else None
    return primary is not None and primary.ready


def retire(state: ModelState, version: str) -> ev.Retired:
    found = known_version(state, version)
    if found.status is VersionStatus.RETIRED:
        raise InvalidTransitionError(f"{state.model} version {version} is already retired")
    if state.primary == version:
        raise InvalidTransitionError(
            f"{state.model} version {version} is the primary; promote another version first"
        )
    if found.weight > 0:
        raise InvalidTransitionError(
            f"{state.model} version {version} takes {found.weight}% of the traffic"
        )
    if version == state.previous_primary and not _primary_ready(state):
        raise InvalidTransitionError(
            f"{state.model} version {version} serves while the new primary {state.primary} "
            "warms up; retire it once a worker has loaded the primary"
        )
    if state.canary is not None and version in (state.canary.version, state.canary.baseline):
        raise InvalidTransitionError(f"{state.model} version {version} is in a running canary")
    rules = [r.rule_id for r in state.rules if r.version == version or version in dict(r.weights)]
    if rules:
        raise InvalidTransitionError(
            f"{state.model} version {version} is used by routing rules {rules}; unpin them first"
        )
    return ev.Retired(version)


def pin(state: ModelState, rule_id: str, tenant: str, version: str) -> ev.RoutingRuleSet:
    if not tenant:
        raise InvalidTransitionError("a pin needs a tenant (promote to move everyone)")
    _check_rule_id(rule_id)
    _servable(state, version, "pin")
    return ev.RoutingRuleSet(rule_id, tenant=tenant, version=version)


def unpin(state: ModelState, rule_id: str) -> ev.RoutingRuleSet:
    """Clear a pin or an experiment: a rule with neither version nor weights removes it."""
    known_model(state)
    if all(r.rule_id != rule_id for r in state.rules):
        raise InvalidTransitionError(f"{state.model} has no routing rule {rule_id!r}")
    return ev.RoutingRuleSet(rule_id)


def experiment(
    state: ModelState, rule_id: str, tenant: str | None, weights: Mapping[str, int]
) -> ev.RoutingRuleSet:
    _check_rule_id(rule_id)
    check_weights(weights)
    for version in weights:
        _servable(state, version, "route an experiment to")
    return ev.RoutingRuleSet(rule_id, tenant=tenant or None, weights=dict(weights))


def check_weights(weights: Mapping[str, int]) -> None:
    if not weights:
        raise InvalidTransitionError("an experiment needs at least one version and weight")
    bad = {v: w for v, w in weights.items() if not isinstance(w, int) or not 0 <= w <= 100}
    if bad:
        raise InvalidTransitionError(f"weights are integer percentages in 0..100, not {bad}")
    total = sum(weights.values())
    if total != 100:
        raise InvalidTransitionError(f"weights must sum to 100, not {total}")


def _check_rule_id(rule_id: str) -> None:
    if not rule_id or len(rule_id) > 128:
        raise InvalidTransitionError(f"a rule id is 1 to 128 characters, not {rule_id!r}")


def fallback(
    state: ModelState, target: ModelState | None, reason: str = "operator"
) -> ev.FallbackSet:
    """Declare `target` the model's fallback, or clear it (`target` None). The fallback must be
    a registered model with a primary, since workers serve a fallback by its primary's split;
    it is one hop only (a fallback's own fallback is never followed), so a cycle is harmless."""
    known_model(state)
    if target is None:
        if state.fallback_model is None:
            raise InvalidTransitionError(f"{state.model} has no fallback to clear")
        return ev.FallbackSet(None, reason)
    if target.sequence == 0:
        # The command's model exists; the one it names is an invalid argument, not a 404.
        raise InvalidTransitionError(
            f"{target.model} is not a registered model, so it cannot be {state.model}'s fallback"
        )
    if target.model == state.model:
        raise InvalidTransitionError(f"{state.model} cannot be its own fallback")
    if target.primary is None:
        raise InvalidTransitionError(
            f"{target.model} has no primary version to serve as {state.model}'s fallback; "
            "promote one first"
        )
    if state.fallback_model == target.model:
        raise InvalidTransitionError(f"{target.model} is already {state.model}'s fallback")
    return ev.FallbackSet(target.model, reason)


def place(state: ModelState, pool: str | None, reason: str = "operator") -> ev.PoolAssigned:
    """Place the model in `pool` (None: back in the default pool). Its requests then go to the
    pool's topics, where only that pool's workers read them; the pool's topics must exist, which
    the command checks (`tidegate pools declare` creates them)."""
    known_model(state)
    if pool is not None:
        try:
            check_pool(pool)
        except ConfigurationError as exc:
            raise InvalidTransitionError(str(exc)) from None
    if state.pool == pool:
        where = f"pool {pool}" if pool is not None else "the default pool"
        raise InvalidTransitionError(f"{state.model} is already in {where}")
    return ev.PoolAssigned(pool, reason)
