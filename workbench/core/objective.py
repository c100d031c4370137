"""The per-token objective before aggregation: policy loss + in-loss KL - entropy bonus."""

from __future__ import annotations

import torch


def token_objective(
    policy_loss: torch.Tensor,
    *,
    kl: torch.Tensor | None = None,
    kl_coef: float = 0.0,
    entropy: torch.Tensor | None = None,
    entropy_coef: float = 0.0,
) -> torch.Tensor:
    """l_t = policy_loss_t + beta * kl_t - c_H * H_t. All (B, T) -> (B, T).

    The KL term here is the GRPO placement (``in_loss``); with ``in_reward`` it is already in the
    advantages and ``kl_coef`` here is 0. The entropy bonus (c_H > 0) pushes against entropy
    collapse; TRL and verl default it to 0.
    """
    out = policy_loss
    if kl is not None and kl_coef != 0.0:
        out = out + kl_coef * kl
    if entropy is not None and entropy_coef != 0.0:
        out = out - entropy_coef * entropy
    return out
