"""LUSPO, VESPO (TRL 1.16) and DRO (verl 0.9.1): hand-derived values from each loss's equation,
and the anchors' own code transcribed below as reference implementations, compared in float64 at
atol = rtol = 1e-12 on random batches with padding.

Anchors: TRL 1.16.0 (PyPI; trl/trainer/grpo_trainer.py, ``_compute_loss`` and
``get_gamma_weights``); verl 0.9.1 (PyPI wheel verl-0.9.1-py3-none-any.whl, sha256 db6e6f2a...;
verl/trainer/ppo/core_algos.py ``compute_policy_loss_dro``, the same lines as verl-project/verl
commit ddfbf4ea0 "add DRO losses (#7245)").
"""

import math

import pytest
import torch

from tests.helpers import assert_values
from workbench.core import REGION_NAMES, PolicyLossConfig, aggregate_loss, compute_policy_loss
from tests.core.test_policy_losses_zoo import run
from workbench.core.policy_losses import vespo_gamma_weights

TIGHT = dict(atol=1e-12, rtol=1e-12)


def m(rows):
    return torch.tensor(rows, dtype=torch.float64)


def random_batch(seed, B=6, T=7, token_adv=False):
    g = torch.Generator().manual_seed(seed)
    old = -torch.rand(B, T, generator=g, dtype=torch.float64) * 3
    logp = old + torch.randn(B, T, generator=g, dtype=torch.float64) * 0.3
    adv = torch.randn(B, T if token_adv else 1, generator=g, dtype=torch.float64).expand(B, T).clone()
    lengths = torch.randint(1, T + 1, (B,), generator=g)
    mask = (torch.arange(T)[None] < lengths[:, None]).double()
    mask[0, 0] = 0.0 if lengths[0] > 1 else 1.0  # a hole, never an empty row
    return logp, old, adv, mask


def ours(name, logp, old, adv, mask, agg, **cfg):
    """Aggregated loss and its gradient w.r.t. logp, through the registry and aggregate_loss."""
    logp = logp.clone().requires_grad_(True)
    per_token, _ = compute_policy_loss(name, logp, old, adv, mask, PolicyLossConfig(**cfg))
    loss = aggregate_loss(agg, per_token, mask, num_seqs=mask.shape[0])
    loss.backward()
    return loss.detach(), logp.grad


# ---- LUSPO: GSPO's sequence ratio with the seq-mean-token-sum aggregation ----------------------


def test_luspo_token_gradient_does_not_shrink_with_length():
    # B = 1, on-policy: GSPO's d loss / d logp_t = -A s / n under seq-mean-token-mean shrinks with the
    # length n; under seq-mean-token-sum (LUSPO) it is -A s = -1.5 for every length
    for n in (1, 3, 8):
        lp = torch.zeros(1, n, dtype=torch.float64)
        adv, mask = torch.full((1, n), 1.5, dtype=torch.float64), torch.ones(1, n, dtype=torch.float64)
        assert_values(ours("gspo", lp, lp, adv, mask, "seq-mean-token-sum")[1], [[-1.5] * n], atol=1e-12)
        assert_values(ours("gspo", lp, lp, adv, mask, "seq-mean-token-mean")[1], [[-1.5 / n] * n], atol=1e-12)


def trl_luspo(per_token_logps, old_per_token_logps, ref_per_token_logps, advantages, mask, epsilon_low, epsilon_high,
              beta, delta=None):
    # TRL 1.16.0 trl/trainer/grpo_trainer.py, _compute_loss, importance_sampling_level == "sequence",
    # loss_type == "luspo": coef_1 / coef_2 / per_token_loss, + beta * per_token_kl, then
    # (per_token_loss * mask).sum(-1).mean()
    per_token_kl = torch.exp(ref_per_token_logps - per_token_logps) - (ref_per_token_logps - per_token_logps) - 1
    log_ratio = per_token_logps - old_per_token_logps
    log_importance_weights = (log_ratio * mask).sum(-1) / mask.sum(-1).clamp(min=1.0)
    log_importance_weights = log_importance_weights.unsqueeze(-1)
    coef_1 = torch.exp(log_importance_weights)
    coef_2 = torch.clamp(coef_1, 1 - epsilon_low, 1 + epsilon_high)
    if delta is not None:
        coef_1 = torch.clamp(coef_1, max=delta)
    per_token_loss1 = coef_1 * advantages
    per_token_loss2 = coef_2 * advantages
    per_token_loss = -torch.min(per_token_loss1, per_token_loss2)
    if beta != 0.0:
        per_token_loss = per_token_loss + beta * per_token_kl
    return (per_token_loss * mask).sum(-1).mean()


