"""The registry's HTTP API over an in-memory log: Confluent's shapes, codes and semantics."""

from __future__ import annotations

import json
from collections.abc import Iterator
from typing import Any

import pytest
from fastapi.testclient import TestClient

from tidegate.gateway.admin.registry_api import CONTENT_TYPE, create_app
from tidegate.gateway.auth.authn import INSECURE, Authenticator
from tidegate.gateway.problems import registry_http_status as http_status
from tidegate.schemas.registry import MemoryLog, SchemaRegistry
from tidegate.schemas.registry.registry_state import RegistryState
from tidegate.schemas.registry.topic_records import decode_record


def record(*fields: dict[str, Any]) -> str:
    return json.dumps(
        {"type": "record", "name": "Request", "namespace": "t", "fields": list(fields)}
    )


ID = {"name": "id", "type": "string"}
V1 = record(ID)
V2 = record(ID, {"name": "tenant", "type": "string", "default": "acme"})
BAD = record(ID, {"name": "tenant", "type": "string"})


@pytest.fixture
def log() -> MemoryLog:
    return MemoryLog()


@pytest.fixture
def client(log: MemoryLog) -> Iterator[TestClient]:
    # What the registry does; who may do it is tests/unit/gateway/test_registry_auth.py's.
    admin = Authenticator.fixed(INSECURE)
    with TestClient(create_app(SchemaRegistry(log), authenticator=admin)) as test_client:
        yield test_client


def register(client: TestClient, subject: str, schema: str) -> dict[str, Any]:
    resp = client.post(f"/subjects/{subject}/versions", json={"schema": schema})
    assert resp.status_code == 200, resp.text
    return dict(resp.json())


def error_of(resp: Any) -> tuple[int, int, str]:
    body = resp.json()
    assert set(body) == {"error_code", "message"}, body
    assert "Traceback" not in body["message"]
    return resp.status_code, body["error_code"], body["message"]


def test_status_follows_confluent_rule() -> None:
    assert http_status(409) == 409
    assert http_status(40401) == 404
    assert http_status(42201) == 422
    assert http_status(50003) == 500


def test_root_types_and_content_type(client: TestClient) -> None:
    resp = client.get("/")
    assert resp.json() == {}
    assert resp.headers["content-type"].startswith(CONTENT_TYPE)
    assert client.get("/schemas/types").json() == ["AVRO"]


def test_register_is_idempotent_and_ids_are_global(client: TestClient) -> None:
    first = register(client, "a-value", V1)
    assert (first["id"], first["version"], first["subject"]) == (1, 1, "a-value")
    assert json.loads(first["schema"]) == json.loads(V1)
    pretty = json.dumps(json.loads(V1), indent=4)
    assert register(client, "a-value", pretty)["id"] == 1
    other = register(client, "b-value", V1)
    assert (other["id"], other["version"]) == (1, 1)
    second = register(client, "a-value", V2)
    assert (second["id"], second["version"]) == (2, 2)


def test_vnd_and_plain_json_bodies_are_accepted(client: TestClient) -> None:
    body = json.dumps({"schema": V1}).encode()
    for content_type in (CONTENT_TYPE, "application/json", "application/octet-stream"):
        resp = client.post(
            "/subjects/s/versions", content=body, headers={"Content-Type": content_type}
        )
        assert resp.status_code == 200, resp.text


def test_lookup(client: TestClient) -> None:
    assert error_of(client.post("/subjects/nope", json={"schema": V1}))[:2] == (404, 40401)
    register(client, "s", V1)
    assert error_of(client.post("/subjects/s", json={"schema": V2}))[:2] == (404, 40403)
    found = client.post("/subjects/s?normalize=False&deleted=False", json={"schema": V1}).json()
    assert (found["subject"], found["version"], found["id"]) == ("s", 1, 1)


def test_schema_by_id(client: TestClient) -> None:
    register(client, "a", V1)
    register(client, "b", V1)
    assert client.get("/schemas/ids/1").json() == {
        "schema": json.dumps(json.loads(V1), separators=(",", ":"))
    }
    assert client.get("/schemas/ids/1?fetchMaxId=true").json()["maxId"] == 1
    assert client.get("/schemas/ids/1/versions").json() == [
        {"subject": "a", "version": 1},
        {"subject": "b", "version": 1},
    ]
    assert client.get("/schemas/ids/1/subjects").json() == ["a", "b"]
    assert json.loads(client.get("/schemas/ids/1/schema").text) == json.loads(V1)
    assert error_of(client.get("/schemas/ids/99"))[:2] == (404, 40403)
    assert error_of(client.get("/schemas/ids/abc"))[:2] == (422, 422)


