"""The verdict table's statistics (workbench/analysis): hand-computed values, agreement with scipy,
verdict wording, seeds needed against textbook power tables, and live curves of unequal length."""

import functools
import itertools
import math
import subprocess
import sys
import warnings

import numpy as np
import pandas as pd
import pytest
from scipy import stats

from workbench.analysis import (aggregation_caption, arm_summary, default_metric, final_window_scores, final_window_values,
                                mean_curve_with_band, pairwise, probability_of_improvement, seeds_needed, sweep_table)
from workbench.analysis.stats import (iqm_interval, pooled_effect_size, seeds_needed_each, t_test_power,
                                      welch_interval, window_length)

T_975_DF2 = 4.302652729749464  # Student t quantile t_{0.975, 2} (tables: 4.303)
T_975_DF1 = 12.706204736174707  # t_{0.975, 1} (tables: 12.706)


def metrics_frame(runs: dict[tuple[str, int], list[float]], metric: str = "reward") -> pd.DataFrame:
    """A long metrics frame: (arm, seed) -> values at steps 0..N-1, run ids ARM-sSEED."""
    return pd.DataFrame([{"run_id": f"{arm}-s{seed}", "arm": arm, "seed": seed, "step": step, "time": 1000.0 + step,
                          metric: value}
                         for (arm, seed), values in runs.items() for step, value in enumerate(values)])


# -- one score per run ----------------------------------------------------------------------------
def test_window_length_is_a_tenth_of_the_steps_rounded_up_and_at_least_one():
    assert [window_length(n, 0.1) for n in (1, 5, 10, 11, 20, 30, 1000)] == [1, 1, 1, 2, 2, 3, 100]
    assert window_length(8, 0.25) == 2 and window_length(8, 1.0) == 8
    assert window_length(100, 0.07) == 7  # 0.07 * 100 = 7.000000000000001 in floating point


def test_final_window_scores_average_the_last_tenth_of_each_runs_logged_steps():
    runs = {("grpo", 1): list(range(20)),          # last 2 steps: (18 + 19) / 2
            ("grpo", 0): [0.0] * 27 + [1, 2, 3],   # 30 steps -> 3: (1 + 2 + 3) / 3
            ("rloo", 0): [5, 6, 7, 8, 9]}          # 5 steps -> 1: the last one
    df = metrics_frame(runs)
    scores = final_window_scores(df, "reward")
    assert scores[["run_id", "arm", "seed", "score", "window_steps", "first_step", "last_step"]].values.tolist() == [
        ["grpo-s0", "grpo", 0, 2.0, 3, 27, 29], ["grpo-s1", "grpo", 1, 18.5, 2, 18, 19], ["rloo-s0", "rloo", 0, 9.0, 1, 4, 4]]
    values = final_window_values(df, "reward")
    assert list(values) == ["grpo", "rloo"]
    np.testing.assert_array_equal(values["grpo"], [2.0, 18.5])
    np.testing.assert_array_equal(values["rloo"], [9.0])


def test_final_window_counts_only_steps_that_logged_the_metric_and_skips_runs_without_it():
    # an eval metric logged every 5th step: 20 logged values, the window is the last 2 of them
    df = metrics_frame({("a", 0): [float(s) if s % 5 == 0 else math.nan for s in range(100)],
                        ("a", 1): [math.nan] * 10})  # a live run that has not logged it yet
    scores = final_window_scores(df, "reward")
    assert scores[["run_id", "score", "first_step", "last_step"]].values.tolist() == [["a-s0", 92.5, 90, 95]]


def test_the_default_metric_is_the_eval_reward_once_logged():
    df = metrics_frame({("a", 0): [0.1, 0.2]})
    assert default_metric(df) == "reward"
    assert default_metric(df.assign(**{"eval/reward": math.nan})) == "reward"  # column present, nothing logged yet
    assert default_metric(df.assign(**{"eval/reward": [math.nan, 0.5]})) == "eval/reward"
    assert default_metric(df.drop(columns="reward")) is None


