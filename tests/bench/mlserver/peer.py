"""MLServer as a peer of tidegate's HTTP path: the same fraud v1 ONNX model behind MLServer's V2
REST API, with adaptive batching, in a venv of its own (MLServer pins `fastapi<0.116`, which the
project cannot share).

`start(parallel_workers, port)` builds what it needs and returns a running server; `stop()` ends it
and everything it spawned. `python -m tests.bench.mlserver.peer` compares `parallel_workers` 0, 1
and 2 at a few open-loop rates.
"""

from __future__ import annotations

import asyncio
import fcntl
import json
import os
import shutil
import signal
import subprocess
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from importlib import metadata
from pathlib import Path
from typing import IO, Any

import httpx

from tidegate.cli.demo import fraud_body
from tidegate.clients.loadgen import LoadResult, http_load

__all__ = [
    "MLSERVER_VERSION",
    "MLServerPeer",
    "ensure_venv",
    "fraud_onnx_path",
    "mlserver_body",
    "start",
    "write_model_repo",
]

BENCH_DIR = Path("var/bench")
VENV = BENCH_DIR / "venvs" / "mlserver"
MLSERVER_VERSION = "1.7.1"
RUN_DIR = BENCH_DIR / "mlserver"
MODEL = "fraud"
RUNTIME_MODULE = Path(__file__).with_name("fraud_runtime.py")


def _log_tail(path: Path, lines: int = 40) -> str:
    try:
        return "\n".join(path.read_text(errors="replace").splitlines()[-lines:])
    except OSError:
        return "(no log)"


def _wanted() -> list[str]:
    # onnxruntime and numpy at the project's own versions, so both sides run the same kernels.
    return [
        f"mlserver=={MLSERVER_VERSION}",
        # uvloop 0.22 and later crash MLServer's parallel workers at start ("There is no current
        # event loop").
        "uvloop<0.22",
        f"onnxruntime=={metadata.version('onnxruntime')}",
        f"numpy=={metadata.version('numpy')}",
    ]


def _served_mlserver() -> str:
    """`MLSERVER_VERSION` if the index serves it, else the newest 1.7.x it serves."""
    try:
        out = subprocess.run(
            [sys.executable, "-m", "pip", "index", "versions", "mlserver"],
            capture_output=True,
            text=True,
            timeout=120,
            check=True,
        ).stdout
    except (subprocess.SubprocessError, OSError):
        # Without an answer let pip install decide: it may still reach a cache or a mirror.
        return MLSERVER_VERSION
    served: list[str] = []
    for line in out.splitlines():
        if line.startswith("Available versions:"):
            served = [v.strip() for v in line.split(":", 1)[1].split(",")]
    if MLSERVER_VERSION in served:
        return MLSERVER_VERSION
    minor = [v for v in served if v.startswith("1.7.") and v.replace(".", "").isdigit()]
    if not minor:
        raise RuntimeError(f"the package index serves no mlserver 1.7.x (it serves {served})")
    newest = max(minor, key=lambda v: tuple(int(p) for p in v.split(".")))
    print(f"mlserver {MLSERVER_VERSION} is not served; using {newest}", file=sys.stderr)
    return newest


