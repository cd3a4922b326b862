"""NVML's GPU utilisation and memory on the worker's /metrics: read at each scrape, one sample
per device, a device that fails skipped, and nothing at all where NVML is missing. NVML is a fake
module here (no GPU on this host); the real `pynvml` is imported too, and finds no driver."""

from __future__ import annotations

import types
from dataclasses import dataclass

from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.parser import text_string_to_metric_families

from tidegate.agents.gpu_metrics import nvml_collector


class NVMLError(Exception):
    pass


@dataclass
class Rates:
    gpu: int
    memory: int


@dataclass
class Memory:
    used: int
    total: int
    free: int


def fake_nvml(*devices: tuple[int, int, int] | None, starts: bool = True) -> types.ModuleType:
    """A `pynvml` whose devices have (utilisation %, used bytes, total bytes); None: a device
    NVML cannot read."""
    nvml = types.ModuleType("pynvml")
    nvml.NVMLError = NVMLError  # type: ignore[attr-defined]
    nvml.shutdowns = 0  # type: ignore[attr-defined]

    def init() -> None:
        if not starts:
            raise NVMLError("NVML Shared Library Not Found")

    def shutdown() -> None:
        nvml.shutdowns += 1  # type: ignore[attr-defined]

    def handle(index: int) -> int:
        if devices[index] is None:
            raise NVMLError("GPU is lost")
        return index

    def rates(index: int) -> Rates:
        found = devices[index]
        assert found is not None
        return Rates(found[0], 0)

    def memory(index: int) -> Memory:
        found = devices[index]
        assert found is not None
        return Memory(found[1], found[2], found[2] - found[1])

    nvml.nvmlInit = init  # type: ignore[attr-defined]
    nvml.nvmlShutdown = shutdown  # type: ignore[attr-defined]
    nvml.nvmlDeviceGetCount = lambda: len(devices)  # type: ignore[attr-defined]
    nvml.nvmlDeviceGetHandleByIndex = handle  # type: ignore[attr-defined]
    nvml.nvmlDeviceGetUtilizationRates = rates  # type: ignore[attr-defined]
    nvml.nvmlDeviceGetMemoryInfo = memory  # type: ignore[attr-defined]
    return nvml


def scrape(registry: CollectorRegistry) -> dict[tuple[str, str], float]:
    text = generate_latest(registry).decode()
    return {
        (sample.name, sample.labels["gpu"]): sample.value
        for family in text_string_to_metric_families(text)
        for sample in family.samples
    }


def test_each_scrape_reads_every_device_and_skips_one_that_fails() -> None:
    nvml = fake_nvml((73, 5 * 2**30, 80 * 2**30), None, (0, 2**20, 16 * 2**30))
    collector = nvml_collector(nvml)
    assert collector is not None
    registry = CollectorRegistry()
    registry.register(collector)
    assert scrape(registry) == {
        ("tidegate_worker_gpu_utilisation_ratio", "0"): 0.73,
        ("tidegate_worker_gpu_memory_used_bytes", "0"): 5 * 2**30,
        ("tidegate_worker_gpu_memory_total_bytes", "0"): 80 * 2**30,
        ("tidegate_worker_gpu_utilisation_ratio", "2"): 0.0,
        ("tidegate_worker_gpu_memory_used_bytes", "2"): 2**20,
        ("tidegate_worker_gpu_memory_total_bytes", "2"): 16 * 2**30,
    }
    collector.close()
    assert nvml.shutdowns == 1


def test_no_driver_or_no_device_exports_nothing() -> None:
    assert nvml_collector(fake_nvml((50, 1, 2), starts=False)) is None
    empty = fake_nvml()
    assert nvml_collector(empty) is None
    assert empty.shutdowns == 1, "NVML started for no device is shut down"
    # The real binding on this host (no NVIDIA driver): no collector, no error.
    assert nvml_collector() is None