@pytest.mark.parametrize("seed", range(6))
@pytest.mark.parametrize("token_adv", [False, True])
@pytest.mark.parametrize("eps,delta,beta", [((0.2, 0.28), None, 0.0), ((0.03, 0.04), None, 0.5), ((0.2, 0.2), 1.5, 0.04)])
def test_luspo_is_gspo_with_seq_mean_token_sum_and_equals_trl_with_its_kl(seed, token_adv, eps, delta, beta):
    """The whole objective (policy term and in-loss k3 KL) of gspo + seq-mean-token-sum is TRL's luspo."""
    from workbench.core import ObjectiveConfig, policy_objective

    logp, old, adv, mask = random_batch(seed, token_adv=token_adv)
    ref = old + torch.randn(old.shape, generator=torch.Generator().manual_seed(50 + seed), dtype=torch.float64) * 0.2
    cfg = ObjectiveConfig(policy_loss="gspo", loss=PolicyLossConfig(eps_low=eps[0], eps_high=eps[1], delta=delta),
                          aggregation="seq-mean-token-sum", kl_estimator="k3", kl_coef=beta)
    lp = logp.clone().requires_grad_(True)
    loss = policy_objective(lp, old, adv, mask, mask, cfg, ref_logp=ref if beta else None, num_seqs=mask.shape[0]).loss
    loss.backward()
    ref_lp = logp.clone().requires_grad_(True)
    expected = trl_luspo(ref_lp, old, ref, adv, mask, eps[0], eps[1], beta, delta)
    expected.backward()
    torch.testing.assert_close(loss.detach(), expected.detach(), **TIGHT)
    torch.testing.assert_close(lp.grad, ref_lp.grad, **TIGHT)


# ---- VESPO -----------------------------------------------------------------------------------


def test_vespo_hand_values():
    # row 0, A = +1 (k 2, lambda 3): log w = 0.1 - 0.3 = -0.2, w = 0.8187307531
    #   log phi = 3 + 2 (-0.2) - 3 w = 0.1438077408, phi = 1.1546620927
    #   loss_t = -phi A logp_t = [-0.11546620927, +0.34639862782]; d loss / d logp_t = -phi A = -1.1546620927
    # row 1, A = -2 (k 3, lambda 2): log w = 0.2, w = 1.2214027582
    #   log phi = 2 + 3 (0.2) - 2 w = 0.1571944837, phi = 1.1702231811
    #   loss = -phi A logp = 2 phi 0.2 = 0.4680892724; grad = -phi A = 2.3404463622; pad 0
    loss, grad, diag = run("vespo", [[0.1, -0.3], [0.2, 0.5]], [[1.0, 1.0], [-2.0, -2.0]], mask=m([[1, 1], [1, 0]]))
    phi0, phi1 = 1.1546620927338898, 1.1702231810814256
    assert_values(loss, [[-0.1 * phi0, 0.3 * phi0], [0.4 * phi1, 0.0]], atol=1e-12)
    assert_values(grad, [[-phi0, -phi0], [2 * phi1, 0.0]], atol=1e-12)
    assert diag.metrics["vespo/phi_seq_mean"].item() == pytest.approx((phi0 + phi1) / 2, abs=1e-12)
    assert [REGION_NAMES[c] for c in diag.region[0].tolist()] == ["trust", "trust"]


