"""Planning pools: every model placed in a pool whose models fit one worker's budget, families
kept together, the fewest pools first fit gives, workers from the rate, and what cannot fit
said rather than placed."""

from __future__ import annotations

import random

import pytest

from tidegate.lifecycle.domain.placement import ModelDemand, plan

MIB = 2**20


def demand(model: str, *mib: int, rate: float = 0.0) -> ModelDemand:
    return ModelDemand(model, {str(i + 1): m * MIB for i, m in enumerate(mib)}, rate)


def test_two_hundred_versions_are_packed_within_every_pools_budget() -> None:
    rng = random.Random(7)
    # 80 models, 200 versions of 50 MiB to 1.5 GiB, Zipf-like rates.
    demands = []
    for i in range(80):
        versions = 3 if i < 40 else 2
        sizes = [rng.randint(50, 1536) for _ in range(versions)]
        demands.append(demand(f"m{i:02d}", *sizes, rate=1000 / (i + 1)))
    assert sum(len(d.version_bytes) for d in demands) == 200
    made = plan(demands, budget_bytes=16 * 1024 * MIB, worker_rate_per_s=200)
    assert made.unplaced == ()
    limit = 16 * 1024 * MIB * 0.95
    assert all(p.bytes <= limit for p in made.pools)
    assert sorted(made.placement) == sorted(d.model for d in demands)
    by_model = {d.model: d for d in demands}
    for p in made.pools:
        assert p.bytes == sum(by_model[m].bytes for m in p.models)
        assert p.workers * 200 >= p.rate_per_s
    # First fit, largest first, packs within a pool of the lower bound.
    total = sum(d.bytes for d in demands)
    assert len(made.pools) <= int(total / limit) + 2


def test_a_family_stays_in_one_pool_and_the_largest_go_first() -> None:
    demands = [
        demand("bert", 600),
        demand("bert-lite", 300),
        demand("resnet", 700),
        demand("fraud", 50, 50, rate=900),
    ]
    made = plan(
        demands,
        budget_bytes=1000 * MIB,
        worker_rate_per_s=400,
        families={"nlp": ["bert", "bert-lite"]},
        prefix="p",
    )
    assert made.placement["bert"] == made.placement["bert-lite"]
    pools = {p.name: p for p in made.pools}
    # nlp (900 MiB) first, then resnet (700 MiB) needs a pool of its own; fraud fits beside it.
    assert pools["p-1"].models == ("bert", "bert-lite")
    assert pools["p-2"].models == ("fraud", "resnet")
    assert pools["p-2"].workers == 3  # 900 req/s over 400 a worker
    assert pools["p-1"].workers == 1  # at least one, even with no traffic


def test_what_no_worker_can_hold_is_named_not_placed() -> None:
    made = plan(
        [demand("huge", 2000), demand("small", 10)], budget_bytes=1024 * MIB, worker_rate_per_s=1
    )
    assert made.unplaced == ("huge",)
    assert made.placement == {"small": "pool-1"}
    with pytest.raises(ValueError, match="positive"):
        plan([], budget_bytes=0, worker_rate_per_s=1)
