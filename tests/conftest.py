"""Fixtures shared by every test package: one tiny-model build per session, copied into fresh homes."""

import pytest

from tests.helpers import home_with_tiny_model


@pytest.fixture(scope="session")
def tiny_model_dir(tmp_path_factory):
    """The built-in tiny model, built once per test session (~20 s) in its own home."""
    from workbench.engine.tiny import ensure_tiny_model

    return ensure_tiny_model(tmp_path_factory.mktemp("tinyhome"))


@pytest.fixture
def fresh_home(tmp_path, monkeypatch, tiny_model_dir):
    """An empty workbench home (WORKBENCH_HOME) that already holds the built tiny model."""
    home = home_with_tiny_model(tmp_path / "home", tiny_model_dir)
    monkeypatch.setenv("WORKBENCH_HOME", str(home))
    return home
