"""Figure and table builders of the Compare page (pure functions of the store's DataFrames)."""

import json

import numpy as np
import pandas as pd
import pytest

from tests.ui.figspec import traces
from workbench.viz.curves import (PANELS, available_panels, compare_figures, ema, final_metrics_table, has_values, metric_figure,
                                  progress, step_label)


def frame() -> pd.DataFrame:
    """Two runs, three steps each, as RunStore.metrics returns them (sorted by run_id, step)."""
    return pd.DataFrame({
        "run_id": ["a", "a", "a", "b", "b", "b"],
        "step": [0, 1, 2, 0, 1, 2],
        "time": [100.0, 102.0, 105.0, 200.0, 201.0, 203.0],
        "reward": [1.0, 0.0, 0.0, 0.5, 0.5, 1.0],
        "clip_ratio/low_mean": [0.0, 0.1, 0.2, 0.0, 0.0, 0.0],
        "clip_ratio/high_mean": [0.0, 0.05, 0.1, 0.0, 0.0, 0.0],
        "clip_ratio/region_mean": [0.0, 0.15, 0.3, 0.0, 0.0, 0.0],
        "completions/mean_length": [4.0, 5.0, 6.0, 3.0, 3.0, 3.0],
        "completions/count": [8.0, 8.0, 8.0, 8.0, 8.0, 8.0],
        "perf/step_time": [2.0, 3.0, 4.0, 1.0, 1.0, 1.0],
        "loss/policy": [0.1, 0.2, np.nan, 0.3, 0.2, 0.1],
    })


def spec(fig):
    """The figure as Streamlit ships it to the browser, x / y decoded to lists."""
    out = json.loads(fig.to_json())
    out["data"] = traces(out)
    return out


def test_ema_is_the_debiased_weighted_mean():
    # w = 0.5: s1 = 1; s2 = (0.5*1 + 0)/(1.5) = 1/3; s3 = (0.25*1)/(1.75) = 1/7
    assert ema([1.0, 0.0, 0.0], 0.5) == pytest.approx([1.0, 1 / 3, 1 / 7])
    assert ema([2.0, 4.0], 0.0).tolist() == [2.0, 4.0]


def test_ema_skips_missing_values():
    out = ema([1.0, np.nan, 0.0], 0.5)
    assert out[0] == 1.0 and np.isnan(out[1]) and out[2] == pytest.approx(1 / 3)


def test_ema_rejects_weight_out_of_range():
    with pytest.raises(ValueError, match=r"smoothing=1\.0 is not allowed; an EMA weight from 0 \(off\) to 0\.99"):
        ema([1.0], 1.0)
    with pytest.raises(ValueError, match=r"smoothing=-0\.5 is not allowed"):
        metric_figure(frame(), "reward", smoothing=-0.5)  # a negative weight is refused, not drawn raw


def test_one_metric_panel_has_one_trace_per_run():
    fig = spec(metric_figure(frame(), "reward", labels={"a": "grpo", "b": "rloo"}))
    assert [t["name"] for t in fig["data"]] == ["grpo", "rloo"]
    assert fig["data"][0]["x"] == [0.0, 1.0, 2.0] and fig["data"][0]["y"] == [1.0, 0.0, 0.0]
    assert fig["data"][1]["y"] == [0.5, 0.5, 1.0]
    assert fig["layout"]["title"]["text"] == "Reward (batch mean)"
    assert fig["data"][0]["line"]["color"] != fig["data"][1]["line"]["color"]


def test_clip_panel_has_low_high_region_per_run():
    """The either-side region is the clip panel's main series; low / high are secondary, drawn
    on request (the page's "Secondary series" toggle)."""
    assert [t["name"] for t in spec(metric_figure(frame(), "clip"))["data"]] == ["a", "b"]
    fig = spec(metric_figure(frame(), "clip", secondary=True))
    names = [t["name"] for t in fig["data"]]
    assert names == ["a · low_mean", "a · high_mean", "a · region_mean", "b · low_mean", "b · high_mean", "b · region_mean"]
    assert fig["data"][2]["y"] == [0.0, 0.15, 0.3]
    assert [t["line"]["dash"] for t in fig["data"][:3]] == ["solid", "dash", "dot"]


def test_smoothing_draws_ema_over_faint_raw():
    fig = spec(metric_figure(frame(), "reward", smoothing=0.5))
    assert [t["name"] for t in fig["data"]] == ["a (raw)", "a", "b (raw)", "b"]
    assert fig["data"][0]["y"] == [1.0, 0.0, 0.0] and fig["data"][0]["showlegend"] is False
    assert fig["data"][1]["y"] == pytest.approx([1.0, 1 / 3, 1 / 7])


def test_x_axis_tokens_and_wall_time():
    tokens = spec(metric_figure(frame(), "reward", x="tokens"))
    assert tokens["data"][0]["x"] == [32.0, 72.0, 120.0]  # cumsum of 4*8, 5*8, 6*8
    assert tokens["layout"]["xaxis"]["title"]["text"] == "completion tokens (cumulative)"
    wall = spec(metric_figure(frame(), "reward", x="wall time"))
    assert wall["data"][0]["x"] == [0.0, 2.0, 5.0] and wall["data"][1]["x"] == [0.0, 1.0, 3.0]
    logged = frame().assign(**{"perf/tokens": [10.0, 20.0, 30.0, 1.0, 2.0, 3.0]})
    assert spec(metric_figure(logged, "reward", x="tokens"))["data"][1]["x"] == [1.0, 2.0, 3.0]


