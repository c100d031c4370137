"""On-policy distillation (core.distillation): hand-derived values of A' = A - lambda * D, against
slime's and tinker's formulas written out as their code has them, and the config's checks."""

import pytest
import torch

from tests.helpers import assert_values
from workbench.core import (
    ADVANTAGE_SHAPINGS,
    DistillationConfig,
    ShapeError,
    distillation_metrics,
    opd_advantages,
    reverse_kl_per_token,
    shape_advantages,
)

A = torch.tensor([[1.0, 1.0, 1.0], [-0.5, -0.5, 0.0]])
MASK = torch.tensor([[1, 1, 1], [1, 1, 0]])
STUDENT = torch.tensor([[-1.0, -2.0, -0.5], [-0.2, -1.0, 0.0]])
TEACHER = torch.tensor([[-1.5, -1.0, -0.5], [-0.7, -3.0, -9.0]])
# d = student - teacher = [[0.5, -1, 0], [0.5, 2, (padding) 0]]


def test_reverse_kl_per_token_is_student_minus_teacher_on_the_mask():
    assert_values(reverse_kl_per_token(STUDENT, TEACHER, MASK), [[0.5, -1.0, 0.0], [0.5, 2.0, 0.0]])


def test_slime_shaping_subtracts_lambda_times_the_reverse_kl():
    # coef 0.5: [[1 - 0.25, 1 + 0.5, 1 - 0], [-0.5 - 0.25, -0.5 - 1, padding 0]]
    out = opd_advantages(A, STUDENT, TEACHER, MASK, DistillationConfig(coef=0.5))
    assert_values(out, [[0.75, 1.5, 1.0], [-0.75, -1.5, 0.0]])


def test_only_mode_drops_the_reward_advantage():
    out = opd_advantages(A, STUDENT, TEACHER, MASK, DistillationConfig(coef=1.0, mode="only"))
    assert_values(out, [[-0.5, 1.0, 0.0], [-0.5, -2.0, 0.0]])


def test_discount_sums_the_future_reverse_kl():
    # gamma 0.5: D row 0 = [0.5 + 0.5 * (-1), -1, 0] = [0, -1, 0]; row 1 = [0.5 + 0.5 * 2, 2] = [1.5, 2]
    out = opd_advantages(A, STUDENT, TEACHER, MASK, DistillationConfig(coef=1.0, discount=0.5))
    assert_values(out, [[1.0, 2.0, 1.0], [-2.0, -2.5, 0.0]])
    # gamma 1: D = suffix sums [-0.5, -1, 0], [2.5, 2]
    out = opd_advantages(A, STUDENT, TEACHER, MASK, DistillationConfig(coef=1.0, discount=1.0))
    assert_values(out, [[1.5, 2.0, 1.0], [-3.0, -2.5, 0.0]])


def test_discount_skips_holes_in_the_mask():
    # a hole at t = 1 (e.g. a masked tool token): D_0 = d_0 + gamma * d_2 = 1 + 0.5 * 4 = 3
    mask = torch.tensor([[1, 0, 1]])
    out = opd_advantages(torch.zeros(1, 3), torch.tensor([[1.0, 7.0, 4.0]]), torch.zeros(1, 3), mask,
                         DistillationConfig(coef=1.0, discount=0.5, mode="only"))
    assert_values(out, [[-3.0, 0.0, -4.0]])


def test_zero_coefficient_leaves_the_advantage_and_nothing_has_a_gradient():
    student = STUDENT.clone().requires_grad_(True)
    out = opd_advantages(A, student, TEACHER, MASK, DistillationConfig(coef=0.0))
    assert_values(out, A * MASK)
    assert not out.requires_grad


def _slime(adv, logp, teacher, coef):
    """slime apply_opd_kl_to_advantages, per sample: advantages[i] = adv - opd_kl_coef * (logp - teacher)."""
    return [a - coef * (lp - t) for a, lp, t in zip(adv, logp, teacher)]


def _tinker(adv, logp, teacher, mask, coef, gamma):
    """tinker incorporate_kl_penalty: adv + discounted_future_sum(-coef * mask * (logp - teacher) * mask, gamma)."""
    out = []
    for a, lp, t, m in zip(adv, logp, teacher, mask):
        kl_adv = -coef * m * ((lp - t) * m)
        if gamma > 0:
            acc, summed = 0.0, torch.zeros_like(kl_adv)
            for k in range(len(kl_adv) - 1, -1, -1):
                acc = kl_adv[k] + gamma * acc
                summed[k] = acc
            kl_adv = summed
        out.append(a + kl_adv)
    return torch.stack(out)


def test_matches_the_anchors_formulas():
    g = torch.Generator().manual_seed(0)
    adv, s, t = (torch.randn(5, 7, generator=g) for _ in range(3))
    mask = torch.ones(5, 7, dtype=torch.long)  # unpadded rows: slime's per-sample tensors have no padding
    assert_values(opd_advantages(adv, s, t, mask, DistillationConfig(coef=0.7)), torch.stack(_slime(adv, s, t, 0.7)), atol=1e-6)
    mask[:, 5:] = 0  # tinker's masks zero the prompt / padding; A' there is 0 here (never in the loss)
    ours = opd_advantages(adv, s, t, mask, DistillationConfig(coef=0.7, discount=0.9))
    assert_values(ours, _tinker(adv, s, t, mask.float(), 0.7, 0.9) * mask, atol=1e-5)


def test_registry_and_metrics():
    assert "opd" in ADVANTAGE_SHAPINGS
    cfg = DistillationConfig(coef=0.5)
    assert_values(shape_advantages("opd", A, STUDENT, TEACHER, MASK, cfg), opd_advantages(A, STUDENT, TEACHER, MASK, cfg))
    m = distillation_metrics(STUDENT, TEACHER, MASK)
    assert m["distill/reverse_kl"].item() == pytest.approx((0.5 - 1 + 0 + 0.5 + 2) / 5)
    assert m["distill/teacher_logp"].item() == pytest.approx((-1.5 - 1 - 0.5 - 0.7 - 3) / 5)


@pytest.mark.parametrize("kwargs, message", [
    ({"coef": -1.0}, "coef=-1.0 must be >= 0"),
    ({"discount": 1.5}, "discount=1.5 must be in [0, 1]"),
    ({"mode": "forward"}, "mode='forward' is not allowed; choose one of: shaped, only"),
])
def test_config_errors_name_the_field(kwargs, message):
    with pytest.raises(ValueError, match=message.replace("[", r"\[").replace("]", r"\]").replace("(", r"\(")):
        DistillationConfig(**kwargs)


def test_shapes_that_do_not_fit_are_named():
    with pytest.raises(ShapeError, match="teacher_logp has shape"):
        opd_advantages(A, STUDENT, TEACHER[:, :2], MASK, DistillationConfig())
    with pytest.raises(ShapeError, match="advantages has shape"):
        opd_advantages(A[:1], STUDENT, TEACHER, MASK, DistillationConfig())
