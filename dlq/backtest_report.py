"""The diff report of a backtest: a candidate version re-scored on requests that were served,
next to what was served.

It is built from plain rows (`BacktestRow`) that the runner assembles, so the numbers can be
checked against a direct runtime comparison without Kafka or a database. The definitions are the
shadow comparison's (`tidegate.agents.inference.compare`), applied to a time range instead of a
sample, so a backtest and a shadow run of the same candidate speak the same language
(docs/backtest.md):

* a request is *compared* when it has a served result and a candidate result with at least one
  numeric output in common of equal shapes; one without a served result is `missing_served`, one
  the candidate failed on (or whose shapes differ: "not comparable") is a `candidate_error`;
* every row of a compared request counts: rows are the first compared output's first dimension;
* agreement (classifiers): rows whose argmax of the first compared output is equal on both
  sides / rows compared, exactly the shadow comparison's `agree_rows / rows`;
* mean abs difference of an output: the sum of |served - candidate| over its values / its
  values; max: the largest such value; both in float64;
* mean cosine (embeddings): the mean over rows of the cosine similarity, zero vectors agreeing
  with nothing;
* latency: percentiles (linear, like PostgreSQL's percentile_cont) over compared requests.

What the outputs mean (`task`) is the caller's to say: `tidegate.agents.inference.compare.task_of`
on the version's manifest gives it. The dlq layer sits below the workers, so the report cannot ask
that rule itself, and a second guessing rule here would drift from the shadow's.
"""

from __future__ import annotations

import heapq
import itertools
import math
from collections import Counter
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Literal

import numpy as np
import numpy.typing as npt
from rich.console import Group
from rich.table import Table
from rich.text import Text

from tidegate.dlq import backtest_html
from tidegate.lifecycle.domain.windows import percentile

__all__ = ["BacktestReport", "BacktestRow", "Kind", "build_report", "kind_of"]

Kind = Literal["classifier", "embedding", "other"]
Arrays = dict[str, npt.NDArray[np.float64]]

_KINDS: Mapping[str, Kind] = {
    "classifier": "classifier",
    "classification": "classifier",
    "embedding": "embedding",
}
_BINS = 20
_MATRIX_MAX_CLASSES = 64
"""Wider classifiers list their most frequent (served, candidate) pairs instead of a matrix."""


@dataclass(frozen=True, slots=True)
class BacktestRow:
    request_id: str
    served_version: str | None
    served: dict[str, npt.NDArray[Any]] | None
    """The outputs that were served; None when no served result was found."""
    served_ms: float | None
    """The served result's `timings.total_ms` (or `compute_ms`)."""
    candidate: dict[str, npt.NDArray[Any]] | None
    """The candidate's outputs; None when the candidate failed."""
    candidate_ms: float
    candidate_error: str | None


@dataclass(slots=True)
class _Output:
    values: int = 0
    abs_sum: float = 0.0
    max_abs: float = 0.0
    non_finite: int = 0
    """Values whose difference is NaN or infinite (one side NaN or inf, the other not): kept out
    of the sum and max, counted here, and they make the report's `max_abs_diff` infinite."""
    row_max: list[npt.NDArray[np.float64]] = field(default_factory=list)
    """Per compared row, the largest absolute difference of this output: the histogram's data."""

    def to_json(self) -> dict[str, Any]:
        data = np.concatenate(self.row_max) if self.row_max else np.zeros(0)
        top = float(data.max()) if data.size else 0.0
        counts, edges = np.histogram(data, bins=_BINS, range=(0.0, top or 1.0))
        return {
            "values": self.values,
            "mean_abs_diff": self.abs_sum / self.values if self.values else None,
            "max_abs_diff": self.max_abs if self.values else None,
            "non_finite": self.non_finite,
            "histogram": {"edges": edges.tolist(), "counts": counts.tolist()},
        }


