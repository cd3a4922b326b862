"""The backtest diff report (dlq.backtest_report, dlq.backtest_html): its numbers checked by hand
and against a direct onnxruntime comparison, and its HTML page self-contained."""

from __future__ import annotations

import json
import re
from typing import Any

import numpy as np
import numpy.typing as npt
import onnx
import onnxruntime as ort
import pytest
from onnx import TensorProto, helper, numpy_helper
from rich.console import Console

from tidegate.dlq.backtest_report import BacktestRow, build_report, kind_of

P = "probabilities"


def _row(
    rid: str,
    served: npt.NDArray[Any] | None,
    candidate: npt.NDArray[Any] | None,
    *,
    served_ms: float | None = 10.0,
    candidate_ms: float = 5.0,
    error: str | None = None,
    version: str = "1",
) -> BacktestRow:
    return BacktestRow(
        rid,
        version,
        None if served is None else {P: served},
        served_ms,
        None if candidate is None else {P: candidate},
        candidate_ms,
        error,
    )


def _softmax_model(weights: npt.NDArray[np.float32]) -> ort.InferenceSession:
    """x (n, 8) -> probabilities (n, 3): softmax(x @ W), built and run by onnxruntime."""
    graph = helper.make_graph(
        [
            helper.make_node("MatMul", ["x", "W"], ["logits"]),
            helper.make_node("Softmax", ["logits"], [P], axis=1),
        ],
        "tiny",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["n", 8])],
        [helper.make_tensor_value_info(P, TensorProto.FLOAT, ["n", 3])],
        [numpy_helper.from_array(weights, "W")],
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    onnx.checker.check_model(model)
    return ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])


def test_agreement_equals_a_direct_onnxruntime_comparison_over_multi_row_requests() -> None:
    rng = np.random.default_rng(7)
    weights = rng.normal(size=(8, 3)).astype(np.float32)
    served_model = _softmax_model(weights)
    candidate_model = _softmax_model(weights + rng.normal(0, 0.4, (8, 3)).astype(np.float32))
    inputs = [rng.normal(size=(int(n), 8)).astype(np.float32) for n in rng.integers(1, 6, 200)]
    rows, all_served, all_cand = [], [], []
    for i, x in enumerate(inputs):
        served = served_model.run([P], {"x": x})[0]
        cand = candidate_model.run([P], {"x": x})[0]
        rows.append(_row(f"r{i}", served, cand))
        all_served.append(served)
        all_cand.append(cand)
    s, c = np.concatenate(all_served), np.concatenate(all_cand)
    direct = float((s.argmax(axis=1) == c.argmax(axis=1)).mean())

    report = build_report("tiny", "2", rows, task="classifier")

    assert 0.5 < direct < 1.0, "the candidate must disagree on some rows for the test to mean much"
    assert report.rows_compared == len(s), "every row of a multi-row request counts"
    assert report.agreement == pytest.approx(direct, abs=1e-6)
    out = report.to_json()["outputs"][P]
    diff = np.abs(s.astype(np.float64) - c.astype(np.float64))  # the report's differences are f64
    assert out["max_abs_diff"] == pytest.approx(float(diff.max()), abs=1e-12)
    assert out["mean_abs_diff"] == pytest.approx(float(diff.mean()), abs=1e-12)
    assert out["values"] == s.size


def test_confusion_counts_served_class_by_candidate_class() -> None:
    eye = np.eye(3, dtype=np.float32)
    rows = [
        _row("a", eye[[0, 1]], eye[[0, 2]]),  # 0->0, 1->2
        _row("b", eye[[2]], eye[[2]]),  # 2->2
        _row("c", eye[[1, 1]], eye[[2, 1]]),  # 1->2, 1->1
    ]
    data = build_report("m", "2", rows, task="classification").to_json()
    assert data["task"] == "classifier"
    assert data["confusion"]["matrix"] == [[1, 0, 0], [0, 1, 2], [0, 0, 1]]
    assert (data["agree_rows"], data["rows_compared"]) == (3, 5)
    assert data["agreement"] == pytest.approx(0.6)


def test_missing_served_and_candidate_errors_are_counted_not_compared() -> None:
    one = np.array([[0.2, 0.8]], dtype=np.float32)
    rows = [
        _row("ok", one, one),
        _row("gone", None, one, served_ms=None),
        _row("boom", one, None, error="ModelExecutionError: boom"),
        _row("shape", one, np.array([[0.2, 0.7, 0.1]], dtype=np.float32)),
    ]
    data = build_report("m", "2", rows, task="classifier").to_json()
    assert (data["requests"], data["requests_compared"], data["rows_compared"]) == (4, 1, 1)
    assert (data["missing_served"], data["candidate_errors"]) == (1, 2)
    errors = {e["error"]: e["count"] for e in data["errors"]}
    assert errors["ModelExecutionError: boom"] == 1
    assert any(e.startswith("not comparable: output 'probabilities'") for e in errors)
    assert data["agreement"] == 1.0
    assert data["latency"]["served"]["count"] == 1, "latency is over compared requests only"


