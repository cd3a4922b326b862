"""tidegate's wheel in fresh virtual environments outside the checkout, as users install it.

- The base (no extras) is the producer client: small, without torch, FastAPI, faust, numpy or
  PostgreSQL, and it publishes a request to the real Kafka through the real registry.
- With the `lifecycle` extra, `tidegate controller --migrate` applies the migrations the wheel
  carries (package data) to PostgreSQL, and the controller runs.

Each install takes constraints.txt's versions, as `make setup` and the image do.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from collections.abc import Callable, Iterator
from pathlib import Path

import psycopg
import pytest
from confluent_kafka import OFFSET_BEGINNING, Message, TopicPartition
from psycopg import sql

from tests.integration.fakes import register_subjects
from tests.support import unique, wait_for
from tests.wheel_build import REPO, build_wheel
from tidegate.core.kafka import make_reader
from tidegate.core.settings import (
    KafkaSettings,
    PostgresSettings,
    SchemaRegistrySettings,
    TopicSettings,
)

# Two fresh venvs and pip installs (from pip's cache on a warm machine, PyPI otherwise).
pytestmark = [pytest.mark.integration, pytest.mark.timeout(900)]

BASE_BUDGET_MB = 100
"""What installing the base may add to a fresh venv (issue bar: under 100 MB)."""
HEAVY = ("torch", "fastapi", "faust", "numpy", "psycopg", "onnxruntime", "uvicorn", "typer")


@pytest.fixture(scope="module")
def wheel(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return build_wheel(tmp_path_factory.mktemp("wheel"))


def fresh_venv(path: Path) -> Path:
    # The interpreter behind this venv, not the venv itself: a fresh one has only pip.
    subprocess.run([sys.executable, "-m", "venv", str(path)], check=True, timeout=120)
    return path / "bin"


def pip_install(bin_dir: Path, *requirements: str) -> None:
    result = subprocess.run(
        [
            str(bin_dir / "python"),
            *("-m", "pip", "install", "-q", "--disable-pip-version-check"),
            *("-c", str(REPO / "constraints.txt")),
            *requirements,
        ],
        capture_output=True,
        text=True,
        timeout=600,
        check=False,
    )
    assert result.returncode == 0, result.stdout + result.stderr


def size_of(path: Path) -> int:
    return sum(
        (Path(root) / name).lstat().st_size for root, _, names in os.walk(path) for name in names
    )


def outside_env(**extra: str) -> dict[str, str]:
    """This test's environment without anything that points back into the checkout."""
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "VIRTUAL_ENV")}
    return {**env, **extra}


PUBLISH = """
import importlib.util, json, sys
from tidegate.clients.producer import TidegateProducer
from tidegate.core.settings import KafkaSettings, SchemaRegistrySettings, TopicSettings

heavy = [name for name in {heavy!r} if importlib.util.find_spec(name) is not None]
loaded = sorted(name for name in {heavy!r} if name in sys.modules)
tensor = {{"name": "features", "datatype": "FP32", "shape": [1, 1], "data": b"\\x00\\x00\\x80?"}}
topics = TopicSettings(requests={requests!r}, results={results!r})
with TidegateProducer(KafkaSettings(), topics, SchemaRegistrySettings()) as producer:
    request_id = producer.publish("fraud", [tensor], routing_key="card-1")
    left = producer.flush(20)
    errors = producer.delivery_errors
try:
    producer.publish("fraud", {{"features": [[1.0]]}})
    arrays = "accepted"
except ModuleNotFoundError as exc:
    arrays = str(exc)
print(json.dumps(dict(heavy=heavy, loaded=loaded, id=request_id, left=left,
                      errors=len(errors), arrays=arrays, where=__import__("tidegate").__file__)))
"""


