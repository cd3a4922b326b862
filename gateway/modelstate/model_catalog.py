"""Which model versions are served and ready, and their V2 metadata (`ModelCatalog`), from the
lifecycle feed: the V2 path never reads the artifact store. The gateway never routes; a worker
decides a request's version.
What is served, ready and checked: docs/lifecycle.md ("Routing").
"""

from __future__ import annotations

from typing import Any, Protocol

from cachetools import LRUCache
from pydantic import ValidationError

from tidegate.core.errors import ModelNotFoundError, ModelUnavailableError
from tidegate.lifecycle.domain.state import ModelState, VersionState
from tidegate.schemas.signature import Signature
from tidegate.schemas.version_order import natural_key

__all__ = ["PLATFORMS", "LifecycleView", "ModelCatalog"]

PLATFORMS = {"onnx": "onnxruntime_onnx", "torch": "pytorch_torchscript"}
# Parsed signatures, keyed by their text: a version's signature never changes once registered.
_SIGNATURES = 1024


class LifecycleView(Protocol):
    """The part of `LifecycleFeed` the catalog reads."""

    def state(self, model: str) -> ModelState | None: ...

    async def caught_up(self, timeout_s: float) -> None: ...


class ModelCatalog:
    def __init__(self, lifecycle: LifecycleView, *, catch_up_s: float = 10.0) -> None:
        self._lifecycle = lifecycle
        self._catch_up_s = catch_up_s
        self._signatures: LRUCache[str, Signature] = LRUCache(_SIGNATURES)

    async def _state(self, name: str) -> ModelState:
        # Until the feed has replayed the topic, "unknown model" could be a lie: wait for it
        # (at once after the first time), or answer 503 (`LifecycleUnavailableError`).
        await self._lifecycle.caught_up(self._catch_up_s)
        state = self._lifecycle.state(name)
        if state is None or not any(v.servable for v in state.versions):
            raise ModelNotFoundError(f"model {name!r} is not served")
        return state

    async def serving_version(self, name: str) -> str:
        """The primary version: the one whose signature a request without a version must fit."""
        state = await self._state(name)
        if state.primary is None:
            raise ModelNotFoundError(f"model {name!r} has no primary version")
        return state.primary

    async def _resolve(self, name: str, version: str | None) -> tuple[ModelState, VersionState]:
        state = await self._state(name)
        if version is None:
            if state.primary is None:
                raise ModelNotFoundError(f"model {name!r} has no primary version")
            version = state.primary
        found = state.version(version)
        if found is None or not found.servable:
            why = "is unknown" if found is None else f"is {found.status.value}"
            raise ModelNotFoundError(f"model {name!r} version {version!r} {why}")
        return state, found

    def _signature(self, name: str, found: VersionState) -> Signature:
        cached = self._signatures.get(found.signature_json)
        if cached is not None:
            return cached
        try:
            parsed = Signature.model_validate_json(found.signature_json)
        except ValidationError as exc:
            # Registration validates the signature, so this is a damaged event, not a bad request.
            raise ModelUnavailableError(
                f"model {name!r} version {found.version!r} has no usable signature: {exc}"
            ) from exc
        self._signatures[found.signature_json] = parsed
        return parsed

    async def signature(self, name: str, version: str | None = None) -> Signature:
        """The signature of a servable version, or of the primary; `ModelNotFoundError` if none."""
        _, found = await self._resolve(name, version)
        return self._signature(name, found)

    async def routes(self, name: str, version: str | None) -> tuple[frozenset[str], str | None]:
        """The versions a request may be routed to (the one it asks for, else every servable
        one), and the model's declared fallback model (docs/breakers.md)."""
        state = await self._state(name)
        if version is not None:
            return frozenset({version}), state.fallback_model
        servable = frozenset(v.version for v in state.versions if v.servable)
        return servable, state.fallback_model

    def pool(self, name: str) -> str | None:
        """The pool the model is placed in, as the feed has it now (no wait); None is the
        default pool, and so is an unknown model's (its call is refused before publishing)."""
        state = self._lifecycle.state(name)
        return state.pool if state is not None else None

    def warm_in(self, name: str, pool: str | None) -> bool:
        """Whether a worker of `pool` has the model's traffic-taking versions loaded, as the
        feed has it now (no wait; any thread): a moving model's calls wait for it."""
        state = self._lifecycle.state(name)
        return state is None or state.warm_in(pool)

    def has_fallback(self, name: str) -> bool:
        """Whether the model declares a fallback model, as the feed has it now (no wait)."""
        state = self._lifecycle.state(name)
        return state is not None and state.fallback_model is not None

    async def check_ready(self, name: str, version: str | None = None) -> None:
        """Return when a worker has the version (or the primary) loaded and warm; otherwise
        `ModelUnavailableError` (or `ModelNotFoundError` when it is not served at all)."""
        _, found = await self._resolve(name, version)
        if not found.ready:
            raise ModelUnavailableError(
                f"model {name!r} version {found.version!r} is not loaded by any worker yet"
            )

    async def metadata(self, name: str, version: str | None = None) -> dict[str, Any]:
        """V2 model metadata; `versions` lists every version that may be asked for by name."""
        state, found = await self._resolve(name, version)
        signature = self._signature(name, found)
        servable = sorted((v.version for v in state.versions if v.servable), key=natural_key)
        return {
            "name": name,
            "versions": servable,
            "platform": PLATFORMS.get(found.runtime, found.runtime),
            "inputs": [spec.model_dump(mode="json") for spec in signature.inputs],
            "outputs": [spec.model_dump(mode="json") for spec in signature.outputs],
        }
