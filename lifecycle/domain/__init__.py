"""The pure domain of the lifecycle: events, the state fold, routing, the rules of the
commands, live windows and the JSON views. No I/O."""

__all__: list[str] = []
