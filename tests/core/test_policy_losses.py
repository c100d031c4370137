"""Policy losses: the six PPO cases, dual clip, GSPO, CISPO, REINFORCE, value loss, regions."""

import math

import pytest
import torch

from tests.helpers import assert_values
from workbench.core import REGION_NAMES, PolicyLossConfig, clipped_value_loss, compute_policy_loss

# The RLHF book's table, eps = 0.2: A = +1 / -1 x ratio below (0.5), inside (1.1), above (1.5)
ADV = torch.tensor([[1.0, 1.0, 1.0, -1.0, -1.0, -1.0]], dtype=torch.float64)
RATIO = torch.tensor([[0.5, 1.1, 1.5, 0.5, 1.1, 1.5]], dtype=torch.float64)
MASK = torch.ones(1, 6, dtype=torch.float64)


def run(name, ratio, adv, mask=None, **cfg):
    """Loss and d loss / d logp with old = 0, logp = log(ratio)."""
    mask = torch.ones_like(ratio) if mask is None else mask
    logp = ratio.log().clone().requires_grad_(True)
    loss, diag = compute_policy_loss(name, logp, torch.zeros_like(logp), adv, mask, PolicyLossConfig(**cfg))
    loss.sum().backward()
    return loss.detach(), logp.grad, diag


def regions(diag):
    return [REGION_NAMES[c] for c in diag.region[0].tolist()]


def test_six_ppo_cases():
    loss, grad, diag = run("clip", RATIO, ADV)
    # A>0: -min(rA, clip(r)A): -0.5, -1.1, -min(1.5, 1.2) = -1.2
    # A<0: -min(-0.5, -0.8) = 0.8, 1.1, -min(-1.5, -1.2) = 1.5 (unbounded without dual clip)
    assert_values(loss, [[-0.5, -1.1, -1.2, 0.8, 1.1, 1.5]], atol=1e-12)
    # d/dlogp = d/dr * r: -A r where the unclipped term is active, 0 where clipped
    assert_values(grad, [[-0.5, -1.1, 0.0, 0.0, 1.1, 1.5]], atol=1e-12)
    assert diag.zero_grad[0].tolist() == [False, False, True, True, False, False]
    assert regions(diag) == ["trust", "trust", "clipped_high", "clipped_low", "trust", "trust"]
    m = diag.metrics
    assert m["clip_ratio/low_mean"].item() == pytest.approx(1 / 6)
    assert m["clip_ratio/high_mean"].item() == pytest.approx(1 / 6)
    assert m["clip_ratio/region_mean"].item() == pytest.approx(2 / 6)
    assert m["clip_ratio/dual_mean"].item() == 0.0


def test_zero_grad_flag_matches_autograd_on_random_tokens():
    g = torch.Generator().manual_seed(0)
    ratio = torch.exp(torch.randn(4, 50, generator=g, dtype=torch.float64) * 0.5)
    adv = torch.randn(4, 50, generator=g, dtype=torch.float64)
    adv[0, :5] = 0.0
    for cfg in ({}, {"clip_c": 3.0}, {"eps_high": 0.28}, {"delta": 2.0}):
        _, grad, diag = run("clip", ratio, adv, **cfg)
        assert torch.equal(diag.zero_grad, grad == 0), cfg


def test_asymmetric_clip_higher():
    loss, grad, diag = run("clip", torch.tensor([[1.25, 1.3]], dtype=torch.float64), torch.ones(1, 2, dtype=torch.float64), eps_high=0.28)
    # 1.25 < 1.28: still trusted; 1.3 > 1.28: clipped at 1.28
    assert_values(loss, [[-1.25, -1.28]], atol=1e-12)
    assert regions(diag) == ["trust", "clipped_high"]


