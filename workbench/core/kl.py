"""KL(pi || ref) estimators per token, and where the KL term goes.

With d = ref_logp - logp on tokens sampled from pi (Schulman, "Approximating KL divergence", 2020):

    k1 = -d                      unbiased, high variance, can be negative
    k2 = d^2 / 2                 biased, low variance (its gradient is the KL's gradient)
    k3 = exp(d) - d - 1          unbiased, low variance, always >= 0 ("low_var_kl" in verl);
                                 the +-10 clamp (as verl) biases it when |k3| would exceed 10
    abs = |d|                    verl "abs": biased, >= 0

Straight-through forms (verl 0.9.1 ``kl_penalty`` with a trailing "+": "k1+" = verl "kl+",
"k3+" = "low_var_kl+", "abs+"): the value of the named estimator, the gradient of k2,

    x+ = k2 - sg(k2) + sg(x)

because k1 and k3 are unbiased for the KL's *value* but their expected gradient is not the KL's
gradient (E[d k1] = 0; d k3 = 1 - exp(d) pulls the wrong amount), while k2's gradient is
(logp - ref) d logp, whose expectation is the KL's gradient. The forms differ from their base
only in the loss (kl_placement in_loss); in the reward the KL is a detached number.

Placements:
    in_reward  RLOO / PPO / REINFORCE++: the reward is shaped before advantages are computed
               (sequence estimators: r_i - beta * sum_t kl_it; token estimators: -beta * kl_t per token)
    in_loss    GRPO: beta * kl_t is added to each token's policy loss, then aggregated with it
"""

from __future__ import annotations

import torch

from .choices import KL_PLACEMENTS  # noqa: F401 (no torch)
from .masked import masked_sum, zero_padding
from .registry import Registry
from .shapes import check_2d, check_like

KL_ESTIMATORS: Registry = Registry("KL estimator")

# verl clamps the log-ratio and k3 so that one wild token cannot dominate the batch.
K3_LOG_RATIO_CLAMP = 20.0
K3_VALUE_CLAMP = 10.0


@KL_ESTIMATORS.register("k1")
def kl_k1(logp: torch.Tensor, ref_logp: torch.Tensor) -> torch.Tensor:
    """k1 = logp - ref_logp. (B, T) -> (B, T)."""
    return logp - ref_logp


@KL_ESTIMATORS.register("k2")
def kl_k2(logp: torch.Tensor, ref_logp: torch.Tensor) -> torch.Tensor:
    """k2 = (ref_logp - logp)^2 / 2. (B, T) -> (B, T)."""
    return 0.5 * (ref_logp - logp) ** 2


@KL_ESTIMATORS.register("k3")
def kl_k3(logp: torch.Tensor, ref_logp: torch.Tensor) -> torch.Tensor:
    """k3 = exp(d) - d - 1 with d = clamp(ref_logp - logp, +-20), result clamped to +-10 (verl)."""
    d = (ref_logp - logp).clamp(-K3_LOG_RATIO_CLAMP, K3_LOG_RATIO_CLAMP)
    return (torch.exp(d) - d - 1.0).clamp(-K3_VALUE_CLAMP, K3_VALUE_CLAMP)


@KL_ESTIMATORS.register("abs")
def kl_abs(logp: torch.Tensor, ref_logp: torch.Tensor) -> torch.Tensor:
    """|logp - ref_logp| (verl "abs"). (B, T) -> (B, T)."""
    return (logp - ref_logp).abs()


def straight_through_k2(forward: torch.Tensor, logp: torch.Tensor, ref_logp: torch.Tensor) -> torch.Tensor:
    """forward's value with k2's gradient: k2 - sg(k2) + sg(forward) (verl's "+" forms). (B, T) -> (B, T)."""
    backward = kl_k2(logp, ref_logp)
    return backward - backward.detach() + forward.detach()


def _straight_through(name: str, base):
    """Register ``name`` as ``base``'s value with k2's gradient."""
    def estimator(logp: torch.Tensor, ref_logp: torch.Tensor) -> torch.Tensor:
        return straight_through_k2(base(logp, ref_logp), logp, ref_logp)

    estimator.__name__ = f"kl_{name.replace('+', '_plus')}"
    estimator.__doc__ = f"{name}: the value of {base.__name__}, the gradient of k2 (verl's straight-through form). (B, T) -> (B, T)."
    return KL_ESTIMATORS.register(name)(estimator)


kl_k1_plus = _straight_through("k1+", kl_k1)  # verl "kl+"
kl_k3_plus = _straight_through("k3+", kl_k3)  # verl "low_var_kl+"
kl_abs_plus = _straight_through("abs+", kl_abs)


def kl_per_token(estimator: str, logp: torch.Tensor, ref_logp: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """Per-token KL estimate, 0 on padding. logp, ref_logp, mask: (B, T) -> (B, T)."""
    check_2d("logp", logp)
    check_like("logp", logp, ref_logp=ref_logp, mask=mask)
    kl = KL_ESTIMATORS.get(estimator)(logp, ref_logp)
    return zero_padding(kl, mask)


# ---- adaptive KL coefficient -------------------------------------------------------------------
# The controllers are pure floats (core.kl_control, torch-free so the recipe can read their names).
from .kl_control import ADAPTIVE_KL_ERROR_CLIP, KL_CONTROLLERS, adaptive_kl_coef, fixed_kl_coef  # noqa: E402,F401


def sequence_mean_kl(kl: torch.Tensor, mask: torch.Tensor) -> float:
    """What verl's adaptive controller sees (``apply_kl_penalty``'s current_kl): each completion's
    mean per-token KL over its valid tokens, averaged over the batch's completions (an empty
    completion counts as 0, as verl's masked_mean over 1e-8). kl, mask: (B, T) -> a float."""
    check_like("kl", kl, mask=mask)
    per_sequence = masked_sum(kl, mask, 1) / mask.sum(1).clamp(min=1).to(kl.dtype)
    return float(per_sequence.mean())