def test_final_window_refuses_a_bad_window_and_a_frame_without_arms():
    df = metrics_frame({("a", 0): [1.0, 2.0]})
    with pytest.raises(ValueError, match=r"window_frac=0 is not allowed; use a fraction of the steps in \(0, 1\]"):
        final_window_scores(df, "reward", 0)
    with pytest.raises(ValueError, match=r"lacks column\(s\) \['arm'\]"):
        final_window_scores(df.drop(columns="arm"), "reward")
    with pytest.raises(ValueError, match=r"lacks column\(s\) \['kl'\]"):
        final_window_scores(df, "kl")


# -- per arm --------------------------------------------------------------------------------------
def test_arm_summary_by_hand():
    table = arm_summary({"A": [1.0, 2.0, 3.0], "B": [0.0, 1.0, 3.0, 10.0], "C": [7.0]}).set_index("arm")
    # A: mean 2, s = 1, interval 2 -+ t_{.975,2} / sqrt(3); IQM of 3 values drops int(0.75) = 0 -> the mean
    assert table.loc["A", "n"] == 3 and table.loc["A", "mean"] == 2.0 and table.loc["A", "std"] == 1.0
    assert table.loc["A", "ci_low"] == pytest.approx(2 - T_975_DF2 / math.sqrt(3), abs=1e-12)
    assert table.loc["A", "ci_high"] == pytest.approx(2 + T_975_DF2 / math.sqrt(3), abs=1e-12)
    assert table.loc["A", "iqm"] == 2.0
    # B: IQM of 4 drops one from each end: (1 + 3) / 2
    assert table.loc["B", "iqm"] == 2.0 and table.loc["B", "mean"] == 3.5
    assert math.isnan(table.loc["B", "iqm_ci_low"]) and table.loc["B", "note"] == "IQM interval needs >= 5 seeds"
    # C: one seed, no spread, no interval, and the table says so
    assert table.loc["C", "mean"] == 7.0 and math.isnan(table.loc["C", "std"]) and math.isnan(table.loc["C", "ci_low"])
    assert table.loc["C", "note"] == "1 seed: no interval (needs >= 2)"


def test_arms_of_one_seed_count_described_together_equal_each_described_alone():
    """Arms of equal seed counts are summarised in one call per statistic: every number equals
    numpy / scipy on that arm's scores alone, bit for bit, with arms of 1 to 9 seeds mixed and
    values spanning 12 orders of magnitude (an arm's row never borrows another's order of sums)."""
    rng = np.random.default_rng(7)
    scores = {f"arm{k}": rng.normal(size=n) * 10.0 ** rng.integers(-6, 6, size=n)
              for k, n in enumerate([3, 1, 3, 5, 2, 3, 9, 5, 2, 1])}
    table = arm_summary(scores).set_index("arm")
    assert list(table.index) == list(scores)
    for arm, x in scores.items():
        row, n = table.loc[arm], len(x)
        assert row["n"] == n and row["mean"] == np.mean(x) and row["iqm"] == stats.trim_mean(x, 0.25)
        if n == 1:
            assert math.isnan(row["std"]) and math.isnan(row["ci_low"]) and math.isnan(row["ci_high"])
            continue
        half = stats.t.ppf(0.975, n - 1) * np.std(x, ddof=1) / np.sqrt(n)
        assert row["std"] == np.std(x, ddof=1)
        assert (row["ci_low"], row["ci_high"]) == (np.mean(x) - half, np.mean(x) + half)
        np.testing.assert_array_equal([row["iqm_ci_low"], row["iqm_ci_high"]], iqm_interval(x))


def test_iqm_of_eight_seeds_ignores_the_outlier_and_gets_a_reproducible_bootstrap_interval():
    x = np.array([1.0, 2, 3, 4, 5, 6, 7, 100])
    row = arm_summary({"A": x}).iloc[0]
    assert row["iqm"] == 4.5  # drop int(0.25 * 8) = 2 each side: mean(3, 4, 5, 6)
    assert row["mean"] == 16.0 and row["note"] == ""
    direct = stats.bootstrap((x,), lambda s, axis: stats.trim_mean(s, 0.25, axis=axis), vectorized=True,
                             n_resamples=9999, method="percentile", rng=np.random.default_rng(0)).confidence_interval
    assert (row["iqm_ci_low"], row["iqm_ci_high"]) == (direct.low, direct.high)
    assert row["iqm_ci_low"] <= row["iqm"] <= row["iqm_ci_high"]
    assert arm_summary({"A": x}).equals(arm_summary({"A": x}))  # same scores, same table


