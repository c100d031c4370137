"""SAPO, GMPO, DPPO (TV / KL), Clip-Cov, KL-Cov and GPG: hand-derived values from each paper's
equation, and the anchors' own formulas (verl core_algos.py, TRL grpo_trainer.py) transcribed
below as *reference implementations* and compared on random inputs."""

import math

import pytest
import torch

from tests.helpers import assert_values
from workbench.core import REGION_NAMES, PolicyLossConfig, aggregate_loss, compute_policy_loss, token_covariance


def run(name, log_ratio, adv, mask=None, old=None, **cfg):
    """Loss and d loss / d logp with logp = old + log_ratio (old = 0 unless given)."""
    log_ratio = torch.as_tensor(log_ratio, dtype=torch.float64)
    adv = torch.as_tensor(adv, dtype=torch.float64)
    old = torch.zeros_like(log_ratio) if old is None else torch.as_tensor(old, dtype=torch.float64)
    mask = torch.ones_like(log_ratio) if mask is None else mask
    logp = (old + log_ratio).clone().requires_grad_(True)
    loss, diag = compute_policy_loss(name, logp, old, adv, mask, PolicyLossConfig(**cfg))
    loss.sum().backward()
    return loss.detach(), logp.grad, diag


def random_batch(seed, B=6, T=7, holes=True):
    g = torch.Generator().manual_seed(seed)
    old = -torch.rand(B, T, generator=g, dtype=torch.float64) * 3
    logp = old + torch.randn(B, T, generator=g, dtype=torch.float64) * 0.4
    adv = torch.randn(B, 1, generator=g, dtype=torch.float64).expand(B, T).clone()
    lengths = torch.randint(1, T + 1, (B,), generator=g)
    mask = (torch.arange(T)[None] < lengths[:, None]).double()
    if holes:
        mask[0, 0] = 0.0
    return logp, old, adv, mask


# ---- SAPO ------------------------------------------------------------------------------------


def test_sapo_hand_values_and_gate_derivative():
    # A = +2, rho = 1.5, tau_pos = 1: f = sigmoid(0.5) * 4 = 0.6224593312 * 4; loss = -f A = -4.9796746
    # A = -1, rho = 0.5, tau_neg = 2: f = sigmoid(-1) * 4 / 2 = 0.2689414214 * 2; loss = -f A = +0.5378828
    loss, grad, diag = run("sapo", [[math.log(1.5), math.log(0.5)]], [[2.0, -1.0]], sapo_tau_pos=1.0, sapo_tau_neg=2.0)
    assert_values(loss, [[-4.979674649, 0.537882843]], atol=1e-8)
    # d loss / d logp = -A 4 s (1 - s) rho: s = 0.6224593312: -2 * 4 * 0.2350037122 * 1.5 = -2.8200445
    # s = 0.2689414214: +1 * 4 * 0.1966119332 * 0.5 = 0.3932238664
    assert_values(grad, [[-2.820044546, 0.393223866]], atol=1e-8)
    assert [REGION_NAMES[c] for c in diag.region[0].tolist()] == ["trust", "trust"]
    assert not diag.zero_grad.any()  # a smooth gate never zeroes a gradient


def test_sapo_on_policy_gradient_is_the_policy_gradient_for_any_temperature():
    # at rho = 1: 4 s (1 - s) = 4 * 1/4 = 1, so d loss / d logp = -A whatever tau
    adv = [[1.5, -0.5, 2.0]]
    for tau in (0.5, 1.0, 7.0):
        _, grad, _ = run("sapo", [[0.0, 0.0, 0.0]], adv, sapo_tau_pos=tau, sapo_tau_neg=tau + 1)
        assert_values(grad, [[-1.5, 0.5, -2.0]], atol=1e-12)


def test_sapo_gate_decays_faster_with_higher_temperature():
    # |grad| at rho = 2 for A = 1: 4 s(1-s) * 2 with s = sigmoid(tau): tau 1 -> 1.5729, tau 4 -> 0.1413
    grads = [abs(run("sapo", [[math.log(2.0)]], [[1.0]], sapo_tau_pos=tau)[1].item()) for tau in (1.0, 4.0)]
    assert grads == pytest.approx([8 * 0.7310585786 * 0.2689414214, 8 * 0.9820137900 * 0.0179862100], rel=1e-8)


def trl_sapo(coef_1, advantages, tau_pos, tau_neg):
    # TRL trl/trainer/grpo_trainer.py, _compute_loss, loss_type == "sapo" (f2cd577):
    temperatures = torch.where(advantages > 0, tau_pos, tau_neg)
    soft_coef_1 = torch.sigmoid(temperatures * (coef_1 - 1)) * 4 / temperatures
    return -soft_coef_1 * advantages


def verl_sapo(ratio, advantages, tau_pos, tau_neg):
    # verl verl/trainer/ppo/core_algos.py, compute_policy_loss_sapo (b178a3c):
    def gate_function(x, tau):
        return torch.sigmoid(tau * (x - 1.0)) * (4.0 / tau)

    taus = torch.where(advantages > 0, torch.as_tensor(tau_pos, dtype=advantages.dtype),
                       torch.as_tensor(tau_neg, dtype=advantages.dtype))
    return -gate_function(ratio, taus) * advantages


