"""Masks that drop tokens or whole completions from the policy loss."""

from __future__ import annotations

import torch

from .masked import masked_mean
from .shapes import check_2d, check_like, check_sequence_vector


def opsm_mask(
    logp: torch.Tensor,
    old_logp: torch.Tensor,
    advantages: torch.Tensor,
    mask: torch.Tensor,
    delta: float,
) -> torch.Tensor:
    """Off-policy sequence masking (slime's OPSM).

    Sequence i is masked when its advantage is negative AND its mean drift
    mean_t (old_logp - logp) over valid tokens exceeds ``delta``: a negative update on a sequence
    the current policy already moved away from is the off-policy update most likely to hurt.
    (B, T) inputs -> (B, T) mask (float, like ``mask``).
    """
    check_2d("logp", logp)
    check_like("logp", logp, old_logp=old_logp, advantages=advantages, mask=mask)
    drift = masked_mean((old_logp - logp).detach(), mask, dim=1)  # (B,)
    seq_adv = masked_mean(advantages, mask, dim=1)
    drop = (seq_adv < 0) & (drift > delta)
    return mask * (~drop).to(mask.dtype)[:, None]


def truncation_mask(mask: torch.Tensor, truncated: torch.Tensor) -> torch.Tensor:
    """Overlong filtering (DAPO): completions cut off at max length get no loss.

    mask (B, T), truncated (B,) bool -> (B, T).
    """
    B, _ = check_2d("mask", mask)
    check_sequence_vector("truncated", truncated, B)
    return mask * (~truncated.bool()).to(mask.dtype)[:, None]


def high_entropy_mask(entropy: torch.Tensor, mask: torch.Tensor, quantile: float) -> torch.Tensor:
    """Keep only the top-``quantile`` tokens by entropy ("Beyond the 80/20 Rule", Wang et al. 2025;
    TRL ``top_entropy_quantile`` rho, paper: 0.2).

        tau = Quantile_{1 - rho}( {H_t : m_t = 1} )     (linear interpolation, torch.quantile)
        keep_t = m_t and H_t >= tau

    rho = 1 keeps every valid token, rho = 0 only the highest-entropy one(s). The quantile is
    over the tokens given: TRL gathers them across ranks first, so the engine must pass the
    whole batch (or gather) to match it. entropy, mask (B, T) -> (B, T) mask (float, like ``mask``).
    """
    check_2d("entropy", entropy)
    check_like("entropy", entropy, mask=mask)
    if not 0.0 <= quantile <= 1.0:
        raise ValueError(f"top_entropy_quantile={quantile} must be in [0, 1]")
    valid = mask.bool()
    values = entropy.detach()[valid].float()
    if values.numel() == 0:
        return torch.zeros_like(mask)
    threshold = torch.quantile(values, 1.0 - quantile)
    return mask * ((entropy.detach().float() >= threshold) & valid).to(mask.dtype)