def test_bad_x_axis_names_the_field():
    with pytest.raises(ValueError, match=r"x='epoch' is not allowed; choose one of: step, tokens, wall time"):
        metric_figure(frame(), "reward", x="epoch")


def test_panels_without_data_are_left_out():
    keys = available_panels(frame())
    assert keys == ["reward", "clip", "length", "loss", "step_time"]  # PANELS order
    assert list(compare_figures(frame())) == [k for k in PANELS if k in keys]
    assert spec(metric_figure(frame(), "kl"))["data"] == []


def test_trls_sampling_metrics_and_dynamic_sampling_have_panels():
    logged = frame().assign(**{"sampling/sampling_logp_difference/max": [1e-6] * 6,
                               "sampling/importance_sampling_ratio/mean": [1.0] * 6, "dynamic_sampling/rounds": [1.0, 2.0, 1.0] * 2})
    assert {"sampling_mismatch", "importance_ratio", "dynamic_sampling"} <= set(available_panels(logged))


def test_final_metrics_table_values():
    table = final_metrics_table(frame(), labels={"a": "grpo"}, last_k=2)
    assert table["run"].tolist() == ["grpo", "b"]
    assert table["steps"].tolist() == [3, 3]
    assert table["reward (best)"].tolist() == [1.0, 1.0]
    assert table["reward (last 2)"].tolist() == [0.0, 0.75]
    assert table["loss/policy (last 2)"].tolist() == pytest.approx([0.2, 0.15])  # NaN skipped in the mean
    assert table["step time (s)"].tolist() == [3.0, 1.0]


def test_progress_fraction():
    assert progress(-1, 30) == 0.0 and progress(14, 30) == 0.5 and progress(29, 30) == 1.0 and progress(3, 0) == 0.0


def test_step_label_counts_steps_done():
    assert (step_label(-1, 30), step_label(14, 30), step_label(29, 30)) == ("0/30", "15/30", "30/30")


def test_legend_sits_right_of_the_plot_area_away_from_the_title():
    """A legend above the plot wrapped into rows over the chart's title once it held many runs; a
    legend below covered the x-axis title. A chart's own legend now starts right of the plot area
    (paper x > 1: plotly widens the right margin for it), and the Compare page turns chart legends
    off for one page legend."""
    for key in ("reward", "clip"):
        layout = spec(metric_figure(frame(), key, labels={"a": "grpo", "b": "rloo"}))["layout"]
        legend = layout["legend"]
        assert legend["orientation"] == "v" and legend["xanchor"] == "left" and legend["x"] > 1.0
        assert layout["xaxis"]["title"]["text"] == "step"
        assert layout["title"]["yref"] == "container" and layout["title"]["yanchor"] == "top"
    layout = spec(metric_figure(frame(), "reward", legend=False))
    assert layout["layout"]["showlegend"] is False and not any(t["showlegend"] for t in layout["data"])


def test_a_constant_metric_is_drawn_flat_after_smoothing():
    """reward_std = 0.3 at every step: its EMA differed from 0.3 by ~1e-17 at some steps, and
    plotly's autorange zoomed into that noise (a flat line drawn as a saw-tooth)."""
    df = pd.DataFrame({"run_id": "a", "step": range(20), "time": 0.0, "reward": 0.3})
    smooth = spec(metric_figure(df, "reward", smoothing=0.6))["data"][1]
    assert smooth["y"] == [0.3] * 20


def test_eval_metrics_logged_every_n_steps_draw_one_connected_line():
    """eval/* is logged at steps 0, 2 (every N) only: the panel exists and its trace joins those
    points (a lines-only trace through NaN gaps would draw nothing between isolated points)."""
    df = frame().assign(**{"eval/pass@1": [0.25, np.nan, 0.5, 0.0, np.nan, 0.75],
                           "eval/reward": [0.3, np.nan, 0.6, 0.1, np.nan, 0.9]})
    assert {"eval_accuracy", "eval_reward"} <= set(available_panels(df))
    assert "eval_accuracy" not in available_panels(frame())
    fig = spec(metric_figure(df, "eval_accuracy", labels={"a": "grpo", "b": "rloo"}))
    assert [t["name"] for t in fig["data"]] == ["grpo", "rloo"]  # pass@k not logged: one trace per run
    assert all(t["connectgaps"] for t in fig["data"])
    assert fig["data"][0]["y"][0] == 0.25 and fig["data"][0]["y"][2] == 0.5 and np.isnan(fig["data"][0]["y"][1])


@pytest.mark.parametrize("values, dtype", [
    ([1.0, np.nan], "float64"), ([np.nan, np.nan], "float64"), ([], "float64"), ([np.inf], "float64"),
    ([np.nan, -np.inf], "float32"), ([1, 2], "int64"), ([], "int64"), ([3], "uint8"), ([True], "bool"),
    ([None, None], "object"), ([None, "x"], "object"), ([np.nan, 1.5], "object"), ([1.0, None], "Float64"),
    ([None, None], "Float64"), ([None, None], "string"), (["a", None], "string"), ([1, None], "Int64"),
    ([pd.NaT, pd.NaT], "datetime64[ns]"), ([pd.NaT, pd.Timestamp(0)], "datetime64[ns]"), ([], "object"),
])
def test_has_values_is_pandas_notna_any_for_every_dtype(values, dtype):
    """The charts' check of a column (read as its array where numpy holds it) says what pandas
    says of the same column: a NaN is missing, an inf is a value, an integer column has a value
    in every row."""
    column = pd.Series(values, dtype=dtype)
    assert has_values(column) is bool(column.notna().any())
