"""tidegate's wheel, built from a copy of the checkout as `pip wheel` builds it for a user.

A copy, so that parallel tests never share setuptools' build/ and egg-info folders in the checkout.
"""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
FOLDERS: tuple[str, ...] = ("core", "schemas", "models", "clients", "lifecycle", "dlq")
FOLDERS += ("agents", "gateway", "examples", "cli")
PIP = (sys.executable, "-m", "pip")


def copy_checkout(dest: Path) -> Path:
    """The files a build reads: the card's folders, tidegate/ with its links, the build config."""
    for folder in FOLDERS:
        shutil.copytree(REPO / folder, dest / folder, ignore=shutil.ignore_patterns("__pycache__"))
    shutil.copytree(REPO / "tidegate", dest / "tidegate", symlinks=True)
    for name in ("pyproject.toml", "setup.py", "README.md", "LICENSE", "constraints.txt"):
        shutil.copy(REPO / name, dest / name)
    (dest / "infra").mkdir()
    shutil.copy(REPO / "infra" / "link-packages.sh", dest / "infra" / "link-packages.sh")
    return dest


def build(source: Path, out: Path) -> subprocess.CompletedProcess[str]:
    """`pip wheel` of `source` into `out`, with this venv's setuptools (no download)."""
    return subprocess.run(
        [*PIP, "wheel", "--no-deps", "--no-build-isolation", "-w", str(out), str(source)],
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )


def build_wheel(tmp: Path) -> Path:
    """The wheel of a copy of this checkout, under `tmp`."""
    source = copy_checkout(tmp / "src")
    result = build(source, tmp / "dist")
    assert result.returncode == 0, result.stdout + result.stderr
    (wheel,) = (tmp / "dist").glob("tidegate-*.whl")
    return wheel
