"""A fleet against the real Kafka, registry and PostgreSQL: 3 pools, 60 generated ONNX versions
(20 models of 3 versions, each about 10 MiB resident in onnxruntime), a worker per pool with a
memory budget that holds a few of its 21 versions, and Zipf-distributed traffic that names every
version.
Every request is answered by a worker of its model's pool; each worker's loaded versions are
back within its budget as measured once the traffic ends; loads and evictions are counted."""

from __future__ import annotations

import asyncio
import random
import urllib.request
from collections import Counter
from pathlib import Path

import numpy as np
import pytest
from prometheus_client.parser import text_string_to_metric_families

from tests.integration.workers import (
    SIGNATURE,
    Reader,
    Stack,
    build_tiny_model,
    controller_relay,
    request,
    start_worker,
    stop_workers,
    store_classifier,
    tidegate,
)
from tests.support import WaitTimeoutError, free_port, unique, wait_for
from tidegate.clients.producer import TidegateProducer
from tidegate.core.kafka import make_admin
from tidegate.core.pools import pool_topic_names
from tidegate.lifecycle.domain import events as ev
from tidegate.models.model_settings import ModelSettings
from tidegate.models.store import LocalArtifactStore

MODELS = [f"fleet-{i:02d}" for i in range(20)]
VERSIONS = ("1", "2", "3")
WIDE = 65_536  # the hidden width: 4 x WIDE + WIDE x 2 floats, about 1.5 MiB of weights
BUDGET_MIB = 40
REQUESTS = 600


def build_fleet(settings: ModelSettings, root: Path) -> None:
    """Each model a two-layer net (features -> WIDE -> 2, softmax), weights of its own."""
    rng = np.random.default_rng(3)
    for name in MODELS:
        for version in VERSIONS:
            hidden = rng.normal(size=(4, WIDE))
            out = rng.normal(size=(WIDE, 2)) / WIDE
            store_classifier(settings, root / f"{name}-{version}", name, version, hidden, out)


@pytest.fixture(scope="module")
def models(tmp_path_factory: pytest.TempPathFactory) -> ModelSettings:
    """tiny (the stack fixture registers it) and the fleet, in one store."""
    root = tmp_path_factory.mktemp("fleet")
    settings = build_tiny_model(root)
    build_fleet(settings, root / "sources")
    return settings


async def registered(models: ModelSettings, name: str) -> list[ev.Payload]:
    store = LocalArtifactStore(models)
    out: list[ev.Payload] = []
    for version in VERSIONS:
        files = (await store.manifest(name, version)).files
        uri = f"file://{store.package_dir(name, version)}"
        signature = SIGNATURE.model_dump_json()
        out += [
            ev.ModelRegistered(version, "onnx", uri, dict(files), signature_json=signature),
            ev.ArtifactValidated(version),
        ]
    return [*out, ev.Promoted("1")]


def scrape(port: int) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=10) as resp:
        text = resp.read().decode()
    return {
        (s.name, tuple(sorted(s.labels.items()))): s.value
        for family in text_string_to_metric_families(text)
        for s in family.samples
    }


def total(
    samples: dict[tuple[str, tuple[tuple[str, str], ...]], float], name: str, **match: str
) -> float:
    return sum(
        value
        for (sample, labels), value in samples.items()
        if sample == name and match.items() <= dict(labels).items()
    )


def settled(port: int) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    """The worker's metrics once its loaded versions fit the budget again (at most 10 s).

    A version a request took in the last quarter second is never evicted, so the last loads of
    the traffic may hold a worker over its budget until they go idle and it evicts again."""

    def within() -> dict[tuple[str, tuple[tuple[str, str], ...]], float] | None:
        samples = scrape(port)
        loaded = total(samples, "tidegate_worker_loaded_bytes")
        return samples if loaded <= 0.95 * BUDGET_MIB * 2**20 else None

    try:
        return wait_for(within, timeout=10.0, what="loaded versions back within the budget")
    except WaitTimeoutError:
        return scrape(port)  # the assertions say by how much


async def test_three_pools_serve_sixty_versions_each_worker_within_its_budget(
    stack: Stack, models: ModelSettings
) -> None:
    tag = unique("f").lower().replace("_", "-")[-10:]
    pools = [f"{tag}-{p}" for p in ("a", "b", "c")]
    placement = {name: pools[i % 3] for i, name in enumerate(MODELS)}
    for pool in pools:
        await asyncio.to_thread(
            tidegate, stack, models, "pools", "declare", pool, "--partitions", "4"
        )
    ports = {pool: free_port() for pool in pools}
    workers = []
    results = Reader(stack, stack.topics.results)
    try:
        async with controller_relay(stack):
            for name in MODELS:
                await stack.append(
                    *await registered(models, name), ev.PoolAssigned(placement[name]), model=name
                )
            for pool in pools:
                workers.append(
                    start_worker(
                        stack,
                        models,
                        TIDEGATE_WORKER_POOL=pool,
                        TIDEGATE_WORKER_WORKER_ID=f"worker-{pool}",
                        TIDEGATE_WORKER_METRICS_PORT=str(ports[pool]),
                        TIDEGATE_WORKER_MEMORY_BUDGET_MIB=str(BUDGET_MIB),
                    )
                )
            # Zipf over the 60 versions: the k-th most asked for, 1/k as often as the first.
            rng = random.Random(11)
            versions = [(name, v) for v in VERSIONS for name in MODELS]
            weights = [1 / (k + 1) for k in range(len(versions))]
            asked = rng.choices(versions, weights, k=REQUESTS)
            sent = {}
            with TidegateProducer(
                stack.kafka, stack.topics, stack.registry, placement=placement.get
            ) as producer:
                for i, (name, version) in enumerate(asked):
                    rid = f"fleet-{i}"
                    sent[rid] = (name, version)
                    record = request(rid, f"k{i % 50}", model=name, model_version=version)
                    producer.publish_record(record)  # type: ignore[arg-type]
            answered = await asyncio.to_thread(results.until, REQUESTS, 240)
            samples = {pool: await asyncio.to_thread(settled, ports[pool]) for pool in pools}
    finally:
        stop_workers(*workers)
        results.close()
        admin = make_admin(stack.kafka)
        names = [n for pool in pools for n in pool_topic_names(stack.topics, pool)]
        for future in admin.delete_topics(names).values():
            await asyncio.to_thread(future.result, 30)

    assert {r["request_id"] for r in answered} == set(sent)
    assert Counter(r["status"] for r in answered) == {"OK": REQUESTS}
    for r in answered:
        name, version = sent[r["request_id"]]
        assert (r["model"], r["model_version"]) == (name, version)
        assert r["worker_id"] == f"worker-{placement[name]}", "answered outside its pool"
    budget = BUDGET_MIB * 2**20
    for pool in pools:
        seen = samples[pool]
        loaded = total(seen, "tidegate_worker_loaded_bytes")
        assert 0 < loaded <= 0.95 * budget, f"{pool}: {loaded / 2**20:.1f} MiB accounted"
        assert total(seen, "tidegate_worker_cold_loads_total") > 0, pool
        assert total(seen, "tidegate_worker_evictions_total", reason="memory") > 0, pool
    print(
        {
            pool: {
                "loaded_mib": round(total(seen, "tidegate_worker_loaded_bytes") / 2**20, 1),
                "cold_loads": total(seen, "tidegate_worker_cold_loads_total"),
                "evictions": total(seen, "tidegate_worker_evictions_total", reason="memory"),
            }
            for pool, seen in samples.items()
        }
    )
