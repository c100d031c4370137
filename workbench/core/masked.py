"""Masked reductions over (B, T) tensors. Padding (mask 0) never contributes.

Masking multiplies by the mask rather than selecting with ``torch.where``: on CPU that is ~15x
faster, and it requires padding values to be finite (the trainer fills padding log-probs and
values with finite numbers; log-ratios are clamped before ``exp``).
Empty selections give 0, not NaN: a batch whose completions were all masked out (truncation
masking, OPSM) must not poison the loss.
"""

from __future__ import annotations

import torch


def zero_padding(x: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """x * m: padding positions set to 0. x, mask: (B, T), x finite."""
    return x * mask.to(x.dtype)


def masked_sum(x: torch.Tensor, mask: torch.Tensor, dim: int | None = None) -> torch.Tensor:
    """sum(x * m) over ``dim`` (all dims if None). x, mask: (B, T)."""
    xm = zero_padding(x, mask)
    return xm.sum() if dim is None else xm.sum(dim)


def masked_mean(x: torch.Tensor, mask: torch.Tensor, dim: int | None = None) -> torch.Tensor:
    """sum(x m) / max(sum(m), 1) over ``dim``; 0 where nothing is selected."""
    count = mask.sum() if dim is None else mask.sum(dim)
    return masked_sum(x, mask, dim) / count.clamp(min=1).to(x.dtype)


def masked_var(x: torch.Tensor, mask: torch.Tensor, unbiased: bool = True) -> torch.Tensor:
    """Variance of the selected entries (Bessel-corrected if ``unbiased``); 0 if fewer than 2."""
    mean = masked_mean(x, mask)
    n = mask.sum().to(x.dtype)
    sq = masked_sum((x - mean) ** 2, mask)
    denom = (n - 1.0) if unbiased else n
    return torch.where(n > 1, sq / denom.clamp(min=1.0), torch.zeros_like(sq))


def masked_whiten(x: torch.Tensor, mask: torch.Tensor, shift_mean: bool = True, eps: float = 1e-8) -> torch.Tensor:
    """(x - mean) / sqrt(var + eps) over the selected entries (verl's ``masked_whiten``).

    With ``shift_mean=False`` the mean is added back (only the scale is normalised).
    Padding positions come out as 0.
    """
    mean = masked_mean(x, mask)
    whitened = (x - mean) * torch.rsqrt(masked_var(x, mask) + eps)
    if not shift_mean:
        whitened = whitened + mean
    return zero_padding(whitened, mask)


def last_valid_index(mask: torch.Tensor) -> torch.Tensor:
    """(B, T) mask -> (B,) index of the last valid position of each row (-1 for empty rows)."""
    T = mask.shape[1]
    positions = torch.arange(T, device=mask.device).expand_as(mask)
    return torch.where(mask.bool(), positions, torch.full_like(positions, -1)).max(dim=1).values
