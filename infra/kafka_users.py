"""Sets the local Kafka's SCRAM-SHA-512 users and checks its SASL_SSL and mutual-TLS listeners.

Run by infra/kafka-tls.sh once the broker is healthy:

    python infra/kafka_users.py USER SASL_SSL_ENV MTLS_ENV [COMPONENT_ENV ...]

USER (the admin) is upserted with the SASL_SSL env file's password, and so is each component's
user, named and with the password of its own env file (`TIDEGATE_KAFKA_SASL_USERNAME`). Each user is
upserted through the admin API of the PLAINTEXT listener (the address that infra/lib.sh
exports as TIDEGATE_KAFKA_BOOTSTRAP_SERVERS), with the password read from the SASL_SSL env file, so
it never appears on a command line or in output. Each listener is then asked for the cluster's
metadata with its own env file's settings, as a client of tidegate would connect: `make up` fails
here, loudly, rather than in the integration test. SCRAM credentials reach the broker's cache a
moment after the controller takes them, so the check retries until a deadline.
"""

from __future__ import annotations

import os
import sys
import time
from pathlib import Path

from confluent_kafka import KafkaException

from tidegate.core.kafka import make_admin
from tidegate.core.kafka_principals import upsert_scram_users
from tidegate.core.settings import KafkaSettings, read_env_file

__all__ = ["env_settings", "main"]

PREFIX = "TIDEGATE_KAFKA_"
DEADLINE_S = 30.0
DEFAULT = "127.0.0.1:9092"


def env_settings(path: Path) -> KafkaSettings:
    """KafkaSettings from a KEY=VALUE file of TIDEGATE_KAFKA_* lines (`main` has cleared those of
    the environment, which name the PLAINTEXT listener)."""
    if not path.is_file():
        raise SystemExit(f"{path} is missing: infra/kafka-tls.sh writes it")
    return KafkaSettings.model_validate(read_env_file(path, PREFIX))


def upsert(users: dict[str, KafkaSettings], plain: KafkaSettings) -> None:
    """Sets each user's SCRAM credential to the password of its settings."""
    passwords = {}
    for user, secure in users.items():
        if secure.sasl_password is None:
            raise SystemExit(f"the env file of {user} names no TIDEGATE_KAFKA_SASL_PASSWORD")
        passwords[user] = secure.sasl_password
    upsert_scram_users(make_admin(plain), passwords)


def answers(settings: KafkaSettings) -> None:
    """Waits until the listener of `settings` serves metadata, or raises at the deadline."""
    admin = make_admin(settings)
    deadline = time.monotonic() + DEADLINE_S
    last = "no brokers in the metadata"
    while time.monotonic() < deadline:
        try:
            if admin.list_topics(timeout=5).brokers:
                return
        except KafkaException as exc:
            last = str(exc)
        time.sleep(0.2)
    raise SystemExit(f"{settings.bootstrap_servers} did not answer in {DEADLINE_S:.0f}s: {last}")


def main(argv: list[str]) -> int:
    if len(argv) < 3:
        usage = "usage: python infra/kafka_users.py USER SASL_SSL_ENV MTLS_ENV [COMPONENT_ENV ...]"
        print(usage, file=sys.stderr)
        return 2
    user, sasl_env, mtls_env, *component_envs = argv
    # Only the PLAINTEXT address comes from the environment: the settings of a shell that sourced
    # an env file of the secure listeners must not leak into any client here.
    servers = os.environ.get(f"{PREFIX}BOOTSTRAP_SERVERS", DEFAULT)
    for key in [k for k in os.environ if k.startswith(PREFIX)]:
        del os.environ[key]
    plain = KafkaSettings(bootstrap_servers=servers)
    sasl, mtls = env_settings(Path(sasl_env)), env_settings(Path(mtls_env))
    users = {user: sasl}
    for path in component_envs:
        settings = env_settings(Path(path))
        if settings.sasl_username is None:
            raise SystemExit(f"{path} names no TIDEGATE_KAFKA_SASL_USERNAME")
        users[settings.sasl_username] = settings
    upsert(users, plain)
    for settings in (mtls, *users.values()):
        answers(settings)
    print(
        f"SCRAM-SHA-512 users {', '.join(users)} set; SASL_SSL on {sasl.bootstrap_servers} and "
        f"mTLS on {mtls.bootstrap_servers} answer"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
