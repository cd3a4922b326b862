"""What the gateway's HTTP protocol takes from uvicorn beyond its public API still holds.

`GatewayHttpProtocol` (tidegate.gateway's slow-client guard) subclasses uvicorn's
`HttpToolsProtocol`: nothing public lets a server bound header and body time, or refuse a request
once its head is parsed. It overrides the parser callbacks and reads the protocol's `parser`,
`cycle`, `pipeline`, `url` and `headers` and the cycle's `more_body` and `response_complete`.
pyproject.toml holds uvicorn to the minor release these checks and the slow-client tests
(tests/integration/gateway) were run on; a release that renames any of these fails here by name,
before the behaviour tests fail by symptom.
"""

from __future__ import annotations

import inspect
import re
import tomllib
from importlib.metadata import version
from pathlib import Path

from packaging.requirements import Requirement
from uvicorn.protocols.http.httptools_impl import HttpToolsProtocol, RequestResponseCycle

REPO = Path(__file__).resolve().parents[3]

CALLBACKS = (
    "connection_made",
    "connection_lost",
    "data_received",
    "on_message_begin",
    "on_headers_complete",
    "on_message_complete",
    "on_response_complete",
)
PROTOCOL_STATE = ("parser", "cycle", "pipeline", "url", "headers", "transport")
CYCLE_STATE = ("more_body", "response_complete")


def _assigned(cls: type, names: tuple[str, ...]) -> list[str]:
    source = inspect.getsource(cls)
    return [name for name in names if not re.search(rf"self\.{name}(: [^=]+)? =", source)]


def test_the_installed_uvicorn_is_within_the_tested_range() -> None:
    project = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]
    lines = [line for extra in project["optional-dependencies"].values() for line in extra]
    (spec,) = [Requirement(line) for line in lines if Requirement(line).name == "uvicorn"]
    assert spec.specifier.contains(version("uvicorn")), (version("uvicorn"), str(spec.specifier))
    # An upper bound below the next minor: 0.x minors may change the protocol's internals.
    assert any(s.operator == "<" for s in spec.specifier)


def test_the_callbacks_the_guard_overrides_exist() -> None:
    missing = [name for name in CALLBACKS if not callable(getattr(HttpToolsProtocol, name, None))]
    assert missing == []
    # The guard calls each with the arguments uvicorn's own implementation takes.
    params = {
        name: list(inspect.signature(getattr(HttpToolsProtocol, name)).parameters)
        for name in CALLBACKS
    }
    assert params["data_received"] == ["self", "data"]
    assert params["connection_made"] == ["self", "transport"]
    assert params["connection_lost"] == ["self", "exc"]
    assert params["on_headers_complete"] == ["self"]


def test_the_state_the_guard_reads_is_still_there() -> None:
    assert _assigned(HttpToolsProtocol, PROTOCOL_STATE) == []
    assert _assigned(RequestResponseCycle, CYCLE_STATE) == []
    assert callable(getattr(__import__("httptools").HttpRequestParser, "get_method", None))
