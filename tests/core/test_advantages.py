"""Advantage estimators against numbers worked out by hand (comments show the arithmetic)."""

import math

import pytest
import torch

from tests.helpers import assert_values
from workbench.core import GROUP_ESTIMATORS, AdvantageConfig, compute_advantages, token_level_rewards

EPS = 1e-6
FULL = torch.ones(6, 3)  # every completion has 3 valid tokens
# two prompts, G = 3:  group 1 = [1, 2, 3], group 2 = [0, 0, 4]
REWARDS = torch.tensor([1.0, 2.0, 3.0, 0.0, 0.0, 4.0], dtype=torch.float64)


def policy_stats(B, T):
    """old_logp and sum_pi_squared (B, T) for the estimators that read them (POLICY_STAT_ESTIMATORS)."""
    return {"old_logp": torch.full((B, T), -0.7), "sum_pi_squared": torch.full((B, T), 0.4)}


def seq_adv(name, rewards=REWARDS, mask=FULL, **cfg):
    out = compute_advantages(name, rewards, mask.to(rewards.dtype), AdvantageConfig(**cfg))
    return out.advantages[:, 0]


def test_grpo_group_scale():
    # group 1: mean 2, unbiased std sqrt((1 + 0 + 1) / 2) = 1            -> [-1, 0, 1] / (1 + eps)
    # group 2: mean 4/3, std sqrt(((4/3)^2 * 2 + (8/3)^2) / 2) = sqrt(16/3) -> [-4/3, -4/3, 8/3] / (2.3094 + eps)
    s2 = math.sqrt(16 / 3)
    expected = [-1 / (1 + EPS), 0.0, 1 / (1 + EPS), -4 / 3 / (s2 + EPS), -4 / 3 / (s2 + EPS), 8 / 3 / (s2 + EPS)]
    assert seq_adv("grpo", group_size=3, eps=EPS).tolist() == pytest.approx(expected, abs=1e-12)


def test_grpo_batch_scale_uses_std_of_whole_batch():
    # batch mean 10/6; sum of squared deviations 13.3333 -> unbiased var 13.3333 / 5 = 2.6667, std 1.63299
    std = math.sqrt((40 / 3) / 5)
    centered = [-1, 0, 1, -4 / 3, -4 / 3, 8 / 3]  # still centred on the *group* mean
    expected = [c / (std + EPS) for c in centered]
    assert seq_adv("grpo", group_size=3, scale="batch", eps=EPS).tolist() == pytest.approx(expected, abs=1e-12)


def test_dr_grpo_is_group_centred_reward():
    assert seq_adv("grpo", group_size=3, scale="none").tolist() == pytest.approx([-1, 0, 1, -4 / 3, -4 / 3, 8 / 3])


def test_trl_eps_changes_only_near_zero_std_groups():
    r = torch.tensor([1.0, 1.0, 1.0, 1.0 + 1e-5], dtype=torch.float64)
    trl = seq_adv("grpo", rewards=r, mask=torch.ones(4, 1), group_size=4, eps=1e-4)
    verl = seq_adv("grpo", rewards=r, mask=torch.ones(4, 1), group_size=4, eps=1e-6)
    # std = 5e-6: TRL's eps dominates (|A| ~ 0.07), verl's does not (|A| ~ 1.25)
    assert abs(trl[3].item()) == pytest.approx(7.5e-6 / (5e-6 + 1e-4), rel=1e-6)
    assert abs(verl[3].item()) == pytest.approx(7.5e-6 / (5e-6 + 1e-6), rel=1e-6)


def test_rloo_hand_values_and_identity_with_dr_grpo():
    # group 1: r=1 -> 1 - (2+3)/2 = -1.5; r=2 -> 2 - 2 = 0; r=3 -> 3 - 1.5 = 1.5
    # group 2: r=0 -> 0 - (0+4)/2 = -2 (twice); r=4 -> 4 - 0 = 4
    rloo = seq_adv("rloo", group_size=3)
    assert rloo.tolist() == pytest.approx([-1.5, 0.0, 1.5, -2.0, -2.0, 4.0])
    G = 3
    assert torch.allclose(rloo, G / (G - 1) * seq_adv("grpo", group_size=3, scale="none"))


