"""KL estimators, entropy / log-probs from logits, OPSM and truncation masks, reward metrics."""

import math

import pytest
import torch

from workbench.core import (
    entropy_from_logits,
    kl_per_token,
    length_metrics,
    logprobs_from_logits,
    opsm_mask,
    reward_metrics,
    token_objective,
    truncation_mask,
)


def test_kl_estimators_by_hand():
    # pi(x) = 0.5, ref(x) = 0.25: d = log 0.25 - log 0.5 = -log 2
    logp = torch.tensor([[math.log(0.5)]], dtype=torch.float64)
    ref = torch.tensor([[math.log(0.25)]], dtype=torch.float64)
    one = torch.ones(1, 1)
    ln2 = math.log(2)
    assert kl_per_token("k1", logp, ref, one).item() == pytest.approx(ln2)  # -d
    assert kl_per_token("k2", logp, ref, one).item() == pytest.approx(ln2**2 / 2)  # d^2 / 2
    assert kl_per_token("k3", logp, ref, one).item() == pytest.approx(0.5 + ln2 - 1)  # e^d - d - 1


def test_k1_k3_unbiased_and_k3_nonnegative():
    p = torch.tensor([0.7, 0.2, 0.1], dtype=torch.float64)
    q = torch.tensor([0.4, 0.4, 0.2], dtype=torch.float64)
    true_kl = (p * (p / q).log()).sum().item()  # KL(p || q) = 0.184...
    g = torch.Generator().manual_seed(0)
    x = torch.multinomial(p, 200_000, replacement=True, generator=g)
    logp, ref = p.log()[x][None], q.log()[x][None]
    mask = torch.ones_like(logp)
    for name in ("k1", "k3"):
        k = kl_per_token(name, logp, ref, mask)
        stderr = k.std().item() / math.sqrt(k.numel())
        assert abs(k.mean().item() - true_kl) < 4 * stderr, name
    # k2 is biased: its expectation E_p[d^2 / 2] = 0.1817 differs from the KL 0.1842 ...
    expected_k2 = (p * (q.log() - p.log()) ** 2 / 2).sum().item()
    assert abs(expected_k2 - true_kl) > 0.002
    # ... and the samples agree with that expectation, not with the KL
    k2 = kl_per_token("k2", logp, ref, mask)
    assert abs(k2.mean().item() - expected_k2) < 4 * k2.std().item() / math.sqrt(k2.numel())
    grid = torch.linspace(-30, 30, 1001, dtype=torch.float64)[None]
    assert (kl_per_token("k3", torch.zeros_like(grid), grid, torch.ones_like(grid)) >= 0).all()


def test_kl_is_zero_on_padding():
    kl = kl_per_token("k1", torch.zeros(1, 2), torch.ones(1, 2), torch.tensor([[1.0, 0.0]]))
    assert kl.tolist() == [[-1.0, 0.0]]


def test_entropy_and_logprobs_from_logits():
    logits = torch.zeros(1, 1, 4)
    assert entropy_from_logits(logits).item() == pytest.approx(math.log(4))
    logits = torch.tensor([[[2.0, 0.0, -1.0]]])
    expected = torch.log_softmax(logits, -1)[0, 0, 2].item()
    assert logprobs_from_logits(logits, torch.tensor([[2]])).item() == pytest.approx(expected)
    # temperature divides the logits
    expected_t = torch.log_softmax(logits / 0.5, -1)[0, 0, 0].item()
    assert logprobs_from_logits(logits, torch.tensor([[0]]), temperature=0.5).item() == pytest.approx(expected_t, abs=1e-6)


def test_opsm_masks_negative_advantage_sequences_that_drifted():
    old = torch.zeros(3, 2)
    logp = torch.tensor([[-0.5, -0.5], [-0.9, -0.9], [-0.1, -0.1]])  # drift old - logp: 0.5, 0.9, 0.1
    adv = torch.tensor([[-1.0, -1.0], [1.0, 1.0], [-1.0, -1.0]])
    mask = torch.ones(3, 2)
    out = opsm_mask(logp, old, adv, mask, delta=0.3)
    # row 0: A<0 and drift 0.5 > 0.3 -> masked; row 1: A>0 -> kept; row 2: drift 0.1 -> kept
    assert out.tolist() == [[0.0, 0.0], [1.0, 1.0], [1.0, 1.0]]


def test_truncation_mask():
    out = truncation_mask(torch.ones(2, 3), torch.tensor([True, False]))
    assert out.tolist() == [[0.0, 0.0, 0.0], [1.0, 1.0, 1.0]]


def test_reward_metrics_trl_names():
    m = reward_metrics(torch.tensor([1.0, 1.0, 0.0, 1.0]), group_size=2)
    # groups [1, 1] (std 0) and [0, 1] (std 0.7071): reward 0.75, reward_std mean of stds
    assert m["reward"].item() == pytest.approx(0.75)
    assert m["reward_std"].item() == pytest.approx(math.sqrt(0.5) / 2)
    assert m["frac_reward_zero_std"].item() == pytest.approx(0.5)


def test_reward_metrics_with_one_completion_per_prompt():
    m = reward_metrics(torch.tensor([1.0, 0.0], dtype=torch.float64), group_size=1)
    # no spread inside a group of one: reward_std 0, every group has zero std
    assert (m["reward"].item(), m["reward_std"].item(), m["frac_reward_zero_std"].item()) == (0.5, 0.0, 1.0)
    assert m["reward_std"].device == m["reward"].device and m["reward_std"].dtype == m["reward"].dtype


def test_reward_metrics_count_equal_groups_exactly_as_the_estimators_zero_them():
    # float32 0.2 x 8 has std 1.6e-8 from rounding (above isclose's atol 1e-8): still an
    # all-equal group, which the advantage estimators set to exactly 0. [0, 1e-9] is a real spread.
    m = reward_metrics(torch.tensor([0.2] * 8 + [1.9485582] * 8 + [0.0] * 7 + [1e-9]), group_size=8)
    assert m["frac_reward_zero_std"].item() == pytest.approx(2 / 3, rel=1e-7)
    # the std of 1e-9 among seven zeros, unbiased: sqrt((7 (1e-9 / 8)^2 + (7e-9 / 8)^2) / 7) = 1e-9 / sqrt(8)
    assert m["reward_std"].item() == pytest.approx(1e-9 / math.sqrt(8) / 3, rel=1e-5)


def test_length_metrics_trl_names():
    m = length_metrics(torch.tensor([[1.0, 1.0, 0.0], [1.0, 1.0, 1.0]]), torch.tensor([False, True]))
    assert {k: v.item() for k, v in m.items()} == {
        "completions/mean_length": 2.5, "completions/min_length": 2.0, "completions/max_length": 3.0,
        "completions/clipped_ratio": 0.5,
    }


def test_token_objective_adds_kl_and_subtracts_entropy():
    out = token_objective(torch.tensor([[1.0]]), kl=torch.tensor([[2.0]]), kl_coef=0.1, entropy=torch.tensor([[3.0]]), entropy_coef=0.01)
    assert out.item() == pytest.approx(1.0 + 0.2 - 0.03)
