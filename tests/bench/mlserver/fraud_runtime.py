"""The MLServer runtime serving the fraud ONNX model. It runs inside MLServer's own venv, copied
into the model folder of the repository `peer.write_model_repo` writes, so it imports only
mlserver, onnxruntime, numpy and the standard library."""

from __future__ import annotations

from typing import Any

import numpy as np
import onnxruntime as ort

# mlserver lives only in the peer's venv: its fastapi pin cannot share the project's.
from mlserver import MLModel  # type: ignore[import-not-found]
from mlserver.codecs import NumpyCodec  # type: ignore[import-not-found]
from mlserver.errors import MLServerError  # type: ignore[import-not-found]
from mlserver.types import InferenceResponse  # type: ignore[import-not-found]

__all__ = ["FraudOnnx"]

INPUT, OUTPUT = "features", "probabilities"


class FraudOnnx(MLModel):  # type: ignore[misc]
    """`features` FP32 [-1, 64] in, the graph's `probabilities` FP32 [-1, 2] out."""

    async def load(self) -> bool:
        options = ort.SessionOptions()
        # The same session settings as tidegate's workers (ModelSettings defaults), so the
        # comparison is between the servers, not between thread pools.
        options.intra_op_num_threads = 1
        options.inter_op_num_threads = 1
        options.execution_mode = ort.ExecutionMode.ORT_SEQUENTIAL
        options.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_ALL
        self._session = ort.InferenceSession(
            self.settings.parameters.uri, sess_options=options, providers=["CPUExecutionProvider"]
        )
        return True

    async def predict(self, payload: Any) -> Any:
        for request_input in payload.inputs:
            if request_input.name == INPUT:
                # The codec decodes to the dtype the request declares; the graph takes float32.
                rows = np.asarray(NumpyCodec.decode_input(request_input), dtype=np.float32)
                break
        else:
            raise MLServerError(f"the model needs input {INPUT!r}", status_code=400)
        (probabilities,) = self._session.run([OUTPUT], {INPUT: rows})
        return InferenceResponse(
            model_name=self.name,
            model_version=self.version,
            outputs=[NumpyCodec.encode_output(OUTPUT, probabilities)],
        )
