"""What failure handling costs the hot path (`python -m tests.bench failures`, part of
`make bench`): tidegate's Kafka path with the crash guard on (its default: one pipelined Redis
write per poll that read something, plus the lineage headers read and the request digest, which
are always on) and off, in alternating rounds on the same open-loop rate steps; each side's best
round counts. The retry relay runs in both (it idles when nothing fails)."""

from __future__ import annotations

import functools

from tests.bench.proc_cpu import cpu_seconds
from tests.bench.versus import (
    ROUNDS,
    RUN_DIR,
    CpuReaders,
    Sweep,
    best,
    kafka_sweep,
    ratio,
    tidegate_workers,
)
from tidegate.cli.procs import stop_recorded

__all__ = ["run"]

SIDES = {
    "guard on": {"TIDEGATE_FAILURE_CRASH_GUARD": "true"},
    "guard off": {"TIDEGATE_FAILURE_CRASH_GUARD": "false"},
}


def run() -> None:
    from rich.console import Console

    from tidegate.cli.demo_lifecycle import bootstrap
    from tidegate.models.model_settings import ModelSettings

    bootstrap(ModelSettings().store_dir.parent / "packages", Console())
    rounds: list[dict[str, Sweep]] = []
    for k in range(ROUNDS):
        order = list(SIDES.items()) if k % 2 == 0 else list(SIDES.items())[::-1]
        found: dict[str, Sweep] = {}
        for name, env in order:
            print(f"failures: round {k + 1}, crash {name}")
            stop_recorded(RUN_DIR)
            with tidegate_workers(env) as workers:
                readers: CpuReaders = {"workers": functools.partial(cpu_seconds, workers)}
                found[name] = kafka_sweep(f"crash {name}", readers)
        rounds.append(found)
    top = {name: best(rounds, name) for name in SIDES}
    print("\nfailures: best round of each (sustained at p99 <= 100 ms, nothing lost)")
    for name, s in top.items():
        every = [r[name].sustained for r in rounds]
        low = s.runs[0] if s.runs else None
        p50 = f"{low.p(0.5):.1f} ms" if low else "-"
        cpu = ", ".join(f"{g} {ms:.2f}" for g, ms in s.cpu_ms.items())
        print(
            f"  crash {name:<9} {s.sustained:>7,.0f}/s  rounds {every}  batch {s.mean_batch:4.1f}"
            f"  cpu ms/req {cpu}  p50 at the first step {p50}"
        )
    on, off = top["guard on"], top["guard off"]
    print(
        f"failures ratio: sustained guard on / off {ratio(on.sustained, off.sustained):.2f}"
        f" (bar >= 0.95); cpu per request on / off "
        f"{ratio(on.cpu_ms.get('workers', 0.0), off.cpu_ms.get('workers', 0.0)):.2f}"
    )
