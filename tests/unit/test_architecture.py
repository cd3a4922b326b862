"""The layout of docs/architecture.md holds: layers, no cycles, one namespace, unique names.

`make lint` runs import-linter on the real tree; these tests prove that the contracts bite (a
forbidden import makes the lint fail) and check what import-linter does not: every module imports
in a fresh interpreter without a bare folder name, no package cycle exists, no module name repeats
or runs past 500 lines, no module imports another package's private module, and no function body
imports one of ours except where a heavy import is deferred on purpose.
"""

from __future__ import annotations

import ast
import collections
import os
import shutil
import subprocess
import sys
import zipfile
from pathlib import Path

import grimp
import pytest

# Builds a wheel, runs lint-imports and imports every module, each in a subprocess.
pytestmark = pytest.mark.slow

REPO = Path(__file__).resolve().parents[2]
LAYERS = ["core", "schemas", "models", "clients", "lifecycle", "dlq", "agents", "gateway"]
FOLDERS = [*LAYERS, "examples", "cli"]
LINT_IMPORTS = Path(sys.executable).with_name("lint-imports")

# Function-body imports of our own modules outside the CLI, each deferring something heavy.
DEFERRED = {
    # A runtime imports its framework (torch, onnxruntime) only when a model of its kind loads.
    ("tidegate.models.runtime.loader", "tidegate.models.runtime.torch"),
    ("tidegate.models.runtime.loader", "tidegate.models.runtime.onnx"),
    # A gateway without /admin never loads the lifecycle's database code.
    ("tidegate.gateway.app", "tidegate.gateway.admin.lifecycle_api"),
    # The producer client's base install has no numpy: named arrays load it on first use.
    ("tidegate.schemas.requests", "tidegate.schemas.tensors"),
}
CLI_DEFERRED = (
    "tidegate.agents",
    "tidegate.gateway",
    "tidegate.examples",
    "tidegate.lifecycle.control",
)


def module_files() -> dict[str, Path]:
    found = {}
    for folder in FOLDERS:
        for path in sorted((REPO / folder).rglob("*.py")):
            parts = path.relative_to(REPO).with_suffix("").parts
            if parts[-1] == "__init__":
                parts = parts[:-1]
            found[".".join(("tidegate", *parts))] = path
    return found


def lint_imports(root: Path) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "PYTHONPATH": str(root)}
    return subprocess.run(
        [str(LINT_IMPORTS), "--no-cache"],
        cwd=root,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )


def copy_tree(dest: Path) -> None:
    """The package and its config, as the lint sees them: real folders and tidegate/'s links."""
    for folder in FOLDERS:
        shutil.copytree(REPO / folder, dest / folder, ignore=shutil.ignore_patterns("__pycache__"))
    shutil.copytree(REPO / "tidegate", dest / "tidegate", symlinks=True)
    shutil.copy(REPO / "pyproject.toml", dest / "pyproject.toml")


def test_the_layer_contracts_are_kept() -> None:
    result = lint_imports(REPO)
    assert result.returncode == 0, result.stdout + result.stderr
    assert "0 broken" in result.stdout


@pytest.mark.parametrize(
    ("module", "line", "contract"),
    [
        ("gateway/probe.py", "from tidegate.agents import worker", "never import each other"),
        ("agents/probe.py", "from tidegate.gateway import app", "never import each other"),
        ("core/probe.py", "from tidegate.schemas import codec", "layers below it"),
        ("schemas/probe.py", "from tidegate.lifecycle.domain import state", "layers below it"),
        ("gateway/probe.py", "from tidegate.models import store", "never from the artifact"),
        ("gateway/roundtrip/probe.py", "from tidegate.gateway.v2api import infer", "own layers"),
        ("gateway/v2api/probe.py", "from tidegate.gateway import app", "own layers"),
        ("lifecycle/domain/probe.py", "import psycopg", "do no I/O"),
        ("lifecycle/domain/probe.py", "from tidegate.lifecycle.eventstore import outbox", "own"),
        ("dlq/probe.py", "import agents", "bare name"),
    ],
)
def test_a_forbidden_import_fails_the_lint(
    tmp_path: Path, module: str, line: str, contract: str
) -> None:
    copy_tree(tmp_path)
    (tmp_path / module).write_text(f'"""A forbidden import."""\n\n{line}\n')
    result = lint_imports(tmp_path)
    assert result.returncode != 0, result.stdout
    broken = result.stdout.split("Broken contracts")[-1]
    assert contract in " ".join(broken.split()), result.stdout


def test_no_cycle_between_top_level_packages() -> None:
    graph = grimp.build_graph("tidegate")
    packages = [f"tidegate.{name}" for name in FOLDERS]
    both_ways = [
        (a, b)
        for i, a in enumerate(packages)
        for b in packages[i + 1 :]
        if graph.chain_exists(importer=a, imported=b, as_packages=True)
        and graph.chain_exists(importer=b, imported=a, as_packages=True)
    ]
    assert both_ways == []


