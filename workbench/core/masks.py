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
    """Off-policy sequence masking (slime's OPSM, ``--opsm-delta``; slime compute_opsm_mask).

        drift_i = sum_t (old_t - logp_t) m_t / max(n_i, 1),   A_i = sum_t A_t m_t / max(n_i, 1)
        keep_i  = not (A_i < 0 and drift_i > delta)

    Sequence i is masked when its advantage is negative AND its mean drift over valid tokens
    exceeds ``delta``: a negative update on a sequence the current policy already moved away
    from is the off-policy update most likely to hurt. ``old_logp`` is what the caller passes:
    the engine passes the trainer's own log-probs of the behaviour policy. TRL's variant is
    ``off_policy_sequence_mask`` (which log-probs, and the sign test per token).
    (B, T) inputs -> (B, T) mask (float, like ``mask``).
    """
    check_2d("logp", logp)
    check_like("logp", logp, old_logp=old_logp, advantages=advantages, mask=mask)
    drift = masked_mean((old_logp - logp).detach(), mask, dim=1)  # (B,)
    seq_adv = masked_mean(advantages, mask, dim=1)
    drop = (seq_adv < 0) & (drift > delta)
    return mask * (~drop).to(mask.dtype)[:, None]


def off_policy_sequence_mask(
    logp: torch.Tensor,
    sampling_logp: torch.Tensor,
    advantages: torch.Tensor,
    mask: torch.Tensor,
    threshold: float,
) -> torch.Tensor:
    """TRL's off-policy sequence mask (``off_policy_mask_threshold``; DeepSeek-V3.2, Eq. 9;
    TRL 1.16 ``GRPOTrainer.get_off_policy_mask``):

        kl_i   = sum_t (sampling_t - logp_t) m_t / max(n_i, 1)       (NaN sampling_t counts as 0)
        keep_t = A_t >= 0  or  kl_i <= threshold

    How it differs from slime's OPSM (``opsm_mask``), whose statistic is the same mean
    log-ratio and whose comparison is the same (drop when > threshold):
    - which log-probs: TRL compares with ``sampling_logp``, the rollout engine's log-probs when
      it reports them (vLLM), else the trainer's old log-probs; so on vLLM it also drops
      negative sequences that only the rollout/trainer mismatch made off-policy. The engine
      passes exactly that; OPSM always gets the trainer's old log-probs.
    - which tokens: TRL tests the sign of each token's advantage (its advantages are (B, 1) for
      GRPO, broadcast), OPSM the sign of the sequence's mean advantage and drops the whole
      sequence. With sequence-level advantages (every estimator but reinforce_pp / gae) the two
      agree; with token-level advantages TRL keeps the A_t >= 0 tokens of a dropped sequence.
    - a NaN log-prob from the engine counts as 0 drift here (TRL), where OPSM would propagate it.
    (B, T) inputs -> (B, T) mask (float, like ``mask``).
    """
    check_2d("logp", logp)
    check_like("logp", logp, sampling_logp=sampling_logp, advantages=advantages, mask=mask)
    drift = torch.nan_to_num(sampling_logp - logp.detach(), nan=0.0)
    kl = (drift * mask).sum(dim=1, keepdim=True) / mask.sum(dim=1, keepdim=True).clamp(min=1.0)  # (B, 1)
    keep = (advantages >= 0) | (kl <= threshold)
    return mask * keep.to(mask.dtype)


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
