"""The settings classes of tidegate, found by reading its settings modules."""

from __future__ import annotations

import importlib
from pathlib import Path

from pydantic_settings import BaseSettings

import tidegate

__all__ = ["PACKAGE", "settings_classes", "settings_modules"]


PACKAGE = Path(tidegate.__file__).resolve().parent


def settings_modules() -> list[str]:
    names = []
    for path in sorted(PACKAGE.resolve().parent.glob("tidegate/*/**/*.py")):
        if "BaseSettings" not in path.read_text(errors="replace"):
            continue
        relative = path.relative_to(PACKAGE.parent).with_suffix("")
        names.append(".".join(relative.parts))
    return names


def settings_classes() -> list[type[BaseSettings]]:
    found: dict[str, type[BaseSettings]] = {}
    for name in settings_modules():
        module = importlib.import_module(name)
        for value in vars(module).values():
            if (
                isinstance(value, type)
                and issubclass(value, BaseSettings)
                and value is not BaseSettings
                and value.__module__.startswith("tidegate.")
            ):
                found[f"{value.__module__}.{value.__qualname__}"] = value
    return [found[key] for key in sorted(found)]