def test_vespo_weight_is_one_on_policy_and_peaks_at_k_over_lambda():
    # phi(1) = e^(lambda + 0 - lambda) = 1 whatever (k, lambda): on-policy the gradient is -A
    for k, lam in ((2.0, 3.0), (0.5, 2.0)):
        _, grad, _ = run("vespo", [[0.0, 0.0]], [[1.5, 1.5]], vespo_k_pos=k, vespo_lambda_pos=lam)
        assert_values(grad, [[-1.5, -1.5]], atol=1e-12)
    # d log phi / d w = k / w - lambda = 0 at w = k / lambda: phi is largest there
    cfg = PolicyLossConfig(vespo_k_pos=2.0, vespo_lambda_pos=3.0)
    ws = torch.tensor([2 / 3 * 0.9, 2 / 3, 2 / 3 * 1.1], dtype=torch.float64)
    phi = vespo_gamma_weights(torch.log(ws)[:, None], torch.ones(3, 1, dtype=torch.float64), torch.ones(3, 1), cfg)
    assert phi[1, 0] > phi[0, 0] and phi[1, 0] > phi[2, 0]
    assert phi[1, 0].item() == pytest.approx(math.exp(3.0 + 2 * math.log(2 / 3) - 2.0), abs=1e-12)


@torch.no_grad()
def trl_get_gamma_weights(advantages, log_ratio_per_token, mask, importance_sampling_ratio,
                          k_pos=2.0, lambda_pos=3.0, k_neg=3.0, lambda_neg=2.0):
    # TRL 1.16.0 trl/trainer/grpo_trainer.py, GRPOTrainer.get_gamma_weights (a @torch.no_grad staticmethod):
    lower_clamp = math.log(1e-8)
    log_ratio_clamped = torch.clamp(log_ratio_per_token, -20.0, 20.0)
    seq_log_ratio = torch.sum(log_ratio_clamped * mask, dim=-1, keepdim=True)  # (B, 1)
    if importance_sampling_ratio is not None:
        log_is_ratio = torch.clamp(torch.log(importance_sampling_ratio), lower_clamp, 20.0)
        seq_log_ratio += torch.sum(log_is_ratio, dim=-1, keepdim=True)
    log_w_seq = torch.clamp(seq_log_ratio, lower_clamp, 20.0)
    w_seq = torch.exp(log_w_seq)
    is_nonneg_adv = advantages >= 0
    k_seq = torch.where(is_nonneg_adv, k_pos, k_neg)
    lambda_seq = torch.where(is_nonneg_adv, lambda_pos, lambda_neg).clamp(min=1e-4)
    log_phi = lambda_seq + k_seq * log_w_seq - lambda_seq * w_seq
    phi_seq = torch.exp(log_phi).nan_to_num(nan=0.0, posinf=0.0, neginf=0.0)
    return phi_seq


def trl_vespo(per_token_logps, old_per_token_logps, advantages, mask, is_ratio=None, **knobs):
    # TRL 1.16.0 _compute_loss, loss_type == "vespo", aggregated as ["cispo", "dapo", "vespo"]:
    # (per_token_loss * mask).sum() / num_items_in_batch, the batch's loss tokens here (one process, no accumulation)
    log_ratio = per_token_logps - old_per_token_logps
    phi_seq = trl_get_gamma_weights(advantages, log_ratio, mask, is_ratio, **knobs)
    per_token_loss = -phi_seq * advantages * per_token_logps
    return (per_token_loss * mask).sum() / mask.sum().clamp(min=1.0)


KNOBS = [dict(), dict(k_pos=1.0, lambda_pos=0.5, k_neg=4.0, lambda_neg=6.0)]


@pytest.mark.parametrize("seed", range(6))
@pytest.mark.parametrize("token_adv", [False, True])
@pytest.mark.parametrize("knobs", KNOBS)
def test_vespo_equals_trl(seed, token_adv, knobs):
    logp, old, adv, mask = random_batch(seed, token_adv=token_adv)
    loss, grad = ours("vespo", logp, old, adv, mask, "token-mean", **{f"vespo_{k}": v for k, v in knobs.items()})
    ref_logp = logp.clone().requires_grad_(True)
    ref = trl_vespo(ref_logp, old, adv, mask, **knobs)
    ref.backward()
    torch.testing.assert_close(loss, ref.detach(), **TIGHT)
    torch.testing.assert_close(grad, ref_logp.grad, **TIGHT)


