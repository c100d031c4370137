"""verl 0.9.1's ``token-sum`` aggregation, KL estimators ``abs`` and the straight-through "+" forms,
and the adaptive KL controller: hand-derived values and gradients, and verl's code transcribed
below, compared in float64 (values and gradients at atol = rtol = 1e-12; the controller exactly).

Anchor: verl 0.9.1 (PyPI wheel verl-0.9.1-py3-none-any.whl, sha256 db6e6f2a...),
verl/trainer/ppo/core_algos.py: ``agg_loss``, ``kl_penalty``, ``kl_penalty_forward``,
``AdaptiveKLController``.
"""

import math

import numpy as np
import pytest
import torch

from tests.helpers import assert_values
from workbench.core import KL_ESTIMATORS, adaptive_kl_coef, aggregate_loss, kl_per_token

TIGHT = dict(atol=1e-12, rtol=1e-12)


# ---- token-sum -------------------------------------------------------------------------------


def test_token_sum_hand_value_and_micro_batches_add_up():
    loss = torch.tensor([[1.0, 2.0, 3.0], [4.0, 5.0, 6.0]], dtype=torch.float64)
    mask = torch.tensor([[1.0, 1.0, 0.0], [1.0, 0.0, 0.0]], dtype=torch.float64)
    assert aggregate_loss("token-sum", loss, mask).item() == 7.0  # 1 + 2 + 4, no normaliser
    # no normaliser, so the micro-batch losses add up to the full batch's whatever the split
    parts = sum(aggregate_loss("token-sum", loss[i:i + 1], mask[i:i + 1]) for i in range(2))
    assert parts.item() == aggregate_loss("token-sum", loss, mask).item()


def verl_agg_loss_token_sum(loss_mat, loss_mask, dp_size=1):
    # verl 0.9.1 agg_loss, loss_agg_mode == "token-sum" (verl_F.masked_sum = (values * mask).sum()):
    return (loss_mat * loss_mask).sum() * dp_size


@pytest.mark.parametrize("seed", range(5))
def test_token_sum_equals_verl(seed):
    g = torch.Generator().manual_seed(seed)
    loss = torch.randn(5, 9, generator=g, dtype=torch.float64)
    mask = (torch.rand(5, 9, generator=g) > 0.3).double()
    torch.testing.assert_close(aggregate_loss("token-sum", loss, mask), verl_agg_loss_token_sum(loss, mask), **TIGHT)


# ---- KL estimators ---------------------------------------------------------------------------


def kl_and_grad(name, logp, ref):
    logp = torch.as_tensor(logp, dtype=torch.float64).clone().requires_grad_(True)
    ref = torch.as_tensor(ref, dtype=torch.float64)
    kl = kl_per_token(name, logp, ref, torch.ones_like(ref))
    kl.sum().backward()
    return kl.detach(), logp.grad


# token 1: logp -1, ref -1.5 (logp - ref = 0.5); token 2: logp -2, ref -1.2 (logp - ref = -0.8)
LOGP, REF = [[-1.0, -2.0]], [[-1.5, -1.2]]
K3 = [[math.exp(-0.5) - 0.5, math.exp(0.8) - 1.8]]  # e^d - d - 1, d = ref - logp = (-0.5, 0.8)
HAND = {  # name: (values, d value / d logp)
    "abs": ([[0.5, 0.8]], [[1.0, -1.0]]),  # |logp - ref|, gradient sign(logp - ref)
    "k1+": ([[0.5, -0.8]], [[0.5, -0.8]]),  # k1's value, k2's gradient logp - ref
    "k3+": (K3, [[0.5, -0.8]]),  # k3's value 0.1065306597 / 0.4255409285, k2's gradient
    "abs+": ([[0.5, 0.8]], [[0.5, -0.8]]),
    # the bases, for contrast: k3's own gradient is 1 - e^d = 0.3934693403 / -1.2255409285
    "k3": (K3, [[1 - math.exp(-0.5), 1 - math.exp(0.8)]]),
    "k2": ([[0.125, 0.32]], [[0.5, -0.8]]),
}


@pytest.mark.parametrize("name", sorted(HAND))
def test_kl_hand_values_and_gradients(name):
    values, grads = HAND[name]
    kl, grad = kl_and_grad(name, LOGP, REF)
    assert_values(kl, values, atol=1e-12)
    assert_values(grad, grads, atol=1e-12)


def verl_kl_penalty_forward(logprob, ref_logprob, kl_penalty):
    # verl 0.9.1 core_algos.kl_penalty_forward ("full" raises NotImplementedError there):
    if kl_penalty in ("kl", "k1"):
        return logprob - ref_logprob
    if kl_penalty == "abs":
        return (logprob - ref_logprob).abs()
    if kl_penalty in ("mse", "k2"):
        return 0.5 * (logprob - ref_logprob).square()
    if kl_penalty in ("low_var_kl", "k3"):
        kl = ref_logprob - logprob
        kl = torch.clamp(kl, min=-20, max=20)
        ratio = torch.exp(kl)
        kld = (ratio - kl - 1).contiguous()
        return torch.clamp(kld, min=-10, max=10)
    raise NotImplementedError


def verl_kl_penalty(logprob, ref_logprob, kl_penalty):
    # verl 0.9.1 core_algos.kl_penalty:
    base_kl_penalty = kl_penalty[:-1] if kl_penalty.endswith("+") else kl_penalty
    forward_score = verl_kl_penalty_forward(logprob, ref_logprob, base_kl_penalty)
    if not kl_penalty.endswith("+") or kl_penalty in ("mse", "k2"):
        return forward_score
    backward_score = 0.5 * (logprob - ref_logprob).square()
    return backward_score - backward_score.detach() + forward_score.detach()


