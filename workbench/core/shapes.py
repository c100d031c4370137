"""Shape checks with errors that name the tensor and both shapes."""

from __future__ import annotations

import torch


class ShapeError(ValueError):
    """Tensors whose shapes do not fit together."""


def check_2d(name: str, tensor: torch.Tensor) -> tuple[int, int]:
    """Require ``tensor`` to be (B, T); return (B, T)."""
    if not isinstance(tensor, torch.Tensor):
        raise ShapeError(f"{name} must be a torch.Tensor of shape (B, T), got {type(tensor).__name__}")
    if tensor.dim() != 2:
        raise ShapeError(f"{name} must have shape (B, T), got shape {tuple(tensor.shape)}")
    return tensor.shape[0], tensor.shape[1]


def check_like(reference_name: str, reference: torch.Tensor, **tensors: torch.Tensor | None) -> None:
    """Require every given tensor (None skipped) to have the shape of ``reference``."""
    for name, tensor in tensors.items():
        if tensor is None:
            continue
        if not isinstance(tensor, torch.Tensor) or tensor.shape != reference.shape:
            got = tuple(tensor.shape) if isinstance(tensor, torch.Tensor) else type(tensor).__name__
            raise ShapeError(
                f"{name} has shape {got} but {reference_name} has shape {tuple(reference.shape)}; "
                "they must match (B, T)"
            )


def check_sequence_vector(name: str, tensor: torch.Tensor, batch: int) -> None:
    """Require ``tensor`` to be a (B,) vector with B = ``batch``."""
    if not isinstance(tensor, torch.Tensor) or tensor.shape != (batch,):
        got = tuple(tensor.shape) if isinstance(tensor, torch.Tensor) else type(tensor).__name__
        raise ShapeError(f"{name} must have shape (B,) = ({batch},), got {got}")
