"""How model version names sort: by their numbers where they hold numbers, so "2" comes before "10"
and "1-torch" right after "1". The artifact store lists versions in this order, and so does the
gateway's model metadata."""

from __future__ import annotations

import re

__all__ = ["natural_key"]


def natural_key(version: str) -> list[tuple[int, int | str]]:
    return [(0, int(p)) if p.isdigit() else (1, p) for p in re.split(r"(\d+)", version) if p]
