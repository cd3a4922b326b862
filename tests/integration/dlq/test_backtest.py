"""`tidegate backtest` against the real stack, on traffic a real worker served with fraud 1
(`replay_fixtures.recorded`): fraud 2's agreement with what was served must be what onnxruntime
itself says of the two versions on those inputs."""

from __future__ import annotations

import asyncio
import json
import re
from pathlib import Path

import numpy as np
import pytest
from typer.testing import CliRunner

from tests.integration.dlq.replay_fixtures import (
    REQUESTS,
    Recorded,
    iso,
    onnx_probabilities,
)
from tidegate.cli import app
from tidegate.cli.backtest_commands import run_backtest
from tidegate.core.db import make_pool
from tidegate.dlq.replay_settings import ReplaySettings
from tidegate.lifecycle.lifecycle_settings import LifecycleSettings
from tidegate.lifecycle.readmodels.backtests import latest_backtest


def direct_agreement(recorded: Recorded) -> tuple[float, int]:
    rows = np.concatenate([recorded.features[rid] for rid in sorted(recorded.features)])
    served = onnx_probabilities(recorded.models, "1", rows).argmax(axis=1)
    candidate = onnx_probabilities(recorded.models, "2", rows).argmax(axis=1)
    return float((served == candidate).mean()), len(rows)


def test_backtest_agrees_with_a_direct_onnxruntime_comparison_and_writes_the_page(
    recorded: Recorded, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    for key, value in recorded.env(tmp_path).items():
        monkeypatch.setenv(key, value)
    report_json, page = tmp_path / "report.json", tmp_path / "report.html"
    args = ["backtest", "fraud", "--candidate", "2"]
    args += ["--from", iso(recorded.from_ms), "--to", iso(recorded.to_ms)]
    args += ["--json", str(report_json), "--html", str(page)]
    outcome = CliRunner().invoke(app, args, env={"COLUMNS": "160"})
    assert outcome.exit_code == 0, outcome.output
    assert "backtest fraud 2" in outcome.stdout  # the tables

    report = json.loads(report_json.read_text())
    agreement, rows = direct_agreement(recorded)
    assert 0.5 < agreement < 1.0, "the two versions must disagree somewhere for this to mean much"
    assert (report["requests"], report["requests_compared"]) == (REQUESTS, REQUESTS)
    assert report["rows_compared"] == rows
    assert report["baseline_versions"] == ["1"]
    assert (report["missing_served"], report["candidate_errors"]) == (0, 0)
    assert abs(report["agreement"] - agreement) <= 1e-6

    html = page.read_text()
    assert html.lstrip().lower().startswith("<!doctype html")
    assert "fraud" in html
    # Self-contained: nothing is fetched (the SVG namespace is a name, not a request).
    assert not re.search(r"<(script|link|img|iframe)[^>]*\b(src|href)=", html, re.I)
    assert not re.search(r"url\(|@import", html, re.I)
    assert set(re.findall(r"https?://[^\s\"'<>]+", html)) <= {"http://www.w3.org/2000/svg"}

    async def recorded_for_the_gate() -> float | None:
        pool = make_pool(recorded.pg, LifecycleSettings(pool_min_size=1))
        await pool.open(wait=True, timeout=30)
        try:
            latest = await latest_backtest(pool, "fraud", "2")
        finally:
            await pool.close()
        return latest.agreement if latest is not None else None

    assert asyncio.run(recorded_for_the_gate()) == pytest.approx(report["agreement"])


async def test_a_backtest_rerun_on_the_same_version_gives_identical_outputs(
    recorded: Recorded,
) -> None:
    settings = ReplaySettings(batch_size=4, stall_timeout_s=5)
    runs = [
        await run_backtest(
            "fraud",
            "2",
            recorded.from_ms,
            recorded.to_ms,
            settings=settings,
            record=False,
            baseline=baseline,
            kafka=recorded.kafka,
            topics=recorded.topics,
            registry=recorded.registry,
            models=recorded.models,
        )
        for baseline in (None, "1")
    ]
    first, second = runs
    assert [r.request_id for r in first.rows] == [r.request_id for r in second.rows]
    assert len(first.rows) == REQUESTS
    for a, b in zip(first.rows, second.rows, strict=True):
        assert a.candidate is not None
        assert b.candidate is not None
        assert a.candidate.keys() == b.candidate.keys()
        for name in a.candidate:
            assert np.array_equal(a.candidate[name], b.candidate[name]), a.request_id
    # Against fraud 1 run here instead of what the worker served: the same verdict.
    assert second.report.baseline_versions == ["1"]
    assert second.report.agreement == pytest.approx(first.report.agreement, abs=1e-6)
