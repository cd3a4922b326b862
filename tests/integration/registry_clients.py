"""Counting the schema registry clients a process makes: each costs about 40 ms of CPU to make,
so a worker or a gateway makes one and shares it."""

from __future__ import annotations

from typing import Any

import pytest
from confluent_kafka.schema_registry import SchemaRegistryClient

__all__ = ["registry_clients_made"]


def registry_clients_made(monkeypatch: pytest.MonkeyPatch) -> list[SchemaRegistryClient]:
    """Every `SchemaRegistryClient` made from now on until the test ends, in order."""
    made: list[SchemaRegistryClient] = []
    original = SchemaRegistryClient.__init__

    def counted(self: SchemaRegistryClient, *args: Any, **kwargs: Any) -> None:
        made.append(self)
        original(self, *args, **kwargs)

    monkeypatch.setattr(SchemaRegistryClient, "__init__", counted)
    return made
