"""Model runtimes: load a verified package onto a device and run batches off the event loop.

`load_package` is the usual entry point. Importing this package stays light: onnxruntime and
torch are imported by the runtime that needs them.
"""

from tidegate.models.runtime.contract import Arrays, ModelRuntime
from tidegate.models.runtime.loader import create_runtime, load_package
from tidegate.models.runtime.runtime_metrics import MODEL_DEVICE_FALLBACKS, MODEL_LOAD_SECONDS

__all__ = [
    "MODEL_DEVICE_FALLBACKS",
    "MODEL_LOAD_SECONDS",
    "Arrays",
    "ModelRuntime",
    "create_runtime",
    "load_package",
]
