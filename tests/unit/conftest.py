"""The unit tests' tiers. `make test-fast` runs `-m "not slow"`: no servers, subprocesses, wheel
builds or torch, nothing `make setup` installs beyond the venv. A heavy test is marked `slow`
(`pytestmark` for a whole module) and runs in `make test`."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest
from hypothesis import settings

# Property tests: no example database in the checkout (CI starts from a clean clone each time),
# and no deadline per example (a loaded machine is not a broken property).
settings.register_profile("tidegate", database=None, deadline=None)
settings.load_profile("tidegate")

HERE = Path(__file__).resolve().parent
# Checked with the tools `make setup` installs (kubeconform, kustomize, promtool, the schemas).
DEPLOY = HERE / "deploy"
# Modules that import torch at the top: the fast tier does not even collect them, since
# importing torch alone takes seconds.
TORCH_MODULES = {HERE / "models" / "test_runtime.py", HERE / "models" / "test_device_fallback.py"}


def _fast(config: pytest.Config) -> bool:
    return "not slow" in (config.option.markexpr or "")


def pytest_ignore_collect(collection_path: Path, config: pytest.Config) -> bool | None:
    if _fast(config) and collection_path in TORCH_MODULES:
        return True
    return None


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    # Every item of the session passes through this hook: only the deploy folder's are marked.
    for item in items:
        if DEPLOY in item.path.parents:
            item.add_marker(pytest.mark.slow)


def pytest_sessionfinish(session: pytest.Session) -> None:
    # The fast tier's promise, checked: a module that imports torch must be in TORCH_MODULES.
    if _fast(session.config) and "torch" in sys.modules:
        print("\nthe fast tier imported torch: mark what does so slow", file=sys.stderr)
        session.exitstatus = pytest.ExitCode.TESTS_FAILED
