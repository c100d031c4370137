"""Readable, honest arm charts: metadata for every metric of the panel registry, axis titles with
units, one colour per arm on every chart, secondary series off by default, the y-axis following
the means when a few-seed band would swamp them, and curves thinned without changing a kept point."""

import json
import math

import numpy as np
import pandas as pd
import pytest
from hypothesis import given, settings
from hypothesis import strategies as hst

from tests.ui.figspec import traces
from workbench.analysis import mean_curve_with_band
from workbench.analysis.bands import Curve
from workbench.viz.arms import MAX_POINTS, _kept_rows, arm_colours, arm_figure, arm_figures, keep_extremes
from workbench.viz.curves import MARGIN, PANELS, UNKNOWN, legend_html, metric_figure

EVERY_METRIC = sorted({m for p in PANELS.values() for m in p.metrics})


def test_every_metric_of_the_registry_has_its_metadata():
    for key, panel in PANELS.items():
        assert set(panel.kinds) <= set(panel.metrics), f"{key}: metadata for metrics it does not draw"
        assert panel.primary(), f"{key}: every series is secondary, the chart would be empty by default"
        for metric in panel.metrics:
            meta = panel.meta(metric)
            assert meta is not UNKNOWN and meta.axis and meta.axis != UNKNOWN.axis, f"{metric}: no unit / axis title"
            assert meta.low < meta.high, f"{metric}: empty range"
            assert meta.better in ("higher", "lower", None)
            assert (f"{metric}: {meta.better} is better" in panel.describe()) == (meta.better is not None)
        assert len({panel.meta(m).axis for m in panel.metrics}) == 1, f"{key}: one y-axis, one unit"


def every_metric_frame(arms=("grpo", "rloo", "dapo"), seeds=2, steps=5) -> pd.DataFrame:
    """Every metric of the registry logged by every run, inside its range (a fraction at 0.3 +
    0.1 seed, an open metric at 2 + seed), so every panel draws."""
    rows = []
    for a, arm in enumerate(arms):
        for seed in range(seeds):
            for step in range(steps):
                row = {"run_id": f"{arm}-{seed}", "arm": arm, "seed": seed, "step": step, "time": 100.0 * seed + step}
                for panel in PANELS.values():
                    for m in panel.metrics:
                        low, high = panel.meta(m).bounds
                        value = 0.3 + 0.1 * seed + 0.01 * step + 0.02 * a
                        row[m] = min(max(value, low), high) if high - low <= 1 else (high - 2 - seed if high < math.inf else 2 + seed + step + a)
                rows.append(row)
    return pd.DataFrame(rows)


def spec(fig) -> dict:
    return json.loads(fig.to_json())


def test_every_chart_has_axis_titles_with_units_and_no_legend_of_its_own():
    import plotly.graph_objects as go

    charts = arm_figures(every_metric_frame(), list(PANELS), show_seeds=True, secondary=True)
    for key, chart in charts.items():
        go.Figure(chart.figure.to_dict())  # the figure is built unvalidated (speed): it must pass plotly's validation
        layout = spec(chart.figure)["layout"]
        assert layout["yaxis"]["title"]["text"] == PANELS[key].meta(PANELS[key].metrics[0]).axis
        assert layout["xaxis"]["title"]["text"] == "step"
        assert layout["showlegend"] is False  # the page draws one legend
    for key in PANELS:
        go.Figure(metric_figure(every_metric_frame(), key, smoothing=0.5, secondary=True).to_dict())  # valid
        layout = spec(metric_figure(every_metric_frame(), key))["layout"]
        assert layout["yaxis"]["title"]["text"] and layout["legend"]["x"] > 1  # a chart's own legend: right of the plot


