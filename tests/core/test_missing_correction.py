"""verl 0.9.1's rollout rejection sampling (``rollout_rs`` modes token / seq_sum / seq_mean /
seq_max x k1 / k2 / k3) and ``rollout_is_batch_normalize``: hand-derived masks and weights, and
verl's code transcribed below, compared on random batches (masks exactly; statistics at
rtol = 1e-7, since verl's masked means divide by count + 1e-8 where ours are exact).

Anchor: verl 0.9.1 (PyPI wheel verl-0.9.1-py3-none-any.whl, sha256 db6e6f2a...),
verl/trainer/ppo/rollout_corr_helper.py ``compute_rollout_rejection_mask``,
``_parse_rollout_rs_thresholds`` and ``compute_rollout_correction_weights``;
verl/utils/torch_functional.py ``masked_sum`` / ``masked_mean``.
"""

import math

import pytest
import torch

from tests.helpers import assert_values
from workbench.core import (REJECTION_MODES, REJECTIONS, batch_normalize_is_weights, rejection_mask,
                            rollout_correction)

# log(pi_old / pi_rollout): row 0 has one padding position
LOG_RATIO = torch.tensor([[0.1, -0.5, 0.0], [1.0, 0.2, 0.3]], dtype=torch.float64)
MASK = torch.tensor([[1.0, 1.0, 0.0], [1.0, 1.0, 1.0]], dtype=torch.float64)


def reject(mode, upper, lower=None, log_ratio=LOG_RATIO, mask=MASK):
    return rejection_mask(log_ratio, torch.zeros_like(log_ratio), mask, mode, upper=upper, lower=lower)


# k2 = l^2 / 2: row 0 [0.005, 0.125], row 1 [0.5, 0.02, 0.045]
# k3 = e^l - 1 - l: row 0 [0.0051709181, 0.1065306597], row 1 [0.7182818285, 0.0214027582, 0.0498588076]
# k1 = -l: row 0 mean 0.2, row 1 mean -0.5
HAND = [
    ("token_k2", 0.1, None, [[1, 0, 0], [0, 1, 1]], 2 / 5, 1.0),
    ("token_k3", 0.05, None, [[1, 0, 0], [0, 1, 1]], 2 / 5, 1.0),
    ("seq_sum_k2", 0.2, None, [[1, 1, 0], [0, 0, 0]], 3 / 5, 0.5),  # sums 0.13 / 0.565
    ("seq_sum_k3", 0.2, None, [[1, 1, 0], [0, 0, 0]], 3 / 5, 0.5),  # sums 0.1117 / 0.7895
    ("seq_mean_k2", 0.1, None, [[1, 1, 0], [0, 0, 0]], 3 / 5, 0.5),  # means 0.065 / 0.18833
    ("seq_mean_k3", 0.06, None, [[1, 1, 0], [0, 0, 0]], 3 / 5, 0.5),  # means 0.05585 / 0.26318
    ("seq_mean_k1", 1.5, None, [[1, 1, 0], [0, 0, 0]], 3 / 5, 0.5),  # 0.2 in [log 2/3, log 1.5], -0.5 not
    ("seq_mean_k1", 1.5, 0.5, [[1, 1, 0], [1, 1, 1]], 0.0, 0.0),  # [log 0.5, log 1.5] holds -0.5 too
    ("seq_max_k2", 0.2, None, [[1, 1, 0], [0, 0, 0]], 3 / 5, 0.5),  # maxima 0.125 / 0.5
    ("seq_max_k3", 0.5, None, [[1, 1, 0], [0, 0, 0]], 3 / 5, 0.5),  # maxima 0.1065 / 0.7183
]


@pytest.mark.parametrize("mode,upper,lower,kept,fraction,seq_fraction", HAND)
def test_hand_masks(mode, upper, lower, kept, fraction, seq_fraction):
    out, metrics = reject(mode, upper, lower)
    assert_values(out, kept, atol=0)
    prefix = f"rollout_corr/rollout_rs_{mode}"
    assert metrics[f"{prefix}_masked_fraction"].item() == pytest.approx(fraction, abs=1e-15)
    assert metrics[f"{prefix}_seq_masked_fraction"].item() == pytest.approx(seq_fraction, abs=1e-15)


def test_every_mode_is_registered_and_thresholds_are_checked():
    assert REJECTIONS.names() == REJECTION_MODES
    with pytest.raises(ValueError, match="upper"):
        reject("token_k2", 0.0)
    with pytest.raises(ValueError, match="only an upper bound"):
        reject("seq_max_k3", 1.0, lower=0.5)
    with pytest.raises(ValueError, match="lower"):
        reject("token_k1", 1.5, lower=2.0)
    with pytest.raises(ValueError, match="unknown rollout rejection mode"):
        reject("seq_max_k1", 1.0)


