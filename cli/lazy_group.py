"""The root command's subcommands, each imported only when it is the one that runs.

A worker, the gateway and the controller are `tidegate` subcommands, and every one of their
processes starts through this command line. Importing every command module first (the Kafka
admin clients, the schema registry client with its HTTP and OAuth stack, Redis, PostgreSQL)
cost each start about 0.3 s of CPU it never used, and `tidegate --help` a second. A
`LazyCommand` names where a subcommand lives; `LazyGroup` imports that module when click asks
for the command by name, as click's documentation shows for lazily loaded subcommands.
"""

from __future__ import annotations

import importlib
from dataclasses import dataclass
from typing import ClassVar

import typer

# typer 0.29 carries its own copy of click: its groups and commands take that copy's types.
from typer._click import Command, Context, HelpFormatter
from typer.core import TyperCommand, TyperGroup

__all__ = ["LazyCommand", "LazyGroup", "lazy_commands"]


@dataclass(frozen=True, slots=True)
class LazyCommand:
    """A subcommand by where it lives: `module`'s `attribute`, a command function or a
    `typer.Typer` of its own (a command group)."""

    module: str
    attribute: str
    help: str

    def load(self, name: str) -> Command:
        target = getattr(importlib.import_module(self.module), self.attribute)
        if isinstance(target, typer.Typer):
            # A group even with one subcommand (get_command would return that command itself).
            command: Command = typer.main.get_group(target)
            command.help = self.help
        else:
            single = typer.Typer(add_completion=False)
            single.command(name, help=self.help)(target)
            command = typer.main.get_command(single)
        command.name = name
        return command


def lazy_commands(table: str, package: str) -> dict[str, LazyCommand]:
    """Commands from a table of two lines each: `NAME MODULE:ATTRIBUTE` (the module under
    `package`), then the command's help."""
    lines = table.strip().splitlines()
    if len(lines) % 2:
        raise ValueError("each command takes two lines: NAME MODULE:ATTRIBUTE, then its help")
    commands = {}
    for head, help in zip(lines[::2], lines[1::2], strict=True):
        name, target = head.split()
        module, attribute = target.split(":")
        commands[name] = LazyCommand(f"{package}.{module}", attribute, help.strip())
    return commands


class LazyGroup(TyperGroup):
    """A typer group whose `LAZY` subcommands are loaded on first use, in the order listed."""

    LAZY: ClassVar[dict[str, LazyCommand]] = {}
    _listing = False

    def format_help(self, ctx: Context, formatter: HelpFormatter) -> None:
        # The listing needs only each subcommand's name and help, which `LAZY` holds.
        self._listing = True
        try:
            super().format_help(ctx, formatter)
        finally:
            self._listing = False

    def list_commands(self, ctx: Context) -> list[str]:
        eager = super().list_commands(ctx)
        return eager + [name for name in self.LAZY if name not in eager]

    def get_command(self, ctx: Context, cmd_name: str) -> Command | None:
        command = super().get_command(ctx, cmd_name)
        if command is None and cmd_name in self.LAZY:
            if self._listing:
                return TyperCommand(cmd_name, help=self.LAZY[cmd_name].help)
            command = self.LAZY[cmd_name].load(cmd_name)
            self.add_command(command, cmd_name)
        return command
