"""`OnnxRuntime`: an onnxruntime InferenceSession, on CUDA when present and allowed."""

from __future__ import annotations

from typing import Any

from tidegate.core.errors import ModelExecutionError
from tidegate.models.manifest import ModelPackage
from tidegate.models.runtime.device import CUDA_PROVIDER, onnx_providers
from tidegate.models.runtime.executor import ExecutorRuntime
from tidegate.models.runtime.pipeline import Batch

__all__ = ["OnnxRuntime"]


class OnnxRuntime(ExecutorRuntime):
    _session: Any = None
    _inputs: tuple[str, ...] = ()
    _outputs: tuple[str, ...] = ()

    def _load_model(self, package: ModelPackage) -> None:
        import onnxruntime as ort

        options = ort.SessionOptions()
        # Explicit thread counts: the defaults take every core for each session, and a worker
        # runs several sessions side by side.
        options.intra_op_num_threads = self.settings.intra_op_threads
        options.inter_op_num_threads = self.settings.inter_op_threads
        options.execution_mode = ort.ExecutionMode.ORT_SEQUENTIAL
        options.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_ALL
        providers = onnx_providers(self.settings, list(ort.get_available_providers()))
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