@pytest.mark.parametrize("name", sorted(GROUP_ESTIMATORS))
def test_group_of_one_gets_zero_advantage(name):
    out = compute_advantages(name, torch.tensor([0.3, 5.0]), torch.ones(2, 4), AdvantageConfig(group_size=1),
                             **policy_stats(2, 4))  # read by the optimal token baselines only
    assert torch.equal(out.advantages, torch.zeros(2, 4))


def test_group_estimators_are_exactly_those_that_read_the_groups():
    """GROUP_ESTIMATORS (the recipe asks them for G >= 2) = the estimators whose advantages change
    with the grouping: a registered estimator cannot silently miss the set."""
    from workbench.core import ADVANTAGE_ESTIMATORS

    values = torch.tensor([[0.1, 0.2], [0.3, 0.1], [0.0, 0.5], [0.2, 0.2]])
    grouping = {}
    for name in ADVANTAGE_ESTIMATORS.names():
        a, b = (compute_advantages(name, REWARDS[:4], torch.ones(4, 2), AdvantageConfig(group_size=g), values=values,
                                   baselines=REWARDS[:4].flip(0), **policy_stats(4, 2)).advantages
                for g in (1, 2))
        grouping[name] = not torch.allclose(a, b)
    assert {name for name, reads in grouping.items() if reads} == GROUP_ESTIMATORS


def test_reinforce_batch_mean_baseline():
    m = 10 / 6
    assert seq_adv("reinforce").tolist() == pytest.approx([r - m for r in REWARDS.tolist()])


def test_sequence_advantages_broadcast_over_valid_tokens_only():
    mask = torch.tensor([[1, 1, 0], [1, 0, 0]], dtype=torch.float32)
    out = compute_advantages("rloo", torch.tensor([1.0, 0.0]), mask, AdvantageConfig(group_size=2))
    assert out.advantages.tolist() == [[1.0, 1.0, 0.0], [-1.0, 0.0, 0.0]]


def test_kl_in_reward_shapes_sequence_reward():
    # r - kl_coef * sum_t kl: row 0: 1 - 0.5 * (0.2 + 0.2) = 0.8; row 1: 0 - 0.5 * 0.4 = -0.2 (padding kl ignored)
    mask = torch.tensor([[1.0, 1.0], [1.0, 0.0]])
    kl = torch.tensor([[0.2, 0.2], [0.4, 9.0]])
    out = compute_advantages("rloo", torch.tensor([1.0, 0.0]), mask, AdvantageConfig(group_size=2, kl_coef=0.5), kl=kl)
    # RLOO of [0.8, -0.2]: [1.0, -1.0]
    assert out.advantages[:, 0].tolist() == pytest.approx([1.0, -1.0])


MASK_PP = torch.tensor([[1.0, 1.0, 1.0], [1.0, 1.0, 0.0]])
KL_PP = torch.tensor([[0.2, 0.2, 0.2], [0.4, 0.4, 9.0]])


def test_token_level_rewards():
    # -0.5 * kl on valid tokens, reward added on the last valid token
    tr = token_level_rewards(torch.tensor([1.0, 0.0]), MASK_PP, KL_PP, 0.5)
    assert_values(tr, [[-0.1, -0.1, 0.9], [-0.2, -0.2, 0.0]])


def test_reinforce_pp_returns_and_whitening():
    out = compute_advantages("reinforce_pp", torch.tensor([1.0, 0.0]), MASK_PP, AdvantageConfig(group_size=1, kl_coef=0.5), kl=KL_PP)
    # returns-to-go (gamma 1): row 0 [0.7, 0.8, 0.9], row 1 [-0.4, -0.2, pad]
    assert_values(out.returns, [[0.7, 0.8, 0.9], [-0.4, -0.2, 0.0]])
    valid = [0.7, 0.8, 0.9, -0.4, -0.2]
    mean = sum(valid) / 5  # 0.36
    var = sum((v - mean) ** 2 for v in valid) / 4  # 1.492 / 4 = 0.373 (Bessel)
    expected = [(v - mean) / math.sqrt(var + 1e-8) for v in valid]
    got = out.advantages[MASK_PP.bool()].tolist()
    assert got == pytest.approx(expected, abs=1e-6)
    assert out.advantages[1, 2].item() == 0.0