def test_mean_interval_agrees_with_scipy_one_sample_t_and_is_a_point_for_zero_spread():
    rng = np.random.default_rng(3)
    for n in (2, 3, 7):
        x = rng.normal(size=n)
        row = arm_summary({"A": x}, confidence=0.9).iloc[0]
        ci = stats.ttest_1samp(x, 0.0).confidence_interval(0.9)
        assert (row["ci_low"], row["ci_high"]) == pytest.approx((ci.low, ci.high), abs=1e-12)
    converged = arm_summary({"A": [1.0, 1.0, 1.0]}).iloc[0]
    assert (converged["ci_low"], converged["ci_high"]) == (1.0, 1.0)
    assert iqm_interval(np.ones(6)) == (1.0, 1.0)


@pytest.mark.parametrize("bad, message", [
    ({"A": []}, r"scores of arm 'A' = \[\] are not allowed; use a non-empty 1-D list of finite numbers"),
    ({"A": [1.0, math.nan]}, r"scores of arm 'A' = \[1.0, nan\] are not allowed"),
    ({}, r"scores_by_arm is empty"),
])
def test_bad_scores_are_refused_naming_the_arm(bad, message):
    with pytest.raises(ValueError, match=message):
        arm_summary(bad)


def test_confidence_outside_zero_one_is_refused():
    with pytest.raises(ValueError, match=r"confidence=1.5 is not allowed; use a number strictly between 0 and 1"):
        arm_summary({"A": [1.0, 2.0]}, confidence=1.5)
    with pytest.raises(ValueError, match=r"confidence=0 is not allowed"):
        pairwise({"A": [1.0, 2.0], "B": [1.0, 3.0]}, confidence=0)


# -- per pair -------------------------------------------------------------------------------------
def test_probability_of_improvement_with_ties_by_hand():
    # pairs (a_i, b_j): a=1 beats 0 only (1); a=2 ties 2 twice, beats 0 (1/2 + 1/2 + 1); a=3 beats all (3) -> 6/9
    assert probability_of_improvement(np.array([1.0, 2, 3]), np.array([2.0, 2, 0])) == pytest.approx(2 / 3, abs=1e-15)
    assert probability_of_improvement(np.array([1.0]), np.array([1.0])) == 0.5
    assert probability_of_improvement(np.array([0.0, 0.0]), np.array([1.0, 1.0, 1.0])) == 0.0


def test_probability_of_improvement_is_the_pair_count_on_random_tied_scores():
    rng = np.random.default_rng(0)
    for _ in range(20):
        a, b = rng.integers(0, 4, size=rng.integers(1, 7)).astype(float), rng.integers(0, 4, size=rng.integers(1, 7)).astype(float)
        by_count = sum((x > y) + 0.5 * (x == y) for x, y in itertools.product(a, b)) / (len(a) * len(b))
        assert probability_of_improvement(a, b) == pytest.approx(by_count, abs=1e-12)
        assert probability_of_improvement(a, b) + probability_of_improvement(b, a) == pytest.approx(1.0, abs=1e-12)


def test_welch_interval_against_the_hand_formula():
    a, b = np.array([1.0, 2, 3]), np.array([2.0, 4, 6, 8])
    # s_a^2/n_a = 1/3, s_b^2/n_b = (20/3)/4 = 5/3: se^2 = 2; nu = 2^2 / ((1/3)^2/2 + (5/3)^2/3) = 216/53
    half = stats.t.ppf(0.975, 216 / 53) * math.sqrt(2.0)
    low, high, p = welch_interval(a, b)
    assert (low, high) == pytest.approx((-3 - half, -3 + half), abs=1e-12)
    assert p == pytest.approx(2 * stats.t.sf(3 / math.sqrt(2), 216 / 53), abs=1e-12)
    row = pairwise({"A": a, "B": b}).iloc[0]
    assert row["diff"] == -3.0 and (row["diff_ci_low"], row["diff_ci_high"]) == pytest.approx((low, high), abs=1e-15)
    # pooled s_p^2 = (2 * 1 + 3 * 20/3) / 5 = 4.4 -> d = 3 / sqrt(4.4)
    assert row["effect_size"] == pytest.approx(3 / math.sqrt(4.4), abs=1e-12)
    assert row["seeds_needed"] == seeds_needed(3 / math.sqrt(4.4))


