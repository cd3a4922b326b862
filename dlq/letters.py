"""One dead letter as the operator commands see it, the filters that pick letters, and the
counts `tidegate dlq stats` prints. Pure: no Kafka, no registry.

A `Letter` is a record read from a dead-letter topic (`inference-failed-requests`), the poison
topic (`inference-poison-pill`) or a retry topic: where it lies, and its decoded
`DeadLetterEnvelope`, or why the envelope itself could not be read. The CLI, the admin API and
the redrive all filter and render the same `Letter`s, so their answers cannot disagree.

The model *version* is not an envelope field. It is taken from the error's `details`
(`version`, else `model_version`) when the worker put it there, else from the original request's
`model_version` when the request pinned one (which needs the request decoded); otherwise it is
unknown, and a version filter never matches a letter whose version is unknown.
"""

from __future__ import annotations

import base64
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any

from tidegate.core.errors import InvalidInputError

__all__ = [
    "UNKNOWN",
    "UNREADABLE",
    "Letter",
    "LetterFilter",
    "LetterStats",
    "Tally",
    "bytes_view",
    "iso_ms",
    "letter_view",
    "to_ms",
]

UNKNOWN = "unknown"
"""The bucket of letters without a model or version, in stats."""
UNREADABLE = "UNREADABLE_ENVELOPE"
"""The error code reported for a record of a dead-letter topic that is not an envelope."""


def to_ms(value: Any) -> int | None:
    """Epoch milliseconds of an Avro timestamp-millis as fastavro reads it (an aware datetime),
    or of an int already in milliseconds."""
    if value is None:
        return None
    if isinstance(value, datetime):
        moment = value if value.tzinfo else value.replace(tzinfo=UTC)
        return int(moment.timestamp() * 1000)
    return int(value)


def iso_ms(ms: int | None) -> str | None:
    if ms is None:
        return None
    return datetime.fromtimestamp(ms / 1000, UTC).isoformat(timespec="milliseconds")


@dataclass(frozen=True, slots=True)
class Letter:
    """A record of a dead-letter topic, decoded."""

    topic: str
    partition: int
    offset: int
    timestamp_ms: int | None
    envelope: Mapping[str, Any] | None
    problem: str | None = None
    """Why the envelope could not be read (then `envelope` is None)."""
    request: Mapping[str, Any] | None = None
    """The original `InferenceRequest`, when it was decoded and could be."""

    @property
    def position(self) -> dict[str, Any]:
        return {"topic": self.topic, "partition": self.partition, "offset": self.offset}

    @property
    def readable(self) -> bool:
        return self.envelope is not None

    @property
    def code(self) -> str:
        if self.envelope is None:
            return UNREADABLE
        return str((self.envelope.get("error") or {}).get("code") or UNKNOWN)

    @property
    def model(self) -> str | None:
        model = self.envelope.get("model") if self.envelope is not None else None
        if model is None and self.request is not None:
            model = self.request.get("model")
        return str(model) if model is not None else None

    @property
    def request_id(self) -> str | None:
        rid = self.envelope.get("request_id") if self.envelope is not None else None
        if rid is None and self.request is not None:
            rid = self.request.get("request_id")
        return str(rid) if rid is not None else None

    @property
    def version(self) -> str | None:
        if self.envelope is not None:
            details = (self.envelope.get("error") or {}).get("details") or {}
            for key in ("version", "model_version"):
                if details.get(key):
                    return str(details[key])
        if self.request is not None and self.request.get("model_version"):
            return str(self.request["model_version"])
        return None

    @property
    def failed_at_ms(self) -> int | None:
        """When processing failed (the envelope's `failed_at`), else the record's timestamp."""
        if self.envelope is not None:
            found = to_ms(self.envelope.get("failed_at"))
            if found is not None:
                return found
        return self.timestamp_ms


def _names(values: Iterable[str] | None) -> frozenset[str]:
    return frozenset(v.strip() for v in values or () if v and v.strip())


@dataclass(frozen=True)
class LetterFilter:
    """Which letters an operation takes. Empty sets match anything; values of one set are
    alternatives, and the sets combine with AND. Times are epoch ms, inclusive, on `failed_at`."""

    models: frozenset[str] = frozenset()
    versions: frozenset[str] = frozenset()
    codes: frozenset[str] = frozenset()
    since_ms: int | None = None
    until_ms: int | None = None

    @classmethod
    def build(
        cls,
        *,
        models: Iterable[str] | None = None,
        versions: Iterable[str] | None = None,
        codes: Iterable[str] | None = None,
        since: datetime | None = None,
        until: datetime | None = None,
    ) -> LetterFilter:
        """A filter from operator input; an empty time range is refused."""
        since_ms, until_ms = to_ms(since), to_ms(until)
        if since_ms is not None and until_ms is not None and since_ms > until_ms:
            raise InvalidInputError(
                f"the time range is empty: since {iso_ms(since_ms)} is after until "
                f"{iso_ms(until_ms)}",
                field="since",
            )
        return cls(
            _names(models),
            _names(versions),
            frozenset(c.upper() for c in _names(codes)),
            since_ms,
            until_ms,
        )

    @property
    def needs_request(self) -> bool:
        """Whether matching may need the original request decoded (for its version)."""
        return bool(self.versions)

    def matches(self, letter: Letter) -> bool:
        if self.codes and letter.code not in self.codes:
            return False
        if self.models and letter.model not in self.models:
            return False
        if self.versions and letter.version not in self.versions:
            return False
        if self.since_ms is not None or self.until_ms is not None:
            at = letter.failed_at_ms
            if at is None:
                return False
            if self.since_ms is not None and at < self.since_ms:
                return False
            if self.until_ms is not None and at > self.until_ms:
                return False
        return True

    def view(self) -> dict[str, Any]:
        """The filter as JSON (stable: also the fingerprint a redrive checkpoint keeps)."""
        return {
            "models": sorted(self.models),
            "versions": sorted(self.versions),
            "codes": sorted(self.codes),
            "since": iso_ms(self.since_ms),
            "until": iso_ms(self.until_ms),
        }


