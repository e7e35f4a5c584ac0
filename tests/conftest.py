import pytest

from decisionkit import load_backbone, load_typed_decisions


@pytest.fixture(scope="session")
def backbone():
    """The default backbone, resolved offline (converted once into the cache, then reused)."""
    return load_backbone()


@pytest.fixture(scope="session")
def splits():
    return {name: load_typed_decisions(name) for name in ("train", "validation", "test")}
