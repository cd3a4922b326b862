"""How `tidegate gateway` runs uvicorn: no access log unless asked, the app from an import-string
factory, one replica id per worker process, the connection limits in every process, and TLS when
a certificate is given."""

from __future__ import annotations

import os
import pickle
from pathlib import Path
from typing import Any

import pytest
import uvicorn
from pydantic import SecretStr, ValidationError

from tidegate.core.errors import ConfigurationError
from tidegate.gateway import serving
from tidegate.gateway.auth.auth_settings import AuthSettings
from tidegate.gateway.gateway_settings import GatewaySettings
from tidegate.gateway.slow_clients import ConnectionLimits, GatewayHttpProtocol


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
    settled: list[bool] = []
    # The test process keeps the collector as it is; the server's heap is settled once built.
    monkeypatch.setattr(serving, "settle", lambda: settled.append(True))
    monkeypatch.setenv("TIDEGATE_GATEWAY_ADMIN", "false")
    app = serving.served_app()
    paths = {getattr(route, "path", "") for route in app.routes}
    assert "/v2/models/{model}/infer" in paths
    assert not any(path.startswith("/admin") for path in paths)
    assert settled == [True]


def test_every_process_serves_with_the_connection_limits() -> None:
    options = serving.uvicorn_options(GatewaySettings())
    assert options["http"] is GatewayHttpProtocol
    # Spawned workers get uvicorn's config pickled: the class must travel by name.
    assert pickle.loads(pickle.dumps(options["http"])) is GatewayHttpProtocol  # noqa: S301
    assert "ssl_certfile" not in options, "plain HTTP unless a certificate is given"
    # Only the local proxy is believed about who the client is, unless configured.
    assert options["forwarded_allow_ips"] == "127.0.0.1"


def test_the_limits_come_from_the_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("TIDEGATE_GATEWAY_HEADER_TIMEOUT_S", "2.5")
    monkeypatch.setenv("TIDEGATE_GATEWAY_BODY_TIMEOUT_S", "7")
    monkeypatch.setenv("TIDEGATE_GATEWAY_MAX_CONNECTIONS_PER_CLIENT", "12")
    monkeypatch.setenv("TIDEGATE_GATEWAY_MAX_HEADER_BYTES", "4096")
    assert ConnectionLimits.of(GatewaySettings()) == ConnectionLimits(2.5, 7.0, 12, 4096)


def test_tls_is_served_with_the_certificate_and_the_key_password(tmp_path: Path) -> None:
    settings = GatewaySettings(
        tls_certfile=tmp_path / "cert.pem",
        tls_keyfile=tmp_path / "key.pem",
        tls_keyfile_password=SecretStr("s3cret-pass"),
    )
    options = serving.uvicorn_options(settings)
    assert options["ssl_certfile"] == str(tmp_path / "cert.pem")
    assert options["ssl_keyfile"] == str(tmp_path / "key.pem")
    assert options["ssl_keyfile_password"] == "s3cret-pass"
    assert "s3cret-pass" not in repr(settings)


def test_a_certificate_without_its_key_is_refused(tmp_path: Path) -> None:
    with pytest.raises(ValidationError, match="tls_certfile and tls_keyfile"):
        GatewaySettings(tls_certfile=tmp_path / "cert.pem")
    with pytest.raises(ValidationError, match="tls_certfile and tls_keyfile"):
        GatewaySettings(tls_keyfile=tmp_path / "key.pem")


@pytest.mark.parametrize("host", ["0.0.0.0", "::", "10.0.0.7", "gateway.internal"])  # noqa: S104
def test_authentication_off_is_refused_off_loopback(host: str) -> None:
    with pytest.raises(ConfigurationError, match="not a loopback address"):
        serving.check_exposure(host, AuthSettings(enabled=False))
    serving.check_exposure(host, AuthSettings(enabled=True))


@pytest.mark.parametrize("host", ["127.0.0.1", "127.0.0.53", "::1", "[::1]", "localhost"])
def test_authentication_off_is_allowed_on_loopback(host: str) -> None:
    serving.check_exposure(host, AuthSettings(enabled=False))
