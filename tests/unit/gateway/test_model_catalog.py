"""The gateway's model catalog: what is served, and each version's signature, from the lifecycle
state alone (no artifact store)."""

from __future__ import annotations

import pytest

from tests.unit.agents.dataplane_support import lifecycle_state, registered
from tests.unit.gateway_harness import ECHO, FRAUD, MemoryLifecycle
from tidegate.core.errors import ModelNotFoundError, ModelUnavailableError
from tidegate.gateway.modelstate.model_catalog import ModelCatalog
from tidegate.lifecycle.domain import events as ev


def catalog(*payloads: ev.Payload) -> ModelCatalog:
    return ModelCatalog(MemoryLifecycle(lifecycle_state("m", *payloads)))


async def test_each_version_is_checked_against_the_signature_it_was_registered_with() -> None:
    models = catalog(
        *registered("1", signature_json=FRAUD.model_dump_json()),
        *registered("2", signature_json=ECHO.model_dump_json(), runtime="torch"),
        ev.Promoted("1"),
    )
    assert await models.signature("m") == FRAUD
    assert await models.signature("m", "1") == FRAUD
    assert await models.signature("m", "2") == ECHO
    meta = await models.metadata("m", "2")
    assert meta["platform"] == "pytorch_torchscript"
    assert meta["inputs"] == [{"name": "text", "datatype": "BYTES", "shape": [-1]}]
    assert (await models.metadata("m"))["platform"] == "onnxruntime_onnx"


async def test_a_version_without_a_usable_signature_is_unavailable_not_a_client_error() -> None:
    models = catalog(*registered("1"), ev.Promoted("1"))  # signature_json "{}"
    with pytest.raises(ModelUnavailableError, match="no usable signature"):
        await models.signature("m")


async def test_unknown_and_retired_versions_have_no_signature() -> None:
    models = catalog(
        *registered("1", "2", signature_json=FRAUD.model_dump_json()),
        ev.Promoted("1"),
        ev.Retired("2"),
    )
    with pytest.raises(ModelNotFoundError, match="retired"):
        await models.signature("m", "2")
    with pytest.raises(ModelNotFoundError, match="unknown"):
        await models.signature("m", "9")
