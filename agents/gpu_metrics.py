"""GPU utilisation and memory through NVML, read when Prometheus scrapes the worker
(`NvmlCollector`), as NVIDIA's dcgm-exporter reads them, but from the worker's own /metrics so a
pool's GPU use joins its `tidegate_worker_pool_info`. A host without NVML (no NVIDIA driver, or
`nvidia-ml-py` not installed) exports none of it. What the numbers mean: docs/pools.md
("Utilisation").
"""

from __future__ import annotations

import importlib
import logging
from collections.abc import Iterator
from types import ModuleType
from typing import Any

from prometheus_client.core import GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

__all__ = ["METRICS", "NvmlCollector", "nvml_collector"]

UTILISATION = "tidegate_worker_gpu_utilisation_ratio"
USED = "tidegate_worker_gpu_memory_used_bytes"
TOTAL = "tidegate_worker_gpu_memory_total_bytes"
METRICS = (UTILISATION, USED, TOTAL)
"""What the collector exports on a host with GPUs (the rules and dashboards read them)."""

log = logging.getLogger(__name__)


class NvmlCollector(Collector):
    """One sample per device and scrape: NVML's own utilisation (the share of its last sample
    period in which a kernel ran on the device, any process's) and memory in use."""

    def __init__(self, nvml: Any, count: int) -> None:
        self._nvml = nvml
        self._count = count

    def collect(self) -> Iterator[Metric]:
        nvml = self._nvml
        busy = GaugeMetricFamily(
            UTILISATION,
            "NVML's utilisation of the device (0-1): the share of its last sample period in "
            "which a kernel ran, by any process on the device.",
            labels=["gpu"],
        )
        used = GaugeMetricFamily(
            USED,
            "Device memory in use, by any process on the device (NVML).",
            labels=["gpu"],
        )
        total = GaugeMetricFamily(
            TOTAL,
            "The device's memory (NVML).",
            labels=["gpu"],
        )
        for index in range(self._count):
            try:
                handle = nvml.nvmlDeviceGetHandleByIndex(index)
                rates = nvml.nvmlDeviceGetUtilizationRates(handle)
                memory = nvml.nvmlDeviceGetMemoryInfo(handle)
            except nvml.NVMLError as exc:
                # A device lost or being reset: the scrape goes on without it.
                log.warning("NVML cannot read GPU %d: %s", index, exc)
                continue
            busy.add_metric([str(index)], rates.gpu / 100.0)
            used.add_metric([str(index)], float(memory.used))
            total.add_metric([str(index)], float(memory.total))
        yield from (busy, used, total)

    def close(self) -> None:
        try:
            self._nvml.nvmlShutdown()
        except self._nvml.NVMLError as exc:
            log.debug("NVML shutdown: %s", exc)


def nvml_collector(module: ModuleType | None = None) -> NvmlCollector | None:
    """A collector over every device NVML sees; None where there is none or no NVML. `module`:
    `pynvml` unless given (the tests give a fake)."""
    if module is None:
        try:
            module = importlib.import_module("pynvml")
        except ImportError:
            return None
    nvml: Any = module
    try:
        nvml.nvmlInit()
    except nvml.NVMLError as exc:
        log.debug("no GPU metrics: NVML did not start (%s)", exc)
        return None
    try:
        count = int(nvml.nvmlDeviceGetCount())
    except nvml.NVMLError as exc:
        log.warning("no GPU metrics: NVML cannot count the devices (%s)", exc)
        count = 0
    if count == 0:
        nvml.nvmlShutdown()
        return None
    return NvmlCollector(nvml, count)
