"""Charts of logged metrics beyond the fixed panels: the ``metric:NAME`` resolver, the Charts
options built from the logged names, and both views drawing such a chart."""

import json

import pandas as pd
import pytest

from tests.ui.figspec import traces
from workbench.viz.arms import arm_figures
from workbench.viz.curves import (PANELS, Panel, available_panels, chart_options, compare_figures, extra_metrics,
                                  has_data, logged_metrics, metric_key, resolve_panel)

# a run that logged a reward function's pair, a log_metric name, TRL's names with fixed panels,
# and the trainer's own step key
LOGGED = ["reward", "kl", "kl/token_std", "num_tokens", "clip_ratio/low_min", "completions/max_terminated_length",
          "rewards/format/std", "rewards/format/mean", "judge/agreement", "step", "entropy_coef", "distill/reverse_kl"]


def runs() -> pd.DataFrame:
    """Runs a and b, 3 steps; only a logged judge/agreement (0.1 + 0.2 step)."""
    return pd.DataFrame({"run_id": ["a"] * 3 + ["b"] * 3, "step": [0, 1, 2] * 2, "time": [0.0, 1.0, 2.0] * 2,
                         "reward": [0.0, 0.5, 1.0, 1.0, 1.0, 1.0],
                         "judge/agreement": [0.1, 0.3, 0.5, None, None, None]})


def test_a_metric_key_resolves_to_a_one_metric_panel_named_after_it():
    assert metric_key("rewards/format/mean") == "metric:rewards/format/mean"
    panel = resolve_panel("metric:rewards/format/mean")
    assert (panel.title, panel.metrics) == ("rewards/format/mean", ("rewards/format/mean",))
    assert resolve_panel("metric:a:b").metrics == ("a:b",)  # only the first colon separates
    assert resolve_panel("clip") is PANELS["clip"]


@pytest.mark.parametrize("key", ["nope", "metric:", "Metric:reward"])
def test_an_unknown_chart_key_names_the_key_and_the_forms_allowed(key):
    with pytest.raises(ValueError, match=rf"chart={key!r} is not allowed; use one of: reward, .*, or metric:NAME"):
        resolve_panel(key)


def test_logged_metrics_are_the_numeric_columns_with_a_value_keys_left_out():
    df = runs().assign(arm="grpo", seed=0, note="text", never=float("nan"))
    assert logged_metrics(df) == ["reward", "judge/agreement"]
    assert logged_metrics(df[df["run_id"] == "b"]) == ["reward"]


def test_trls_well_known_names_have_fixed_panels_the_rest_become_metric_options_sorted():
    assert extra_metrics(LOGGED) == ["judge/agreement", "rewards/format/mean", "rewards/format/std"]
    assert chart_options(LOGGED) == [*PANELS, "metric:judge/agreement", "metric:rewards/format/mean",
                                     "metric:rewards/format/std"]
    assert chart_options([]) == list(PANELS)
    covered = {"num_tokens": "num_tokens", "kl/token_std": "kl_token_std", "entropy_coef": "entropy_coef",
               "distill/reverse_kl": "distill_reverse_kl", "clip_ratio/low_min": "clip_extremes",
               "clip_ratio/high_max": "clip_extremes", "completions/mean_terminated_length": "terminated_length",
               "prompts/truncated_ratio": "prompts_truncated", "remax/baseline_reward": "remax_baseline",
               "entropy/top_quantile_kept": "entropy_kept", "distill/teacher_logp": "distill_teacher_logp"}
    assert {name: [k for k, p in PANELS.items() if name in p.metrics] for name in covered} == \
        {name: [key] for name, key in covered.items()}


def test_every_fixed_panel_says_what_it_draws():
    assert all(isinstance(p, Panel) and p.title and p.help for p in PANELS.values())
    names = [m for p in PANELS.values() for m in p.metrics]
    assert len(names) == len(set(names))  # a logged name is drawn by one fixed panel


def test_has_data_for_fixed_and_metric_keys_and_available_panels_stay_fixed():
    df = runs()
    assert has_data(df, "metric:judge/agreement") and has_data(df, "reward")
    assert not has_data(df, "metric:rewards/format/mean") and not has_data(df, "kl")
    assert not has_data(df[df["run_id"] == "b"], "metric:judge/agreement")  # a column of NaN only
    assert available_panels(df) == ["reward"]  # the default figures: fixed panels only


def test_a_metric_chart_in_the_per_run_and_the_arms_view():
    df = runs()
    fig = json.loads(compare_figures(df, ["metric:judge/agreement"])["metric:judge/agreement"].to_json())
    assert fig["layout"]["title"]["text"] == "judge/agreement"
    (line,) = traces(fig)  # run b never logged it: no trace
    assert line["name"] == "a" and line["x"] == [0.0, 1.0, 2.0] and line["y"] == pytest.approx([0.1, 0.3, 0.5])
    arms = df.assign(arm="grpo", seed=[0, 0, 0, 1, 1, 1])
    chart = arm_figures(arms, ["reward", "metric:judge/agreement"])["metric:judge/agreement"]
    mean = {t["name"]: t for t in traces(json.loads(chart.figure.to_json()))}["grpo"]
    assert mean["y"] == pytest.approx([0.1, 0.3, 0.5])  # one seed logged it: its values
    assert chart.figure.layout.title.text == "judge/agreement"
