"""The loop a user writes with confluent-kafka instead of tidegate: poll a batch, decode JSON, run
one onnxruntime batch over it, produce one JSON result per request, commit.

The client options are tidegate's own (`tidegate.core.kafka`), written out here so that the
process depends on confluent-kafka, onnxruntime and numpy only and the comparison measures the
processing, not different transport settings. Offsets are committed without waiting for the
results' delivery: at-least-once only as long as nothing crashes, as such loops usually are.

Run: `python -m tests.bench.peers.naive --bootstrap B --source T --sink T --group G --model M`.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import sys
from types import FrameType

import numpy as np
import onnxruntime as ort
from confluent_kafka import Consumer, Producer

__all__ = ["main"]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--bootstrap", required=True)
    parser.add_argument("--source", required=True)
    parser.add_argument("--sink", required=True)
    parser.add_argument("--group", required=True)
    parser.add_argument("--model", required=True, help="path of the fraud ONNX graph")
    # consume(n, timeout) returns early only when n messages are there, so below n per poll this
    # window is added to every request's latency.
    parser.add_argument("--timeout", type=float, default=0.01, help="consume() window, seconds")
    args = parser.parse_args(argv)

    options = ort.SessionOptions()
    # One thread, as a tidegate worker's session has: two of these share the machine's cores.
    options.intra_op_num_threads = 1
    options.inter_op_num_threads = 1
    session = ort.InferenceSession(args.model, options, providers=["CPUExecutionProvider"])
    # Nagle's algorithm would hold small records back for the peer's delayed ACK.
    common = {"bootstrap.servers": args.bootstrap, "socket.nagle.disable": True}
    consumer = Consumer(
        {**common, "group.id": args.group, "enable.auto.commit": False,
         "auto.offset.reset": "earliest"}
    )  # fmt: skip
    producer = Producer(
        {**common, "enable.idempotence": True, "acks": "all", "linger.ms": 2,
         "compression.type": "lz4"}
    )  # fmt: skip

    stopping = False

    def stop(_signum: int, _frame: FrameType | None) -> None:
        nonlocal stopping
        stopping = True

    signal.signal(signal.SIGTERM, stop)
    signal.signal(signal.SIGINT, stop)
    parent = os.getppid()
    consumer.subscribe([args.source])
    # A benchmark killed outright must not leave this loop consuming: once the parent is gone the
    # process is reparented, and getppid() tells.
    while not stopping and os.getppid() == parent:
        requests = [
            (m.key(), json.loads(value))
            for m in consumer.consume(500, args.timeout)
            if not m.error() and (value := m.value()) is not None
        ]
        if not requests:
            producer.poll(0)
            continue
        rows = np.asarray([r["features"] for _, r in requests], dtype=np.float32)
        (probabilities,) = session.run(None, {"features": rows})
        for (key, request), row in zip(requests, probabilities.tolist(), strict=True):
            result = {"request_id": request["request_id"], "probabilities": row,
                      "batch_size": len(requests)}  # fmt: skip
            producer.produce(args.sink, key=key, value=json.dumps(result))
        producer.poll(0)
        consumer.commit(asynchronous=True)
    consumer.close()
    producer.flush(10)
    return 0


if __name__ == "__main__":
    sys.exit(main())
