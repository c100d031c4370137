"""Importance-sampling correction for the mismatch between the rollout engine and the trainer.

The rollout engine (vLLM, another precision, an older policy) samples from mu; the trainer
recomputes log-probs under pi_old for the same tokens. The two differ, so the policy gradient is
off-policy by w = pi_old / mu, and each token's loss is multiplied by a bounded w:

    level  token      w_t = exp(old_t - rollout_t)                               (B, T)
           sequence   w_i = exp(sum_t (old_t - rollout_t) m_t), on every token     (B, T)
    mode   truncate   w <- clamp(w, clip_min, clip_max)        TIS (truncated IS)
           mask       w <- 0 where w < clip_min or w > clip_max   MIS / IcePop (masked IS)

TRL ``vllm_importance_sampling_mode`` = "{level}_{mode}" with ``vllm_importance_sampling_clip_min``
(default None) / ``clip_max`` (3.0); verl ``rollout_is`` = token / sequence truncation from above
at ``rollout_is_threshold`` (2.0), i.e. clip_min=None; IcePop is token / mask with [0.5, 5];
OpenRLHF ``is_correction_type`` likewise. A bound of None is no bound. Log-ratios are clamped to
+-20 before exp (verl's SAFETY_BOUND; TRL does not clamp: the two agree unless a bound exceeds
e^20). Weights are detached (they scale the gradient, they are not differentiated) and 0 on padding.

verl's ``rollout_is_batch_normalize`` rescales the bounded weights to mean 1 over the batch
(``batch_normalize_is_weights``), and its rejection sampling ``rollout_rs`` drops tokens or whole
completions whose divergence between the two policies exceeds a threshold (``rejection_mask``,
one registered statistic per mode in ``REJECTIONS``).
"""

from __future__ import annotations

import math
from typing import Callable

import torch

from .choices import IS_LEVELS, IS_MODES, REJECTION_MODES  # noqa: F401 (REJECTION_MODES: the torch-free names)
from .masked import masked_mean, masked_sum, zero_padding
from .registry import Registry, check_choice
from .shapes import check_2d, check_like

IS_LOG_RATIO_CLAMP = 20.0


def rollout_correction(
    old_logp: torch.Tensor,
    rollout_logp: torch.Tensor,
    mask: torch.Tensor,
    *,
    level: str = "token",
    mode: str = "truncate",
    clip_min: float | None = None,
    clip_max: float | None = 3.0,
    batch_normalize: bool = False,
) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
    """IS weights (B, T) and TRL's metrics. old_logp: trainer log-probs of the sampled tokens
    (B, T); rollout_logp: the rollout engine's (B, T); mask (B, T).

    Metrics (TRL names): ``sampling/sampling_logp_difference/{mean,max}`` of |old - rollout| over
    valid tokens; ``sampling/importance_sampling_ratio/{min,mean,max}`` of the bounded weights,
    over valid tokens (token level) or over completions with a valid token (sequence level).
    Empty selections give 0. batch_normalize: rescale the bounded weights to mean 1
    (``batch_normalize_is_weights``, verl ``rollout_is_batch_normalize``); the ratio metrics are
    of the weights before it, as verl's, and its factor is logged as verl names it.
    """
    check_2d("old_logp", old_logp)
    check_like("old_logp", old_logp, rollout_logp=rollout_logp, mask=mask)
    check_choice("level", level, IS_LEVELS)
    check_choice("mode", mode, IS_MODES)
    if clip_min is not None and clip_max is not None and clip_min > clip_max:
        raise ValueError(f"clip_min={clip_min} must not exceed clip_max={clip_max}")
    diff = zero_padding((old_logp - rollout_logp).detach(), mask)
    if level == "sequence":
        log_w = masked_sum(diff, mask, dim=1)[:, None].expand_as(diff)
    else:
        log_w = diff
    w = torch.exp(log_w.clamp(-IS_LOG_RATIO_CLAMP, IS_LOG_RATIO_CLAMP))
    if mode == "truncate":
        w = w.clamp(min=clip_min, max=clip_max) if (clip_min, clip_max) != (None, None) else w  # no bounds: raw ratios
    else:
        low = w < clip_min if clip_min is not None else torch.zeros_like(w, dtype=torch.bool)
        high = w > clip_max if clip_max is not None else torch.zeros_like(w, dtype=torch.bool)
        w = w.masked_fill(low | high, 0.0)
    w = zero_padding(w, mask)
    valid = mask.bool()
    # sequence level: a row's valid tokens share its weight (>= 0) and padding is 0, so the row max is it
    ratios = w.amax(dim=1)[valid.any(dim=1)] if level == "sequence" else w[valid]
    metrics = {**_stats("sampling/sampling_logp_difference", diff.abs()[valid], ("mean", "max")),
               **_stats("sampling/importance_sampling_ratio", ratios, ("min", "mean", "max"))}
    if batch_normalize:
        w, metrics["rollout_corr/rollout_is_batch_norm_factor"] = batch_normalize_is_weights(w, mask, level)
    return w, metrics


