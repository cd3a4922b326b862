"""`tidegate demo`: the pipeline end to end on the local stack.

It registers the example models and promotes the served versions (`tidegate models ...`), starts
the lifecycle controller, 2 workers and 1 gateway, sends `fraud` and `minilm` traffic both through
the V2 HTTP gateway and straight into Kafka, then shows the lifecycle: fraud 2 shadowed next to
fraud 1 with the comparison, and a canary of the faulty fraud 3 rolled back by the controller on
its own. It prints a summary and stops what it started unless `--keep`. `make demo` runs the
set-up, the stack, the models and the schema registration before it. The gateway authenticates
every call: the demo issues its own `infer` and `admin` API keys and prints how to use them.
"""

from __future__ import annotations

import asyncio
import functools
import uuid
from collections.abc import Callable
from pathlib import Path
from typing import Annotated, Any

import typer

from tidegate.agents.worker_settings import WorkerSettings
from tidegate.cli.demo_lifecycle import (
    bootstrap,
    demo_keys,
    showcase,
    wait_group_settled,
    wait_warm,
)
from tidegate.cli.procs import spawn, stop_recorded, wait_http
from tidegate.clients.loadgen import KafkaLoad, LoadResult, http_load
from tidegate.models.model_settings import ModelSettings
from tidegate.schemas.tensors import from_numpy

__all__ = ["demo", "demo_stop"]

RUN_DIR = Path("var/demo")
# The demo's worker processes, by worker id, each with its own metrics port.
WORKERS = {"demo-w1": 9101, "demo-w2": 9102}
TEXTS = [
    "A man is playing a guitar on stage.",
    "Someone performs music with a guitar in front of an audience.",
    "The stock market fell sharply on Monday.",
    "Interest rates were raised by the central bank.",
    "A cat sleeps on the warm windowsill.",
    "The kitten naps in the sunshine by the window.",
    "Fresh bread is baked every morning in the village.",
    "Our train was delayed by heavy snow.",
]


def _features(i: int) -> list[float]:
    import numpy as np

    return [float(x) for x in np.random.default_rng(i).normal(size=64).astype("float32")]


def fraud_record(i: int, run: str) -> dict[str, Any]:
    import numpy as np

    row = np.asarray([_features(i)], dtype=np.float32)
    return {
        "request_id": f"{run}-fraud-{i}",
        "model": "fraud",
        "routing_key": f"card-{i % 64}",
        "inputs": [from_numpy("features", row)],
    }


def minilm_record(i: int, run: str) -> dict[str, Any]:
    import numpy as np

    texts = np.asarray([TEXTS[i % len(TEXTS)].encode()], dtype=object)
    return {
        "request_id": f"{run}-minilm-{i}",
        "model": "minilm",
        "routing_key": f"doc-{i % 16}",
        "inputs": [from_numpy("text", texts)],
    }


def _with_run(make: Callable[[int, str], dict[str, Any]], run: str, i: int) -> dict[str, Any]:
    return make(i, run)


def fraud_body(i: int) -> dict[str, Any]:
    return {"inputs": [{"name": "features", "datatype": "FP32", "shape": [1, 64],
                        "data": _features(i)}]}  # fmt: skip


def minilm_body(i: int) -> dict[str, Any]:
    return {"inputs": [{"name": "text", "datatype": "BYTES", "shape": [1],
                        "data": [TEXTS[i % len(TEXTS)]]}]}  # fmt: skip