def test_reinforce_pp_discount():
    out = compute_advantages("reinforce_pp", torch.tensor([1.0, 0.0]), MASK_PP, AdvantageConfig(group_size=1, kl_coef=0.5, gamma=0.5), kl=KL_PP)
    # row 0: G2 = 0.9, G1 = -0.1 + 0.5 * 0.9 = 0.35, G0 = -0.1 + 0.5 * 0.35 = 0.075
    # row 1: G1 = -0.2, G0 = -0.2 + 0.5 * -0.2 = -0.3
    assert_values(out.returns, [[0.075, 0.35, 0.9], [-0.3, -0.2, 0.0]])


def test_reinforce_pp_baseline_subtracts_group_mean_first():
    mask = torch.ones(4, 2)
    out = compute_advantages("reinforce_pp_baseline", torch.tensor([1.0, 0.0, 3.0, 3.0]), mask, AdvantageConfig(group_size=2))
    # centred rewards [0.5, -0.5, 0, 0] on the last token; returns-to-go (gamma 1) = same on both tokens
    assert_values(out.returns, [[0.5, 0.5], [-0.5, -0.5], [0.0, 0.0], [0.0, 0.0]])
    # whitened: mean 0, unbiased std over 8 tokens = sqrt(4 * 0.25 / 7)
    std = math.sqrt(1.0 / 7)
    assert out.advantages[0, 0].item() == pytest.approx(0.5 / std, rel=1e-6)


def test_gae_by_hand():
    # V = [0.5, 0.2, 0.4], r = [0, 0, 1], gamma 0.9, lambda 0.8
    # delta2 = 1 - 0.4 = 0.6; delta1 = 0.9*0.4 - 0.2 = 0.16; delta0 = 0.9*0.2 - 0.5 = -0.32
    # A2 = 0.6; A1 = 0.16 + 0.72*0.6 = 0.592; A0 = -0.32 + 0.72*0.592 = 0.10624
    values = torch.tensor([[0.5, 0.2, 0.4]], dtype=torch.float64)
    out = compute_advantages("gae", torch.tensor([1.0], dtype=torch.float64), torch.ones(1, 3, dtype=torch.float64),
                             AdvantageConfig(gamma=0.9, lam=0.8), values=values)
    assert out.advantages.tolist()[0] == pytest.approx([0.10624, 0.592, 0.6], abs=1e-12)
    assert out.returns.tolist()[0] == pytest.approx([0.60624, 0.792, 1.0], abs=1e-12)


def slow_token_rewards(rewards, mask, kl=None, kl_coef=0.0):
    """Per-sequence reference loop: -kl_coef * kl on each valid token, plus the reward on the
    last valid one. -> one list of (token index, reward) per sequence."""
    out = []
    for i in range(mask.shape[0]):
        idx = [t for t in range(mask.shape[1]) if mask[i, t] > 0]
        r = [(-kl_coef * kl[i, t].item() if kl is not None else 0.0) for t in idx]
        if idx:
            r[-1] += rewards[i].item()
        out.append(list(zip(idx, r)))
    return out


def slow_gae(rewards, values, mask, gamma, lam, kl=None, kl_coef=0.0):
    """Per-sequence reference loop over valid tokens only."""
    B, T = mask.shape
    adv = torch.zeros(B, T, dtype=torch.float64)
    for i, row in enumerate(slow_token_rewards(rewards, mask, kl, kl_coef)):
        idx, r = [t for t, _ in row], [x for _, x in row]
        last = 0.0
        for k in reversed(range(len(idx))):
            v_next = values[i, idx[k + 1]].item() if k + 1 < len(idx) else 0.0
            delta = r[k] + gamma * v_next - values[i, idx[k]].item()
            last = delta + gamma * lam * last
            adv[i, idx[k]] = last
    return adv


