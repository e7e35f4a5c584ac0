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
    anomaly and widget tests. Returns (path, model)."""
    from decisionkit import FeatureSpec, load, preset, train

    path = tmp_path_factory.mktemp("quick-model") / "model"
    train(preset("cpu-quick", train_per_workflow=10, validation_per_workflow=10, head_steps=100,
                 features=FeatureSpec(max_length=128)), path, progress=False)
    return path, load(path)
