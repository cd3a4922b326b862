"""How a shadow candidate's outputs differ from the primary's, for one request (`compare`): sums,
not means, so that any set of requests can be added up and divided once.
The numbers and the model's task: docs/lifecycle.md ("Rollout").
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Literal

import numpy as np
import numpy.typing as npt

from tidegate.models.manifest import Manifest
from tidegate.schemas.signature import Signature

__all__ = ["Comparison", "Kind", "compare", "compared_outputs", "guess_task", "task_of"]

Kind = Literal["classifier", "embedding", "other"]

_CLASS_HINTS = ("prob", "logit", "class", "score")


@dataclass(frozen=True, slots=True)
class Comparison:
    rows: int
    abs_diff_sum: float
    values: int
    agree_rows: int | None = None
    cosine_sum: float | None = None


def task_of(manifest: Manifest) -> Kind:
    return manifest.task or guess_task(manifest.signature)


def guess_task(signature: Signature) -> Kind:
    """By the first output: named like an embedding, or like class probabilities over two or
    more classes; anything else is only compared value by value."""
    if not signature.outputs:
        return "other"
    first = signature.outputs[0]
    name = first.name.lower()
    if "embed" in name:
        return "embedding"
    two_d = len(first.shape) == 2 and first.shape[1] >= 2
    if two_d and any(hint in name for hint in _CLASS_HINTS):
        return "classifier"
    return "other"


def compared_outputs(
    primary: Mapping[str, npt.NDArray[Any]], candidate: Mapping[str, npt.NDArray[Any]]
) -> list[str]:
    """The numeric outputs both versions gave, in the primary's order (texts are not compared)."""
    return [
        name
        for name, array in primary.items()
        if name in candidate and array.dtype.kind in "fiub" and candidate[name].dtype.kind in "fiub"
    ]


def compare(
    kind: Kind,
    primary: Mapping[str, npt.NDArray[Any]],
    candidate: Mapping[str, npt.NDArray[Any]],
    names: Sequence[str],
) -> Comparison:
    """Compare one request's outputs (its rows only). The first name is the one whose classes or
    vectors are compared. `ValueError` when the two disagree on a shape: nothing to compare."""
    if not names:
        raise ValueError("the versions have no numeric output in common")
    abs_diff, values = 0.0, 0
    for name in names:
        p, c = _float(primary[name]), _float(candidate[name])
        if p.shape != c.shape:
            raise ValueError(f"output {name!r} is {list(c.shape)}, the primary's {list(p.shape)}")
        abs_diff += float(np.abs(p - c).sum())
        values += int(p.size)
    main_p, main_c = _float(primary[names[0]]), _float(candidate[names[0]])
    rows = int(main_p.shape[0]) if main_p.ndim else 1
    agree: int | None = None
    cosine: float | None = None
    if kind == "classifier" and main_p.ndim == 2:
        agree = int((main_p.argmax(axis=1) == main_c.argmax(axis=1)).sum())
    elif kind == "embedding" and main_p.ndim >= 1:
        cosine = _cosine_sum(main_p.reshape(rows, -1), main_c.reshape(rows, -1))
    return Comparison(rows, abs_diff, values, agree, cosine)


def _float(array: npt.NDArray[Any]) -> npt.NDArray[np.float64]:
    return np.asarray(array, dtype=np.float64)


def _cosine_sum(p: npt.NDArray[np.float64], c: npt.NDArray[np.float64]) -> float:
    dots = np.einsum("ij,ij->i", p, c)
    norms = np.linalg.norm(p, axis=1) * np.linalg.norm(c, axis=1)
    # A zero vector has no direction: it agrees with nothing, not even another zero vector.
    cosines = np.divide(dots, norms, out=np.zeros_like(dots), where=norms > 0)
    return float(cosines.sum())