def test_verdicts_for_clear_and_unclear_gaps():
    table = pairwise({"grpo": [10.0, 11, 12], "rloo": [1.0, 2, 3], "ppo": [1.5, 0.5, 3.5],
                      "dapo": [0.0, 2, 3, 6], "one": [4.0]})
    verdicts = dict(zip(zip(table["a"], table["b"]), table["verdict"]))
    assert verdicts["grpo", "rloo"] == "grpo > rloo: the interval excludes 0"
    assert verdicts["rloo", "ppo"] == "no difference detectable with 3 seeds"
    assert verdicts["ppo", "dapo"] == "no difference detectable with 3 and 4 seeds"
    assert verdicts["grpo", "one"] == "not enough seeds: one has 1 (an interval needs >= 2 per arm)"
    # against a baseline the winner can be B
    by_baseline = pairwise({"rloo": [1.0, 2, 3], "grpo": [10.0, 11, 12]}, baseline="grpo")
    assert by_baseline[["a", "b", "verdict"]].values.tolist() == [["rloo", "grpo", "grpo > rloo: the interval excludes 0"]]
    assert by_baseline["p_improvement"].tolist() == [0.0]
    with pytest.raises(ValueError, match=r"baseline='ppo' is not allowed; choose one of the arms: rloo, grpo"):
        pairwise({"rloo": [1.0, 2], "grpo": [3.0, 4]}, baseline="ppo")


def test_pairwise_rows_of_identical_and_single_seed_arms():
    table = pairwise({"A": [1.0, 1, 1], "B": [1.0, 1, 1], "C": [0.0]})
    same = table.iloc[0]
    assert (same["diff"], same["diff_ci_low"], same["diff_ci_high"], same["p_improvement"]) == (0.0, 0.0, 0.0, 0.5)
    assert same["verdict"] == "no difference detectable with 3 seeds" and same["seeds_needed"] is pd.NA
    lonely = table.iloc[1]
    assert math.isnan(lonely["diff_ci_low"]) and lonely["seeds_needed"] is pd.NA and lonely["p_improvement"] == 1.0
    # converged arms with no spread that differ: the interval is the point -1 and 2 seeds suffice
    apart = pairwise({"A": [1.0, 1, 1], "B": [2.0, 2, 2]}).iloc[0]
    assert (apart["diff_ci_low"], apart["diff_ci_high"], apart["p_value"]) == (-1.0, -1.0, 0.0)
    assert apart["verdict"] == "B > A: the interval excludes 0" and apart["seeds_needed"] == 2


def test_pairwise_equals_scipy_pair_by_pair():
    """``pairwise`` stacks pairs of equal seed counts and runs each test once per stack; every row
    equals scipy run on that pair alone (to a few ulps: numpy sums a stacked row in another order),
    for arms of 1-6 seeds, with ties, and with no spread."""
    rng = np.random.default_rng(11)
    for _ in range(15):
        arms = {f"arm{i}": rng.normal(size=rng.integers(1, 7)).round(int(rng.integers(0, 3)))
                for i in range(rng.integers(2, 8))}
        arms["flat"] = np.full(3, 0.5)
        for baseline in (None, "flat"):
            for _, row in pairwise(arms, baseline=baseline).iterrows():
                a, b = arms[row["a"]], arms[row["b"]]
                assert row["p_improvement"] == stats.mannwhitneyu(a, b).statistic / (len(a) * len(b))
                if min(len(a), len(b)) < 2:
                    assert math.isnan(row["diff_ci_low"]) and math.isnan(row["effect_size"])
                    continue
                with warnings.catch_warnings():  # scipy warns on arms with no spread
                    warnings.simplefilter("ignore", RuntimeWarning)
                    test = stats.ttest_ind(a, b, equal_var=False)
                    ci = test.confidence_interval(0.95)
                got = row[["diff_ci_low", "diff_ci_high", "p_value", "effect_size"]].to_numpy(np.float64)
                assert got == pytest.approx([ci.low, ci.high, test.pvalue, pooled_effect_size(a, b)],
                                            rel=1e-13, abs=1e-15, nan_ok=True)


