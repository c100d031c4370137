"""Adaptive entropy control (Skywork-OR1; TRL use_adaptive_entropy): hand-derived sequences and
TRL 1.16's update rule, transcribed."""

import math

import pytest

from workbench.core.entropy_control import (
    EntropyControl,
    EntropyControlState,
    applied_entropy_coef,
    update_entropy_control,
)


def trl_update(coef, entropy, target, delta, lo, hi):
    # trl/trainer/grpo_trainer.py (1.16), _compute_loss, at the optimizer-step boundary
    if entropy <= target:
        return min(coef + delta, hi)
    return max(coef - delta, lo)


def test_coefficient_rises_below_the_target_and_falls_above_it_within_its_bounds():
    control = EntropyControl(target=0.5, delta=0.1, coef_min=0.05, coef_max=0.25)
    state = EntropyControlState(coef=0.1)
    coefs = []
    for entropy in (0.4, 0.5, 0.3, 0.2, 0.9, 0.9, 0.9, 0.9):
        state = update_entropy_control(state, entropy, control)
        coefs.append(state.coef)
    # 0.1 +0.1 -> 0.2, +0.1 (0.5 <= 0.5 counts as below) -> 0.25 (cap), stays 0.25, 0.25,
    # then -0.1 per update: 0.15, 0.05 (floor), 0.05, 0.05
    assert coefs == pytest.approx([0.2, 0.25, 0.25, 0.25, 0.15, 0.05, 0.05, 0.05])


def test_the_bonus_applies_only_while_the_previous_entropy_is_at_or_below_the_target():
    control = EntropyControl(target=0.5, delta=0.1)
    start = EntropyControlState(coef=0.3)
    assert start.last_entropy == math.inf
    assert applied_entropy_coef(start, control) == 0.0  # nothing measured yet: TRL's conservative start
    low = update_entropy_control(start, 0.5, control)
    assert applied_entropy_coef(low, control) == pytest.approx(0.4)
    high = update_entropy_control(low, 0.51, control)
    assert high.coef == pytest.approx(0.3)
    assert applied_entropy_coef(high, control) == 0.0


@pytest.mark.parametrize("seed", range(5))
def test_matches_trls_update_rule(seed):
    import random

    rng = random.Random(seed)
    control = EntropyControl(target=rng.uniform(0.1, 1), delta=rng.uniform(1e-4, 0.05),
                             coef_min=0.0, coef_max=rng.uniform(0.05, 0.2))
    state, coef = EntropyControlState(coef=0.01), 0.01
    for _ in range(50):
        entropy = rng.uniform(0, 1.2)
        state = update_entropy_control(state, entropy, control)
        coef = trl_update(coef, entropy, control.target, control.delta, control.coef_min, control.coef_max)
        assert state.coef == pytest.approx(coef, abs=1e-15)
        assert control.coef_min <= state.coef <= control.coef_max


@pytest.mark.parametrize("kwargs, field", [
    (dict(coef_min=0.5, coef_max=0.1), "entropy_coef_min"),
    (dict(delta=-0.1), "delta"),
    (dict(target=math.nan), "target"),
])
def test_bad_settings_name_the_field(kwargs, field):
    with pytest.raises(ValueError, match=field):
        EntropyControl(**kwargs)


def test_non_finite_entropy_is_refused():
    with pytest.raises(ValueError, match="entropy=nan"):
        update_entropy_control(EntropyControlState(coef=0.0), math.nan, EntropyControl())
