"""verl 0.9.1's optimal token baselines (``optimal_token_baseline``, ``tir_optimal_token_baseline``):
a hand-derived example, and verl's functions transcribed below, compared in float64 at
atol = rtol = 1e-12 on random groups (right padding, holes, rollout IS weights, zero tails).

Anchor: verl 0.9.1 (PyPI wheel verl-0.9.1-py3-none-any.whl, sha256 db6e6f2a...),
verl/trainer/ppo/core_algos.py ``compute_optimal_token_baseline_advantage`` and
``compute_multi_turn_optimal_token_baseline_advantage``; the inputs as verl's ray_trainer.py
``compute_advantage`` passes them (old_log_probs, sum_pi_squared, rollout_is_weights; defaults
handle_zero_tail=True, epsilon=1e-8).
"""

import math
from collections import defaultdict

import numpy as np
import pytest
import torch

from tests.helpers import assert_values
from workbench.core import AdvantageConfig, compute_advantages, sum_pi_squared_from_logits, token_level_rewards

TIGHT = dict(atol=1e-12, rtol=1e-12)
NAMES = ("optimal_token_baseline", "tir_optimal_token_baseline")


def otb(name, rewards, mask, G, old_logp, sum_pi_sq, is_weights=None):
    return compute_advantages(name, torch.as_tensor(rewards, dtype=torch.float64), torch.as_tensor(mask, dtype=torch.float64),
                              AdvantageConfig(group_size=G), old_logp=torch.as_tensor(old_logp, dtype=torch.float64),
                              sum_pi_squared=torch.as_tensor(sum_pi_sq, dtype=torch.float64), is_weights=is_weights)


@pytest.mark.parametrize("name", NAMES)
def test_hand_example(name):
    # one group of two. row 0: two tokens, reward 1, pi = 0.5, sum pi^2 = 0.5 -> ||s||^2 = 1 - 1 + 0.5 = 0.5
    #                   row 1: one token, reward 0, pi = 0.25, sum pi^2 = 0.25 -> ||s||^2 = 1 - 0.5 + 0.25 = 0.75
    # W (cumulative): row 0 [0.5, 1.0], row 1 [0.75, -]; returns G: row 0 [1, 1], row 1 [0, -]
    # t = 0: B = (1 * 0.5 + 0 * 0.75) / (0.5 + 0.75 + 1e-8) = 0.4 (to 1e-8): A = [0.6, -0.4]
    # t = 1: row 0 alone and strictly the longest: zero tail, B = 0, A = G = 1
    b0 = 0.5 / (1.25 + 1e-8)
    out = otb(name, [1.0, 0.0], [[1, 1], [1, 0]], 2, [[math.log(0.5)] * 2, [math.log(0.25)] * 2], [[0.5, 0.5], [0.25, 0.25]])
    assert_values(out.advantages, [[1 - b0, 1.0], [-b0, 0.0]], atol=1e-14)
    assert_values(out.returns, [[1.0, 1.0], [0.0, 0.0]], atol=0)


def test_sum_pi_squared_from_logits():
    # softmax([0, log 3]) = [0.25, 0.75]: 0.0625 + 0.5625 = 0.625; uniform over 4: 4 / 16 = 0.25
    logits = torch.tensor([[[0.0, math.log(3.0)], [0.0, 0.0]]], dtype=torch.float64)
    assert_values(sum_pi_squared_from_logits(logits), [[0.625, 0.5]], atol=1e-15)
    assert sum_pi_squared_from_logits(torch.zeros(1, 1, 4)).item() == pytest.approx(0.25)


@pytest.mark.parametrize("name", NAMES)
def test_policy_statistics_are_required(name):
    with pytest.raises(ValueError, match="old_logp and sum_pi_squared"):
        compute_advantages(name, torch.zeros(2), torch.ones(2, 3), AdvantageConfig(group_size=2))


# ---- verl transcribed ----------------------------------------------------------------------------


