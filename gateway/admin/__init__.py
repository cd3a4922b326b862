"""The operator APIs over HTTP: `/admin` (the lifecycle commands), `/admin/dlq` (dead letters and
redrives) and the schema registry's REST API."""

__all__: list[str] = []
