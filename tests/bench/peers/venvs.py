"""Isolated virtual environments for peers whose pins may clash with the project's own."""

from __future__ import annotations

import subprocess
from pathlib import Path

__all__ = ["QUIX_REQUIREMENTS", "quix_python"]

# 3.28 is the release the facts were gathered with; `pip index versions quixstreams` lists 3.28.1.
QUIX_REQUIREMENTS = ("quixstreams==3.28.*", "onnxruntime", "numpy")


def quix_python(root: Path = Path("var/bench/venvs/quix")) -> Path:
    """The python of a venv at ROOT with quixstreams installed, built on the first call.

    A stamp holding the requirements marks a finished install, so an install cut short is redone
    rather than trusted, and a change of the requirements rebuilds it.
    """
    python = root / "bin" / "python"
    stamp = root / "tidegate-requirements.txt"
    wanted = "\n".join(QUIX_REQUIREMENTS) + "\n"
    if python.exists() and stamp.exists() and stamp.read_text() == wanted:
        return python
    if not python.exists():
        root.parent.mkdir(parents=True, exist_ok=True)
        subprocess.run(["python3.11", "-m", "venv", str(root)], check=True, timeout=300)
    pip = [str(python), "-m", "pip", "install", "-q", "--disable-pip-version-check"]
    subprocess.run([*pip, *QUIX_REQUIREMENTS], check=True, timeout=900)
    stamp.write_text(wanted)
    return python