def test_an_empty_row_counts_zero_and_is_kept():
    mask = MASK.clone()
    mask[0] = 0.0
    out, metrics = reject("seq_max_k2", 0.2, mask=mask)
    assert_values(out, [[0, 0, 0], [0, 0, 0]], atol=0)
    assert metrics["rollout_corr/rollout_rs_seq_max_k2_seq_masked_fraction"].item() == 1.0  # of rows with a token


# ---- verl transcribed ----------------------------------------------------------------------------


def verl_masked_sum(values, mask, axis=None):
    valid_values = torch.where(mask.bool(), values, 0.0)
    return (valid_values * mask).sum(axis=axis)


def verl_masked_mean(values, mask, axis=None):
    s = verl_masked_sum(values, mask, axis)
    return s / (mask.sum(axis=axis) + 1e-8)


def verl_threshold(option, spec):
    # verl 0.9.1 _parse_rollout_rs_thresholds, one option, spec a string:
    if option.endswith("k1"):
        if "_" in spec:
            lower_str, upper_str = spec.split("_", 1)
        else:
            upper_str = spec
            lower_str = str(1.0 / float(upper_str))
        return float(lower_str), float(upper_str)
    return None, float(spec)


def verl_rejection(log_ratio, response_mask, option_name, spec):
    # verl 0.9.1 compute_rollout_rejection_mask, one option (SAFETY_BOUND = 20); the masked fractions
    # as it computes them, and "_mean" as compute_rs_metrics does:
    lower_value, upper_value = verl_threshold(option_name, spec)
    log_ratio_safe = torch.clamp(log_ratio, min=-20.0, max=20.0)
    token_k1 = -log_ratio_safe
    token_k2 = 0.5 * log_ratio_safe**2
    token_k3 = torch.exp(log_ratio_safe) - 1.0 - log_ratio_safe
    response_mask_bool = response_mask.bool()
    seq_valid_mask = response_mask.sum(dim=-1) > 0
    combined_mask = torch.ones_like(response_mask, dtype=log_ratio.dtype)

    def _sequence_max(values):
        mask_bool = response_mask.bool()
        neg_inf = torch.tensor(float("-inf"), device=values.device, dtype=values.dtype)
        masked_values = values.masked_fill(~mask_bool, neg_inf)
        max_values = masked_values.max(dim=-1).values
        return torch.where(max_values == neg_inf, torch.zeros_like(max_values), max_values)

    is_k1_option = option_name.endswith("k1")
    if is_k1_option:
        lower_log, upper_log = math.log(lower_value), math.log(upper_value)
    stats = {"k1": token_k1, "k2": token_k2, "k3": token_k3}[option_name[-2:]]
    if option_name.startswith("token"):
        per_token_stat = stats
        if is_k1_option:
            token_keep_bool = (per_token_stat >= lower_log) & (per_token_stat <= upper_log)
        else:
            token_keep_bool = per_token_stat <= upper_value
    else:
        reduce = {"seq_sum": lambda v: verl_masked_sum(v, response_mask, axis=-1),
                  "seq_mean": lambda v: verl_masked_mean(v, response_mask, axis=-1),
                  "seq_max": _sequence_max}[option_name.rsplit("_", 1)[0]]
        seq_stat = reduce(stats)
        if is_k1_option:
            seq_keep_bool_direct = (seq_stat >= lower_log) & (seq_stat <= upper_log)
        else:
            seq_keep_bool_direct = seq_stat <= upper_value
        token_keep_bool = seq_keep_bool_direct.unsqueeze(-1).expand_as(response_mask_bool)
        per_token_stat = seq_stat.unsqueeze(-1).expand_as(response_mask)
    token_keep_mask = token_keep_bool.to(dtype=log_ratio.dtype)
    combined_mask = combined_mask * token_keep_mask
    seq_keep_bool_tensor = (~((~token_keep_bool) & response_mask_bool)).all(dim=-1)
    token_masked_fraction = verl_masked_mean(1 - token_keep_mask, response_mask).item()
    seq_valid_float = seq_valid_mask.float()
    seq_keep_float = seq_keep_bool_tensor.to(dtype=log_ratio.dtype)
    seq_masked_fraction = (((1.0 - seq_keep_float) * seq_valid_float).sum() / seq_valid_float.sum()).item()
    modified_response_mask = (response_mask * combined_mask).to(dtype=response_mask.dtype)
    return modified_response_mask, {"mean": verl_masked_mean(per_token_stat, response_mask).item(),
                                    "masked_fraction": token_masked_fraction, "seq_masked_fraction": seq_masked_fraction}


SPECS = {"k1": ("1.3", "0.6_1.2", "2.0"), "k2": ("0.02", "0.1"), "k3": ("0.02", "0.1")}


