"""Running a backtest: re-score a time range of one model's requests on a candidate version, next
to what was served, and build the diff report (`dlq.backtest_report`).

The requests are read like a replay's (assigned partitions, nothing committed); the served side
is either the results that were served for them, matched by request id in the results topic
(`dlq.replay_served.served_results`), or, with `baseline`, a named version run here too. Nothing
is produced anywhere.

Batches are consecutive requests of one partition, `batch_size` at a time, in offset order, so
the same range, limit and batch size always give the same batches, and the same outputs: a
backtest rerun on the same version matches itself exactly. With a `limit`, the earliest requests
(by timestamp, then partition and offset) are kept.
"""

from __future__ import annotations

import asyncio
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol

from tidegate.core.kafka import make_consumer
from tidegate.core.settings import KafkaSettings, TopicSettings
from tidegate.dlq.backtest_report import BacktestReport, BacktestRow, build_report
from tidegate.dlq.ranges import ReadPlan, resolve_times
from tidegate.dlq.replay_reader import Decoder, RangeReader, SourceRecord
from tidegate.dlq.replay_run import Scorer
from tidegate.dlq.replay_served import served_results
from tidegate.dlq.replay_settings import ReplaySettings
from tidegate.schemas.records import ResultRecord
from tidegate.schemas.tensors import to_numpy

__all__ = ["BacktestRun", "BacktestScorer", "backtest"]


class BacktestScorer(Scorer, Protocol):
    async def task(self, model: str, version: str) -> str:
        """What the version's outputs mean: classifier, embedding or other."""
        ...


@dataclass
class BacktestRun:
    report: BacktestReport
    rows: list[BacktestRow]
    plan: ReadPlan
    candidate_results: dict[str, ResultRecord] = field(default_factory=dict)
    """Request id to the candidate's `InferenceResult` record."""


async def backtest(
    *,
    kafka: KafkaSettings,
    topics: TopicSettings,
    requests: Decoder,
    results: Decoder,
    scorer: BacktestScorer,
    model: str,
    candidate: str,
    from_ms: int,
    to_ms: int,
    run_id: str,
    settings: ReplaySettings,
    baseline: str | None = None,
    limit: int | None = None,
) -> BacktestRun:
    group = f"{settings.group_prefix}-{run_id}"
    plan = await asyncio.to_thread(_plan, kafka, topics.requests, from_ms, to_ms, group)
    records = await asyncio.to_thread(_read, kafka, plan, requests, model, limit, settings, group)
    batches = _batches(records, settings.batch_size)
    scored = await _score(scorer, batches, candidate)
    if baseline is not None:
        served = await _score(scorer, batches, baseline)
    else:
        margin = int(settings.served_margin_s * 1000)
        served = await asyncio.to_thread(
            served_results,
            kafka,
            topics.results,
            results,
            request_ids=[str(r.request_id) for r in records],
            model=model,
            from_ms=from_ms - margin,
            to_ms=to_ms + margin,
            group_id=group,
            stall_timeout_s=settings.stall_timeout_s,
        )
    rows = [_row(str(r.request_id), served.get(str(r.request_id)), scored) for r in records]
    task = await scorer.task(model, candidate)
    report = build_report(model, candidate, rows, task=task)
    return BacktestRun(report, rows, plan, scored)


def _plan(kafka: KafkaSettings, topic: str, from_ms: int, to_ms: int, group: str) -> ReadPlan:
    consumer = make_consumer(kafka, group)
    try:
        return resolve_times(consumer, topic, from_ms, to_ms)
    finally:
        consumer.close()


def _read(
    kafka: KafkaSettings,
    plan: ReadPlan,
    requests: Decoder,
    model: str,
    limit: int | None,
    settings: ReplaySettings,
    group: str,
) -> list[SourceRecord]:
    """The model's requests in the plan, the first of each request id, earliest first."""
    per_partition: dict[int, int] = {}

    def select(record: SourceRecord) -> bool:
        if record.model != model:
            return False
        partition = int(record.position["partition"])
        if limit is not None and per_partition.get(partition, 0) >= limit:
            return False  # the earliest `limit` of the whole range are among these
        per_partition[partition] = per_partition.get(partition, 0) + 1
        return True

    reader = RangeReader(
        kafka,
        plan,
        {},
        requests=requests,
        group_id=group,
        batch_size=settings.batch_size,
        select=select,
        stall_timeout_s=settings.stall_timeout_s,
    )
    records: list[SourceRecord] = []
    try:
        while not reader.done:
            for chunk in reader.poll():
                records.extend(chunk.records)
    finally:
        reader.close()
    records.sort(key=_order)
    seen: set[str] = set()
    unique = []
    for record in records:
        rid = str(record.request_id)
        if rid not in seen:
            seen.add(rid)
            unique.append(record)
    return unique[:limit] if limit is not None else unique


def _order(record: SourceRecord) -> tuple[int, int, int]:
    position = record.position
    return (record.timestamp_ms or 0, int(position["partition"]), int(position["offset"]))


def _batches(records: Sequence[SourceRecord], size: int) -> list[list[SourceRecord]]:
    by_partition: dict[int, list[SourceRecord]] = {}
    for record in records:
        by_partition.setdefault(int(record.position["partition"]), []).append(record)
    batches = []
    for partition in sorted(by_partition):
        ordered = sorted(by_partition[partition], key=lambda r: int(r.position["offset"]))
        batches += [ordered[i : i + size] for i in range(0, len(ordered), size)]
    return batches


async def _score(
    scorer: Scorer, batches: Sequence[Sequence[SourceRecord]], version: str
) -> dict[str, ResultRecord]:
    out: dict[str, ResultRecord] = {}
    for batch in batches:
        results = await scorer.score([(r, version) for r in batch])
        for record, result in zip(batch, results, strict=True):
            out[str(record.request_id)] = result
    return out


def _outputs(result: ResultRecord) -> dict[str, Any]:
    return {t["name"]: to_numpy(t) for t in result["outputs"]}


def _row(
    request_id: str, served: ResultRecord | None, scored: dict[str, ResultRecord]
) -> BacktestRow:
    cand = scored[request_id]
    ok = cand["status"] == "OK"
    error = cand.get("error")
    why = f"{error['code'] if error else cand['status']}: {error['message'] if error else None}"
    served_ok = served is not None and served["status"] == "OK"
    return BacktestRow(
        request_id=request_id,
        served_version=served["model_version"] if served is not None else None,
        served=_outputs(served) if served is not None and served_ok else None,
        served_ms=float(served["timings"]["compute_ms"]) if served is not None else None,
        candidate=_outputs(cand) if ok else None,
        candidate_ms=float(cand["timings"]["compute_ms"]),
        candidate_error=None if ok else why,
    )
