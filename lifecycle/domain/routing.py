"""Which version serves a request: the routing table and the pure decision over it.

Workers decide (so the HTTP and Kafka paths decide alike), in this order:
1. an explicit version, honoured if it is registered, validated and not retired;
2. the tenant's pin, then the tenant's experiment (rules with no tenant apply to everyone);
3. the traffic split, by weighted rendezvous hashing of the routing key: a key stays on its
   version while the weights stand, and raising a version's weight only moves keys onto it.
A version the deciding worker has not warmed up is never chosen by a split while a fallback is
warm: its share goes to the primary (or, while a newly promoted primary warms up, to the previous
one) until the worker has loaded it.
"""

from __future__ import annotations

import hashlib
import math
from collections.abc import Callable, Iterable
from dataclasses import dataclass

from tidegate.core.errors import ModelNotFoundError
from tidegate.lifecycle.domain.state import ModelState, Rule

__all__ = [
    "EXPLICIT",
    "Decision",
    "RoutingTable",
    "choose_weighted",
    "sampled",
]

EXPLICIT = "explicit-version"


@dataclass(frozen=True, slots=True)
class Decision:
    version: str
    rule: str
    """Why: `explicit-version`, `pin:<rule>`, `experiment:<rule>`, `split@<sequence>` or
    `warming-fallback@<sequence>`; results carry it, so `tidegate served` can say why. A worker
    that sends the request to the model's declared fallback instead says
    `fallback:breaker-open@<model>/<version>` (`tidegate.agents.inference.inference_service`); one
    a gateway sent to the fallback says `fallback:<reason>@<model>`, reason `breaker-open` or
    `overloaded`."""


@dataclass(frozen=True, slots=True)
class RoutingTable:
    """One model's routing state as of stream `sequence`: what a worker needs to route."""

    model: str
    sequence: int
    primary: str | None
    fallbacks: tuple[str, ...]
    """Where a split's pick goes when this worker has not warmed it: primary, previous primary."""
    weights: tuple[tuple[str, int], ...]
    shadows: tuple[tuple[str, float], ...]
    rules: tuple[Rule, ...]
    servable: frozenset[str]
    known: frozenset[str]
    wanted: frozenset[str]
    fallback_model: str | None = None
    """The model declared to serve this one's requests while its breaker is open."""
    pool: str | None = None
    """The pool whose workers keep this model loaded (None: the default pool)."""

    @classmethod
    def from_state(cls, state: ModelState) -> RoutingTable:
        return cls(
            model=state.model,
            sequence=state.sequence,
            primary=state.primary,
            fallbacks=tuple(v for v in (state.primary, state.previous_primary) if v),
            weights=tuple(sorted(state.effective_weights().items())),
            shadows=tuple(sorted(state.shadows().items())),
            rules=state.rules,
            servable=frozenset(v.version for v in state.versions if v.servable),
            known=frozenset(v.version for v in state.versions),
            wanted=state.wanted(),
            fallback_model=state.fallback_model,
            pool=state.pool,
        )

    def route(
        self,
        *,
        tenant: str,
        key: str,
        requested: str | None = None,
        ready: Callable[[str], bool] = lambda _: True,
    ) -> Decision:
        """The version for one request. `ready(version)` says whether this worker has it warm."""
        if requested:
            if requested in self.servable:
                return Decision(requested, EXPLICIT)
            why = "is retired or failed validation" if requested in self.known else "is unknown"
            raise ModelNotFoundError(f"model {self.model!r} version {requested!r} {why}")
        # A tenant's own pin, then a pin for everyone, then the tenant's experiment, then an
        # experiment for everyone: the more specific rule wins whatever the rule ids.
        for kind, scope in (
            ("pin", tenant),
            ("pin", None),
            ("experiment", tenant),
            ("experiment", None),
        ):
            for rule in self.rules:
                if rule.kind != kind or rule.tenant != scope:
                    continue
                if rule.version is not None and rule.version in self.servable:
                    return Decision(rule.version, f"pin:{rule.rule_id}")
                # An experiment's arms are warm-before-route like the split: an arm this
                # worker has not loaded is left out until it has (pins load on demand).
                weights = [(v, w) for v, w in rule.weights if v in self.servable and ready(v)]
                if weights:
                    version = choose_weighted(f"{self.model}\0{rule.rule_id}", key, weights)
                    return Decision(version, f"experiment:{rule.rule_id}")
        if not self.weights:
            raise ModelNotFoundError(f"model {self.model!r} has no version taking traffic")
        version = choose_weighted(self.model, key, self.weights)
        if not ready(version):
            for fallback in self.fallbacks:
                if fallback != version and fallback in self.servable and ready(fallback):
                    return Decision(fallback, f"warming-fallback@{self.sequence}")
        return Decision(version, f"split@{self.sequence}")

    def shadow_targets(self, request_id: str, served: str) -> list[str]:
        """The shadow versions this request is copied to (sampled by request id)."""
        return [
            version
            for version, rate in self.shadows
            if version != served and sampled(f"{self.model}\0{version}", request_id, rate)
        ]


def _unit(*parts: str) -> float:
    """A stable hash in (0, 1): Python's own `hash` is salted per process, so it cannot be used
    by workers that must agree."""
    digest = hashlib.blake2b("\0".join(parts).encode(), digest_size=8).digest()
    return (int.from_bytes(digest, "big") + 0.5) / 2.0**64


def choose_weighted(salt: str, key: str, weights: Iterable[tuple[str, int]]) -> str:
    """Weighted rendezvous (highest random weight) hashing: each version scores
    `-weight / ln(u)` for a per-(key, version) uniform `u`; the highest score wins, so each
    version wins a share equal to its weight and a key only moves when its winner changes."""
    weights = list(weights)
    if len(weights) == 1 and weights[0][1] > 0:
        return weights[0][0]  # the only candidate wins every key: no hash to compute
    best, best_score = "", -math.inf
    for version, weight in weights:
        if weight <= 0:
            continue
        score = -weight / math.log(_unit(salt, key, version))
        if score > best_score:
            best, best_score = version, score
    if not best:
        raise ModelNotFoundError(f"no version of {salt.split(chr(0))[0]!r} has weight")
    return best


def sampled(salt: str, request_id: str, rate: float) -> bool:
    return rate >= 1.0 or _unit(salt, "shadow", request_id) < rate