@pytest.mark.parametrize("seed", range(5))
def test_sapo_matches_trl_and_verl(seed):
    logp, old, adv, mask = random_batch(seed)
    ours, _ = compute_policy_loss("sapo", logp, old, adv, mask, PolicyLossConfig(sapo_tau_pos=1.0, sapo_tau_neg=1.05))
    ratio = torch.exp(logp - old)
    torch.testing.assert_close(ours, verl_sapo(ratio, adv, 1.0, 1.05) * mask, atol=1e-12, rtol=1e-12)
    # TRL's torch.where over two Python floats makes float32 temperatures (1.05 -> 1.0499999523), so in
    # float64 it differs from the exact formula by ~1e-7 relative; in float32 training they coincide.
    torch.testing.assert_close(ours, trl_sapo(ratio, adv, 1.0, 1.05) * mask, atol=1e-6, rtol=1e-6)
    ours32, _ = compute_policy_loss("sapo", logp.float(), old.float(), adv.float(), mask.float(), PolicyLossConfig())
    torch.testing.assert_close(ours32, trl_sapo(ratio.float(), adv.float(), 1.0, 1.05) * mask.float(), atol=1e-6, rtol=1e-6)


# ---- GMPO ------------------------------------------------------------------------------------


def test_gmpo_hand_values_and_gradients():
    # A = +1, l = [0.5, -0.1], eps 0.4: A > 0 clips only above: l~ = [0.4, -0.1], mean 0.15, loss -e^0.15
    # A = -1, l = [0.5, -0.6]: A < 0 clips only below: l~ = [0.5, -0.4], mean 0.05, loss +e^0.05
    log_ratio = torch.tensor([[0.5, -0.1], [0.5, -0.6]], dtype=torch.float64)
    adv = torch.tensor([[1.0, 1.0], [-1.0, -1.0]], dtype=torch.float64)
    logp = log_ratio.clone().requires_grad_(True)
    loss, diag = compute_policy_loss("gmpo", logp, torch.zeros_like(logp), adv, torch.ones_like(logp),
                                     PolicyLossConfig(eps_low=0.4, eps_high=0.4))
    e1, e2 = math.exp(0.15), math.exp(0.05)
    assert_values(loss, [[-e1, -e1], [e2, e2]], atol=1e-12)  # the sequence loss on each of its tokens
    total = aggregate_loss("seq-mean-token-mean", loss, torch.ones_like(loss))  # = mean_i loss_i
    assert total.item() == pytest.approx((-e1 + e2) / 2, abs=1e-12)
    (grad,) = torch.autograd.grad(total, logp)
    # d/dl_t of -A exp(mean l~) / B: clipped tokens 0, the others -A e^{mean} / (n_i B)
    assert_values(grad, [[0.0, -e1 / 4], [e2 / 4, 0.0]], atol=1e-12)
    assert diag.zero_grad.tolist() == [[True, False], [False, True]]
    assert [[REGION_NAMES[c] for c in row] for row in diag.region.tolist()] == [
        ["clipped_high", "trust"], ["trust", "clipped_low"]]
    assert diag.metrics["clip_ratio/high_mean"].item() == pytest.approx(0.25)  # verl's pg_clipfrac
    assert diag.metrics["clip_ratio/low_mean"].item() == pytest.approx(0.25)  # verl's pg_clipfrac_lower


def verl_geo_mean(old_log_prob, log_prob, advantages, response_mask, cliprange_low, cliprange_high):
    # verl verl/trainer/ppo/core_algos.py, compute_policy_loss_geo_mean (b178a3c):
    negative_approx_kl = log_prob - old_log_prob
    sgn_advantage = torch.sign(advantages)
    negative_approx_kl_clamp = torch.clamp(negative_approx_kl, -cliprange_low, cliprange_high)
    negative_approx_kl_min = torch.min(sgn_advantage * negative_approx_kl, sgn_advantage * negative_approx_kl_clamp)
    negative_approx_kl_min = sgn_advantage * negative_approx_kl_min
    response_mask_sum = response_mask.sum(dim=-1)
    ratio = torch.exp((negative_approx_kl_min * response_mask).sum(dim=-1) / (response_mask_sum + 1e-8))
    advantage = (advantages * response_mask).sum(dim=-1) / (response_mask_sum + 1e-8)
    pg_losses = -advantage * ratio
    return torch.mean(pg_losses)


@pytest.mark.parametrize("seed", range(5))
def test_gmpo_matches_verl_geo_mean_value_and_gradient(seed):
    logp, old, adv, mask = random_batch(seed)
    a = logp.clone().requires_grad_(True)
    ours, _ = compute_policy_loss("gmpo", a, old, adv, mask, PolicyLossConfig(eps_low=0.3, eps_high=0.4))
    # verl's torch.mean counts every row, also one whose tokens are all masked: num_seqs = B
    ours = aggregate_loss("seq-mean-token-mean", ours, mask, num_seqs=mask.shape[0])
    b = logp.clone().requires_grad_(True)
    theirs = verl_geo_mean(old, b, adv, mask, 0.3, 0.4)
    torch.testing.assert_close(ours, theirs, atol=1e-7, rtol=1e-7)  # verl's 1e-8 in n + 1e-8
    (ga,), (gb,) = torch.autograd.grad(ours, a), torch.autograd.grad(theirs, b)
    torch.testing.assert_close(ga * mask, gb * mask, atol=1e-7, rtol=1e-7)


