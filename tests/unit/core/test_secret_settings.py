"""Every setting that holds a secret is a `SecretStr`, in every settings class of tidegate.

A secret kept in a plain `str` shows in the settings' repr, in a validation error and in any log
line that formats the settings; `SecretStr` prints as `**********`. The classes are found by
reading the source of every tidegate module, so a settings class added anywhere is checked too.
"""

from __future__ import annotations

import re
import typing

import pytest
from pydantic import SecretStr
from pydantic_settings import BaseSettings

from tests.unit.core.secret_settings_support import settings_classes

# A field whose name says it holds a secret. Paths of key files (`tls_keyfile`) and names of
# things (`token_audience`) are not secrets: only the credential itself is.
SECRET_NAME = re.compile(r"(password|secret|token|passphrase|api_key|private_key|credential)")
NOT_SECRET = re.compile(r"(_file|_path|_location|_ttl|_url|_audience|_issuer|_header|_name|_s)$")


def plain_text(annotation: object) -> bool:
    """Whether a value of this type may be a plain `str`: itself, in a union or in a container
    (a dict of header values, a list of keys). A flag or a number is never a secret."""
    if annotation is str:
        return True
    args = typing.get_args(annotation)
    if typing.get_origin(annotation) is dict:
        args = args[1:]  # the names are not secret, the values may be
    return any(plain_text(arg) for arg in args)


def secret_named(field: str) -> bool:
    return bool(SECRET_NAME.search(field)) and not NOT_SECRET.search(field)


def test_the_walk_finds_the_settings_classes() -> None:
    names = {cls.__name__ for cls in settings_classes()}
    assert {"KafkaSettings", "GatewaySettings", "WorkerSettings", "PostgresSettings"} <= names


@pytest.mark.parametrize("cls", settings_classes(), ids=lambda cls: cls.__name__)
def test_every_secret_setting_is_a_secret_str(cls: type[BaseSettings]) -> None:
    plain = [
        name
        for name, info in cls.model_fields.items()
        if secret_named(name) and plain_text(info.annotation)
    ]
    assert not plain, f"{cls.__name__}: make {plain} SecretStr, or they end up in logs"


def test_the_check_tells_a_secret_from_a_plain_field() -> None:
    assert not plain_text(SecretStr | None)
    assert not plain_text(bool)
    assert not plain_text(dict[str, SecretStr])
    assert plain_text(str | None)
    assert plain_text(dict[str, str])
    assert plain_text(list[str])
    for secret in ("sasl_password", "jwt_secret", "oauth_token", "tls_keyfile_password"):
        assert secret_named(secret), secret
    for plain in ("tls_keyfile", "token_audience", "jwks_url"):
        assert not secret_named(plain), plain
