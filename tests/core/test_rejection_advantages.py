"""Advantages under rollout rejection (``keep``), as verl's driver computes them: rejection holes
response_mask AFTER the reward and the in-reward KL sit on the full mask and BEFORE
compute_advantage. Hand-derived values (comments show the arithmetic), then verl's own loops
transcribed below and compared in float64 on random holed batches.

Read: verl main @ b178a3cd (2026-01-29, version file 0.8.0.dev; the 0.9.1 wheel was not at hand):
verl/trainer/ppo/ray_trainer.py ``fit`` (apply_kl_penalty -> compute_rollout_correction_and_add_to_batch
-> compute_advantage) and verl/trainer/ppo/core_algos.py ``compute_gae_advantage_return``,
``compute_reinforce_plus_plus_outcome_advantage``.
"""

import math

import pytest
import torch

from workbench.core import AdvantageConfig, compute_advantages, masked_whiten, token_level_rewards

T64 = torch.float64
# B = 4 (two groups of 2), T = 3
MASK = torch.tensor([[1, 1, 1], [1, 1, 0], [1, 1, 1], [1, 1, 1]], dtype=T64)
KEEP = torch.tensor([[1, 0, 1],   # a token hole in the middle
                     [1, 1, 1],
                     [0, 0, 0],   # a rejected row (sequence-level rejection)
                     [1, 1, 1]], dtype=T64)
REWARDS = torch.tensor([1.0, 2.0, 3.0, 0.0], dtype=T64)
VALUES = torch.tensor([[0.1, 0.2, 0.3]] * 4, dtype=T64)


def assert_close(got, expected):
    torch.testing.assert_close(got, torch.tensor(expected, dtype=T64), rtol=0, atol=1e-12)


def adv(name, keep=KEEP, **cfg):
    return compute_advantages(name, REWARDS, MASK, AdvantageConfig(**cfg), values=VALUES, keep=keep)


def test_reinforce_pp_resets_the_return_at_a_hole_and_whitens_over_kept_tokens():
    # token rewards by the FULL mask: row0 [0,0,1], row1 [0,2,0] (last valid t=1), row2 [0,0,3], row3 0
    # verl's loop (gamma 1): row0 t2: G=1 (kept); t1: G=1, hole -> running 0; t0: G=0   -> returns [0, 1, 1]
    #                        row1: [2, 2, 0]; row3: [0, 0, 0]; row2 has no kept token
    # kept returns: 0, 1 | 2, 2 | 0, 0, 0 -> n 7, mean 5/7,
    #   unbiased var = (4*(5/7)^2 + (2/7)^2 + 2*(9/7)^2) / 6 = (266/49) / 6 = 19/21
    s = math.sqrt(19 / 21 + 1e-8)
    lo, mid, hi = -5 / 7 / s, 2 / 7 / s, 9 / 7 / s
    expected = [[lo, 0, mid], [hi, hi, 0], [0, 0, 0], [lo, lo, lo]]
    assert_close(adv("reinforce_pp", gamma=1.0).advantages, expected)
    # the token before the hole got return 0, not 1: the reward after a hole does not reach it (verl)


def test_gae_skips_a_hole_carrying_the_next_kept_value():
    # gamma 0.5, lam 1, V = [0.1, 0.2, 0.3]; delta_t = r_t + gamma V_next_kept - V_t
    # row0 (hole t1): A2 = 1 - 0.3 = 0.7; delta0 = 0 + 0.5*0.3 - 0.1 = 0.05; A0 = 0.05 + 0.5*0.7 = 0.4
    # row1 (T=2):     A1 = 2 - 0.2 = 1.8; delta0 = 0.5*0.2 - 0.1 = 0;        A0 = 0.5*1.8 = 0.9
    # row2 rejected:  0
    # row3 (r 0):     A2 = -0.3; delta1 = 0.15 - 0.2 = -0.05, A1 = -0.05 - 0.15 = -0.2; delta0 = 0, A0 = -0.1
    out = adv("gae", gamma=0.5, lam=1.0)
    expected = [[0.4, 0, 0.7], [0.9, 1.8, 0], [0, 0, 0], [-0.1, -0.2, -0.3]]
    assert_close(out.advantages, expected)
    # returns = A + V on kept tokens
    assert_close(out.returns, [[0.5, 0, 1.0], [1.0, 2.0, 0], [0, 0, 0], [0, 0, 0]])


