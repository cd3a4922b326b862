"""No secret reaches a log: a run of the real components, every secret setting given a value of
its own, then every log line and every command's output searched for those values.

The run is what an operator does on the local stack: `tidegate models register` and `promote`
(fraud 1), a lifecycle controller, a real worker and a gateway serving HTTPS from an encrypted key
with /admin on, then calls that succeed, fail (400, 404, a plaintext call to the TLS port) and
clients cut off for being slow, so that start-up, error and warning paths all write their lines.
Each `SecretStr` field of every tidegate settings class is set: to a value the servers check
where they check one (the TLS key's password), else to a distinctive string where the stack
ignores it (the Kafka SASL password with PLAINTEXT). A secret added to any settings class is set
too, unless `UNSET` says why it cannot be in this run (PostgreSQL's and Redis's passwords and the
registry's basic auth, which the local servers check: the registry's is the stack's own key, and
searched for like the rest; Kafka's TLS and OAUTHBEARER secrets, which the settings refuse
without such a listener).
"""

from __future__ import annotations

import base64
import json
import os
import socket
import ssl
import subprocess
import sys
import typing
import uuid
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest
from pydantic import SecretStr

from tests.integration.gateway.gateway_fixtures import topic_env
from tests.support import WaitTimeoutError, free_port, retry_later, unique, wait_for
from tests.tls_support import self_signed, wait_https
from tests.unit.core.secret_settings_support import settings_classes
from tidegate.cli.procs import Child, spawn, wait_http
from tidegate.core.settings import PostgresSettings, SchemaRegistrySettings, TopicSettings
from tidegate.gateway.auth.api_keys import KEY_PREFIX, parse_key
from tidegate.schemas.catalog import topic_subjects
from tidegate.schemas.registration import RegistryHttp, register_all

REPO = Path(__file__).resolve().parents[2]
# Secrets this run cannot set, and why. The servers of the local stack check the first two, so
# they keep their real values; the settings refuse the others without a Kafka TLS or OAUTHBEARER
# listener, which the local stack does not run (the SASL_SSL integration test uses those).
UNSET = {
    "TIDEGATE_POSTGRES_PASSWORD": "PostgreSQL checks it",
    "TIDEGATE_REDIS_PASSWORD": "Redis without requirepass refuses AUTH",
    "TIDEGATE_SCHEMA_REGISTRY_BASIC_AUTH_PASSWORD": "the registry checks it: the stack's own key",
    "TIDEGATE_KAFKA_SSL_KEY_PASSWORD": "needs ssl_key_location, hence an SSL listener",
    "TIDEGATE_KAFKA_SASL_OAUTHBEARER_CLIENT_SECRET": "needs sasl_mechanism OAUTHBEARER",
}
TLS_PASSWORD = "TIDEGATE_GATEWAY_TLS_KEYFILE_PASSWORD"
# Two rows of the real fraud 1's 64 features.
FRAUD = {
    "inputs": [{"name": "features", "datatype": "FP32", "shape": [2, 64], "data": [0.5] * 128}]
}


def secret_settings() -> dict[str, object]:
    """Environment variable -> the annotation of every SecretStr field of tidegate's settings."""
    found: dict[str, object] = {}
    for cls in settings_classes():
        prefix = str(cls.model_config.get("env_prefix", ""))
        for name, info in cls.model_fields.items():
            if SecretStr in (info.annotation, *_flat(info.annotation)):
                found[f"{prefix}{name}".upper()] = info.annotation
    return found


def _flat(annotation: object) -> list[object]:
    args = list(typing.get_args(annotation))
    return args + [inner for arg in args for inner in _flat(arg)]


def env_value(annotation: object, secret: str) -> str:
    """The variable's text for a value holding `secret`: JSON for a container of secrets."""
    if typing.get_origin(annotation) is dict or dict in _flat(annotation):
        return json.dumps({"x-probe": secret})
    if typing.get_origin(annotation) is list or list in _flat(annotation):
        return json.dumps([secret])
    return secret


@pytest.fixture
def secrets() -> dict[str, str]:
    """Each settable secret's variable -> its distinctive value."""
    chosen = {
        name: f"zq{name.lower().removeprefix('tidegate_')[:12]}{uuid.uuid4().hex[:10]}"
        for name in secret_settings()
        if name not in UNSET
    }
    assert TLS_PASSWORD in chosen
    assert "TIDEGATE_KAFKA_SASL_PASSWORD" in chosen
    return chosen


def run_cli(env: dict[str, str], *args: str) -> str:
    done = subprocess.run(
        [sys.executable, "-m", "tidegate.cli", *args],
        cwd=REPO,
        env={**os.environ, **env},
        capture_output=True,
        text=True,
        timeout=240,
        check=False,
    )
    assert done.returncode == 0, f"tidegate {' '.join(args)}:\n{done.stdout}\n{done.stderr}"
    return done.stdout + done.stderr


@pytest.fixture
def children() -> Iterator[list[Child]]:
    started: list[Child] = []
    yield started
    for child in reversed(started):
        child.stop()


