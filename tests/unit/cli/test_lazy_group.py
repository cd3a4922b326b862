"""The `tidegate` command imports a subcommand's module only when that subcommand runs."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest
from typer.testing import CliRunner

from tidegate.cli import TidegateCommands, app

# Runs `tidegate ARGS` in a fresh interpreter and prints its exit code, its output and which of
# the CLI's own modules (and the registry client, the heaviest import) it imported.
_PROBE = """
import json, sys
from typer.testing import CliRunner
from tidegate.cli import app
result = CliRunner().invoke(app, sys.argv[1:])
print(json.dumps({
    "code": result.exit_code,
    "output": result.output,
    "modules": sorted(m for m in sys.modules
                      if m.startswith("tidegate.cli.") or m == "confluent_kafka.schema_registry"),
}))
"""


def _run(*args: str) -> dict[str, object]:
    done = subprocess.run(
        [sys.executable, "-c", _PROBE, *args], capture_output=True, text=True, check=True
    )
    return json.loads(done.stdout.strip().splitlines()[-1])  # type: ignore[no-any-return]


def test_the_root_help_lists_every_command_and_imports_none() -> None:
    ran = _run("--help")
    assert ran["code"] == 0
    output = str(ran["output"])
    for name, command in TidegateCommands.LAZY.items():
        assert name in output
        assert command.help.split()[0] in output
    assert ran["modules"] == ["tidegate.cli.actor", "tidegate.cli.lazy_group"]


def test_a_command_imports_its_own_module_only() -> None:
    ran = _run("worker", "--help")
    assert ran["code"] == 0
    assert "--pool" in str(ran["output"])
    modules = ran["modules"]
    assert isinstance(modules, list)
    assert "tidegate.cli.serve_worker" in modules
    for unused in (
        "tidegate.cli.audit_commands",
        "tidegate.cli.auth_commands",
        "tidegate.cli.model_commands",
        "tidegate.cli.serve_gateway",
        "confluent_kafka.schema_registry",
    ):
        assert unused not in modules


@pytest.mark.parametrize("name", list(TidegateCommands.LAZY))
def test_every_command_loads_with_its_help(name: str) -> None:
    result = CliRunner().invoke(app, [name, "--help"])
    assert result.exit_code == 0, result.output
    assert f"Usage: tidegate {name}" in result.output
    # Shell completion is the root command's option, as before the commands were lazy.
    assert "--install-completion" not in result.output


def test_a_group_keeps_its_subcommands() -> None:
    result = CliRunner().invoke(app, ["pools", "--help"])
    assert result.exit_code == 0
    assert "plan" in result.output
    assert "apply" in result.output


def test_a_group_of_one_subcommand_stays_a_group() -> None:
    result = CliRunner().invoke(app, ["schemas", "register", "--help"])
    assert result.exit_code == 0, result.output
    assert "Usage: tidegate schemas register" in result.output


def test_an_unknown_command_is_a_usage_error() -> None:
    result = CliRunner().invoke(app, ["no-such-command"])
    assert result.exit_code == 2
    assert "No such command" in result.output