def ensure_venv() -> Path:
    """The MLServer venv, built on first use and rebuilt only when the pins change."""
    VENV.parent.mkdir(parents=True, exist_ok=True)
    stamp = VENV / "tidegate-stamp.json"
    wanted = _wanted()
    key = {"wanted": wanted, "python": list(sys.version_info[:2])}
    # Two benchmark processes building at once would each delete the other's half-built venv.
    with (VENV.parent / "mlserver.lock").open("w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if stamp.exists() and json.loads(stamp.read_text()).get("key") == key:
            return VENV.absolute()
        version = _served_mlserver()
        pins = [f"mlserver=={version}", *wanted[1:]]
        shutil.rmtree(VENV, ignore_errors=True)
        log_path = BENCH_DIR / "mlserver-venv.log"
        with log_path.open("w") as log:
            steps = [
                ([sys.executable, "-m", "venv", str(VENV)], 120),
                ([str(VENV / "bin/python"), "-m", "pip", "install", "-q", "-U", "pip"], 300),
                ([str(VENV / "bin/python"), "-m", "pip", "install", *pins], 1200),
            ]
            for cmd, timeout in steps:
                try:
                    subprocess.run(
                        cmd, stdout=log, stderr=subprocess.STDOUT, timeout=timeout, check=True
                    )
                except subprocess.SubprocessError as exc:
                    raise RuntimeError(
                        f"building {VENV} failed ({exc}); {log_path}:\n{_log_tail(log_path)}"
                    ) from exc
        # Written last: a build that failed half way has no stamp and is redone.
        stamp.write_text(json.dumps({"key": key, "installed": pins}, indent=2))
    return VENV.absolute()


def fraud_onnx_path() -> Path:
    """The fraud v1 ONNX file tidegate's workers serve (built by `make models`)."""
    from tidegate.models.model_settings import ModelSettings
    from tidegate.models.store import LocalArtifactStore

    package = asyncio.run(LocalArtifactStore(ModelSettings()).fetch(MODEL, "1"))
    return package.path(package.manifest.entrypoint).absolute()


def write_model_repo(
    root: Path,
    onnx_path: Path,
    *,
    parallel_workers: int,
    port: int | None = None,
    max_batch_size: int = 32,
    max_batch_time: float = 0.005,
) -> Path:
    """An MLServer model repository at `root` serving `onnx_path` as model `fraud`, its HTTP port
    `port` (a free one when None; settings.json names it). Returns `root`."""
    from tests.support import free_port

    if root.exists():
        shutil.rmtree(root)
    model_dir = root / MODEL
    model_dir.mkdir(parents=True)
    settings = {
        # The default, debug on, writes an access-log line per request.
        "debug": False,
        "host": "127.0.0.1",
        "http_port": port or free_port(),
        # gRPC cannot be switched off; a free port keeps it from colliding with anything.
        "grpc_port": free_port(),
        # Off: the peer at its fastest (the Prometheus middleware costs per request).
        "metrics_endpoint": None,
        "parallel_workers": parallel_workers,
        "load_models_at_startup": True,
        "environments_dir": str((root / ".envs").absolute()),
        "metrics_dir": str((root / ".metrics").absolute()),
    }
    model_settings = {
        "name": MODEL,
        "implementation": "fraud_runtime.FraudOnnx",
        "max_batch_size": max_batch_size,
        "max_batch_time": max_batch_time,
        "inputs": [{"name": "features", "datatype": "FP32", "shape": [-1, 64]}],
        "outputs": [{"name": "probabilities", "datatype": "FP32", "shape": [-1, 2]}],
        "parameters": {"uri": str(onnx_path.absolute()), "version": "1"},
    }
    (root / "settings.json").write_text(json.dumps(settings, indent=2))
    (model_dir / "model-settings.json").write_text(json.dumps(model_settings, indent=2))
    # MLServer puts the model folder on sys.path (in each parallel worker too) to import it.
    shutil.copyfile(RUNTIME_MODULE, model_dir / "fraud_runtime.py")
    return root


def _group_cpu_and_pids(pgid: int) -> tuple[float, list[int]]:
    """CPU seconds used so far by the live processes of group `pgid`, and their pids (zombies
    excluded: they hold no CPU and cannot be signalled away)."""
    tick = os.sysconf("SC_CLK_TCK")
    total, pids = 0.0, []
    for entry in os.scandir("/proc"):
        if not entry.name.isdigit():
            continue
        try:
            raw = Path(entry.path, "stat").read_text()
        except OSError:
            continue
        # Fields after the command, which may itself hold spaces and parentheses.
        fields = raw[raw.rindex(")") + 2 :].split()
        if int(fields[2]) != pgid or fields[0] in "ZX":
            continue
        pids.append(int(entry.name))
        total += (int(fields[11]) + int(fields[12])) / tick
    return total, pids


def _end_group(pgid: int, reap: Callable[[], object], grace_s: float) -> list[int]:
    """SIGTERM to group `pgid`, SIGKILL to what is left after `grace_s`; the pids still alive."""
    for sig, bound in ((signal.SIGTERM, grace_s), (signal.SIGKILL, 5.0)):
        if not _group_cpu_and_pids(pgid)[1]:
            break
        try:
            os.killpg(pgid, sig)
        except ProcessLookupError:
            break
        deadline = time.monotonic() + bound
        while time.monotonic() < deadline:
            reap()
            if not _group_cpu_and_pids(pgid)[1]:
                break
            time.sleep(0.1)
    reap()
    return _group_cpu_and_pids(pgid)[1]


@dataclass
class MLServerPeer:
    """A running `mlserver start`, the leader of its own process group."""

    url: str
    parallel_workers: int
    process: subprocess.Popen[bytes]
    log_path: Path
    repo: Path
    pidfile: Path
    _log: IO[bytes] | None = field(default=None, repr=False)

    def cpu_seconds(self) -> float:
        """CPU time used so far by MLServer and its workers (reaped children not counted)."""
        return _group_cpu_and_pids(self.process.pid)[0]

    def stop(self, grace_s: float = 15.0) -> None:
        """Ends the server and everything in its process group: SIGTERM, SIGKILL after `grace_s`."""
        # poll() reaps the leader, which would otherwise stay a zombie until we exit.
        left = _end_group(self.process.pid, self.process.poll, grace_s)
        # Derived from the settings alone, and one per port: kept, they would pile up.
        shutil.rmtree(self.repo, ignore_errors=True)
        if self._log is not None:
            self._log.close()
            self._log = None
        if left:
            raise RuntimeError(f"MLServer processes {left} survived SIGKILL")
        self.pidfile.unlink(missing_ok=True)

    def __enter__(self) -> MLServerPeer:
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()


def _stop_stale() -> None:
    """Stops servers whose benchmark died before their stop() ran (`stop_recorded` in
    pipeline.py knows only tidegate's own processes). Servers of a live benchmark, this one
    included, are left running: it may compare two side by side."""
    server = str(VENV.absolute() / "bin" / "mlserver").encode()
    for pidfile in RUN_DIR.glob("*.pid"):
        try:
            pid, owner = (int(n) for n in pidfile.read_text().split())
            cmdline = Path(f"/proc/{pid}/cmdline").read_bytes()
        except (OSError, ValueError):
            cmdline, owner = b"", 0
        if owner and Path(f"/proc/{owner}").exists():
            continue
        # A pid since reused by someone else's process is left alone.
        if server in cmdline:
            # Not our child: init reaps it.
            left = _end_group(pid, lambda: None, 15.0)
            if left:
                raise RuntimeError(f"stale MLServer processes {left} survived SIGKILL")
            shutil.rmtree(RUN_DIR / f"repo-{pidfile.stem}", ignore_errors=True)
        pidfile.unlink(missing_ok=True)


def _wait_ready(peer: MLServerPeer, timeout_s: float) -> None:
    probe = f"{peer.url}/v2/models/{MODEL}/ready"
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if peer.process.poll() is not None:
            raise RuntimeError(
                f"MLServer exited with {peer.process.returncode} before it was ready; "
                f"{peer.log_path}:\n{_log_tail(peer.log_path)}"
            )
        try:
            if httpx.get(probe, timeout=1.0).status_code == 200:
                return
        except httpx.HTTPError:
            pass  # not listening yet
        time.sleep(0.2)
    raise RuntimeError(
        f"MLServer was not ready within {timeout_s:.0f}s; {peer.log_path}:\n"
        f"{_log_tail(peer.log_path)}"
    )


def start(
    parallel_workers: int,
    port: int,
    *,
    max_batch_size: int = 32,
    max_batch_time: float = 0.005,
    ready_timeout_s: float = 120.0,
) -> MLServerPeer:
    """MLServer serving fraud v1 on 127.0.0.1:`port`, ready for traffic."""
    venv = ensure_venv()
    repo = write_model_repo(
        (RUN_DIR / f"repo-{port}").absolute(),
        fraud_onnx_path(),
        parallel_workers=parallel_workers,
        port=port,
        max_batch_size=max_batch_size,
        max_batch_time=max_batch_time,
    )
    _stop_stale()
    log_path = BENCH_DIR / f"mlserver-w{parallel_workers}.log"
    # Only the peer's venv: the project's PYTHONPATH or MLSERVER_* settings would change what runs.
    env = {
        k: v
        for k, v in os.environ.items()
        if k not in ("PYTHONPATH", "PYTHONHOME", "VIRTUAL_ENV") and not k.startswith("MLSERVER_")
    }
    env["PATH"] = f"{venv / 'bin'}{os.pathsep}{env.get('PATH', '')}"
    env["VIRTUAL_ENV"] = str(venv)
    env["PYTHONUNBUFFERED"] = "1"
    log = log_path.open("wb")
    process = subprocess.Popen(
        [str(venv / "bin" / "mlserver"), "start", str(repo)],
        cwd=repo,
        env=env,
        stdin=subprocess.DEVNULL,
        stdout=log,
        stderr=subprocess.STDOUT,
        # Its own group, so stop() reaches the parallel workers it spawns too.
        start_new_session=True,
    )
    pidfile = RUN_DIR / f"{port}.pid"
    pidfile.write_text(f"{process.pid} {os.getpid()}")
    peer = MLServerPeer(
        f"http://127.0.0.1:{port}", parallel_workers, process, log_path, repo, pidfile, log
    )
    try:
        _wait_ready(peer, ready_timeout_s)
    except BaseException:
        peer.stop()
        raise
    return peer


def mlserver_body(i: int) -> dict[str, Any]:
    """Request i for MLServer: tidegate's `fraud_body` is plain V2 JSON (`inputs` with name, shape,
    datatype, data), which MLServer takes as it is, so both servers get the same 64 features."""
    return fraud_body(i)


def _machine_busy_s() -> float:
    """CPU seconds all cores spent busy since boot: a step that saw the cores busy with something
    else measured the machine, not the contender."""
    user, nice, system, _idle, _iowait, irq, softirq = (
        int(n) for n in Path("/proc/stat").read_text().split("\n", 1)[0].split()[1:8]
    )
    return (user + nice + system + irq + softirq) / os.sysconf("SC_CLK_TCK")


def _self_check(rounds: int = 2) -> int:
    """parallel_workers 0, 1 and 2 served side by side (an idle server costs next to nothing) and
    loaded in alternating rounds, each (workers, rate) keeping its best round by p99: the machine
    is shared, and whatever else runs would otherwise land on one contender only."""
    from contextlib import ExitStack

    from tests.support import free_port

    rates, step_s, bar_ms, contenders = (250, 500, 1000), 5.0, 100.0, (0, 1, 2)
    venv = ensure_venv()
    installed = json.loads((venv / "tidegate-stamp.json").read_text())["installed"]
    print(f"MLServer peer self-check; venv {venv}: {' '.join(installed)}")
    best: dict[tuple[int, int], tuple[LoadResult, str]] = {}
    with ExitStack() as stack:
        peers = {w: stack.enter_context(start(w, free_port())) for w in contenders}
        urls = {w: f"{peer.url}/v2/models/{MODEL}/infer" for w, peer in peers.items()}
        for url in urls.values():
            # Uncounted: the first requests pay for connections and onnxruntime's first runs.
            asyncio.run(http_load("warm-up", url, mlserver_body, rate=200.0, count=200))
        for round_ in range(rounds):
            for rate in rates:
                # Rotated, so no contender always runs first (or right after the heaviest).
                order = contenders[round_ % 3 :] + contenders[: round_ % 3]
                for workers in order:
                    peer = peers[workers]
                    server0, client0 = peer.cpu_seconds(), time.process_time()
                    busy0 = _machine_busy_s()
                    result = asyncio.run(
                        http_load(
                            f"mlserver w{workers}",
                            urls[workers],
                            mlserver_body,
                            rate=rate,
                            count=int(rate * step_s),
                        )
                    )
                    client_s = time.process_time() - client0
                    server_s = peer.cpu_seconds() - server0
                    busy = (_machine_busy_s() - busy0) / result.elapsed_s
                    line = (
                        f"p50 {result.p(0.5):7.1f} ms  p99 {result.p(0.99):7.1f} ms  "
                        f"req/s {result.throughput:5.0f}  lost {result.lost}  "
                        f"errors {result.errors}  CPU ms/req: server "
                        f"{server_s * 1000 / max(1, result.ok):4.2f}  client "
                        f"{client_s * 1000 / max(1, result.sent):4.2f}  "
                        f"machine busy {busy:4.2f} of {os.cpu_count()} cores"
                    )
                    if result.errors:
                        line += f"  {result.statuses}"
                    print(f"  round {round_ + 1}  parallel_workers {workers}  {rate:>5}/s  {line}")
                    kept = best.get((workers, rate))
                    if kept is None or _rank(result) < _rank(kept[0]):
                        best[(workers, rate)] = (result, line)
    print(f"best of {rounds} rounds:")
    for workers in contenders:
        top, sustained = 0, True
        for rate in rates:
            result, line = best[(workers, rate)]
            sustained = sustained and not result.lost and not result.errors
            sustained = sustained and result.p(0.99) <= bar_ms
            top = rate if sustained else top
            print(f"  parallel_workers {workers}  {rate:>5}/s  {line}")
        print(f"  parallel_workers {workers}: highest rate with p99 <= {bar_ms:.0f} ms: {top}/s")
    return 0


def _rank(result: LoadResult) -> tuple[int, float]:
    return (result.lost + result.errors, result.p(0.99))


if __name__ == "__main__":
    # An optional argument: the number of rounds.
    sys.exit(_self_check(*(int(a) for a in sys.argv[1:2])))
