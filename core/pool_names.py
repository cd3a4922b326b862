"""What a model pool's name may be (pure: the lifecycle's domain checks it). A pool's topics and
group are in `tidegate.core.pools`; what a pool is: docs/pools.md."""

from __future__ import annotations

import re

from tidegate.core.errors import ConfigurationError

__all__ = ["DEFAULT_POOL", "POOL_PATTERN", "check_pool"]

DEFAULT_POOL = "default"
"""What metrics, views and tables call the default pool (a model placed in none)."""

POOL_PATTERN = r"^[a-z0-9][a-z0-9-]{0,39}$"
"""A pool's name: it becomes part of topic and consumer group names, so it is kept to characters
every one of them takes, and short."""
_POOL = re.compile(POOL_PATTERN)


def check_pool(pool: str) -> str:
    """`pool`, if it is a valid pool name; else `ConfigurationError`."""
    if not _POOL.match(pool):
        raise ConfigurationError(
            f"pool name {pool!r} is not valid: 1-40 lowercase letters, digits and dashes, "
            "starting with a letter or digit"
        )
    return pool
