"""What the built-in runtimes share: a single-thread executor, the package pipeline, the checks.

One thread per loaded model keeps compute off the event loop and serialises calls into the
backend, whose sessions are cheapest used from one thread. A model faster than the hop (a moving
average under `ModelSettings.inline_below_ms`: a small tabular model's batch takes tens of
microseconds, a thread hop and its wake-ups more) runs inline on the caller's loop instead; one
that slows down goes back to its thread. Backend exceptions become
`ModelExecutionError` with the backend's own message; outputs are checked against the signature
so a model that drops rows or changes a datatype is caught here and not by a caller.
"""

from __future__ import annotations

import asyncio
import time
from abc import abstractmethod
from concurrent.futures import ThreadPoolExecutor
from typing import Any, ClassVar

import numpy as np
import numpy.typing as npt

from tidegate.core.errors import (
    ArtifactError,
    InvalidInputError,
    ModelExecutionError,
    ModelUnavailableError,
    TidegateError,
)
from tidegate.models.manifest import Manifest, ModelPackage
from tidegate.models.model_settings import ModelSettings
from tidegate.models.runtime.contract import Arrays, ModelRuntime
from tidegate.models.runtime.pipeline import Batch, Pipeline, build_pipeline
from tidegate.schemas.signature import Signature
from tidegate.schemas.tensors import DATATYPES, datatype_of

__all__ = ["ExecutorRuntime", "batch_rows", "synthetic_inputs"]


class ExecutorRuntime(ModelRuntime):
    """Base of `OnnxRuntime` and `TorchRuntime`: subclasses load and compute, synchronously, in
    the runtime's own thread."""

    warmup_rows: ClassVar[int] = 4

    def __init__(self, settings: ModelSettings) -> None:
        self.settings = settings
        self.manifest: Manifest | None = None
        self.pipeline = Pipeline()
        self._executor: ThreadPoolExecutor | None = None
        # Seconds per batch, a moving average; None until the first batch ran in the thread.
        self._average_s: float | None = None

    @abstractmethod
    def _load_model(self, package: ModelPackage) -> None:
        """Load the entry point onto a device and set `self.device` (runs in the executor)."""

    @abstractmethod
    def _compute(self, feeds: Batch) -> Batch:
        """Run the graph on preprocessed inputs; outputs by name (runs in the executor)."""

    @abstractmethod
    def _release(self) -> None:
        """Drop the model and its device memory (runs in the executor)."""

    @property
    def label(self) -> str:
        return f"{self.manifest.name} version {self.manifest.version}" if self.manifest else "?"

    async def load(self, package: ModelPackage) -> None:
        if self._executor is not None:
            raise ArtifactError(f"{self.label} is already loaded")
        self.manifest = package.manifest
        self._executor = ThreadPoolExecutor(1, thread_name_prefix=f"model-{self.label}")
        try:
            await self._call(self._load_sync, package)
        except BaseException as exc:
            await self.on_unload()
            if isinstance(exc, TidegateError) or not isinstance(exc, Exception):
                raise
            raise ArtifactError(f"cannot load {self.label}: {exc}") from exc

    async def infer(self, inputs: Arrays) -> dict[str, npt.NDArray[Any]]:
        if self._executor is None or self.manifest is None:
            raise ModelUnavailableError(f"{self.label} is not loaded")
        rows = batch_rows(inputs)
        try:
            if self._inline():
                outputs = self._timed_run(dict(inputs))
            else:
                outputs = await self._call(self._timed_run, dict(inputs))
        except TidegateError:
            raise
        except Exception as exc:
            raise ModelExecutionError(str(exc) or type(exc).__name__) from exc
        return _checked(self.manifest.signature, outputs, rows)

    async def on_warmup(self) -> None:
        """One batch of synthetic inputs, so the first request meets a warm model and a package
        whose graph does not match its signature is refused before it serves."""
        if self.manifest is None:
            raise ModelUnavailableError("warm-up before load")
        try:
            await self.infer(synthetic_inputs(self.manifest.signature, self.warmup_rows))
        except (ModelExecutionError, InvalidInputError) as exc:
            raise ArtifactError(f"warm-up of {self.label} failed: {exc}") from exc

    async def on_unload(self) -> None:
        executor, self._executor = self._executor, None
        if executor is None:
            return
        try:
            await asyncio.get_running_loop().run_in_executor(executor, self._release)
        finally:
            executor.shutdown(wait=False)

    async def _call(self, function: Any, *args: Any) -> Any:
        if self._executor is None:
            raise ModelUnavailableError(f"{self.label} is not loaded")
        return await asyncio.get_running_loop().run_in_executor(self._executor, function, *args)

    def _load_sync(self, package: ModelPackage) -> None:
        self.pipeline = build_pipeline(package.manifest, package.directory)
        self._load_model(package)

    def _inline(self) -> bool:
        average = self._average_s
        return average is not None and average * 1000.0 < self.settings.inline_below_ms

    def _timed_run(self, inputs: Batch) -> Batch:
        started = time.perf_counter()
        outputs = self._run_sync(inputs)
        took = time.perf_counter() - started
        average = self._average_s
        self._average_s = took if average is None else average + (took - average) * 0.1
        return outputs

    def _run_sync(self, inputs: Batch) -> Batch:
        return self.pipeline.after(self._compute(self.pipeline.before(inputs)))


def batch_rows(inputs: Arrays) -> int:
    """The batch size every input agrees on."""
    if not inputs:
        raise InvalidInputError("a batch needs at least one input")
    sizes: dict[str, int] = {}
    for name, array in inputs.items():
        if array.ndim == 0:
            raise InvalidInputError(f"input {name!r} has no batch dimension", name)
        sizes[name] = int(array.shape[0])
    if len(set(sizes.values())) > 1:
        name = next(iter(sizes))
        raise InvalidInputError(f"inputs disagree on the batch size: {sizes}", name)
    return next(iter(sizes.values()))


def synthetic_inputs(signature: Signature, rows: int) -> dict[str, npt.NDArray[Any]]:
    """Zeros (or short texts) of the signature's shapes; free dimensions other than the batch
    are 1."""
    out: dict[str, npt.NDArray[Any]] = {}
    for spec in signature.inputs:
        shape = [1 if d == -1 else d for d in spec.shape]
        if spec.shape and spec.shape[0] == -1:
            shape[0] = rows
        if spec.datatype == "BYTES":
            array = np.empty(shape, dtype=object)
            array.fill(b"warm-up")
            out[spec.name] = array
        else:
            out[spec.name] = np.zeros(shape, dtype=DATATYPES[spec.datatype])
    return out


def _checked(signature: Signature, outputs: Batch, rows: int) -> dict[str, npt.NDArray[Any]]:
    checked: dict[str, npt.NDArray[Any]] = {}
    for spec in signature.outputs:
        array = outputs.get(spec.name)
        if array is None:
            raise ModelExecutionError(
                f"the model gave no output {spec.name!r}; it gave {list(outputs)}"
            )
        if array.ndim == 0 or array.shape[0] != rows:
            got = array.shape[0] if array.ndim else "no"
            raise ModelExecutionError(f"output {spec.name!r} has {got} rows for a batch of {rows}")
        if datatype_of(array) != spec.datatype:
            raise ModelExecutionError(
                f"output {spec.name!r} is {datatype_of(array)}, the signature says {spec.datatype}"
            )
        if not spec.accepts(array.shape):
            raise ModelExecutionError(
                f"output {spec.name!r} has shape {list(array.shape)}, the signature says "
                f"{list(spec.shape)}"
            )
        checked[spec.name] = array
    return checked