def verl_otb(token_level_rewards, response_mask, index, old_log_probs, sum_pi_squared, rollout_is_weights=None,
             handle_zero_tail=True, epsilon=1e-8):
    # verl 0.9.1 core_algos.compute_optimal_token_baseline_advantage:
    with torch.no_grad():
        batch_size, seq_len = token_level_rewards.shape
        device = token_level_rewards.device
        returns = (token_level_rewards * response_mask).flip(dims=[-1]).cumsum(dim=-1).flip(dims=[-1])
        pi_t = torch.exp(old_log_probs)
        w_per_timestep = 1 - 2 * pi_t + sum_pi_squared
        if rollout_is_weights is not None:
            w_per_timestep = w_per_timestep * (rollout_is_weights**2)
        w_cumulative = (w_per_timestep * response_mask).cumsum(dim=-1)
        prompt_groups = defaultdict(list)
        for i in range(batch_size):
            prompt_groups[index[i]].append(i)
        baselines = torch.zeros_like(returns)
        for _, trajectory_indices in prompt_groups.items():
            N = len(trajectory_indices)
            if N == 1:
                continue
            traj_idx = torch.tensor(trajectory_indices, device=device)
            returns_group = returns[traj_idx]
            w_cumulative_group = w_cumulative[traj_idx]
            mask_group = response_mask[traj_idx]
            numerator = (returns_group * w_cumulative_group * mask_group).sum(dim=0)
            denominator = (w_cumulative_group * mask_group).sum(dim=0) + epsilon
            baseline_per_step = numerator / denominator
            baselines[traj_idx] = baseline_per_step.unsqueeze(0).expand(N, -1)
            if handle_zero_tail:
                response_lengths = mask_group.sum(dim=-1)
                sorted_lengths, _ = torch.sort(response_lengths)
                max_length = int(sorted_lengths[-1].item())
                second_max_length = int(sorted_lengths[-2].item())
                max_length_idx = (response_lengths == max_length).nonzero(as_tuple=True)[0]
                if max_length_idx.numel() == 1 and max_length > second_max_length:
                    max_length_traj_idx = trajectory_indices[int(max_length_idx[0])]
                    baselines[max_length_traj_idx, second_max_length:] = 0.0
        advantages = (returns - baselines) * response_mask
    return advantages, returns


def verl_tir_otb(token_level_rewards, response_mask, index, old_log_probs, sum_pi_squared, rollout_is_weights=None,
                 handle_zero_tail=True, epsilon=1e-8):
    # verl 0.9.1 core_algos.compute_multi_turn_optimal_token_baseline_advantage:
    with torch.no_grad():
        token_returns = (token_level_rewards * response_mask).flip(dims=[-1]).cumsum(dim=-1).flip(dims=[-1])
        pi_t = torch.exp(old_log_probs)
        w_per_timestep = 1 - 2 * pi_t + sum_pi_squared
        if rollout_is_weights is not None:
            w_per_timestep = w_per_timestep * (rollout_is_weights**2)
        w_cumulative = (w_per_timestep * response_mask).cumsum(dim=-1)
        response_lengths = response_mask.sum(dim=-1).to(dtype=torch.long)
        max_response_length = int(response_lengths.max().item()) if response_lengths.numel() > 0 else 0
        all_w_values = w_cumulative.new_zeros((len(response_lengths), max_response_length))
        all_returns = torch.zeros_like(all_w_values)
        for i in range(len(response_lengths)):
            length = int(response_lengths[i].item())
            if length == 0:
                continue
            mask = response_mask[i].bool()
            all_w_values[i, :length] = w_cumulative[i, mask]
            all_returns[i, :length] = token_returns[i, mask]
        prompt_groups = defaultdict(list)
        for i in range(len(response_lengths)):
            if response_lengths[i] == 0:
                continue
            prompt_groups[index[i]].append(i)
        baselines = torch.zeros_like(all_returns)
        for _, trajectory_indices in prompt_groups.items():
            N = len(trajectory_indices)
            traj_idx = torch.tensor(trajectory_indices, device=all_returns.device)
            if N == 1:
                baselines[traj_idx[0]] = 0.0
                continue
            w_group = all_w_values[traj_idx]
            R_group = all_returns[traj_idx]
            b_star = (R_group * w_group).sum(dim=0) / (w_group.sum(dim=0) + epsilon)
            baselines[traj_idx] = b_star.to(baselines.dtype)
            if handle_zero_tail:
                response_lengths_group = response_lengths[traj_idx]
                sorted_lengths, _ = torch.sort(response_lengths_group)
                max_length = int(sorted_lengths[-1].item())
                second_max_length = int(sorted_lengths[-2].item())
                max_length_idx = (response_lengths_group == max_length).nonzero(as_tuple=True)[0]
                if max_length_idx.numel() == 1 and max_length > second_max_length:
                    max_length_traj_idx = trajectory_indices[int(max_length_idx[0])]
                    baselines[max_length_traj_idx, second_max_length:] = 0.0
        all_advantages = all_returns - baselines
        advantages = torch.zeros_like(token_returns)
        for i in range(len(response_lengths)):
            if response_lengths[i] == 0:
                continue
            advantages[i, response_mask[i].bool()] = all_advantages[i, : response_lengths[i]]
        advantages = advantages * response_mask
    return advantages, token_returns


