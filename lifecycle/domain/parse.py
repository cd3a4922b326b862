"""Parsing of the operators' arguments, shared by the CLI and the admin API so both accept the
same spellings. Malformed input raises `ValueError`: a usage error, not a lifecycle refusal."""

from __future__ import annotations

import re
from datetime import UTC, datetime, timedelta

__all__ = ["parse_at", "parse_steps", "parse_weights"]

_RELATIVE = re.compile(r"^-\s*(\d+(?:\.\d+)?)\s*(ms|s|m|h|d|w)$")
_UNITS = {"ms": 0.001, "s": 1.0, "m": 60.0, "h": 3600.0, "d": 86400.0, "w": 604800.0}


def parse_at(text: str, now: datetime | None = None) -> datetime:
    """An ISO-8601 instant (naive means UTC), `now`, or a time ago like `-5m`, `-90s`, `-2h`."""
    value = text.strip()
    current = now or datetime.now(UTC)
    if value.lower() == "now":
        return current
    relative = _RELATIVE.match(value)
    if relative:
        seconds = float(relative.group(1)) * _UNITS[relative.group(2)]
        try:
            return current - timedelta(seconds=seconds)
        except OverflowError:
            # Before year 1 (or past what timedelta holds): no instant to read at.
            raise ValueError(f"{text!r} reaches back before the year 1") from None
    try:
        moment = datetime.fromisoformat(value.replace("Z", "+00:00").replace("z", "+00:00"))
    except ValueError:
        raise ValueError(
            f"{text!r} is neither an ISO-8601 time (2026-01-01T12:00:00Z) nor a time ago (-5m)"
        ) from None
    return moment if moment.tzinfo else moment.replace(tzinfo=UTC)


def parse_steps(text: str) -> list[int]:
    """`10,50,100` -> [10, 50, 100] (the rules on steps are the command's)."""
    try:
        return [int(part) for part in text.replace(" ", "").split(",") if part]
    except ValueError:
        raise ValueError(
            f"steps are comma-separated percentages like 10,50,100, not {text!r}"
        ) from None


def parse_weights(text: str) -> dict[str, int]:
    """`1=90,2=10` -> {"1": 90, "2": 10}."""
    weights: dict[str, int] = {}
    for part in text.replace(" ", "").split(","):
        if not part:
            continue
        version, sep, weight = part.partition("=")
        if not sep or not version or version in weights:
            raise ValueError(f"weights are VERSION=PERCENT pairs like 1=90,2=10, not {text!r}")
        try:
            weights[version] = int(weight)
        except ValueError:
            raise ValueError(f"weight of {version!r} is not an integer: {weight!r}") from None
    return weights
