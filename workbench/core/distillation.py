"""On-policy distillation (OPD): the student's advantage shaped by the per-token reverse KL to a teacher.

The student pi_theta samples completions o; a teacher pi_T scores the same tokens. Per token

    d_t = log pi_theta(o_t) - log pi_T(o_t)          (one-sample reverse KL, KL(pi_theta || pi_T) = E_{o ~ pi_theta}[d])

and the advantage the policy loss sees is (lambda = coef, gamma = discount, A = the estimator's advantage)

    shaped (slime OPD, --opd-kl-coef):     A'_t = A_t - lambda * D_t
    only   (Thinking Machines, tinker):    A'_t =     - lambda * D_t      (the reward advantage dropped)
    with   D_t = sum_{k >= t} gamma^(k - t) d_k   (tinker kl_discount_factor; gamma = 0: D_t = d_t, slime)

so with a policy-gradient loss the student is pushed up on tokens the teacher finds likelier than it
does (d < 0) and down where it is more confident than the teacher (d > 0): minimising the reverse
KL, mode-seeking. The shaping is a constant of the loss (computed without gradient, like A).

Anchors, and where they differ (both: lambda = 1 by default, one-sample d, 0 on padding):
    slime  ``apply_opd_kl_to_advantages`` (megatron_utils/loss.py): A - opd_kl_coef * (logp - teacher_logp),
           after the estimator and *before* its optional advantage normalisation; no discount;
           logp is the trainer's recomputed log-prob; logs ``opd_reverse_kl`` (mean per sequence).
    tinker ``incorporate_kl_penalty`` (distillation/train_on_policy.py): A + discounted_future_sum(
           -kl_penalty_coef * mask * (logp - teacher_logp), kl_discount_factor); logp is the
           sampler's; the environments of its distillation recipes pay reward 0, so A = 0 ("only");
           logs ``teacher_kl`` (token mean over the batch).
Here: the trainer's log-probs (slime), after the estimator including any whitening (so lambda is
in nats per token whatever the estimator), and ``distill/reverse_kl`` is the token mean (tinker).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from .choices import DISTILL_MODES
from .masked import masked_mean, zero_padding
from .registry import Registry, check_choice
from .scan import reverse_discounted_cumsum
from .shapes import check_2d, check_like

#: Advantage shapings (one signature: advantages, student_logp, teacher_logp, mask, cfg -> (B, T)).
ADVANTAGE_SHAPINGS: Registry = Registry("advantage shaping")


@dataclass(frozen=True)
class DistillationConfig:
    """coef: lambda (slime opd_kl_coef, tinker kl_penalty_coef; both default 1.0). discount: gamma
    of the KL's future sum (tinker kl_discount_factor; 0 = per token, slime). mode: shaped / only."""

    coef: float = 1.0
    discount: float = 0.0
    mode: str = "shaped"

    def __post_init__(self) -> None:
        if not self.coef >= 0:
            raise ValueError(f"coef={self.coef} must be >= 0")
        if not 0 <= self.discount <= 1:
            raise ValueError(f"discount={self.discount} must be in [0, 1]")
        check_choice("mode", self.mode, DISTILL_MODES)


def reverse_kl_per_token(student_logp: torch.Tensor, teacher_logp: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """d_t = log pi_theta(o_t) - log pi_T(o_t), 0 on padding. (B, T) each -> (B, T), detached."""
    check_2d("student_logp", student_logp)
    check_like("student_logp", student_logp, teacher_logp=teacher_logp, mask=mask)
    return zero_padding(student_logp.detach() - teacher_logp.detach(), mask)


@ADVANTAGE_SHAPINGS.register("opd")
def opd_advantages(advantages: torch.Tensor, student_logp: torch.Tensor, teacher_logp: torch.Tensor,
                   mask: torch.Tensor, cfg: DistillationConfig) -> torch.Tensor:
    """A'_t = [mode = shaped] A_t - coef * sum_{k >= t} discount^(k - t) d_k on mask tokens, 0 off them.

    d_t = student_logp - teacher_logp (reverse_kl_per_token); discount 0 gives slime's per-token
    A_t - coef * d_t. advantages, student_logp, teacher_logp, mask: (B, T) -> (B, T), detached.
    """
    d = reverse_kl_per_token(student_logp, teacher_logp, mask)
    check_like("student_logp", d, advantages=advantages)
    penalty = reverse_discounted_cumsum(d, cfg.discount, mask) if cfg.discount > 0 else d
    base = advantages.detach() if cfg.mode == "shaped" else torch.zeros_like(d)
    return zero_padding(base - cfg.coef * penalty, mask)


def shape_advantages(name: str, advantages: torch.Tensor, student_logp: torch.Tensor, teacher_logp: torch.Tensor,
                     mask: torch.Tensor, cfg: DistillationConfig) -> torch.Tensor:
    """The registered shaping ``name`` (e.g. 'opd'). (B, T) each -> (B, T)."""
    return ADVANTAGE_SHAPINGS.get(name)(advantages, student_logp, teacher_logp, mask, cfg)


def distillation_metrics(student_logp: torch.Tensor, teacher_logp: torch.Tensor, mask: torch.Tensor) -> dict[str, torch.Tensor]:
    """``distill/reverse_kl``: token mean of d_t over the batch (tinker teacher_kl; an unbiased
    estimate of the per-token reverse KL on the student's samples, one draw can be < 0);
    ``distill/teacher_logp``: token mean of log pi_T(o_t), how likely the teacher finds the
    student's tokens. (B, T) each -> scalars."""
    d = reverse_kl_per_token(student_logp, teacher_logp, mask)
    return {"distill/reverse_kl": masked_mean(d, mask), "distill/teacher_logp": masked_mean(teacher_logp.detach(), mask)}
