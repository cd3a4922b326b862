"""The gateway against its own OpenAPI, with schemathesis: every operation, a bounded number of
generated requests each (deterministic: derandomized), and every response checked for a 5xx, a
status the document does not list, a media type it does not give, a body that does not match its
schema, and a required header that is missing.

The run calls as an admin (`Authenticator.fixed`), who may call everything; a second run calls
with authentication on and no credentials, and every operation that is not public must answer
its documented 401. The app is the real one (`create_app` with /admin and /admin/dlq): the V2
backends are the unit harness's fakes (a fake worker answers in memory), /admin runs the real
lifecycle commands on PostgreSQL (a schema of this test's own), and /admin/dlq reads and
redrives real Kafka topics of this test's own, so a generated redrive never touches anyone's
dead letters. No 5xx is a designed answer here: the stack is up, and the fake worker serves
every warm version and never fails (a real model error is the 500 MODEL_ERROR the document
lists).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import hypothesis
import hypothesis.errors
import pytest
import schemathesis
from hypothesis import HealthCheck, Phase
from schemathesis import GenerationMode
from schemathesis.checks import not_a_server_error
from schemathesis.core.failures import Failure, FailureGroup
from schemathesis.core.result import Ok
from schemathesis.python.asgi import get_client, shutdown_lifespans
from schemathesis.specs.openapi.checks import (
    content_type_conformance,
    response_headers_conformance,
    response_schema_conformance,
    status_code_conformance,
)

from tests.unit.gateway_harness import Harness
from tidegate.core.settings import PostgresSettings, TopicSettings
from tidegate.gateway.admin.lifecycle_api import lifecycle_admin
from tidegate.gateway.app import create_app
from tidegate.gateway.auth.auth_settings import AuthSettings
from tidegate.gateway.auth.authn import Authenticator
from tidegate.gateway.auth.identity import Identity, grants_of
from tidegate.gateway.openapi.openapi_docs import PERMISSION_KEY

CHECKS = [
    not_a_server_error,
    status_code_conformance,
    content_type_conformance,
    response_schema_conformance,
    response_headers_conformance,
]
# Per operation: valid requests, then invalid ones (a wrong type, a missing field, ...), which
# must be documented 4xx problems too. Each DLQ read opens a Kafka consumer: fewer of those.
EXAMPLES = {GenerationMode.POSITIVE: 20, GenerationMode.NEGATIVE: 10}
EXAMPLES_KAFKA = 4


ADMIN = Identity("local:openapi-conformance", "local", grants_of(["admin"]))
Api = Callable[[Authenticator], schemathesis.BaseSchema]


@pytest.fixture
def api(
    tmp_path: Path,
    packages: Path,
    pg_settings: PostgresSettings,
    lifecycle_topic: str,
    new_topic: Callable[..., str],
    monkeypatch: pytest.MonkeyPatch,
) -> Iterator[Api]:
    """The schema of a gateway app that authenticates with the given authenticator."""
    monkeypatch.setenv("TIDEGATE_POSTGRES_DB_SCHEMA", pg_settings.db_schema)
    monkeypatch.setenv("TIDEGATE_MODELS_STORE_DIR", str(tmp_path / "store"))
    monkeypatch.setenv("TIDEGATE_MODELS_PACKAGES_ROOT", str(packages))
    harness = Harness(tmp_path)
    topics = TopicSettings(
        requests=new_topic("it-oas-requests"),
        lifecycle=lifecycle_topic,
        failed=new_topic("it-oas-failed"),
        poison=new_topic("it-oas-poison"),
    )
    config = dataclasses.replace(harness.config, topics=topics)

    def build(authenticator: Authenticator) -> schemathesis.BaseSchema:
        app = create_app(
            config,
            lambda _config: harness.services,
            admin=lifecycle_admin,
            authenticator=authenticator,
        )
        schema = schemathesis.openapi.from_dict(app.openapi())
        schema.app = app  # in-process, over ASGI; the app's lifespan starts with the first call
        return schema

    yield build
    shutdown_lifespans()


def _conforms(
    operation: Any,
    examples: int,
    mode: GenerationMode = GenerationMode.POSITIVE,
    expect: int | None = None,
) -> list[str]:
    """Run the checks over `examples` generated cases of one operation; the failures found
    (and every status but `expect`, when given)."""
    failures: list[str] = []

    @hypothesis.settings(
        max_examples=examples,
        derandomize=True,
        database=None,
        deadline=None,
        phases=[Phase.explicit, Phase.generate],
        suppress_health_check=list(HealthCheck),
    )
    @hypothesis.given(case=operation.as_strategy(generation_mode=mode))
    def run(case: schemathesis.Case[Any]) -> None:
        try:
            response = case.call_and_validate(checks=CHECKS)
        except (Failure, FailureGroup) as exc:  # collected, so one run reports them all
            found = f"{operation.label}: {exc}"
        else:
            if expect is None or response.status_code == expect:
                return
            found = f"{operation.label}: {response.status_code}, not {expect}: {response.text}"
        if found not in failures:
            failures.append(found)

    try:
        run()
    except hypothesis.errors.Unsatisfiable:
        # Negative mode only: the operation takes nothing that could be made invalid.
        assert mode is GenerationMode.NEGATIVE, operation.label
    return failures


def test_every_operation_answers_as_documented(api: Api, packages: Path) -> None:
    """As an admin, who may call everything: what each operation does is answered as documented.
    fraud 1 and 2 are registered first, so the document's example model has a lifecycle."""
    schema = api(Authenticator.fixed(ADMIN))
    with get_client(schema.app) as http:
        for version in ("1", "2"):
            body = {"path": str(packages / "fraud" / version)}
            created = http.post(f"{http.base_url}/admin/models/fraud/versions", json=body)
            assert created.status_code == 201, created.text
    failures: list[str] = []
    labels: list[str] = []
    for result in schema.get_all_operations():
        assert isinstance(result, Ok), result  # the document itself is valid OpenAPI
        operation = result.ok()
        labels.append(operation.label)
        kafka = operation.path.startswith("/admin/dlq/")
        for mode, examples in EXAMPLES.items():
            failures += _conforms(operation, EXAMPLES_KAFKA if kafka else examples, mode)
    # The run covered the whole API: inference, the V2 reads, /admin and /admin/dlq.
    assert "POST /v2/models/{model}/infer" in labels
    assert "POST /admin/models/{name}/promote" in labels
    assert "POST /admin/dlq/redrive" in labels
    assert not failures, "\n\n".join(failures)