@pytest.mark.parametrize("mode,spec", [(m, s) for m in REJECTION_MODES for s in SPECS[m[-2:]]])
@pytest.mark.parametrize("seed", range(3))
def test_rejection_equals_verl(mode, spec, seed):
    g = torch.Generator().manual_seed(seed)
    old = -torch.rand(8, 10, generator=g, dtype=torch.float64) * 3
    rollout = old + torch.randn(8, 10, generator=g, dtype=torch.float64) * 0.15
    lengths = torch.randint(0, 11, (8,), generator=g)
    lengths[0] = 10
    mask = (torch.arange(10)[None] < lengths[:, None]).double()
    lower, upper = verl_threshold(mode, spec)
    got, metrics = rejection_mask(old, rollout, mask, mode, upper=upper, lower=lower if "_" in spec else None)
    want, verl_metrics = verl_rejection(old - rollout, mask, mode, spec)
    assert torch.equal(got, want)
    for name, value in verl_metrics.items():
        assert metrics[f"rollout_corr/rollout_rs_{mode}_{name}"].item() == pytest.approx(value, rel=1e-7, abs=1e-12)


# ---- batch normalisation -------------------------------------------------------------------------


def test_batch_normalize_hand_values():
    # token level: weights 3, 1, 2 on the valid tokens: mean 2 -> 1.5, 0.5, 1
    w, factor = batch_normalize_is_weights(torch.tensor([[3.0, 1.0], [2.0, 0.0]], dtype=torch.float64),
                                           torch.tensor([[1.0, 1.0], [1.0, 0.0]], dtype=torch.float64), "token")
    assert_values(w, [[1.5, 0.5], [1.0, 0.0]], atol=0)
    assert factor.item() == 2.0
    # sequence level: one weight per completion (3 and 1): mean 2, not the token mean 7 / 3
    w, factor = batch_normalize_is_weights(torch.tensor([[3.0, 3.0], [1.0, 0.0]], dtype=torch.float64),
                                           torch.tensor([[1.0, 1.0], [1.0, 0.0]], dtype=torch.float64), "sequence")
    assert_values(w, [[1.5, 1.5], [0.5, 0.0]], atol=0)
    assert factor.item() == 2.0
    # a batch whose weights are all (nearly) 0 stays as it is, factor 1
    w, factor = batch_normalize_is_weights(torch.zeros(2, 2), torch.ones(2, 2), "token")
    assert factor.item() == 1.0 and not w.any()


def verl_is_weights(log_ratio, response_mask, rollout_is, threshold, batch_normalize):
    # verl 0.9.1 compute_rollout_correction_weights (TIS: a single upper threshold; not distributed):
    if rollout_is == "token":
        raw_rollout_is_weights = torch.exp(torch.clamp(log_ratio, min=-20.0, max=20.0))
    else:
        log_ratio_sum = verl_masked_sum(log_ratio, response_mask, axis=-1).unsqueeze(-1)
        raw_rollout_is_weights = torch.exp(torch.clamp(log_ratio_sum, min=-20.0, max=20.0)).expand_as(log_ratio)
    raw_rollout_is_weights = raw_rollout_is_weights * response_mask
    rollout_is_weights = raw_rollout_is_weights.clamp(max=threshold)
    if batch_normalize:
        if rollout_is == "token":
            weights_mean = verl_masked_mean(rollout_is_weights, response_mask)
        else:
            seq_weights = verl_masked_mean(rollout_is_weights, response_mask, axis=-1)
            seq_mask = (response_mask.sum(dim=-1) > 0).to(dtype=rollout_is_weights.dtype)
            weights_mean = (seq_weights * seq_mask).sum() / seq_mask.sum().clamp_min(1e-8)
        if weights_mean > 1e-8:
            rollout_is_weights = rollout_is_weights / weights_mean
    return rollout_is_weights


@pytest.mark.parametrize("level", ["token", "sequence"])
@pytest.mark.parametrize("seed", range(4))
def test_batch_normalized_weights_equal_verl(level, seed):
    g = torch.Generator().manual_seed(seed)
    old = -torch.rand(6, 8, generator=g, dtype=torch.float64) * 3
    rollout = old + torch.randn(6, 8, generator=g, dtype=torch.float64) * 0.2
    lengths = torch.randint(1, 9, (6,), generator=g)
    mask = (torch.arange(8)[None] < lengths[:, None]).double()
    w, metrics = rollout_correction(old, rollout, mask, level=level, mode="truncate", clip_max=2.0, batch_normalize=True)
    want = verl_is_weights(old - rollout, mask, level, 2.0, True)
    torch.testing.assert_close(w, want, rtol=1e-7, atol=0)  # verl's means divide by count + 1e-8
    plain, plain_metrics = rollout_correction(old, rollout, mask, level=level, mode="truncate", clip_max=2.0)
    torch.testing.assert_close(w * metrics["rollout_corr/rollout_is_batch_norm_factor"], plain, rtol=1e-15, atol=0)
    assert metrics["sampling/importance_sampling_ratio/mean"] == plain_metrics["sampling/importance_sampling_ratio/mean"]
