"""Writes docs/reference/settings.md from tidegate's settings classes (`make docs`).

Every `BaseSettings` class under `tidegate.*` becomes a section: its env prefix, the first
paragraph of its docstring, and a row per field with the variable, its type, its default and its
description, as the code declares them. tests/unit/test_settings_reference.py fails when the page
differs from what this prints, so the reference never drifts from the code.

    python infra/settings_reference.py            # print
    python infra/settings_reference.py --write    # rewrite docs/reference/settings.md
"""

from __future__ import annotations

import importlib
import json
import os
import sys
from pathlib import Path
from types import ModuleType
from typing import Any

from pydantic.fields import FieldInfo
from pydantic_core import PydanticUndefined
from pydantic_settings import BaseSettings

import tidegate

__all__ = ["PAGE", "render", "settings_classes"]

PAGE = Path(__file__).resolve().parents[1] / "docs" / "reference" / "settings.md"
_SKIP = ("tidegate.tests",)


def settings_classes() -> list[type[BaseSettings]]:
    """Every settings class defined in a `tidegate.*` module, ordered by env prefix."""
    found: dict[str, type[BaseSettings]] = {}
    # Read the sources rather than walk the packages: walking imports every package's __init__,
    # and some (the example models) import torch, which the fast tier must not pay for.
    root = Path(tidegate.__path__[0])
    for folder, _dirs, files in os.walk(root, followlinks=True):
        for file in sorted(files):
            source = Path(folder, file)
            if file.endswith(".py") and "BaseSettings" in source.read_text(errors="replace"):
                parts = source.relative_to(root).with_suffix("").parts
                name = ".".join(("tidegate", *parts)).removesuffix(".__init__")
                if not name.startswith(_SKIP):
                    _collect(importlib.import_module(name), found)
    return sorted(found.values(), key=lambda cls: (_prefix(cls), cls.__qualname__))


def _collect(module: ModuleType, found: dict[str, type[BaseSettings]]) -> None:
    for value in vars(module).values():
        if (
            isinstance(value, type)
            and issubclass(value, BaseSettings)
            and value is not BaseSettings
            and value.__module__ == module.__name__
        ):
            found[f"{value.__module__}.{value.__qualname__}"] = value


def _prefix(cls: type[BaseSettings]) -> str:
    return str(cls.model_config.get("env_prefix", ""))


def _type(annotation: Any) -> str:
    text = getattr(annotation, "__name__", None) if isinstance(annotation, type) else None
    text = text or repr(annotation)
    for noise in ("typing.", "pydantic.types.", "pathlib.", "datetime.", "<class '", "'>"):
        text = text.replace(noise, "")
    return text.replace("NoneType", "None").replace("|", "\\|")


def _default(field: FieldInfo) -> str:
    if field.default_factory is not None:
        value: Any = field.default_factory()  # type: ignore[call-arg]
        if isinstance(value, str | int | float):
            return "computed"  # per host or process (a name, a core count): see the description
    elif field.default is PydanticUndefined:
        return "required"
    else:
        value = field.default
    if value is None:
        return "unset"
    if hasattr(value, "get_secret_value"):
        return "(secret)"
    if isinstance(value, dict | list | tuple | set | frozenset):
        text = json.dumps(value if not isinstance(value, set | frozenset) else sorted(value))
    else:
        text = str(value.value if hasattr(value, "value") else value)
    return f"`{text}`".replace("|", "\\|") if text else '`""`'


def _cell(text: str) -> str:
    return " ".join(text.split()).replace("|", "\\|")


def _section(cls: type[BaseSettings]) -> list[str]:
    prefix = _prefix(cls)
    doc = (cls.__doc__ or "").strip().split("\n\n")[0]
    lines = [
        f"## `{prefix}*`: {cls.__qualname__}",
        "",
        f"`{cls.__module__}`. {_cell(doc)}",
        "",
        "| variable | type | default | what it sets |",
        "|---|---|---|---|",
    ]
    for name, field in cls.model_fields.items():
        variable = f"{prefix}{name.upper()}"
        description = _cell(field.description or "")
        lines.append(
            f"| `{variable}` | {_type(field.annotation)} | {_default(field)} | {description} |"
        )
    return [*lines, ""]


def render() -> str:
    classes = settings_classes()
    lines = [
        "# Settings reference",
        "",
        "Every setting of every tidegate process, as an environment variable. Generated from",
        "the settings classes by `make docs` (infra/settings_reference.py); a unit test fails",
        "when this page and the code differ. A variable under a prefix that names no field is",
        'refused at start (`extra="forbid"`). Secrets (`SecretStr`) are never logged or shown.',
        "",
        *(f"- [`{_prefix(c)}*`](#{_anchor(c)}): {c.__qualname__}" for c in classes),
        "",
    ]
    for cls in classes:
        lines += _section(cls)
    return "\n".join(lines)


def _anchor(cls: type[BaseSettings]) -> str:
    title = f"{_prefix(cls)}*: {cls.__qualname__}"
    return "".join(ch for ch in title.lower() if ch.isalnum() or ch in "-_ ").replace(" ", "-")


def main(argv: list[str]) -> int:
    text = render()
    if argv[:1] == ["--write"]:
        PAGE.parent.mkdir(parents=True, exist_ok=True)
        PAGE.write_text(text)
        print(f"wrote {PAGE}")
    else:
        print(text, end="")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
