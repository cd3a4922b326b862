"""Fixed-rate steps on the Kafka path, repeated, for A/B comparisons
(`python -m tests.bench.kafka_steps --rates 1500,2000 --rounds 2`).

Part `versus` sweeps up to the first rate that misses, once per round: it says what a build
sustains, not whether one setting beats another at a given rate. This starts tidegate as
`versus` does for its Kafka path (the controller with lineage on, 2 `tidegate worker`
processes), then runs every rate of `--rates` in each of `--rounds` rounds: 2 s of warm-up, one
counted step of `STEP_S` seconds, open loop from `KafkaLoad`. Each step prints p50, p90 and p99,
the mean batch, CPU per request by process (the broker's included) and the broker's requests per
call by API; the end prints each rate's steps side by side.

The workers inherit the environment, so one arm of an A/B is one run with its variables set:
alternate the arms' runs in one script, since these 2 cores drift over minutes.
"""

from __future__ import annotations

import argparse
import statistics
import sys
from dataclasses import dataclass

from tests.bench import versus
from tests.bench.pipeline import kafka_attempt
from tests.support import unique
from tidegate.cli.demo import fraud_record
from tidegate.cli.procs import stop_recorded
from tidegate.clients.loadgen import KafkaLoad

__all__ = ["Step", "main", "summary"]


@dataclass(frozen=True)
class Step:
    rate: float
    p50_ms: float
    p99_ms: float
    lost: int
    cpu_ms: float
    """CPU per request over every counted process, the broker's included."""


def summary(steps: list[Step]) -> list[str]:
    """One line per rate: every step's p99 in order, their median, and the CPU per request."""
    lines = []
    for rate in sorted({s.rate for s in steps}):
        mine = [s for s in steps if s.rate == rate]
        p99 = [s.p99_ms for s in mine]
        lost = sum(s.lost for s in mine)
        lines.append(
            f"{rate:>6,.0f}/s  p99 {', '.join(f'{p:.1f}' for p in p99)} ms"
            f" (median {statistics.median(p99):.1f})"
            f"  p50 median {statistics.median(s.p50_ms for s in mine):.1f} ms"
            f"  cpu ms/req median {statistics.median(s.cpu_ms for s in mine):.3f}"
            f"  lost {lost}"
        )
    return lines


def run(rates: list[float], rounds: int) -> list[Step]:
    versus.serve_examples()
    stop_recorded(versus.RUN_DIR)
    steps: list[Step] = []
    with versus.controller() as ctl, versus.tidegate_workers() as workers:
        cpu = versus.tidegate_cpu(workers, ctl)
        broker = versus.BROKER()
        load = KafkaLoad()
        load.start(lambda i: fraud_record(i, unique("warm")))
        with load:
            for _ in range(rounds):
                for rate in rates:
                    load.run(
                        "warm-up",
                        lambda i: fraud_record(i, unique("w")),
                        rate=rate,
                        count=versus.warmed(rate),
                    )
                    before = {name: read() for name, read in cpu.items()}
                    asked = broker.read()
                    result = kafka_attempt(load, "fraud", unique("s"), rate)
                    calls = max(result.sent, 1)
                    used = {n: 1000 * (read() - before[n]) / calls for n, read in cpu.items()}
                    requests = broker.per_call(asked, broker.read(), calls)
                    step = Step(
                        rate, result.p(0.5), result.p(0.99), result.lost, sum(used.values())
                    )
                    steps.append(step)
                    print(
                        f"  {rate:>6,.0f}/s  p50 {step.p50_ms:6.1f}  p90 {result.p(0.9):6.1f}"
                        f"  p99 {step.p99_ms:6.1f} ms  lost {step.lost}"
                        f"  batch {result.mean_batch:4.1f}  cpu ms/req: "
                        + "  ".join(f"{n} {ms:.3f}" for n, ms in used.items())
                        + "  broker requests/call: "
                        + "  ".join(f"{api} {n:.2f}" for api, n in requests.items()),
                        flush=True,
                    )
    return steps


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(prog="python -m tests.bench.kafka_steps")
    parser.add_argument("--rates", default="1500,2000", help="requests/s, comma-separated")
    parser.add_argument("--rounds", type=int, default=2)
    args = parser.parse_args(argv)
    steps = run([float(r) for r in args.rates.split(",")], args.rounds)
    print("\nkafka steps: each rate's steps, in order")
    for line in summary(steps):
        print("  " + line)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
