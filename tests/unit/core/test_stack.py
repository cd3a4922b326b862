"""The stack's topic layout derived from the settings, and `ensure_topics` against a fake admin."""

from __future__ import annotations

import os
from types import SimpleNamespace
from typing import Any

import pytest
from confluent_kafka import KafkaError, KafkaException

from tidegate.core.settings import RegistryServerSettings, TopicSettings
from tidegate.core.stack import TopicSpec, ensure_topics, topic_specs, wait_healthy


@pytest.fixture(autouse=True)
def _no_topic_env(monkeypatch: pytest.MonkeyPatch) -> None:
    # The developer's shell may override topics; these tests pin the defaults.
    for name in list(os.environ):
        if name.startswith(("TIDEGATE_TOPICS_", "TIDEGATE_REGISTRY_")):
            monkeypatch.delenv(name)


def by_name(specs: list[TopicSpec]) -> dict[str, TopicSpec]:
    return {s.name: s for s in specs}


def test_every_topic_of_the_settings_is_specified_once() -> None:
    topics = TopicSettings()
    names = [s.name for s in topic_specs(topics)]
    assert len(names) == len(set(names))
    assert set(names) == {
        topics.requests,
        topics.requests_batch,
        topics.results,
        topics.replies,
        topics.failed,
        topics.poison,
        *topics.retry_topics(),
        topics.lifecycle,
        topics.audit,
        topics.shadow,
        topics.breakers,
        RegistryServerSettings().topic,
    }


def test_default_layout() -> None:
    specs = by_name(topic_specs(TopicSettings()))
    assert specs["inference-requests"].partitions == 32
    assert specs["inference-requests-batch"].partitions == 32
    assert specs["inference-results"].partitions == 32
    assert specs["inference-failed-requests"].partitions == 4
    assert specs["inference-poison-pill"].partitions == 4
    assert specs["inference-replies"].partitions == 16
    assert all(s.replication_factor == 1 for s in specs.values())
    assert specs["inference-requests"].config == {
        "cleanup.policy": "delete",
        "retention.ms": str(7 * 24 * 3600 * 1000),
    }
    assert specs["inference-poison-pill"].config["retention.ms"] == str(30 * 24 * 3600 * 1000)


def test_model_lifecycle_keeps_its_full_history() -> None:
    spec = by_name(topic_specs(TopicSettings()))["model-lifecycle"]
    # Never compacted, never expired: the lifecycle state is rebuilt by replaying every event.
    assert spec.config == {
        "cleanup.policy": "delete",
        "retention.ms": "-1",
        "retention.bytes": "-1",
    }
    assert spec.partitions == 1


def test_shadow_comparisons_are_partitioned_like_the_dlq_and_kept_like_results() -> None:
    topics = TopicSettings(dlq_partitions=3, retention_ms=86_400_000)
    spec = by_name(topic_specs(topics))["shadow-comparisons"]
    assert spec.partitions == 3
    assert spec.config == {"cleanup.policy": "delete", "retention.ms": "86400000"}


def test_registry_topic_is_one_compacted_partition() -> None:
    spec = by_name(topic_specs(TopicSettings(), RegistryServerSettings(topic="_my_schemas")))
    assert spec["_my_schemas"].partitions == 1
    assert spec["_my_schemas"].config == {"cleanup.policy": "compact"}


def test_settings_from_the_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("TIDEGATE_TOPICS_PARTITIONS", "8")
    monkeypatch.setenv("TIDEGATE_TOPICS_DLQ_PARTITIONS", "2")
    monkeypatch.setenv("TIDEGATE_TOPICS_REPLICATION_FACTOR", "3")
    monkeypatch.setenv("TIDEGATE_TOPICS_REQUESTS", "reqs")
    monkeypatch.setenv("TIDEGATE_TOPICS_RETENTION_MS", "-1")
    specs = by_name(topic_specs(TopicSettings()))
    assert specs["reqs"].partitions == 8
    assert specs["reqs"].config["retention.ms"] == "-1"
    assert specs["inference-results"].partitions == 8
    assert specs["inference-failed-requests"].partitions == 2
    assert {s.replication_factor for s in specs.values()} == {3}


class FakeFuture:
    def __init__(self, error: KafkaException | None = None) -> None:
        self.error = error

    def result(self, timeout: float | None = None) -> None:
        if self.error is not None:
            raise self.error


class FakeAdmin:
    """Enough of AdminClient for ensure_topics: a topic listing and create_topics."""

    def __init__(self, existing: dict[str, int], racing: frozenset[str] = frozenset()) -> None:
        self.existing = existing
        self.racing = racing
        self.created: list[Any] = []

    def list_topics(self, timeout: float) -> SimpleNamespace:
        topics = {
            name: SimpleNamespace(partitions=dict.fromkeys(range(n)))
            for name, n in self.existing.items()
        }
        return SimpleNamespace(topics=topics)

    def create_topics(self, new: list[Any], **_: Any) -> dict[str, FakeFuture]:
        self.created.extend(new)
        exists = KafkaException(KafkaError(KafkaError.TOPIC_ALREADY_EXISTS))
        return {t.topic: FakeFuture(exists if t.topic in self.racing else None) for t in new}


def test_ensure_topics_creates_only_the_missing_ones_and_reports_differences() -> None:
    specs = [
        TopicSpec("a", 4, 1, {"cleanup.policy": "delete"}),
        TopicSpec("b", 32, 1),
        TopicSpec("c", 1, 1, {"retention.ms": "-1"}),
    ]
    admin = FakeAdmin(existing={"b": 16})
    result = ensure_topics(admin, specs)  # type: ignore[arg-type]
    assert result.created == ["a", "c"]
    assert result.existing == ["b"]
    assert result.mismatched == {"b": (32, 16)}
    created = {t.topic: t for t in admin.created}
    assert created["a"].num_partitions == 4
    assert created["a"].replication_factor == 1
    assert created["c"].config == {"retention.ms": "-1"}


def test_ensure_topics_accepts_a_topic_created_concurrently() -> None:
    admin = FakeAdmin(existing={}, racing=frozenset({"a"}))
    result = ensure_topics(admin, [TopicSpec("a", 1, 1)])  # type: ignore[arg-type]
    assert result.created == []
    assert result.existing == ["a"]


def test_ensure_topics_raises_other_errors() -> None:
    class Refusing(FakeAdmin):
        def create_topics(self, new: list[Any], **_: Any) -> dict[str, FakeFuture]:
            error = KafkaException(KafkaError(KafkaError.INVALID_REPLICATION_FACTOR))
            return {t.topic: FakeFuture(error) for t in new}

    with pytest.raises(KafkaException):
        ensure_topics(Refusing(existing={}), [TopicSpec("a", 1, 3)])  # type: ignore[arg-type]


def test_wait_healthy_retries_until_the_probe_succeeds() -> None:
    calls: list[float] = []

    def probe(timeout: float) -> str:
        calls.append(timeout)
        if len(calls) < 3:
            raise ConnectionError("not yet")
        return "fine"

    assert wait_healthy(probe, 10.0) == "fine"
    assert len(calls) == 3


def test_wait_healthy_gives_up_with_the_last_error() -> None:
    def probe(timeout: float) -> str:
        raise ConnectionError("refused")

    with pytest.raises(ConnectionError, match="refused"):
        wait_healthy(probe, 0.0)