def demo(
    keep: Annotated[
        bool, typer.Option("--keep", help="Leave workers and gateway running.")
    ] = False,
    scale: Annotated[float, typer.Option(min=0.05, max=20, help="Multiply traffic volume.")] = 1.0,
) -> None:
    """Run the pipeline end to end and print throughput, latency, batch size and errors."""
    from rich.console import Console
    from rich.progress import Progress
    from rich.table import Table

    from tidegate.gateway.gateway_settings import GatewaySettings

    console = Console()
    stop_recorded(RUN_DIR)
    console.rule("registering the example models")
    bootstrap(ModelSettings().store_dir.parent / "packages", console)
    gw = GatewaySettings()
    base = f"http://{gw.host}:{gw.port}"
    console.rule("API keys (the gateway authenticates every call)")
    keys = demo_keys(console, base)
    infer_headers = {"Authorization": f"Bearer {keys['infer']}"}
    children = [
        spawn("controller", ["controller", "--migrate"], RUN_DIR),
        *(
            spawn(
                f"worker-{n}",
                ["worker", "--processes", "1", "--worker-id", wid, "--metrics-port", str(port)],
                RUN_DIR,
            )
            for n, (wid, port) in enumerate(WORKERS.items(), start=1)
        ),
        # As shipped: authentication on, the default admission objective.
        spawn("gateway", ["gateway"], RUN_DIR),
    ]
    results: list[LoadResult] = []
    canary: list[LoadResult] = []
    try:
        with console.status("starting the controller, 2 workers and 1 gateway, loading models"):
            for child, port in zip(children[1:3], WORKERS.values(), strict=True):
                wait_http(f"http://127.0.0.1:{port}/metrics", child, 120)
            wait_http(f"{base}/v2/health/ready", children[3], 120)
            for model in ("fraud", "minilm"):
                wait_http(f"{base}/v2/models/{model}/ready", children[3], 120, infer_headers)
                wait_warm(model, "1", set(WORKERS))
            # Ready means both workers serve: each warm, and each holding its partitions.
            wait_group_settled(WorkerSettings().group_id, members=len(WORKERS))
        run = uuid.uuid4().hex[:8]
        plan = [
            ("HTTP", "fraud", 200.0, int(1000 * scale)),
            ("Kafka", "fraud", 1000.0, int(2000 * scale)),
            ("HTTP", "minilm", 20.0, int(60 * scale)),
            ("Kafka", "minilm", 40.0, int(100 * scale)),
        ]
        kafka = KafkaLoad()
        kafka.start(functools.partial(_with_run, fraud_record, f"{run}-warm"))
        with kafka:
            with Progress(console=console) as progress:
                for path, model, rate, count in plan:
                    task = progress.add_task(f"{path:<5} {model}", total=count)

                    def advance(n: int, task: Any = task) -> None:
                        progress.advance(task, n)

                    label = f"{path} {model}"
                    if path == "HTTP":
                        body = fraud_body if model == "fraud" else minilm_body
                        url = f"{base}/v2/models/{model}/infer"
                        results.append(
                            asyncio.run(
                                http_load(
                                    label,
                                    url,
                                    body,
                                    rate=rate,
                                    count=count,
                                    progress=advance,
                                    headers=infer_headers,
                                    # As a client should: admission may shed a call when this
                                    # host stalls (docs/overload.md); it is retried, and shown.
                                    retry_shed=3,
                                )
                            )
                        )
                    else:
                        make = fraud_record if model == "fraud" else minilm_record
                        results.append(
                            kafka.run(
                                label,
                                functools.partial(_with_run, make, run),
                                rate=rate,
                                count=count,
                                progress=advance,
                            )
                        )

            def traffic(stage: str) -> Callable[[int], dict[str, Any]]:
                return functools.partial(_with_run, fraud_record, f"{run}-{stage}-{uuid.uuid4()}")

            staged = showcase(console, kafka, traffic, set(WORKERS), scale)
            results.append(staged[0])
            canary.extend(staged[1:])
    finally:
        if not keep:
            for child in children:
                child.stop()

    if canary:
        results.append(LoadResult.merged("Kafka fraud-canary", canary))
    table = Table(title="tidegate demo: 2 workers, 1 gateway, 1 controller, CPU")
    cols = ("path", "model", "sent", "ok", "errors", "lost", "shed", "req/s", "p50 ms", "p99 ms")
    for col in cols:
        table.add_column(col, justify="right" if col not in ("path", "model") else "left")
    table.add_column("mean batch", justify="right")
    for r in results:
        path, model = r.label.split()
        batch = f"{r.mean_batch:.1f}" if r.batch_sizes else "-"
        counts = [str(n) for n in (r.sent, r.ok, r.errors, r.lost, r.shed)]
        timings = [f"{r.throughput:,.0f}", f"{r.p(0.5):.1f}", f"{r.p(0.99):.1f}"]
        table.add_row(path, model, *counts, *timings, batch)
    console.print(table)
    for r in results:
        if r.shed:
            console.print(
                f"{r.label}: {r.shed} calls were shed (503, Retry-After) by admission control and "
                "sent again after Retry-After; their latency includes the wait (docs/overload.md)"
            )
            for reason, n in sorted(r.shed_reasons.items(), key=lambda kv: -kv[1]):
                console.print(f"  {n} refused: {reason}")
    if keep:
        console.print(f"Workers and gateway keep running ({base}); `make down` stops them.")
        console.print("Call it with the API keys printed above (Authorization: Bearer tg_...).")
    # The canary's errors are fraud 3's deliberate faults, which the rollback is about; a lost
    # request is a failure anywhere.
    failed = [r for r in results if r.lost or (r.errors and "canary" not in r.label)]
    if failed:
        for r in failed:
            if r.errors or r.lost:
                console.print(f"[red]{r.label}[/red]: {r.statuses}, lost {r.lost}")
        raise typer.Exit(1)


def demo_stop() -> None:
    """Stop workers and gateways that `tidegate demo --keep` left running."""

    for name in stop_recorded(RUN_DIR):
        typer.echo(f"demo: stopped {name}")