def _stats(prefix: str, values: torch.Tensor, names: tuple[str, ...]) -> dict[str, torch.Tensor]:
    if values.numel() == 0:
        zero = torch.zeros((), dtype=values.dtype, device=values.device)
        return {f"{prefix}/{n}": zero for n in names}
    return {f"{prefix}/{n}": getattr(values, n)() for n in names}


# verl normalises only when the mean weight exceeds this (else the weights stay, factor 1).
BATCH_NORM_MIN_MEAN = 1e-8


def batch_normalize_is_weights(weights: torch.Tensor, mask: torch.Tensor, level: str) -> tuple[torch.Tensor, torch.Tensor]:
    """Weights (B, T) divided by their batch mean, and that mean (verl 0.9.1
    ``rollout_is_batch_normalize``): the mean over valid tokens (token level) or over completions
    with a valid token, one weight each (sequence level). Truncation biases the weights
    downwards; normalising restores an average step size of 1 (the direction is unchanged).
    A mean <= 1e-8 leaves them as they are, with factor 1. verl divides sums by count + 1e-8;
    here the means are exact (relative difference ~1e-8 / count)."""
    check_choice("level", level, IS_LEVELS)
    if level == "token":
        mean = masked_mean(weights, mask)
    else:
        rows = mask.sum(dim=1) > 0
        per_row = masked_sum(weights, mask, dim=1)[rows] / mask.sum(dim=1)[rows].to(weights.dtype)
        mean = per_row.mean() if per_row.numel() else torch.zeros((), dtype=weights.dtype, device=weights.device)
    if bool(mean > BATCH_NORM_MIN_MEAN):
        return weights / mean, mean
    return weights, torch.ones((), dtype=weights.dtype, device=weights.device)


# ---- rejection sampling (verl 0.9.1 rollout_rs) ---------------------------------------------------

# A statistic maps the clamped log-ratio l = old - rollout (B, T) and the mask to a per-token value
# (B, T): the token's own divergence, or its sequence's broadcast over the row.
RejectionStatistic = Callable[[torch.Tensor, torch.Tensor], torch.Tensor]
REJECTIONS: Registry[RejectionStatistic] = Registry("rollout rejection mode")

# Per-token divergence estimators of l = log(pi_old / pi_rollout), as verl's rollout_rs writes them.
_TOKEN_DIVERGENCE: dict[str, Callable[[torch.Tensor], torch.Tensor]] = {
    "k1": lambda l: -l,
    "k2": lambda l: 0.5 * l**2,
    "k3": lambda l: torch.exp(l) - 1.0 - l,
}


