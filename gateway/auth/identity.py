"""Who is calling, and what they may do: `Identity`, its `Grant`s (a role over every model or named
ones) and the `Permission` each route is authorized against. Roles nest: admin > deploy > infer.
Identities, roles and what each permission allows: docs/security.md ("Identities", "Roles and
permissions").
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field
from enum import StrEnum
from typing import Literal

__all__ = [
    "ANONYMOUS",
    "ROLE_PERMISSIONS",
    "Grant",
    "Identity",
    "IdentityKind",
    "Permission",
    "grants_of",
]


class Permission(StrEnum):
    PUBLIC = "public"
    READ = "read"
    INFER = "infer"
    DEPLOY = "deploy"
    ADMIN = "admin"


ROLE_PERMISSIONS: dict[str, frozenset[Permission]] = {
    "infer": frozenset({Permission.READ, Permission.INFER}),
    "deploy": frozenset({Permission.READ, Permission.INFER, Permission.DEPLOY}),
    "admin": frozenset(Permission) - {Permission.PUBLIC},
}
"""Each role's permissions (`public` needs none)."""

IdentityKind = Literal["api-key", "jwt", "local", "anonymous"]


@dataclass(frozen=True, slots=True)
class Grant:
    """A role, over every model (`models` None) or over the named ones only."""

    role: str
    models: frozenset[str] | None = None

    def __post_init__(self) -> None:
        if self.role not in ROLE_PERMISSIONS:
            raise ValueError(f"unknown role {self.role!r}; roles: {sorted(ROLE_PERMISSIONS)}")

    def allows(self, permission: Permission, model: str | None) -> bool:
        if permission not in ROLE_PERMISSIONS[self.role]:
            return False
        if self.models is None:
            return True
        if model is None:
            # A route over no one model (listing models): the route filters what it shows.
            return permission in (Permission.READ, Permission.INFER)
        return model in self.models


@dataclass(frozen=True, slots=True)
class Identity:
    """`subject` names the caller in the audit trail and as the lifecycle's actor: the key's id
    (`key:<id>`), the token's `sub` (`jwt:<issuer>/<sub>`) or the local name (`local:<name>`).
    `rate_per_s` overrides the configured rate limit for this caller (None: the default), and
    `tenant` is the one it acts for, if it names one."""

    subject: str
    kind: IdentityKind
    grants: tuple[Grant, ...] = ()
    rate_per_s: float | None = None
    labels: dict[str, str] = field(default_factory=dict)
    tenant: str | None = None
    """The tenant the caller acts for (a key's, or a token's claim): its calls are that tenant's
    whatever their `tenant` parameter says. None: the parameter (else `default`) stands."""
    routing_key: str | None = None
    """The routing key of every call of the caller (a key's, or a token's claim), so it cannot
    pick its own version of a weighted split or its partition. None: the parameter stands."""

    def allows(self, permission: Permission, model: str | None = None) -> bool:
        """Whether a route needing `permission` (on `model`, when it names one) is allowed. A
        grant scoped to named models allows a route that names no model only for `read` and
        `infer` (listing models, which the route filters), never `deploy` or `admin`."""
        if permission is Permission.PUBLIC:
            return True
        return any(g.allows(permission, model) for g in self.grants)

    @property
    def is_admin(self) -> bool:
        """Whether a grant of `admin` over every model is among the grants: who may see any
        caller's results by id (`local:insecure` is one)."""
        return any(g.role == "admin" and g.models is None for g in self.grants)

    @property
    def roles(self) -> list[str]:
        return sorted({g.role for g in self.grants})


def grants_of(roles: Iterable[str], models: Iterable[str] | None = None) -> tuple[Grant, ...]:
    scope = frozenset(models) if models is not None else None
    return tuple(Grant(role, scope) for role in roles)


ANONYMOUS = Identity("anonymous", "anonymous")
"""Who calls without credentials: allowed `public` routes only (and everything with
`--insecure`, where the gateway grants it `admin`)."""
