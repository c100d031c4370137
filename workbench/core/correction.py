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
"""

from __future__ import annotations

import torch

from .choices import IS_LEVELS, IS_MODES
from .masked import masked_sum, zero_padding
from .registry import check_choice
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
) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
    """IS weights (B, T) and TRL's metrics. old_logp: trainer log-probs of the sampled tokens
    (B, T); rollout_logp: the rollout engine's (B, T); mask (B, T).

    Metrics (TRL names): ``sampling/sampling_logp_difference/{mean,max}`` of |old - rollout| over
    valid tokens; ``sampling/importance_sampling_ratio/{min,mean,max}`` of the bounded weights,
    over valid tokens (token level) or over completions with a valid token (sequence level).
    Empty selections give 0.
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
    return w, {**_stats("sampling/sampling_logp_difference", diff.abs()[valid], ("mean", "max")),
               **_stats("sampling/importance_sampling_ratio", ratios, ("min", "mean", "max"))}


def _stats(prefix: str, values: torch.Tensor, names: tuple[str, ...]) -> dict[str, torch.Tensor]:
    if values.numel() == 0:
        zero = torch.zeros((), dtype=values.dtype, device=values.device)
        return {f"{prefix}/{n}": zero for n in names}
    return {f"{prefix}/{n}": getattr(values, n)() for n in names}
