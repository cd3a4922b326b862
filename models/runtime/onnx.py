"""`OnnxRuntime`: an onnxruntime InferenceSession, on CUDA when present and allowed.

CUDA needs the `onnxruntime-gpu` wheel (`pip install .[gpu]`, docs/gpu.md); the `onnxruntime`
wheel offers only the CPU.
"""

from __future__ import annotations

import functools
import logging
from importlib import metadata
from typing import Any

from tidegate.core.errors import ModelExecutionError
from tidegate.models.manifest import ModelPackage
from tidegate.models.runtime.device import CUDA_PROVIDER, onnx_providers
from tidegate.models.runtime.executor import ExecutorRuntime
from tidegate.models.runtime.pipeline import Batch

__all__ = ["ONNXRUNTIME_WHEELS", "OnnxRuntime", "installed_onnxruntime_wheels"]

_log = logging.getLogger(__name__)
# Both install the same `onnxruntime` module; they must not be installed side by side.
ONNXRUNTIME_WHEELS = ("onnxruntime", "onnxruntime-gpu")


class OnnxRuntime(ExecutorRuntime):
    _session: Any = None
    _inputs: tuple[str, ...] = ()
    _outputs: tuple[str, ...] = ()

    def _load_model(self, package: ModelPackage) -> None:
        import onnxruntime as ort

        wheels = installed_onnxruntime_wheels()
        if len(wheels) > 1:
            # The files of the one installed last win, the rest are the other's: it may load
            # without CUDA, or not at all once either is uninstalled.
            _log.warning(
                "loading %s with both %s installed: they write the same onnxruntime module; "
                "keep one (docs/gpu.md)",
                self.label,
                " and ".join(wheels),
            )
        options = ort.SessionOptions()
        # Explicit thread counts: the defaults take every core for each session, and a worker
        # runs several sessions side by side.
        options.intra_op_num_threads = self.settings.intra_op_threads
        options.inter_op_num_threads = self.settings.inter_op_threads
        options.execution_mode = ort.ExecutionMode.ORT_SEQUENTIAL
        options.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_ALL
        providers = onnx_providers(self.settings, list(ort.get_available_providers()))
        if CUDA_PROVIDER in providers:
            _load_cuda_libraries()
        path = package.path(package.manifest.entrypoint)
        session = ort.InferenceSession(str(path), sess_options=options, providers=providers)
        # The session may still have fallen back to the CPU (no CUDA libraries, say).
        self.device = "cuda" if session.get_providers()[0] == CUDA_PROVIDER else "cpu"
        self._inputs = tuple(i.name for i in session.get_inputs())
        self._outputs = tuple(o.name for o in session.get_outputs())
        self._session = session

    def _compute(self, feeds: Batch) -> Batch:
        missing = [name for name in self._inputs if name not in feeds]
        if missing:
            given = list(feeds)
            raise ModelExecutionError(f"the graph needs inputs {missing}; it was given {given}")
        results = self._session.run(None, {name: feeds[name] for name in self._inputs})
        return dict(zip(self._outputs, results, strict=True))

    def _release(self) -> None:
        self._session = None


def installed_onnxruntime_wheels() -> list[str]:
    """Which of the onnxruntime distributions are installed."""
    installed = []
    for name in ONNXRUNTIME_WHEELS:
        try:
            metadata.version(name)
        except metadata.PackageNotFoundError:
            continue
        installed.append(name)
    return installed


@functools.cache
def _load_cuda_libraries() -> None:
    """Load the CUDA and cuDNN libraries of the nvidia-* wheels (which `onnxruntime-gpu[cuda,cudnn]`
    and torch install) into the process, once: onnxruntime's CUDA provider does not search
    site-packages for them, and without them the session quietly starts on the CPU."""
    import onnxruntime as ort

    preload = getattr(ort, "preload_dlls", None)
    if preload is not None:
        preload()
