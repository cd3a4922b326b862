"""The model runtimes' Prometheus metrics, in prometheus-client's default registry."""

from __future__ import annotations

from prometheus_client import Counter, Histogram

__all__ = ["MODEL_DEVICE_FALLBACKS", "MODEL_LOAD_SECONDS"]

MODEL_LOAD_SECONDS = Histogram(
    "tidegate_model_load_seconds",
    "Time to fetch, verify, load and warm up one model version.",
    ["model", "version"],
    buckets=(0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0, 120.0),
)

MODEL_DEVICE_FALLBACKS = Counter(
    "tidegate_model_device_fallbacks",
    "Loaded model versions moved to another device after that device failed at inference time.",
    ["model", "version", "from", "to"],
)
