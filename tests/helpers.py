"""Small assertion helpers shared by the tests."""

import torch


def assert_values(actual: torch.Tensor, expected, atol: float = 1e-6) -> None:
    """Compare a tensor with hand-written (possibly nested) numbers."""
    expected_t = (expected.detach() if isinstance(expected, torch.Tensor) else torch.tensor(expected, dtype=torch.float64)).to(torch.float64)
    torch.testing.assert_close(actual.detach().to(torch.float64), expected_t, atol=atol, rtol=0)


def home_with_tiny_model(home, tiny_model_dir):
    """Make ``home`` a workbench home holding a copy of the session's tiny-model build."""
    import shutil
    from pathlib import Path

    home = Path(home)
    shutil.copytree(tiny_model_dir, home / "models" / tiny_model_dir.name)
    return home


def missing_component(reason: str) -> None:
    """A system component a test needs is missing: fail under CI (CI=true/1), skip elsewhere."""
    import os

    import pytest

    if os.environ.get("CI", "").strip().lower() in ("true", "1", "yes"):
        pytest.fail(reason)
    pytest.skip(reason)