def test_versions(client: TestClient) -> None:
    register(client, "s", V1)
    register(client, "s", V2)
    assert client.get("/subjects").json() == ["s"]
    assert client.get("/subjects/s/versions").json() == [1, 2]
    for spelling in ("2", "latest", "-1"):
        found = client.get(f"/subjects/s/versions/{spelling}").json()
        assert (found["version"], found["id"], found["subject"]) == (2, 2, "s")
    assert json.loads(client.get("/subjects/s/versions/1/schema").text) == json.loads(V1)
    assert client.get("/subjects/s/versions/1/referencedby").json() == []
    assert error_of(client.get("/subjects/s/versions/3"))[:2] == (404, 40402)
    assert error_of(client.get("/subjects/x/versions/1"))[:2] == (404, 40401)
    assert error_of(client.get("/subjects/x/versions"))[:2] == (404, 40401)
    for invalid in ("0", "abc", "-2", "99999999999"):
        assert error_of(client.get(f"/subjects/s/versions/{invalid}"))[:2] == (422, 42202)


def test_incompatible_registration_names_the_field(client: TestClient) -> None:
    register(client, "s", V1)
    status, code, message = error_of(client.post("/subjects/s/versions", json={"schema": BAD}))
    assert (status, code) == (409, 409)
    assert "tenant" in message
    assert "no default" in message
    assert client.get("/subjects/s/versions").json() == [1]


def test_compatibility_endpoints(client: TestClient) -> None:
    assert client.post("/compatibility/subjects/new/versions", json={"schema": BAD}).json() == {
        "is_compatible": True
    }
    register(client, "s", V1)
    quiet = client.post("/compatibility/subjects/s/versions/latest", json={"schema": BAD})
    assert quiet.json() == {"is_compatible": False}
    for path in ("versions/latest", "versions/1", "versions"):
        resp = client.post(
            f"/compatibility/subjects/s/{path}?normalize=False&verbose=True", json={"schema": BAD}
        )
        body = resp.json()
        assert body["is_compatible"] is False
        assert any("field 'tenant'" in m and "no default" in m for m in body["messages"])
    ok = client.post("/compatibility/subjects/s/versions?verbose=true", json={"schema": V2})
    assert ok.json() == {"is_compatible": True, "messages": []}
    missing = client.post("/compatibility/subjects/s/versions/7", json={"schema": V2})
    assert error_of(missing)[:2] == (404, 40402)


def test_config(client: TestClient) -> None:
    assert client.get("/config").json() == {"compatibilityLevel": "BACKWARD"}
    assert client.put("/config", json={"compatibility": "FULL"}).json() == {"compatibility": "FULL"}
    assert client.get("/config").json() == {"compatibilityLevel": "FULL"}
    assert error_of(client.get("/config/s"))[:2] == (404, 40408)
    assert client.get("/config/s?defaultToGlobal=true").json() == {"compatibilityLevel": "FULL"}
    assert client.put("/config/s", json={"compatibility": "NONE"}).json() == {
        "compatibility": "NONE"
    }
    assert client.get("/config/s").json() == {"compatibilityLevel": "NONE"}
    register(client, "s", V1)
    register(client, "s", BAD)  # NONE lets anything through
    assert client.delete("/config/s").json() == {"compatibilityLevel": "NONE"}
    assert client.delete("/config").json() == {"compatibilityLevel": "FULL"}
    assert client.get("/config").json() == {"compatibilityLevel": "BACKWARD"}
    bad_level = client.put("/config", json={"compatibility": "SIDEWAYS"})
    assert error_of(bad_level)[:2] == (422, 42203)
    assert error_of(client.put("/config", json={}))[:2] == (422, 42203)


def test_subject_soft_and_permanent_delete(client: TestClient) -> None:
    register(client, "s", V1)
    register(client, "s", V2)
    assert error_of(client.delete("/subjects/s?permanent=true"))[:2] == (404, 40405)
    assert client.delete("/subjects/s").json() == [1, 2]
    assert client.get("/subjects").json() == []
    assert client.get("/subjects?deleted=true").json() == ["s"]
    assert client.get("/subjects?deleted_only=true").json() == ["s"]
    assert error_of(client.get("/subjects/s/versions"))[:2] == (404, 40401)
    assert client.get("/subjects/s/versions?deleted=true").json() == [1, 2]
    assert client.get("/subjects/s/versions/1?deleted=true").json()["id"] == 1
    assert client.get("/schemas/ids/1").status_code == 200  # soft-deleted schemas keep their id
    assert error_of(client.delete("/subjects/s"))[:2] == (404, 40404)
    assert client.delete("/subjects/s?permanent=true").json() == [1, 2]
    assert client.get("/subjects?deleted=true").json() == []
    assert error_of(client.get("/schemas/ids/1"))[:2] == (404, 40403)
    assert error_of(client.delete("/subjects/s"))[:2] == (404, 40401)
    assert register(client, "s", V1)["version"] == 1  # numbering restarts after a hard delete