def test_anonymous_callers_get_the_documented_401(api: Api) -> None:
    """Authentication on, no credentials: every operation that is not public answers a 401
    problem (with its `WWW-Authenticate` challenge), as its document says."""
    schema = api(Authenticator(AuthSettings(enabled=True, api_keys=False)))
    failures: list[str] = []
    guarded = 0
    for result in schema.get_all_operations():
        assert isinstance(result, Ok), result
        operation = result.ok()
        if operation.definition.raw[PERMISSION_KEY] == "public":
            continue
        guarded += 1
        failures += _conforms(operation, 2, expect=401)
    assert guarded >= 30  # inference, the V2 reads, /admin and /admin/dlq
    assert not failures, "\n\n".join(failures)


# What schemathesis found answering 500 before they were fixed: text PostgreSQL cannot hold (a NUL
# character) and times so far back that no datetime holds them. Each must be the caller's 400.
REGRESSIONS: list[tuple[str, str, dict[str, Any]]] = [
    ("GET", "/admin/models/{name}", {"path_parameters": {"name": "fr\x00aud"}}),
    ("GET", "/admin/requests/{request_id}/served", {"path_parameters": {"request_id": "a\x00"}}),
    (
        "POST",
        "/admin/models/{name}/shadow",
        {"path_parameters": {"name": "a\x00"}, "body": {"version": "1"}},
    ),
    (
        "POST",
        "/admin/models/{name}/pin",
        {"path_parameters": {"name": "fraud"}, "body": {"tenant": "t\x00", "version": "1"}},
    ),
    (
        "GET",
        "/admin/models/{name}/state",
        {"path_parameters": {"name": "fraud"}, "query": {"at": "-99999999999999w"}},
    ),
    ("GET", "/admin/dlq/messages", {"query": {"since": "-99999999999999w"}}),
    (
        "POST",
        "/admin/dlq/redrive",
        {"body": {"until": "-9999999999999999999999ms", "dry_run": True}},
    ),
]


def test_values_nothing_can_hold_are_the_callers_400(api: Api, packages: Path) -> None:
    schema = api(Authenticator.fixed(ADMIN))
    with get_client(schema.app) as http:
        body = {"path": str(packages / "fraud" / "1")}
        created = http.post(f"{http.base_url}/admin/models/fraud/versions", json=body)
        assert created.status_code == 201, created.text
    for method, path, parts in REGRESSIONS:
        case = schema[path][method].Case(**parts)
        response = case.call_and_validate(checks=CHECKS)
        assert response.status_code == 400, (method, path, response.text)
        assert response.json()["code"] == "INVALID_INPUT"
