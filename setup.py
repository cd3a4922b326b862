"""The build's one check (decision 007): the card's top-level folders must be reachable as
`tidegate.<folder>` through the links in tidegate/. A checkout without symlinks (a ZIP download,
`core.symlinks=false`) has plain files there instead, and setuptools would silently build a wheel
holding only `tidegate/__init__.py`. Everything else is in pyproject.toml.
"""

from pathlib import Path

from setuptools import setup

ROOT = Path(__file__).resolve().parent
FOLDERS = (
    "agents",
    "cli",
    "clients",
    "core",
    "dlq",
    "examples",
    "gateway",
    "lifecycle",
    "models",
    "schemas",
)

missing = [name for name in FOLDERS if not (ROOT / "tidegate" / name / "__init__.py").is_file()]
if missing:
    raise SystemExit(
        f"tidegate/{{{','.join(missing)}}} are not links to the top-level folders, so the wheel "
        "would be empty. This checkout was made without symlinks: run `git config core.symlinks "
        "true && git checkout -- tidegate`, or `sh infra/link-packages.sh` (docs/decisions/007)."
    )

setup()
