"""MLServer as a benchmark peer for tidegate's HTTP path: its own venv, a model repository serving
the fraud v1 ONNX model through a custom runtime, and a server process started and stopped around a
measurement (`python -m tests.bench.mlserver.peer` runs a self-check)."""