def test_dual_clip_caps_negative_advantage_loss():
    ratio = torch.tensor([[1.5, 4.0, 4.0]], dtype=torch.float64)
    adv = torch.tensor([[-1.0, -1.0, 1.0]], dtype=torch.float64)
    loss, grad, diag = run("clip", ratio, adv, clip_c=3.0)
    # A<0, r=1.5 < c: unchanged 1.5; A<0, r=4 > c: min(4, -c A = 3) = 3, gradient 0; A>0 unaffected: -1.2
    assert_values(loss, [[1.5, 3.0, -1.2]], atol=1e-12)
    assert_values(grad, [[1.5, 0.0, 0.0]], atol=1e-12)
    assert regions(diag) == ["trust", "dual_clipped", "clipped_high"]
    assert diag.metrics["clip_ratio/dual_mean"].item() == pytest.approx(1 / 3)


def test_trl_delta_equals_verl_dual_clip_forward():
    ratio = torch.exp(torch.linspace(-3, 3, 101, dtype=torch.float64))[None].repeat(2, 1)
    adv = torch.tensor([[1.0], [-2.0]], dtype=torch.float64).expand(2, 101).contiguous()
    dual, grad_dual, _ = run("clip", ratio, adv, clip_c=3.0)
    trl, grad_trl, _ = run("clip", ratio, adv, delta=3.0)
    torch.testing.assert_close(dual, trl, atol=1e-12, rtol=0)
    # both pass no gradient once a negative-advantage ratio exceeds 3
    over = (ratio > 3.0) & (adv < 0)
    assert over.any() and (grad_dual[over] == 0).all() and (grad_trl[over] == 0).all()


def test_single_step_ratio_is_one_but_gradient_is_policy_gradient():
    logp = torch.tensor([[-1.0, -2.0]], dtype=torch.float64, requires_grad=True)
    adv = torch.tensor([[0.5, -2.0]], dtype=torch.float64)
    loss, diag = compute_policy_loss("clip", logp, logp.detach(), adv, torch.ones(1, 2))
    loss.sum().backward()
    assert_values(diag.ratio, [[1.0, 1.0]])
    assert_values(logp.grad, [[-0.5, 2.0]], atol=1e-12)  # -A d logp


def test_gspo_sequence_ratio_is_geometric_mean():
    log_r = torch.tensor([[0.3, -0.1, 0.1, 0.0]], dtype=torch.float64)  # last token is padding
    mask = torch.tensor([[1.0, 1.0, 1.0, 0.0]], dtype=torch.float64)
    adv = torch.ones(1, 4, dtype=torch.float64)
    s = (math.exp(0.3) * math.exp(-0.1) * math.exp(0.1)) ** (1 / 3)  # = exp(0.1)
    # gradient of the FIRST token's loss alone: the sequence ratio spreads it over all tokens
    # (d(-s)/d logp_t = -s / n_i), verl's token variant keeps it on that token (-s, others 0)
    for variant, first_token_grad in (("sequence", [-s / 3] * 3 + [0.0]), ("token", [-s, 0.0, 0.0, 0.0])):
        logp = log_r.clone().requires_grad_(True)
        loss, diag = compute_policy_loss("gspo", logp, torch.zeros(1, 4, dtype=torch.float64), adv, mask,
                                         PolicyLossConfig(eps_low=0.2, eps_high=0.2, gspo_variant=variant))
        loss[0, 0].backward()
        assert_values(diag.ratio[:, :3], [[s, s, s]], atol=1e-12)
        assert_values(loss, [[-s, -s, -s, 0.0]], atol=1e-12)
        assert_values(logp.grad, [first_token_grad], atol=1e-12)


@pytest.mark.parametrize("variant", ["sequence", "token"])
def test_gspo_sequence_log_ratio_clamped_above_at_10_as_verl(variant):
    # verl 0.9.1 compute_policy_loss_gspo: torch.clamp(log_seq_importance_ratio, max=10.0), no
    # lower bound. Row 0: log s = (14 + 16) / 2 = 15 -> s = e^10; row 1: log s = -30 -> e^-30
    # (a +-20 clamp gave e^15 and e^-20). A = -1 keeps the unclipped term -s A = s for row 0.
    logp = torch.tensor([[14.0, 16.0], [-30.0, -30.0]], dtype=torch.float64)
    adv = -torch.ones(2, 2, dtype=torch.float64)
    loss, diag = compute_policy_loss("gspo", logp, torch.zeros_like(logp), adv, torch.ones(2, 2, dtype=torch.float64),
                                     PolicyLossConfig(gspo_variant=variant))
    assert diag.ratio.flatten().tolist() == pytest.approx([math.exp(10)] * 2 + [math.exp(-30)] * 2, rel=1e-15)
    assert loss[0].tolist() == pytest.approx([math.exp(10)] * 2, rel=1e-15)
    assert loss[1].tolist() == pytest.approx([0.8, 0.8])  # s < 1 - eps_low with A < 0: -clip(s) A


