"""The image: what docker-compose.yml and deploy/k8s expect of the Dockerfile holds.

The image cannot be built here (no Docker engine), so the Dockerfile is read, and the one step that
is code, infra/image-migrations.sh, runs against a real non-editable install of the wheel.
"""

from __future__ import annotations

import fnmatch
import json
import os
import re
import shlex
import shutil
import subprocess
import sys
from pathlib import Path

import yaml

from tests.unit.deploy.deploy_support import REPO

DOCKERFILE = (REPO / "Dockerfile").read_text()
FOLDERS = [
    "core",
    "schemas",
    "models",
    "clients",
    "lifecycle",
    "dlq",
    "agents",
    "gateway",
    "examples",
    "cli",
]


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
    """COPY . . brings the checkout less .dockerignore: the migrations the init service applies and
    the script the build runs must not be ignored."""
    ignored = [
        line.strip()
        for line in (REPO / ".dockerignore").read_text().splitlines()
        if line.strip() and not line.startswith("#")
    ]
    needed = ["infra/migrations/0001_init.sql", "infra/image-migrations.sh", "pyproject.toml"]
    compose = yaml.safe_load((REPO / "docker-compose.yml").read_text())
    assert "infra/migrations" in compose["services"]["init"]["command"][0]
    for path in needed:
        assert (REPO / path).exists(), path
        parts = Path(path).parts
        prefixes = ["/".join(parts[: i + 1]) for i in range(len(parts))]
        assert not any(fnmatch.fnmatch(p, pattern) for p in prefixes for pattern in ignored), path
    assert ["sh", "infra/image-migrations.sh"] in run_commands()


def _installed_copy(tmp_path: Path) -> Path:
    """tidegate installed from its wheel into a folder of its own, as `pip install .` does."""
    source = tmp_path / "src"
    for folder in FOLDERS:
        shutil.copytree(
            REPO / folder, source / folder, ignore=shutil.ignore_patterns("__pycache__")
        )
    shutil.copytree(REPO / "tidegate", source / "tidegate", symlinks=True)
    for name in ("pyproject.toml", "README.md"):
        shutil.copy(REPO / name, source / name)
    shutil.copytree(REPO / "infra" / "migrations", source / "infra" / "migrations")
    shutil.copy(REPO / "infra" / "image-migrations.sh", source / "infra" / "image-migrations.sh")
    pip = [sys.executable, "-m", "pip", "-q"]
    subprocess.run(
        [
            *pip,
            "wheel",
            "--no-deps",
            "--no-build-isolation",
            "-w",
            str(tmp_path / "dist"),
            str(source),
        ],
        check=True,
        capture_output=True,
        timeout=300,
    )
    (wheel,) = (tmp_path / "dist").glob("tidegate-*.whl")
    site = tmp_path / "site"
    subprocess.run(
        [*pip, "install", "--no-deps", "--no-compile", "--target", str(site), str(wheel)],
        check=True,
        capture_output=True,
        timeout=300,
    )
    return source


def _migrations_dir(site: Path, env: dict[str, str]) -> tuple[Path, list[str]]:
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
    return Path(where), json.loads(ids)


def test_an_installed_tidegate_finds_its_migrations_once_the_image_step_ran(tmp_path: Path) -> None:
    source = _installed_copy(tmp_path)
    site = tmp_path / "site"
    env = {
        **os.environ,
        "PYTHONPATH": str(site),
        "PATH": f"{Path(sys.executable).parent}:{os.environ['PATH']}",
    }

    # The problem the step fixes: the installed package looks inside site-packages, finds nothing.
    where, ids = _migrations_dir(site, env)
    assert where.is_relative_to(site)
    assert ids == []

    result = subprocess.run(
        ["sh", "infra/image-migrations.sh"],
        cwd=source,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert result.returncode == 0, result.stdout + result.stderr
    where, ids = _migrations_dir(site, env)
    expected = sorted(
        p.stem for p in (REPO / "infra" / "migrations").glob("*.sql") if ".rollback" not in p.name
    )
    assert where.is_relative_to(site)
    assert ids == expected
