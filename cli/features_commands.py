"""`tidegate features put|get`: write and read an entity's online features (docs/features.md).

`put` sets named features (`amount=12.5`), or a whole declared row in order (`--model fraud
--row 0.1,0.2,...`, the features `TIDEGATE_FEATURES_DECLARED` declares for the model's input), and
the entity's `_updated_at` in one `HSET`. `get` prints the entity's hash as JSON.

Settings come from the environment (TIDEGATE_REDIS_*, TIDEGATE_FEATURES_*). Exit codes: 0 done;
1 failed (Redis unreachable, no such entity for `get`); 2 usage.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import Awaitable, Callable
from typing import Annotated, TypeVar

import typer
from redis.asyncio import Redis
from redis.exceptions import RedisError

from tidegate.agents.stages.feature_settings import FeatureSettings
from tidegate.agents.stages.feature_store import read_features, write_features
from tidegate.core.errors import TidegateError
from tidegate.core.settings import RedisSettings

__all__ = ["app", "parse_assignments", "row_values"]

T = TypeVar("T")
app = typer.Typer(no_args_is_help=True)


def parse_assignments(items: list[str]) -> dict[str, float]:
    """`NAME=NUMBER` items as a mapping; a name given twice is refused."""
    values: dict[str, float] = {}
    for item in items:
        name, sep, raw = item.partition("=")
        if not sep or not name:
            raise typer.BadParameter(f"{item!r} is not NAME=NUMBER")
        if name in values:
            raise typer.BadParameter(f"feature {name!r} is given twice")
        try:
            values[name] = float(raw)
        except ValueError:
            raise typer.BadParameter(f"{item!r}: {raw!r} is not a number") from None
    return values


def row_values(
    settings: FeatureSettings, model: str, version: str | None, row: str
) -> dict[str, float]:
    """A comma-separated row, named by the features declared for the model (or version)."""
    declared = settings.inputs(model, version) if version else settings.declared.get(model)
    if not declared:
        raise typer.BadParameter(f"no features are declared for {model!r} (TIDEGATE_FEATURES_)")
    if len(declared) != 1:
        raise typer.BadParameter(f"{model!r} declares several inputs: name the features instead")
    (names,) = declared.values()
    raw = [item.strip() for item in row.split(",")]
    if len(raw) != len(names):
        raise typer.BadParameter(f"the row has {len(raw)} values, {model!r} declares {len(names)}")
    try:
        return {name: float(value) for name, value in zip(names, raw, strict=True)}
    except ValueError as exc:
        raise typer.BadParameter(f"the row holds a value that is not a number: {exc}") from None


def _run(work: Callable[[Redis, FeatureSettings], Awaitable[T]]) -> T:
    settings, redis_settings = FeatureSettings(), RedisSettings()

    async def main() -> T:
        secret = redis_settings.password
        redis = Redis.from_url(
            redis_settings.url, password=secret.get_secret_value() if secret else None
        )
        try:
            return await work(redis, settings)
        finally:
            await redis.aclose()

    try:
        return asyncio.run(main())
    except (RedisError, OSError, TidegateError) as exc:
        typer.echo(f"error: {exc}", err=True)
        raise typer.Exit(1) from None


@app.command("put")
def put(
    entity: Annotated[str, typer.Argument(help="The entity key requests name.")],
    features: Annotated[
        list[str] | None, typer.Argument(help="NAME=NUMBER, one per feature.")
    ] = None,
    model: Annotated[
        str | None, typer.Option(help="With --row: the model whose declared features it holds.")
    ] = None,
    version: Annotated[
        str | None, typer.Option(help="With --row: that version's declaration.")
    ] = None,
    row: Annotated[
        str | None, typer.Option(help="Comma-separated values, in the declared order.")
    ] = None,
    at: Annotated[
        int | None, typer.Option(help="_updated_at, epoch milliseconds (default: now).")
    ] = None,
) -> None:
    """Set an entity's features and its _updated_at."""
    values = parse_assignments(features or [])
    if row is not None:
        if model is None:
            raise typer.BadParameter("--row needs --model")
        values = {**row_values(FeatureSettings(), model, version, row), **values}
    if not values:
        raise typer.BadParameter("give NAME=NUMBER features, or --model and --row")

    async def work(redis: Redis, settings: FeatureSettings) -> int:
        return await write_features(redis, settings, entity, values, at_ms=at)

    stamp = _run(work)
    typer.echo(json.dumps({"entity": entity, "features": len(values), "updated_at": stamp}))


@app.command("get")
def get(entity: Annotated[str, typer.Argument(help="The entity key.")]) -> None:
    """Print an entity's hash as JSON."""

    async def work(redis: Redis, settings: FeatureSettings) -> dict[str, str]:
        return await read_features(redis, settings, entity)

    found = _run(work)
    if not found:
        typer.echo(f"error: entity {entity!r} has no features", err=True)
        raise typer.Exit(1)
    typer.echo(json.dumps(found, indent=2))
