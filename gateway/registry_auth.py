"""Who may use the schema registry: every route but its root and health check needs a caller.

The registry takes what confluent-kafka's `SchemaRegistryClient` sends:

* HTTP Basic (`basic.auth.user.info`): a tidegate API key as user and password, its id (the part
  between `tg_` and the next `_`) and its secret, as Confluent Cloud takes an API key and
  secret; a whole key as the password is taken too;
* a bearer token (`bearer.auth.token`): an API key, or a JWT of the issuer the gateway trusts.

Keys are verified as the gateway verifies them (`tidegate.gateway.authn`, the same table and
cache). Reading (schemas by id, subjects, versions, a lookup, a compatibility test) needs
`read`; registering a schema needs `deploy` over every model (a contract is no one model's);
deleting a subject or a version and changing compatibility need `admin`, since either can
break every reader. Refusals keep Confluent's error shape: `{"error_code": 40101, ...}`.
"""

from __future__ import annotations

import base64
import binascii
from collections.abc import Awaitable, Callable
from typing import Any

from fastapi import Depends, Request

from tidegate.core.errors import AuthenticationError, ConfigurationError, PermissionDeniedError
from tidegate.gateway.api_keys import KEY_PREFIX
from tidegate.gateway.authn import Authenticator
from tidegate.gateway.identity import Identity, Permission

__all__ = ["REALM", "registry_guard"]

REALM = 'Basic realm="tidegate schema registry"'


def registry_guard(permission: Permission) -> list[Any]:
    """The route's dependencies that authenticate the caller and check `permission`."""
    return [Depends(_requires(permission))]


def _requires(permission: Permission) -> Callable[[Request], Awaitable[Identity | None]]:
    async def dependency(request: Request) -> Identity | None:
        if permission is Permission.PUBLIC:
            return None
        authenticator: Authenticator | None = getattr(request.app.state, "authenticator", None)
        if authenticator is None:
            raise ConfigurationError("no authenticator is installed on the registry")
        identity = await _identity(authenticator, request)
        if not identity.allows(permission):
            raise PermissionDeniedError(f"{identity.subject} may not {permission.value} schemas")
        return identity

    return dependency


async def _identity(authenticator: Authenticator, request: Request) -> Identity:
    header = request.headers.get("authorization")
    scheme, _, credentials = (header or "").partition(" ")
    if scheme.lower() == "basic":
        client = request.client.host if request.client is not None else None
        return await authenticator.verify_key(_basic_key(credentials.strip()), client)
    identity = await authenticator.authenticate(request)
    if identity.kind == "anonymous":
        raise AuthenticationError("credentials are required", "no credentials")
    return identity


def _basic_key(credentials: str) -> str:
    """The API key that `user:password` names: `tg_<user>_<password>`, or the password itself
    when it is a whole key."""
    try:
        decoded = base64.b64decode(credentials, validate=True).decode()
    except (binascii.Error, UnicodeDecodeError):
        raise AuthenticationError(
            "malformed Basic credentials", "malformed Authorization header"
        ) from None
    user, sep, password = decoded.partition(":")
    if not sep or not password:
        raise AuthenticationError("malformed Basic credentials", "malformed Authorization header")
    return password if password.startswith(KEY_PREFIX) else f"{KEY_PREFIX}{user}_{password}"
