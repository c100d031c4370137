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
