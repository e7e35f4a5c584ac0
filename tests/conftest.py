import pytest
import torch

from decisionkit import load_backbone, load_typed_decisions
from decisionkit.core.precision import kernels


def pytest_terminal_summary(terminalreporter):
    """The machine this run's durations belong to (shown under -q too): CPU, cores, the kernels torch runs. (Not the
    compute dtype: tests force both, and each benchmark record carries the one it ran.)"""
    import os
    import re
    from pathlib import Path

    found = re.search(r"^model name\s*:\s*(.+)$", Path("/proc/cpuinfo").read_text(), re.M)
    terminalreporter.write_line(f"decisionkit ran on: {found.group(1) if found else 'unknown CPU'}, {os.cpu_count()} "
                                f"cores, {kernels()}")


@pytest.fixture(scope="session")
def backbone():
    """The default backbone, resolved offline (converted once into the cache, then reused)."""
    return load_backbone()


@pytest.fixture(scope="session")
def tiny_backbone_path(tmp_path_factory, backbone):
    """A Llama of 4 layers, 64 wide, with random weights and SmolLM2's tokenizer (as LLMs-from-scratch tests its
    code on small configs), for the tests that check mechanics alone: shapes, batching, saving, resuming. Its forward
    pass costs about 1% of SmolLM2's. Tests of what a model learns use the real backbone."""
    from transformers import LlamaConfig, LlamaForCausalLM

    path = tmp_path_factory.mktemp("tiny-backbone")
    config = LlamaConfig(vocab_size=len(backbone.tokenizer), hidden_size=64, intermediate_size=128,
                         num_hidden_layers=4, num_attention_heads=4, num_key_value_heads=2,
                         max_position_embeddings=1024, tie_word_embeddings=True, bos_token_id=backbone.tokenizer.bos_token_id,
                         eos_token_id=backbone.tokenizer.eos_token_id)
    torch.manual_seed(0)
    LlamaForCausalLM(config).save_pretrained(path, safe_serialization=True)
    backbone.tokenizer.save_pretrained(path)
    return path


@pytest.fixture(scope="session")
def tiny_backbone(tiny_backbone_path):
    return load_backbone(tiny_backbone_path)


@pytest.fixture(scope="session")
def splits():
    return {name: load_typed_decisions(name) for name in ("train", "validation", "test")}


@pytest.fixture(scope="session")
def quick_model(splits):
    """A small trained hybrid model (cpu-quick with trees on the fields, as make demo trains it; 40 train / 40
    validation cases, 128 tokens), shared by the calibration, anomaly, serving and widget tests, and the notebooks'
    quick SmolLM2 hybrid at the same sizes (its features come from the cache then). Returns (path, model). It is trained once into the cache
    (``runs.shared_run``), so the next session, and any process beside this one, reuses it: tests must not save
    into its folder.

    Its heads must really learn, or the tests that use it cannot tell a working model from uniform answers: at the
    full recipe's rate (0.003) and L2 (1e-3 to 1e-2), 40 cases were overfitted by step 10 and the fit kept step 0,
    every answer uniform. cpu-quick's rate of 3e-4 and L2 of 1 or 10 keep a late step (measured: step 100 at L2 10,
    validation accuracy 0.455 on 80 cases)."""
    from decisionkit import load
    from decisionkit.data.metrics import score, uniform_predictions
    from decisionkit.training.runs import shared_run

    path = shared_run("cpu-quick", structured=True)
    model = load(path)
    assert model.head_recipe.steps > 0, "the quick model kept its uniform start (step 0): its heads learned nothing"
    validation = splits["validation"].head(10)
    accuracy = score(validation, *model.outputs(validation, raw=True)).overall()["accuracy"]
    uniform = score(validation, uniform_predictions(validation)).overall()["accuracy"]
    assert accuracy > uniform + 0.1, f"quick model: validation accuracy {accuracy:.3f}, uniform answers {uniform:.3f}"
    return path, model


@pytest.fixture(scope="session")
def postgres_url():
    """The URL of a database on a throwaway PostgreSQL server (tests/postgres.py: 127.0.0.1 only, its own port),
    stopped and deleted at the session's end; the test is skipped, with the reason, where none can start."""
    from postgres import Server, Unavailable

    try:
        with Server() as server:
            yield server.url
    except Unavailable as err:
        pytest.skip(f"no PostgreSQL server here: {err}")
