"""The registry's log: every state change is a record appended to it and applied from it.

`SchemaLog` holds the state and the lock that guards it; subclasses decide where records go.
`MemoryLog` applies each record at once (tests, single process); `KafkaLog` (in `kafka_log`)
writes to the compacted topic and applies what its reader thread reads back.
"""

from __future__ import annotations

import logging
import threading
from abc import ABC, abstractmethod
from collections.abc import Iterator
from contextlib import contextmanager

from tidegate.core.errors import RegistryUnavailableError
from tidegate.schemas.registry.registry_state import RegistryState
from tidegate.schemas.registry.topic_records import Record, decode_record, encode_record

__all__ = ["MemoryLog", "SchemaLog"]

_log = logging.getLogger(__name__)


class SchemaLog(ABC):
    def __init__(self) -> None:
        self._state = RegistryState()
        self._lock = threading.RLock()

    @contextmanager
    def view(self) -> Iterator[RegistryState]:
        """The state, locked against the applier for the duration of the block."""
        with self._lock:
            yield self._state

    def ensure_ready(self) -> None:
        if not self.ready:
            raise RegistryUnavailableError(
                f"the schema registry is still loading its state from {self.describe()}"
            )

    def settle(self) -> None:
        """Called before a write reads the state: make sure that state is current."""
        self.ensure_ready()

    def _apply_bytes(self, key: bytes | None, value: bytes | None) -> None:
        try:
            record = decode_record(key, value)
        except (ValueError, KeyError, TypeError) as exc:
            # A foreign or corrupt record must not stop the replay of everything after it.
            _log.warning("skipping an unreadable registry record (key %r): %s", key, exc)
            return
        if record is not None:
            with self._lock:
                self._state.apply(record)

    @property
    @abstractmethod
    def ready(self) -> bool:
        """Whether the state has caught up with the log as it was at start."""

    @abstractmethod
    def describe(self) -> str: ...

    @abstractmethod
    def start(self) -> None: ...

    @abstractmethod
    def wait_ready(self, timeout: float) -> bool: ...

    @abstractmethod
    def stop(self) -> None: ...

    @abstractmethod
    def append(self, record: Record) -> None:
        """Write `record` and return once the state has applied it."""


class MemoryLog(SchemaLog):
    """A log in a list: records are encoded, kept and applied at once."""

    def __init__(self) -> None:
        super().__init__()
        self.records: list[tuple[bytes, bytes | None]] = []

    @property
    def ready(self) -> bool:
        return True

    def describe(self) -> str:
        return "memory"

    def start(self) -> None:
        pass

    def wait_ready(self, timeout: float) -> bool:
        return True

    def stop(self) -> None:
        pass

    def append(self, record: Record) -> None:
        key, value = encode_record(record)
        with self._lock:
            self.records.append((key, value))
            self._apply_bytes(key, value)
