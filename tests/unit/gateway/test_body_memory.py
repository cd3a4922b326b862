"""What one JSON call can make the gateway hold is bounded by the record cap, not by the body's
size (docs/security.md): each parsed value costs about 24 bytes however short its text, so a
body of many tiny values is refused before it is parsed, and the body limit follows the record
cap unless set."""

from __future__ import annotations

import json
import tracemalloc
from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from tests.unit.gateway_harness import Harness
from tidegate.gateway.gateway_settings import GatewaySettings
from tidegate.gateway.http_errors import PayloadTooLargeError
from tidegate.gateway.v2api.gateway_runtime import GatewayRuntime
from tidegate.gateway.v2api.infer import InferCall, Inference

RECORD_CAP = 100_000


@pytest.fixture
async def inference(tmp_path: Path) -> AsyncIterator[Inference]:
    harness = Harness(tmp_path, max_record_bytes=RECORD_CAP, max_body_bytes=None)
    runtime = GatewayRuntime(harness.config, harness.services)
    await runtime.start()
    yield runtime.inference
    await runtime.stop()


def tiny_values(count: int) -> bytes:
    data = "[" + ",".join(["0"] * count) + "]"
    body = {"inputs": [{"name": "features", "datatype": "FP32", "shape": [count], "data": 0}]}
    return json.dumps(body).replace('"data": 0', f'"data": {data}').encode()


async def test_more_values_than_a_record_holds_are_refused_before_parsing(
    inference: Inference,
) -> None:
    body = tiny_values(4 * RECORD_CAP)  # 0.8 MB of text, 9.6 MB as Python objects
    tracemalloc.start()
    try:
        outcome = await inference.infer(InferCall("fraud", None, body))
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert isinstance(outcome.error, PayloadTooLargeError)
    assert "binary data" in str(outcome.error)
    assert peak < len(body), f"{peak} bytes held for a {len(body)}-byte body"


async def test_a_body_a_record_can_hold_is_still_parsed(inference: Inference) -> None:
    outcome = await inference.infer(InferCall("fraud", None, tiny_values(64)))
    assert not isinstance(outcome.error, PayloadTooLargeError)


def test_the_body_limit_follows_the_record_cap_unless_set() -> None:
    assert GatewaySettings(max_record_bytes=1_000_000).body_limit == 8_000_000
    assert GatewaySettings(max_record_bytes=2_000_000).body_limit == 16_000_000
    assert GatewaySettings(max_body_bytes=4096).body_limit == 4096
