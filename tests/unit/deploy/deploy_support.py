"""Helpers of the deployment tests: the tools they run, the settings and metric names of the code.

The tools (kubeconform, promtool, the schemas under var/schemas) are installed by `make setup`
(infra/deploy-tools.sh and infra/install-system.sh). Where one is missing, a test fails with the
command that installs it when the environment variable CI is set, and is skipped with that reason
otherwise, so a developer without them can still run the rest of the unit tests.
"""

from __future__ import annotations

import ast
import importlib
import json
import os
import re
import shutil
from collections.abc import Iterable, Mapping
from functools import cache
from pathlib import Path
from typing import Any

import pytest
from pydantic import SecretStr
from pydantic_settings import BaseSettings

from tests.support import settings_reference

REPO = Path(__file__).resolve().parents[3]
VAR_BIN = REPO / "var" / "bin"
SCHEMAS = REPO / "var" / "schemas"
PACKAGES = ["core", "schemas", "models", "clients", "lifecycle", "dlq", "agents", "gateway", "cli"]

__all__ = [
    "PACKAGES",
    "REPO",
    "SCHEMAS",
    "check_settings",
    "metric_names",
    "promql_metrics",
    "require",
    "schema_manifest",
    "settings_classes",
]


def require(tool: str, installed_by: str) -> str:
    """The path of `tool` (a file under the repo, or a command on PATH), or fail/skip."""
    candidate = REPO / tool
    found = str(candidate) if candidate.exists() else shutil.which(tool)
    if found:
        return found
    message = f"{tool} is missing; {installed_by} installs it"
    if os.environ.get("CI"):
        pytest.fail(message)
    pytest.skip(message)


def schema_manifest() -> dict[str, Any]:
    """What infra/deploy-tools.sh built into var/schemas (and kubeconform beside it)."""
    require("var/bin/kubeconform", "`make setup` (infra/deploy-tools.sh)")
    path = Path(require("var/schemas/manifest.json", "`make setup` (infra/deploy-tools.sh)"))
    manifest: dict[str, Any] = json.loads(path.read_text())
    return manifest


# --- settings ------------------------------------------------------------------------------------


@cache
def settings_classes() -> dict[str, type[BaseSettings]]:
    """Every settings class of the code by its env prefix (as infra/settings_reference.py finds
    them)."""
    classes: list[type[BaseSettings]] = settings_reference().settings_classes()
    return {str(cls.model_config.get("env_prefix", "")): cls for cls in classes}


def _owner(variable: str) -> tuple[str, type[BaseSettings]] | None:
    """The settings class whose prefix `variable` has (the longest prefix wins)."""
    matches = [(p, c) for p, c in settings_classes().items() if p and variable.startswith(p)]
    return max(matches, key=lambda m: len(m[0])) if matches else None


def check_settings(
    env: Mapping[str, str], *, passthrough: Iterable[str] = ()
) -> dict[str, BaseSettings]:
    """Checks that every TIDEGATE_* variable of `env` names a field of a settings class and that
    every class loads from `env`; returns the loaded settings by prefix.

    pydantic-settings ignores a variable under a prefix that names no field, so a misspelt one
    would be silently dropped: this is the check that catches it. Variables in `passthrough` are
    read by something else (libpq's PGSSLMODE).
    """
    unknown = []
    for variable in env:
        if variable in passthrough:
            continue
        owner = _owner(variable)
        field = variable[len(owner[0]) :].lower() if owner else None
        if owner is None or field not in owner[1].model_fields:
            unknown.append(variable)
    assert not unknown, f"not a setting of any settings class: {sorted(unknown)}"
    loaded = {}
    with pytest.MonkeyPatch.context() as patch:
        for variable in list(os.environ):
            if variable.startswith("TIDEGATE_"):
                patch.delenv(variable)
        for variable, value in env.items():
            patch.setenv(variable, str(value))
        for prefix, cls in settings_classes().items():
            loaded[prefix] = cls()
    return loaded


