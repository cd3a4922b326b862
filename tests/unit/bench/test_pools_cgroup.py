"""The pools part's CPU limit: processes started inside `in_cgroup` run under it, and the thread
that started them leaves the group."""

from __future__ import annotations

import os
import subprocess
import uuid
from pathlib import Path

import pytest

from tests.bench.pools_load import cpu_limit, in_cgroup, remove_cgroup

_CPU = Path("/sys/fs/cgroup/cpu")

pytestmark = [
    pytest.mark.slow,
    pytest.mark.skipif(
        not (_CPU / "cgroup.procs").exists() or not os.access(_CPU, os.W_OK),
        reason="needs root and cgroup v1's cpu controller",
    ),
]


def test_a_child_started_inside_runs_under_the_limit_and_the_starter_does_not() -> None:
    name = f"tidegate-test-{uuid.uuid4().hex[:8]}"
    before = cpu_limit([os.getpid()])
    with in_cgroup(name, 0.25):
        child = subprocess.Popen(["sleep", "30"])
    try:
        assert cpu_limit([child.pid]) == "0.25"
        assert str(child.pid) in (_CPU / name / "cgroup.procs").read_text().split()
        assert cpu_limit([os.getpid()]) == before, "the starting thread stayed in the group"
    finally:
        child.kill()
        child.wait()
        remove_cgroup(name)


def test_a_shorter_period_grants_the_same_share_in_shorter_slices() -> None:
    name = f"tidegate-test-{uuid.uuid4().hex[:8]}"
    with in_cgroup(name, 0.5, period_ms=10):
        child = subprocess.Popen(["sleep", "30"])
    try:
        assert cpu_limit([child.pid]) == "0.50"
        assert (_CPU / name / "cpu.cfs_period_us").read_text().strip() == "10000"
        assert (_CPU / name / "cpu.cfs_quota_us").read_text().strip() == "5000"
    finally:
        child.kill()
        child.wait()
        remove_cgroup(name)


def test_without_a_name_nothing_is_limited() -> None:
    before = cpu_limit([os.getpid()])
    with in_cgroup(None, 0.25):
        child = subprocess.Popen(["sleep", "30"])
    try:
        assert cpu_limit([child.pid]) == before
    finally:
        child.kill()
        child.wait()


def test_the_starting_thread_leaves_the_group_when_the_start_fails() -> None:
    name = f"tidegate-test-{uuid.uuid4().hex[:8]}"
    before = cpu_limit([os.getpid()])
    try:
        with pytest.raises(FileNotFoundError), in_cgroup(name, 0.25):
            subprocess.Popen(["/nonexistent/program"])
        assert cpu_limit([os.getpid()]) == before, "a failed start left the thread limited"
    finally:
        remove_cgroup(name)
    assert not (_CPU / name).exists(), "the emptied group was not removed"


def test_no_limit_at_zero_cores() -> None:
    name = f"tidegate-test-{uuid.uuid4().hex[:8]}"
    with in_cgroup(name, 0.0):
        pass
    assert not (_CPU / name).exists(), "a group was made for no limit"
