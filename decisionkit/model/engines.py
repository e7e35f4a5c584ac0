"""Loading a resolved backbone (``backbone.resolve_backbone``), through one of two engines driven by the same
settings (``backbone.QuantSettings``, ``backbone.LoraSettings``):

- CUDA + ``unsloth`` installed, causal LMs: Unsloth's ``FastLanguageModel`` (4-bit NF4 when asked, LoRA via
  Unsloth);
- otherwise transformers: with bitsandbytes NF4 when 4-bit weights are asked for and peft LoRA when adapters are,
  else plain float32 weights (bfloat16 on a GPU).

``add_lora`` attaches trainable LoRA adapters to a loaded ``backbone.Backbone`` with the engine it was loaded by.
"""

from __future__ import annotations

import importlib.util
import logging
import warnings
from contextlib import contextmanager
from functools import partial
from pathlib import Path
from typing import Any
from unittest import mock

import torch

from ..core.extras import needs_extra, require

# On a bf16 CPU, bitsandbytes tries an optional hub kernel when it is imported (by transformers' 4-bit loading, and
# by peft when it adds LoRA adapters) and warns on stderr when the `kernels` package is absent; offline it cannot be
# fetched anyway, and bitsandbytes' own CPU kernels answer.
logging.getLogger("bitsandbytes.backends.cpu.ops").setLevel(logging.ERROR)


def model_kind(path: Path, trust_remote_code: bool = False) -> str:
    """"causal" when the config names a ``...ForCausalLM`` architecture, else "encoder" (loaded with AutoModel)."""
    from transformers import AutoConfig

    config = AutoConfig.from_pretrained(path, trust_remote_code=trust_remote_code)
    return "causal" if any(a.endswith("ForCausalLM") for a in config.architectures or []) else "encoder"


def unsloth_usable(device: str, kind: str) -> bool:
    return device == "cuda" and kind == "causal" and importlib.util.find_spec("unsloth") is not None


def load_unsloth(resolved, quant, max_seq_length: int, trust_remote_code: bool):
    from unsloth import FastLanguageModel  # imported lazily: it needs a GPU and patches transformers

    return FastLanguageModel.from_pretrained(
        model_name=str(resolved.path),
        max_seq_length=max_seq_length,
        dtype=None,
        load_in_4bit=quant is not None,
        trust_remote_code=trust_remote_code,
    )


@contextmanager
def quiet_progress(gguf: bool = False):
    """No progress bar from transformers for a load that takes seconds ("Loading weights", "Writing model shards":
    its own switch), and with ``gguf`` none from its GGUF reader either (``tqdm.auto``, whose notebook bar ignores
    ``TQDM_DISABLE`` and would stay in a saved notebook at 0%); the user's own setting is restored."""
    from transformers.utils import logging as hf_logging

    enabled = hf_logging.is_progress_bar_enabled()
    hf_logging.disable_progress_bar()
    try:
        if gguf:
            from tqdm.auto import tqdm
            from transformers import modeling_gguf_pytorch_utils

            with mock.patch.object(modeling_gguf_pytorch_utils, "tqdm", partial(tqdm, disable=True)):
                yield
        else:
            yield
    finally:
        if enabled:
            hf_logging.enable_progress_bar()


def load_transformers(resolved, quant, device: str, trust_remote_code: bool, kind: str):
    from transformers import AutoModel, AutoModelForCausalLM, AutoTokenizer

    kwargs: dict[str, Any] = {"trust_remote_code": trust_remote_code, "use_safetensors": True}
    if quant is not None:
        from transformers import BitsAndBytesConfig

        require("bitsandbytes", "4-bit weights")

        kwargs["quantization_config"] = BitsAndBytesConfig(
            load_in_4bit=True,
            bnb_4bit_quant_type=quant.quant_type,
            bnb_4bit_use_double_quant=quant.double_quant,
            bnb_4bit_compute_dtype=quant.torch_compute_dtype(device),
        )
        kwargs["device_map"] = {"": device}
    else:
        kwargs["dtype"] = torch.bfloat16 if device == "cuda" and torch.cuda.is_bf16_supported() else torch.float32
    with quiet_progress():
        model = (AutoModelForCausalLM if kind == "causal" else AutoModel).from_pretrained(resolved.path, **kwargs)
    if quant is None:
        model.to(device)
    tokenizer = AutoTokenizer.from_pretrained(resolved.path, trust_remote_code=trust_remote_code)
    return model, tokenizer


def add_lora(backbone, lora):
    """Attach trainable LoRA adapters (``lora``: a ``LoraSettings``) to ``backbone`` (a ``Backbone``), Unsloth's on a
    GPU with Unsloth, else peft's; the base stays frozen. Returns the backbone."""
    if backbone.lora is not None:
        raise ValueError("the backbone already has LoRA adapters")
    if backbone.engine == "unsloth":
        from unsloth import FastLanguageModel

        model = FastLanguageModel.get_peft_model(
            backbone.model, r=lora.r, lora_alpha=lora.alpha, lora_dropout=lora.dropout,
            target_modules=list(lora.target_modules), bias="none", use_gradient_checkpointing="unsloth",
            random_state=lora.seed, layers_to_transform=lora.layers(backbone.num_layers),
        )
    else:
        with needs_extra("LoRA adapters"):
            from peft import LoraConfig, get_peft_model, prepare_model_for_kbit_training

        model = backbone.model
        if backbone.quantize is not None:
            model = prepare_model_for_kbit_training(model, use_gradient_checkpointing=False)
        torch.manual_seed(lora.seed)
        config = LoraConfig(r=lora.r, lora_alpha=lora.alpha, lora_dropout=lora.dropout,
                            target_modules=list(lora.target_modules), bias="none",
                            task_type="CAUSAL_LM" if backbone.kind == "causal" else "FEATURE_EXTRACTION",
                            layers_to_transform=lora.layers(backbone.num_layers))
        with warnings.catch_warnings():  # peft 0.21 calls a transformers 5 property it deprecated; nothing to act on
            warnings.filterwarnings("ignore", message=".*is_gradient_checkpointing.*", category=FutureWarning)
            model = get_peft_model(model, config)
    backbone.model, backbone.lora = model, lora
    return backbone
