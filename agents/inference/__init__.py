"""The data plane: batching, the inference service, loaded versions and the version manager,
signature checks, the breakers' fallback, shadow runs and their comparison, result records,
and the offline scorer of replays."""

__all__: list[str] = []
