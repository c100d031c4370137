"""ReMax, OPO, pass@k and multi-reward normalisation; the top-entropy token mask; rollout IS
correction. Hand-derived values, and the anchors' formulas (verl core_algos.py, TRL
grpo_trainer.py) transcribed below as reference implementations, compared on random inputs."""

import math

import pytest
import torch

from tests.helpers import assert_values
from workbench.core import AdvantageConfig, combine_rewards, compute_advantages, high_entropy_mask, rollout_correction


def random_group_batch(seed, N=4, G=4, T=6):
    g = torch.Generator().manual_seed(seed)
    rewards = torch.randint(0, 3, (N * G,), generator=g).double() * 0.5
    lengths = torch.randint(1, T + 1, (N * G,), generator=g)
    mask = (torch.arange(T)[None] < lengths[:, None]).double()
    return rewards, mask


# ---- ReMax -------------------------------------------------------------------------------------


def test_remax_subtracts_the_greedy_reward():
    mask = torch.tensor([[1.0, 1.0, 0.0], [1.0, 0.0, 0.0]])
    out = compute_advantages("remax", torch.tensor([1.0, 0.0]), mask, AdvantageConfig(group_size=2),
                             baselines=torch.tensor([0.25, 0.25]))
    assert out.advantages.tolist() == [[0.75, 0.75, 0.0], [-0.25, 0.0, 0.0]]


def test_remax_without_baselines_says_what_it_needs():
    with pytest.raises(ValueError, match="remax.*baselines"):
        compute_advantages("remax", torch.tensor([1.0, 0.0]), torch.ones(2, 2))
    with pytest.raises(ValueError, match=r"baselines must have shape \(B,\) = \(2,\)"):
        compute_advantages("remax", torch.tensor([1.0, 0.0]), torch.ones(2, 2), baselines=torch.zeros(3))


def verl_remax(token_level_rewards, reward_baselines, response_mask):
    # verl verl/trainer/ppo/core_algos.py, compute_remax_outcome_advantage (b178a3c):
    returns = (token_level_rewards * response_mask).flip(dims=[-1]).cumsum(dim=-1).flip(dims=[-1])
    advantages = returns - reward_baselines.unsqueeze(-1) * response_mask
    return advantages


def outcome_token_rewards(rewards, mask):
    """verl's token_level_rewards: the scalar reward on the last valid token."""
    last = torch.arange(mask.shape[1])[None] == (mask.sum(1, keepdim=True) - 1)  # prefix masks here
    return rewards[:, None] * last.double()


@pytest.mark.parametrize("seed", range(4))
def test_remax_matches_verl_without_in_reward_kl(seed):
    rewards, mask = random_group_batch(seed)
    baselines = torch.randn(rewards.shape, generator=torch.Generator().manual_seed(seed), dtype=torch.float64)
    ours = compute_advantages("remax", rewards, mask, AdvantageConfig(group_size=4), baselines=baselines).advantages
    torch.testing.assert_close(ours, verl_remax(outcome_token_rewards(rewards, mask), baselines, mask))


# ---- GPG ---------------------------------------------------------------------------------------


def test_gpg_rescales_by_the_share_of_informative_completions():
    # 3 groups of 2: (1, 0) informative, (1, 1) and (0, 0) all-equal -> M = 4 of B = 6.
    rewards = torch.tensor([1.0, 0.0, 1.0, 1.0, 0.0, 0.0])
    mask = torch.ones(6, 1)

    def adv(alpha, **kw):
        cfg = AdvantageConfig(group_size=2, **{"scale": "none", "gpg_alpha": alpha, **kw})
        return compute_advantages("gpg", rewards, mask, cfg).advantages[:, 0].tolist()

    # r - mean_g = (0.5, -0.5, 0, 0, 0, 0)
    assert adv("none") == [0.5, -0.5, 0.0, 0.0, 0.0, 0.0]
    assert adv("paper") == [1.5, -1.5, 0.0, 0.0, 0.0, 0.0]  # alpha = 6 / (6 - 4) = 3
    assert adv("verl") == [1.0, -1.0, 0.0, 0.0, 0.0, 0.0]  # alpha = 6 / #(r != 0) = 6 / 3 = 2
    # F_norm = std_g + eps: std of (1, 0) = 1/sqrt(2)
    assert_values(torch.tensor(adv("paper", eps=0.0, scale="group")[:2]), [3 * 0.5 * math.sqrt(2), -3 * 0.5 * math.sqrt(2)])
    zeros = compute_advantages("gpg", torch.ones(4), torch.ones(4, 2), AdvantageConfig(group_size=2, scale="none"))
    assert zeros.advantages.abs().sum() == 0  # every group equal: alpha = B / 1 never multiplies a nonzero


