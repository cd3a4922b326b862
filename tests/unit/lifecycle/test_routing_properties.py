"""Weighted routing over any weights (property tests): a key's version depends only on the key
and the weights, raising one version's weight only moves keys onto that version, and over many
keys each version's share converges to its weight (a version of weight 0 gets none)."""

from __future__ import annotations

from collections import Counter

from hypothesis import given, settings
from hypothesis import strategies as st

from tidegate.lifecycle.domain.routing import choose_weighted

SALT = "fraud"
KEYS = [f"card-{i}" for i in range(300)]
MANY_KEYS = [f"key-{i}" for i in range(10_000)]

WEIGHTS = st.dictionaries(
    st.sampled_from(["1", "2", "3", "4"]), st.integers(0, 100), min_size=1, max_size=4
).filter(lambda w: sum(w.values()) > 0)


@settings(max_examples=50)
@given(WEIGHTS, st.data())
def test_a_key_stays_on_its_version_whatever_order_the_weights_come_in(
    weights: dict[str, int], data: st.DataObject
) -> None:
    listed = list(weights.items())
    shuffled = data.draw(st.permutations(listed))
    for key in KEYS:
        chosen = choose_weighted(SALT, key, listed)
        assert weights[chosen] > 0
        assert choose_weighted(SALT, key, shuffled) == chosen
        assert choose_weighted(SALT, key, listed) == chosen


@settings(max_examples=50)
@given(WEIGHTS, st.data())
def test_raising_a_weight_only_moves_keys_onto_that_version(
    weights: dict[str, int], data: st.DataObject
) -> None:
    raised = data.draw(st.sampled_from(sorted(weights)))
    more = {**weights, raised: weights[raised] + data.draw(st.integers(1, 100))}
    for key in KEYS:
        before = choose_weighted(SALT, key, weights.items())
        after = choose_weighted(SALT, key, more.items())
        assert after in (before, raised), (key, before, after)


@settings(max_examples=25)
@given(WEIGHTS)
def test_each_versions_share_of_many_keys_converges_to_its_weight(
    weights: dict[str, int],
) -> None:
    total = sum(weights.values())
    shares = Counter(choose_weighted(SALT, key, weights.items()) for key in MANY_KEYS)
    for version, weight in weights.items():
        # 10,000 keys: a share's standard deviation is at most 0.005, and 0.025 is 5 of them.
        assert abs(shares[version] / len(MANY_KEYS) - weight / total) < 0.025, (version, shares)