def test_the_base_is_the_producer_client_alone_and_publishes(
    tmp_path: Path,
    wheel: Path,
    new_topic: Callable[..., str],
    registry_settings: SchemaRegistrySettings,
) -> None:
    venv = tmp_path / "venv"
    bin_dir = fresh_venv(venv)
    before = size_of(venv)
    pip_install(bin_dir, str(wheel))
    added_mb = (size_of(venv) - before) / 2**20
    assert added_mb < BASE_BUDGET_MB, f"the base adds {added_mb:.0f} MB to a fresh venv"

    topics = TopicSettings(
        requests=new_topic("it-wheel-requests", 1), results=new_topic("it-wheel-results", 1)
    )
    register_subjects(registry_settings, topics)
    code = PUBLISH.format(heavy=HEAVY, requests=topics.requests, results=topics.results)
    env = outside_env(
        TIDEGATE_SCHEMA_REGISTRY_LOCAL_CREDENTIALS=str(REPO / "var/registry/client.env")
    )
    result = subprocess.run(
        [str(bin_dir / "python"), "-c", code],
        cwd=tmp_path,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert result.returncode == 0, result.stderr[-3000:]
    seen = json.loads(result.stdout.splitlines()[-1])
    assert seen["where"].startswith(str(venv)), seen["where"]
    assert seen["heavy"] == [], f"the base installed {seen['heavy']}"
    assert seen["left"] == 0
    assert seen["errors"] == 0
    assert "tidegate[arrays]" in seen["arrays"]

    reader = make_reader(KafkaSettings(), unique("it-wheel"))
    try:
        reader.assign([TopicPartition(topics.requests, 0, OFFSET_BEGINNING)])

        def delivered() -> Message | None:
            m = reader.poll(0.5)
            return m if m is not None and m.error() is None else None

        message = wait_for(delivered, timeout=30, what="the request the base install published")
        assert message.key() == b"card-1"
    finally:
        reader.close()


@pytest.fixture
def schema() -> Iterator[PostgresSettings]:
    settings = PostgresSettings(db_schema=unique("wheel").replace("-", "_"))
    yield settings
    with psycopg.connect(settings.conninfo(), autocommit=True, connect_timeout=10) as conn:
        conn.execute(
            sql.SQL("DROP SCHEMA IF EXISTS {} CASCADE").format(sql.Identifier(settings.db_schema))
        )


def applied(settings: PostgresSettings) -> list[str]:
    with psycopg.connect(settings.conninfo(), autocommit=True, connect_timeout=10) as conn:
        found = conn.execute(
            "SELECT 1 FROM information_schema.tables "
            "WHERE table_schema = %s AND table_name = '_yoyo_migration'",
            (settings.db_schema,),
        ).fetchone()
        if found is None:
            return []
        rows = conn.execute(
            sql.SQL("SELECT migration_id FROM {}._yoyo_migration").format(
                sql.Identifier(settings.db_schema)
            )
        ).fetchall()
    return sorted(row[0] for row in rows)


def test_the_wheel_runs_its_migrations_from_a_fresh_venv(
    tmp_path: Path, wheel: Path, schema: PostgresSettings
) -> None:
    bin_dir = fresh_venv(tmp_path / "venv")
    pip_install(bin_dir, f"{wheel}[lifecycle]")
    expected = sorted(
        p.stem for p in (REPO / "core" / "migrations").glob("*.sql") if ".rollback" not in p.name
    )
    log = (tmp_path / "controller.log").open("w")
    controller = subprocess.Popen(
        [str(bin_dir / "tidegate"), "controller", "--migrate"],
        cwd=tmp_path,
        env=outside_env(TIDEGATE_POSTGRES_DB_SCHEMA=schema.db_schema),
        stdout=log,
        stderr=subprocess.STDOUT,
    )
    try:
        wait_for(
            lambda: applied(schema) == expected or controller.poll() is not None,
            timeout=120,
            what="the controller's migrations",
        )
        assert controller.poll() is None, (tmp_path / "controller.log").read_text()[-3000:]
        assert applied(schema) == expected
        wait_for(
            lambda: "controller lock acquired" in (tmp_path / "controller.log").read_text()
            or controller.poll() is not None,
            timeout=60,
            what="the controller to start after migrating",
        )
        assert controller.poll() is None, (tmp_path / "controller.log").read_text()[-3000:]
    finally:
        controller.send_signal(signal.SIGTERM)
        rc = controller.wait(timeout=60)
        log.close()
    assert rc == 0, (tmp_path / "controller.log").read_text()[-3000:]