def _seq_max(values: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """Row max over valid tokens, 0 for a row without one (verl). (B, T) -> (B,)."""
    top = values.masked_fill(~mask.bool(), float("-inf")).max(dim=-1).values
    return torch.where(torch.isneginf(top), torch.zeros_like(top), top)


def _seq_mean(values: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    return masked_sum(values, mask, dim=1) / mask.sum(dim=1).clamp(min=1).to(values.dtype)


_LEVELS: dict[str, Callable[[torch.Tensor, torch.Tensor], torch.Tensor] | None] = {
    "token": None,
    "seq_sum": lambda v, m: masked_sum(v, m, dim=1),
    "seq_mean": _seq_mean,
    "seq_max": _seq_max,
}


def _register_rejection(level: str, k: str) -> None:
    divergence, reduce = _TOKEN_DIVERGENCE[k], _LEVELS[level]

    def statistic(log_ratio: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
        per_token = divergence(log_ratio)
        return per_token if reduce is None else reduce(per_token, mask)[:, None].expand_as(per_token)

    statistic.__name__ = f"rejection_{level}_{k}"
    statistic.__doc__ = f"{k} of log(pi_old / pi_rollout), {'per token' if reduce is None else level + ' over the row'}."
    REJECTIONS.register(f"{level}_{k}")(statistic)


for _mode in REJECTION_MODES:
    _register_rejection(*_mode.rsplit("_", 1))


def rejection_mask(
    old_logp: torch.Tensor,
    rollout_logp: torch.Tensor,
    mask: torch.Tensor,
    mode: str,
    *,
    upper: float,
    lower: float | None = None,
) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
    """verl 0.9.1's rollout rejection sampling (``rollout_rs`` = mode, ``rollout_rs_threshold``):
    the mask (B, T) with the rejected tokens set to 0, and verl's metrics for the mode.

    With l = clamp(old_logp - rollout_logp, +-20) per token and the divergences
    k1 = -l, k2 = l^2 / 2, k3 = e^l - 1 - l, the mode "{level}_{k}" takes k per token (token),
    or its sum / mean / max over the row's valid tokens (seq_sum / seq_mean / seq_max; a row
    without one gets 0) on every token of the row, and keeps

        k2, k3:  statistic <= upper                              (a hard trust region)
        k1:      log(lower) <= statistic <= log(upper),  lower = 1 / upper unless given

    (thresholds of k1 are ratios; of k2 / k3 divergences). Unlike an IS weight, rejection only
    removes tokens; chain several modes by multiplying their masks (verl's comma-separated
    ``rollout_rs`` keeps a token only if every mode keeps it). seq_mean divides by the exact count
    (verl by count + 1e-8: the two differ only for a statistic within ~1e-8 relative of a bound).

    Metrics (verl's names, prefixed ``rollout_corr/`` as verl logs them): ``rollout_rs_{mode}_mean``
    (mean statistic over valid tokens), ``..._masked_fraction`` (valid tokens rejected),
    ``..._seq_masked_fraction`` (completions with a valid token that lost any).
    """
    check_2d("old_logp", old_logp)
    check_like("old_logp", old_logp, rollout_logp=rollout_logp, mask=mask)
    statistic_fn = REJECTIONS.get(mode)
    bounds = _rejection_bounds(mode, upper, lower)
    log_ratio = (old_logp - rollout_logp).detach().clamp(-IS_LOG_RATIO_CLAMP, IS_LOG_RATIO_CLAMP)
    statistic = statistic_fn(log_ratio, mask)
    keep = statistic <= bounds[1]
    if bounds[0] is not None:
        keep = keep & (statistic >= bounds[0])
    valid = mask.bool()
    rejected = ~keep & valid
    rows = valid.any(dim=1)
    prefix = f"rollout_corr/rollout_rs_{mode}"
    metrics = {
        f"{prefix}_mean": masked_mean(statistic, mask),
        f"{prefix}_masked_fraction": masked_mean(rejected.to(log_ratio.dtype), mask),
        f"{prefix}_seq_masked_fraction": (rejected.any(dim=1)[rows].to(log_ratio.dtype).mean() if bool(rows.any())
                                          else torch.zeros((), dtype=log_ratio.dtype, device=mask.device)),
    }
    return mask * keep.to(mask.dtype), metrics


def _rejection_bounds(mode: str, upper: float, lower: float | None) -> tuple[float | None, float]:
    """(lower, upper) bounds on the statistic: log-ratios for k1 modes, divergences otherwise."""
    if not upper > 0:
        raise ValueError(f"rejection upper={upper} must be > 0")
    if not mode.endswith("k1"):
        if lower is not None:
            raise ValueError(f"rejection mode {mode!r} takes only an upper bound, got lower={lower}")
        return None, upper
    lower = 1.0 / upper if lower is None else lower
    if not 0 < lower <= upper:
        raise ValueError(f"rejection lower={lower} must be > 0 and <= upper={upper}")
    return math.log(lower), math.log(upper)
