"""`TorchRuntime`: a TorchScript module (`torch.jit.load`) or a `torch.export` program (.pt2), on
CUDA when present and allowed."""

from __future__ import annotations

import contextlib
import warnings
from typing import Any

import numpy as np

from tidegate.core.errors import ArtifactError, ModelExecutionError
from tidegate.models.manifest import ModelPackage
from tidegate.models.runtime.device import torch_device
from tidegate.models.runtime.executor import ExecutorRuntime
from tidegate.models.runtime.pipeline import Batch

__all__ = ["TorchRuntime"]
_JIT_LOAD_DEPRECATED = r"`torch\.jit\.load` is deprecated"


class TorchRuntime(ExecutorRuntime):
    _module: Any = None
    _inputs: tuple[str, ...] = ()
    _outputs: tuple[str, ...] = ()

    def _load_model(self, package: ModelPackage) -> None:
        import torch

        # Thread counts are per process in torch, and OpenMP's apply to the calling thread:
        # setting them here, in the compute thread, is what takes effect.
        torch.set_num_threads(self.settings.intra_op_threads)
        # torch allows this once per process, before any inter-op work; later calls fail.
        with contextlib.suppress(RuntimeError):
            torch.set_num_interop_threads(self.settings.inter_op_threads)
        device = torch_device(self.settings, torch.cuda.is_available())
        path = package.path(package.manifest.entrypoint)
        if path.suffix == ".pt2":
            if not self.settings.allow_pickled:
                # torch.export.load unpickles parts of the archive: loading it runs its code.
                raise ArtifactError(
                    f"{path.name} is a torch.export archive, which unpickles as it loads (it can "
                    "run any code); set TIDEGATE_MODELS_ALLOW_PICKLED=true to load packages you "
                    "trust as code, or export the model as ONNX or TorchScript"
                )
            module = torch.export.load(str(path)).module().to(device)
        else:
            # torch 2.9+ warns that TorchScript is deprecated on every load; loading it is this
            # runtime's job. A filter, not catch_warnings, which is not thread-safe; re-adding
            # an identical filter replaces it.
            warnings.filterwarnings("ignore", _JIT_LOAD_DEPRECATED, FutureWarning)
            module = torch.jit.load(  # type: ignore[no-untyped-call]
                str(path), map_location=device
            ).eval()
        self.device = device
        self._module = module
        self._inputs = tuple(self.pipeline.model_inputs(package.manifest.signature))
        self._outputs = tuple(spec.name for spec in package.manifest.signature.outputs)

    def _compute(self, feeds: Batch) -> Batch:
        import torch

        tensors = []
        for name in self._inputs:
            array = feeds.get(name)
            if array is None:
                given = list(feeds)
                raise ModelExecutionError(f"the model needs input {name!r}; it was given {given}")
            if array.dtype == object:
                raise ModelExecutionError(f"input {name!r} is BYTES: torch models take numbers")
            # from_numpy shares memory and refuses read-only buffers (request bytes are).
            writable = array if array.flags.writeable else array.copy()
            tensors.append(torch.from_numpy(np.ascontiguousarray(writable)).to(self.device))
        try:
            with torch.inference_mode():
                result = self._module(*tensors)
        except torch.jit.Error as exc:
            raise ModelExecutionError(_last_line(str(exc))) from exc
        return self._named(result)

    def _named(self, result: Any) -> Batch:
        import torch

        if isinstance(result, torch.Tensor):
            result = (result,)
        if isinstance(result, dict):
            items = list(result.items())
        elif isinstance(result, tuple | list) and len(result) == len(self._outputs):
            items = list(zip(self._outputs, result, strict=True))
        else:
            raise ModelExecutionError(
                f"the model returned {type(result).__name__}; expected {len(self._outputs)} tensors"
            )
        return {str(name): tensor.detach().cpu().numpy() for name, tensor in items}

    def _release(self) -> None:
        self._module = None
        self._free_device_memory(self.device)

    def _free_device_memory(self, device: str) -> None:
        import torch

        if device == "cuda":
            torch.cuda.empty_cache()


def _last_line(message: str) -> str:
    """TorchScript wraps an exception in both tracebacks; its last line is the error itself."""
    lines = [line for line in message.splitlines() if line.strip()]
    return lines[-1].removeprefix("builtins.") if lines else message
