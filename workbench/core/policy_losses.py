"""Policy losses. One contract for all of them:

    fn(logp (B, T), old_logp (B, T), advantages (B, T), mask (B, T), cfg: PolicyLossConfig)
        -> (loss_per_token (B, T), PolicyDiagnostics)

``loss_per_token`` is to be *minimised* and is not yet aggregated (see ``aggregation.py``);
padding positions are 0. ``old_logp`` is detached by the caller; with a single gradient step
per batch pass ``logp.detach()``: then rho = 1 but d rho = d logp, so the gradient is the
on-policy policy gradient.

Diagnostics use TRL's metric names (``clip_ratio/low_mean`` ...) and label every token with the
PPO region it fell in and whether its gradient is exactly zero.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Callable

import torch

from .masked import masked_mean, masked_sum, zero_padding
from .registry import Registry, check_choice
from .shapes import check_2d, check_like

# Log-ratios are clamped before exp (verl does the same) so a single token cannot overflow.
LOG_RATIO_CLAMP = 20.0

REGION_NAMES: tuple[str, ...] = ("trust", "clipped_high", "clipped_low", "dual_clipped")
TRUST, CLIPPED_HIGH, CLIPPED_LOW, DUAL_CLIPPED = range(4)
PADDING = -1  # region code of masked positions

GSPO_VARIANTS: tuple[str, ...] = ("sequence", "token")
CISPO_BOUNDS: tuple[str, ...] = ("relative", "absolute")
REINFORCE_FORMS: tuple[str, ...] = ("logp", "ratio")


@dataclass(frozen=True)
class PolicyLossConfig:
    """Settings of the policy losses (each loss reads the ones it needs).

    eps_low, eps_high: the trust region [1 - eps_low, 1 + eps_high] of the ratio (PPO,
        Schulman et al. 2017: 0.2/0.2). DAPO's clip-higher (Yu et al. 2025) raises eps_high to
        0.28 so low-probability tokens can grow, against entropy collapse. GSPO works on a
        sequence ratio and uses tiny values (3e-4 / 4e-4). CISPO bounds its weight with them.
    clip_c: dual clip (Ye et al. 2020, verl ``clip_ratio_c``, e.g. 3.0): for A < 0 the loss is
        capped at -c A, so a token whose ratio exploded cannot produce an unbounded update.
        None = off. Must exceed 1 + eps_high.
    delta: TRL's two-sided clipping (``delta``): the ratio in the unclipped term is capped at
        delta. With delta = c its forward values equal verl's dual clip. None = off.
    gspo_variant: ``sequence`` (GSPO paper, Zheng et al. 2025: one ratio s_i per sequence, its
        gradient spread over all tokens) or ``token`` (verl's GSPO-token: same forward value,
        log s_it = sg(log s_i) + logp_t - sg(logp_t), per-token gradient).
    cispo_bounds: CISPO (MiniMax-M1, 2025) weight bounds. ``relative`` clips the ratio to
        [1 - eps_low, 1 + eps_high] (verl); ``absolute`` caps it at eps_high with no lower bound
        (TRL, where epsilon_high ~ 5).
    reinforce_form: vanilla policy gradient as -A logp (``logp``) or -A rho with rho from a
        stop-grad old policy (``ratio``); same gradient on-policy, different loss values.
    """

    eps_low: float = 0.2
    eps_high: float = 0.2
    clip_c: float | None = None
    delta: float | None = None
    gspo_variant: str = "sequence"
    cispo_bounds: str = "relative"
    reinforce_form: str = "logp"

    def __post_init__(self) -> None:
        if self.eps_low < 0 or self.eps_high < 0:
            raise ValueError(f"eps_low={self.eps_low}, eps_high={self.eps_high}: both must be >= 0")
        for name, cap in (("clip_c", self.clip_c), ("delta", self.delta)):
            if cap is not None and cap <= 1.0 + self.eps_high:
                raise ValueError(f"{name}={cap} must be greater than 1 + eps_high = {1.0 + self.eps_high}")
        check_choice("gspo_variant", self.gspo_variant, GSPO_VARIANTS)
        check_choice("cispo_bounds", self.cispo_bounds, CISPO_BOUNDS)
        check_choice("reinforce_form", self.reinforce_form, REINFORCE_FORMS)


@dataclass
class PolicyDiagnostics:
    """What a policy loss reports besides its value.

    metrics: scalar tensors under TRL's names (``clip_ratio/low_mean``, ``approx_kl`` ...).
    ratio: (B, T) the ratio the loss used (sequence ratio broadcast for GSPO), detached.
    region: (B, T) int64 codes into REGION_NAMES, PADDING on masked positions.
    zero_grad: (B, T) bool, True where the token's gradient is exactly zero (and on padding).
    """

    metrics: dict[str, torch.Tensor] = field(default_factory=dict)
    ratio: torch.Tensor | None = None
    region: torch.Tensor | None = None
    zero_grad: torch.Tensor | None = None


PolicyLossFn = Callable[..., tuple[torch.Tensor, PolicyDiagnostics]]
POLICY_LOSSES: Registry[PolicyLossFn] = Registry("policy loss")


def safe_exp(log_ratio: torch.Tensor) -> torch.Tensor:
    return torch.exp(log_ratio.clamp(-LOG_RATIO_CLAMP, LOG_RATIO_CLAMP))


def approx_kl(logp: torch.Tensor, old_logp: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """0.5 * mean over valid tokens of (logp - old_logp)^2 (PPO's usual drift diagnostic)."""
    return masked_mean(0.5 * (logp - old_logp).detach() ** 2, mask)


def dual_clip_cap(cfg: PolicyLossConfig) -> float | None:
    """The ratio above which a negative-advantage token is capped (dual clip or TRL's delta)."""
    caps = [c for c in (cfg.clip_c, cfg.delta) if c is not None]
    return min(caps) if caps else None


def ppo_regions(ratio: torch.Tensor, advantages: torch.Tensor, mask: torch.Tensor, cfg: PolicyLossConfig):
    """Label each token with its PPO region and whether its gradient is zero.

    The six cases of the clipped objective (RLHF book, policy-gradient chapter):
        A > 0: rho < 1 + eps_high -> trust (gradient flows); rho > 1 + eps_high -> clipped_high (0)
        A < 0: rho > 1 - eps_low  -> trust;                  rho < 1 - eps_low  -> clipped_low (0)
        A < 0 with dual clip/delta: rho > cap -> dual_clipped (0)
        A = 0: trust, gradient 0.
    ratio, advantages, mask: (B, T) -> region (B, T) int64, zero_grad (B, T) bool.
    """
    pos, neg = advantages > 0, advantages < 0
    high = pos & (ratio > 1.0 + cfg.eps_high)
    low = neg & (ratio < 1.0 - cfg.eps_low)
    cap = dual_clip_cap(cfg)
    dual = neg & (ratio > cap) if cap is not None else torch.zeros_like(high)
    # the three clipped cases are mutually exclusive, so the codes can simply be added
    region = _label(high, low, dual, mask)
    zero_grad = high | low | dual | (advantages == 0) | ~mask.bool()
    return region, zero_grad


def _label(high: torch.Tensor, low: torch.Tensor, dual: torch.Tensor | None, mask: torch.Tensor) -> torch.Tensor:
    """Region codes from disjoint boolean masks (B, T); PADDING where mask is 0."""
    region = CLIPPED_HIGH * high.to(torch.int64) + CLIPPED_LOW * low.to(torch.int64)
    if dual is not None:
        region = region + DUAL_CLIPPED * dual.to(torch.int64)
    return region.masked_fill(~mask.bool(), PADDING)


def _region_metrics(region: torch.Tensor, mask: torch.Tensor) -> dict[str, torch.Tensor]:
    """TRL's clip fractions over valid tokens, from the region labels."""
    low = masked_mean((region == CLIPPED_LOW).float(), mask)
    high = masked_mean((region == CLIPPED_HIGH).float(), mask)
    return {
        "clip_ratio/low_mean": low,
        "clip_ratio/high_mean": high,
        "clip_ratio/region_mean": low + high,
        "clip_ratio/dual_mean": masked_mean((region == DUAL_CLIPPED).float(), mask),
    }


def clipped_objective(ratio: torch.Tensor, advantages: torch.Tensor, cfg: PolicyLossConfig) -> torch.Tensor:
    """Per-token PPO loss  -min(rho A, clip(rho, 1-eps_low, 1+eps_high) A), with the dual clip
    min(., -c A) for A < 0 (verl) and TRL's cap of rho at delta in the unclipped term.
    (B, T) -> (B, T)."""
    clipped = ratio.clamp(1.0 - cfg.eps_low, 1.0 + cfg.eps_high)
    unclipped = ratio if cfg.delta is None else ratio.clamp(max=cfg.delta)
    loss = -torch.minimum(unclipped * advantages, clipped * advantages)
    if cfg.clip_c is not None:
        loss = torch.where(advantages < 0, torch.minimum(loss, -cfg.clip_c * advantages), loss)
    return loss


def _finish(loss, ratio, advantages, mask, cfg, logp, old_logp, extra=None) -> tuple[torch.Tensor, PolicyDiagnostics]:
    region, zero_grad = ppo_regions(ratio.detach(), advantages, mask, cfg)
    metrics = {**_region_metrics(region, mask), "approx_kl": approx_kl(logp, old_logp, mask), **(extra or {})}
    return zero_padding(loss, mask), PolicyDiagnostics(metrics, ratio.detach(), region, zero_grad)


@POLICY_LOSSES.register("clip")
def clip_policy_loss(logp, old_logp, advantages, mask, cfg: PolicyLossConfig):
    """PPO / GRPO / DAPO token-level clipped surrogate with rho_t = exp(logp_t - old_t)."""
    ratio = safe_exp(logp - old_logp)
    return _finish(clipped_objective(ratio, advantages, cfg), ratio, advantages, mask, cfg, logp, old_logp)


def sequence_log_ratio(logp, old_logp, mask) -> torch.Tensor:
    """GSPO's log s_i = sum_t (logp - old) m / n_i: the log of the length-normalised geometric
    mean of the token ratios. (B, T) -> (B,)."""
    return masked_sum(logp - old_logp, mask, dim=1) / mask.sum(dim=1).clamp(min=1).to(logp.dtype)


@POLICY_LOSSES.register("gspo")
def gspo_policy_loss(logp, old_logp, advantages, mask, cfg: PolicyLossConfig):
    """GSPO (Zheng et al. 2025): the clipped objective on the sequence ratio s_i, the same on
    every token of sequence i. Clip fractions are fractions of *sequences*."""
    log_s = sequence_log_ratio(logp, old_logp, mask)[:, None]
    if cfg.gspo_variant == "token":  # verl: sg(log s_i) + logp - sg(logp)
        log_s = log_s.detach() + logp - logp.detach()
    else:
        log_s = log_s.expand_as(logp)
    ratio = safe_exp(log_s)
    loss, diag = _finish(clipped_objective(ratio, advantages, cfg), ratio, advantages, mask, cfg, logp, old_logp)
    # With sequence-level advantages every valid token of a sequence shares its region (a
    # clipped sequence passes no gradient to any token), so report fractions of sequences; with
    # token-level advantages the most-clipped label of the row stands for the sequence.
    seq_mask = (mask.sum(dim=1, keepdim=True) > 0).to(mask.dtype)
    seq_region = diag.region.max(dim=1, keepdim=True).values
    diag.metrics.update(_region_metrics(torch.where(seq_mask.bool(), seq_region, PADDING), seq_mask))
    return loss, diag


@POLICY_LOSSES.register("cispo")
def cispo_policy_loss(logp, old_logp, advantages, mask, cfg: PolicyLossConfig):
    """CISPO (MiniMax-M1, 2025): -sg(clip(rho)) A logp. The importance weight is clipped and
    detached, so every token keeps a gradient -w A d logp; clipping never zeroes it.

    Regions describe the *weight* with the signs of ESTIMATORS.md (and TRL, which counts CISPO
    clipping for A > 0): clipped_high = weight at the upper bound and A > 0, clipped_low = at the
    lower bound and A < 0, so ``clip_ratio/{high,low}_mean`` mean what they mean for ``clip``.
    ``cispo/clip_ratio`` counts every clipped weight whatever the sign of A.
    """
    ratio = safe_exp(logp - old_logp)
    if cfg.cispo_bounds == "relative":
        low, high = 1.0 - cfg.eps_low, 1.0 + cfg.eps_high
    else:  # TRL: absolute cap eps_high, no lower bound
        low, high = 0.0, cfg.eps_high
    weight = ratio.detach().clamp(low, high)
    loss = zero_padding(-weight * advantages * logp, mask)
    above, below = ratio.detach() > high, ratio.detach() < low
    region = _label(above & (advantages > 0), below & (advantages < 0), None, mask)
    zero_grad = (advantages == 0) | ~mask.bool()
    metrics = {
        **_region_metrics(region, mask),
        "cispo/clip_ratio": masked_mean((above | below).float(), mask),
        "approx_kl": approx_kl(logp, old_logp, mask),
    }
    return loss, PolicyDiagnostics(metrics, ratio.detach(), region, zero_grad)


@POLICY_LOSSES.register("reinforce")
def reinforce_policy_loss(logp, old_logp, advantages, mask, cfg: PolicyLossConfig):
    """Vanilla policy gradient (Williams 1992), no clipping: -A logp, or -A rho (``ratio`` form)."""
    ratio = safe_exp(logp - old_logp)
    surrogate = logp if cfg.reinforce_form == "logp" else ratio
    loss = zero_padding(-advantages * surrogate, mask)
    nothing = torch.zeros_like(mask, dtype=torch.bool)
    region = _label(nothing, nothing, None, mask)
    metrics = {**_region_metrics(region, mask), "approx_kl": approx_kl(logp, old_logp, mask)}
    return loss, PolicyDiagnostics(metrics, ratio.detach(), region, (advantages == 0) | ~mask.bool())


def compute_policy_loss(
    name: str,
    logp: torch.Tensor,
    old_logp: torch.Tensor,
    advantages: torch.Tensor,
    mask: torch.Tensor,
    cfg: PolicyLossConfig = PolicyLossConfig(),
) -> tuple[torch.Tensor, PolicyDiagnostics]:
    """Validate shapes and run the registered policy loss ``name``."""
    fn = POLICY_LOSSES.get(name)
    check_2d("logp", logp)
    check_like("logp", logp, old_logp=old_logp, advantages=advantages, mask=mask)
    return fn(logp, old_logp.detach(), advantages.detach(), mask, cfg)