@pytest.mark.parametrize("gamma,lam", [(1.0, 1.0), (0.99, 0.95), (0.9, 0.0), (0.5, 1.0)])
@pytest.mark.parametrize("holes", [False, True])
def test_gae_matches_slow_reference(gamma, lam, holes):
    g = torch.Generator().manual_seed(0)
    B, T = 7, 150  # T > block size, so the block carry is exercised
    lengths = torch.randint(0, T + 1, (B,), generator=g)
    mask = (torch.arange(T)[None] < lengths[:, None]).double()
    if holes:
        mask = mask * (torch.rand(B, T, generator=g) > 0.3).double()
    values = torch.randn(B, T, generator=g, dtype=torch.float64)
    kl = torch.rand(B, T, generator=g, dtype=torch.float64)
    rewards = torch.randn(B, generator=g, dtype=torch.float64)
    out = compute_advantages("gae", rewards, mask, AdvantageConfig(gamma=gamma, lam=lam, kl_coef=0.1), kl=kl, values=values)
    ref = slow_gae(rewards, values, mask, gamma, lam, kl, 0.1)
    assert torch.allclose(out.advantages, ref, atol=1e-9)


def test_gae_at_gamma_lambda_one_is_returns_to_go_minus_value():
    g = torch.Generator().manual_seed(1)
    B, T = 5, 20
    mask = (torch.arange(T)[None] < torch.tensor([20, 13, 1, 7, 0])[:, None]).double()
    values = torch.randn(B, T, generator=g, dtype=torch.float64)
    kl = torch.rand(B, T, generator=g, dtype=torch.float64)
    rewards = torch.randn(B, generator=g, dtype=torch.float64)
    cfg = AdvantageConfig(gamma=1.0, lam=1.0, kl_coef=0.2)
    out = compute_advantages("gae", rewards, mask, cfg, kl=kl, values=values)
    returns_to_go = torch.zeros(B, T, dtype=torch.float64)  # the test's own loop, not core's token rewards
    for i, row in enumerate(slow_token_rewards(rewards, mask, kl, 0.2)):
        run = 0.0
        for t, r in reversed(row):
            run += r
            returns_to_go[i, t] = run
    assert torch.allclose(out.advantages, (returns_to_go - values) * mask, atol=1e-12)
    assert torch.allclose(out.returns, returns_to_go, atol=1e-12)


def test_whitening_is_masked():
    mask = torch.tensor([[1.0, 1.0, 0.0], [1.0, 0.0, 0.0]])
    out = compute_advantages("reinforce", torch.tensor([1.0, 0.0]), mask, AdvantageConfig(whiten=True))
    # raw advantages on valid tokens [0.5, 0.5, -0.5]: mean 1/6, unbiased var = (1/9+1/9+4/9)/2 = 1/3
    mean, std = 1 / 6, math.sqrt(1 / 3)
    assert_values(out.advantages, [[(0.5 - mean) / std, (0.5 - mean) / std, 0.0], [(-0.5 - mean) / std, 0.0, 0.0]])


# ---- groups whose rewards are all equal: exactly 0 -----------------------------------------
# Every group-baseline setting (and REINFORCE's batch baseline), before any batch whitening:
# (estimator, AdvantageConfig overrides). reinforce_pp_baseline is read from its returns, which
# are the centred rewards on the last token before the batch whitening.
EQUAL_GROUP_SETTINGS = [("grpo", {"scale": "group"}), ("grpo", {"scale": "batch"}), ("grpo", {"scale": "none"}),
                        ("rloo", {}), ("reinforce_pp_baseline", {})]


def centred_scores(name, rewards, group_size, **cfg):
    """(B,) per-completion score before any batch whitening: the advantage, or for
    reinforce_pp_baseline its return (= the group-centred reward with gamma 1 and no KL)."""
    out = compute_advantages(name, rewards, torch.ones(len(rewards), 1), AdvantageConfig(group_size=group_size, **cfg))
    return (out.returns if name == "reinforce_pp_baseline" else out.advantages)[:, 0]


@pytest.mark.parametrize("name, cfg", EQUAL_GROUP_SETTINGS)
def test_equal_non_integer_rewards_give_exactly_zero_in_float32(name, cfg):
    # float32 sums 0.2 eight times to 1.6000001: mean 0.20000002, one ulp above 0.2, so r - mean
    # = -1.49e-8 and GRPO's 1 / (std + 1e-6) with std ~1.6e-8 made it -0.0147 (the issue's -0.015)
    alone = torch.full((8,), 0.2, dtype=torch.float32)
    assert centred_scores(name, alone, 8, **cfg).tolist() == [0.0] * 8
    # 1.9485582 x 8 beside a group that varies: it got 0.119 under scale=group
    mixed = torch.tensor([1.9485582] * 8 + [0.0, 1.0, 0.5, 0.3, 0.9, 0.1, 0.7, 0.2], dtype=torch.float32)
    assert centred_scores(name, mixed, 8, **cfg)[:8].tolist() == [0.0] * 8