def test_each_arm_has_one_colour_on_every_chart():
    frame = every_metric_frame()
    colours = arm_colours(frame)
    assert list(colours) == ["dapo", "grpo", "rloo"] and len(set(colours.values())) == 3  # run order
    seen = {}
    for chart in arm_figures(frame, list(PANELS), secondary=True).values():
        for t in traces(spec(chart.figure)):
            arm = t["name"].split(" ")[0]
            seen.setdefault(arm, set()).add(t["line"]["color"] if t.get("fill") != "toself" else t["fillcolor"])
    for arm, hue in colours.items():
        r, g, b = (int(hue[i:i + 2], 16) for i in (1, 3, 5))
        assert seen[arm] == {hue, f"rgba({r},{g},{b},0.2)"}
    html = legend_html(colours)
    assert all(f"background:{hue}" in html and f">{arm}</span>" in html for arm, hue in colours.items())
    assert "&lt;b&gt;" in legend_html({"<b>": "#000000"})  # names are escaped


SECONDARY = {key: [m for m in p.metrics if p.meta(m).secondary] for key, p in PANELS.items()}


@pytest.mark.parametrize("key", [k for k, v in SECONDARY.items() if v])
def test_secondary_series_are_hidden_until_asked_for(key):
    frame = every_metric_frame()
    short = [m.split("/", 1)[-1] for m in SECONDARY[key]]
    hidden = [t["name"] for t in traces(spec(arm_figure(frame, key).figure))]
    shown = [t["name"] for t in traces(spec(arm_figure(frame, key, secondary=True).figure))]
    assert not any(name.endswith(f"· {s}") for name in hidden for s in short), hidden
    assert all(any(name.endswith(f"· {s}") for name in shown) for s in short), shown
    styles = arm_figure(frame, key, secondary=True).styles
    assert styles.startswith("solid: ") and all(m in styles for m in SECONDARY[key])
    hidden_names = [t["name"] for t in traces(spec(metric_figure(frame, key)))]
    assert not any(name.endswith(f"· {s}") for name in hidden_names for s in short)


def two_seeds(metric: str, a: list[float], b: list[float]) -> pd.DataFrame:
    return pd.DataFrame([{"run_id": f"x{s}", "arm": "x", "seed": s, "step": i, "time": float(i), metric: v}
                         for s, values in enumerate((a, b)) for i, v in enumerate(values)])


def test_a_two_seed_band_does_not_squash_the_means_and_stays_in_range():
    # seeds 0.1 apart, means rising by 0.01 per step: the t-band (12.7 x 0.05 each side) is ~30x
    # the means' span of 0.04, so the axis follows the means
    frame = two_seeds("frac_reward_zero_std", [0.2, 0.21, 0.22, 0.23, 0.24], [0.3, 0.31, 0.32, 0.33, 0.34])
    layout = spec(arm_figure(frame, "frac_reward_zero_std").figure)["layout"]
    lo, hi, pad = 0.25, 0.29, MARGIN * 0.04
    assert layout["yaxis"]["range"] == pytest.approx([lo - pad, hi + pad]) and layout["yaxis"]["autorange"] is False
    band = [t for t in traces(spec(arm_figure(frame, "frac_reward_zero_std").figure)) if t.get("fill") == "toself"][0]
    assert min(band["y"]) == 0.0 and max(band["y"]) == pytest.approx(0.29 + 12.706204736174707 * 0.05)
    # a narrow band: the range holds it whole (means 0.005 to 2.005, band half-width 12.7 x 0.005)
    close = two_seeds("reward", [0.0, 1.0, 2.0], [0.01, 1.01, 2.01])
    half = 12.706204736174707 * 0.005
    span = 2.0 + 2 * half
    assert spec(arm_figure(close, "reward").figure)["layout"]["yaxis"]["range"] == pytest.approx(
        [0.005 - half - MARGIN * span, 2.005 + half + MARGIN * span])
    # a flat line of a non-negative metric: around its value, not from -0.5 (plotly's autorange)
    flat = two_seeds("reward_std", [0.3, 0.3], [0.3, 0.3])
    assert spec(arm_figure(flat, "reward_std").figure)["layout"]["yaxis"]["range"] == pytest.approx([0.27, 0.33])
    assert spec(metric_figure(flat, "reward_std"))["layout"]["yaxis"]["range"] == pytest.approx([0.27, 0.33])
    # smoothed, the EMA of the constant is off by ~1e-17 at some steps: still the flat line's range
    flat = two_seeds("reward_std", [0.3] * 20, [0.3] * 20)
    assert spec(arm_figure(flat, "reward_std", smoothing=0.6).figure)["layout"]["yaxis"]["range"] == pytest.approx(
        [0.27, 0.33])
    assert spec(metric_figure(flat, "reward_std", smoothing=0.6))["layout"]["yaxis"]["range"] == pytest.approx([0.27, 0.33])
    # means at a bound: the margin never goes further past the range than itself
    zeros = two_seeds("frac_reward_zero_std", [0.0, 0.0, 0.0], [0.0, 0.0, 0.2])
    assert spec(arm_figure(zeros, "frac_reward_zero_std").figure)["layout"]["yaxis"]["range"][0] >= -MARGIN * 0.1 - 1e-12


