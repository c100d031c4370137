"""Advantage estimators. One contract for all of them:

    fn(rewards (B,), mask (B, T), cfg: AdvantageConfig, *, kl (B, T) | None, values (B, T) | None)
        -> Advantages(advantages (B, T), returns (B, T))

B = number of completions, grouped contiguously by prompt in groups of ``cfg.group_size`` (G).
Sequence-level estimators broadcast one scalar per completion over its valid tokens; token-level
ones (REINFORCE++, GAE) give each token its own value. Padding is always 0.

``kl`` is the per-token KL estimate, used only when ``cfg.kl_coef`` (the *in-reward* KL
coefficient) is non-zero: sequence estimators shape r_i <- r_i - kl_coef * sum_t kl_it, token
estimators put -kl_coef * kl_t on every token (see ``kl.py``).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable, NamedTuple

import torch

from .masked import last_valid_index, masked_sum, masked_whiten, zero_padding
from .registry import Registry, check_choice
from .scan import next_valid_value, reverse_discounted_cumsum
from .shapes import ShapeError, check_2d, check_like, check_sequence_vector


@dataclass(frozen=True)
class AdvantageConfig:
    """Settings shared by the advantage estimators (each reads the ones it needs).

    group_size: G, completions per prompt (contiguous). Group baselines need G >= 2; a group of
        one gets advantage 0 (no baseline can be formed without using its own reward).
    scale: ``grpo`` only. ``group`` divides by the group's std (DeepSeekMath GRPO); ``batch``
        by the std of all rewards in the batch (TRL ``scale_rewards="batch"``, more robust when
        many groups have near-zero std); ``none`` keeps r - mean (Dr. GRPO, Liu et al. 2025,
        which removes the bias towards groups that are nearly all-right or all-wrong).
    eps: added to the std. TRL uses 1e-4, verl 1e-6; the difference matters only for groups
        whose std is near zero.
    gamma, lam: discount and GAE lambda (token-level estimators). LM RL uses gamma = 1.
    kl_coef: in-reward KL coefficient (0 when the KL goes in the loss, or is off).
    whiten: normalise the final advantages over all valid tokens of the batch (masked
        mean/var). PPO implementations do this for GAE; it changes the effective step size.
    """

    group_size: int = 1
    scale: str = "group"
    eps: float = 1e-6
    gamma: float = 1.0
    lam: float = 1.0
    kl_coef: float = 0.0
    whiten: bool = False


class Advantages(NamedTuple):
    advantages: torch.Tensor  # (B, T)
    returns: torch.Tensor  # (B, T): value targets for GAE, = advantages otherwise


AdvantageFn = Callable[..., Advantages]
ADVANTAGE_ESTIMATORS: Registry[AdvantageFn] = Registry("advantage estimator")
GRPO_SCALES: tuple[str, ...] = ("group", "batch", "none")
TOKEN_LEVEL_ESTIMATORS: frozenset[str] = frozenset({"reinforce_pp", "reinforce_pp_baseline", "gae"})
# Estimators whose baseline is the other completions of the prompt's group: they need G >= 2.
GROUP_ESTIMATORS: frozenset[str] = frozenset({"grpo", "rloo", "reinforce_pp_baseline"})
# Estimators that read a critic's values (B, T).
CRITIC_ESTIMATORS: frozenset[str] = frozenset({"gae"})


# ---------------------------------------------------------------------------------------------
# reward shaping helpers


def kl_shaped_sequence_rewards(rewards, mask, kl, kl_coef: float) -> torch.Tensor:
    """r_i - kl_coef * sum_t kl_it m_it. rewards (B,), mask/kl (B, T) -> (B,)."""
    if kl_coef == 0.0 or kl is None:
        return rewards
    return rewards - kl_coef * masked_sum(kl, mask, dim=1)


def token_level_rewards(rewards, mask, kl=None, kl_coef: float = 0.0) -> torch.Tensor:
    """Per-token rewards: -kl_coef * kl_t on valid tokens, plus r_i on the last valid token.

    rewards (B,), mask (B, T), kl (B, T) | None -> (B, T). Rows without valid tokens get nothing.
    """
    B, T = mask.shape
    out = torch.zeros(B, T, dtype=rewards.dtype, device=rewards.device)
    if kl is not None and kl_coef != 0.0:
        out = zero_padding(-kl_coef * kl.to(rewards.dtype), mask)
    last = last_valid_index(mask)
    rows = torch.nonzero(last >= 0).squeeze(1)
    out[rows, last[rows]] += rewards[rows]
    return out


def _broadcast(scores: torch.Tensor, mask: torch.Tensor) -> Advantages:
    """(B,) sequence scores -> (B, T) on valid tokens."""
    adv = scores[:, None] * mask.to(scores.dtype)
    return Advantages(adv, adv)


def _groups(x: torch.Tensor, group_size: int) -> torch.Tensor:
    """(B,) -> (B/G, G)."""
    return x.view(-1, group_size)


# ---------------------------------------------------------------------------------------------
# GRPO's std choices: each maps grouped rewards (N, G) and all rewards (B,) to a std (N, 1) or None.


def _group_std(grouped: torch.Tensor, flat: torch.Tensor) -> torch.Tensor:
    if grouped.shape[1] < 2:
        return torch.zeros(grouped.shape[0], 1, dtype=grouped.dtype, device=grouped.device)
    return grouped.std(dim=1, keepdim=True)  # unbiased (Bessel), as TRL and verl


def _batch_std(grouped: torch.Tensor, flat: torch.Tensor) -> torch.Tensor:
    std = flat.std() if flat.numel() > 1 else torch.zeros((), dtype=flat.dtype, device=flat.device)
    return std.expand(grouped.shape[0], 1)


_GRPO_STD: dict[str, Callable[[torch.Tensor, torch.Tensor], torch.Tensor | None]] = {
    "group": _group_std,
    "batch": _batch_std,
    "none": lambda grouped, flat: None,
}


@ADVANTAGE_ESTIMATORS.register("grpo")
def grpo_advantages(rewards, mask, cfg: AdvantageConfig, *, kl=None, values=None) -> Advantages:
    """GRPO (Shao et al. 2024): A_i = (r_i - mean_g) / (std_g + eps); ``scale`` picks the std.

    scale="none" is Dr. GRPO's A_i = r_i - mean_g.
    """
    r = kl_shaped_sequence_rewards(rewards, mask, kl, cfg.kl_coef)
    grouped = _groups(r, cfg.group_size)
    centered = grouped - grouped.mean(dim=1, keepdim=True)
    std = _GRPO_STD[check_choice("scale", cfg.scale, GRPO_SCALES)](grouped, r)
    scores = centered if std is None else centered / (std + cfg.eps)
    return _broadcast(scores.reshape(-1), mask)


@ADVANTAGE_ESTIMATORS.register("rloo")
def rloo_advantages(rewards, mask, cfg: AdvantageConfig, *, kl=None, values=None) -> Advantages:
    """RLOO (Kool et al. 2019; Ahmadian et al. 2024): A_i = r_i - (sum_g r - r_i) / (G - 1).

    Equals G / (G - 1) * (r_i - mean_g). A group of one has no leave-one-out baseline: A = 0.
    """
    r = kl_shaped_sequence_rewards(rewards, mask, kl, cfg.kl_coef)
    G = cfg.group_size
    grouped = _groups(r, G)
    if G < 2:
        return _broadcast(torch.zeros_like(r), mask)
    baseline = (grouped.sum(dim=1, keepdim=True) - grouped) / (G - 1)
    return _broadcast((grouped - baseline).reshape(-1), mask)


@ADVANTAGE_ESTIMATORS.register("reinforce")
def reinforce_advantages(rewards, mask, cfg: AdvantageConfig, *, kl=None, values=None) -> Advantages:
    """REINFORCE with a batch-mean baseline (Williams 1992): A_i = r_i - mean over the batch."""
    r = kl_shaped_sequence_rewards(rewards, mask, kl, cfg.kl_coef)
    return _broadcast(r - r.mean(), mask)


def _reinforce_pp_from_sequence_rewards(r, mask, cfg: AdvantageConfig, kl) -> Advantages:
    token_rewards = token_level_rewards(r, mask, kl, cfg.kl_coef)
    returns = reverse_discounted_cumsum(token_rewards, cfg.gamma, mask)  # G_t = r_t + gamma G_{t+1}
    return Advantages(masked_whiten(returns, mask, shift_mean=True), returns)


@ADVANTAGE_ESTIMATORS.register("reinforce_pp")
def reinforce_pp_advantages(rewards, mask, cfg: AdvantageConfig, *, kl=None, values=None) -> Advantages:
    """REINFORCE++ (Hu 2025), token level: returns-to-go of the token rewards
    (-kl_coef kl_t, plus r_i on the last token), whitened over all valid tokens of the batch.
    """
    return _reinforce_pp_from_sequence_rewards(rewards, mask, cfg, kl)


@ADVANTAGE_ESTIMATORS.register("reinforce_pp_baseline")
def reinforce_pp_baseline_advantages(rewards, mask, cfg: AdvantageConfig, *, kl=None, values=None) -> Advantages:
    """REINFORCE++-baseline: subtract the group-mean reward, then as ``reinforce_pp``.

    (verl's version whitens sequence scores that include the summed KL; with gamma = 1 and no
    KL the two agree.)
    """
    grouped = _groups(rewards, cfg.group_size)
    centered = (grouped - grouped.mean(dim=1, keepdim=True)).reshape(-1)
    return _reinforce_pp_from_sequence_rewards(centered, mask, cfg, kl)


@ADVANTAGE_ESTIMATORS.register("gae")
def gae_advantages(rewards, mask, cfg: AdvantageConfig, *, kl=None, values=None) -> Advantages:
    """GAE (Schulman et al. 2016) for PPO, per token:

        delta_t = r_t + gamma V_{t+1} - V_t        (V after the last valid token = 0)
        A_t     = sum_l (gamma lambda)^l delta_{t+l}
        returns = A + V                             (the critic's targets)

    r_t = -kl_coef kl_t, plus the scalar reward on the last valid token.
    """
    if values is None:
        raise ValueError("advantage estimator 'gae' needs values (B, T) from a critic")
    token_rewards = token_level_rewards(rewards, mask, kl, cfg.kl_coef)
    v = zero_padding(values.to(token_rewards.dtype), mask)
    delta = token_rewards + cfg.gamma * next_valid_value(v, mask) - v
    adv = reverse_discounted_cumsum(delta, cfg.gamma * cfg.lam, mask)
    returns = zero_padding(adv + v, mask)
    return Advantages(adv, returns)


# ---------------------------------------------------------------------------------------------


def compute_advantages(
    estimator: str,
    rewards: torch.Tensor,
    mask: torch.Tensor,
    cfg: AdvantageConfig = AdvantageConfig(),
    *,
    kl: torch.Tensor | None = None,
    values: torch.Tensor | None = None,
) -> Advantages:
    """Validate inputs, run the registered estimator, optionally whiten. See module docstring."""
    fn = ADVANTAGE_ESTIMATORS.get(estimator)
    B, _ = check_2d("mask", mask)
    check_sequence_vector("rewards", rewards, B)
    check_like("mask", mask, kl=kl, values=values)
    if cfg.group_size < 1 or B % cfg.group_size != 0:
        raise ShapeError(f"group_size={cfg.group_size} must be >= 1 and divide the batch size B={B}")
    if cfg.kl_coef != 0.0 and kl is None:
        raise ValueError(f"kl_coef={cfg.kl_coef} puts the KL in the reward, so kl (B, T) is required")
    rewards = rewards.to(torch.promote_types(rewards.dtype, torch.float32))
    out = fn(rewards, mask, cfg, kl=kl, values=values)
    if cfg.whiten:
        out = Advantages(masked_whiten(out.advantages, mask, shift_mean=True), out.returns)
    return out