# ---- DPPO ------------------------------------------------------------------------------------


def test_dppo_tv_masks_tokens_whose_probability_moved_too_far():
    # p_old = 0.5 everywhere; eps 0.15. A > 0: p = 0.6 (+0.1, kept), p = 0.7 (+0.2, masked);
    # A < 0: p = 0.4 (-0.1, kept), p = 0.3 (-0.2, masked); A < 0 with p = 0.9 (kept: TV bounds only the fall)
    p = torch.tensor([[0.6, 0.7, 0.4, 0.3, 0.9]], dtype=torch.float64)
    old = torch.full_like(p, math.log(0.5))
    adv = [[1.0, 1.0, -1.0, -1.0, -1.0]]
    loss, grad, diag = run("dppo_tv", p.log() - old, adv, old=old, eps_low=0.15, eps_high=0.15)
    rho = p / 0.5  # loss = -A sg(min(rho, 20)) logp on kept tokens; d/dlogp = -A rho
    assert_values(loss, [[-1.2 * math.log(0.6), 0.0, 0.8 * math.log(0.4), 0.0, 1.8 * math.log(0.9)]], atol=1e-12)
    assert_values(grad, [[-1.2, 0.0, 0.8, 0.0, 1.8]], atol=1e-12)
    assert [REGION_NAMES[c] for c in diag.region[0].tolist()] == ["trust", "clipped_high", "trust", "clipped_low", "trust"]
    assert diag.metrics["dppo/masked_mean"].item() == pytest.approx(2 / 5)
    assert rho.max() < 20


def test_dppo_kl_uses_the_binary_kl():
    # p_old = 0.5, p = 0.7: KL_b = 0.5 log(0.5/0.7) + 0.5 log(0.5/0.3) = 0.0871767 (> 0.05, < 0.1)
    # p = 0.3 gives the same KL_b by symmetry.
    kl_b = 0.5 * math.log(0.5 / 0.7) + 0.5 * math.log(0.5 / 0.3)
    assert kl_b == pytest.approx(0.0871766936)
    p = torch.tensor([[0.7, 0.7, 0.3, 0.3]], dtype=torch.float64)
    old = torch.full_like(p, math.log(0.5))
    # A > 0 and p rose: masked at eps_high 0.05, kept at 0.1; A < 0 and p rose: always kept
    _, grad, _ = run("dppo_kl", p.log() - old, [[1.0, -1.0, 1.0, -1.0]], old=old, eps_low=0.05, eps_high=0.05)
    assert_values(grad, [[0.0, 1.4, -0.6, 0.0]], atol=1e-12)  # kept: -A rho
    _, grad, _ = run("dppo_kl", p.log() - old, [[1.0, -1.0, 1.0, -1.0]], old=old, eps_low=0.1, eps_high=0.1)
    assert_values(grad, [[-1.4, 1.4, -0.6, 0.6]], atol=1e-12)


def test_dppo_truncates_the_ratio_at_clip_c():
    # rho = e^3 = 20.09: the detached weight is 3 (clip_c unset: verl 0.9.1's clip_ratio_c default), 5 with
    # clip_c = 5. p = 0.05 e^3 ~ 1.004 > 1 would not be a probability, so take p_old = 0.01, p = 0.2009
    # (TV +0.19 <= eps 0.5: kept)
    old = torch.tensor([[math.log(0.01)]], dtype=torch.float64)
    for cfg, weight in (({}, 3.0), ({"clip_c": 5.0}, 5.0)):
        _, grad, diag = run("dppo_tv", [[3.0]], [[1.0]], old=old, eps_low=0.5, eps_high=0.5, **cfg)
        assert grad.item() == pytest.approx(-weight)
        assert diag.metrics["dppo/truncated_mean"].item() == 1.0


def verl_dppo(old_log_prob, log_prob, advantages, clip_low, clip_high, kind, clip_ratio_c=3.0):
    # verl verl/trainer/ppo/core_algos.py, compute_policy_loss_dppo_tv / _dppo_kl (arXiv 2602.04879;
    # not in the b178a3c mirror: transcribed from verl's code as carried after Feb 2026). clip_ratio_c is
    # config.get("clip_ratio_c", 20.0) there, and verl 0.9.1's ActorConfig always holds it: 3.0 unless set.
    negative_approx_kl = torch.clamp(log_prob - old_log_prob, min=-20.0, max=20.0)
    ratio = torch.exp(negative_approx_kl)
    truncated_ratio = torch.clamp(ratio, max=clip_ratio_c).detach()
    prob = torch.exp(log_prob)
    old_prob = torch.exp(old_log_prob)
    if kind == "tv":
        valid_positive_mask = (prob - old_prob) <= clip_high
        valid_negative_mask = (prob - old_prob) >= -clip_low
    else:
        binary_kl = old_prob * (old_log_prob - log_prob) + (1 - old_prob) * torch.log(
            (1.0 - old_prob + 1e-8) / (1.0 - prob + 1e-8)
        )
        valid_positive_mask = (binary_kl <= clip_high) | (prob <= old_prob)
        valid_negative_mask = (binary_kl <= clip_low) | (prob >= old_prob)
    valid_mask = torch.where(advantages > 0, valid_positive_mask, valid_negative_mask).detach().float()
    return -advantages * truncated_ratio * log_prob * valid_mask