def test_equal_batch_gives_exactly_zero_for_the_batch_mean_baseline():
    assert seq_adv("reinforce", rewards=torch.full((8,), 0.2), mask=torch.ones(8, 1)).tolist() == [0.0] * 8


def test_equal_group_stays_zero_next_to_varied_groups_and_others_are_unchanged():
    # float32 0.3 x 6 has mean one ulp below 0.3. Group 2 = [1, 0, 0, 0, 0, 0]: mean 1/6, centred
    # [5/6, -1/6 x 5], unbiased std sqrt((25/36 + 5/36) / 5) = sqrt(1/6)
    r = torch.tensor([0.3] * 6 + [1.0] + [0.0] * 5, dtype=torch.float32)
    a = seq_adv("grpo", rewards=r, mask=torch.ones(12, 1), group_size=6, eps=EPS)
    assert a[:6].tolist() == [0.0] * 6
    s = math.sqrt(1 / 6) + EPS
    assert a[6:].tolist() == pytest.approx([5 / 6 / s] + [-1 / 6 / s] * 5, rel=1e-6)


def test_reinforce_pp_baseline_whitens_exact_zeros_of_an_equal_group():
    # centred rewards [0 x 6, 5/6, -1/6 x 5] (0.3 x 6 exactly 0); batch mean 0, unbiased variance
    # over the 12 tokens (25/36 + 5/36) / 11 = 5/66: whitened = centred / sqrt(5/66 + 1e-8)
    r = torch.tensor([0.3] * 6 + [1.0] + [0.0] * 5, dtype=torch.float32)
    out = compute_advantages("reinforce_pp_baseline", r, torch.ones(12, 1), AdvantageConfig(group_size=6))
    assert out.returns[:6, 0].tolist() == [0.0] * 6  # exact before the whitening
    s = math.sqrt(5 / 66 + 1e-8)
    # the whitening's batch mean is 0 only up to float32 rounding of 5/6 - 5 x 1/6 (a few 1e-9)
    assert out.advantages[:, 0].tolist() == pytest.approx([0.0] * 6 + [5 / 6 / s] + [-1 / 6 / s] * 5, abs=1e-7)


from hypothesis import given, settings  # noqa: E402
from hypothesis import strategies as hst  # noqa: E402

FLOAT32 = hst.floats(width=32, allow_nan=False, allow_infinity=False)


@settings(max_examples=200, deadline=None)
@given(value=FLOAT32, G=hst.integers(1, 64), others=hst.lists(hst.floats(-10, 10, width=32), min_size=0, max_size=3),
       position=hst.integers(0, 3), dtype=hst.sampled_from([torch.float32, torch.float64]),
       setting=hst.sampled_from(EQUAL_GROUP_SETTINGS))
def test_property_any_equal_group_gets_exactly_zero(value, G, others, position, dtype, setting):
    """Whatever the common value (any finite float32, tiny or huge), the group size, the dtype and
    the groups around it, an all-equal group's score is exactly 0."""
    name, cfg = setting
    groups = [torch.linspace(-1.0, 1.0, G) * o + o for o in others]  # varied groups (or equal when o = 0)
    position = min(position, len(groups))
    groups.insert(position, torch.full((G,), value))
    rewards = torch.cat(groups).to(dtype)
    scores = centred_scores(name, rewards, G, **cfg)
    assert scores[position * G:(position + 1) * G].tolist() == [0.0] * G


@pytest.mark.parametrize("scale", ["group", "batch"])
def test_equal_group_with_eps_zero_is_zero_not_nan(scale):
    # std of 0.5 x 4 is exactly 0: (r - mean) / (0 + 0) would be 0 / 0 = NaN
    a = seq_adv("grpo", rewards=torch.full((4,), 0.5), mask=torch.ones(4, 1), group_size=4, eps=0.0, scale=scale)
    assert a.tolist() == [0.0] * 4
