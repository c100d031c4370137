"""Curve smoothing (workbench/analysis/smoothing.py): TensorBoard's debiased EMA by hand (the first
point, a NaN and an inf in the series, a constant series), its weight's bounds, and properties
(w = 0 and constant series return their input; a smoothed point is a weighted mean of the values
so far, so it stays inside their range). Then the arms view: each seed smoothed before the mean
and band, said in the caption with the weight, and nothing changed with smoothing off."""

import functools
import math

import numpy as np
import pandas as pd
import pytest
from hypothesis import given, settings
from hypothesis import strategies as hst

from workbench.analysis import aggregation_caption, mean_curve_with_band
from workbench.analysis.smoothing import EMA, MAX_SMOOTHING, check_smoothing, ema, ema_rows, smoothing_caption

NAN = math.nan


def test_first_point_nan_and_later_points_by_hand():
    # w = 0.5, x = 1, NaN, 0, 3 (TensorBoard: last = w*last + (1-w)*x, shown as last / (1 - w^n)):
    # t0: last = 0.5, n = 1 -> 0.5 / 0.5 = 1 (the first point is the value itself, not 0.5)
    # t1: NaN shown as NaN; last and n stay
    # t2: last = 0.25 + 0 = 0.25, n = 2 -> 0.25 / 0.75 = 1/3
    # t3: last = 0.125 + 1.5 = 1.625, n = 3 -> 1.625 / 0.875 = 13/7
    out = ema([1.0, NAN, 0.0, 3.0], 0.5)
    assert out[0] == 1.0 and math.isnan(out[1]) and out[2] == pytest.approx(1 / 3, abs=1e-15) and out[3] == 13 / 7
    # w = 0.6, x = 0, 1: t0 = 0; t1: last = 0.4, n = 2 -> 0.4 / 0.64 = 0.625
    assert ema([0.0, 1.0], 0.6) == pytest.approx([0.0, 0.625], abs=1e-15)
    # a NaN first: still NaN, and the first finite value is shown as itself
    assert np.array_equal(ema([NAN, 2.0, 4.0], 0.5), [NAN, 2.0, (0.5 * 1.0 + 2.0) / 0.75], equal_nan=True)


def test_inf_is_kept_and_does_not_advance_the_average():
    out = ema([1.0, math.inf, 0.0], 0.5)
    assert out[0] == 1.0 and out[1] == math.inf and out[2] == pytest.approx(1 / 3, abs=1e-15)


def test_constant_series_and_zero_weight_are_returned_unchanged_as_new_arrays():
    values = np.array([0.3] * 7)
    out = ema(values, 0.9)
    assert out.tolist() == [0.3] * 7 and out is not values  # not 0.30000000000000004 somewhere
    raw = np.array([1.0, NAN, -2.5])
    assert np.array_equal(ema(raw, 0.0), raw, equal_nan=True)
    assert ema([], 0.6).shape == (0,) and np.isnan(ema([NAN, NAN], 0.6)).all()


@pytest.mark.parametrize("weight", [1.0, -0.01, 0.995, NAN, math.inf, True, "0.5", None])
def test_weight_outside_0_to_0_99_is_named(weight):
    with pytest.raises(ValueError, match=r"^smoothing=.* is not allowed; an EMA weight from 0 \(off\) to 0\.99$"):
        ema([1.0, 2.0], weight)
    with pytest.raises(ValueError, match=r"^--smooth="):
        check_smoothing(weight, "--smooth")


def test_weight_bounds_are_allowed():
    assert check_smoothing(0) == 0.0 and check_smoothing(MAX_SMOOTHING) == 0.99 and check_smoothing(np.float32(0.5)) == 0.5
    assert np.isfinite(ema(np.linspace(0, 1, 1000), MAX_SMOOTHING)).all()


finite = hst.floats(-1e6, 1e6, allow_nan=False)
weights = hst.floats(0.0, MAX_SMOOTHING)


@settings(max_examples=60, deadline=None)
@given(finite, hst.integers(1, 50), weights)
def test_property_a_constant_series_is_returned_exactly(value, n, weight):
    assert ema([value] * n, weight).tolist() == [value] * n


@settings(max_examples=60, deadline=None)
@given(hst.lists(hst.one_of(finite, hst.just(NAN)), max_size=40))
def test_property_zero_weight_returns_the_input(values):
    assert np.array_equal(ema(values, 0.0), np.asarray(values, dtype=np.float64), equal_nan=True)


