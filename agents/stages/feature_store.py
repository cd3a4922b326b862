"""The online feature store's layout in Redis, and how operators write it.

One hash per entity, at `<FeatureSettings.key_prefix><entity_key>`: each field is a feature name
and its value a number as text (`repr` of a float round-trips exactly); `_updated_at` is when the
values were written, in epoch milliseconds. Writing a row and its timestamp is one `HSET`, so a
reader never sees new values with the old timestamp.
"""

from __future__ import annotations

import math
import time
from collections.abc import Mapping

from redis.asyncio import Redis

from tidegate.agents.stages.feature_settings import UPDATED_AT, FeatureSettings
from tidegate.core.errors import InvalidInputError

__all__ = ["entity_redis_key", "read_features", "write_features"]


def entity_redis_key(settings: FeatureSettings, entity: str) -> str:
    return f"{settings.key_prefix}{entity}"


async def write_features(
    redis: Redis,
    settings: FeatureSettings,
    entity: str,
    values: Mapping[str, float],
    *,
    at_ms: int | None = None,
) -> int:
    """Set `values` of `entity` (other features it has stay) and its `_updated_at` (now unless
    `at_ms`); returns the timestamp written."""
    if not entity:
        raise InvalidInputError("an entity key must not be empty", "entity_key")
    if not values:
        raise InvalidInputError("give at least one feature", "features")
    for name, value in values.items():
        if name == UPDATED_AT or not name:
            raise InvalidInputError(f"{name!r} is not a feature name", name)
        if not math.isfinite(value):
            raise InvalidInputError(f"feature {name!r} must be a finite number, got {value}", name)
    stamp = at_ms if at_ms is not None else int(time.time() * 1000)
    mapping = {name: repr(float(value)) for name, value in values.items()}
    mapping[UPDATED_AT] = str(stamp)
    await redis.hset(entity_redis_key(settings, entity), mapping=mapping)  # type: ignore[misc]
    return stamp


async def read_features(redis: Redis, settings: FeatureSettings, entity: str) -> dict[str, str]:
    """Every field of `entity`'s hash as text (empty when the entity has none)."""
    raw: dict[bytes, bytes] = await redis.hgetall(entity_redis_key(settings, entity))  # type: ignore[misc]
    return {key.decode(): value.decode() for key, value in sorted(raw.items())}
