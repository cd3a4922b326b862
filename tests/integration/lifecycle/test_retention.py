"""Lineage rows past their retention are deleted (the running controller: test_controller)."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

from tests.integration.lifecycle.lineage_rows import Pool, compared, request_ids, served
from tidegate.lifecycle.control.retention import prune


async def test_prune_deletes_only_rows_past_the_cutoff_in_batches(pg_pool: Pool) -> None:
    now = datetime.now(UTC)
    for i in range(5):
        await served(pg_pool, f"old-{i}", now - timedelta(days=40))
        await compared(pg_pool, f"old-{i}", now - timedelta(days=40))
    await served(pg_pool, "recent", now - timedelta(days=1))
    await compared(pg_pool, "recent", now - timedelta(days=1))

    counts = await prune(pg_pool, now - timedelta(days=30), batch_size=2)

    assert counts == {"served_requests": 5, "shadow_comparisons": 5}
    assert await request_ids(pg_pool, "served_requests") == {"recent"}
    assert await request_ids(pg_pool, "shadow_comparisons") == {"recent"}
    assert await prune(pg_pool, now - timedelta(days=30)) == {
        "served_requests": 0,
        "shadow_comparisons": 0,
    }