@pytest.mark.parametrize("seed", range(5))
@pytest.mark.parametrize("kind", ["tv", "kl"])
def test_dppo_matches_verl(seed, kind):
    logp, old, adv, mask = random_batch(seed)
    eps = (0.15, 0.1) if kind == "tv" else (0.05, 0.03)
    a = logp.clone().requires_grad_(True)
    ours, _ = compute_policy_loss(f"dppo_{kind}", a, old, adv, mask, PolicyLossConfig(eps_low=eps[0], eps_high=eps[1]))
    b = logp.clone().requires_grad_(True)
    theirs = verl_dppo(old, b, adv, eps[0], eps[1], kind) * mask
    torch.testing.assert_close(ours, theirs, atol=1e-12, rtol=1e-12)
    (ga,), (gb,) = torch.autograd.grad(ours.sum(), a), torch.autograd.grad(theirs.sum(), b)
    torch.testing.assert_close(ga, gb, atol=1e-12, rtol=1e-12)


# ---- Clip-Cov / KL-Cov ------------------------------------------------------------------------


def test_clip_cov_zeroes_the_drawn_in_band_token():
    # A = [1, -1, 1, -1], logp = [-1, -1, -3, -3] at ratio 1: mean A = 0, mean logp = -2,
    # Cov = A (logp + 2) = [1, -1, -1, 1]. Band (0.5, 2): tokens 0 and 3; k = max(1, floor(0.25 * 4)) = 1.
    logp = torch.tensor([[-1.0, -1.0, -3.0, -3.0]], dtype=torch.float64)
    adv = [[1.0, -1.0, 1.0, -1.0]]
    drawn = set()
    for seed in range(20):
        loss, grad, diag = run("clip_cov", [[0.0] * 4], adv, old=logp, clip_cov_ratio=0.25, clip_cov_lb=0.5,
                               clip_cov_ub=2.0, cov_seed=seed)
        zero = [i for i in range(4) if loss[0, i] == 0]
        assert len(zero) == 1 and zero[0] in (0, 3)  # one token, from the band
        drawn.add(zero[0])
        assert grad[0, zero[0]] == 0 and diag.zero_grad[0, zero[0]]
        others = [i for i in range(4) if i != zero[0]]
        assert grad[0, others].tolist() == [-a for a in [adv[0][i] for i in others]]  # -A at ratio 1
        assert diag.metrics["clip_cov/selected_mean"].item() == 0.25
    assert drawn == {0, 3}  # the draw is random among the band
    again = run("clip_cov", [[0.0] * 4], adv, old=logp, clip_cov_ratio=0.25, clip_cov_lb=0.5, clip_cov_ub=2.0, cov_seed=3)
    assert torch.equal(again[0], run("clip_cov", [[0.0] * 4], adv, old=logp, clip_cov_ratio=0.25, clip_cov_lb=0.5,
                                     clip_cov_ub=2.0, cov_seed=3)[0])  # a seed repeats its draw


def verl_clip_cov(old_log_prob, log_prob, advantages, response_mask, cliprange_low, cliprange_high,
                  clip_cov_ratio, clip_cov_lb, clip_cov_ub):
    # verl verl/trainer/ppo/core_algos.py, compute_policy_loss_clip_cov (b178a3c):
    def masked_mean(x, m):
        return (x * m).sum() / m.sum()

    negative_approx_kl = log_prob - old_log_prob
    ratio = torch.exp(negative_approx_kl)
    pg_losses1 = -advantages * ratio
    corr = torch.ones_like(advantages)
    pg_losses2 = -advantages * torch.clamp(ratio, 1 - cliprange_low, 1 + cliprange_high)
    clip_by_origin = (pg_losses2 > pg_losses1) & (response_mask > 0)
    cov_all = (advantages - masked_mean(advantages, response_mask)) * (
        log_prob - masked_mean(log_prob.detach(), response_mask))
    cov_all[response_mask == 0] = -torch.inf
    cov_all[clip_by_origin] = -torch.inf
    clip_num = max(int(clip_cov_ratio * response_mask.sum().item()), 1)
    top_k_idx = (cov_all < clip_cov_ub) & (cov_all > clip_cov_lb) & (response_mask > 0)
    top_k_idx = torch.nonzero(top_k_idx)
    if len(top_k_idx) > 0:
        perm = torch.randperm(len(top_k_idx))
        top_k_idx = top_k_idx[perm[: min(clip_num, len(top_k_idx))]]
    else:
        top_k_idx = torch.empty((0, 2), device=cov_all.device, dtype=torch.long)
    corr[top_k_idx[:, 0], top_k_idx[:, 1]] = 0
    return torch.maximum(pg_losses1, pg_losses2) * corr