def test_version_soft_and_permanent_delete(client: TestClient) -> None:
    register(client, "s", V1)
    register(client, "s", V2)
    assert error_of(client.delete("/subjects/s/versions/2?permanent=true"))[:2] == (404, 40407)
    assert client.delete("/subjects/s/versions/latest").json() == 2
    assert client.get("/subjects/s/versions").json() == [1]
    assert client.get("/subjects/s/versions/latest").json()["version"] == 1
    assert error_of(client.delete("/subjects/s/versions/2"))[:2] == (404, 40406)
    # A soft-deleted schema registered again is a new version with the same id.
    again = register(client, "s", V2)
    assert (again["version"], again["id"]) == (3, 2)
    assert client.delete("/subjects/s/versions/2?permanent=true").json() == 2
    assert client.get("/subjects/s/versions?deleted=true").json() == [1, 3]
    assert error_of(client.delete("/subjects/s/versions/5"))[:2] == (404, 40402)


@pytest.mark.parametrize(
    ("body", "status", "code", "says"),
    [
        (b"{not json", 400, 400, "not valid JSON"),
        (b"[1, 2]", 400, 400, "JSON object"),
        (json.dumps({"schema": '{"type": "record", '}).encode(), 422, 42201, "not valid JSON"),
        (json.dumps({"schema": '{"type": "record", "name": "R"}'}).encode(), 422, 42201, "fields"),
        (json.dumps({"schema": '"strnig"'}).encode(), 422, 42201, "strnig"),
        (json.dumps({}).encode(), 422, 42201, "'schema'"),
        (json.dumps({"schema": 5}).encode(), 422, 42201, "'schema'"),
        (
            json.dumps({"schema": "syntax = 'proto3';", "schemaType": "PROTOBUF"}).encode(),
            422,
            42201,
            "PROTOBUF",
        ),
        (
            json.dumps(
                {"schema": V1, "references": [{"name": "x", "subject": "y", "version": 1}]}
            ).encode(),
            422,
            42201,
            "references",
        ),
        (
            json.dumps(
                {"schema": record({"name": "n", "type": ["null", "int"], "default": 1})}
            ).encode(),
            422,
            42201,
            "default",
        ),
    ],
)
def test_malformed_requests_get_clear_errors(
    client: TestClient, body: bytes, status: int, code: int, says: str
) -> None:
    resp = client.post("/subjects/s/versions", content=body, headers={"Content-Type": CONTENT_TYPE})
    got_status, got_code, message = error_of(resp)
    assert (got_status, got_code) == (status, code)
    assert says in message


def test_unknown_route_answers_in_confluent_shape(client: TestClient) -> None:
    assert error_of(client.get("/nowhere"))[:2] == (404, 404)
    assert error_of(client.put("/subjects"))[:2] == (405, 405)


def test_not_ready_answers_50003() -> None:
    class LoadingLog(MemoryLog):
        @property
        def ready(self) -> bool:
            return False

    client = TestClient(
        create_app(SchemaRegistry(LoadingLog()), authenticator=Authenticator.fixed(INSECURE))
    )
    assert error_of(client.get("/subjects"))[:2] == (503, 50003)
    assert error_of(client.get("/_health"))[:2] == (503, 50003)


def test_records_use_confluents_format_and_replay_to_the_same_state(
    client: TestClient, log: MemoryLog
) -> None:
    register(client, "s", V1)
    register(client, "s", V2)
    client.put("/config/s", json={"compatibility": "FULL"})
    client.delete("/subjects/s/versions/1")
    register(client, "t", V1)
    client.delete("/subjects/t")
    client.delete("/subjects/t?permanent=true")

    key, value = log.records[0]
    assert key == b'{"keytype":"SCHEMA","subject":"s","version":1,"magic":1}'
    assert value is not None
    assert list(json.loads(value)) == ["subject", "version", "id", "schema", "deleted"]
    keys = [json.loads(k) for k, _ in log.records]
    assert {"keytype": "CONFIG", "subject": "s", "magic": 0} in keys
    assert {"keytype": "DELETE_SUBJECT", "subject": "t", "magic": 0} in keys
    assert (b'{"keytype":"SCHEMA","subject":"t","version":1,"magic":1}', None) in log.records

    replayed = RegistryState()
    for k, v in log.records:
        decoded = decode_record(k, v)
        assert decoded is not None
        replayed.apply(decoded)
    with log.view() as state:
        assert replayed.subjects == state.subjects
        assert replayed.configs == state.configs
        assert replayed.max_id == state.max_id
