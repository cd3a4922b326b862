"""Code and docs say what they mean, not which tracker item asked for it: "issue 12" tells a
reader nothing, and the tracker is not shipped. Upstream projects' issues (four digits and more,
such as librdkafka's) are references a reader can follow, and stay."""

from __future__ import annotations

import os
import re
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
# Our tracker's numbers are small; an upstream project's are not.
_TRACKER = re.compile(r"\b[Ii]ssues? #?\d{1,3}\b")
_SUFFIXES = (".py", ".md", ".toml", ".yml", ".yaml", ".sh", ".cfg")


# What the checkout holds that is not ours: environments, state, build output, caches.
_SKIP = {".git", ".venv", "var", "node_modules", "build", "dist", ".mypy_cache", ".ruff_cache"}


def _tracked() -> list[Path]:
    found: list[Path] = []
    for folder, dirs, files in os.walk(REPO):
        # Not followed: tidegate/'s links lead back into the same folders.
        dirs[:] = [d for d in dirs if d not in _SKIP and not d.startswith(".")]
        dirs[:] = [d for d in dirs if not Path(folder, d).is_symlink()]
        found.extend(
            Path(folder, name) for name in files if name.endswith(_SUFFIXES) or name == "Makefile"
        )
    return found


def test_no_file_names_a_tracker_issue() -> None:
    found = [
        f"{path.relative_to(REPO)}:{number}: {line.strip()}"
        for path in _tracked()
        if path != Path(__file__).resolve()  # its own examples
        for number, line in enumerate(path.read_text(errors="replace").splitlines(), 1)
        if _TRACKER.search(line)
    ]
    assert found == [], "say what the change is for instead:\n" + "\n".join(found)


def test_the_check_finds_a_tracker_number_and_leaves_upstream_ones() -> None:
    assert _TRACKER.search("as issue 12 asks")
    assert _TRACKER.search("Issues 9 and 10")
    assert not _TRACKER.search("librdkafka issues 4605 and 3663")