@pytest.mark.parametrize("seed", range(5))
def test_clip_cov_matches_verl_with_the_same_random_draw(seed):
    logp, old, adv, mask = random_batch(seed, B=8, T=9)
    cfg = dict(eps_low=0.2, eps_high=0.28, clip_cov_ratio=0.2, clip_cov_lb=-0.3, clip_cov_ub=0.3)
    torch.manual_seed(1000 + seed)  # cov_seed=None: the global generator, as verl's torch.randperm
    ours, _ = compute_policy_loss("clip_cov", logp, old, adv, mask, PolicyLossConfig(**cfg))
    torch.manual_seed(1000 + seed)
    theirs = verl_clip_cov(old, logp, adv, mask, 0.2, 0.28, 0.2, -0.3, 0.3) * mask
    assert (ours == 0).sum() > (mask == 0).sum()  # some valid token was drawn
    torch.testing.assert_close(ours, theirs, atol=1e-12, rtol=1e-12)


def test_kl_cov_penalises_the_top_covariance_tokens():
    # A = [2, -1, 1, -2], logp = [-1, -2, -3, -4], ratio e^[0.1, -0.2, 0.3, 0.1] (old = logp - l):
    # mean A = 0, mean logp = -2.5: Cov = A (logp + 2.5) = [3, 0.5, -0.5, 3]; k = floor(0.5 * 4) = 2 -> tokens 0, 3
    logp = torch.tensor([[-1.0, -2.0, -3.0, -4.0]], dtype=torch.float64)
    lr = torch.tensor([[0.1, -0.2, 0.3, 0.1]], dtype=torch.float64)
    adv = [[2.0, -1.0, 1.0, -2.0]]
    loss, grad, diag = run("kl_cov", lr, adv, old=logp - lr, kl_cov_ratio=0.5, kl_cov_coef=0.5)
    r = lr.exp()[0].tolist()
    # loss = -A rho + 0.5 |l| on tokens 0 and 3; d/dlogp = -A rho + 0.5 sign(l) there
    assert_values(loss, [[-2 * r[0] + 0.05, r[1], -r[2], 2 * r[3] + 0.05]], atol=1e-12)
    assert_values(grad, [[-2 * r[0] + 0.5, r[1], -r[2], 2 * r[3] + 0.5]], atol=1e-12)
    assert diag.metrics["kl_cov/selected_mean"].item() == 0.5


