"""The gateway's OpenAPI document: every status each operation answers, and the bodies and
headers it writes."""

__all__: list[str] = []
