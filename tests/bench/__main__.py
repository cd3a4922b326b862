"""`make bench`: benchmarks run side by side in one process, reported as ratios.

These machines are noisy, so contenders run in alternating rounds and the best round counts; only
ratios between contenders measured in the same run are meaningful. `python -m tests.bench codec`
(or `relay`, `pipeline`, `lifecycle`, `versus`, `profile`, `threads`, `tracing`, `failures`,
`auth`, `takeover`, `overload`, `refusal`, `lanes`, `ratelimits`, `kafka_down`, `redrive`,
`chaos`, `security`, `pools`) runs one part.
"""

from __future__ import annotations

import sys

from tests.bench import (
    auth_cost,
    chaos,
    codec,
    failure_cost,
    faust_vs_confluent,
    kafka_down,
    lanes,
    lifecycle,
    overload,
    pipeline,
    pools,
    profile,
    rate_limit_cost,
    redrive,
    refusal_cost,
    security_cost,
    takeover,
    thread_cpu,
    tracing_cost,
    versus,
)

PARTS = {
    "codec": codec.run,
    "relay": lambda: faust_vs_confluent.main([]),
    "pipeline": pipeline.run,
    "lifecycle": lifecycle.run,
    "versus": versus.run,
    "profile": profile.run,
    "threads": thread_cpu.run,
    "tracing": tracing_cost.run,
    "failures": failure_cost.run,
    "auth": auth_cost.run,
    "takeover": takeover.run,
    "overload": overload.run,
    "refusal": refusal_cost.run,
    "lanes": lanes.run,
    "ratelimits": rate_limit_cost.run,
    "kafka_down": kafka_down.run,
    "redrive": redrive.run,
    "chaos": chaos.run,
    "security": security_cost.run,
    "pools": pools.run,
}


def main(argv: list[str]) -> int:
    for name in argv or list(PARTS):
        PARTS[name]()
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