def test_seeds_needed_of_many_effect_sizes_at_once_equals_each_alone():
    """The verdict table asks for all its pairs in one vectorised search; each answer is the one the
    search gives that effect size alone, and the smallest n with enough power (checked here with
    t_test_power itself), for gaps from tiny to none and infinite."""
    ds = [0.0, math.inf, 1e-4, 0.0115, 0.05, 0.3, 0.5, 0.8, 1.0, 2.5, 10.0, 50.0, *np.linspace(0.07, 4.0, 23)]
    for alpha, power in [(0.05, 0.8), (0.01, 0.9)]:
        together = seeds_needed_each(ds, alpha, power)
        assert together == [seeds_needed_each([d], alpha, power)[0] for d in ds]
        for d, n in zip(ds, together):
            if n is not None and n > 2 and math.isfinite(d):
                assert t_test_power(d, n, alpha) >= power > t_test_power(d, n - 1, alpha)
        assert together[:3] == [None, 2, None]


@pytest.mark.parametrize("d, n", [(1.0, 17), (0.8, 26), (0.5, 64)])
def test_seeds_needed_matches_textbook_power_tables(d, n):
    """Cohen (1988) Table 2.4.1 / G*Power: two-sided alpha .05, power .8 -> n per group."""
    assert seeds_needed(d) == n
    assert t_test_power(d, n) >= 0.8 > t_test_power(d, n - 1)  # the smallest such n


def test_power_stays_finite_for_large_effects():
    # scipy's nct.cdf of the far lower tail is NaN at d = 10, n = 3; the power must still be 1
    power = t_test_power(10.0, np.arange(2, 50))
    assert np.isfinite(power).all() and (np.diff(power) >= 0).all() and power[1] == pytest.approx(1.0, abs=1e-9)
    assert seeds_needed(10.0) == 2 and seeds_needed(50.0) == 2


def test_seeds_needed_edges():
    assert seeds_needed(0.0) is None
    assert seeds_needed(math.inf) == 2
    assert seeds_needed(1e-4) is None  # more than MAX_SEEDS_SEARCHED
    assert seeds_needed(1.0, power=0.9) == 23  # Cohen's table: d = 1, power .9 -> 23
    assert pooled_effect_size(np.array([1.0, 1]), np.array([2.0, 2])) == math.inf
    with pytest.raises(ValueError, match=r"power=1 is not allowed; use a number strictly between 0 and 1"):
        seeds_needed(1.0, power=1)


# -- curves ---------------------------------------------------------------------------------------
def test_live_curves_of_unequal_length_aggregate_the_seeds_present_at_each_step():
    df = metrics_frame({("grpo", 0): [0.0, 1, 2, 3], ("grpo", 1): [2.0, 3, 4], ("grpo", 2): [1.0, 2],
                        ("rloo", 0): [5.0, 5]})
    curve = mean_curve_with_band(df, "reward")
    grpo = curve[curve["arm"] == "grpo"]
    assert grpo["x"].tolist() == [0, 1, 2, 3] and grpo["n_seeds"].tolist() == [3, 3, 2, 1]
    assert grpo["mean"].tolist() == [1.0, 2.0, 3.0, 3.0]
    # step 0: values 0, 2, 1 -> s = 1, band 1 -+ t_{.975,2} / sqrt(3); step 2: 2, 4 -> s = sqrt 2, +- t_{.975,1}
    assert grpo["ci_low"].iloc[0] == pytest.approx(1 - T_975_DF2 / math.sqrt(3), abs=1e-12)
    assert grpo["ci_high"].iloc[2] == pytest.approx(3 + T_975_DF1 * math.sqrt(2) / math.sqrt(2), abs=1e-12)
    assert math.isnan(grpo["ci_low"].iloc[3]) and math.isnan(grpo["ci_high"].iloc[3])  # one seed: no band
    rloo = curve[curve["arm"] == "rloo"]
    assert rloo["n_seeds"].tolist() == [1, 1] and rloo["ci_low"].isna().all()
    assert aggregation_caption(curve) == ("grpo: 3 seeds to step 1, then 2 to step 2, then 1 to step 3 · "
                                          "rloo: 1 seed · band: 95% t-interval over seeds where >= 2")


