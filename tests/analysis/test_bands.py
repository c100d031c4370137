"""Bands of the arms view (workbench/analysis/bands.py): each band choice by hand for 2-3 seeds,
clipping to a metric's range, and a property test over every metric of the panel registry that
has a range: whatever the seeds log inside the range, no band leaves it."""

import math

import numpy as np
import pandas as pd
import pytest
from hypothesis import given, settings
from hypothesis import strategies as hst

from workbench.analysis import aggregation_caption, mean_curve_with_band
from workbench.analysis.smoothing import EMA
from workbench.analysis.bands import (BANDS, MAX_ALIGNED_SEEDS, _aligned_blocks, _by_arm_then_x, _per_point,
                                      _per_point_aligned, _sorted_by, clip_band, frame_codes)
from workbench.viz.curves import PANELS

T1 = 12.706204736174707  # t_{0.975, 1}
T2 = 4.302652729749464  # t_{0.975, 2}


def seeds_frame(values_by_seed: list[list[float]], metric: str = "reward", arm: str = "a") -> pd.DataFrame:
    """One arm; seed i logs values_by_seed[i] at steps 0.."""
    return pd.DataFrame([{"run_id": f"{arm}{seed}", "arm": arm, "seed": seed, "step": step, metric: value}
                         for seed, values in enumerate(values_by_seed) for step, value in enumerate(values)])


def one_point(values: list[float], band: str, bounds=(-math.inf, math.inf)) -> tuple[float, float, float]:
    curve = mean_curve_with_band(seeds_frame([[v] for v in values]), "reward", band=band, bounds=bounds)
    row = curve.iloc[0]
    return row["mean"], row["ci_low"], row["ci_high"]


def test_each_band_by_hand_for_two_seeds():
    # 1 and 3: mean 2, s = sqrt 2, standard error s / sqrt 2 = 1
    assert one_point([1.0, 3.0], "ci") == pytest.approx((2.0, 2.0 - T1, 2.0 + T1), abs=1e-12)
    assert one_point([1.0, 3.0], "se") == pytest.approx((2.0, 1.0, 3.0), abs=1e-12)
    assert one_point([1.0, 3.0], "minmax") == (2.0, 1.0, 3.0)


def test_each_band_by_hand_for_three_seeds():
    # 0, 1, 5: mean 2, squared deviations 4 + 1 + 9 = 14, s^2 = 7, standard error sqrt(7 / 3)
    se = math.sqrt(7 / 3)
    assert one_point([0.0, 1.0, 5.0], "ci") == pytest.approx((2.0, 2.0 - T2 * se, 2.0 + T2 * se), abs=1e-12)
    assert one_point([0.0, 1.0, 5.0], "se") == pytest.approx((2.0, 2.0 - se, 2.0 + se), abs=1e-12)
    assert one_point([0.0, 1.0, 5.0], "minmax") == (2.0, 0.0, 5.0)


def test_one_seed_has_no_band_of_any_kind():
    for band in BANDS:
        mean, low, high = one_point([0.4], band)
        assert mean == 0.4 and math.isnan(low) and math.isnan(high)


def test_a_fractions_two_seed_band_is_clipped_to_zero_one():
    # 0 and 0.5: mean 0.25, t-band 0.25 -+ 12.7 x 0.25 = [-2.93, 3.43] -> [0, 1]
    assert one_point([0.0, 0.5], "ci", (0.0, 1.0)) == (0.25, 0.0, 1.0)
    assert one_point([0.0, 0.5], "se", (0.0, 1.0)) == pytest.approx((0.25, 0.0, 0.5))  # inside: unchanged


def test_a_mean_outside_the_range_keeps_its_band_around_it():
    """A k1 KL estimate's step mean can be < 0 although KL >= 0: the band is clipped to the range
    widened to the mean, so it still contains the line it surrounds."""
    mean, low, high = one_point([-1.0, -3.0], "ci", (0.0, math.inf))  # mean -2, s = sqrt 2
    assert (mean, low) == (-2.0, -2.0) and high == pytest.approx(-2.0 + T1)
    low, high = clip_band(np.array([0.5, 0.5]), np.array([np.nan, -0.5]), np.array([np.nan, 2.0]), (0.0, 1.0))
    assert math.isnan(low[0]) and math.isnan(high[0]) and (low[1], high[1]) == (0.0, 1.0)  # no band stays none


def test_the_caption_names_the_band_drawn():
    curve = mean_curve_with_band(seeds_frame([[0.0, 1.0], [1.0, 1.0]]), "reward")
    assert {band: aggregation_caption(curve, band=band) for band in BANDS} == {
        "ci": "a: 2 seeds · band: 95% t-interval over seeds where >= 2",
        "se": "a: 2 seeds · band: +-1 standard error over seeds where >= 2",
        "minmax": "a: 2 seeds · band: min-max over seeds where >= 2"}
    with pytest.raises(ValueError, match=r"band='iqr' is not allowed; choose one of: ci, se, minmax"):
        mean_curve_with_band(seeds_frame([[0.0]]), "reward", band="iqr")


