"""Settings of the artifact store and the model runtimes."""

from __future__ import annotations

from pathlib import Path
from typing import Literal

from pydantic import Field
from pydantic_settings import BaseSettings

from tidegate.core.settings import settings_config

__all__ = ["ModelSettings"]


class ModelSettings(BaseSettings):
    """The artifact store and the model runtimes (env prefix `TIDEGATE_MODELS_`)."""

    model_config = settings_config("TIDEGATE_MODELS_")

    store_dir: Path = Field(Path("var/models"), description="Root of the local artifact store.")
    packages_root: Path = Field(
        Path("var/packages"),
        description="Registration through the gateway (`POST /admin/models/{name}/versions`) "
        "reads package directories under this one only, and no file that resolves outside it.",
    )
    allow_pickled: bool = Field(
        False,
        description="Load model formats that unpickle, and so can run any code as they load: "
        "torch.export archives (.pt2). Off, such a package fails validation; turn it on only "
        "for packages you trust as you trust code (docs/security.md).",
    )
    device: Literal["auto", "cpu", "cuda"] = Field(
        "auto", description="auto picks CUDA when present, the CPU otherwise."
    )
    cuda_fallback: bool = Field(
        True,
        description="A CUDA failure while computing a batch moves that version to the CPU for "
        "the rest of its life (the batch is retried there); false fails the batch instead.",
    )
    intra_op_threads: int = Field(
        1, ge=1, le=256, description="Threads inside one operator (onnxruntime and torch)."
    )
    inter_op_threads: int = Field(1, ge=1, le=256, description="Threads across operators.")
    inline_below_ms: float = Field(
        1.0,
        ge=0,
        le=1000,
        description="A version whose batches take less than this (a moving average) runs on the "
        "caller's event loop instead of its own thread, where the hop costs more than the "
        "compute; 0 never inlines.",
    )
