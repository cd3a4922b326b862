"""The controller's lineage pruner: off at 0, never shorter than the canary windows' horizon."""

from __future__ import annotations

from datetime import timedelta
from typing import Any

import pytest
from pydantic import ValidationError

from tidegate.lifecycle.control.retention import LineagePruner, lineage_pruner
from tidegate.lifecycle.lifecycle_settings import LifecycleSettings

POOL: Any = object()  # never touched until the pruner starts


def test_a_zero_retention_keeps_lineage_forever() -> None:
    assert (
        lineage_pruner(POOL, LifecycleSettings(lineage_retention_days=0), min_retention_s=60)
        is None
    )


def test_the_retention_is_the_setting_when_longer_than_the_horizon() -> None:
    pruner = lineage_pruner(POOL, LifecycleSettings(lineage_retention_days=7), min_retention_s=3600)
    assert pruner is not None
    assert pruner.retention == timedelta(days=7)


def test_the_retention_is_raised_to_the_windows_horizon() -> None:
    settings = LifecycleSettings(lineage_retention_days=0.001)  # 86 s
    pruner = lineage_pruner(POOL, settings, min_retention_s=3600)
    assert pruner is not None
    assert pruner.retention == timedelta(hours=1)


def test_nonsense_retentions_are_refused() -> None:
    with pytest.raises(ValidationError):
        LifecycleSettings(lineage_retention_days=-1)
    with pytest.raises(ValidationError):
        LifecycleSettings(lineage_retention_days=1e9)  # timedelta would overflow
    with pytest.raises(ValueError, match="retention"):
        LineagePruner(POOL, timedelta(0), every_s=1)
    with pytest.raises(ValueError, match="every_s"):
        LineagePruner(POOL, timedelta(days=1), every_s=0)
