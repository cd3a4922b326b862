"""A replay run's checkpoint and summary: what `--resume RUN_ID` continues from.

The checkpoint is a small JSON file per run under `ReplaySettings.state_dir`. A local file, not a
Kafka topic or a table: a replay is one operator's process on one machine, resuming is that same
operator's act, and a file needs no schema, no migration and no cluster permissions; it is
written to a temporary name and renamed, so an interrupt never leaves half of one.

It holds the whole resolved plan (topic, per-partition offset ranges), the options that decide
the outputs (target topic, version, model, request ids, batch size), and per partition the next
offset to read. That offset advances only once Kafka acknowledged the results of every record
before it, so a resumed run never redoes acknowledged work; results produced but not yet
acknowledged at an interrupt may be written again (at least once).
"""

from __future__ import annotations

import json
import os
import secrets
import time
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

from tidegate.core.errors import ConfigurationError
from tidegate.dlq.ranges import ReadPlan

__all__ = ["ReplayCheckpoint", "Source", "Status", "Summary", "checkpoint_path", "new_run_id"]

Status = Literal["running", "interrupted", "failed", "done"]
Source = Literal["requests", "dlq"]


def new_run_id() -> str:
    """Sortable by start time, unique without coordination."""
    return f"replay-{time.strftime('%Y%m%dT%H%M%SZ', time.gmtime())}-{secrets.token_hex(3)}"


def checkpoint_path(state_dir: Path, run_id: str) -> Path:
    if not run_id or "/" in run_id or run_id.startswith("."):
        raise ConfigurationError(f"{run_id!r} is not a replay run id")
    return state_dir / f"{run_id}.json"


@dataclass
class Summary:
    """What a run did so far; saved with the checkpoint, so a resumed run's summary is whole."""

    read: int = 0
    """Records read from the source topic."""
    filtered: int = 0
    """Read but not selected (another model, another request id)."""
    replayed: int = 0
    """Results produced to the target topic and acknowledged by Kafka."""
    ok: int = 0
    """Of those, with status OK."""
    errors: Counter[str] = field(default_factory=Counter)
    """Error code to count: results that are not OK, and records that could not be decoded."""
    skipped: Counter[str] = field(default_factory=Counter)
    """Reason to count: selected records that were not run (no served version known, ...)."""

    def to_json(self) -> dict[str, Any]:
        return {
            "read": self.read,
            "filtered": self.filtered,
            "replayed": self.replayed,
            "ok": self.ok,
            "errors": dict(sorted(self.errors.items())),
            "skipped": dict(sorted(self.skipped.items())),
        }

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> Summary:
        return cls(
            read=int(data["read"]),
            filtered=int(data["filtered"]),
            replayed=int(data["replayed"]),
            ok=int(data["ok"]),
            errors=Counter({str(k): int(v) for k, v in data["errors"].items()}),
            skipped=Counter({str(k): int(v) for k, v in data["skipped"].items()}),
        )


@dataclass
class ReplayCheckpoint:
    run_id: str
    plan: ReadPlan
    target_topic: str
    source: Source = "requests"
    model: str | None = None
    version: str | None = None
    """None: each request runs on the version that served it."""
    request_ids: tuple[str, ...] = ()
    batch_size: int = 32
    positions: dict[int, int] = field(default_factory=dict)
    """Per partition, the next offset to read; a partition missing here starts at its range."""
    summary: Summary = field(default_factory=Summary)
    status: Status = "running"
    started_at_ms: int = field(default_factory=lambda: int(time.time() * 1000))
    updated_at_ms: int = 0

    def position(self, partition: int) -> int:
        start = next(r.start for r in self.plan.ranges if r.partition == partition)
        return max(self.positions.get(partition, start), start)

    def to_json(self) -> dict[str, Any]:
        return {
            "run_id": self.run_id,
            "plan": self.plan.to_json(),
            "target_topic": self.target_topic,
            "source": self.source,
            "model": self.model,
            "version": self.version,
            "request_ids": list(self.request_ids),
            "batch_size": self.batch_size,
            "positions": {str(p): o for p, o in sorted(self.positions.items())},
            "summary": self.summary.to_json(),
            "status": self.status,
            "started_at_ms": self.started_at_ms,
            "updated_at_ms": self.updated_at_ms,
        }

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> ReplayCheckpoint:
        return cls(
            run_id=str(data["run_id"]),
            plan=ReadPlan.from_json(data["plan"]),
            target_topic=str(data["target_topic"]),
            source=data["source"],
            model=data["model"],
            version=data["version"],
            request_ids=tuple(data["request_ids"]),
            batch_size=int(data["batch_size"]),
            positions={int(p): int(o) for p, o in data["positions"].items()},
            summary=Summary.from_json(data["summary"]),
            status=data["status"],
            started_at_ms=int(data["started_at_ms"]),
            updated_at_ms=int(data["updated_at_ms"]),
        )

    def save(self, path: Path) -> None:
        """Write atomically: a temporary file in the same directory, then a rename."""
        self.updated_at_ms = int(time.time() * 1000)
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
        tmp.write_text(json.dumps(self.to_json(), indent=2, sort_keys=True) + "\n")
        os.replace(tmp, path)

    @classmethod
    def load(cls, path: Path) -> ReplayCheckpoint:
        try:
            data = json.loads(path.read_text())
        except FileNotFoundError:
            raise ConfigurationError(f"no replay checkpoint at {path}") from None
        except ValueError as exc:
            raise ConfigurationError(f"the replay checkpoint {path} is unreadable: {exc}") from exc
        return cls.from_json(data)