def verl_gpg(token_level_rewards, response_mask, index, f_norm=1.0):
    # verl verl/trainer/ppo/core_algos.py, compute_gpg_outcome_advantage, its loop vectorised:
    scores = token_level_rewards.sum(dim=-1)
    bsz = scores.shape[0]
    alpha = bsz / torch.count_nonzero(scores).clamp(min=1)
    means = {i: scores[torch.as_tensor(index) == i].mean() for i in set(index)}
    out = torch.stack([alpha * (scores[k] - means[index[k]]) / f_norm for k in range(bsz)])
    return out.unsqueeze(-1) * response_mask


@pytest.mark.parametrize("seed", range(4))
def test_gpg_verl_alpha_matches_verl(seed):
    rewards, mask = random_group_batch(seed)
    index = [k // 4 for k in range(rewards.numel())]
    ours = compute_advantages("gpg", rewards, mask, AdvantageConfig(group_size=4, scale="none", gpg_alpha="verl"))
    torch.testing.assert_close(ours.advantages, verl_gpg(outcome_token_rewards(rewards, mask), mask, index))


# ---- OPO ---------------------------------------------------------------------------------------


def test_opo_length_weighted_baseline():
    # group 1: r = [1, 0], n = [3, 1]: b = (3*1 + 1*0) / 4 = 0.75 -> A = [0.25, -0.75]
    # group 2: r = [2, 2] (all equal) -> exactly 0
    mask = torch.tensor([[1.0, 1.0, 1.0], [1.0, 0.0, 0.0], [1.0, 1.0, 0.0], [1.0, 0.0, 0.0]])
    out = compute_advantages("opo", torch.tensor([1.0, 0.0, 2.0, 2.0]), mask, AdvantageConfig(group_size=2))
    assert out.advantages.tolist() == [[0.25, 0.25, 0.25], [-0.75, 0.0, 0.0], [0.0, 0.0, 0.0], [0.0, 0.0, 0.0]]


def verl_opo(scores, response_length, index):
    # verl verl/trainer/ppo/core_algos.py, compute_opo_outcome_advantage (b178a3c), loop form:
    from collections import defaultdict

    scores = scores.clone()
    id2score, id2len, id2bsl = defaultdict(list), defaultdict(list), {}
    for i in range(scores.shape[0]):
        id2score[index[i]].append(scores[i])
        id2len[index[i]].append(response_length[i])
    for idx in id2score:
        if len(id2score[idx]) == 1:
            id2bsl[idx] = torch.tensor(0.0)
        else:
            score_tensor, len_tensor = torch.stack(id2score[idx]), torch.stack(id2len[idx])
            id2bsl[idx] = (len_tensor * score_tensor).sum() / len_tensor.sum()
    for i in range(scores.shape[0]):
        scores[i] = scores[i] - id2bsl[index[i]]
    return scores


@pytest.mark.parametrize("seed", range(4))
def test_opo_matches_verl(seed):
    rewards, mask = random_group_batch(seed)
    ours = compute_advantages("opo", rewards, mask, AdvantageConfig(group_size=4)).advantages
    index = [i // 4 for i in range(rewards.numel())]
    theirs = verl_opo(rewards, mask.sum(1), index)[:, None] * mask
    torch.testing.assert_close(ours, theirs, atol=1e-12, rtol=0)


# ---- pass@k ------------------------------------------------------------------------------------


def test_grpo_passk_credits_only_the_best():
    # group [1, 0, 0.5]: margin 1 - 0.5 = 0.5, std (Bessel) = 0.5 -> 0.5 / (0.5 + 1e-6); others 0
    # group [1, 1, 0]: a tie for the best -> margin 0 -> all 0
    r = torch.tensor([1.0, 0.0, 0.5, 1.0, 1.0, 0.0], dtype=torch.float64)
    out = compute_advantages("grpo_passk", r, torch.ones(6, 1, dtype=torch.float64), AdvantageConfig(group_size=3))
    assert out.advantages[:, 0].tolist() == pytest.approx([0.5 / (0.5 + 1e-6), 0, 0, 0, 0, 0], abs=1e-15)
    none = compute_advantages("grpo_passk", r, torch.ones(6, 1), AdvantageConfig(group_size=3, scale="none"))
    assert none.advantages[:, 0].tolist() == [0.5, 0, 0, 0, 0, 0]


def verl_passk(scores, index, epsilon, norm_adv_by_std_in_grpo):
    # verl verl/trainer/ppo/core_algos.py, compute_grpo_passk_outcome_advantage (b178a3c):
    from collections import defaultdict

    advantages = torch.zeros_like(scores)
    id2scores, id2indices = defaultdict(list), defaultdict(list)
    for i in range(scores.shape[0]):
        id2scores[index[i]].append(scores[i])
        id2indices[index[i]].append(i)
    for idx in id2scores:
        rewards = torch.stack(id2scores[idx])
        topk, topk_idx = torch.topk(rewards, 2)
        r_max, r_second_max = topk[0], topk[1]
        i_max = id2indices[idx][topk_idx[0].item()]
        advantage = r_max - r_second_max
        if norm_adv_by_std_in_grpo:
            advantage = advantage / (torch.std(rewards) + epsilon)
        advantages[i_max] = advantage
    return advantages


@pytest.mark.parametrize("seed", range(4))
@pytest.mark.parametrize("scale", ["group", "none"])
def test_grpo_passk_matches_verl(seed, scale):
    rewards, mask = random_group_batch(seed)
    rewards = rewards + torch.arange(rewards.numel()) * 1e-3  # distinct, so the best is unique in both
    ours = compute_advantages("grpo_passk", rewards, mask, AdvantageConfig(group_size=4, scale=scale)).advantages
    theirs = verl_passk(rewards, [i // 4 for i in range(16)], 1e-6, scale == "group")[:, None] * mask
    torch.testing.assert_close(ours, theirs, atol=1e-12, rtol=0)


# ---- several reward functions -------------------------------------------------------------------


def test_sum_then_normalize_is_the_weighted_sum():
    per_func = torch.tensor([[1.0, 0.0], [0.0, 2.0]])
    assert combine_rewards(per_func, torch.tensor([1.0, 0.5])).tolist() == [1.0, 1.0]


def test_normalize_then_sum_hand_values():
    # group of 2: f0 = [1, 0] -> (+-0.5) / (0.7071068 + eps); f1 = [0, 4] -> (-+2) / (2.8284271 + eps),
    # weights [1, 1]: with eps = 0 both normalise to +-0.7071068, so the sums are 0 -- f1's larger
    # scale no longer dominates (sum_then_normalize would give [1, 4], ranking by f1 alone).
    # group 2: f0 = [1, 1] (all equal -> 0), f1 = [3, 1] -> [+0.7071068, -0.7071068]
    per_func = torch.tensor([[1.0, 0.0], [0.0, 4.0], [1.0, 3.0], [1.0, 1.0]], dtype=torch.float64)
    out = combine_rewards(per_func, None, "normalize_then_sum", group_size=2, eps=0.0)
    assert out.tolist() == pytest.approx([0.0, 0.0, math.sqrt(0.5), -math.sqrt(0.5)], abs=1e-12)


def test_combine_rewards_rejects_bad_input():
    with pytest.raises(ValueError, match="mode='sum'"):
        combine_rewards(torch.ones(2, 2), mode="sum")
    with pytest.raises(ValueError, match=r"weights must have shape \(F,\) = \(2,\)"):
        combine_rewards(torch.ones(2, 2), torch.ones(3))
    with pytest.raises(ValueError, match="group_size=3"):
        combine_rewards(torch.ones(4, 2), group_size=3)


def trl_normalize_then_sum(rewards_per_func, reward_weights, num_generations):
    # TRL trl/trainer/grpo_trainer.py, multi_objective_aggregation == "normalize_then_sum" (f2cd577;
    # no NaN rows here, so nanmean / nanstd are mean / std):
    grouped = rewards_per_func.view(-1, num_generations, rewards_per_func.shape[1])
    mean_k = torch.mean(grouped, dim=1, keepdim=True)
    std_k = torch.std(grouped, dim=1, keepdim=True)
    reward_k = (grouped - mean_k) / (std_k + 1e-4)
    reward_k = reward_k.view(-1, rewards_per_func.shape[1])
    rewards = (reward_k * reward_weights.unsqueeze(0)).sum(dim=1)
    std_rewards = torch.std(rewards).expand_as(rewards)
    return (rewards - torch.mean(rewards)) / (std_rewards + 1e-4)


def verl_gdpo(per_func, weights, response_mask, group_size, epsilon=1e-6):
    # verl verl/trainer/ppo/core_algos.py, compute_gdpo_outcome_advantage (arXiv 2601.05242; after the
    # b178a3c mirror): GRPO per reward, weighted sum, verl_F.masked_whiten over tokens.
    new_advantage = 0
    for i in range(per_func.shape[1]):
        g = per_func[:, i].view(-1, group_size)
        scores = ((g - g.mean(1, keepdim=True)) / (g.std(1, keepdim=True) + epsilon)).reshape(-1)
        new_advantage = new_advantage + weights[i] * scores[:, None] * response_mask
    mean = (new_advantage * response_mask).sum() / response_mask.sum()
    var = (((new_advantage - mean) ** 2) * response_mask).sum() / (response_mask.sum() - 1)  # unbiased
    return (new_advantage - mean) * torch.rsqrt(var + 1e-8) * response_mask


@pytest.mark.parametrize("seed", range(4))
def test_normalize_then_sum_then_grpo_reproduces_trl_and_verl(seed):
    g = torch.Generator().manual_seed(seed)
    per_func = torch.cat([torch.randint(0, 2, (16, 1), generator=g), torch.randint(0, 5, (16, 1), generator=g) * 3],
                         dim=1).double()
    weights = torch.tensor([1.0, 0.5], dtype=torch.float64)
    _, mask = random_group_batch(seed)
    # TRL: eps 1e-4 in both normalisations, batch std over completions
    s = combine_rewards(per_func, weights, "normalize_then_sum", group_size=4, eps=1e-4)
    trl = compute_advantages("grpo", s, mask, AdvantageConfig(group_size=4, scale="batch", eps=1e-4)).advantages
    torch.testing.assert_close(trl[:, 0], trl_normalize_then_sum(per_func, weights, 4), atol=1e-9, rtol=0)
    # verl: eps 1e-6 per reward, then masked whitening over tokens
    s = combine_rewards(per_func, weights, "normalize_then_sum", group_size=4, eps=1e-6)
    verl = compute_advantages("grpo", s, mask, AdvantageConfig(group_size=4, scale="none", whiten=True)).advantages
    torch.testing.assert_close(verl, verl_gdpo(per_func, weights, mask, 4), atol=1e-9, rtol=0)


# ---- top-entropy tokens ------------------------------------------------------------------------


def test_high_entropy_mask_keeps_the_top_quantile():
    # valid entropies [1, 2, 3, 4, 5] (padding holds 9, ignored); rho = 0.5: Quantile_0.5 = 3 -> keep 3, 4, 5
    entropy = torch.tensor([[1.0, 5.0, 9.0], [3.0, 2.0, 4.0]])
    mask = torch.tensor([[1.0, 1.0, 0.0], [1.0, 1.0, 1.0]])
    assert high_entropy_mask(entropy, mask, 0.5).tolist() == [[0.0, 1.0, 0.0], [1.0, 0.0, 1.0]]
    # rho = 0.2: Quantile_0.8 = 4 + 0.2 * (5 - 4) = 4.2 -> keep 5 only; rho = 1 keeps every valid token
    assert high_entropy_mask(entropy, mask, 0.2).tolist() == [[0.0, 1.0, 0.0], [0.0, 0.0, 0.0]]
    assert torch.equal(high_entropy_mask(entropy, mask, 1.0), mask)
    with pytest.raises(ValueError, match="top_entropy_quantile=1.5"):
        high_entropy_mask(entropy, mask, 1.5)


def trl_high_entropy_mask(entropies, mask, threshold):
    # TRL trl/trainer/grpo_trainer.py, get_high_entropy_mask (f2cd577), one process:
    local = entropies[mask.bool()].float()
    entropy_threshold = torch.quantile(local, threshold)
    masked_entropies = entropies * mask.float()
    entropy_mask = masked_entropies >= entropy_threshold
    return entropy_mask & mask.bool()


@pytest.mark.parametrize("rho", [0.0, 0.2, 0.5, 0.9])
def test_high_entropy_mask_matches_trl(rho):
    g = torch.Generator().manual_seed(7)
    entropy = torch.rand(6, 9, generator=g) * 4
    _, mask = random_group_batch(3, N=2, G=3, T=9)
    ours = high_entropy_mask(entropy, mask.float(), rho)
    assert torch.equal(ours.bool(), trl_high_entropy_mask(entropy, mask, 1 - rho))


# ---- rollout / trainer mismatch --------------------------------------------------------------


OLD = torch.tensor([[0.0, -1.0, -2.0], [-1.0, -1.0, 5.0]], dtype=torch.float64)
ROLLOUT = torch.tensor([[-0.5, -0.8, -4.0], [-1.2, -0.5, 0.0]], dtype=torch.float64)
MASK = torch.tensor([[1.0, 1.0, 1.0], [1.0, 1.0, 0.0]], dtype=torch.float64)


def test_token_truncate_and_mask_hand_values():
    # log w = old - rollout = [[0.5, -0.2, 2.0], [0.2, -0.5, pad]]; w = e^.5 1.6487, e^-.2 0.8187, e^2 7.389, ...
    w, m = rollout_correction(OLD, ROLLOUT, MASK, level="token", mode="truncate", clip_min=None, clip_max=3.0)
    assert_values(w, [[math.exp(0.5), math.exp(-0.2), 3.0], [math.exp(0.2), math.exp(-0.5), 0.0]], atol=1e-12)
    assert m["sampling/sampling_logp_difference/mean"].item() == pytest.approx((0.5 + 0.2 + 2.0 + 0.2 + 0.5) / 5)
    assert m["sampling/sampling_logp_difference/max"].item() == pytest.approx(2.0)
    assert m["sampling/importance_sampling_ratio/min"].item() == pytest.approx(math.exp(-0.5))
    assert m["sampling/importance_sampling_ratio/max"].item() == pytest.approx(3.0)
    # IcePop-style masking to [0.7, 2]: e^2 and e^-0.5 = 0.6065 are dropped
    w, _ = rollout_correction(OLD, ROLLOUT, MASK, level="token", mode="mask", clip_min=0.7, clip_max=2.0)
    assert_values(w, [[math.exp(0.5), math.exp(-0.2), 0.0], [math.exp(0.2), 0.0, 0.0]], atol=1e-12)


def test_sequence_level_uses_the_product_of_token_ratios():
    # row 0: sum log w = 2.3 -> e^2.3 = 9.97; row 1: -0.3 -> 0.7408
    w, m = rollout_correction(OLD, ROLLOUT, MASK, level="sequence", mode="truncate", clip_max=3.0)
    assert_values(w, [[3.0, 3.0, 3.0], [math.exp(-0.3), math.exp(-0.3), 0.0]], atol=1e-12)
    assert m["sampling/importance_sampling_ratio/mean"].item() == pytest.approx((3.0 + math.exp(-0.3)) / 2)
    w, _ = rollout_correction(OLD, ROLLOUT, MASK, level="sequence", mode="mask", clip_min=0.5, clip_max=3.0)
    assert_values(w, [[0.0, 0.0, 0.0], [math.exp(-0.3), math.exp(-0.3), 0.0]], atol=1e-12)


def trl_is_ratio(old_per_token_logps, sampling_per_token_logps, mask, mode, clip_min, clip_max):
    # TRL trl/trainer/grpo_trainer.py, _generate_and_score_completions (f2cd577):
    per_token_logps_diff = (old_per_token_logps - sampling_per_token_logps) * mask
    sequence_level_is = mode in ["sequence_mask", "sequence_truncate"]
    logps_diff = per_token_logps_diff.sum(dim=-1, keepdim=True) if sequence_level_is else per_token_logps_diff
    ratio = torch.exp(logps_diff)
    if mode in ["sequence_truncate", "token_truncate"]:
        ratio = torch.clamp(ratio, min=clip_min, max=clip_max)
    else:
        min_val = clip_min if clip_min is not None else -math.inf
        max_val = clip_max if clip_max is not None else math.inf
        ratio = ratio.masked_fill((ratio < min_val) | (ratio > max_val), value=0.0)
    return ratio


@pytest.mark.parametrize("level", ["token", "sequence"])
@pytest.mark.parametrize("mode", ["truncate", "mask"])
@pytest.mark.parametrize("bounds", [(None, 3.0), (0.5, 2.0), (0.2, None)])
def test_rollout_correction_matches_trl(level, mode, bounds):
    g = torch.Generator().manual_seed(11)
    old = -torch.rand(6, 8, generator=g, dtype=torch.float64) * 3
    rollout = old + torch.randn(6, 8, generator=g, dtype=torch.float64) * 0.3
    _, mask = random_group_batch(5, N=2, G=3, T=8)
    ours, _ = rollout_correction(old, rollout, mask, level=level, mode=mode, clip_min=bounds[0], clip_max=bounds[1])
    theirs = trl_is_ratio(old, rollout, mask, f"{level}_{mode}", *bounds)
    torch.testing.assert_close(ours, theirs.expand_as(mask) * mask, atol=1e-12, rtol=1e-12)


def test_rollout_correction_rejects_bad_options():
    with pytest.raises(ValueError, match="level='seq'"):
        rollout_correction(OLD, ROLLOUT, MASK, level="seq")
    with pytest.raises(ValueError, match="clip_min=3"):
        rollout_correction(OLD, ROLLOUT, MASK, clip_min=3, clip_max=2)
