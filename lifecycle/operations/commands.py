"""The operator commands of the model lifecycle, shared by `tidegate models ...` and `/admin`.

Every write reads the model's state, asks a pure rule of `tidegate.lifecycle.domain.decide` for the
events, and appends them with the sequence it read as the expected version: if anyone changed the
model in between, the append fails with `ConcurrencyConflictError` and nothing is written. There is
no silent retry: the operator decided on a state that no longer holds, so the operator decides
again. `expected_sequence` lets a caller pin that state explicitly (the sequence shown by `status`),
like an HTTP If-Match.
"""

from __future__ import annotations

import dataclasses
import uuid
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any, Protocol

from psycopg_pool import AsyncConnectionPool

from tidegate.core.errors import ConcurrencyConflictError
from tidegate.lifecycle.domain import decide
from tidegate.lifecycle.domain import events as ev
from tidegate.lifecycle.domain.placement import ModelDemand
from tidegate.lifecycle.domain.render import event_view, state_view
from tidegate.lifecycle.domain.state import ModelState, VersionStatus, apply, fold
from tidegate.lifecycle.eventstore.event_store import EventStore
from tidegate.lifecycle.lifecycle_settings import LifecycleSettings
from tidegate.lifecycle.operations import register
from tidegate.lifecycle.readmodels import demand, lineage
from tidegate.lifecycle.readmodels.backtests import latest_backtest
from tidegate.lifecycle.readmodels.lookups import live_metrics, served_view
from tidegate.models.model_settings import ModelSettings
from tidegate.models.store import LocalArtifactStore

__all__ = ["Appender", "CommandResult", "LifecycleCommands", "RegisterResult"]


class Appender(Protocol):
    """What writes events: `tidegate.lifecycle.eventstore.lifecycle_log.LifecycleLog` (store +
    outbox relay)."""

    async def append(
        self, stream: str, events: Sequence[ev.NewEvent], *, expected_version: int | None
    ) -> list[ev.RecordedEvent]: ...


@dataclass(frozen=True)
class CommandResult:
    """The model's state after the command, and the events it appended (none for a no-op)."""

    state: ModelState
    events: list[ev.RecordedEvent] = field(default_factory=list)
    gate: decide.GateResult | None = None
    backtest: decide.GateResult | None = None
    """The backtest gate's verdict, when `require_backtest` asked for one."""

    def to_dict(self) -> dict[str, Any]:
        return {
            "model": self.state.model,
            "events": [event_view(e) for e in self.events],
            "state": state_view(self.state),
            "gate": dataclasses.asdict(self.gate) if self.gate else None,
            "backtest": dataclasses.asdict(self.backtest) if self.backtest else None,
        }


@dataclass(frozen=True)
class RegisterResult(CommandResult):
    action: str = "registered"
    """`registered`, `validated` (registered before, validated now) or `unchanged` (the same
    content was already registered and validated)."""
    version: str = ""

    def to_dict(self) -> dict[str, Any]:
        found = self.state.version(self.version)
        return {
            **super().to_dict(),
            "action": self.action,
            "version": self.version,
            "status": found.status.value if found else None,
            "reason": found.reason if found else None,
        }


Rule = Callable[[ModelState], ev.Payload]


_REDECIDE_ATTEMPTS = 3
_WORKER_REPORTS = (ev.VersionLoaded, ev.VersionUnloaded)


