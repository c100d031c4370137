"""KL(pi || ref) estimators per token, and where the KL term goes.

With d = ref_logp - logp on tokens sampled from pi (Schulman, "Approximating KL divergence", 2020):

    k1 = -d                      unbiased, high variance, can be negative
    k2 = d^2 / 2                 biased, low variance (its gradient is the KL's gradient)
    k3 = exp(d) - d - 1          unbiased, low variance, always >= 0 ("low_var_kl" in verl);
                                 the +-10 clamp (as verl) biases it when |k3| would exceed 10

Placements:
    in_reward  RLOO / PPO / REINFORCE++: the reward is shaped before advantages are computed
               (sequence estimators: r_i - beta * sum_t kl_it; token estimators: -beta * kl_t per token)
    in_loss    GRPO: beta * kl_t is added to each token's policy loss, then aggregated with it
"""

from __future__ import annotations

import torch

from .choices import KL_PLACEMENTS  # noqa: F401 (no torch)
from .masked import zero_padding
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


def kl_per_token(estimator: str, logp: torch.Tensor, ref_logp: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """Per-token KL estimate, 0 on padding. logp, ref_logp, mask: (B, T) -> (B, T)."""
    check_2d("logp", logp)
    check_like("logp", logp, ref_logp=ref_logp, mask=mask)
    kl = KL_ESTIMATORS.get(estimator)(logp, ref_logp)
    return zero_padding(kl, mask)
