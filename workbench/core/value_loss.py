"""PPO critic loss with value clipping."""

from __future__ import annotations

import torch

from .masked import masked_mean, zero_padding
from .shapes import check_2d, check_like


def clipped_value_loss(
    values: torch.Tensor,
    old_values: torch.Tensor,
    returns: torch.Tensor,
    mask: torch.Tensor,
    clip_range_value: float | None = 0.2,
) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
    """Per-token value loss (PPO; the clipping as in OpenAI baselines / TRL / verl):

        L_t = 0.5 * max((V - R)^2, (clip(V, V_old - c_v, V_old + c_v) - R)^2)

    Without clipping (clip_range_value None) L_t = 0.5 (V - R)^2.
    values, old_values, returns, mask: (B, T) -> loss (B, T) (0 on padding), metrics with
    ``value/clipfrac`` (fraction of valid tokens where the clipped term was the larger).
    """
    check_2d("values", values)
    check_like("values", values, old_values=old_values, returns=returns, mask=mask)
    returns = returns.detach()
    unclipped = (values - returns) ** 2
    if clip_range_value is None:
        loss, clipfrac = 0.5 * unclipped, torch.zeros((), dtype=values.dtype)
    else:
        old = old_values.detach()
        # clip V itself: V_old + clamp(V - V_old, +-c) rounds V - V_old and so can return a
        # number one ulp away from an unclipped V, whose term then counts (and acts) as clipped
        v_clipped = torch.clamp(values, old - clip_range_value, old + clip_range_value)
        clipped = (v_clipped - returns) ** 2
        loss = 0.5 * torch.maximum(unclipped, clipped)
        clipfrac = masked_mean((clipped > unclipped).float(), mask)
    loss = zero_padding(loss, mask)
    return loss, {"value/clipfrac": clipfrac.detach()}
