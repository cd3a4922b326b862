"""`tidegate models ...`: build the example models into the artifact store, list what it holds."""

from __future__ import annotations

from typing import Annotated

import typer

__all__ = ["app"]

app = typer.Typer(no_args_is_help=True)


@app.command("build")
def build(
    only: Annotated[
        list[str] | None,
        typer.Option("--only", help="Only this model (repeatable): fraud, fraud-lite, minilm."),
    ] = None,
    force: Annotated[
        bool,
        typer.Option("--force", help="Rebuild even unchanged versions; replace ones that differ."),
    ] = False,
) -> None:
    """Build fraud 1, 1-torch, 2, 3, fraud-lite 1 and minilm 1 into the store (offline).

    Versions already built from the same recipe are skipped, so a re-run takes seconds.
    """
    import asyncio

    from rich.console import Console
    from rich.table import Table

    from agents.models import build_models
    from agents.store import LocalArtifactStore
    from tidegate.errors import TidegateError
    from tidegate.settings import ModelSettings

    console = Console()
    store = LocalArtifactStore(ModelSettings())
    try:
        outcomes = asyncio.run(
            build_models(store, only=only or (), force=force, progress=console.print)
        )
    except TidegateError as exc:
        console.print(f"[red]error:[/red] {exc}")
        raise typer.Exit(1) from None
    table = Table("model", "version", "runtime", "action", "seconds", title=str(store.root))
    for outcome in outcomes:
        manifest = outcome.manifest
        table.add_row(
            manifest.name,
            manifest.version,
            manifest.runtime,
            outcome.action,
            f"{outcome.seconds:.1f}",
        )
    console.print(table)


@app.command("list")
def list_models() -> None:
    """Every model version in the store, with its runtime, signature and description."""
    import asyncio

    from rich.console import Console
    from rich.table import Table

    from agents.store import LocalArtifactStore
    from tidegate.settings import ModelSettings

    store = LocalArtifactStore(ModelSettings())

    async def manifests() -> list[tuple[str, str, str, str, str]]:
        rows: list[tuple[str, str, str, str, str]] = []
        for name in await store.models():
            for version in await store.versions(name):
                manifest = await store.manifest(name, version)
                signature = manifest.signature
                io = ", ".join(f"{s.name} {s.datatype}{list(s.shape)}" for s in signature.inputs)
                io += " -> " + ", ".join(
                    f"{s.name} {s.datatype}{list(s.shape)}" for s in signature.outputs
                )
                rows.append((name, version, manifest.runtime, io, manifest.description))
        return rows

    table = Table("model", "version", "runtime", "signature", "description", title=str(store.root))
    for row in asyncio.run(manifests()):
        table.add_row(*row)
    Console().print(table)
