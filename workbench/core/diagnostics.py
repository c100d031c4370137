"""Batch-level diagnostics with TRL's metric names."""

from __future__ import annotations

import torch

from .advantages import equal_groups
from .masked import masked_mean, masked_var


def reward_metrics(rewards: torch.Tensor, group_size: int) -> dict[str, torch.Tensor]:
    """``reward`` (mean), ``reward_std`` (mean over groups of the within-group std, as TRL logs
    it), ``frac_reward_zero_std`` (fraction of groups whose rewards are all equal: they carry no
    GRPO/RLOO learning signal). rewards: (B,) grouped contiguously by G.

    "All equal" is the estimators' exact test (``equal_groups``), not std ~ 0: float32 gives
    0.2 x 8 a std of 1.6e-8 from rounding, while a group with a real spread may have a smaller
    one; those groups' std is reported as the 0 it is."""
    grouped = rewards.view(-1, group_size).float()
    equal = equal_groups(grouped)[:, 0]
    if group_size > 1:
        std = grouped.std(dim=1).masked_fill(equal, 0.0)
    else:  # one completion per prompt: no spread (same device / dtype as the rewards)
        std = torch.zeros_like(grouped[:, 0])
    return {
        "reward": grouped.mean(),
        "reward_std": std.mean(),
        "frac_reward_zero_std": equal.float().mean(),
    }


def length_metrics(mask: torch.Tensor, truncated: torch.Tensor) -> dict[str, torch.Tensor]:
    """``completions/{mean,min,max}_length`` and ``completions/clipped_ratio`` (fraction cut at
    max length). mask (B, T), truncated (B,) bool."""
    lengths = mask.sum(dim=1).float()
    return {
        "completions/mean_length": lengths.mean(),
        "completions/min_length": lengths.min(),
        "completions/max_length": lengths.max(),
        "completions/clipped_ratio": truncated.float().mean(),
    }


def terminated_length_metrics(mask: torch.Tensor, truncated: torch.Tensor) -> dict[str, torch.Tensor]:
    """``completions/{mean,min,max}_terminated_length``: the lengths of the completions that ended
    with a stop token (not cut at max length), as TRL logs them; all 0 when none did (TRL's rule).
    mask (B, T), truncated (B,) bool."""
    lengths = mask.sum(dim=1).float()[~truncated.bool()]
    if lengths.numel() == 0:
        lengths = torch.zeros(1, device=mask.device)
    return {f"completions/{n}_terminated_length": getattr(lengths, n)() for n in ("mean", "min", "max")}


def reward_function_metrics(name: str, values: torch.Tensor) -> dict[str, torch.Tensor]:
    """``rewards/{name}/mean`` and ``rewards/{name}/std`` of one reward function's raw scores (B,),
    over the completions it scored (NaN = returned None, skipped), as TRL: the std is Bessel-
    corrected (TRL ``nanstd``); NaN when it scored none, std NaN when it scored one."""
    scored = values[~torch.isnan(values)].float()
    nan = torch.tensor(float("nan"))
    mean = scored.mean() if scored.numel() else nan
    std = scored.std() if scored.numel() > 1 else nan
    return {f"rewards/{name}/mean": mean, f"rewards/{name}/std": std}


def token_std_metric(values: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """Standard deviation over valid tokens (Bessel-corrected; 0 with fewer than 2), e.g.
    ``kl/token_std``: the spread of the per-token KL estimate behind its mean ``kl``."""
    return masked_var(values.detach().float(), mask).sqrt()


def token_mean_metric(values: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """Mean over valid tokens (for ``entropy``, ``kl`` ...). (B, T) -> scalar."""
    return masked_mean(values.detach().float(), mask)
