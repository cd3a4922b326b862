"""Exporting trained torch modules: ONNX through the legacy TorchScript-based exporter (stable,
deterministic graphs with a dynamic batch axis) and TorchScript."""

from __future__ import annotations

import contextlib
import warnings
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

__all__ = ["ONNX_OPSET", "export_onnx", "export_torchscript", "load_torchscript", "single_thread"]

ONNX_OPSET = 17


@contextlib.contextmanager
def single_thread() -> Iterator[None]:
    """One intra-op thread while building: float reductions then add up in one order, so the
    same seed gives the same weights, bit for bit, on any machine."""
    import torch

    before = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        yield
    finally:
        torch.set_num_threads(before)


def export_onnx(
    module: Any,
    example: tuple[Any, ...],
    path: Path,
    inputs: Sequence[str],
    outputs: Sequence[str],
    dynamic_axes: dict[str, dict[int, str]],
) -> None:
    import torch

    module.eval()
    with warnings.catch_warnings():
        # The legacy exporter announces its own deprecation and traces Python branches; both
        # are expected here, and the graph is checked against torch after export.
        warnings.simplefilter("ignore")
        torch.onnx.export(
            module,
            example,
            str(path),
            dynamo=False,
            opset_version=ONNX_OPSET,
            input_names=list(inputs),
            output_names=list(outputs),
            dynamic_axes=dynamic_axes,
            do_constant_folding=True,
        )


def export_torchscript(module: Any, path: Path) -> None:
    import torch

    module.eval()
    with warnings.catch_warnings():
        # torch 2.9+ marks TorchScript deprecated; it is still the format that carries Python
        # control flow (fraud v3's data-dependent failure), so the notice is expected.
        warnings.simplefilter("ignore", FutureWarning)
        scripted = torch.jit.script(module)
        torch.jit.save(scripted, str(path))


def load_torchscript(path: Path) -> Any:
    import torch

    with warnings.catch_warnings():
        warnings.simplefilter("ignore", FutureWarning)
        return torch.jit.load(str(path))  # type: ignore[no-untyped-call]
