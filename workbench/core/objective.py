"""The whole objective a run optimises, from log-probs to the aggregated loss.

``policy_objective`` is the one place where every mask and weight of a run meets the policy loss;
the trainer differentiates it per micro-batch and the same-batch lens calls it for its reference
row, so the lens's g_run is the gradient the run stepped with. In order (each step is one core
function, named beside it):

    m      = loss_mask                                     (B, T) truncation- and rejection-masked by the caller
    m, w   = bypass_in_loss(sg(logp), old, m)              verl bypass mode: rejection / IS weights of the
                                                           CURRENT policy against old = the rollout's
    m      = opsm_mask(logp, old, A, m, delta)             slime OPSM (opsm_delta)
    m      = off_policy_sequence_mask(logp, s, A, m, eps)  TRL off-policy mask; s = rollout logp, else old
    l_t    = policy_loss(logp, old, A, m)_t                core.compute_policy_loss (the registered loss)
    l_t    = w_t * l_t                                     rollout-correction IS weights (TRL: on the policy loss)
    l_t    = k_t * l_t                                     top-entropy tokens k = 1[H_t >= tau] over loss_mask
    o_t    = l_t + beta * KL_t(logp, ref) - c_H * H_t      core.token_objective (in-loss KL, entropy bonus)
    L      = aggregate(o, m; num_tokens, num_seqs, max_len)

The caller's loss mask already lacks the completions cut at max length (mask_truncated) and the
tokens verl's rollout rejection sampling drops (core.rejection_mask, verl ``rollout_rs``): verl
takes those out of its response_mask, so they leave every denominator, the KL's included.
The normalisers stay those of the caller's loss mask, as TRL and verl count them:
OPSM, the off-policy mask, IS weights and top-entropy tokens narrow or weigh the loss without
changing its denominator. The KL and entropy terms are aggregated over the same mask m. TRL
multiplies only the policy term by its off-policy mask and keeps the KL on the dropped sequences'
tokens, so with off_policy_mask_threshold (or OPSM) and an in-loss KL the two differ on those
tokens (not changed here: the runs' numbers would move).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Callable

import torch

from .aggregation import aggregate_loss, batch_normalizers
from .choices import PolicyLossConfig
from .correction import rejection_mask, rollout_correction
from .diagnostics import token_mean_metric
from .kl import kl_per_token
from .masked import masked_mean
from .masks import high_entropy_mask, off_policy_sequence_mask, opsm_mask
from .policy_losses import PolicyDiagnostics, compute_policy_loss

#: (entropy (B, T), loss_mask (B, T)) -> the kept-token mask (B, T). The default is
#: ``high_entropy_mask`` over the tokens given; a data-parallel caller passes one that gathers
#: every rank's tokens first (TRL's threshold is over the global batch).
TopEntropyRule = Callable[[torch.Tensor, torch.Tensor], torch.Tensor]


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


@dataclass(frozen=True)
class ObjectiveConfig:
    """The algorithm settings the objective reads (the recipe's ``algorithm`` section).

    policy_loss: a registered policy loss; loss: its PolicyLossConfig. aggregation: a registered
    loss aggregation. opsm_delta / off_policy_mask_threshold: None = off. top_entropy_quantile:
    rho in [0, 1], 1 = every token. kl_estimator / kl_coef: the in-loss KL (kl_coef 0 = none;
    a run with the KL in the reward passes 0). The entropy coefficient is an argument of
    ``policy_objective``, not a setting: adaptive entropy control changes it per update.
    in_loss_correction / in_loss_rejection: verl's bypass mode (``compute_policy_loss_bypass_mode``),
    where old_logp IS the rollout engine's: ``core.rollout_correction`` / ``core.rejection_mask``
    keywords, applied per (micro-)batch to the current policy sg(logp) against old_logp (see
    ``bypass_in_loss``); None = off (a run without bypass applies its weights and rejection before
    the loss, against the recomputed old log-probs).
    """

    policy_loss: str = "clip"
    loss: PolicyLossConfig = field(default_factory=PolicyLossConfig)
    aggregation: str = "token-mean"
    opsm_delta: float | None = None
    off_policy_mask_threshold: float | None = None
    top_entropy_quantile: float = 1.0
    kl_estimator: str = "k3"
    kl_coef: float = 0.0
    in_loss_correction: dict | None = None
    in_loss_rejection: dict | None = None


@dataclass
class Objective:
    """What ``policy_objective`` returns.

    loss: the aggregated objective L (scalar, differentiable). loss_mask: m after OPSM and the
    off-policy mask (B, T). kept: the top-entropy mask (B, T) or None when off. diagnostics: the
    policy loss's (ratio, region, zero_grad, its metrics). metrics: scalar tensors, detached, in
    the order the run logs them: the policy loss's metrics, ``loss/policy`` (the aggregated
    policy term alone, without KL and entropy), ``entropy`` (mean over the completion mask) and,
    with top-entropy on, ``entropy/top_quantile_kept`` (its share of the loss tokens).
    """

    loss: torch.Tensor
    loss_mask: torch.Tensor
    kept: torch.Tensor | None
    diagnostics: PolicyDiagnostics
    metrics: dict[str, torch.Tensor]


def bypass_in_loss(current_logp: torch.Tensor, rollout_logp: torch.Tensor, loss_mask: torch.Tensor,
                   correction: dict | None, rejection: dict | None) -> tuple[torch.Tensor, torch.Tensor | None]:
    """verl's bypass-mode loss (``compute_policy_loss_bypass_mode`` -> ``compute_rollout_correction_and_rejection_mask``
    with the current log-probs as "old"): both from the same incoming mask, independently,

        w_t = IS weight of sg(pi_theta) / pi_rollout      (correction; None when off)
        m_t = loss_mask_t * keep_t(sg(pi_theta), pi_rollout)   (rejection; loss_mask when off)

    so the weights and the rejection follow the policy as it moves through the epochs. All (B, T);
    current_logp is detached by the caller. Returns (m, w)."""
    weights = None
    if correction is not None:
        weights, _ = rollout_correction(current_logp, rollout_logp, loss_mask, **correction)
    m = loss_mask
    if rejection is not None:
        m, _ = rejection_mask(current_logp, rollout_logp, loss_mask, **rejection)
    return m, weights


def policy_objective(
    logp: torch.Tensor,
    old_logp: torch.Tensor,
    advantages: torch.Tensor,
    loss_mask: torch.Tensor,
    completion_mask: torch.Tensor,
    cfg: ObjectiveConfig,
    *,
    num_tokens: float | torch.Tensor | None = None,
    num_seqs: float | torch.Tensor | None = None,
    max_len: int | None = None,
    entropy: torch.Tensor | None = None,
    entropy_coef: float = 0.0,
    rollout_logp: torch.Tensor | None = None,
    ref_logp: torch.Tensor | None = None,
    is_weights: torch.Tensor | None = None,
    top_entropy: TopEntropyRule | None = None,
) -> Objective:
    """The run's aggregated objective on one (micro-)batch (module docstring for the equation).

    logp (B, T): log pi_theta, differentiable. old_logp (B, T): the ratio's denominator (the
    caller's choice: the behaviour policy's, or logp.detach() for a single pass). advantages,
    loss_mask, completion_mask (B, T). num_tokens / num_seqs / max_len: the aggregation's
    normalisers (global counts when this is a micro-batch of a larger batch or one rank's share;
    None: this batch's own, batch_normalizers of the given loss and completion masks).
    entropy (B, T): per-token entropy (differentiable when entropy_coef > 0; needed for the bonus,
    top-entropy and the ``entropy`` metric). rollout_logp (B, T): the rollout engine's log-probs
    (the off-policy mask compares with them when given, else with old_logp). ref_logp (B, T): the
    reference's (in-loss KL when cfg.kl_coef != 0). is_weights (B, T): rollout-correction weights.
    top_entropy: the kept-token rule (default: high_entropy_mask over these tokens).
    """
    if cfg.top_entropy_quantile < 1.0 and entropy is None:
        raise ValueError(f"top_entropy_quantile={cfg.top_entropy_quantile} needs the per-token entropy: pass entropy=")
    if cfg.kl_coef != 0.0 and ref_logp is None:
        raise ValueError(f"kl_coef={cfg.kl_coef} (an in-loss KL) needs the reference log-probs: pass ref_logp=")
    m = loss_mask
    if cfg.in_loss_correction is not None or cfg.in_loss_rejection is not None:
        # verl computes its normalisers before the loss (global_batch_info), so rejected tokens stay in them
        m, in_loss_weights = bypass_in_loss(logp.detach(), old_logp, m, cfg.in_loss_correction, cfg.in_loss_rejection)
        is_weights = in_loss_weights if in_loss_weights is not None else is_weights
    if cfg.opsm_delta is not None:
        m = opsm_mask(logp, old_logp, advantages, m, cfg.opsm_delta)
    if cfg.off_policy_mask_threshold is not None:
        sampling = rollout_logp if rollout_logp is not None else old_logp
        m = off_policy_sequence_mask(logp, sampling, advantages, m, cfg.off_policy_mask_threshold)
    pg, diag = compute_policy_loss(cfg.policy_loss, logp, old_logp, advantages, m, cfg.loss)
    if is_weights is not None:
        pg = pg * is_weights
    kept = None
    if cfg.top_entropy_quantile < 1.0:
        rule = top_entropy or (lambda h, mask: high_entropy_mask(h.detach(), mask, cfg.top_entropy_quantile))
        kept = rule(entropy, loss_mask)
        pg = pg * kept
    kl = kl_per_token(cfg.kl_estimator, logp, ref_logp, completion_mask) if cfg.kl_coef != 0.0 else None
    objective = token_objective(pg, kl=kl, kl_coef=cfg.kl_coef if kl is not None else 0.0,
                                entropy=entropy, entropy_coef=entropy_coef)
    if num_tokens is None or num_seqs is None:
        own_tokens, own_seqs = batch_normalizers(loss_mask, completion_mask)
        num_tokens = own_tokens if num_tokens is None else num_tokens
        num_seqs = own_seqs if num_seqs is None else num_seqs
    norm = dict(max_len=max_len, num_tokens=num_tokens, num_seqs=num_seqs)
    loss = aggregate_loss(cfg.aggregation, objective, m, **norm)
    metrics = {k: v.detach() for k, v in diag.metrics.items()}
    metrics["loss/policy"] = aggregate_loss(cfg.aggregation, pg.detach(), m, **norm)
    if entropy is not None:
        metrics["entropy"] = token_mean_metric(entropy, completion_mask)  # detached inside
    if kept is not None:
        metrics["entropy/top_quantile_kept"] = masked_mean(kept, loss_mask)
    return Objective(loss, m, kept, diag, metrics)