@dataclass(slots=True)
class _Classes:
    rows: int = 0
    agree: int = 0
    classes: int = 0
    pairs: Counter[tuple[int, int]] = field(default_factory=Counter)

    def to_json(self) -> dict[str, Any]:
        if self.classes <= _MATRIX_MAX_CLASSES:
            matrix = [[self.pairs[s, c] for c in range(self.classes)] for s in range(self.classes)]
            return {"classes": self.classes, "matrix": matrix, "pairs": None}
        common = [[s, c, n] for (s, c), n in self.pairs.most_common(200)]
        return {"classes": self.classes, "matrix": None, "pairs": common}


@dataclass(slots=True)
class BacktestReport:
    """Every count and sum of one backtest; `to_json` derives the ratios from them."""

    model: str
    candidate: str
    task: Kind
    requests: int = 0
    requests_compared: int = 0
    rows_compared: int = 0
    missing_served: int = 0
    candidate_errors: int = 0
    baseline_versions: list[str] = field(default_factory=list)
    errors: list[tuple[str, int]] = field(default_factory=list)
    skipped_outputs: list[str] = field(default_factory=list)
    outputs: dict[str, _Output] = field(default_factory=dict)
    classes: _Classes | None = None
    cosine_sum: float | None = None
    served_ms: list[float] = field(default_factory=list)
    candidate_ms: list[float] = field(default_factory=list)
    top: list[dict[str, Any]] = field(default_factory=list)

    @property
    def agreement(self) -> float | None:
        """Rows whose argmax agrees / rows compared; classifiers only."""
        if self.classes is None or not self.classes.rows:
            return None
        return self.classes.agree / self.classes.rows

    @property
    def mean_cosine(self) -> float | None:
        if self.cosine_sum is None or not self.rows_compared:
            return None
        return self.cosine_sum / self.rows_compared

    @property
    def max_abs_diff(self) -> float | None:
        """The largest absolute difference of any compared value of any output; infinite when
        a difference was NaN or infinite (JSON shows null and `non_finite_values`)."""
        if any(o.non_finite for o in self.outputs.values()):
            return math.inf
        return max((o.max_abs for o in self.outputs.values() if o.values), default=None)

    def to_json(self) -> dict[str, Any]:
        return {
            "model": self.model,
            "candidate": self.candidate,
            "task": self.task,
            "baseline_versions": list(self.baseline_versions),
            "requests": self.requests,
            "requests_compared": self.requests_compared,
            "rows_compared": self.rows_compared,
            "missing_served": self.missing_served,
            "candidate_errors": self.candidate_errors,
            "errors": [{"error": e, "count": n} for e, n in self.errors],
            "agreement": self.agreement,
            "agree_rows": self.classes.agree if self.classes else None,
            "mean_cosine": self.mean_cosine,
            "max_abs_diff": _finite(self.max_abs_diff),
            "non_finite_values": sum(o.non_finite for o in self.outputs.values()),
            "outputs": {name: o.to_json() for name, o in self.outputs.items()},
            "skipped_outputs": list(self.skipped_outputs),
            "confusion": self.classes.to_json() if self.classes else None,
            "latency": {
                "served": _latency(self.served_ms),
                "candidate": _latency(self.candidate_ms),
            },
            "top": [{**t, "max_abs_diff": _finite(t["max_abs_diff"])} for t in self.top],
        }

    def render_table(self) -> Group:
        return _tables(self.to_json())

    def render_html(self) -> str:
        return backtest_html.render(self.to_json())


def kind_of(task: str | None) -> Kind:
    """`classifier` and `embedding` (also spelled `classification`); anything else, None
    included, is compared value by value only."""
    return _KINDS.get((task or "").lower(), "other")