def test_vespo_peak_is_bounded_for_every_knob_setting():
    from workbench.core.choices import VESPO_MAX_PEAK, vespo_peak

    assert vespo_peak(2.0, 3.0) == pytest.approx(math.exp(1 + 2 * math.log(2 / 3)))  # TRL's A >= 0 default: 1.21
    # e^50 as w -> 0; e^{0.1 - 25 + 25 log 250} at w = 250; and peaks whose exp overflows a float
    # (inside the knobs' bounds: a one-line ValueError, not an OverflowError)
    for k, lam in ((0.0, 50.0), (25.0, 0.1), (0.0, 1000.0), (1000.0, 0.001)):
        assert vespo_peak(k, lam) > VESPO_MAX_PEAK
        with pytest.raises(ValueError, match=f"vespo_k_pos={k}, vespo_lambda_pos={lam}: phi peaks at"):
            PolicyLossConfig(vespo_k_pos=k, vespo_lambda_pos=lam)
    # the largest weight any admitted setting gives, over a grid of sequence ratios, stays under the bound
    # (the core's own phi: one-token sequences whose log-ratio sweeps the clamped range)
    from workbench.core.policy_losses import vespo_gamma_weights

    log_w = torch.linspace(math.log(1e-8), 20.0, 2001, dtype=torch.float64)[:, None]
    ones = torch.ones_like(log_w)
    for k, lam in ((0.0, 2.3), (1.0, 1.0), (5.0, 4.0), (2.0, 3.0)):
        phi = vespo_gamma_weights(log_w, ones, ones, PolicyLossConfig(vespo_k_pos=k, vespo_lambda_pos=lam))
        assert float(phi.max()) <= vespo_peak(k, lam) * (1 + 1e-12) <= VESPO_MAX_PEAK


# ---- DRO -------------------------------------------------------------------------------------


def test_dro_hand_values():
    # beta = 0.5. token 1: old -1, l = 0.4, logp = -0.6, A = 2:
    #   loss = -(-0.6 * 2 - 0.25 * 0.16) = 1.24; d loss / d logp = -A + beta l = -2 + 0.2 = -1.8
    # token 2: old -2, l = -0.2, logp = -2.2, A = -1:
    #   loss = -((-2.2)(-1) - 0.25 * 0.04) = -2.19; grad = 1 + 0.5 (-0.2) = 0.9
    loss, grad, diag = run("dro", [[0.4, -0.2]], [[2.0, -1.0]], old=[[-1.0, -2.0]], dro_beta=0.5)
    assert_values(loss, [[1.24, -2.19]], atol=1e-12)
    assert_values(grad, [[-1.8, 0.9]], atol=1e-12)
    assert not diag.zero_grad.any()


def test_dro_beta_is_positive():
    for bad in (0.0, -1.0):
        with pytest.raises(ValueError, match="dro_beta"):
            PolicyLossConfig(dro_beta=bad)


def verl_dro(old_log_prob, log_prob, advantages, response_mask, beta, rollout_is_weights=None):
    # verl 0.9.1 verl/trainer/ppo/core_algos.py, compute_policy_loss_dro (agg_loss "token-mean", dp_size 1):
    log_ratio = log_prob - old_log_prob
    pg_losses = -(log_prob * advantages - 0.5 * beta * log_ratio.square())
    if rollout_is_weights is not None:
        pg_losses = pg_losses * rollout_is_weights
    return (pg_losses * response_mask).sum() / response_mask.sum()


@pytest.mark.parametrize("seed", range(6))
@pytest.mark.parametrize("beta", [0.1, 2.0])
def test_dro_equals_verl(seed, beta):
    logp, old, adv, mask = random_batch(seed, token_adv=True)
    loss, grad = ours("dro", logp, old, adv, mask, "token-mean", dro_beta=beta)
    ref_logp = logp.clone().requires_grad_(True)
    ref = verl_dro(old, ref_logp, adv, mask, beta)
    ref.backward()
    torch.testing.assert_close(loss, ref.detach(), **TIGHT)
    torch.testing.assert_close(grad, ref_logp.grad, **TIGHT)


def test_new_knobs_are_bounded():
    for field, bad in (("vespo_k_pos", -0.1), ("vespo_k_neg", -1.0), ("vespo_lambda_pos", 0.0), ("vespo_lambda_neg", -2.0)):
        with pytest.raises(ValueError, match=field):
            PolicyLossConfig(**{field: bad})
    cfg = PolicyLossConfig()
    assert (cfg.vespo_k_pos, cfg.vespo_lambda_pos, cfg.vespo_k_neg, cfg.vespo_lambda_neg, cfg.dro_beta) == (2.0, 3.0, 3.0, 2.0, 0.05)