def test_token_ratios_clamped_at_20_as_verl_ppo():
    # verl's PPO loss clamps the token log-ratio to [-20, 20] before exp
    loss, _, diag = run("clip", torch.tensor([[math.exp(25.0), math.exp(-25.0)]], dtype=torch.float64), -torch.ones(1, 2, dtype=torch.float64))
    assert diag.ratio[0].tolist() == pytest.approx([math.exp(20), math.exp(-20)], rel=1e-15)


def test_gspo_clip_fraction_counts_sequences():
    # two sequences of different lengths, the short one clipped (s = e^0.5 > 1.2), the long one not
    logp = torch.tensor([[0.5, 0.0, 0.0, 0.0], [0.0, 0.0, 0.0, 0.0]], dtype=torch.float64)
    mask = torch.tensor([[1.0, 0.0, 0.0, 0.0], [1.0, 1.0, 1.0, 1.0]], dtype=torch.float64)
    _, diag = compute_policy_loss("gspo", logp, torch.zeros_like(logp), torch.ones_like(logp), mask, PolicyLossConfig())
    assert diag.metrics["clip_ratio/high_mean"].item() == pytest.approx(0.5)  # 1 of 2 sequences (tokens: 1 of 5)


def test_cispo_gradient_is_clipped_weight_times_advantage_for_every_token():
    ratio = torch.tensor([[0.5, 1.1, 1.5, 0.5, 1.5]], dtype=torch.float64)
    adv = torch.tensor([[1.0, 1.0, 1.0, -1.0, -2.0]], dtype=torch.float64)
    loss, grad, diag = run("cispo", ratio, adv, eps_low=0.2, eps_high=0.2)
    w = torch.tensor([[0.8, 1.1, 1.2, 0.8, 1.2]], dtype=torch.float64)
    # loss = -sg(w) A logp  ->  d/dlogp = -w A, never zero from clipping
    assert_values(loss, -w * adv * ratio.log(), atol=1e-12)
    assert_values(grad, -w * adv, atol=1e-12)
    assert not diag.zero_grad.any()
    assert diag.metrics["cispo/clip_ratio"].item() == pytest.approx(4 / 5)
    # clip_ratio/* as ESTIMATORS.md defines them (TRL: CISPO clipping counts for A > 0):
    # high = weight at 1 + eps_high with A > 0 (token 2 only; token 4 has A < 0),
    # low = weight at 1 - eps_low with A < 0 (token 3 only; token 0 has A > 0)
    assert diag.metrics["clip_ratio/high_mean"].item() == pytest.approx(1 / 5)
    assert diag.metrics["clip_ratio/low_mean"].item() == pytest.approx(1 / 5)
    assert diag.metrics["clip_ratio/region_mean"].item() == pytest.approx(2 / 5)
    assert regions(diag) == ["trust", "trust", "clipped_high", "clipped_low", "trust"]


def test_cispo_absolute_bounds_cap_only_from_above():
    ratio = torch.tensor([[0.1, 6.0]], dtype=torch.float64)
    adv = torch.ones(1, 2, dtype=torch.float64)
    _, grad, diag = run("cispo", ratio, adv, eps_high=5.0, cispo_bounds="absolute")
    assert_values(grad, [[-0.1, -5.0]], atol=1e-12)
    assert diag.metrics["cispo/clip_ratio"].item() == pytest.approx(0.5)