def build_report(
    model: str,
    candidate: str,
    rows: Sequence[BacktestRow],
    *,
    task: str | None = None,
    top: int = 20,
) -> BacktestReport:
    """Compare every row; `top` bounds the rows listed as disagreeing most."""
    kind = kind_of(task)
    report = BacktestReport(model, candidate, kind, requests=len(rows))
    report.cosine_sum = 0.0 if kind == "embedding" else None
    errors: Counter[str] = Counter()
    skipped: set[str] = set()
    baselines: set[str] = set()
    worst: list[tuple[float, int, dict[str, Any]]] = []
    order = itertools.count()
    for row in rows:
        if row.served is None:
            report.missing_served += 1
            continue
        if row.served_version is not None:
            baselines.add(row.served_version)
        if row.candidate is None:
            report.candidate_errors += 1
            errors[row.candidate_error or "the candidate gave no outputs"] += 1
            continue
        names = _compared_outputs(row.served, row.candidate)
        served = {n: np.asarray(row.served[n], dtype=np.float64) for n in names}
        cand = {n: np.asarray(row.candidate[n], dtype=np.float64) for n in names}
        mismatch = _mismatch(served, cand, names)
        if mismatch:
            report.candidate_errors += 1
            errors[f"not comparable: {mismatch}"] += 1
            continue
        skipped.update(n for n in row.served if n not in names)
        for entry in _compare(report, kind, row.request_id, served, cand, names):
            item = (float(entry["max_abs_diff"]), -next(order), entry)
            if len(worst) < top:
                heapq.heappush(worst, item)
            elif top > 0 and item[:2] > worst[0][:2]:
                heapq.heapreplace(worst, item)
        report.requests_compared += 1
        if row.served_ms is not None:
            report.served_ms.append(float(row.served_ms))
        report.candidate_ms.append(float(row.candidate_ms))
    report.baseline_versions = sorted(baselines)
    report.errors = errors.most_common(10)
    report.skipped_outputs = sorted(skipped)
    report.top = [e for *_, e in sorted(worst, key=lambda w: w[:2], reverse=True)]
    return report


def _compared_outputs(
    served: Mapping[str, npt.NDArray[Any]], candidate: Mapping[str, npt.NDArray[Any]]
) -> list[str]:
    """The shadow's rule (`agents.inference.compare.compared_outputs`): numeric outputs both gave,
    in the served order."""
    return [
        name
        for name, array in served.items()
        if name in candidate and array.dtype.kind in "fiub" and candidate[name].dtype.kind in "fiub"
    ]


def _mismatch(served: Arrays, cand: Arrays, names: list[str]) -> str | None:
    if not names:
        return "the versions have no numeric output in common"
    for name in names:
        if served[name].shape != cand[name].shape:
            return f"output {name!r} is {list(cand[name].shape)}, served {list(served[name].shape)}"
    return None


def _compare(
    report: BacktestReport, kind: Kind, rid: str, served: Arrays, cand: Arrays, names: list[str]
) -> list[dict[str, Any]]:
    """Add one request's rows to the report; return its rows' entries for the top list."""
    main_s, main_c = served[names[0]], cand[names[0]]
    rows = int(main_s.shape[0]) if main_s.ndim else 1
    row_max = np.zeros(rows)
    row_output = np.full(rows, names[0], dtype=object)
    for name in names:
        s, c = served[name], cand[name]
        with np.errstate(invalid="ignore"):
            diff = np.where((s == c) | (np.isnan(s) & np.isnan(c)), 0.0, np.abs(s - c))
        bad = ~np.isfinite(diff)
        diff[bad] = 0.0
        per_row = diff.reshape(rows, -1).max(axis=1, initial=0.0)
        out = report.outputs.setdefault(name, _Output())
        out.values += int(diff.size)
        out.non_finite += int(bad.sum())
        out.abs_sum += float(diff.sum())
        out.max_abs = max(out.max_abs, float(diff.max(initial=0.0)))
        out.row_max.append(per_row)
        score = np.where(bad.reshape(rows, -1).any(axis=1), np.inf, per_row)
        bigger = score > row_max
        row_max = np.where(bigger, score, row_max)
        row_output = np.where(bigger, name, row_output)
    report.rows_compared += rows
    s_class: npt.NDArray[np.intp] | None = None
    c_class: npt.NDArray[np.intp] | None = None
    if kind == "classifier" and main_s.ndim == 2:
        s_class, c_class = main_s.argmax(axis=1), main_c.argmax(axis=1)
        classes = report.classes = report.classes or _Classes()
        classes.rows += rows
        classes.agree += int((s_class == c_class).sum())
        classes.classes = max(classes.classes, int(main_s.shape[1]))
        classes.pairs.update(zip(s_class.tolist(), c_class.tolist(), strict=True))
    elif kind == "embedding" and main_s.ndim >= 1 and report.cosine_sum is not None:
        report.cosine_sum += _cosine_sum(main_s.reshape(rows, -1), main_c.reshape(rows, -1))
    return [
        {
            "request_id": rid,
            "row": i,
            "max_abs_diff": float(row_max[i]),
            "output": str(row_output[i]),
            "served_class": None if s_class is None else int(s_class[i]),
            "candidate_class": None if c_class is None else int(c_class[i]),
        }
        for i in range(rows)
    ]


