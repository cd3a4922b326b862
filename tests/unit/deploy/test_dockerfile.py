"""The image: what docker-compose.yml and deploy/k8s expect of the Dockerfile holds.

The image cannot be built here (no Docker engine), so the Dockerfile is read, and a real
non-editable install of the wheel shows that the controller finds its migrations there.
"""

from __future__ import annotations

import fnmatch
import json
import os
import re
import shlex
import subprocess
import sys
from pathlib import Path

import yaml

from tests.unit.deploy.deploy_support import REPO
from tests.wheel_build import PIP, build_wheel

DOCKERFILE = (REPO / "Dockerfile").read_text()


def instructions() -> list[tuple[str, str]]:
    """(INSTRUCTION, arguments), continuation lines joined, comments dropped."""
    text = re.sub(
        r"\\\n",
        " ",
        "\n".join(line for line in DOCKERFILE.splitlines() if not line.lstrip().startswith("#")),
    )
    return [
        (line.split(None, 1)[0].upper(), line.split(None, 1)[1].strip())
        for line in text.splitlines()
        if line.strip()
    ]


def run_commands() -> list[list[str]]:
    return [
        shlex.split(part)
        for name, args in instructions()
        if name == "RUN"
        for part in args.split("&&")
    ]


def created_and_owned() -> tuple[set[str], set[str]]:
    made, owned = set(), set()
    for argv in run_commands():
        if argv[:2] == ["mkdir", "-p"]:
            made.update(argv[2:])
        if argv[:2] == ["chown", "-R"] and argv[2] == "10001:10001":
            owned.update(argv[3:])
    return made, owned


def test_the_image_runs_as_10001_from_app() -> None:
    steps = instructions()
    assert ("WORKDIR", "/app") in steps
    assert ("COPY", ". .") in steps
    assert ("USER", "10001:10001") in steps
    users = [argv for argv in run_commands() if argv and argv[0] == "useradd"]
    assert len(users) == 1
    assert users[0][users[0].index("--uid") + 1] == "10001"
    assert users[0][users[0].index("--gid") + 1] == "10001"


def test_the_volumes_compose_mounts_exist_in_the_image_and_belong_to_its_user() -> None:
    """A named volume starts as a copy of the image's folder, owner included: /app/var must exist
    and be 10001's, or the model store is root's and the services cannot write it."""
    made, owned = created_and_owned()
    compose = yaml.safe_load((REPO / "docker-compose.yml").read_text())
    targets = {
        volume.split(":")[1]
        for name, service in compose["services"].items()
        if service.get("image") == "tidegate:dev"
        for volume in service.get("volumes", [])
    }
    assert targets == {"/app/var"}
    for target in targets:
        assert any(path == target or path.startswith(target + "/") for path in made), target
        assert target in owned, target
    # The store's default path (var/models, from WORKDIR /app) is under it.
    assert any(path == "/app/var/models" for path in made)


def test_the_paths_the_services_read_from_the_checkout_are_in_the_image() -> None:
    """COPY . . brings the checkout less .dockerignore: what the install reads must not be
    ignored, and the image installs every part at constraints.txt's versions."""
    ignored = [
        line.strip()
        for line in (REPO / ".dockerignore").read_text().splitlines()
        if line.strip() and not line.startswith("#")
    ]
    needed = ["core/migrations/0001_init.sql", "constraints.txt", "pyproject.toml", "setup.py"]
    for path in needed:
        assert (REPO / path).exists(), path
        parts = Path(path).parts
        prefixes = ["/".join(parts[: i + 1]) for i in range(len(parts))]
        assert not any(fnmatch.fnmatch(p, pattern) for p in prefixes for pattern in ignored), path
    assert ["pip", "install", "-c", "constraints.txt", ".[all]"] in run_commands()
    # init migrates through the installed package (registry-credentials migrates first).
    compose = yaml.safe_load((REPO / "docker-compose.yml").read_text())
    assert "tidegate stack registry-credentials" in compose["services"]["init"]["command"][0]


def test_a_non_editable_install_finds_its_migrations_in_site_packages(tmp_path: Path) -> None:
    """The image's `pip install` is not editable: the controller must find the migrations the
    wheel carries as package data, inside site-packages."""
    wheel = build_wheel(tmp_path)
    site = tmp_path / "site"
    subprocess.run(
        [*PIP, "install", "-q", "--no-deps", "--no-compile", "--target", str(site), str(wheel)],
        check=True,
        capture_output=True,
        timeout=300,
    )
    env = {**os.environ, "PYTHONPATH": str(site)}
    probe = (
        "import json; from yoyo import read_migrations;"
        "from tidegate.core.db import MIGRATIONS_DIR as d;"
        "print(d); print(json.dumps(sorted(m.id for m in read_migrations(str(d)))))"
    )
    out = subprocess.run(
        [sys.executable, "-c", probe], cwd="/", env=env, capture_output=True, text=True, timeout=60
    )
    assert out.returncode == 0, out.stderr
    where, ids = out.stdout.splitlines()
    expected = sorted(
        p.stem for p in (REPO / "core" / "migrations").glob("*.sql") if ".rollback" not in p.name
    )
    assert Path(where).is_relative_to(site)
    assert json.loads(ids) == expected
