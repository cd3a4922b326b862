"""The lifecycle fold over logs the commands could have written (property tests): random
operator and worker commands, each decided by `tidegate.lifecycle.domain.decide` against the
state so far (a refused command writes nothing), make a log; every prefix of it folds to a valid
state, folding is deterministic, and events republished out of order change nothing."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from hypothesis import given, settings
from hypothesis import strategies as st

from tests.unit.lifecycle_events import recorded
from tidegate.core.errors import TidegateError
from tidegate.lifecycle.domain import decide
from tidegate.lifecycle.domain import events as ev
from tidegate.lifecycle.domain.routing import RoutingTable
from tidegate.lifecycle.domain.state import ModelState, apply, fold

MODEL = "m"
VERSIONS = ("1", "2", "3")
WORKERS = ("w1", "w2")
STEPS = ([100], [10, 50, 100], [50, 100])
PASSED = decide.GateResult(True, "agreement", 0.99, 500, "agreement 0.99 over 500 samples")

Command = tuple[str, str, str, int]


def _register(s: ModelState, version: str, _worker: str, n: int) -> list[ev.Payload]:
    sha = {"model.onnx": version * 64}
    action = decide.register(s, version, sha)
    registered = ev.ModelRegistered(version, "onnx", f"store://{version}", sha)
    outcome = ev.ValidationFailed(version, "it failed") if n == 3 else ev.ArtifactValidated(version)
    chosen: dict[str, list[ev.Payload]] = {
        "register": [registered, outcome],
        "validate": [outcome],
        "unchanged": [],
    }
    return chosen[action]


def _step(s: ModelState, _version: str, _worker: str, _n: int) -> list[ev.Payload]:
    """What the canary controller appends when a step's dwell is over."""
    canary = s.canary
    if canary is None or canary.baseline is None or canary.step + 1 >= len(canary.steps):
        return []
    share = canary.steps[canary.step + 1]
    if share == 100:
        return [decide.promote(s, canary.version, PASSED, force=False)]
    return [ev.TrafficShifted({canary.version: share, canary.baseline: 100 - share})]


def _experiment(s: ModelState, version: str, _worker: str, n: int) -> list[ev.Payload]:
    other = VERSIONS[(VERSIONS.index(version) + 1) % len(VERSIONS)]
    tenant = "acme" if n % 2 else None
    return [decide.experiment(s, f"e{n}", tenant, {version: 30, other: 70})]


COMMANDS: dict[str, Callable[[ModelState, str, str, int], list[ev.Payload]]] = {
    "register": _register,
    "promote": lambda s, v, _w, _n: [decide.promote(s, v, PASSED, force=False)],
    "canary": lambda s, v, _w, n: [decide.canary(s, v, STEPS[n % 3], 60.0, {})],
    "step": _step,
    "rollback": lambda s, _v, _w, _n: [decide.rollback(s)],
    "retire": lambda s, v, _w, _n: [decide.retire(s, v)],
    "shadow": lambda s, v, _w, _n: [decide.shadow_start(s, v, 0.5)],
    "unshadow": lambda s, v, _w, _n: [decide.shadow_stop(s, v)],
    "pin": lambda s, v, _w, n: [decide.pin(s, f"p{n}", "acme", v)],
    "unpin": lambda s, _v, _w, n: [decide.unpin(s, f"p{n}")],
    "experiment": _experiment,
    "unroute": lambda s, _v, _w, n: [decide.unpin(s, f"e{n}")],
    "load": lambda s, v, w, _n: [ev.VersionLoaded(v, w)] if s.version(v) else [],
    "unload": lambda s, v, w, _n: [ev.VersionUnloaded(v, w)] if s.version(v) else [],
}
COMMAND = st.tuples(
    # A canary's steps and the workers' loads come more often than an operator's commands.
    st.sampled_from([*sorted(COMMANDS), "step", "step", "load"]),
    st.sampled_from(VERSIONS),
    st.sampled_from(WORKERS),
    st.integers(0, 3),
)
# Every version registered and validated, 1 promoted and warm: where most logs get past the
# first commands (a list of random commands alone rarely registers before it promotes).
SERVING: list[Command] = [
    *(("register", v, "w1", 0) for v in VERSIONS),
    ("promote", "1", "w1", 0),
    ("load", "1", "w1", 0),
]
COMMANDS_LISTS = st.tuples(st.sampled_from([[], SERVING]), st.lists(COMMAND, max_size=60)).map(
    lambda parts: [*parts[0], *parts[1]]
)


def written(commands: list[Command]) -> list[ev.RecordedEvent]:
    """The log the commands write, each decided against the state the log so far folds to."""
    state, log = ModelState(MODEL), list[ev.RecordedEvent]()
    for kind, version, worker, n in commands:
        try:
            payloads = COMMANDS[kind](state, version, worker, n)
        except TidegateError:
            continue  # refused: nothing is appended
        for event in recorded(MODEL, payloads, start=len(log) + 1):
            log.append(event)
            state = apply(state, event)
    return log


def check_valid(state: ModelState, folded: int) -> None:
    """What every state the commands can reach satisfies."""
    assert state.sequence == folded
    names = [v.version for v in state.versions]
    assert len(names) == len(set(names))
    servable = {v.version for v in state.versions if v.servable}
    intended = state.intended_weights()
    assert set(intended) <= servable, "weight on a version that may not serve"
    assert sum(intended.values()) in (0, 100)
    effective = state.effective_weights()
    assert sum(effective.values()) == sum(intended.values())
    assert set(effective) <= servable
    assert state.primary is None or state.primary in servable
    assert state.previous_primary is None or state.previous_primary in names
    assert state.previous_primary is None or state.previous_primary != state.primary
    if state.canary is not None:
        assert state.canary.version in servable
        assert -1 <= state.canary.step < len(state.canary.steps)
    assert set(state.shadows()) <= servable
    assert state.wanted() <= servable
    assert {r.version for r in state.rules if r.version} <= set(names)
    table = RoutingTable.from_state(state)
    if table.weights:
        for key in ("a", "b", "c"):
            assert table.route(tenant="default", key=key).version in servable


@settings(max_examples=200)
@given(COMMANDS_LISTS)
def test_every_prefix_of_a_log_folds_to_a_valid_state(commands: list[Command]) -> None:
    log = written(commands)
    state = ModelState(MODEL)
    check_valid(state, 0)
    for k, event in enumerate(log, start=1):
        state = apply(state, event)
        check_valid(state, k)
        # Deterministic: the prefix folded afresh is the state reached event by event.
        assert fold(MODEL, log[:k]) == state


@settings(max_examples=100)
@given(COMMANDS_LISTS, st.data())
def test_republished_events_change_nothing(commands: list[Command], data: Any) -> None:
    log = written(commands)
    again = data.draw(st.lists(st.sampled_from(log), max_size=10)) if log else []
    # An outbox republishing what was already folded, at any later point and in any order.
    at = data.draw(st.integers(0, len(log)))
    mixed = [*log[:at], *(e for e in again if e.sequence <= at), *log[at:], *again]
    assert fold(MODEL, mixed) == fold(MODEL, log)
