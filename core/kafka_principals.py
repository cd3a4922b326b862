"""The components' Kafka principals as SCRAM users: their passwords, their env files, and the
cluster's credentials for them.

Each component connects as `User:<prefix><component>` (core/kafka_acls.py says what each may do).
`tidegate stack kafka-principals DIR` makes a password for each, once, and keeps it in
`DIR/<component>.env` (mode 600) with the listener's settings, as `TIDEGATE_KAFKA_*` lines that
the component's process reads; then it sets every user's SCRAM-SHA-512 credential through an admin
connection. docker-compose's `kafka-setup` service runs it; `make up` sets the local stack's users
the same way (infra/kafka_users.py).
"""

from __future__ import annotations

import os
import secrets
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

from confluent_kafka.admin import (  # type: ignore[attr-defined]
    AdminClient,
    ScramCredentialInfo,
    ScramMechanism,
    UserScramCredentialAlteration,
    UserScramCredentialUpsertion,
)
from pydantic import SecretStr

from tidegate.core.kafka_acls import Component
from tidegate.core.settings import read_env_file

__all__ = ["ComponentCredentials", "ensure_env_file", "upsert_scram_users"]

ITERATIONS = 8192
PREFIX = "TIDEGATE_KAFKA_"


@dataclass(frozen=True)
class ComponentCredentials:
    component: Component
    username: str
    password: SecretStr
    env_file: Path


def ensure_env_file(
    directory: Path,
    component: Component,
    *,
    bootstrap_servers: str,
    security_protocol: str = "SASL_PLAINTEXT",
    ssl_ca_location: str | None = None,
    user_prefix: str = "tidegate-",
) -> ComponentCredentials:
    """`DIR/<component>.env`: kept as it is when it names a password (so a restart does not
    change anyone's credentials), else written anew with a fresh 192-bit password."""
    path = directory / f"{component.value}.env"
    username = f"{user_prefix}{component.value}"
    found = read_env_file(path, PREFIX)
    if found.get("sasl_password") and found.get("sasl_username") == username:
        return ComponentCredentials(component, username, SecretStr(found["sasl_password"]), path)
    password = secrets.token_urlsafe(24)
    lines = [
        f"{PREFIX}BOOTSTRAP_SERVERS={bootstrap_servers}",
        f"{PREFIX}SECURITY_PROTOCOL={security_protocol}",
        f"{PREFIX}SASL_MECHANISM=SCRAM-SHA-512",
        f"{PREFIX}SASL_USERNAME={username}",
        f"{PREFIX}SASL_PASSWORD={password}",
    ]
    if ssl_ca_location is not None:
        lines.append(f"{PREFIX}SSL_CA_LOCATION={ssl_ca_location}")
    directory.mkdir(parents=True, exist_ok=True)
    # Created with mode 600 before a byte is written: the password is never readable by others.
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "w") as out:
        out.write("\n".join(lines) + "\n")
    return ComponentCredentials(component, username, SecretStr(password), path)


def upsert_scram_users(
    admin: AdminClient, users: Mapping[str, SecretStr], timeout: float = 30.0
) -> None:
    """Sets each user's SCRAM-SHA-512 credential to its password (created or replaced)."""
    info = ScramCredentialInfo(ScramMechanism.SCRAM_SHA_512, ITERATIONS)
    upsertions: list[UserScramCredentialAlteration] = [
        UserScramCredentialUpsertion(user, info, password.get_secret_value().encode())
        for user, password in users.items()
    ]
    # `admin` must outlive the futures: a freed client cancels them.
    for future in admin.alter_user_scram_credentials(upsertions).values():
        future.result(timeout=timeout)