def test_every_module_imports_under_the_namespace_alone() -> None:
    """In a fresh interpreter outside the checkout (as an installed tidegate), every module imports
    in turn and no bare folder name (`agents`, `gateway`, ...) is ever loaded."""
    names = sorted(n for n in module_files() if not n.endswith("__main__"))
    code = (
        "import importlib, sys\n"
        f"for name in {names!r}:\n"
        "    importlib.import_module(name)\n"
        f"bare = sorted(m for m in sys.modules if m.split('.')[0] in {FOLDERS!r})\n"
        "print('BARE', bare)\n"
    )
    result = subprocess.run(
        [sys.executable, "-c", code],
        cwd="/",
        capture_output=True,
        text=True,
        timeout=240,
        check=False,
    )
    assert result.returncode == 0, result.stderr[-3000:]
    assert "BARE []" in result.stdout


def test_the_pure_domains_load_no_client_library() -> None:
    """The V2 records and the lifecycle's domain do no I/O (an import-linter contract), and at
    run time importing them loads no Kafka, Avro, database or Redis client either."""
    pure = [
        n
        for n in module_files()
        if n.startswith("tidegate.lifecycle.domain")
        or n
        in {
            "tidegate.schemas.tensors",
            "tidegate.schemas.signature",
            "tidegate.schemas.v2",
            "tidegate.schemas.v2_binary",
            "tidegate.schemas.requests",
            "tidegate.schemas.version_order",
        }
    ]
    clients = ["confluent_kafka", "fastavro", "psycopg", "psycopg_pool", "redis", "httpx"]
    code = (
        "import importlib, sys\n"
        f"for name in {sorted(pure)!r}:\n"
        "    importlib.import_module(name)\n"
        f"print('LOADED', sorted(c for c in {clients!r} if c in sys.modules))\n"
    )
    result = subprocess.run(
        [sys.executable, "-c", code], cwd="/", capture_output=True, text=True, timeout=120
    )
    assert result.returncode == 0, result.stderr[-3000:]
    assert "LOADED []" in result.stdout


def test_module_names_do_not_repeat_across_packages() -> None:
    by_name: dict[str, list[str]] = collections.defaultdict(list)
    for dotted in module_files():
        last = dotted.rsplit(".", 1)[-1]
        if last not in ("__main__",) and dotted.count(".") > 1:
            by_name[last].append(dotted)
    repeated = {name: where for name, where in by_name.items() if len(where) > 1}
    assert repeated == {}


def test_no_module_imports_another_packages_private_module() -> None:
    """A `_name` module is its package's own: only modules inside that package import it."""
    graph = grimp.build_graph("tidegate")
    crossing = sorted(
        (importer, imported)
        for imported in graph.modules
        if imported.rsplit(".", 1)[-1].startswith("_")
        and not imported.rsplit(".", 1)[-1].startswith("__")
        for importer in graph.find_modules_that_directly_import(imported)
        if not importer.startswith(imported.rsplit(".", 1)[0] + ".")
    )
    assert crossing == []


# The card's bound on one module: past it, a module holds more than one thing.
MAX_MODULE_LINES = 500


def test_no_module_runs_past_the_bound() -> None:
    long = {
        dotted: lines
        for dotted, path in module_files().items()
        if (lines := len(path.read_text().splitlines())) > MAX_MODULE_LINES
    }
    assert long == {}


def function_body_imports(path: Path) -> set[str]:
    found = set()
    for fn in ast.walk(ast.parse(path.read_text())):
        if not isinstance(fn, ast.FunctionDef | ast.AsyncFunctionDef):
            continue
        for node in ast.walk(fn):
            if isinstance(node, ast.ImportFrom) and node.module:
                found.add(node.module)
            elif isinstance(node, ast.Import):
                found.update(alias.name for alias in node.names)
    return {name for name in found if name.split(".")[0] == "tidegate"}


def test_no_function_body_imports_our_modules_except_deferred_heavy_ones() -> None:
    found = set()
    for dotted, path in module_files().items():
        for imported in function_body_imports(path):
            # The CLI defers the modules that bring faust, fastapi and uvicorn, torch, or the
            # controller's clients, so that `tidegate --help` stays fast; nothing else.
            if dotted.startswith("tidegate.cli") and imported.startswith(CLI_DEFERRED):
                continue
            found.add((dotted, imported))
    assert found - DEFERRED == set()


def test_the_wheel_installs_one_top_level_package(tmp_path: Path) -> None:
    """Built as CI and the Docker image build it: real files under `tidegate/` only, so no
    `agents`, `schemas` or `gateway` lands in site-packages beside other distributions'."""
    source = tmp_path / "src"
    copy_tree(source)
    for extra in ("README.md", "LICENSE"):
        if (REPO / extra).exists():
            shutil.copy(REPO / extra, source / extra)
    subprocess.run(
        [
            sys.executable,
            "-m",
            "pip",
            "wheel",
            "-q",
            "--no-deps",
            "--no-build-isolation",
            "-w",
            str(tmp_path / "dist"),
            str(source),
        ],
        check=True,
        capture_output=True,
        timeout=300,
    )
    (wheel,) = (tmp_path / "dist").glob("tidegate-*.whl")

    with zipfile.ZipFile(wheel) as archive:
        names = archive.namelist()
        top_level = next(n for n in names if n.endswith("top_level.txt"))
        assert archive.read(top_level).decode().split() == ["tidegate"]
    tops = {name.split("/")[0] for name in names if not name.startswith("tidegate-")}
    assert tops == {"tidegate"}
    assert "tidegate/schemas/avro/dev.tidegate.inference.InferenceRequest.avsc" in names
    assert "tidegate/agents/worker.py" in names