def test_wall_time_curves_are_interpolated_onto_one_grid_inside_each_seeds_range():
    df = pd.DataFrame({"run_id": ["a0"] * 3 + ["a1"] * 4, "arm": "a", "step": [0, 1, 2, 0, 1, 2, 3],
                       "wall time": [0.0, 2, 4, 0, 1, 2, 3], "reward": [0.0, 2, 4, 1, 1, 1, 1]})
    curve = mean_curve_with_band(df, "reward", "wall time", grid_points=5)  # grid 0, 1, 2, 3, 4
    assert curve["x"].tolist() == [0.0, 1.0, 2.0, 3.0, 4.0]
    assert curve["mean"].tolist() == [0.5, 1.0, 1.5, 2.0, 4.0]  # a0 interpolates 1 and 3; a1 stops at 3
    assert curve["n_seeds"].tolist() == [2, 2, 2, 2, 1]
    assert aggregation_caption(curve, "wall time") == "a: 2 seeds to 3 s, then 1 to 4 s · band: 95% t-interval over seeds where >= 2"
    # default grid: as many points as the longest seed (4)
    assert mean_curve_with_band(df, "reward", "wall time")["x"].tolist() == pytest.approx([0, 4 / 3, 8 / 3, 4])


def test_curves_smooth_each_seed_before_averaging():
    from workbench.viz.curves import ema

    df = metrics_frame({("a", 0): [0.0, 2.0], ("a", 1): [2.0, 2.0]})
    curve = mean_curve_with_band(df, "reward", smoothing=functools.partial(ema, weight=0.5))
    # seed 0: ema = 0, then (0.5 * 0 + 0.5 * 2) / 0.75 = 4/3; seed 1 stays 2
    assert curve["mean"].tolist() == pytest.approx([1.0, (4 / 3 + 2) / 2], abs=1e-12)


def test_curves_of_an_empty_frame_and_bad_grid():
    df = metrics_frame({("a", 0): [math.nan, math.nan]})
    assert mean_curve_with_band(df, "reward").empty
    with pytest.raises(ValueError, match=r"grid_points=1 is not allowed; use an integer >= 2"):
        mean_curve_with_band(df, "reward", grid_points=1)


# -- sweeps ---------------------------------------------------------------------------------------
def test_sweep_table_by_hand():
    scores = {"eps_high=0.28 · token-mean": [3.0, 5.0], "eps_high=0.2 · token-mean": [1.0, 3.0],
              "eps_high=0.28 · seq-mean": [4.0, 4.0], "eps_high=0.2 · seq-mean": [0.0, 2.0]}
    values = {arm: {"eps_high": float(arm.split("=")[1].split(" ")[0]), "aggregation": arm.split(" · ")[1]}
              for arm in scores}
    table = sweep_table(scores, values)
    eps = table[table["field"] == "eps_high"]
    assert eps[["value", "others", "arms", "n", "mean"]].values.tolist() == [
        [0.2, "aggregation=token-mean", 1, 2, 2.0], [0.2, "aggregation=seq-mean", 1, 2, 1.0], [0.2, "all", 2, 4, 1.5],
        [0.28, "aggregation=token-mean", 1, 2, 4.0], [0.28, "aggregation=seq-mean", 1, 2, 4.0], [0.28, "all", 2, 4, 4.0]]
    # pooled 0.28: 3, 5, 4, 4 -> s^2 = 2/3; interval 4 -+ t_{.975,3} sqrt(2/3) / 2
    pooled = eps[(eps["value"] == 0.28) & (eps["others"] == "all")].iloc[0]
    assert pooled["ci_high"] == pytest.approx(4 + stats.t.ppf(0.975, 3) * math.sqrt(2 / 3) / 2, abs=1e-12)
    agg = table[table["field"] == "aggregation"]
    assert agg["value"].tolist()[:3] == ["token-mean"] * 3  # strings keep their order of appearance
    single = sweep_table({"lr=1": [1.0, 2.0], "lr=0.5": [0.0, 1.0]}, {"lr=1": {"lr": 1}, "lr=0.5": {"lr": 0.5}})
    assert single[["value", "others", "mean"]].values.tolist() == [[0.5, "", 0.5], [1, "", 1.5]]