def verl_kl_cov(old_log_prob, log_prob, advantages, response_mask, kl_cov_ratio, ppo_kl_coef):
    # verl verl/trainer/ppo/core_algos.py, compute_policy_loss_kl_cov (b178a3c):
    negative_approx_kl = log_prob - old_log_prob
    abs_kl = negative_approx_kl.abs()
    ratio = torch.exp(negative_approx_kl)
    pg_losses1 = -advantages * ratio
    pg_losses_kl = -advantages * ratio + ppo_kl_coef * abs_kl
    pg_losses = pg_losses1
    all_valid = response_mask > 0
    all_valid_idx = torch.nonzero(all_valid.reshape(-1), as_tuple=True)[0]
    all_valid_adv = advantages[all_valid].detach().reshape(-1).cpu()
    all_valid_logp = log_prob[all_valid].detach().reshape(-1).cpu()
    k = min(kl_cov_ratio, len(all_valid_adv))
    if k != 0:
        cov_lst_all = (all_valid_adv - all_valid_adv.mean()) * (all_valid_logp - all_valid_logp.mean())
        k_percent_nums = max(1, int(len(cov_lst_all) * kl_cov_ratio))
        large_cov_idxs = torch.topk(cov_lst_all, k_percent_nums, largest=True).indices
        if len(large_cov_idxs) != 0:
            large_cov_idxs = all_valid_idx[large_cov_idxs]
            pg_losses[large_cov_idxs // advantages.shape[1], large_cov_idxs % advantages.shape[1]] = pg_losses_kl[
                large_cov_idxs // advantages.shape[1], large_cov_idxs % advantages.shape[1]]
    return pg_losses


@pytest.mark.parametrize("seed,ratio", [(seed, ratio) for seed in range(5) for ratio in (0.1, 0.5, 1.0)])
def test_kl_cov_matches_verl(seed, ratio):
    # without ties the stable top-k (ties to the earlier token) selects exactly what verl's topk does
    logp, old, adv, mask = random_batch(seed, B=8, T=9)
    a = logp.clone().requires_grad_(True)
    ours, _ = compute_policy_loss("kl_cov", a, old, adv, mask, PolicyLossConfig(kl_cov_ratio=ratio, kl_cov_coef=0.7))
    b = logp.clone().requires_grad_(True)
    theirs = verl_kl_cov(old, b, adv, mask, ratio, 0.7) * mask
    torch.testing.assert_close(ours, theirs, atol=1e-12, rtol=1e-12)
    (ga,), (gb,) = torch.autograd.grad(ours.sum(), a), torch.autograd.grad(theirs.sum(), b)
    torch.testing.assert_close(ga, gb, atol=1e-12, rtol=1e-12)


@pytest.mark.parametrize("seed", range(8))
def test_kl_cov_and_clip_cov_match_verl_on_large_float32_batches(seed):
    """fp32, 64 x 256 tokens, per-token advantages: the selections and losses are verl's (only a
    batch of one value up to rounding is centred differently, to exactly 0). KL-Cov at ratio 0.5
    reaches deep into near-zero covariances; Clip-Cov's band (-0.3, 0.3) straddles 0."""
    logp, old, _, mask = (t.float() for t in random_batch(seed, B=64, T=256))
    adv = torch.randn(64, 256, generator=torch.Generator().manual_seed(seed + 99))
    ours, _ = compute_policy_loss("kl_cov", logp, old, adv, mask, PolicyLossConfig(kl_cov_ratio=0.5, kl_cov_coef=0.7))
    torch.testing.assert_close(ours, verl_kl_cov(old, logp.clone(), adv, mask, 0.5, 0.7) * mask)
    cfg = dict(eps_low=0.2, eps_high=0.28, clip_cov_ratio=0.2, clip_cov_lb=-0.3, clip_cov_ub=0.3)
    torch.manual_seed(seed)
    ours, _ = compute_policy_loss("clip_cov", logp, old, adv, mask, PolicyLossConfig(**cfg))
    torch.manual_seed(seed)
    torch.testing.assert_close(ours, verl_clip_cov(old, logp, adv, mask, 0.2, 0.28, 0.2, -0.3, 0.3) * mask)


def test_a_tiny_real_covariance_is_kept_as_verl_keeps_it():
    """Only a constant batch is centred to 0. A = [1, 2, -2, 5e-15, -1] (mean 1e-15) and logp =
    [-2, -1, -3, -1.5, -2.5] (mean -2): Cov = [0, 2, 2, 2e-15, 0.5]. KL-Cov at ratio 0.8 (k = 4)
    penalises token 3 (Cov 2e-15 > 0), as verl's topk does; snapping deviations within 64 ulps of
    max |A| (this round's first fix) zeroed it and picked token 0 instead."""
    logp = torch.tensor([[-2.0, -1.0, -3.0, -1.5, -2.5]], dtype=torch.float64)
    adv = torch.tensor([[1.0, 2.0, -2.0, 5e-15, -1.0]], dtype=torch.float64)
    mask = torch.ones_like(adv)
    assert selected_valid_tokens("kl_cov", logp, adv, mask, kl_cov_ratio=0.8, kl_cov_coef=0.7) == [1, 2, 3, 4]
    old = logp - 0.01
    ours, _ = compute_policy_loss("kl_cov", logp, old, adv, mask, PolicyLossConfig(kl_cov_ratio=0.8, kl_cov_coef=0.7))
    torch.testing.assert_close(ours, verl_kl_cov(old, logp.clone(), adv, mask, 0.8, 0.7), atol=0, rtol=0)


def constant_advantage_batches():
    """Batches whose valid advantages are all one value, each with a copy where that value is one ulp
    off (0 becomes -0.0) and masked columns hold garbage: what padding does to ReMax advantages."""
    g = torch.Generator().manual_seed(17)
    for value in (-3.9116166465314377, -0.5711610821189331, 1.0 / 3.0, 0.1, 0.0, 2.5e-7, 1e6):
        for length, holes in ((6, False), (7, True), (12, True)):
            logp = -torch.rand(1, length, generator=g, dtype=torch.float64) * 3
            mask = torch.ones(1, length, dtype=torch.float64)
            if holes:
                mask[0, 1::3] = 0.0
            adv = torch.full((1, length), value, dtype=torch.float64) * mask
            off = torch.nextafter(adv, torch.full_like(adv, math.inf)) * mask if value else -adv  # 0 -> -0.0
            padded_mask = torch.cat([torch.zeros(1, 2, dtype=torch.float64), mask, torch.zeros(1, 3, dtype=torch.float64)], 1)
            pad = lambda x, fill: torch.cat([torch.full((1, 2), fill, dtype=x.dtype), x, torch.full((1, 3), fill, dtype=x.dtype)], 1)
            yield (logp, adv, mask), (pad(logp, 7.5), pad(off, 0.0), padded_mask)


def selected_valid_tokens(name, logp, adv, mask, **cfg):
    """Indices (in valid-token order) of the tokens Clip-Cov zeroed / KL-Cov penalised, read off the
    loss: at ratio e^0.01 (inside every trust region) an unselected token's loss is -A rho exactly."""
    old = logp - 0.01
    loss, diag = compute_policy_loss(name, logp, old, adv, mask, PolicyLossConfig(**cfg))
    plain = -adv * torch.exp(logp - old)
    chosen = (loss != plain) & (mask > 0)
    if name == "clip_cov" and (adv[mask > 0] == 0).all():  # -A rho = 0 = a zeroed loss: count only
        return ["?"] * round(diag.metrics["clip_cov/selected_mean"].item() * int(mask.sum()))
    return torch.nonzero(chosen[mask > 0]).squeeze(1).tolist()


def test_covariance_ties_go_to_the_earlier_valid_token_whatever_the_padding():
    # constant advantages: every Cov_t is 0 (a tie); KL-Cov penalises the first k valid tokens, and
    # an ulp of noise in the advantages or padding anywhere changes nothing (issue 17)
    for (logp, adv, mask), (plogp, padv, pmask) in constant_advantage_batches():
        n = int(mask.sum())
        cov = token_covariance(logp, adv, mask)
        assert (cov[mask > 0] == 0).all() and (token_covariance(plogp, padv, pmask)[pmask > 0] == 0).all()
        k = max(int(0.3 * n), 1)
        assert selected_valid_tokens("kl_cov", logp, adv, mask, kl_cov_ratio=0.3, kl_cov_coef=1.0) == list(range(k))
        assert selected_valid_tokens("kl_cov", plogp, padv, pmask, kl_cov_ratio=0.3, kl_cov_coef=1.0) == list(range(k))
        # Clip-Cov: Cov = 0 lies outside the open band (0, 1) for every token, inside (-1, 1)
        for lb, ub in ((0.0, 1.0), (-1.0, 0.0), (-1.0, 1.0)):
            cfg = dict(clip_cov_ratio=0.3, clip_cov_lb=lb, clip_cov_ub=ub, cov_seed=5)
            drawn = selected_valid_tokens("clip_cov", logp, adv, mask, **cfg)
            assert drawn == selected_valid_tokens("clip_cov", plogp, padv, pmask, **cfg)
            assert len(drawn) == (k if lb < 0 < ub else 0)


def test_kl_cov_equal_covariances_go_to_the_earlier_token():
    # A = [1, 1, -1, -1], logp = [-1, -1, -3, -3]: Cov = [1, 1, 1, 1]; k = 2 -> tokens 0, 1 (topk may pick any two)
    logp = torch.tensor([[-1.0, -1.0, -3.0, -3.0]], dtype=torch.float64)
    adv = torch.tensor([[1.0, 1.0, -1.0, -1.0]], dtype=torch.float64)
    mask = torch.ones_like(adv)
    assert token_covariance(logp, adv, mask).tolist() == [[1.0, 1.0, 1.0, 1.0]]
    assert selected_valid_tokens("kl_cov", logp, adv, mask, kl_cov_ratio=0.5, kl_cov_coef=1.0) == [0, 1]
    # the last two tie with each other below the first: [2, 2, 1, 1] -> k = 3 takes 0, 1 and then 2
    logp = torch.tensor([[-1.0, -1.0, -2.0, -2.0]], dtype=torch.float64)
    adv = torch.tensor([[2.0, 2.0, -2.0, -2.0]], dtype=torch.float64)
    assert selected_valid_tokens("kl_cov", logp, adv, mask, kl_cov_ratio=0.75, kl_cov_coef=1.0) == [0, 1, 2]


# ---- GPG ------------------------------------------------------------------------------------


def test_gpg_is_the_plain_policy_gradient_whatever_the_ratio():
    # loss = -A logp (verl compute_policy_loss_gpg: pg_losses = -log_prob * advantages); d/dlogp = -A,
    # also far off-policy (no ratio, no clip) and whatever reinforce_form says
    old = torch.tensor([[-1.0, -2.0, -0.5]], dtype=torch.float64)
    lr = [[2.0, -3.0, 0.0]]
    loss, grad, diag = run("gpg", lr, [[1.5, -2.0, 0.0]], old=old, reinforce_form="ratio")
    assert_values(loss, [[-1.5 * 1.0, 2.0 * -5.0, 0.0]], atol=1e-12)
    assert_values(grad, [[-1.5, 2.0, 0.0]], atol=1e-12)
    assert diag.zero_grad[0].tolist() == [False, False, True]


# ---- config --------------------------------------------------------------------------------


@pytest.mark.parametrize("kwargs, field", [
    ({"sapo_tau_pos": 0.0}, "sapo_tau_pos"), ({"sapo_tau_neg": -1.0}, "sapo_tau_neg"),
    ({"clip_cov_ratio": 0.0}, "clip_cov_ratio"), ({"kl_cov_ratio": 1.5}, "kl_cov_ratio"),
    ({"clip_cov_lb": 5.0, "clip_cov_ub": 1.0}, "clip_cov_lb"), ({"kl_cov_coef": -0.1}, "kl_cov_coef"),
])
def test_bad_settings_name_the_field(kwargs, field):
    with pytest.raises(ValueError, match=field):
        PolicyLossConfig(**kwargs)


# ---- off-policy sequence masks: slime OPSM vs TRL off_policy_mask_threshold ----------------------

from workbench.core.masks import off_policy_sequence_mask, opsm_mask  # noqa: E402


def test_opsm_and_trl_mask_agree_on_sequence_advantages_and_trainer_log_probs():
    # rows: drift mean(old - logp) = 0.6 (A < 0) -> both drop; 0.2 (A < 0) -> keep; 0.6 (A > 0) -> keep;
    # 0.5 exactly at the threshold (A < 0) -> kept by both (the tests are strict ">")
    logp = torch.tensor([[-1.0, -2.0], [-1.0, -1.0], [-1.0, -2.0], [-1.0, -1.0]], dtype=torch.float64)
    old = torch.tensor([[-0.4, -1.4], [-0.8, -0.8], [-0.4, -1.4], [-0.5, -0.5]], dtype=torch.float64)
    adv = torch.tensor([[-1.0], [-1.0], [1.0], [-1.0]], dtype=torch.float64).expand(4, 2)
    mask = torch.ones(4, 2, dtype=torch.float64)
    expected = [[0, 0], [1, 1], [1, 1], [1, 1]]
    assert_values(opsm_mask(logp, old, adv, mask, 0.5), expected)
    assert_values(off_policy_sequence_mask(logp, old, adv, mask, 0.5), expected)


def test_trl_mask_reads_the_rollout_engines_log_probs_opsm_the_trainers():
    # the trainer's old log-probs equal the current ones (no drift: OPSM keeps everything), but the
    # rollout engine scored the first sequence 0.75 nats/token higher: TRL's mask drops it
    logp = torch.tensor([[-1.0, -2.0], [-1.0, -2.0]], dtype=torch.float64)
    rollout = torch.tensor([[-0.25, -1.25], [-1.0, -2.0]], dtype=torch.float64)
    adv = torch.full((2, 2), -1.0, dtype=torch.float64)
    mask = torch.ones(2, 2, dtype=torch.float64)
    assert_values(opsm_mask(logp, logp, adv, mask, 0.5), [[1, 1], [1, 1]])
    assert_values(off_policy_sequence_mask(logp, rollout, adv, mask, 0.5), [[0, 0], [1, 1]])


def test_with_token_level_advantages_trl_keeps_the_non_negative_tokens_opsm_drops_the_sequence():
    # drift 1.0 > 0.5; token advantages (+2, -1, -3): mean -2/3 < 0 -> OPSM drops all three;
    # TRL drops only the tokens with A_t < 0. The padded 4th position stays 0 in both.
    logp = torch.tensor([[-2.0, -2.0, -2.0, 0.0]], dtype=torch.float64)
    old = torch.tensor([[-1.0, -1.0, -1.0, 0.0]], dtype=torch.float64)
    adv = torch.tensor([[2.0, -1.0, -3.0, 0.0]], dtype=torch.float64)
    mask = torch.tensor([[1.0, 1.0, 1.0, 0.0]], dtype=torch.float64)
    assert_values(opsm_mask(logp, old, adv, mask, 0.5), [[0, 0, 0, 0]])
    assert_values(off_policy_sequence_mask(logp, old, adv, mask, 0.5), [[1, 0, 0, 0]])


def test_trl_mask_counts_a_nan_engine_log_prob_as_no_drift():
    # tokens: drift 1.2 and NaN -> (1.2 + 0) / 2 = 0.6 > 0.5: dropped; with 0.7 as threshold kept
    logp = torch.tensor([[-1.0, -1.0]], dtype=torch.float64)
    rollout = torch.tensor([[0.2, math.nan]], dtype=torch.float64)
    adv = torch.full((1, 2), -1.0, dtype=torch.float64)
    mask = torch.ones(1, 2, dtype=torch.float64)
    assert_values(off_policy_sequence_mask(logp, rollout, adv, mask, 0.5), [[0, 0]])
    assert_values(off_policy_sequence_mask(logp, rollout, adv, mask, 0.7), [[1, 1]])


@pytest.mark.parametrize("seed", range(4))
def test_trl_mask_matches_trls_get_off_policy_mask(seed):
    from tests.helpers import missing_component

    try:
        from trl.trainer.grpo_trainer import GRPOTrainer
    except ImportError as err:  # pragma: no cover
        missing_component(f"trl is not importable ({err})")
    logp, old, _, mask = random_batch(seed, B=16)
    g = torch.Generator().manual_seed(100 + seed)
    rollout = old + torch.randn(old.shape, generator=g, dtype=torch.float64) * 0.5
    adv = torch.randn(old.shape[0], 1, generator=g, dtype=torch.float64)
    theirs = GRPOTrainer.get_off_policy_mask(adv, logp, rollout, mask, 0.1)  # (B, 1)
    ours = off_policy_sequence_mask(logp, rollout, adv.expand_as(logp), mask, 0.1)
    assert_values(ours, theirs * mask)
    assert 0 < float(theirs.mean()) < 1  # the draw exercises both outcomes


def test_sequence_clip_fractions_hand_values():
    """TRL 1.16's masked_seq_mean of the low / high clip flags: per sequence over its valid tokens,
    NaN for a sequence without any (TRL's nanmin / nanmax then skip it)."""
    from workbench.core import PADDING, sequence_clip_fractions

    # codes: 0 trust, 1 clipped_high, 2 clipped_low, 3 dual_clipped, -1 padding
    region = torch.tensor([[2, 2, 0, 1], [1, 3, PADDING, PADDING], [PADDING, PADDING, PADDING, PADDING]])
    out = sequence_clip_fractions(region, region != PADDING)
    assert out["clip_ratio/low_min"][:2].tolist() == [0.5, 0.0]  # dual-clipped tokens are not low-clipped
    assert out["clip_ratio/high_max"][:2].tolist() == [0.25, 0.5]
    assert math.isnan(out["clip_ratio/low_min"][2]) and math.isnan(out["clip_ratio/high_max"][2])
