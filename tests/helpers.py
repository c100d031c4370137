"""Small assertion helpers shared by the tests."""

import torch


def assert_values(actual: torch.Tensor, expected, atol: float = 1e-6) -> None:
    """Compare a tensor with hand-written (possibly nested) numbers."""
    expected_t = (expected.detach() if isinstance(expected, torch.Tensor) else torch.tensor(expected, dtype=torch.float64)).to(torch.float64)
    torch.testing.assert_close(actual.detach().to(torch.float64), expected_t, atol=atol, rtol=0)