def test_sweep_table_refuses_arms_without_values():
    with pytest.raises(ValueError, match=r"arm_values lacks arm\(s\) \['b'\]"):
        sweep_table({"a": [1.0], "b": [2.0]}, {"a": {"lr": 1}})
    with pytest.raises(ValueError, match=r"arm 'b' sets fields \['lr'\]; every arm must set \['lr', 'mu'\]"):
        sweep_table({"a": [1.0], "b": [2.0]}, {"a": {"lr": 1, "mu": 2}, "b": {"lr": 1}})


def test_the_analysis_layer_imports_neither_torch_nor_streamlit():
    code = ("import sys, workbench.analysis.stats, workbench.analysis.bands; "  # the package itself imports them lazily
            "print(sorted(m for m in ('torch', 'streamlit', 'plotly') if m in sys.modules))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "[]"


def _final_window_scores_by_groups(df: pd.DataFrame, metric: str, window_frac: float) -> pd.DataFrame:
    """The earlier implementation of ``final_window_scores`` (a pandas group per run), kept here as
    the reference the array version must equal exactly."""
    from workbench.analysis.stats import finite, in_arm_order

    columns = ["run_id", "arm", "seed", "score", "window_steps", "first_step", "last_step"]
    logged = df.loc[finite(df[metric]), ["run_id", "arm", "seed", "step", metric]]
    rows = []
    for run_id, run in logged.sort_values("step", kind="stable").groupby("run_id", sort=False):
        window = run.tail(window_length(len(run), float(window_frac)))
        rows.append({"run_id": run_id, "arm": str(run["arm"].iloc[0]), "seed": run["seed"].iloc[0],
                     "score": float(window[metric].astype(float).mean()), "window_steps": len(window),
                     "first_step": int(window["step"].iloc[0]), "last_step": int(window["step"].iloc[-1])})
    return in_arm_order(pd.DataFrame(rows, columns=columns), list(dict.fromkeys(df["arm"].astype(str))), "seed")


@pytest.mark.parametrize("window_frac", [0.01, 0.07, 0.1, 0.5, 1.0])
def test_final_window_scores_equal_the_per_group_computation_exactly(window_frac):
    """Seeded data shaped as a live comparison: 4 arms x 3 seeds of unequal lengths, rows shuffled
    (runs interleaved, steps out of order), gaps where the metric was not logged (NaN, None), a
    run that never logged it: every score, window and bound equals the earlier per-run pandas
    computation bit for bit."""
    rng = np.random.default_rng(19)
    rows = []
    for a in range(4):
        for seed in range(3):
            for step in range(int(rng.integers(5, 400))):
                value = float(rng.normal(a, 1.0)) if rng.random() > 0.1 else (np.nan if rng.random() > 0.5 else None)
                rows.append({"run_id": f"arm{a}-s{seed}", "arm": f"arm{a}", "seed": seed, "step": step, "reward": value})
    rows += [{"run_id": "quiet", "arm": "arm1", "seed": 9, "step": s, "reward": None} for s in range(5)]
    frame = pd.DataFrame(rows).sample(frac=1.0, random_state=3).reset_index(drop=True)
    pd.testing.assert_frame_equal(final_window_scores(frame, "reward", window_frac),
                                  _final_window_scores_by_groups(frame, "reward", window_frac), check_exact=True)