def test_a_group_estimator_only_zeroes_the_rejected_tokens():
    # rloo, G = 2: group 1 [1 - 2, 2 - 1] = [-1, 1]; group 2 [3 - 0, 0 - 3] = [3, -3]
    # the rejected row 2 still counts in its group's baseline (verl sums token_level_rewards of every row)
    expected = [[-1, 0, -1], [1, 1, 0], [0, 0, 0], [-3, -3, -3]]
    assert_close(adv("rloo", group_size=2).advantages, expected)
    # and it is the unrejected estimator times the keep-mask, bit for bit
    full = compute_advantages("rloo", REWARDS, MASK, AdvantageConfig(group_size=2)).advantages
    assert torch.equal(adv("rloo", group_size=2).advantages, full * MASK * KEEP)


def test_whiten_is_over_the_kept_tokens():
    a = adv("rloo", group_size=2, whiten=True).advantages
    kept = (MASK * KEEP).bool()
    assert a[kept].mean().item() == pytest.approx(0.0, abs=1e-12)
    assert a[kept].std().item() == pytest.approx(1.0, abs=1e-6)
    assert torch.all(a[~kept] == 0)


def test_all_kept_equals_no_keep():
    for name, cfg in (("gae", dict(gamma=0.9, lam=0.8)), ("rloo", dict(group_size=2)),
                      ("reinforce_pp_baseline", dict(group_size=2))):
        plain = compute_advantages(name, REWARDS, MASK, AdvantageConfig(**cfg), values=VALUES).advantages
        ones = compute_advantages(name, REWARDS, MASK, AdvantageConfig(**cfg), values=VALUES,
                                  keep=torch.ones_like(MASK)).advantages
        assert torch.allclose(plain, ones, atol=1e-12), name


# ---- verl transcribed ----------------------------------------------------------------------------


def verl_gae(token_level_rewards, values, response_mask, gamma, lam):
    # core_algos.compute_gae_advantage_return (values are masked by the full mask in verl's critic)
    nextvalues = 0
    lastgaelam = 0
    advantages_reversed = []
    gen_len = token_level_rewards.shape[-1]
    for t in reversed(range(gen_len)):
        delta = token_level_rewards[:, t] + gamma * nextvalues - values[:, t]
        lastgaelam_ = delta + gamma * lam * lastgaelam
        nextvalues = values[:, t] * response_mask[:, t] + (1 - response_mask[:, t]) * nextvalues
        lastgaelam = lastgaelam_ * response_mask[:, t] + (1 - response_mask[:, t]) * lastgaelam
        advantages_reversed.append(lastgaelam)
    advantages = torch.stack(advantages_reversed[::-1], dim=1)
    returns = advantages + values
    advantages = masked_whiten(advantages, response_mask)
    return advantages, returns


def verl_reinforce_pp(token_level_rewards, response_mask, gamma):
    # core_algos.compute_reinforce_plus_plus_outcome_advantage
    returns = torch.zeros_like(token_level_rewards)
    running_return = 0
    for t in reversed(range(token_level_rewards.shape[1])):
        running_return = token_level_rewards[:, t] + gamma * running_return
        returns[:, t] = running_return
        running_return = running_return * response_mask[:, t]
    advantages = masked_whiten(returns, response_mask)
    advantages = advantages * response_mask
    return advantages, returns


def random_holed_batch(seed, B=8, T=11):
    g = torch.Generator().manual_seed(seed)
    lengths = torch.randint(1, T + 1, (B,), generator=g)
    mask = (torch.arange(T)[None, :] < lengths[:, None]).to(T64)
    keep = (torch.rand(B, T, generator=g) > 0.3).to(T64)
    keep[0] = 0  # one rejected row
    keep[1, lengths[1] - 1] = 0  # a rejected last token: its reward is dropped by verl's GAE
    rewards = torch.randn(B, generator=g, dtype=T64)
    kl = torch.randn(B, T, generator=g, dtype=T64).abs() * mask
    values = torch.randn(B, T, generator=g, dtype=T64) * mask
    return rewards, mask, keep, kl, values


