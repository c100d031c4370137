"""Figures and tables over arms x seeds (pure functions of the long frame of RunStore.arm_metrics)."""

import json
import math

import numpy as np
import pandas as pd
import pytest

from tests.ui.figspec import traces
from workbench.analysis import sweep_table
from workbench.viz.arms import arm_figure, band_polygon, fill_colour, sweep_figures
from workbench.viz.tables import verdict

T2 = 4.302652729749464  # t_{0.975, 2}


def long_frame() -> pd.DataFrame:
    """Arms a (offset 0) and b (offset 1), seeds 0-2, 3 steps; value = offset + step + 0.1 seed."""
    rows = [{"run_id": f"{arm}{seed}", "arm": arm, "seed": seed, "step": step, "time": 10.0 * seed + step,
             "reward": off + step + 0.1 * seed, "clip_ratio/low_mean": 0.0, "clip_ratio/high_mean": 0.5 * seed}
            for arm, off in (("a", 0.0), ("b", 1.0)) for seed in range(3) for step in range(3)]
    return pd.DataFrame(rows)


def spec(fig):
    out = json.loads(fig.to_json())
    return {t["name"]: t for t in traces(out)}


def test_band_polygon_goes_along_the_top_and_back_along_the_bottom():
    x, y = band_polygon(np.array([0.0, 1.0, 2.0]), np.array([0.0, 1.0, 2.0]), np.array([1.0, 2.0, 3.0]))
    assert x.tolist() == [0, 1, 2, 2, 1, 0] and y.tolist() == [1, 2, 3, 2, 1, 0]


def test_band_polygon_splits_where_the_band_is_undefined():
    nan = np.nan
    x, y = band_polygon(np.arange(5.0), np.array([0, nan, 1, 2, 3.0]), np.array([1, nan, 2, 3, 4.0]))
    assert x[:2].tolist() == [0, 0] and math.isnan(x[2]) and x[3:].tolist() == [2, 3, 4, 4, 3, 2]
    assert y[:2].tolist() == [1, 0] and y[3:].tolist() == [2, 3, 4, 3, 2, 1]
    assert band_polygon(np.arange(2.0), np.full(2, nan), np.full(2, nan))[0].size == 0  # one seed: no band


def test_fill_colour_is_the_line_colour_with_alpha():
    assert fill_colour("#636efa") == "rgba(99,110,250,0.2)"


def test_arm_figure_draws_the_mean_and_its_t_band_per_arm():
    chart = arm_figure(long_frame(), "reward")
    fig = spec(chart.figure)
    assert list(fig) == ["a (95% CI)", "a", "b (95% CI)", "b"]
    assert fig["a"]["y"] == pytest.approx([0.1, 1.1, 2.1])  # mean over seeds of step + 0.1 seed
    half = T2 * 0.1 / math.sqrt(3)  # s = 0.1 over the three seeds
    assert fig["b (95% CI)"]["y"] == pytest.approx([1.1 + half, 2.1 + half, 3.1 + half, 3.1 - half, 2.1 - half, 1.1 - half])
    assert chart.caption == "a: 3 seeds · b: 3 seeds · band: 95% t-interval over seeds where >= 2"


def test_a_panel_of_several_metrics_names_each_and_seeds_are_faint():
    fig = spec(arm_figure(long_frame(), "clip", show_seeds=True).figure)
    assert [n for n in fig if n.startswith("a")] == [
        "a · low_mean · seed 0", "a · low_mean · seed 1", "a · low_mean · seed 2", "a · low_mean (95% CI)", "a · low_mean",
        "a · high_mean · seed 0", "a · high_mean · seed 1", "a · high_mean · seed 2", "a · high_mean (95% CI)",
        "a · high_mean"]
    assert fig["a · high_mean · seed 2"]["y"] == [1.0, 1.0, 1.0] and fig["a · high_mean · seed 2"]["opacity"] == 0.3
    assert fig["a · high_mean"]["line"]["dash"] == "dash"
    assert set(fig["a · low_mean (95% CI)"]["y"]) == {0.0}  # seeds that agree: a band of zero width


def test_verdict_shapes_the_statistics_for_display():
    result = verdict(long_frame(), "reward", window_frac=0.34)  # ceil(0.34 x 3) = 2 steps: 1 and 2
    assert result.arms["arm"].tolist() == ["a", "b"] and result.arms["seeds"].tolist() == [3, 3]
    assert result.arms["mean"].tolist() == pytest.approx([1.6, 2.6])
    assert result.arms["95% CI"].tolist()[0] == f"[{1.6 - T2 * 0.1 / math.sqrt(3):.3g}, {1.6 + T2 * 0.1 / math.sqrt(3):.3g}]"
    assert result.arms["IQM 95% CI"].tolist() == ["—", "—"]  # the IQM's bootstrap needs >= 5 seeds
    [pair] = result.pairs.to_dict("records")
    assert pair["A − B"] == pytest.approx(-1.0) and pair["P(A > B)"] == 0.0
    assert pair["verdict"] == "b > a: the interval excludes 0"
    assert result.window == "last 34% of each run's logged steps: 2 steps (steps 1-2)"
    # a window under 0.5% read "last 0%" (a whole percent); it says its share as given
    assert verdict(long_frame(), "reward", window_frac=0.004).window.startswith("last 0.4% of each run's logged steps: 1 step")
    with pytest.raises(ValueError, match="metric='kl': no run of this selection logged it yet"):
        verdict(long_frame().assign(kl=np.nan), "kl")


def test_sweep_figure_has_error_bars_per_value():
    scores = {"lr=0.1": [1.0, 1.2], "lr=0.2": [2.0, 2.0]}
    table = sweep_table(scores, {"lr=0.1": {"optim.lr": 0.1}, "lr=0.2": {"optim.lr": 0.2}})
    [trace] = traces(json.loads(sweep_figures(table, "reward")["optim.lr"].to_json()))
    assert trace["x"] == [0.1, 0.2] and trace["y"] == pytest.approx([1.1, 2.0])
    from tests.ui.figspec import decode

    assert decode(trace["error_y"]["array"]) == pytest.approx([12.706204736174698 * 0.1 / 1.0, 0.0])