VERL = {"optimal_token_baseline": verl_otb, "tir_optimal_token_baseline": verl_tir_otb}


def random_groups(seed, N=3, G=4, T=9, holes=False, tie=False):
    g = torch.Generator().manual_seed(seed)
    B = N * G
    rewards = torch.randint(0, 3, (B,), generator=g).double() + torch.rand(B, generator=g, dtype=torch.float64)
    lengths = torch.randint(1, T + 1, (B,), generator=g)
    if tie:  # two longest of equal length in group 0: no zero tail there
        lengths[0] = lengths[1] = T
    mask = (torch.arange(T)[None] < lengths[:, None]).double()
    if holes:  # tool outputs masked out inside completions (never emptying a row)
        mask = mask * (torch.rand(B, T, generator=g) > 0.3).double()
        mask[:, 0] = 1.0
    logits = torch.randn(B, T, 11, generator=g, dtype=torch.float64) * 2
    logp_all = torch.log_softmax(logits, dim=-1)
    tokens = torch.randint(0, 11, (B, T), generator=g)
    old_logp = logp_all.gather(-1, tokens[..., None]).squeeze(-1)
    return rewards, mask, old_logp, sum_pi_squared_from_logits(logits), G


@pytest.mark.parametrize("name", NAMES)
@pytest.mark.parametrize("seed", range(5))
@pytest.mark.parametrize("holes", [False, True])
@pytest.mark.parametrize("with_is", [False, True])
def test_equals_verl(name, seed, holes, with_is):
    rewards, mask, old_logp, spp, G = random_groups(seed, holes=holes, tie=seed == 4)
    is_w = torch.exp(torch.randn(mask.shape, generator=torch.Generator().manual_seed(7), dtype=torch.float64) * 0.3) if with_is else None
    got = compute_advantages(name, rewards, mask, AdvantageConfig(group_size=G), old_logp=old_logp, sum_pi_squared=spp,
                             is_weights=is_w)
    index = np.repeat(np.arange(len(rewards) // G), G)
    want_adv, want_ret = VERL[name](token_level_rewards(rewards, mask), mask, index, old_logp, spp, is_w)
    torch.testing.assert_close(got.advantages, want_adv, **TIGHT)
    torch.testing.assert_close(got.returns, want_ret * mask, **TIGHT)


def test_the_two_agree_without_holes_and_differ_with_them():
    rewards, mask, old_logp, spp, G = random_groups(1)
    a, b = (compute_advantages(n, rewards, mask, AdvantageConfig(group_size=G), old_logp=old_logp, sum_pi_squared=spp)
            for n in NAMES)
    torch.testing.assert_close(a.advantages, b.advantages, **TIGHT)
    rewards, mask, old_logp, spp, G = random_groups(1, holes=True)
    a, b = (compute_advantages(n, rewards, mask, AdvantageConfig(group_size=G), old_logp=old_logp, sum_pi_squared=spp)
            for n in NAMES)
    assert not torch.allclose(a.advantages, b.advantages)


@pytest.mark.parametrize("name", NAMES)
def test_in_reward_kl_enters_the_returns(name):
    # r = 1 on the last token, -kl_coef kl_t on every token: G_t = 1 - 0.5 * (sum of kl from t on)
    rewards, mask = torch.tensor([1.0, 0.0], dtype=torch.float64), torch.ones(2, 3, dtype=torch.float64)
    kl = torch.tensor([[0.2, 0.4, 0.6], [0.0, 0.0, 0.0]], dtype=torch.float64)
    out = compute_advantages(name, rewards, mask, AdvantageConfig(group_size=2, kl_coef=0.5), kl=kl,
                             old_logp=torch.full((2, 3), -1.0, dtype=torch.float64), sum_pi_squared=torch.full((2, 3), 0.3, dtype=torch.float64))
    assert_values(out.returns, [[1 - 0.6, 1 - 0.5, 1 - 0.3], [0.0, 0.0, 0.0]], atol=1e-15)