def test_the_tokens_caption_prints_whole_tokens():
    """Interpolated grid points of the tokens axis fall between tokens: 3842.81 is shown 3,843."""
    df = pd.DataFrame({"run_id": ["a0"] * 2 + ["a1"] * 3, "arm": "a", "step": [0, 1, 0, 1, 2],
                       "tokens": [0.0, 3842.81, 0.0, 3000.0, 7685.62], "reward": [0.0, 1, 0, 1, 2]})
    curve = mean_curve_with_band(df, "reward", "tokens", grid_points=3)  # grid 0, 3842.81, 7685.62
    assert aggregation_caption(curve, "tokens") == ("a: 2 seeds to 3,843 tokens, then 1 to 7,686 tokens · "
                                                    "band: 95% t-interval over seeds where >= 2")


def test_a_caption_over_several_arms_names_each_arms_seeds_in_order():
    df = pd.concat([seeds_frame([[0.0, 1.0, 2.0], [1.0, 1.0]], arm="b"), seeds_frame([[0.0], [1.0], [2.0]], arm="a"),
                    seeds_frame([[1.0] * 6, [1.0] * 2, [1.0] * 4, [1.0] * 5, [1.0] * 3], arm="c")])
    curve = mean_curve_with_band(df, "reward")
    assert aggregation_caption(curve) == ("b: 2 seeds to step 1, then 1 to step 2 · a: 3 seeds · c: 1-5 seeds per point · "
                                          "band: 95% t-interval over seeds where >= 2")


def test_codes_given_by_the_caller_change_nothing():
    """``codes`` (a caller drawing several metrics of one frame factorizes its ids once) gives the
    frame's own result; codes of another frame are refused."""
    df = pd.concat([seeds_frame([[0.0, 1.0, 2.0], [1.0, 3.0]], arm="b"), seeds_frame([[0.5], [1.5]], arm="a")])
    for x, band in (("step", "ci"), ("time", "minmax")):
        framed = df.assign(time=df["step"] * 1.5 + df["seed"])
        assert mean_curve_with_band(framed, "reward", x, band=band, codes=frame_codes(framed)).equals(
            mean_curve_with_band(framed, "reward", x, band=band))
    with pytest.raises(ValueError, match="codes of 2 rows given for a frame of 7; use frame_codes"):
        mean_curve_with_band(df, "reward", codes=frame_codes(df.head(2)))


def test_one_codes_object_serves_every_metric_and_x_of_its_frame():
    """The codes of a frame keep its layout per x column (order and alignment checked once): curves
    of metrics logged at every step and at some steps, on two x columns, drawn in turn from one codes
    object equal each drawn alone; aligned seeds (3 per arm, same steps) and a late seed both."""
    rng = np.random.default_rng(5)
    for late in (False, True):
        rows = [{"run_id": f"{arm}{seed}", "arm": arm, "seed": seed, "step": step, "reward": rng.normal(),
                 "kl": rng.normal() if step % 2 else np.nan, "time": 2.0 * step + seed}
                for arm in "ab" for seed in range(3) for step in range(6 - (late and seed == 2))]
        frame, smooth = pd.DataFrame(rows), EMA(0.6)
        codes = frame_codes(frame)
        for x in ("step", "time", "step"):
            for metric in ("reward", "kl", "reward"):
                alone = mean_curve_with_band(frame, metric, x, smoothing=smooth)
                pd.testing.assert_frame_equal(mean_curve_with_band(frame, metric, x, smoothing=smooth, codes=codes), alone)
        assert set(codes.layouts) == {"step", "time"}
        assert (codes.layouts["step"].aligned is None) == late  # a seed one step behind: the sorted path


@given(hst.lists(hst.tuples(*(hst.integers(0, 3),) * 3), max_size=12))
def test_sorted_by_says_what_lexsort_would_leave_in_place(rows):
    """The arms view's frame comes sorted by (run, x, step): the check that skips the sort is
    lexsort's own verdict (stable: rows equal on every key count as sorted)."""
    keys = [np.array([r[i] for r in rows], dtype=np.float64) for i in range(3)]
    assert _sorted_by(*keys) == bool((np.lexsort(keys[::-1]) == np.arange(len(rows))).all())


