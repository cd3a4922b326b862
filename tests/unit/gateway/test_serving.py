"""How `tidegate gateway` runs uvicorn: no access log unless asked, the app from an import-string
factory, and one replica id per worker process."""

from __future__ import annotations

import os
from typing import Any

import pytest
import uvicorn

from tidegate.core.errors import ConfigurationError
from tidegate.gateway import serving
from tidegate.gateway.gateway_settings import GatewaySettings


def test_the_access_log_is_off_unless_asked(monkeypatch: pytest.MonkeyPatch) -> None:
    assert serving.uvicorn_options(GatewaySettings())["access_log"] is False
    monkeypatch.setenv("TIDEGATE_GATEWAY_ACCESS_LOG", "true")
    assert serving.uvicorn_options(GatewaySettings())["access_log"] is True


def test_serve_runs_the_factory_with_the_overrides_in_the_environment(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    ran: dict[str, Any] = {}
    monkeypatch.setattr(serving, "configure_logging", lambda: None)
    monkeypatch.setattr(uvicorn, "run", lambda app, **options: ran.update(options, app=app))
    # Registered with monkeypatch first, so that what serve() exports is undone afterwards.
    for name in ("PORT", "WORKERS", "ADMIN"):
        monkeypatch.setenv(f"TIDEGATE_GATEWAY_{name}", "")
        monkeypatch.delenv(f"TIDEGATE_GATEWAY_{name}")

    serving.serve({"port": 9123, "workers": 3, "admin": False})

    assert ran["app"] == serving.APP_FACTORY
    assert ran["factory"] is True
    assert (ran["port"], ran["workers"], ran["access_log"]) == (9123, 3, False)
    # What spawned workers will read.
    assert os.environ["TIDEGATE_GATEWAY_WORKERS"] == "3"
    assert GatewaySettings().admin is False


def test_no_more_workers_than_reply_partitions(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(serving, "configure_logging", lambda: None)
    monkeypatch.setattr(uvicorn, "run", lambda *_args, **_options: None)
    monkeypatch.setenv("TIDEGATE_TOPICS_REPLY_PARTITIONS", "2")
    monkeypatch.setenv("TIDEGATE_GATEWAY_WORKERS", "3")
    with pytest.raises(ConfigurationError, match="3 workers"):
        serving.serve()


def test_each_worker_process_is_a_replica_of_its_own(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("TIDEGATE_GATEWAY_WORKERS", "2")
    default = GatewaySettings()
    assert serving.worker_settings(default, 41).replica_id == default.replica_id
    monkeypatch.setenv("TIDEGATE_GATEWAY_REPLICA_ID", "edge")
    named = GatewaySettings()
    ids = {serving.worker_settings(named, pid).replica_id for pid in (41, 42)}
    assert ids == {"edge-41", "edge-42"}
    monkeypatch.setenv("TIDEGATE_GATEWAY_WORKERS", "1")
    assert serving.worker_settings(GatewaySettings(), 41).replica_id == "edge"


def test_the_factory_builds_the_app_from_the_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(serving, "configure_logging", lambda: None)
    monkeypatch.setenv("TIDEGATE_GATEWAY_ADMIN", "false")
    app = serving.served_app()
    paths = {getattr(route, "path", "") for route in app.routes}
    assert "/v2/models/{model}/infer" in paths
    assert not any(path.startswith("/admin") for path in paths)
