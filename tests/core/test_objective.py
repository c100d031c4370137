"""core.policy_objective: the run's whole objective, each mask and weight checked against the
number it must produce on a small batch."""

import math

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


# ---- verl's bypass mode: correction and rejection inside the loss -----------------------------------


def _bypass_batch(seed=3, B=6, T=5):
    """The current policy ``logp`` moved away from the rollout's ``rollout`` (which bypass mode takes as
    the old log-probs) by up to ~0.6 nats per token, so truncation at 1.2 and a k1 window bite."""
    gen = torch.Generator().manual_seed(seed)
    lengths = torch.tensor([5, 4, 5, 2, 3, 5])
    mask = (torch.arange(T)[None] < lengths[:, None]).to(torch.float64)
    rollout = -torch.rand(B, T, generator=gen, dtype=torch.float64) * 2
    logp = (rollout + 0.6 * torch.randn(B, T, generator=gen, dtype=torch.float64)).requires_grad_(True)
    adv = torch.randn(B, generator=gen, dtype=torch.float64)[:, None].expand(B, T).clone() * mask
    return logp, rollout, adv, mask


def verl_bypass_loss(log_prob, rollout_log_prob, advantages, response_mask, loss_type, is_threshold, rs_lower, rs_upper,
                     num_tokens, clip=0.2):
    """verl core_algos.compute_policy_loss_bypass_mode (b178a3c) with rollout_is='token',
    rollout_rs='token_k1' and loss_agg_mode token-mean over the global token count it was given
    (global_batch_info, counted before the loss): weights and rejection of the CURRENT log-probs
    against the rollout's (compute_rollout_correction_and_rejection_mask(old_log_prob=log_prob, ...)),
    then REINFORCE -A log pi w, or the vanilla PPO clip with the rollout as old and no weights."""
    with torch.no_grad():
        log_ratio = log_prob - rollout_log_prob
        weights = torch.exp(torch.clamp(log_ratio, max=20.0)).clamp(max=is_threshold) * response_mask
        k1 = -torch.clamp(log_ratio, -20, 20)  # log(pi_rollout / pi): kept within [log lower, log upper]
        effective = response_mask * ((k1 >= math.log(rs_lower)) & (k1 <= math.log(rs_upper))).to(response_mask.dtype)
    if loss_type == "reinforce":
        pg_losses = -advantages * log_prob * weights
    else:
        ratio = torch.exp(log_prob - rollout_log_prob)  # compute_policy_loss_vanilla, dual clip c = 3 (verl's default)
        clipped = torch.maximum(-advantages * ratio, -advantages * torch.clamp(ratio, 1 - clip, 1 + clip))
        pg_losses = torch.where(advantages < 0, torch.minimum(-advantages * 3.0, clipped), clipped)
    return (pg_losses * effective).sum() / num_tokens, effective


@pytest.mark.parametrize("loss_type, rs_lower, rs_upper, seed", [("reinforce", 0.7, 1.5, 3), ("ppo_clip", 0.25, 4.0, 16)])
def test_bypass_corrects_and_rejects_inside_the_loss_against_the_current_policy_as_verl(loss_type, rs_lower, rs_upper, seed):
    logp, rollout, adv, mask = _bypass_batch(seed)
    rejection = {"mode": "token_k1", "upper": rs_upper, "lower": rs_lower}
    correction = {"level": "token", "mode": "truncate", "clip_min": None, "clip_max": 1.2} if loss_type == "reinforce" else None
    cfg = ObjectiveConfig(policy_loss="reinforce" if loss_type == "reinforce" else "clip", aggregation="token-mean",
                          loss=PolicyLossConfig(reinforce_form="logp", clip_c=3.0), in_loss_correction=correction,
                          in_loss_rejection=rejection)
    n = mask.sum()
    ours = policy_objective(logp, rollout, adv, mask, mask, cfg, num_tokens=n, num_seqs=float(mask.shape[0]))
    theirs, effective = verl_bypass_loss(logp, rollout, adv, mask, loss_type, 1.2, rs_lower, rs_upper, n)
    assert 0 < effective.sum() < mask.sum()  # the rejection dropped some tokens, kept others
    if loss_type == "ppo_clip":  # the window keeps ratios up to 1 / 0.25 = 4: the dual clip acts on a kept token
        assert ((torch.exp(logp.detach() - rollout) > 3.0) & (adv < 0) & effective.bool()).any()
    torch.testing.assert_close(ours.loss_mask, effective, rtol=0, atol=0)
    torch.testing.assert_close(ours.loss, theirs, rtol=1e-12, atol=1e-14)
    g_ours, = torch.autograd.grad(ours.loss, logp)
    g_theirs, = torch.autograd.grad(theirs, logp)
    torch.testing.assert_close(g_ours, g_theirs, rtol=1e-12, atol=1e-14)
    if loss_type == "reinforce":  # d/dlogp of -A logp sg(w) / N: the truncated weight, not the ratio
        w = torch.exp(logp.detach() - rollout).clamp(max=1.2)
        torch.testing.assert_close(g_ours, -adv * w * effective / n, rtol=1e-12, atol=1e-14)
        assert (torch.exp(logp.detach() - rollout) * effective > 1.2).any()  # the truncation acted


def test_bypass_rejection_leaves_the_normalisers_and_follows_the_policy():
    """Rejected tokens stay in the token count (verl counts before the loss); the same rollout with a
    policy that moved elsewhere rejects other tokens (the mask is the current policy's, not fixed)."""
    logp, rollout, adv, mask = _bypass_batch()
    cfg = ObjectiveConfig(policy_loss="clip", aggregation="token-mean",
                          in_loss_rejection={"mode": "token_k1", "upper": 1.5, "lower": 0.7})
    obj = policy_objective(logp, rollout, adv, mask, mask, cfg)
    pg, _ = compute_policy_loss("clip", logp, rollout, adv, obj.loss_mask, PolicyLossConfig())
    assert obj.loss.item() == pytest.approx(float((pg * obj.loss_mask).sum() / mask.sum()), rel=1e-12)
    moved = policy_objective((rollout + 0.5 * (logp.detach() - rollout)).requires_grad_(True), rollout, adv, mask, mask, cfg)
    assert not torch.equal(moved.loss_mask, obj.loss_mask)
    off = policy_objective(logp, rollout, adv, mask, mask, ObjectiveConfig(policy_loss="clip", aggregation="token-mean"))
    assert torch.equal(off.loss_mask, mask)  # without the settings nothing is rejected
