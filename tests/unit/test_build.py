"""The build fails loudly, rather than shipping an empty wheel, in a checkout without symlinks.

tidegate/<folder> are links to the card's top-level folders (decision 007). Without symlink
support git writes each link as a small file holding its target, and setuptools would build a
wheel with `tidegate/__init__.py` alone. setup.py stops the build and says how to fix the
checkout; infra/link-packages.sh makes the links again.
"""

from __future__ import annotations

import subprocess
import zipfile
from pathlib import Path

import pytest

from tests.wheel_build import FOLDERS, build, copy_checkout

# Two wheel builds in subprocesses.
pytestmark = pytest.mark.slow


def test_a_checkout_without_symlinks_fails_the_build_and_the_script_mends_it(
    tmp_path: Path,
) -> None:
    source = copy_checkout(tmp_path / "src")
    for folder in FOLDERS:
        link = source / "tidegate" / folder
        link.unlink()
        link.write_text(f"../{folder}")  # what git writes with core.symlinks=false

    broken = build(source, tmp_path / "broken")
    assert broken.returncode != 0
    assert "made without symlinks" in broken.stdout + broken.stderr
    assert not list((tmp_path / "broken").glob("*.whl"))

    mended = subprocess.run(
        ["sh", "infra/link-packages.sh"], cwd=source, capture_output=True, text=True, timeout=60
    )
    assert mended.returncode == 0, mended.stderr
    built = build(source, tmp_path / "dist")
    assert built.returncode == 0, built.stdout + built.stderr
    (wheel,) = (tmp_path / "dist").glob("tidegate-*.whl")
    names = set(zipfile.ZipFile(wheel).namelist())
    assert {f"tidegate/{folder}/__init__.py" for folder in FOLDERS} <= names
    assert "tidegate/core/migrations/0001_init.sql" in names
