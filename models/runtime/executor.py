"""What the built-in runtimes share: a single-thread executor, the package pipeline, the checks.

One thread per loaded model keeps compute off the event loop and serialises calls into the
backend, whose sessions are cheapest used from one thread. A model faster than the hop (a moving
average under `ModelSettings.inline_below_ms`: a small tabular model's batch takes tens of
microseconds, a thread hop and its wake-ups more) runs inline on the caller's loop instead; one
that slows down goes back to its thread. Backend exceptions become
`ModelExecutionError` with the backend's own message; outputs are checked against the signature
so a model that drops rows or changes a datatype is caught here and not by a caller.

A batch that fails on CUDA because CUDA itself failed (`device.cuda_failure`) moves the version
to the CPU: the model is loaded again there, in the runtime's thread, the batch is retried, and
every later batch runs there. A worker keeps answering at CPU speed on a broken GPU instead of
failing every request; a WARNING line and `tidegate_model_device_fallbacks_total` say so.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
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
from tidegate.models.runtime.device import cuda_failure
from tidegate.models.runtime.pipeline import Batch, Pipeline, build_pipeline
from tidegate.models.runtime.runtime_metrics import MODEL_DEVICE_FALLBACKS
from tidegate.schemas.signature import Signature
from tidegate.schemas.tensors import DATATYPES, datatype_of

__all__ = ["ExecutorRuntime", "batch_rows", "synthetic_inputs"]

_log = logging.getLogger(__name__)
# A CUDA error can carry a page of advice (torch's CUDA_LAUNCH_BLOCKING hint); the log line keeps
# the error itself.
_LOGGED_ERROR_CHARS = 500
# Hung calls a version may leave behind, each holding a thread; past this, its batches queue (and
# time out) behind them rather than growing threads without bound.
_MAX_ABANDONED = 4


class ExecutorRuntime(ModelRuntime):
    """Base of `OnnxRuntime` and `TorchRuntime`: subclasses load and compute, synchronously, in
    the runtime's own thread."""

    warmup_rows: ClassVar[int] = 4

    def __init__(self, settings: ModelSettings) -> None:
        self.settings = settings
        self.manifest: Manifest | None = None
        self.package: ModelPackage | None = None
        self.pipeline = Pipeline()
        self._executor: ThreadPoolExecutor | None = None
        # Seconds per batch, a moving average; None until the first batch ran in the thread.
        self._average_s: float | None = None
        # Batches waiting for a move to the CPU: none runs inline meanwhile, where it could meet
        # the model half replaced.
        self._moves_pending = 0
        # Executors left behind by calls that timed out, until their thread returns; and whether
        # any call ever timed out (such a version never runs inline again: an inline call
        # cannot be timed out).
        self._abandoned: list[ThreadPoolExecutor] = []
        self._timed_out = False

    @abstractmethod
    def _load_model(self, package: ModelPackage) -> None:
        """Load the entry point onto the device `self.settings` allows and set `self.device`
        (runs in the executor). It replaces the loaded model only once the new one is ready, so
        a failed reload leaves the previous one serving."""

    @abstractmethod
    def _compute(self, feeds: Batch) -> Batch:
        """Run the graph on preprocessed inputs; outputs by name (runs in the executor)."""

    @abstractmethod
    def _release(self) -> None:
        """Drop the model and its device memory (runs in the executor)."""

    def _free_device_memory(self, device: str) -> None:
        """Return memory a backend caches on `device` once no model uses it (runs in the
        executor)."""

    @property
    def label(self) -> str:
        return f"{self.manifest.name} version {self.manifest.version}" if self.manifest else "?"

    async def load(self, package: ModelPackage) -> None:
        if self._executor is not None:
            raise ArtifactError(f"{self.label} is already loaded")
        self.manifest = package.manifest
        self.package = package
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
        device = self.device
        try:
            try:
                if self._inline():
                    outputs = self._timed_run(dict(inputs))
                else:
                    outputs = await self._call(self._timed_run, dict(inputs))
            except Exception as exc:
                reason = self._fallback_reason(device, exc)
                if reason is None:
                    raise
                self._moves_pending += 1
                try:
                    await self._call(self._fall_back_to_cpu, reason)
                finally:
                    self._moves_pending -= 1
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

    def abandon(self) -> None:
        executor = self._executor
        if executor is None or self.manifest is None:
            return
        self._timed_out = True
        # `_threads` is the executor's own record of its thread; a thread that has returned
        # from its call exits, since the executor is shut down.
        self._abandoned = [e for e in self._abandoned if any(t.is_alive() for t in e._threads)]
        if len(self._abandoned) >= _MAX_ABANDONED:
            _log.error(
                "%s: %d calls still hung past their timeout; no new thread",
                self.label,
                len(self._abandoned),
            )
            return
        executor.shutdown(wait=False)
        self._abandoned.append(executor)
        self._executor = ThreadPoolExecutor(1, thread_name_prefix=f"model-{self.label}")
        _log.warning("%s: a call ran past its timeout; later calls use a new thread", self.label)

    async def on_unload(self) -> None:
        executor, self._executor = self._executor, None
        if executor is None:
            return
        loop = asyncio.get_running_loop()
        try:
            await loop.run_in_executor(executor, self._release)
        except BaseException:
            executor.shutdown(wait=False)
            raise
        # The thread holds its last call, and through it this runtime, until it takes the next
        # item: the unload returns once it has exited, so the version is freed by then (a frozen
        # heap frees it by reference counting alone, `tidegate.core.heap`).
        await loop.run_in_executor(None, executor.shutdown, True)

    async def _call(self, function: Any, *args: Any) -> Any:
        if self._executor is None:
            raise ModelUnavailableError(f"{self.label} is not loaded")
        return await asyncio.get_running_loop().run_in_executor(self._executor, function, *args)

    def _load_sync(self, package: ModelPackage) -> None:
        self.pipeline = build_pipeline(package.manifest, package.directory)
        self._load_model(package)

    def _fallback_reason(self, device: str, error: Exception) -> str | None:
        """The CUDA failure that moves this version to the CPU, or None to fail the batch."""
        if device != "cuda" or not self.settings.cuda_fallback:
            return None
        reason = cuda_failure(error)
        return None if reason is None else reason[:_LOGGED_ERROR_CHARS]

    def _fall_back_to_cpu(self, reason: str) -> None:
        """Load the version again on the CPU (runs in the executor, so it is serialised with
        every batch of this version)."""
        if self.device != "cuda":
            # Batches that failed side by side each ask; the first one moved the version.
            return
        if self.package is None:
            raise ModelUnavailableError(f"{self.label} is not loaded")
        self.settings = self.settings.model_copy(update={"device": "cpu"})
        try:
            self._load_model(self.package)
        except Exception as exc:
            raise ModelExecutionError(
                f"{self.label} failed on CUDA ({reason}) and could not be loaded on the CPU: "
                f"{_one_line(exc)}"
            ) from exc
        # A failed CUDA context can fail its own clean-up too; the CPU copy does not need it.
        with contextlib.suppress(Exception):
            self._free_device_memory("cuda")
        # CUDA's timings say nothing about the CPU's: measure again, in the thread.
        self._average_s = None
        manifest = self.package.manifest
        MODEL_DEVICE_FALLBACKS.labels(manifest.name, manifest.version, "cuda", self.device).inc()
        _log.warning("%s moved from CUDA to the CPU after a CUDA failure: %s", self.label, reason)

    def _inline(self) -> bool:
        average = self._average_s
        if average is None or self._moves_pending or self._timed_out:
            return False
        return average * 1000.0 < self.settings.inline_below_ms

    def _timed_run(self, inputs: Batch) -> Batch:
        started = time.perf_counter()
        outputs = self._run_sync(inputs)
        took = time.perf_counter() - started
        average = self._average_s
        self._average_s = took if average is None else average + (took - average) * 0.1
        return outputs

    def _run_sync(self, inputs: Batch) -> Batch:
        return self.pipeline.after(self._compute(self.pipeline.before(inputs)))


def _one_line(error: BaseException) -> str:
    lines = [line.strip() for line in str(error).splitlines() if line.strip()]
    return (lines[0] if lines else type(error).__name__)[:_LOGGED_ERROR_CHARS]


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
