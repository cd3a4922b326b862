"""CPU and process trees read from /proc, for the bench parts that count every process's CPU."""

from __future__ import annotations

import os
from pathlib import Path

__all__ = ["cpu_seconds", "pid_file", "process_tree"]

_TICK = os.sysconf("SC_CLK_TCK")


def process_tree(pid: int | None) -> list[int]:
    """`pid` and every process below it (PostgreSQL's backends come and go with connections)."""
    if pid is None:
        return []
    children: dict[int, list[int]] = {}
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            fields = stat.read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue
        children.setdefault(int(fields[1]), []).append(int(stat.parent.name))
    found, todo, seen = [], [pid], set()
    while todo:
        current = todo.pop()
        if current in seen:  # a pid reused while /proc was read could close a loop
            continue
        seen.add(current)
        found.append(current)
        todo.extend(children.get(current, ()))
    return found


def pid_file(name: str) -> int | None:
    try:
        return int(Path(f"var/run/{name}.pid").read_text().split()[0])
    except (OSError, ValueError, IndexError):
        return None


def cpu_seconds(pids: list[int]) -> float:
    """utime + stime of the processes, their threads included, from /proc."""
    total = 0
    for pid in pids:
        try:
            fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue
        total += int(fields[11]) + int(fields[12])
    return total / _TICK
