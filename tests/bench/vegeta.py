"""Open-loop HTTP load from vegeta (github.com/tsenart/vegeta), for rates the Python generator
cannot make on these 2 cores.

The aiohttp generator (`tidegate.clients.loadgen.http_load`) tops out near 1,000 calls/s here,
using the cores it shares with what it measures, and started calls 70-200 ms late at p99 under
overload, a delay inside every latency it reported. vegeta paces requests from Go at a fraction of
that CPU. `make bench` installs it into `var/bin` (`infra/bench-tools.sh`).

Latencies are counted as the Python generator counts them, from when each call was due
(`start + seq / rate`), so the generator's own lateness stays visible rather than hidden:
`Answers.started_late` holds it per call.
"""

from __future__ import annotations

import base64
import csv
import io
import json
import subprocess
import tempfile
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

from tests.bench.overload_load import Answers
from tidegate.clients.loadgen import LoadResult

__all__ = ["VEGETA", "attack", "available", "load_result"]

VEGETA = Path("var/bin/vegeta")
# One client's connections are capped by the gateway (`max_connections_per_client`, 256).
_MAX_CONNECTIONS = 256
# Distinct bodies, cycled: no cache may answer a repeated one.
_BODIES = 2000


def available() -> bool:
    return VEGETA.is_file()


def attack(
    url: str,
    make_body: Callable[[int], dict[str, Any]],
    *,
    rate: float,
    seconds: float,
    headers: Mapping[str, str],
    timeout_s: float = 30.0,
) -> Answers:
    """POST V2 bodies to `url` at `rate`/s for `seconds`, open loop; each answer's latency from
    when it was due, by status ("200", "503", ... or the transport error vegeta reports)."""
    sent = {**headers, "Content-Type": "application/json"}
    with tempfile.TemporaryDirectory(prefix="vegeta-") as tmp:
        targets, results = Path(tmp) / "targets.jsonl", Path(tmp) / "results.bin"
        with targets.open("w") as out:
            for i in range(_BODIES):
                body = json.dumps(make_body(i)).encode()
                target = {
                    "method": "POST",
                    "url": url,
                    "body": base64.b64encode(body).decode(),
                    "header": {name: [value] for name, value in sent.items()},
                }
                out.write(json.dumps(target) + "\n")
        subprocess.run(
            [
                str(VEGETA.resolve()),
                "attack",
                f"-targets={targets}",
                "-format=json",
                f"-rate={round(rate)}/1s",
                f"-duration={seconds:g}s",
                f"-timeout={timeout_s:g}s",
                f"-max-connections={_MAX_CONNECTIONS}",
                f"-output={results}",
            ],
            check=True,
        )
        encoded = subprocess.run(
            [str(VEGETA.resolve()), "encode", "--to", "csv", str(results)],
            check=True,
            capture_output=True,
        ).stdout.decode()
    return _answers(encoded, rate, seconds)


def _answers(encoded: str, rate: float, seconds: float) -> Answers:
    # vegeta's CSV: timestamp (ns, when the request began), code, latency (ns), bytes out,
    # bytes in, error, body, attack, seq, method, url, headers.
    rows = [
        (int(row[0]), int(row[1]), int(row[2]), row[5], int(row[8]))
        for row in csv.reader(io.StringIO(encoded))
        if row
    ]
    answers = Answers(seconds)
    if not rows:
        return answers
    # The first request began when it was due, or a hair after: the schedule starts there.
    start_ns = min(began for began, *_ in rows)
    for began, code, latency_ns, error, seq in sorted(rows, key=lambda r: r[4]):
        # Seconds since the start, kept small: nanoseconds since 1970 lose precision as floats.
        due = seq / rate
        late = max(0.0, (began - start_ns) / 1e9 - due)
        status = str(code) if code else (error.split(":")[-1].strip() or "error")
        latency = late + latency_ns / 1e9
        answers.started_late.append(late)
        answers.by_status.setdefault(status, []).append(latency)
        if latency < 1.0:
            answers.timeline.append((due, status))
    return answers


def load_result(label: str, answers: Answers) -> LoadResult:
    """The same answers as a `LoadResult`, for the sweeps written against the Python generator."""
    result = LoadResult(label, elapsed_s=answers.seconds)
    for status, latencies in answers.by_status.items():
        name = "OK" if status == "200" else f"HTTP {status}" if status.isdigit() else status
        result.statuses[name] = len(latencies)
        result.latencies.extend(latencies)
        if name == "OK":
            result.ok += len(latencies)
        else:
            result.errors += len(latencies)
    result.sent = result.ok + result.errors
    return result
