"""Which version of a model serves a request.

The routing table is `ModelSettings.serving_config` (TOML, `[models.NAME] version = "V"`) until the
model lifecycle replaces it. A request that names a version is served by that version when the
store has it; otherwise the table decides. Unknown models and versions are `ModelNotFoundError`.
"""

from __future__ import annotations

import asyncio
import tomllib
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Protocol

from tidegate.errors import ConfigurationError, ModelNotFoundError

__all__ = [
    "EXPLICIT",
    "SERVING_CONFIG",
    "Resolution",
    "ServingResolver",
    "VersionLister",
    "load_serving_table",
]

EXPLICIT = "explicit-version"
SERVING_CONFIG = "serving-config"


class VersionLister(Protocol):
    """The part of the artifact store the resolver needs (`LocalArtifactStore` is one)."""

    async def versions(self, name: str) -> list[str]: ...


@dataclass(frozen=True, slots=True)
class Resolution:
    version: str
    rule: str


def load_serving_table(path: Path) -> dict[str, str]:
    """Model name to serving version, from the TOML file."""
    try:
        data = tomllib.loads(path.read_text())
    except (OSError, tomllib.TOMLDecodeError) as exc:
        raise ConfigurationError(f"cannot read the serving config {path}: {exc}") from exc
    models = data.get("models", {})
    if not isinstance(models, dict):
        raise ConfigurationError(f"{path}: [models] must be a table")
    table: dict[str, str] = {}
    for name, entry in models.items():
        version = entry.get("version") if isinstance(entry, dict) else None
        if not isinstance(version, str | int) or isinstance(version, bool):
            raise ConfigurationError(f'{path}: [models.{name}] needs version = "..."')
        table[str(name)] = str(version)
    return table


class ServingResolver:
    """Resolves (model, requested version) to the version that serves, and why.

    The versions the store holds are cached for `ttl_s`, so an explicit version published while
    the worker runs becomes servable without a restart and the hot path rarely touches the disk.
    """

    def __init__(
        self, table: Mapping[str, str], store: VersionLister, *, ttl_s: float = 5.0
    ) -> None:
        self.table = dict(table)
        self._store = store
        self._ttl = ttl_s
        self._versions: dict[str, tuple[float, frozenset[str]]] = {}

    def serving(self) -> Sequence[tuple[str, str]]:
        """Every (model, version) of the table: what a worker loads before it consumes."""
        return sorted(self.table.items())

    async def resolve(self, model: str, requested: str | None) -> Resolution:
        if requested:
            if requested in await self._known(model):
                return Resolution(requested, EXPLICIT)
            raise ModelNotFoundError(f"model {model!r} has no version {requested!r}")
        version = self.table.get(model)
        if version is None:
            raise ModelNotFoundError(f"model {model!r} is not served")
        return Resolution(version, SERVING_CONFIG)

    async def _known(self, model: str) -> frozenset[str]:
        now = asyncio.get_running_loop().time()
        cached = self._versions.get(model)
        if cached is not None and now - cached[0] < self._ttl:
            return cached[1]
        found = frozenset(await self._store.versions(model))
        self._versions[model] = (now, found)
        return found
