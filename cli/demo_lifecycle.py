"""The model lifecycle part of `tidegate demo`, through the same commands an operator runs.

`bootstrap` registers the example packages (idempotent: a re-run finds them registered) and
promotes the served versions, so a fresh machine and a second run end in the same state.
`demo_keys` issues the demo's API keys. `showcase` shadows fraud 2 against fraud 1 on live
traffic and prints the comparison, then starts a canary of fraud 3, which fails a fifth of its
inputs, and waits for the controller to roll it back by itself.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any, TypeVar

from rich.console import Console

from tidegate.cli.auth_commands import issue
from tidegate.cli.lifecycle_tables import compare_table, history_table
from tidegate.clients.loadgen import KafkaLoad, LoadResult
from tidegate.core.errors import ModelNotFoundError, TidegateError
from tidegate.core.kafka import make_admin
from tidegate.core.settings import KafkaSettings
from tidegate.gateway.auth.identity import Grant
from tidegate.lifecycle.domain.render import event_view
from tidegate.lifecycle.operations.commands import LifecycleCommands
from tidegate.lifecycle.operations.sessions import command_session

__all__ = ["SERVED", "bootstrap", "demo_keys", "showcase", "wait_group_settled", "wait_warm"]

T = TypeVar("T")
ACTOR = "local:demo"
"""The demo acts as a named local identity, as every operator command does."""
KEY_LIFETIME = timedelta(days=1)
SERVED = (("fraud", "1"), ("fraud-lite", "1"), ("minilm", "1"))
CANDIDATES = (("fraud", "2"), ("fraud", "3"))


def _run(action: Callable[[LifecycleCommands], Awaitable[T]], *, write: bool = True) -> T:
    async def go() -> T:
        async with command_session(write=write) as commands:
            return await action(commands)

    return asyncio.run(go())


def bootstrap(packages: Path, console: Console) -> None:
    """Register every example version and make the served ones primary; undo what an
    interrupted earlier run may have left (a canary, a shadow)."""

    async def go(c: LifecycleCommands) -> None:
        for name, version in (*SERVED, *CANDIDATES):
            path = packages / name / version
            result = await c.register(path, actor=ACTOR, name=name, version=version)
            found = result.state.version(version)
            if found is None or not found.servable:
                raise TidegateError(f"{name} {version} is not servable: {found and found.reason}")
            console.print(f"  {name} {version}: {result.action}")
        for name, version in SERVED:
            state = await c.status(name)
            if state.canary is not None:
                await c.rollback(name, actor=ACTOR)
            for shadow in state.shadows():
                await c.shadow(name, shadow, actor=ACTOR, stop=True)
            if (await c.status(name)).primary != version:
                await c.promote(name, version, actor=ACTOR, force=True)

    _run(go)


def demo_keys(console: Console, base: str) -> dict[str, str]:
    """An `infer` key and an `admin` key of the demo's own (the gateway authenticates every
    call), valid for a day, printed once with how to use them. Created as `tidegate auth keys
    create` does: as the operator's local identity, each written to the audit trail."""
    expires = datetime.now(UTC) + KEY_LIFETIME
    keys = {}
    for role in ("infer", "admin"):
        issued = issue(f"demo {role}", (Grant(role),), expires_at=expires)
        keys[role] = issued.key.get_secret_value()
    console.print(
        "API keys of this demo (shown once, valid for a day; `tidegate auth keys list` lists "
        "them, `tidegate auth keys revoke ID` revokes one):",
        highlight=False,
    )
    body = '{"inputs": [{"name": "text", "datatype": "BYTES", "shape": [1], "data": ["hello"]}]}'
    console.print(
        f"  infer  {keys['infer']}\n"
        f'    curl -H "Authorization: Bearer {keys["infer"]}" -H "Content-Type: '
        f"application/json\" -d '{body}' {base}/v2/models/minilm/infer\n"
        f"  admin  {keys['admin']}\n"
        f'    curl -H "Authorization: Bearer {keys["admin"]}" {base}/admin/models',
        highlight=False,
        markup=False,
        soft_wrap=True,
    )
    return keys


