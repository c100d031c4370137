"""Live / Compare offers every logged metric: after the fixed panels, one chart option per metric
no fixed panel draws (a reward function's rewards/NAME/mean and std, a log_metric name), not
chosen by default; chosen, it is drawn in the per-run view and in the arms view (real store)."""

import json

import pytest

from tests.ui.conftest import page
from tests.ui.figspec import traces
from tests.ui.seed import add_run
from workbench.viz.curves import PANELS

# what the trainer logs beyond the seed's base line: TRL's names, a reward function's pair and a
# name a reward function chose with log_metric
TRL_EXTRAS = {"num_tokens": 100.0, "completions/mean_terminated_length": 4.0, "completions/min_terminated_length": 2.0,
              "completions/max_terminated_length": 5.0, "clip_ratio/low_min": 0.0, "clip_ratio/high_max": 0.04,
              "kl/token_std": 0.002}


def judge_metrics(step: int) -> dict:
    return {**TRL_EXTRAS, "num_tokens": 100.0 * (step + 1), "rewards/accuracy/mean": 0.25 * step,
            "rewards/accuracy/std": 0.5, "judge/agreement": 0.1 + 0.2 * step}


def charts(at) -> dict[str, list[dict]]:
    return {json.loads(c.proto.spec)["layout"]["title"]["text"]: traces(c.proto.spec) for c in at.get("plotly_chart")}


@pytest.fixture
def judged(store):
    """One run (grpo, 3 steps) that logs TRL's extra names, rewards/accuracy/* and judge/agreement."""
    return add_run(store, name="grpo", steps=3, total=3, group="g", t0=1000.0, extra_metrics=judge_metrics)


def test_logged_metrics_without_a_fixed_panel_are_offered_after_the_panels_not_chosen(home, judged):
    at = page("compare_page").run()
    assert not at.exception
    charts_control = at.multiselect(key="compare_panels")
    # the seed line's lr, completions/count and perf/tokens_per_s have no fixed panel either; the
    # trainer's own `step` key is not a metric
    extras = ["metric:completions/count", "metric:judge/agreement", "metric:lr", "metric:perf/tokens_per_s",
              "metric:rewards/accuracy/mean", "metric:rewards/accuracy/std"]
    assert charts_control.options == [PANELS[k].title for k in PANELS] + [k.split(":", 1)[1] for k in extras]
    assert charts_control.value == list(PANELS)
    drawn = charts(at)
    assert not {"judge/agreement", "rewards/accuracy/mean"} & set(drawn)
    # TRL's names have fixed panels, drawn by default
    # (the mean; the batch min / max are secondary series, drawn with the toggle)
    assert [t["name"] for t in drawn["Terminated completion length"]][1::2] == ["grpo"]
    assert drawn["Tokens seen"][0]["y"] == [100.0, 200.0, 300.0]
    assert drawn["Clip ratio extremes over sequences"][3]["y"] == [0.04, 0.04, 0.04]


def test_a_chosen_metric_is_drawn_as_its_own_chart(home, judged):
    at = page("compare_page").run()
    at.slider(key="compare_smoothing").set_value(0.0).run()
    at.multiselect(key="compare_panels").set_value(["reward", "metric:judge/agreement", "metric:rewards/accuracy/mean"]).run()
    assert not at.exception
    drawn = charts(at)
    assert list(drawn) == ["Reward (batch mean)", "judge/agreement", "rewards/accuracy/mean"]
    (judge,) = drawn["judge/agreement"]
    assert judge["name"] == "grpo" and judge["x"] == [0.0, 1.0, 2.0]
    assert judge["y"] == pytest.approx([0.1, 0.3, 0.5])
    assert drawn["rewards/accuracy/mean"][0]["y"] == [0.0, 0.25, 0.5]
    # the help lists what each chosen chart draws under its logged name
    assert "- **judge/agreement** (`judge/agreement`): Logged as judge/agreement" in at.expander[0].markdown[0].value


def test_a_chosen_metric_is_drawn_per_arm_in_the_arms_view(home, store):
    for seed in range(2):
        add_run(store, name="grpo", steps=3, total=3, group="g", t0=1000.0, seed=seed,
                extra_metrics=lambda step, seed=seed: {"judge/agreement": 0.1 * step + 0.2 * seed})
    at = page("compare_page").run()
    assert at.radio(key="compare_view").value == "arms"
    at.slider(key="compare_smoothing").set_value(0.0).run()
    at.multiselect(key="compare_panels").set_value(["metric:judge/agreement"]).run()
    assert not at.exception
    judge = {t["name"]: t for t in charts(at)["judge/agreement"]}
    # the mean over seeds 0 and 1 of 0.1 step + 0.2 seed
    assert judge["grpo"]["y"] == pytest.approx([0.1, 0.2, 0.3])
    assert "grpo (95% CI)" in judge


def test_a_chosen_metric_the_new_selection_does_not_log_is_dropped(home, store, judged):
    plain = add_run(store, name="rloo", steps=2, total=2, t0=2000.0)
    at = page("compare_page").run()
    at.multiselect(key="compare_panels").set_value(["reward", "metric:judge/agreement"]).run()
    at.radio(key="compare_mode").set_value("Runs").run()
    at.multiselect(key="compare_pick").set_value([plain]).run()
    assert not at.exception
    assert at.multiselect(key="compare_panels").value == ["reward"] and not at.warning
    assert list(charts(at)) == ["Reward (batch mean)"]
