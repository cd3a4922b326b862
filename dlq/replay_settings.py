"""Settings of `tidegate replay` and `tidegate backtest` (env prefix `TIDEGATE_REPLAY_`)."""

from __future__ import annotations

from pathlib import Path

from pydantic import Field
from pydantic_settings import BaseSettings

from tidegate.core.settings import settings_config

__all__ = ["ReplaySettings"]


class ReplaySettings(BaseSettings):
    """Replays and backtests run in the operator's process, never through the live workers."""

    model_config = settings_config("TIDEGATE_REPLAY_")

    state_dir: Path = Field(
        Path("var/replay"),
        description="Where each replay run keeps its checkpoint, `<run id>.json`, for --resume.",
    )
    results_topic: str = Field(
        "inference-results-replay",
        description="Where replayed results go unless --to-topic says otherwise; created (with "
        "the InferenceResult schema under `<topic>-value`) when missing.",
    )
    batch_size: int = Field(
        32,
        ge=1,
        le=4096,
        description="Requests per model call. Batches are consecutive records of one partition, "
        "so the same range and size always give the same batches (and the same outputs).",
    )
    group_prefix: str = Field(
        "tidegate-replay",
        description="Consumer group id prefix of the readers (`<prefix>-<run id>`). Readers "
        "assign partitions and never commit: no group's offsets change.",
    )
    served_margin_s: float = Field(
        300.0,
        ge=0,
        description="A backtest reads served results from this long before --from to this long "
        "after --to: a result is produced a little after its request.",
    )
    stall_timeout_s: float = Field(
        15.0,
        gt=0,
        description="A partition that yields nothing for this long before its planned end "
        "(records deleted by retention, an open transaction) is given up as done.",
    )
    checkpoint_every_s: float = Field(
        1.0, ge=0, description="How often the checkpoint file is rewritten while running."
    )
