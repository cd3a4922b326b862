"""`make bench`: benchmarks run side by side in one process, reported as ratios.

These machines are noisy, so each contender runs in alternating rounds and the best round counts;
only ratios between contenders measured in the same run are meaningful.
"""

from __future__ import annotations

import sys

from tests.bench.codec import run as run_codec


def main() -> int:
    run_codec()
    return 0


if __name__ == "__main__":
    sys.exit(main())
