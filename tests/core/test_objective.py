"""core.policy_objective: the run's whole objective, each mask and weight checked against the
number it must produce on a small batch."""

import pytest
import torch

from workbench.core import (
    ObjectiveConfig,
    PolicyLossConfig,
    aggregate_loss,
    compute_policy_loss,
    kl_per_token,
    policy_objective,
)

B, T = 4, 3


def batch():
    gen = torch.Generator().manual_seed(0)
    logp = (-torch.rand(B, T, generator=gen, dtype=torch.float64)).requires_grad_(True)
    old = logp.detach() + 0.05 * torch.randn(B, T, generator=gen, dtype=torch.float64)
    adv = torch.tensor([1.0, -1.0, 0.5, -0.5], dtype=torch.float64)[:, None].expand(B, T).clone()
    mask = torch.tensor([[1, 1, 1], [1, 1, 0], [1, 0, 0], [1, 1, 1]], dtype=torch.float64)
    entropy = torch.rand(B, T, generator=gen, dtype=torch.float64)
    return logp, old, adv, mask, entropy


def loss(cfg=ObjectiveConfig(aggregation="token-mean"), **kw):
    logp, old, adv, mask, entropy = batch()
    kw = {"entropy": entropy, **kw}
    return policy_objective(logp, old, adv, mask, mask, cfg, max_len=T, **kw), (logp, old, adv, mask, entropy)


def test_without_extras_it_is_the_aggregated_policy_loss():
    obj, (logp, old, adv, mask, _) = loss()
    pg, _ = compute_policy_loss("clip", logp, old, adv, mask, PolicyLossConfig())
    assert torch.equal(obj.loss, aggregate_loss("token-mean", pg, mask, max_len=T))
    assert torch.equal(obj.metrics["loss/policy"], obj.loss.detach())
    assert obj.kept is None and torch.equal(obj.loss_mask, mask)


def test_is_weights_scale_the_policy_term_and_keep_the_normalisers():
    plain, (_, _, _, mask, _) = loss()
    doubled, _ = loss(is_weights=2.0 * mask)
    assert doubled.loss.item() == pytest.approx(2 * plain.loss.item(), rel=1e-12)
    # weights that vary by token: token-mean divides by the token count, not by the weights' sum
    w = torch.tensor([[0.5, 1.0, 2.0], [3.0, 0.25, 9.0], [1.5, 7.0, 7.0], [0.0, 1.0, 4.0]], dtype=torch.float64) * mask
    weighted, (logp, old, adv, _, _) = loss(is_weights=w)
    pg, _ = compute_policy_loss("clip", logp, old, adv, mask, PolicyLossConfig())
    assert weighted.loss.item() == pytest.approx(float((pg * w * mask).sum() / mask.sum()), rel=1e-12)
    assert weighted.loss.item() != pytest.approx(float((pg * w * mask).sum() / (w * mask).sum()), rel=1e-6)


def test_entropy_bonus_and_in_loss_kl_add_their_terms():
    c, beta = 0.1, 0.04
    plain, (logp, _, _, mask, entropy) = loss()
    bonus, _ = loss(entropy_coef=c)
    # token-mean over the 9 loss tokens: L - c * sum(H m) / 9
    assert bonus.loss.item() == pytest.approx(plain.loss.item() - c * float((entropy * mask).sum()) / 9, rel=1e-12)
    ref = logp.detach() - 0.1
    with_kl, _ = loss(ObjectiveConfig(aggregation="token-mean", kl_coef=beta), ref_logp=ref)
    kl = kl_per_token("k3", logp.detach(), ref, mask)
    assert with_kl.loss.item() == pytest.approx(plain.loss.item() + beta * float((kl * mask).sum()) / 9, rel=1e-12)
    assert with_kl.metrics["loss/policy"] == plain.metrics["loss/policy"]  # the policy term alone
    no_kl, _ = loss(ObjectiveConfig(aggregation="token-mean", kl_coef=0.0), ref_logp=ref)
    assert torch.equal(no_kl.loss, plain.loss)


def test_top_entropy_keeps_the_callers_rule_and_the_default_quantile():
    cfg = ObjectiveConfig(aggregation="token-mean", top_entropy_quantile=0.5)
    obj, (_, _, _, mask, entropy) = loss(cfg)
    assert obj.kept.sum() == 5  # the upper half of 9 loss tokens' entropies (ties aside)
    assert ((obj.kept == 1) <= (mask == 1)).all()
    only_first, _ = loss(cfg, top_entropy=lambda h, m: torch.zeros_like(m).index_fill(0, torch.tensor([0]), 1.0) * m)
    assert only_first.kept[1:].sum() == 0
    assert only_first.metrics["entropy/top_quantile_kept"].item() == pytest.approx(3 / 9)


def test_off_policy_mask_compares_with_the_rollout_logp_when_given():
    cfg = ObjectiveConfig(aggregation="token-mean", off_policy_mask_threshold=0.5)
    near, (logp, _, _, mask, _) = loss(cfg)
    assert torch.equal(near.loss_mask, mask)  # old is within 0.05 nats: nothing dropped
    far, _ = loss(cfg, rollout_logp=logp.detach() + 1.0)  # the engine 1 nat above: negatives dropped
    assert far.loss_mask[1].sum() == 0 and far.loss_mask[3].sum() == 0
    assert torch.equal(far.loss_mask[[0, 2]], mask[[0, 2]])


def test_opsm_drops_negative_sequences_the_policy_moved_away_from():
    logp, old, adv, mask, entropy = batch()
    cfg = ObjectiveConfig(aggregation="token-mean", opsm_delta=0.5)
    obj = policy_objective(logp, logp.detach() + 1.0, adv, mask, mask, cfg, max_len=T)
    assert obj.loss_mask[1].sum() == 0 and obj.loss_mask[3].sum() == 0
    # the normalisers stay the caller's: 9 tokens, not the 4 still in the loss
    pg, _ = compute_policy_loss("clip", logp, logp.detach() + 1.0, adv, obj.loss_mask, PolicyLossConfig())
    assert obj.loss.item() == pytest.approx(float((pg.detach() * obj.loss_mask).sum()) / 9, rel=1e-12)


def test_settings_that_need_a_missing_input_are_refused_not_dropped():
    from workbench.core import ObjectiveConfig, policy_objective

    logp = torch.zeros(2, 3, dtype=torch.float64, requires_grad=True)
    mask, adv = torch.ones(2, 3, dtype=torch.float64), torch.ones(2, 3, dtype=torch.float64)
    with pytest.raises(ValueError, match=r"kl_coef=0.1 \(an in-loss KL\) needs the reference log-probs"):
        policy_objective(logp, logp.detach(), adv, mask, mask, ObjectiveConfig(kl_coef=0.1))
    with pytest.raises(ValueError, match="top_entropy_quantile=0.5 needs the per-token entropy"):
        policy_objective(logp, logp.detach(), adv, mask, mask, ObjectiveConfig(top_entropy_quantile=0.5))