@settings(max_examples=60, deadline=None)
@given(hst.lists(hst.one_of(finite, hst.just(NAN)), min_size=1, max_size=40), weights)
def test_property_each_point_is_a_weighted_mean_of_the_values_so_far(values, weight):
    """NaN where the input is NaN, else inside [min, max] of the finite values up to that point."""
    out, x = ema(values, weight), np.asarray(values, dtype=np.float64)
    assert np.array_equal(np.isnan(out), np.isnan(x))
    for t in np.flatnonzero(np.isfinite(x)):
        seen = x[:t + 1][np.isfinite(x[:t + 1])]
        slack = 1e-9 * max(1.0, np.abs(seen).max())
        assert seen.min() - slack <= out[t] <= seen.max() + slack


def two_seeds() -> pd.DataFrame:
    """One arm, seed 0 logs 0, 2, 2 and seed 1 logs 2, 2, 4 at steps 0..2."""
    ys = {0: [0.0, 2.0, 2.0], 1: [2.0, 2.0, 4.0]}
    return pd.DataFrame([{"run_id": f"r{s}", "arm": "a", "seed": s, "step": t, "reward": y}
                         for s, values in ys.items() for t, y in enumerate(values)])


def test_each_seed_is_smoothed_before_the_mean_and_band_and_the_caption_says_so():
    # w = 0.5. seed 0 (0, 2, 2): last = 0, 1, 1.5 -> 0/0.5 = 0, 1/0.75 = 4/3, 1.5/0.875 = 12/7
    #          seed 1 (2, 2, 4): last = 1, 1.5, 2.75 -> 1/0.5 = 2, 1.5/0.75 = 2, 2.75/0.875 = 22/7
    curve = mean_curve_with_band(two_seeds(), "reward", smoothing=functools.partial(ema, weight=0.5), band="minmax")
    assert curve["mean"].tolist() == pytest.approx([1.0, 5 / 3, 17 / 7], abs=1e-12)
    assert curve["ci_low"].tolist() == pytest.approx([0.0, 4 / 3, 12 / 7], abs=1e-12)  # the smoothed seeds' range
    assert curve["ci_high"].tolist() == pytest.approx([2.0, 2.0, 22 / 7], abs=1e-12)
    caption = aggregation_caption(curve, band="minmax", smoothing=0.5)
    assert caption == ("a: 2 seeds · band: min-max over seeds where >= 2 · each seed smoothed first (EMA weight 0.5, "
                       "debiased as in TensorBoard), then averaged: the band spreads the smoothed seeds")
    raw = mean_curve_with_band(two_seeds(), "reward", band="minmax")  # off (the default): the logged values
    assert raw["mean"].tolist() == [1.0, 2.0, 3.0] and raw["ci_low"].tolist() == [0.0, 2.0, 2.0]
    assert aggregation_caption(raw, band="minmax") == "a: 2 seeds · band: min-max over seeds where >= 2"
    assert smoothing_caption(0.0) == ""


@given(hst.lists(hst.lists(hst.sampled_from([0.0, 1.0, -2.5, 0.3, 7.0, math.nan, math.inf]), min_size=4, max_size=4),
                 min_size=1, max_size=5),
       hst.sampled_from([0.0, 0.3, 0.6, 0.99]))
def test_ema_rows_is_ema_row_by_row(rows, weight):
    """The arms view smooths all seeds of one length in one filter call: every row equals ``ema`` of
    that row alone, bit for bit, constant rows and rows with NaN / inf included."""
    x = np.array(rows, dtype=np.float64)
    together = ema_rows(x, weight)
    for row, alone in zip(together, x):
        assert np.array_equal(row, ema(alone, weight), equal_nan=True)
    assert np.array_equal(EMA(weight).rows(x), together, equal_nan=True)
    assert np.array_equal(EMA(weight)(x[0]), ema(x[0], weight), equal_nan=True)


def test_the_arms_view_bands_are_the_same_with_seeds_smoothed_together():
    """``mean_curve_with_band`` smooths seeds of equal length together when the smoother can
    (``EMA``): the same curve and band as a smoother of one seed at a time, for live seeds of
    unequal length."""
    rng = np.random.default_rng(5)
    rows = [(f"a{arm}s{seed}", f"a{arm}", seed, step, float(rng.normal()))
            for arm in range(3) for seed in range(3) for step in range((40, 40, int(rng.integers(3, 40)))[seed])]
    df = pd.DataFrame(rows, columns=["run_id", "arm", "seed", "step", "reward"])
    together = mean_curve_with_band(df, "reward", smoothing=EMA(0.6))
    one_by_one = mean_curve_with_band(df, "reward", smoothing=functools.partial(ema, weight=0.6))
    pd.testing.assert_frame_equal(together, one_by_one, check_exact=True)
    assert not together.equals(mean_curve_with_band(df, "reward"))  # the smoothing acted