# ours -> verl's spellings (verl accepts both where two are listed)
VERL_NAMES = {"k1": ("kl", "k1"), "k2": ("mse", "k2"), "k3": ("low_var_kl", "k3"), "abs": ("abs",),
              "k1+": ("kl+", "k1+"), "k3+": ("low_var_kl+", "k3+"), "abs+": ("abs+",)}


def test_every_registered_estimator_has_its_verl_spelling():
    assert set(VERL_NAMES) == set(KL_ESTIMATORS.names())


@pytest.mark.parametrize("seed", range(4))
@pytest.mark.parametrize("ours,theirs", [(o, t) for o, ts in VERL_NAMES.items() for t in ts])
def test_kl_estimators_equal_verl(seed, ours, theirs):
    g = torch.Generator().manual_seed(seed)
    ref = -torch.rand(4, 6, generator=g, dtype=torch.float64) * 4
    logp = ref + torch.randn(4, 6, generator=g, dtype=torch.float64) * (1.0 if seed < 3 else 12.0)  # seed 3: clamps act
    mask = torch.ones_like(ref)
    a, b = logp.clone().requires_grad_(True), logp.clone().requires_grad_(True)
    got, want = kl_per_token(ours, a, ref, mask), verl_kl_penalty(b, ref, theirs)
    torch.testing.assert_close(got, want, **TIGHT)
    (got * torch.arange(24, dtype=torch.float64).view(4, 6)).sum().backward()  # distinct weights per token
    (want * torch.arange(24, dtype=torch.float64).view(4, 6)).sum().backward()
    torch.testing.assert_close(a.grad, b.grad, **TIGHT)


# ---- adaptive KL controller --------------------------------------------------------------------


class VerlAdaptiveKLController:
    # verl 0.9.1 core_algos.AdaptiveKLController:
    def __init__(self, init_kl_coef, target_kl, horizon):
        self.value = init_kl_coef
        self.target = target_kl
        self.horizon = horizon

    def update(self, current_kl, n_steps):
        target = self.target
        proportional_error = np.clip(current_kl / target - 1, -0.2, 0.2)
        mult = 1 + proportional_error * n_steps / self.horizon
        self.value *= mult


def test_adaptive_kl_hand_values():
    # target 6, horizon 10000, 256 completions per step, beta_0 = 0.1
    # KL 3  -> e = clip(-0.5) = -0.2: beta = 0.1 (1 - 0.2 * 0.0256) = 0.099488
    # KL 12 -> e = clip(+1)   = +0.2: beta = 0.099488 (1 + 0.00512) = 0.09999737856
    # KL 6  -> e = 0:                 unchanged
    # KL 6.3 -> e = 0.05:             beta = 0.09999737856 (1 + 0.00128) = 0.10012537520456
    beta = 0.1
    expected = [0.099488, 0.09999737856, 0.09999737856, 0.10012537520456]
    for kl, want in zip((3.0, 12.0, 6.0, 6.3), expected):
        beta = adaptive_kl_coef(beta, kl, 256, target_kl=6.0, horizon=10000)
        assert beta == pytest.approx(want, rel=1e-14)


def test_adaptive_kl_equals_verl_exactly():
    rng = np.random.default_rng(0)
    ours_beta, theirs = 0.05, VerlAdaptiveKLController(0.05, target_kl=0.1, horizon=1000)
    for kl in rng.exponential(0.1, size=50):
        ours_beta = adaptive_kl_coef(ours_beta, float(kl), 64, target_kl=0.1, horizon=1000)
        theirs.update(float(kl), 64)
        assert ours_beta == float(theirs.value)


@pytest.mark.parametrize("kwargs", [dict(target_kl=0.0, horizon=10), dict(target_kl=0.1, horizon=0)])
def test_adaptive_kl_refuses_degenerate_settings(kwargs):
    with pytest.raises(ValueError, match=next(iter(k for k, v in kwargs.items() if not v > 0))):
        adaptive_kl_coef(0.1, 0.1, 1, **kwargs)


def test_adaptive_kl_coef_never_reaches_zero_and_refuses_a_non_finite_kl():
    from workbench.core.kl import adaptive_kl_coef

    # verl: 0.1 * (1 + (-0.2) * 100 / 10) = -0.1, a reward for drifting; a floor at 0 (this
    # function's previous answer) is as bad: 0 times anything stays 0, the KL term gone for good
    for n_steps in (50, 100):
        with pytest.raises(ValueError, match=f"n_steps / horizon = {n_steps}/10 must be < 5"):
            adaptive_kl_coef(0.1, 0.0, n_steps, target_kl=0.1, horizon=10)
    assert adaptive_kl_coef(0.1, 0.0, 1, target_kl=0.1, horizon=10) == 0.1 * (1.0 + (-0.2) * 1 / 10)  # verl's
    assert adaptive_kl_coef(0.1, 0.0, 49, target_kl=0.1, horizon=10) == pytest.approx(0.1 * 0.02)  # just inside: > 0
    for bad in (float("nan"), float("inf")):
        with pytest.raises(ValueError, match="current_kl=.* is not finite"):
            adaptive_kl_coef(0.1, bad, 1, target_kl=0.1, horizon=10)