class LifecycleCommands:
    """One object per process (CLI run or gateway); cheap, holds no state of its own."""

    def __init__(
        self,
        log: Appender,
        pool: AsyncConnectionPool[Any],
        store: LocalArtifactStore,
        settings: LifecycleSettings,
        *,
        models: ModelSettings | None = None,
        events: EventStore | None = None,
    ) -> None:
        self.log = log
        self.pool = pool
        self.store = store
        self.settings = settings
        self.model_settings = models or ModelSettings()
        self.events = events or EventStore(pool)

    # -- writes -------------------------------------------------------------------------------

    async def register(
        self,
        path: Path,
        *,
        actor: str,
        name: str | None = None,
        version: str | None = None,
        expected_sequence: int | None = None,
        root: Path | None = None,
    ) -> RegisterResult:
        """Import the package at `path`, append `ModelRegistered`, then validate it (load and
        warm-up) and append `ArtifactValidated` or `ValidationFailed`. With `root`, only a
        package under it (links resolved) is read (`register.confined`)."""
        if root is not None:
            path = register.confined(root, path)
        manifest = register.read_package(path, name, version)
        if root is not None:
            register.check_confined(root, path, manifest)
        model, ver = manifest.name, manifest.version
        imported = await register.import_package(self.store, path, manifest)
        state = await self._read(model, expected_sequence)
        action = decide.register(state, ver, imported.manifest.files)
        if action == "unchanged":
            return RegisterResult(state, action=action, version=ver)
        correlation = uuid.uuid4()
        first: list[ev.RecordedEvent] = []
        if action == "register":
            first = await self._append(state, [imported.registered()], actor, correlation)
        if imported.failure is not None:
            outcome: ev.Payload = ev.ValidationFailed(ver, imported.failure)
        else:
            outcome = await register.validate(self.store, model, ver, self.model_settings)
        # Validation took a while: judge the append on the state as it is now, not as it was.
        state = await self.events.load(model)
        found = state.version(ver)
        if found is None or found.status is not VersionStatus.REGISTERED:
            # Someone else recorded the outcome meanwhile: nothing more to append.
            return RegisterResult(state, first, action=_done_by(first), version=ver)
        cause = first[-1].event_id if first else None
        second = await self._append(state, [outcome], actor, correlation, cause)
        after = _after(state, second)
        return RegisterResult(after, first + second, action=_done_by(first, second), version=ver)

    async def shadow(
        self,
        model: str,
        version: str,
        *,
        actor: str,
        sample_rate: float = 1.0,
        stop: bool = False,
        expected_sequence: int | None = None,
    ) -> CommandResult:
        def rule(s: ModelState) -> ev.Payload:
            if stop:
                return decide.shadow_stop(s, version)
            return decide.shadow_start(s, version, sample_rate)

        return await self._command(model, rule, actor, expected_sequence)

    async def canary(
        self,
        model: str,
        version: str,
        *,
        actor: str,
        steps: Sequence[int] | None = None,
        dwell_s: float | None = None,
        thresholds: Mapping[str, float] | None = None,
        expected_sequence: int | None = None,
    ) -> CommandResult:
        """A stepped rollout the controller drives; `steps=[100]` is blue-green."""
        s = self.settings
        merged = {
            "max_error_rate": s.canary_max_error_rate,
            "max_error_rate_increase": s.canary_max_error_rate_increase,
            "max_p99_ratio": s.canary_max_p99_ratio,
            "min_requests": float(s.canary_min_requests),
            **(thresholds or {}),
        }
        chosen_steps = list(steps if steps is not None else s.canary_steps)
        dwell = dwell_s if dwell_s is not None else s.canary_dwell_s

        def rule(state: ModelState) -> ev.Payload:
            return decide.canary(state, version, chosen_steps, dwell, merged)

        return await self._command(model, rule, actor, expected_sequence)

    async def promote(
        self,
        model: str,
        version: str,
        *,
        actor: str,
        force: bool = False,
        expected_sequence: int | None = None,
    ) -> CommandResult:
        state = await self._read(model, expected_sequence)
        gate = backtest = None
        if state.sequence and decide.needs_gate(state, version):
            gate = await self.gate(model, version)
            if self.settings.require_backtest:
                backtest = await self.backtest_gate(model, version, state.primary)
        state, recorded = await self._decide_and_append(
            state,
            lambda s: [decide.promote(s, version, gate, force=force, backtest=backtest)],
            actor,
            expected_sequence,
        )
        return CommandResult(_after(state, recorded), recorded, gate, backtest)

    async def rollback(
        self,
        model: str,
        *,
        actor: str,
        version: str | None = None,
        expected_sequence: int | None = None,
    ) -> CommandResult:
        """Abort a running canary back to its baseline, or return from the current primary to
        the previous one; the event carries the versions' live metrics when there are any."""
        history = await self.events.read(model)
        state = self._check(fold(model, history), expected_sequence)
        current, target = decide.rollback_target(state)
        since = decide.rollback_window(state, history)
        metrics = await live_metrics(self.pool, model, current, target, since)
        payload = decide.rollback(state, version, metrics)
        recorded = await self._append(state, [payload], actor)
        return CommandResult(_after(state, recorded), recorded)

    async def retire(
        self, model: str, version: str, *, actor: str, expected_sequence: int | None = None
    ) -> CommandResult:
        return await self._command(
            model, lambda s: decide.retire(s, version), actor, expected_sequence
        )

    async def pin(
        self,
        model: str,
        tenant: str,
        version: str,
        *,
        actor: str,
        rule_id: str | None = None,
        expected_sequence: int | None = None,
    ) -> CommandResult:
        rid = rule_id or f"pin-{tenant}"
        return await self._command(
            model, lambda s: decide.pin(s, rid, tenant, version), actor, expected_sequence
        )

    async def unpin(
        self, model: str, rule_id: str, *, actor: str, expected_sequence: int | None = None
    ) -> CommandResult:
        return await self._command(
            model, lambda s: decide.unpin(s, rule_id), actor, expected_sequence
        )

    async def experiment(
        self,
        model: str,
        weights: Mapping[str, int],
        *,
        actor: str,
        tenant: str | None = None,
        rule_id: str | None = None,
        expected_sequence: int | None = None,
    ) -> CommandResult:
        rid = rule_id or f"experiment-{tenant or 'all'}"
        return await self._command(
            model,
            lambda s: decide.experiment(s, rid, tenant, weights),
            actor,
            expected_sequence,
        )

    async def fallback(
        self,
        model: str,
        fallback: str | None,
        *,
        actor: str,
        reason: str = "operator",
        expected_sequence: int | None = None,
    ) -> CommandResult:
        """Declare (or, with None, clear) the model's fallback model. Only the model's stream
        is appended to: the fallback's state is read to check it can serve, not locked."""
        target = await self.events.load(fallback) if fallback is not None else None
        return await self._command(
            model, lambda s: decide.fallback(s, target, reason), actor, expected_sequence
        )

    async def place(
        self,
        model: str,
        pool: str | None,
        *,
        actor: str,
        reason: str = "operator",
        expected_sequence: int | None = None,
    ) -> CommandResult:
        """Place the model in `pool` (None: the default pool). The caller checks that the
        pool's topics exist (`tidegate.core.pools.missing_topics`): this layer has no Kafka."""
        return await self._command(
            model, lambda s: decide.place(s, pool, reason), actor, expected_sequence
        )

    # -- reads --------------------------------------------------------------------------------

    async def demands(self, window: timedelta) -> list[ModelDemand]:
        """What each model needs of a worker: its versions' measured memory, its recent rate."""
        return await demand.demands(self.events, self.pool, window=window)

    async def models(self) -> list[ModelState]:
        return [await self.events.load(stream) for stream in sorted(await self.events.streams())]

    async def status(self, model: str) -> ModelState:
        return decide.known_model(await self.events.load(model))

    async def history(self, model: str) -> list[ev.RecordedEvent]:
        events = await self.events.read(model)
        if not events:
            decide.known_model(ModelState(model))
        return events

    async def state(self, model: str, at: datetime | None = None) -> ModelState:
        """The model as it was at `at` (its events up to then, folded): time travel."""
        known = await self.status(model)
        return known if at is None else await self.events.load(model, until=at)

    async def gate(self, model: str, candidate: str) -> decide.GateResult:
        """The promotion gate's verdict on the candidate's shadow comparisons."""
        gate: dict[str, Any] = (await self.compare(model, candidate))["gate"]
        return decide.GateResult(**gate)

    async def backtest_gate(
        self, model: str, candidate: str, primary: str | None
    ) -> decide.GateResult:
        """The backtest gate's verdict on the candidate's latest recorded backtest."""
        s = self.settings
        return decide.evaluate_backtest(
            await latest_backtest(self.pool, model, candidate),
            primary=primary,
            now=datetime.now(UTC),
            min_agreement=s.backtest_min_agreement,
            min_rows=s.backtest_min_rows,
            max_age_h=s.backtest_max_age_h,
            max_error_rate=s.backtest_max_error_rate,
            max_abs_diff=s.backtest_max_abs_diff,
        )

    async def compare(self, model: str, candidate: str) -> dict[str, Any]:
        """The candidate's shadow comparison stats of its latest shadow run, against the current
        primary (comparisons from an earlier run or with an earlier primary say nothing about
        the candidate as it would replace this one now), and the promotion gate's verdict."""
        history = await self.history(model)
        state = fold(model, history)
        decide.known_version(state, candidate)
        started = [
            e.occurred_at
            for e in history
            if isinstance(e.payload, ev.ShadowStarted) and e.payload.version == candidate
        ]
        stats = await lineage.shadow_stats(
            self.pool, model, candidate, primary=state.primary, since=max(started, default=None)
        )
        verdict = decide.evaluate_gate(
            stats.agreement,
            stats.mean_cosine,
            stats.samples,
            min_agreement=self.settings.promote_min_agreement,
            min_samples=self.settings.promote_min_samples,
        )
        return {
            "model": model,
            "candidate": candidate,
            "stats": stats.to_dict(),
            "gate": dataclasses.asdict(verdict),
        }

    async def served(self, request_id: str) -> dict[str, Any]:
        """Which version served a request, when, where and why; the routing table then; the
        version's lineage."""
        return await served_view(self.pool, self.events, request_id)

    # -- plumbing -----------------------------------------------------------------------------

    async def _command(
        self, model: str, rule: Rule, actor: str, expected_sequence: int | None
    ) -> CommandResult:
        state = await self._read(model, expected_sequence)
        state, recorded = await self._decide_and_append(
            state, lambda s: [rule(s)], actor, expected_sequence
        )
        return CommandResult(_after(state, recorded), recorded)

    async def _decide_and_append(
        self,
        state: ModelState,
        rule: Callable[[ModelState], list[ev.Payload]],
        actor: str,
        expected_sequence: int | None,
    ) -> tuple[ModelState, list[ev.RecordedEvent]]:
        """Decide on `state` and append. Workers report VersionLoaded/Unloaded at any time, and
        such a report between the read and the append must not fail an operator's command: when
        the operator named no sequence and only worker reports intervened, decide again on the
        newer state. Any other intervening event is a real conflict and is raised."""
        for attempt in range(_REDECIDE_ATTEMPTS):
            try:
                return state, await self._append(state, rule(state), actor)
            except ConcurrencyConflictError:
                if expected_sequence is not None or attempt + 1 == _REDECIDE_ATTEMPTS:
                    raise
                history = await self.events.read(state.model)
                between = [e for e in history if e.sequence > state.sequence]
                if not all(isinstance(e.payload, _WORKER_REPORTS) for e in between):
                    raise
                state = fold(state.model, history)
        raise AssertionError("unreachable: the last attempt raises")

    async def _read(self, model: str, expected_sequence: int | None) -> ModelState:
        return self._check(await self.events.load(model), expected_sequence)

    @staticmethod
    def _check(state: ModelState, expected_sequence: int | None) -> ModelState:
        if expected_sequence is not None and expected_sequence != state.sequence:
            raise ConcurrencyConflictError(state.model, expected_sequence, state.sequence)
        return state

    async def _append(
        self,
        state: ModelState,
        payloads: list[ev.Payload],
        actor: str,
        correlation: uuid.UUID | None = None,
        causation: uuid.UUID | None = None,
    ) -> list[ev.RecordedEvent]:
        correlation = correlation or uuid.uuid4()
        new = [
            ev.NewEvent(p, actor=actor, causation_id=causation, correlation_id=correlation)
            for p in payloads
        ]
        return await self.log.append(state.model, new, expected_version=state.sequence)


def _done_by(
    registered: list[ev.RecordedEvent], validated: list[ev.RecordedEvent] | None = None
) -> str:
    if registered:
        return "registered"
    return "validated" if validated else "unchanged"


def _after(state: ModelState, recorded: list[ev.RecordedEvent]) -> ModelState:
    for event in recorded:
        state = apply(state, event)
    return state
