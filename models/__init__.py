"""Model packages: the manifest, the artifact store, and the runtime interface with its ONNX and
TorchScript backends. The lifecycle (register validates a package) and the workers use it."""

__all__: list[str] = []
