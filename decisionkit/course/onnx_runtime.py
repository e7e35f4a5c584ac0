"""The decision pass on ONNX Runtime: the backbone and its pooling exported once to ONNX, run by onnxruntime.

``export(model)`` traces the backbone's forward pass and the pooling of the model's feature layers into one ONNX
graph (``torch.onnx.export``, dynamo, dynamic batch and length), about a minute for SmolLM2-135M, cached under
``DECISIONKIT_CACHE/onnx`` by the weights' checksum and the feature settings. ``quantize(path)`` writes its int8
version (onnxruntime's dynamic quantization: int8 weights, activations quantized per call). ``OnnxEncoder(path)``
answers like ``DecisionModel.pooled``: one pooled vector per row of a tokenized batch, before the standardization.
The graph reads one window a row (at most ``spec.max_length`` tokens); a state of several windows (the batch's
``owner``) has its rows' vectors merged after the graph, in torch (``pooling.merge_windows``), as ``pooled`` does.
The heads stay in torch; an int8 graph changes the features, so heads for it are re-fitted on its own features
(``speed.speed_table``).
"""

from __future__ import annotations

import hashlib
import json
from pathlib import Path

import numpy as np
import torch
from torch import nn

from ..core import settings
from ..core.atomic import atomic_folder
from ..model.pooling import merge_windows, one_window_each, pool_layers

EXPORT_OPSET = 18  # what torch.onnx's dynamo exporter writes by default in torch 2.13


class PooledBackbone(nn.Module):
    """The backbone, run in float32, and the model's pooling of its feature layers, concatenated: what is exported.
    Not the model itself: its forward pass routes rows to heads by workflow name and checks the attention mask's
    values, which a traced graph cannot hold."""

    def __init__(self, model):
        super().__init__()
        self.body, self.spec = model.backbone.body, model.spec

    def forward(self, input_ids: torch.Tensor, attention_mask: torch.Tensor) -> torch.Tensor:
        hidden = self.body(input_ids=input_ids, attention_mask=attention_mask, output_hidden_states=True).hidden_states
        return pool_layers(hidden, attention_mask, self.spec.pooling, self.spec.layers, checked=False)


def export(model, folder: str | Path | None = None) -> Path:
    """The ONNX graph of ``model``'s backbone and pooling (written once, then read from the cache)."""
    # the cap on windows is not part of the graph (one window a row): graphs exported before windows stay valid
    spec = {k: v for k, v in model.spec.to_json().items() if k != "max_windows"}
    key = hashlib.sha256(json.dumps([model.backbone.checksum, spec]).encode()).hexdigest()[:16]
    folder = Path(folder) if folder else settings.cache_dir() / "onnx" / key
    path = folder / "pooled.onnx"
    if path.is_file():
        return path
    example = model.tokenize(["workflow: example\nstate"])
    batch, length = torch.export.Dim("batch", max=256), torch.export.Dim("length", max=model.spec.max_length)
    with atomic_folder(folder) as scratch, torch.no_grad():  # written whole, then renamed: no half export is read
        torch.onnx.export(PooledBackbone(model).eval(), (example["input_ids"], example["attention_mask"]),
                          scratch / path.name, dynamo=True, input_names=["input_ids", "attention_mask"],
                          output_names=["pooled"], external_data=True, opset_version=EXPORT_OPSET,
                          dynamic_shapes={"input_ids": {0: batch, 1: length}, "attention_mask": {0: batch, 1: length}})
    return path


def quantize(path: str | Path) -> Path:
    """The int8 version of an exported graph (dynamic quantization of its matrix products), cached beside it."""
    from onnxruntime.quantization import QuantType, quantize_dynamic

    path = Path(path)
    out = path.with_name(path.stem + ".int8.onnx")
    if not out.is_file():
        scratch = out.with_name(out.stem + ".partial.onnx")
        quantize_dynamic(path, scratch, weight_type=QuantType.QInt8, use_external_data_format=False)
        scratch.replace(out)
    return out


class OnnxEncoder:
    """Pooled features of tokenized batches from an exported graph, on onnxruntime's CPU provider; ``pooling``
    (the model's ``spec.pooling``) merges the windows of a state read in several (``tokenize``'s ``owner``)."""

    def __init__(self, path: str | Path, threads: int | None = None, pooling: str | None = None):
        import onnxruntime as ort

        options = ort.SessionOptions()
        options.intra_op_num_threads = threads or torch.get_num_threads()
        self.session = ort.InferenceSession(str(path), options, providers=["CPUExecutionProvider"])
        self.path = Path(path)
        self.pooling = pooling

    def __call__(self, batch: dict[str, torch.Tensor]) -> torch.Tensor:
        feed = {"input_ids": batch["input_ids"].cpu().numpy().astype(np.int64),
                "attention_mask": batch["attention_mask"].cpu().numpy().astype(np.int64)}
        pooled = torch.from_numpy(self.session.run(None, feed)[0])
        owner = batch.get("owner")
        if one_window_each(owner, pooled.shape[0]):
            return pooled
        if self.pooling is None:
            raise ValueError("this batch reads a state in several windows; pass pooling= (the model's spec.pooling) "
                             "to OnnxEncoder to merge them")
        return merge_windows(pooled, owner.cpu(), batch["attention_mask"].cpu(), self.pooling)