def test_top_rows_are_the_largest_differences_with_both_classes() -> None:
    served = np.array([[0.9, 0.1]] * 4, dtype=np.float32)
    diffs = [0.0, 0.5, 0.1, 0.3]
    cand = np.array([[0.9 - d, 0.1 + d] for d in diffs], dtype=np.float32)
    rows = [_row("x", served[:2], cand[:2]), _row("y", served[2:], cand[2:])]
    top = build_report("m", "2", rows, task="classifier", top=2).to_json()["top"]
    assert [(t["request_id"], t["row"]) for t in top] == [("x", 1), ("y", 1)]
    assert top[0]["max_abs_diff"] == pytest.approx(0.5, abs=1e-6)
    assert (top[0]["served_class"], top[0]["candidate_class"]) == (0, 1)
    assert (top[1]["served_class"], top[1]["candidate_class"]) == (0, 0)


def test_latency_percentiles_interpolate_like_percentile_cont_on_both_sides() -> None:
    one = np.ones((1, 2), dtype=np.float32)
    rows = [_row(str(i), one, one, served_ms=float(i), candidate_ms=2.0 * i) for i in range(101)]
    latency = build_report("m", "2", rows).to_json()["latency"]
    assert latency["served"] == {
        "count": 101,
        "mean_ms": 50.0,
        "p50_ms": 50.0,
        "p95_ms": 95.0,
        "p99_ms": 99.0,
    }
    assert latency["candidate"]["p99_ms"] == pytest.approx(198.0)
    two = [_row("a", one, one, served_ms=1.0), _row("b", one, one, served_ms=2.0)]
    assert build_report("m", "2", two).to_json()["latency"]["served"]["p95_ms"] == 1.95


def test_other_models_are_compared_value_by_value_and_nan_is_a_difference() -> None:
    served = np.array([[1.0, 2.0], [3.0, np.nan]], dtype=np.float32)
    cand = np.array([[1.5, 2.0], [3.0, 4.0]], dtype=np.float32)
    rows = [_row("r", served, cand), _row("same-nan", served[1:], served[1:].copy())]
    report = build_report("m", "2", rows, task=None)
    data = report.to_json()
    assert kind_of(None) == "other"
    assert (data["agreement"], data["confusion"]) == (None, None)
    assert report.max_abs_diff == float("inf"), "a NaN where a number was served must show"
    assert data["max_abs_diff"] is None
    assert data["non_finite_values"] == 1, "NaN served and NaN again is no difference"
    assert data["outputs"][P]["max_abs_diff"] == pytest.approx(0.5)
    assert data["top"][0]["request_id"] == "r"
    assert data["top"][0]["row"] == 1
    json.dumps(data, allow_nan=False)


def test_embeddings_report_the_mean_cosine() -> None:
    served = np.array([[1.0, 0.0], [0.0, 1.0]], dtype=np.float32)
    cand = np.array([[1.0, 0.0], [1.0, 0.0]], dtype=np.float32)
    rows = [BacktestRow("e", "1", {"embedding": served}, 1.0, {"embedding": cand}, 1.0, None)]
    data = build_report("m", "2", rows, task="embedding").to_json()
    assert data["mean_cosine"] == pytest.approx(0.5)
    assert data["agreement"] is None


def _sample_rows() -> list[BacktestRow]:
    rng = np.random.default_rng(3)
    rows = []
    for i in range(30):
        served = rng.dirichlet(np.ones(3), size=2).astype(np.float32)
        cand = np.abs(served + rng.normal(0, 0.1, served.shape)).astype(np.float32)
        rows.append(_row(f"<script>alert({i})</script>", served, cand, served_ms=float(i)))
    rows.append(_row("err", rows[0].served[P] if rows[0].served else None, None, error="<b>x</b>"))
    return rows


def test_html_is_one_self_contained_page_with_plots_and_escaped_strings() -> None:
    page = build_report("fraud", "2", _sample_rows(), task="classifier").render_html()
    assert page.startswith("<!DOCTYPE html>")
    assert page.count("<svg") >= 2, "a histogram per output and the latency plot"
    assert "confusion" in page.lower()
    for outside in ("http://", "https://", "src=", "<link", "@import", "url("):
        assert outside not in page, outside
    assert "<script>" not in page
    assert "<b>x</b>" not in page
    assert "&lt;script&gt;alert(" in page


def test_json_is_serialisable_and_the_table_renders_without_reading_markup() -> None:
    rows = [*_sample_rows(), _row("[red]id[/red]", np.eye(2)[:1], np.eye(2)[1:])]
    report = build_report("fraud", "2", rows, task="classifier", top=50)
    json.dumps(report.to_json(), allow_nan=False)
    console = Console(record=True, width=200)
    console.print(report.render_table())
    text = console.export_text()
    assert "[red]id[/red]" in text
    assert re.search(r"agreement\s+│\s+0\.\d+", text)
    assert "confusion" in text
