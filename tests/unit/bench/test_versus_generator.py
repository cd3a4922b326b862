"""Both HTTP contenders of part versus get the same generator: vegeta unless told otherwise."""

from __future__ import annotations

import pytest

from tests.bench import vegeta, versus


def test_vegeta_is_the_default_and_a_missing_one_stops_the_part(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.delenv("TIDEGATE_BENCH_HTTP_GENERATOR", raising=False)
    monkeypatch.setattr(vegeta, "available", lambda: True)
    assert versus.uses_vegeta()
    monkeypatch.setattr(vegeta, "available", lambda: False)
    with pytest.raises(SystemExit, match="bench-tools"):
        versus.uses_vegeta()


def test_the_python_generator_is_chosen_by_name_and_nothing_else_is_taken(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(vegeta, "available", lambda: False)
    monkeypatch.setenv("TIDEGATE_BENCH_HTTP_GENERATOR", "python")
    assert not versus.uses_vegeta()
    monkeypatch.setenv("TIDEGATE_BENCH_HTTP_GENERATOR", "wrk")
    with pytest.raises(SystemExit, match="not 'wrk'"):
        versus.uses_vegeta()