@given(hst.lists(hst.tuples(hst.integers(0, 3), hst.integers(0, 5)), max_size=40), hst.booleans())
def test_the_per_point_order_is_lexsorts(rows, in_arm_blocks):
    """The per-point statistics' order (arm, then x, ties in input order) is np.lexsort's, whether
    the arms come in blocks (sorted per block) or interleaved (lexsort itself)."""
    rows = sorted(rows, key=lambda r: r[0]) if in_arm_blocks else rows
    arm, xs = np.array([r[0] for r in rows], dtype=np.intp), np.array([r[1] for r in rows], dtype=np.float64)
    assert (_by_arm_then_x(arm, xs) == np.lexsort((xs, arm))).all()


@settings(max_examples=60, deadline=None)
@given(hst.integers(1, 4), hst.integers(1, 11), hst.integers(1, 7), hst.integers(0, 2**32 - 1),
       hst.sampled_from(["aligned", "a seed behind", "x differs", "x repeats"]))
def test_aligned_seeds_give_the_sorted_paths_numbers_exactly(arms, seeds, steps, seed, shape):
    """Arms whose seeds share their steps are reduced over (seeds, steps) blocks; every statistic
    equals the sort-and-reduceat path bit for bit (sums in reduceat's order), up to
    MAX_ALIGNED_SEEDS seeds, and anything not aligned (a seed a step behind, other x, a repeated
    x, more seeds) takes the sorted path. Values span 12 orders of magnitude: a different order
    of addition shows in the last bits."""
    rng = np.random.default_rng(seed)
    run = np.repeat(np.arange(arms * seeds), steps)
    arm = np.repeat(np.arange(arms), seeds * steps)
    xs = np.tile(np.arange(steps, dtype=np.float64) * 3, arms * seeds)
    ys = rng.normal(size=len(xs)) * 10.0 ** rng.integers(-6, 6, size=len(xs))
    if shape == "a seed behind" and steps > 1:
        keep = np.ones(len(xs), dtype=bool)
        keep[steps - 1] = False  # run 0's last step not logged yet
        run, arm, xs, ys = run[keep], arm[keep], xs[keep], ys[keep]
    elif shape == "x differs" and seeds > 1:
        xs[steps] += 1  # run 1's first x
    elif shape == "x repeats" and steps > 1:
        xs.reshape(-1, steps)[:, 1] = xs.reshape(-1, steps)[:, 0]
    aligned = _aligned_blocks(run, arm, xs)
    expected_aligned = shape == "aligned" or (shape == "a seed behind" and steps == 1) or (
        shape == "x differs" and seeds == 1) or (shape == "x repeats" and steps == 1)
    assert (aligned is not None) == (expected_aligned and 2 <= seeds <= MAX_ALIGNED_SEEDS)
    if aligned is None:
        return
    fast, sorted_path = _per_point_aligned(arm, xs, ys, *aligned), _per_point(arm, xs, ys)
    assert fast.keys() == sorted_path.keys()
    for key in fast:
        assert fast[key].dtype == sorted_path[key].dtype, key
        np.testing.assert_array_equal(fast[key], sorted_path[key], err_msg=key, strict=True)


BOUNDED = [(key, metric) for key, panel in PANELS.items() for metric in panel.metrics
           if math.isfinite(panel.meta(metric).low) or math.isfinite(panel.meta(metric).high)]
FAR = 1e6  # stands in for an open end of a range in the generated values


@pytest.mark.parametrize("key,metric", BOUNDED, ids=[m for _, m in BOUNDED])
def test_no_band_leaves_the_metrics_range(key, metric):
    """Every metric of the registry with a range, every band choice, 2-3 seeds of 1-6 steps with
    values anywhere inside the range (its ends included): each band edge stays inside the range."""
    low, high = PANELS[key].meta(metric).bounds
    lo, hi = (low if math.isfinite(low) else -FAR), (high if math.isfinite(high) else FAR)
    value = hst.one_of(hst.sampled_from([lo, hi]), hst.floats(lo, hi, allow_nan=False))

    @settings(max_examples=25, deadline=None)
    @given(hst.integers(2, 3).flatmap(lambda n: hst.lists(hst.lists(value, min_size=1, max_size=6),
                                                          min_size=n, max_size=n)),
           hst.sampled_from(list(BANDS)))
    def inside(values_by_seed, band):
        curve = mean_curve_with_band(seeds_frame(values_by_seed, metric), metric, band=band, bounds=(low, high))
        edges = curve[["ci_low", "ci_high"]].to_numpy()
        defined = edges[np.isfinite(edges)]
        assert (defined >= low).all() and (defined <= high).all(), curve
        both = curve.dropna(subset=["ci_low", "ci_high"])
        assert (both["ci_low"] <= both["mean"] + 1e-9 * FAR).all() and (both["mean"] <= both["ci_high"] + 1e-9 * FAR).all()

    inside()