def _cosine_sum(p: npt.NDArray[np.float64], c: npt.NDArray[np.float64]) -> float:
    dots = np.einsum("ij,ij->i", p, c)
    norms = np.linalg.norm(p, axis=1) * np.linalg.norm(c, axis=1)
    cosines = np.divide(dots, norms, out=np.zeros_like(dots), where=norms > 0)
    return float(cosines.sum())


def _finite(value: float | None) -> float | None:
    return value if value is None or math.isfinite(value) else None


def _latency(samples: list[float]) -> dict[str, Any]:
    ordered = sorted(samples)
    return {
        "count": len(ordered),
        "mean_ms": sum(ordered) / len(ordered) if ordered else None,
        "p50_ms": percentile(ordered, 0.5),
        "p95_ms": percentile(ordered, 0.95),
        "p99_ms": percentile(ordered, 0.99),
    }


def _num(value: Any, digits: int = 6) -> str:
    if value is None:
        return "-"
    return f"{value:.{digits}g}" if isinstance(value, float) else str(value)


def _tables(data: Mapping[str, Any]) -> Group:
    """The terminal view of `to_json()`: summary, outputs, latency, confusion, the worst rows.
    Every value is a `Text`, so a request id like `[red]` is shown, not read as markup."""
    summary = Table(title=Text(f"backtest {data['model']} {data['candidate']}"), show_header=False)
    for key in backtest_html.SUMMARY_KEYS:
        value = data[key]
        summary.add_row(key, Text(", ".join(value) if isinstance(value, list) else _num(value)))
    outputs = Table("output", "values", "mean abs diff", "max abs diff", title="outputs")
    for name, o in data["outputs"].items():
        outputs.add_row(*_texts(name, o["values"], o["mean_abs_diff"], o["max_abs_diff"]))
    lat = Table("side", "count", "mean ms", "p50 ms", "p95 ms", "p99 ms", title="latency")
    for side, s in data["latency"].items():
        lat.add_row(side, str(s["count"]), *(_num(s[k], 4) for k in _LAT_KEYS))
    tables: list[Table] = [summary, outputs, lat]
    matrix = (data["confusion"] or {}).get("matrix")
    if matrix and len(matrix) <= _TERMINAL_CLASSES:
        confusion = Table("served \\ candidate", *map(str, range(len(matrix))), title="confusion")
        for s_class, counts in enumerate(matrix):
            confusion.add_row(str(s_class), *map(str, counts))
        tables.append(confusion)
    worst = Table("request", "row", "output", "max abs diff", "served", "candidate", title="top")
    for t in data["top"]:
        worst.add_row(*_texts(*(t[k] for k in _TOP_KEYS)))
    tables.append(worst)
    return Group(*tables)


def _texts(*values: Any) -> list[Text]:
    return [Text(_num(v)) for v in values]


_LAT_KEYS = ("mean_ms", "p50_ms", "p95_ms", "p99_ms")
_TOP_KEYS = ("request_id", "row", "output", "max_abs_diff", "served_class", "candidate_class")
_TERMINAL_CLASSES = 16