# Four CLI runs, a worker's start and fraud 1 warming on a loaded machine: past the default, so
# that a slow step fails with its own message (and the processes' logs), not pytest-timeout's.
@pytest.mark.timeout(1200)
def test_no_secret_is_logged(
    topics: TopicSettings,
    pg_settings: PostgresSettings,
    packages: Path,
    secrets: dict[str, str],
    children: list[Child],
    tmp_path: Path,
) -> None:
    annotations = secret_settings()
    certfile, keyfile = self_signed(tmp_path, secrets[TLS_PASSWORD].encode())
    port = free_port()
    env = {
        **topic_env(topics),
        **{name: env_value(annotations[name], value) for name, value in secrets.items()},
        "TIDEGATE_POSTGRES_DB_SCHEMA": pg_settings.db_schema,
        "TIDEGATE_MODELS_STORE_DIR": str(tmp_path / "store"),
        "TIDEGATE_WORKER_GROUP_ID": unique("secrets-workers"),
        "TIDEGATE_TELEMETRY_LOG_LEVEL": "DEBUG",
        "TIDEGATE_GATEWAY_PORT": str(port),
        "TIDEGATE_GATEWAY_TLS_CERTFILE": str(certfile),
        "TIDEGATE_GATEWAY_TLS_KEYFILE": str(keyfile),
        "TIDEGATE_GATEWAY_HEADER_TIMEOUT_S": "1",
        "TIDEGATE_GATEWAY_ACCESS_LOG": "true",
    }
    # Every subject a worker resolves at start (the dead-letter, retry and shadow topics keep
    # their default names here): a stack whose registry lost them must not fail this test.
    with RegistryHttp(SchemaRegistrySettings()) as http:
        list(register_all(http, topic_subjects(topics)))
    issued = run_cli(env, "auth", "keys", "create", "secrets-test", "--role", "admin", "--json")
    api_key = next(
        json.loads(line)["key"] for line in issued.splitlines() if line.startswith('{"key"')
    )
    outputs = [
        run_cli(env, "models", "register", str(packages / "fraud" / "1"), "--version", "1"),
        run_cli(env, "models", "promote", "fraud", "1"),
    ]
    children.append(spawn("controller", ["controller", "--group-id", unique("idx")], tmp_path, env))
    metrics = free_port()
    worker_args = ["worker", "--processes", "1", "--metrics-port", str(metrics)]
    children.append(spawn("worker", worker_args, tmp_path, env))
    wait_http(f"http://127.0.0.1:{metrics}/metrics", children[-1], 180)
    gateway = spawn("gateway", ["gateway"], tmp_path, env)
    children.append(gateway)

    url = f"https://127.0.0.1:{port}"
    trust = ssl.create_default_context(cafile=certfile)
    # A wrong secret for the key's own id: the refusal is logged and audited, the secret not.
    # The secret is URL-safe base64 and may itself hold "_": split as the gateway does.
    parsed = parse_key(api_key)
    assert parsed is not None
    key_id, key_secret = parsed
    wrong_key = f"{KEY_PREFIX}{key_id}_{'0' * 43}"
    auth = {"Authorization": f"Bearer {api_key}"}
    with httpx.Client(base_url=url, verify=trust, timeout=30, headers=auth) as client:
        wait_https(f"{url}/v2/health/ready", gateway, trust)
        refused = client.get("/admin/models", headers={"Authorization": f"Bearer {wrong_key}"})
        assert refused.status_code == 401
        answers: list[str] = []

        def answered() -> bool:
            resp = client.post("/v2/models/fraud/infer", json=FRAUD)
            answers.append(f"{resp.status_code} {resp.text[:200]}")
            if retry_later(resp):  # fraud 1 not loaded and warm on the worker yet
                return False
            assert resp.status_code == 200, resp.text
            return True

        # The worker loads and warms fraud 1 and reports it before it serves; on a loaded CI
        # machine that takes minutes, not seconds.
        try:
            wait_for(answered, timeout=300, what="fraud 1 to answer")
        except WaitTimeoutError as exc:
            tails = "\n".join(f"--- {c.name}\n{c.tail()}" for c in children)
            raise AssertionError(f"{exc}; last answers {answers[-3:]}\n{tails}") from None
        assert client.post("/v2/models/fraud/infer", content=b"{nope").status_code == 400
        assert client.post("/v2/models/absent/infer", json=FRAUD).status_code == 404
        assert client.get("/admin/models").status_code == 200
    with pytest.raises(httpx.HTTPError):
        httpx.get(f"http://127.0.0.1:{port}/v2/health/live", timeout=5)
    with (
        socket.create_connection(("127.0.0.1", port), 5) as raw,
        trust.wrap_socket(raw, server_hostname="127.0.0.1") as slow,
    ):
        slow.sendall(b"GET /v2/health/live HTTP/1.1\r\nHost: gw\r\n")
        slow.settimeout(10)
        assert slow.recv(64).startswith(b"HTTP/1.1 408")
    outputs.append(run_cli(env, "models", "status", "fraud", "--json"))

    for child in reversed(children):  # stopped first, so that shutdown lines are written too
        child.stop()
    logs = {child.name: child.log.read_text(errors="replace") for child in children}
    logs |= {f"cli-{i}": text for i, text in enumerate(outputs)}
    assert all(logs.values()), "every component wrote something to search"
    # The search sees what the components wrote: their topics, and the slow client cut off.
    assert topics.requests in logs["worker"]
    assert "cut off 127.0.0.1" in logs["gateway"]
    # The registry's credentials are the stack's own key (it checks them), read from its file.
    registry = SchemaRegistrySettings()
    assert registry.basic_auth_user is not None
    assert registry.basic_auth_password is not None
    registry_secret = registry.basic_auth_password.get_secret_value()
    basic = base64.b64encode(f"{registry.basic_auth_user}:{registry_secret}".encode()).decode()
    wanted = {
        **secrets,
        "the registry key's secret": registry_secret,
        "registry basic auth header": basic,
        "the API key": api_key,
        "its secret part": key_secret,
        "a wrong secret presented": "0" * 43,
    }
    leaks = [
        f"{name} in {where}"
        for name, value in wanted.items()
        for where, text in logs.items()
        if value in text
    ]
    assert not leaks, leaks