def _wait(what: str, probe: Callable[[], T | None], timeout_s: float) -> T:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        found = probe()
        if found:
            return found
        time.sleep(0.5)
    raise TidegateError(f"demo: timed out after {timeout_s:.0f}s waiting for {what}")


def wait_warm(model: str, version: str, workers: set[str], timeout_s: float = 120) -> None:
    def warm() -> bool:
        try:
            state = _run(lambda c: c.status(model), write=False)
        except ModelNotFoundError:
            return False
        found = state.version(version)
        return found is not None and workers <= found.loaded_on

    _wait(f"{model} {version} warm on {sorted(workers)}", warm, timeout_s)


def wait_group_settled(group: str, members: int, timeout_s: float = 120.0) -> None:
    """Until the workers' group is stable with `members` members each holding partitions.

    A worker reports its models warm before it joins the group; traffic sent before the last
    one has its partitions meets the cooperative rebalance (partitions revoked from one worker
    reach the other a heartbeat later), whose stall reads as queueing to admission.
    """
    from confluent_kafka import ConsumerGroupState

    admin = make_admin(KafkaSettings())

    def settled() -> bool:
        found = admin.describe_consumer_groups([group])[group].result(timeout=10)
        owners = [m for m in found.members if m.assignment.topic_partitions]
        return found.state == ConsumerGroupState.STABLE and len(owners) == members

    _wait(f"consumer group {group} stable with {members} members", settled, timeout_s)


def showcase(
    console: Console,
    kafka: KafkaLoad,
    traffic: Callable[[str], Callable[[int], dict[str, Any]]],
    workers: set[str],
    scale: float,
) -> list[LoadResult]:
    """Shadow fraud 2, then canary fraud 3 until the controller rolls it back."""

    results: list[LoadResult] = []
    count = max(100, int(600 * scale))
    console.rule("shadow: fraud 2 next to fraud 1 on live traffic")
    _run(lambda c: c.shadow("fraud", "2", actor=ACTOR, sample_rate=1.0))
    wait_warm("fraud", "2", workers)
    results.append(kafka.run("Kafka fraud+shadow", traffic("shadow"), rate=200, count=count))

    # Workers skip a comparison rather than queue it when shadow_max_in_flight runs are going
    # (tidegate_worker_shadow_skipped_total), so wait for the count to settle, not to reach `count`.
    seen: list[int] = []

    def compared() -> dict[str, Any] | None:
        data = _run(lambda c: c.compare("fraud", "2"), write=False)
        seen.append(int(data["stats"]["samples"]))
        settled = len(seen) >= 4 and seen[-1] == seen[-4] and seen[-1] > 0
        return data if settled or seen[-1] >= count else None

    data = _wait("the shadow comparisons", compared, 90)
    console.print(compare_table(data))
    console.print(f"{data['stats']['samples']} of {count} requests compared (the rest skipped)")
    _run(lambda c: c.shadow("fraud", "2", actor=ACTOR, stop=True))

    console.rule("canary: fraud 3 (fails ~20% of inputs), steps 10 -> 50 -> 100")
    started = _run(
        lambda c: c.canary(
            "fraud",
            "3",
            actor=ACTOR,
            steps=(10, 50, 100),
            dwell_s=3.0,
            thresholds={"max_error_rate": 0.05, "min_requests": 20},
        )
    )
    since = started.events[-1].sequence
    deadline = time.monotonic() + 120
    rolled: list[Any] = []
    while not rolled and time.monotonic() < deadline:
        results.append(kafka.run("Kafka fraud canary", traffic("canary"), rate=200, count=400))
        history = _run(lambda c: c.history("fraud"), write=False)
        rolled = [e for e in history if e.sequence > since and e.type in ("RolledBack", "Promoted")]
    if not rolled or rolled[0].type != "RolledBack":
        raise TidegateError("demo: the controller did not roll the faulty canary back")
    history = _run(lambda c: c.history("fraud"), write=False)
    recent = [event_view(e) for e in history if e.sequence > since - 1]
    console.print(history_table(recent, title="fraud: the canary and its automatic rollback"))
    return results