def test_thinning_keeps_each_buckets_extremes_exactly():
    """A hand-made curve of 1,000 points thinned to 400 (buckets of 10): each bucket's lowest and
    highest mean and band edge, NaN (no band) never chosen, ties to the bucket's first point, and
    the curve's ends. A spike of the mean (503), a dip (778) and a spike of the band's top alone
    (256) are kept; every k-th point would have dropped all three."""
    n = 1000
    mean = np.zeros(n)
    mean[503], mean[778] = 5.0, -3.0
    low, high = mean - 1, mean + 1
    high[256] = 9.0
    low[:15] = high[:15] = np.nan  # fewer than 2 seeds there: no band
    kept = keep_extremes(mean, low, high, max_points=400)
    assert kept.tolist() == sorted({*range(0, n, 10), 15, 256, 503, 778, n - 1})
    assert len(kept) <= 400 + 2 and not {256, 503, 778} & set(range(0, n, 3))
    assert keep_extremes(mean[:400], low[:400], high[:400], max_points=400).tolist() == list(range(400))
    assert keep_extremes(np.empty(0), np.empty(0), np.empty(0)).tolist() == []


def _bucket_extremes_by_loop(mean, low, high, max_points):
    """``keep_extremes`` written out: per bucket of k points the first index of its lowest and
    highest mean, lowest low and highest high, NaN skipped (an all-NaN bucket: its first point)."""
    n = len(mean)
    if n <= max_points:
        return list(range(n))
    k = -(-n // (max_points // 4))
    kept = {0, n - 1}
    for start in range(0, n, k):
        for values, lowest in ((mean, True), (mean, False), (low, True), (high, False)):
            bucket = [(v if lowest else -v, i) for i, v in enumerate(values[start:start + k]) if not math.isnan(v)]
            kept.add(start + (min(bucket, key=lambda vi: vi[0])[1] if bucket else 0))  # min: first of ties
    return sorted(kept)


@settings(max_examples=80, deadline=None)
@given(hst.integers(1, 60), hst.integers(4, 24), hst.data())
def test_thinning_keeps_what_a_loop_over_buckets_keeps(n, max_points, data):
    """The vectorised thinning (bucket extremes by reshaping, NaN and padding as the worst value)
    keeps the indices a plain loop over buckets keeps: ties (+0.0 and -0.0 among them) to the
    first point, NaN skipped. (Finite values and NaN only: the curves' statistics are of finite
    points.)"""
    value = hst.sampled_from([0.0, -0.0, 1.0, -1.0, 2.5, 1e300, -1e-300, math.nan])
    mean, low, high = (np.array(data.draw(hst.lists(value, min_size=n, max_size=n))) for _ in range(3))
    assert keep_extremes(mean, low, high, max_points).tolist() == _bucket_extremes_by_loop(mean, low, high, max_points)


@pytest.mark.parametrize("lengths", [(1000, 1000, 1000), (1000, 1001, 999), (7, 7), (401, 401, 401, 401)])
def test_arms_thinned_together_keep_what_each_arm_thinned_alone_keeps(lengths):
    """Arms of one length are thinned in one call (``_kept_rows``): the rows kept are those that
    ``keep_extremes`` keeps of each arm alone, NaN (no band) and spikes included; arms of
    different lengths take the per-arm path."""
    rng = np.random.default_rng(len(lengths) * 1000 + lengths[1])
    n = sum(lengths)
    mean, low, high = rng.normal(size=(3, n))
    low[rng.random(n) < 0.2] = np.nan
    high[rng.random(n) < 0.2] = np.nan
    arm = np.repeat(np.arange(len(lengths)), lengths)
    curve = Curve(arm, np.arange(n, dtype=np.float64), mean, np.zeros(n), low, high, np.full(n, 3), [f"a{i}" for i in range(len(lengths))])
    slices = curve.arm_slices()
    expected = [rows.start + keep_extremes(mean[rows], low[rows], high[rows]) for _, rows in slices]
    kept = _kept_rows(curve, slices)
    assert [k.tolist() for k in kept] == [e.tolist() for e in expected]
    assert all(len(k) <= MAX_POINTS + 2 for k in kept)


def test_thinned_arm_curves_keep_a_one_step_spike_with_unchanged_statistics():
    """1,001 steps x 3 seeds with a reward collapse at step 502 only: the drawn mean curve has at
    most MAX_POINTS + 2 points, the collapse among them at its full depth, and every kept point
    is the full curve's row unchanged (thinning picks rows, it never averages them)."""
    steps = 1001
    rng = np.random.default_rng(0)
    rewards = rng.normal(size=(3, steps))
    rewards[:, 502] = -20.0
    frame = pd.DataFrame([{"run_id": f"a{s}", "arm": "a", "seed": s, "step": i, "time": float(i), "reward": v}
                          for s in range(3) for i, v in enumerate(rewards[s])])
    full = mean_curve_with_band(frame, "reward").set_index("x")
    mean = [t for t in traces(spec(arm_figure(frame, "reward").figure)) if t.get("fill") != "toself"][0]
    assert len(mean["x"]) <= MAX_POINTS + 2 and mean["x"][0] == 0 and mean["x"][-1] == steps - 1
    assert mean["x"] == sorted(mean["x"]) and 502 in mean["x"]
    assert min(mean["y"]) == pytest.approx(-20.0, abs=1e-11)
    assert mean["y"] == pytest.approx(full["mean"].loc[mean["x"]].tolist(), abs=1e-11)


def test_a_k1_kl_below_zero_is_drawn_whole_and_a_clipped_band_says_so():
    """k1's step mean can be < 0 (the ppo, rloo and reinforce_pp presets use k1): no axis or band
    may hide it. A metric with a finite range says in its caption that its band is clipped."""
    kl = [0.002, -0.01, -0.03, -0.05, -0.04]
    df = pd.DataFrame({"run_id": "r", "arm": "ppo", "step": range(5), "time": 0.0, "kl": kl})
    lo, hi = metric_figure(df, "kl").layout.yaxis.range or (None, None)
    assert lo is None or (lo <= min(kl) and hi >= max(kl))
    negative = df.assign(kl=[-0.02, -0.05, -0.08, -0.06, -0.07])
    lo, hi = metric_figure(negative, "kl").layout.yaxis.range or (None, None)
    assert lo is None or (lo < -0.08 and hi > -0.02 and lo < hi)
    seeds = pd.DataFrame([{"run_id": f"s{i}", "arm": "ppo", "seed": i, "step": t, "time": 0.0, "kl": v}
                          for i, v in enumerate((-0.3, 0.2, 0.4)) for t in range(3)])
    chart = arm_figure(seeds, "kl", band="minmax")
    band = next(t for t in chart.figure.data if t.fill)
    assert min(y for y in band.y if y is not None) == pytest.approx(-0.3)  # the lowest seed, not 0
    assert chart.note == ""
    assert arm_figure(seeds.rename(columns={"kl": "frac_reward_zero_std"}).assign(frac_reward_zero_std=0.5),
                      "frac_reward_zero_std").note == "band clipped to the metric's range [0, 1]"
