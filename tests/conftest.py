import pytest

from decisionkit import load_backbone, load_typed_decisions


@pytest.fixture(scope="session")
def backbone():
    """The default backbone, resolved offline (converted once into the cache, then reused)."""
    return load_backbone()


@pytest.fixture(scope="session")
def splits():
    return {name: load_typed_decisions(name) for name in ("train", "validation", "test")}


@pytest.fixture(scope="session")
def quick_model(tmp_path_factory, splits):
    """A small trained heads-only model (40 train / 40 validation cases, short inputs), shared by the calibration,
    anomaly and widget tests. Returns (path, model).

    Its heads must really learn, or the tests that use it cannot tell a working model from uniform answers: at the
    full recipe's rate (0.003) and L2 (1e-3 to 1e-2), 40 cases were overfitted by step 10 and the fit kept step 0,
    every answer uniform. cpu-quick's rate of 3e-4 and L2 of 1 or 10 keep a late step (measured: step 100 at L2 10,
    validation accuracy 0.455 on 80 cases)."""
    from decisionkit import FeatureSpec, load, preset, train
    from decisionkit.metrics import score, uniform_predictions

    path = tmp_path_factory.mktemp("quick-model") / "model"
    train(preset("cpu-quick", train_per_workflow=10, validation_per_workflow=10, head_steps=100,
                 features=FeatureSpec(max_length=128)), path, progress=False)
    model = load(path)
    assert model.head_fit["steps"] > 0, "the quick model kept its uniform start (step 0): its heads learned nothing"
    validation = splits["validation"].head(10)
    accuracy = score(validation, *model.outputs(validation, raw=True)).overall()["accuracy"]
    uniform = score(validation, uniform_predictions(validation)).overall()["accuracy"]
    assert accuracy > uniform + 0.1, f"quick model: validation accuracy {accuracy:.3f}, uniform answers {uniform:.3f}"
    return path, model
