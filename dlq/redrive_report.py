"""What a redrive is asked to do, how far it has got, and what happened to each letter: the
plain records `tidegate.dlq.redrive` fills in, and the JSON views the CLI's `--json` and the
admin API answer with (the CLI draws its tables from the same views)."""

from __future__ import annotations

import re
import uuid
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any

from tidegate.core.errors import InvalidInputError
from tidegate.dlq.letters import LetterFilter, iso_ms

__all__ = [
    "DEFAULT_RATE",
    "FAILED",
    "MAX_RATE",
    "OUTCOMES",
    "REDRIVEN",
    "SKIPPED",
    "WOULD_REDRIVE",
    "MessageOutcome",
    "RedriveOptions",
    "RedriveProgress",
    "RedriveReport",
    "check_run_id",
    "new_run_id",
]

DEFAULT_RATE = 200.0
"""Messages per second: well below what one worker serves, so a redrive never crowds out live
traffic; raise it with `--rate` for a big backlog."""
MAX_RATE = 100_000.0

REDRIVEN = "redriven"
WOULD_REDRIVE = "would_redrive"
SKIPPED = "skipped"
FAILED = "failed"
OUTCOMES = (REDRIVEN, WOULD_REDRIVE, SKIPPED, FAILED)

_RUN_ID = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]{0,99}$")


def new_run_id() -> str:
    return f"redrive-{datetime.now(UTC):%Y%m%dT%H%M%SZ}-{uuid.uuid4().hex[:6]}"


def check_run_id(run_id: str) -> str:
    """A run id names a consumer group and appears in every redriven request's history."""
    if not _RUN_ID.match(run_id):
        raise InvalidInputError(
            f"run id {run_id!r} must be 1-100 letters, digits, '.', '_' or '-', starting with a "
            "letter or digit",
            field="run_id",
        )
    return run_id


@dataclass(frozen=True)
class RedriveOptions:
    """One redrive run. `source` is the topic read (the failed or the poison topic)."""

    source: str
    letters: LetterFilter = field(default_factory=LetterFilter)
    run_id: str = field(default_factory=new_run_id)
    rate: float = DEFAULT_RATE
    dry_run: bool = False
    resume: bool = False
    limit: int | None = None
    delivery_timeout_s: float = 30.0

    def __post_init__(self) -> None:
        check_run_id(self.run_id)
        if not 0 < self.rate <= MAX_RATE:
            raise InvalidInputError(
                f"the rate must be above 0 and at most {MAX_RATE:.0f} messages/s", field="rate"
            )
        if self.limit is not None and self.limit < 1:
            raise InvalidInputError("the limit must be at least 1", field="limit")
        if self.delivery_timeout_s <= 0:
            raise InvalidInputError("the delivery timeout must be positive", field="timeout")


@dataclass(frozen=True)
class MessageOutcome:
    """What happened to one letter."""

    position: dict[str, Any]
    outcome: str
    request_id: str | None = None
    model: str | None = None
    code: str | None = None
    target: str | None = None
    reason: str | None = None

    def view(self) -> dict[str, Any]:
        return {
            **self.position,
            "outcome": self.outcome,
            "request_id": self.request_id,
            "model": self.model,
            "code": self.code,
            "target": self.target,
            "reason": self.reason,
        }


@dataclass
class RedriveProgress:
    """Counts so far. `total` is every letter in the range read (filtered ones included), so
    `scanned / total` is the share done; `limit` may end a run before that."""

    total: int = 0
    scanned: int = 0
    redriven: int = 0
    would_redrive: int = 0
    skipped: int = 0
    failed: int = 0
    in_flight: int = 0

    def count(self, outcome: str) -> None:
        setattr(self, outcome, getattr(self, outcome) + 1)

    def view(self) -> dict[str, int]:
        return {
            "total": self.total,
            "scanned": self.scanned,
            "redriven": self.redriven,
            "would_redrive": self.would_redrive,
            "skipped": self.skipped,
            "failed": self.failed,
            "in_flight": self.in_flight,
        }


@dataclass
class RedriveReport:
    """The summary of a run, and each letter's outcome in offset order."""

    options: RedriveOptions
    progress: RedriveProgress
    started_ms: int
    finished_ms: int | None = None
    send_s: float = 0.0
    """From the first permit of the rate limiter to the last delivery report. The first burst
    (1/20 s of the rate) goes at once, so a run shorter than a second may show a higher rate."""
    stopped: bool = False
    resumed_from: dict[int, int] = field(default_factory=dict)
    checkpoint: dict[int, int] = field(default_factory=dict)
    outcomes: list[MessageOutcome] = field(default_factory=list)

    @property
    def achieved_rate(self) -> float | None:
        sent = self.progress.redriven + self.progress.failed
        return sent / self.send_s if self.send_s > 0 and sent else None

    @property
    def ok(self) -> bool:
        return self.progress.failed == 0 and not self.stopped

    def view(self, *, outcomes: bool = True) -> dict[str, Any]:
        options = self.options
        rate = self.achieved_rate
        view: dict[str, Any] = {
            "run_id": options.run_id,
            "source": options.source,
            "dry_run": options.dry_run,
            "resume": options.resume,
            "rate": options.rate,
            "limit": options.limit,
            "filter": options.letters.view(),
            "started_at": iso_ms(self.started_ms),
            "finished_at": iso_ms(self.finished_ms),
            "send_seconds": round(self.send_s, 3),
            "achieved_rate": round(rate, 1) if rate is not None else None,
            "stopped": self.stopped,
            "counts": self.progress.view(),
            "resumed_from": {str(p): o for p, o in sorted(self.resumed_from.items())},
            "checkpoint": {str(p): o for p, o in sorted(self.checkpoint.items())},
        }
        if outcomes:
            view["outcomes"] = [o.view() for o in self.outcomes]
        return view
