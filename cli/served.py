"""`tidegate served REQUEST_ID`: which version served a request, when, on which worker and under
which routing rule; where the request was read (topic, partition, offset), the registry id of its
schema, its delivery attempt and every retry, redrive or replay that led to the result, and a
CONFLICT warning when its id was reused for other content; with the routing table as it stood
then and the version's lineage. `--json` prints all of it, as `/admin/requests/{id}/served`."""

from __future__ import annotations

from typing import Annotated

import typer

from tidegate.cli.lifecycle_session import emit, run
from tidegate.cli.lifecycle_tables import served_render

__all__ = ["served"]


def served(
    request_id: Annotated[str, typer.Argument(help="The request's id.")],
    as_json: Annotated[bool, typer.Option("--json", help="Print JSON instead of a table.")] = False,
) -> None:
    """Which version served REQUEST_ID, when, where and why, where it was read and how it got
    there (from the indexed results)."""

    data = run(lambda c: c.served(request_id), write=False, as_json=as_json)
    emit(data, as_json, served_render)
