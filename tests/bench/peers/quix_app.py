"""A quixstreams app serving the fraud model, one model call per message, as its docs show.

It runs in its own venv (`tests.bench.peers.venvs.quix_python`), so it imports quixstreams,
onnxruntime, numpy and the standard library only, and is started as a script path: `-m` would
import the `tests` packages, which belong to the project's environment.

Run: `python tests/bench/peers/quix_app.py --bootstrap B --source T --sink T --group G --model M
--state-dir D`.
"""

from __future__ import annotations

import argparse
import os
import sys
import threading
import time
from typing import Any

import numpy as np
import onnxruntime as ort
from quixstreams import Application  # type: ignore[import-not-found]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--bootstrap", required=True)
    parser.add_argument("--source", required=True)
    parser.add_argument("--sink", required=True)
    parser.add_argument("--group", required=True)
    parser.add_argument("--model", required=True, help="path of the fraud ONNX graph")
    parser.add_argument("--state-dir", required=True, help="quixstreams' state directory")
    args = parser.parse_args(argv)

    options = ort.SessionOptions()
    # One thread, as a tidegate worker's session has: two of these share the machine's cores.
    options.intra_op_num_threads = 1
    options.inter_op_num_threads = 1
    session = ort.InferenceSession(args.model, options, providers=["CPUExecutionProvider"])

    def infer(request: dict[str, Any]) -> dict[str, Any]:
        rows = np.asarray([request["features"]], dtype=np.float32)
        (probabilities,) = session.run(None, {"features": rows})
        return {
            "request_id": request["request_id"],
            "probabilities": probabilities[0].tolist(),
            "batch_size": 1,
        }

    # The same client options as tidegate and the naive peer, so that only the processing differs.
    app = Application(
        broker_address=args.bootstrap,
        consumer_group=args.group,
        auto_offset_reset="earliest",
        consumer_extra_config={"socket.nagle.disable": True},
        producer_extra_config={
            "socket.nagle.disable": True,
            "enable.idempotence": True,
            "acks": "all",
            "linger.ms": 2,
            "compression.type": "lz4",
        },
        state_dir=args.state_dir,
        use_changelog_topics=False,
        loglevel="WARNING",
    )
    source = app.topic(args.source, value_deserializer="json")
    sink = app.topic(args.sink, value_serializer="json")
    app.dataframe(source).apply(infer).to_topic(sink)

    parent = os.getppid()

    def watch_parent() -> None:
        # A benchmark killed outright must not leave this app consuming.
        while os.getppid() == parent:
            time.sleep(1.0)
        app.stop()

    threading.Thread(target=watch_parent, name="watch-parent", daemon=True).start()
    app.run()
    return 0


if __name__ == "__main__":
    sys.exit(main())