@pytest.mark.parametrize("seed", range(5))
def test_equals_verl(seed):
    rewards, mask, keep, kl, values = random_holed_batch(seed)
    kept = mask * keep
    # verl's token_level_rewards: score at the original last token, minus beta*kl on the full mask
    tlr = token_level_rewards(rewards, mask, kl, 0.05)
    cfg = AdvantageConfig(gamma=0.9, lam=0.8, kl_coef=0.05, whiten=True)
    ours = compute_advantages("gae", rewards, mask, cfg, kl=kl, values=values, keep=keep)
    theirs, their_returns = verl_gae(tlr, values, kept, 0.9, 0.8)
    assert torch.allclose(ours.advantages, theirs * kept, atol=1e-10)  # rejected tokens: 0 here, out of the loss there
    assert torch.allclose(ours.returns, their_returns * kept, atol=1e-10)
    cfg = AdvantageConfig(gamma=0.9, kl_coef=0.05)
    ours = compute_advantages("reinforce_pp", rewards, mask, cfg, kl=kl, keep=keep)
    theirs, _ = verl_reinforce_pp(tlr, kept, 0.9)
    assert torch.allclose(ours.advantages, theirs, atol=1e-10)


def verl_opo(token_level_rewards, response_mask, index):
    # core_algos.compute_opo_outcome_advantage (b178a3c; the same in 0.9.1's transcription in test_zoo)
    response_length = response_mask.sum(dim=-1)
    scores = token_level_rewards.sum(dim=-1)
    by_score, by_len = {}, {}
    for i in range(scores.shape[0]):
        by_score.setdefault(index[i], []).append(scores[i])
        by_len.setdefault(index[i], []).append(response_length[i])
    baseline = {k: (torch.stack(by_len[k]) * torch.stack(v)).sum() / torch.stack(by_len[k]).sum() for k, v in by_score.items()}
    scores = torch.stack([scores[i] - baseline[index[i]] for i in range(scores.shape[0])])
    return scores.unsqueeze(-1) * response_mask


def random_holed_groups(seed, N=3, G=4, T=9):
    """Groups of G with right padding, token holes, one rejected row in group 0 and a rejected last
    token (whose reward, for the token-level estimators, then reaches no token), never a whole group
    rejected (verl's OPO divides 0 by 0 there)."""
    from workbench.core import sum_pi_squared_from_logits

    g = torch.Generator().manual_seed(100 + seed)
    B = N * G
    rewards = torch.randint(0, 3, (B,), generator=g).double() + torch.rand(B, generator=g, dtype=T64)
    lengths = torch.randint(2, T + 1, (B,), generator=g)
    mask = (torch.arange(T)[None] < lengths[:, None]).to(T64)
    keep = (torch.rand(B, T, generator=g) > 0.25).to(T64)
    keep[:, 0] = 1
    keep[1] = 0
    keep[5, lengths[5] - 1] = 0
    logits = torch.randn(B, T, 11, generator=g, dtype=T64) * 2
    old_logp = torch.log_softmax(logits, dim=-1).gather(-1, torch.randint(0, 11, (B, T), generator=g)[..., None]).squeeze(-1)
    return rewards, mask, keep, old_logp, sum_pi_squared_from_logits(logits), G


@pytest.mark.parametrize("seed", range(5))
def test_opo_and_the_optimal_token_baselines_read_the_holed_mask_as_verl(seed):
    """verl's driver gives OPO and the optimal token baselines response_mask * keep: OPO weighs each
    score by its kept length, the token baselines accumulate path variance and returns over kept
    tokens only (verl 0.9.1's functions transcribed in tests/core/test_missing_advantages.py)."""
    import numpy as np

    from tests.core.test_missing_advantages import VERL

    rewards, mask, keep, old_logp, spp, G = random_holed_groups(seed)
    kept, index = mask * keep, np.repeat(np.arange(len(rewards) // G), G)
    tlr = token_level_rewards(rewards, mask)  # the score on the full mask's last token
    ours = compute_advantages("opo", rewards, mask, AdvantageConfig(group_size=G), keep=keep)
    torch.testing.assert_close(ours.advantages, verl_opo(tlr, kept, index), rtol=0, atol=1e-12)
    assert torch.all(ours.advantages[1] == 0)  # the rejected row
    for name, verl_fn in VERL.items():
        ours = compute_advantages(name, rewards, mask, AdvantageConfig(group_size=G), old_logp=old_logp,
                                  sum_pi_squared=spp, keep=keep)
        want_adv, want_ret = verl_fn(tlr, kept, index, old_logp, spp)
        torch.testing.assert_close(ours.advantages, want_adv, rtol=1e-12, atol=1e-12)
        torch.testing.assert_close(ours.returns, want_ret * kept, rtol=1e-12, atol=1e-12)
    # and the holes matter: the full-mask OPO differs from the holed one
    plain = compute_advantages("opo", rewards, mask, AdvantageConfig(group_size=G)).advantages * kept
    assert not torch.allclose(plain, verl_opo(tlr, kept, index))