@dataclass
class Tally:
    """How many letters, and the oldest and newest failure among them."""

    count: int = 0
    oldest_ms: int | None = None
    newest_ms: int | None = None

    def add(self, at_ms: int | None) -> None:
        self.count += 1
        if at_ms is None:
            return
        if self.oldest_ms is None or at_ms < self.oldest_ms:
            self.oldest_ms = at_ms
        if self.newest_ms is None or at_ms > self.newest_ms:
            self.newest_ms = at_ms

    def view(self) -> dict[str, Any]:
        return {
            "count": self.count,
            "oldest": iso_ms(self.oldest_ms),
            "newest": iso_ms(self.newest_ms),
        }


@dataclass
class LetterStats:
    """Counts of the letters that matched, by topic, model, version and error code."""

    total: Tally = field(default_factory=Tally)
    scanned: int = 0
    unreadable: int = 0
    by_topic: dict[str, Tally] = field(default_factory=dict)
    by_model: dict[str, Tally] = field(default_factory=dict)
    by_version: dict[str, Tally] = field(default_factory=dict)
    by_code: dict[str, Tally] = field(default_factory=dict)

    def add(self, letter: Letter) -> None:
        at = letter.failed_at_ms
        self.total.add(at)
        if not letter.readable:
            self.unreadable += 1
        model = letter.model or UNKNOWN
        for groups, key in (
            (self.by_topic, letter.topic),
            (self.by_model, model),
            (self.by_version, f"{model}:{letter.version or UNKNOWN}"),
            (self.by_code, letter.code),
        ):
            groups.setdefault(key, Tally()).add(at)

    def view(self) -> dict[str, Any]:
        def groups(by: dict[str, Tally]) -> dict[str, dict[str, Any]]:
            return {key: by[key].view() for key in sorted(by)}

        return {
            **self.total.view(),
            "scanned": self.scanned,
            "unreadable": self.unreadable,
            "by_topic": groups(self.by_topic),
            "by_model": groups(self.by_model),
            "by_version": groups(self.by_version),
            "by_code": groups(self.by_code),
        }


def bytes_view(data: bytes | None) -> dict[str, Any] | None:
    """Bytes for JSON: base64 always, the UTF-8 text too when they are text."""
    if data is None:
        return None
    view: dict[str, Any] = {"size": len(data), "base64": base64.b64encode(data).decode()}
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError:
        return view
    if text.isprintable():
        view["text"] = text
    return view


def _history_view(items: Iterable[Mapping[str, Any]]) -> list[dict[str, Any]]:
    return [{**item, "at": iso_ms(to_ms(item.get("at")))} for item in items]


def _request_view(request: Mapping[str, Any]) -> dict[str, Any]:
    """The original request without its tensor bytes: what an operator needs to recognise it."""
    return {
        "request_id": request.get("request_id"),
        "model": request.get("model"),
        "model_version": request.get("model_version"),
        "tenant": request.get("tenant"),
        "routing_key": request.get("routing_key"),
        "created_at": iso_ms(to_ms(request.get("created_at"))),
        "deadline": iso_ms(to_ms(request.get("deadline"))),
        "inputs": [
            {
                "name": t.get("name"),
                "datatype": t.get("datatype"),
                "shape": list(t.get("shape", [])),
            }
            for t in request.get("inputs") or ()
        ],
    }


def letter_view(letter: Letter, *, full: bool = False) -> dict[str, Any]:
    """The JSON view of a letter: the summary `list` shows, or with `full` everything `show`
    shows (the original key, value and headers, the decoded request)."""
    envelope: Mapping[str, Any] = letter.envelope or {}
    error: Mapping[str, Any] = envelope.get("error") or {}
    view: dict[str, Any] = {
        **letter.position,
        "timestamp": iso_ms(letter.timestamp_ms),
        "request_id": letter.request_id,
        "model": letter.model,
        "version": letter.version,
        "code": letter.code,
        "message": error.get("message") if letter.readable else letter.problem,
        "retriable": error.get("retriable"),
        "attempt": envelope.get("attempt"),
        "failed_at": iso_ms(letter.failed_at_ms),
        "first_failed_at": iso_ms(to_ms(envelope.get("first_failed_at"))),
        "source": envelope.get("source"),
        "origin": envelope.get("origin"),
        "worker_id": envelope.get("worker_id"),
        "redeliveries": len(envelope.get("history") or ()),
    }
    if not full:
        return view
    view.update(
        {
            "error": dict(error) if letter.readable else None,
            "history": _history_view(envelope.get("history") or ()),
            "retry_at": iso_ms(to_ms(envelope.get("retry_at"))),
            "original_timestamp": iso_ms(to_ms(envelope.get("original_timestamp"))),
            "original_key": bytes_view(envelope.get("original_key")),
            "original_value": bytes_view(envelope.get("original_value")),
            "original_headers": [
                {"key": h["key"], "value": bytes_view(h.get("value"))}
                for h in envelope.get("original_headers") or ()
            ],
            "request": _request_view(letter.request) if letter.request is not None else None,
        }
    )
    return view