def test_reinforce_forms():
    ratio = torch.tensor([[0.5, 2.0]], dtype=torch.float64)
    adv = torch.tensor([[1.0, -3.0]], dtype=torch.float64)
    loss, grad, _ = run("reinforce", ratio, adv)
    assert_values(loss, -adv * ratio.log(), atol=1e-12)
    assert_values(grad, [[-1.0, 3.0]], atol=1e-12)
    loss, grad, _ = run("reinforce", ratio, adv, reinforce_form="ratio")
    assert_values(loss, [[-0.5, 6.0]], atol=1e-12)
    assert_values(grad, [[-0.5, 6.0]], atol=1e-12)  # -A r (d r / d logp = r)


def test_padding_has_zero_loss_and_no_gradient():
    mask = torch.tensor([[1.0, 1.0, 0.0, 0.0, 1.0, 0.0]], dtype=torch.float64)
    for name in ("clip", "gspo", "cispo", "reinforce"):
        loss, grad, diag = run(name, RATIO, ADV, mask=mask)
        assert (loss[~mask.bool()] == 0).all() and (grad[~mask.bool()] == 0).all(), name
        assert (diag.region[~mask.bool()] == -1).all()


def test_value_loss_clipping():
    values = torch.tensor([[1.0, 0.6, 1.0]], dtype=torch.float64, requires_grad=True)
    old = torch.tensor([[0.5, 0.5, 0.5]], dtype=torch.float64)
    returns = torch.tensor([[2.0, 0.0, 0.0]], dtype=torch.float64)
    loss, metrics = clipped_value_loss(values, old, returns, torch.ones(1, 3), clip_range_value=0.2)
    # (1) unclipped (1-2)^2 = 1, clipped V = 0.7 -> 1.69: 0.5 * 1.69 = 0.845
    # (2) V within old +- 0.2: 0.5 * 0.36 = 0.18
    # (3) unclipped 1.0, clipped (0.7)^2 = 0.49 -> 0.5 * 1.0 = 0.5
    assert_values(loss, [[0.845, 0.18, 0.5]], atol=1e-12)
    assert metrics["value/clipfrac"].item() == pytest.approx(1 / 3)
    loss.sum().backward()
    assert_values(values.grad, [[0.0, 0.6, 1.0]], atol=1e-12)  # clipped term active -> no gradient
    plain, _ = clipped_value_loss(values, old, returns, torch.ones(1, 3), clip_range_value=None)
    assert_values(plain, [[0.5, 0.18, 0.5]], atol=1e-12)


def test_value_clipping_clips_v_itself_so_an_unclipped_token_is_not_counted():
    # The float32 V next to -0.03982663 (it prints as that), V_old = 0.14850530, c = 0.2:
    # |V - V_old| = 0.188 < c, so clip(V, V_old - c, V_old + c) = V, the two terms are equal and
    # the token is not clipped. V_old + clamp(V - V_old, +-c) rounded V - V_old and gave back
    # -0.03982663154602051, not V: with R = 0 that term was larger, the token counted as clipped
    # and its gradient dropped.
    values = torch.tensor([[-0.03982662782073021]], dtype=torch.float32, requires_grad=True)
    old = torch.tensor([[0.14850530]], dtype=torch.float32)
    assert f"{values.item():.8f}" == "-0.03982663"
    loss, metrics = clipped_value_loss(values, old, torch.zeros(1, 1), torch.ones(1, 1), clip_range_value=0.2)
    assert metrics["value/clipfrac"].item() == 0.0
    assert loss.item() == (0.5 * values.detach() ** 2).item()  # the unclipped term, bit for bit
    loss.sum().backward()
    assert values.grad.item() == values.item()  # d/dV 0.5 (V - R)^2 = V - R: the gradient flows


def test_config_validation_names_field_and_allowed_values():
    with pytest.raises(ValueError, match="clip_c=1.1 must be greater than 1 \\+ eps_high"):
        PolicyLossConfig(clip_c=1.1)
    with pytest.raises(ValueError, match="gspo_variant='seq'.*sequence, token"):
        PolicyLossConfig(gspo_variant="seq")
