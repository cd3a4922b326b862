"""A pool's Kafka layout: its own requests topic per lane and its own consumer group, derived
from the default pool's, which is left exactly as it was."""

from __future__ import annotations

import pytest

from tidegate.core.errors import ConfigurationError
from tidegate.core.pool_names import check_pool
from tidegate.core.pools import pool_group, pool_topic_names, pool_topics
from tidegate.core.settings import TopicSettings


def test_a_pool_has_its_own_requests_topics_and_shares_the_rest() -> None:
    topics = TopicSettings()
    nlp = pool_topics(topics, "nlp")
    assert (nlp.requests, nlp.requests_batch) == (
        "inference-requests.nlp",
        "inference-requests-batch.nlp",
    )
    # Its own retry topics: a relay of its group reads them, and none of another pool's.
    assert nlp.retry_topics() == [f"inference-retry.nlp-{n}" for n in (1, 2, 3)]
    assert pool_topic_names(topics, "nlp") == [
        "inference-requests.nlp",
        "inference-requests-batch.nlp",
        *nlp.retry_topics(),
    ]
    own = {"requests", "requests_batch", "retry_prefix"}
    assert nlp.model_dump(exclude=own) == topics.model_dump(exclude=own)
    assert topics.requests == "inference-requests"  # a copy, not the settings changed
    assert pool_topics(topics, None) is topics


def test_a_pool_has_its_own_consumer_group() -> None:
    assert pool_group("tidegate-workers", "nlp") == "tidegate-workers.nlp"
    assert pool_group("tidegate-workers", None) == "tidegate-workers"


@pytest.mark.parametrize("bad", ["", "NLP", "-nlp", "n.lp", "n_lp", "n" * 41, "nlp "])
def test_a_pool_name_fits_topic_and_group_names(bad: str) -> None:
    with pytest.raises(ConfigurationError):
        check_pool(bad)
    with pytest.raises(ConfigurationError):
        pool_topics(TopicSettings(), bad)
    assert check_pool("cv-2") == "cv-2"