def secret_fields() -> set[str]:
    """The variables of every SecretStr field (which belong in a Secret, never a ConfigMap)."""
    names = set()
    for prefix, cls in settings_classes().items():
        for name, info in cls.model_fields.items():
            if "SecretStr" in repr(info.annotation) or info.annotation is SecretStr:
                names.add(f"{prefix}{name.upper()}")
    return names


# --- metrics -------------------------------------------------------------------------------------

_METRIC_CLASSES = {"Counter", "Gauge", "Histogram", "Summary", "Info", "Enum"}
_SUFFIXES = {
    "counter": ("_total", "_created"),
    "gauge": ("",),
    "histogram": ("_bucket", "_count", "_sum", "_created"),
    "gaugehistogram": ("_bucket", "_gcount", "_gsum"),
    "summary": ("", "_count", "_sum", "_created"),
    "info": ("_info",),
    "stateset": ("",),
    "unknown": ("",),
}


def _defines_metrics(path: Path) -> bool:
    """Whether the module builds a prometheus_client metric at module level."""
    tree = ast.parse(path.read_text())
    imported = {
        alias.asname or alias.name
        for node in tree.body
        if isinstance(node, ast.ImportFrom) and node.module == "prometheus_client"
        for alias in node.names
        if alias.name in _METRIC_CLASSES
    }
    return any(
        isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and node.func.id in imported
        for statement in tree.body
        for node in ast.walk(statement)
        if not isinstance(statement, ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef)
    )


@cache
def metric_modules() -> tuple[str, ...]:
    return tuple(
        "tidegate." + path.relative_to(REPO).with_suffix("").as_posix().replace("/", ".")
        for package in PACKAGES
        for path in sorted((REPO / package).rglob("*.py"))
        if _defines_metrics(path)
    )


@cache
def metric_names() -> frozenset[str]:
    """Every sample name the code's Prometheus metrics (and the default collectors) expose."""
    from prometheus_client import REGISTRY

    for module in metric_modules():
        importlib.import_module(module)
    names: set[str] = set()
    for family in REGISTRY.collect():
        names.update(s.name for s in family.samples)
        names.update(family.name + suffix for suffix in _SUFFIXES.get(family.type, ("",)))
    # Registered only on a host with GPUs (NVML), which this one is not.
    names.update(importlib.import_module("tidegate.agents.gpu_metrics").METRICS)
    return frozenset(names)


# --- PromQL --------------------------------------------------------------------------------------

_STRING = re.compile(r'"(?:\\.|[^"\\])*"|\'(?:\\.|[^\'\\])*\'|`[^`]*`')
_SELECTOR = re.compile(r"\{[^{}]*\}")
_GROUPING = re.compile(
    r"\b(?:by|without|on|ignoring|group_left|group_right)\s*\([^()]*\)", re.IGNORECASE
)
_RANGE = re.compile(r"\[[^\[\]]*\]")
_VARIABLE = re.compile(r"\$\{?\w+\}?")
_IDENTIFIER = re.compile(r"(?<![\w.:])([a-zA-Z_:][a-zA-Z0-9_:]*)(?![\w:])(?!\s*\()")
_KEYWORDS = {
    "and",
    "or",
    "unless",
    "by",
    "without",
    "on",
    "ignoring",
    "group_left",
    "group_right",
    "offset",
    "bool",
    "inf",
    "nan",
    "start",
    "end",
}


def promql_metrics(expr: str) -> set[str]:
    """The metric names an expression selects, roughly: label matchers, label lists, ranges,
    strings and Grafana variables removed, then every identifier that is not a function call or a
    keyword (`sum(...)`, `rate(...)` are calls; `x offset 5m` leaves `x`)."""
    text = _STRING.sub('""', expr)
    text = _VARIABLE.sub("5m", text)
    text = _SELECTOR.sub(" ", text)
    text = _GROUPING.sub(" ", text)
    text = _RANGE.sub(" ", text)
    return {m for m in _IDENTIFIER.findall(text) if m.lower() not in _KEYWORDS}
