"""Live / Compare page: a group's or chosen runs' curves (traces read back from the plotly spec),
smoothing and x-axis controls, samples per step, final metrics, and new steps showing up."""

import pytest

from tests.ui.conftest import page
from tests.ui.figspec import traces
from tests.ui.seed import LiveRun, add_run
from workbench.runs import sync


def charts(at) -> dict[str, list[dict]]:
    """Chart title -> its traces, as shipped to the browser."""
    import json

    out = {}
    for chart in at.get("plotly_chart"):
        spec = json.loads(chart.proto.spec)
        out[spec["layout"]["title"]["text"]] = traces(spec)
    return out


@pytest.fixture
def group(store):
    a = add_run(store, preset="grpo", name="grpo", steps=4, total=4, group="cmp", reward_offset=0.0, t0=1000.0)
    b = add_run(store, preset="rloo", name="rloo", steps=4, total=4, group="cmp", reward_offset=0.5, t0=2000.0)
    return a, b


def test_group_shows_every_panel_with_one_trace_per_run(home, group):
    at = page("compare_page").run()
    assert not at.exception
    figs = charts(at)
    assert list(figs) == ["Reward (batch mean)", "Reward std within groups", "Groups with zero reward std",
                          "KL to the reference", "Entropy", "Clip ratios", "Completion length", "Truncated completions",
                          "Losses", "Gradient norm", "Step time (s)"]
    reward = figs["Reward (batch mean)"]
    assert [t["name"] for t in reward] == ["grpo (raw)", "grpo", "rloo (raw)", "rloo"]  # smoothed by default
    assert reward[0]["x"] == [0.0, 1.0, 2.0, 3.0] and reward[0]["y"] == [0.0, 0.01, 0.02, 0.03]
    assert reward[2]["y"] == [0.5, 0.51, 0.52, 0.53]
    # the clip panel's main series is the either-side region; low / high are behind "Secondary series"
    assert [t["name"] for t in figs["Clip ratios"]][1::2] == ["grpo", "rloo"]
    assert [t["name"] for t in figs["Losses"] if not t["name"].endswith("(raw)")] == ["grpo", "rloo"]  # no value loss
    assert not any(t["showlegend"] for fig in figs.values() for t in fig)  # one legend for the page instead
    at.toggle(key="compare_secondary").set_value(True).run()
    assert [t["name"] for t in charts(at)["Clip ratios"]][1:6:2] == ["grpo · low_mean", "grpo · high_mean",
                                                                     "grpo · region_mean"]


def test_smoothing_defaults_to_tensorboards_ema_with_the_raw_curve_faint(home, group):
    """Smoothing 0 made reward curves read as noise: the default is EMA 0.6 (TensorBoard's), with
    the raw values drawn faint behind each smoothed line."""
    at = page("compare_page").run()
    assert at.slider(key="compare_smoothing").value == 0.6
    raw, smooth = charts(at)["Reward (batch mean)"][:2]
    assert raw["name"] == "grpo (raw)" and raw["opacity"] == 0.25 and raw["showlegend"] is False
    # debiased EMA, w = 0.6, of 0, 0.01: s1 = 0, s2 = 0.4 * 0.01 / (1 - 0.36)
    assert smooth["y"][:2] == pytest.approx([0.0, 0.004 / 0.64])
    at.slider(key="compare_smoothing").set_value(0.0).run()
    assert [t["name"] for t in charts(at)["Reward (batch mean)"]] == ["grpo", "rloo"]


def test_smoothing_and_x_axis_controls(home, group):
    at = page("compare_page").run()
    at.slider(key="compare_smoothing").set_value(0.5).run()
    reward = charts(at)["Reward (batch mean)"]
    assert [t["name"] for t in reward] == ["grpo (raw)", "grpo", "rloo (raw)", "rloo"]
    # debiased EMA, w = 0.5, of 0, 0.01, 0.02, 0.03: s1 = 0, s2 = 0.01/1.5, s3 = (0.005+0.02)/1.75 ...
    assert reward[1]["y"] == pytest.approx([0.0, 0.01 / 1.5, 0.025 / 1.75, 0.0425 / 1.875])
    at.radio(key="compare_x").set_value("wall time").run()
    reward = charts(at)["Reward (batch mean)"]
    assert reward[0]["x"] == [0.0, 1.0, 2.0, 3.0]
    at.radio(key="compare_x").set_value("tokens").run()
    assert charts(at)["Reward (batch mean)"][0]["x"] == [160.0, 320.0, 480.0, 640.0]  # 5 tokens x 32 per step


def test_chart_selection_and_chosen_runs(home, group):
    a, b = group
    at = page("compare_page").run()
    at.multiselect(key="compare_panels").set_value(["kl", "entropy"]).run()
    assert list(charts(at)) == ["KL to the reference", "Entropy"]
    at.radio(key="compare_mode").set_value("Runs").run()
    at.multiselect(key="compare_pick").set_value([b]).run()
    assert [t["name"] for t in charts(at)["KL to the reference"]] == ["rloo (raw)", "rloo"]


def test_final_metrics_and_samples(home, group):
    at = page("compare_page").run()
    final = at.dataframe[0].value.set_index("run")
    assert final.loc["grpo", "steps"] == 4 and final.loc["rloo", "reward (best)"] == 0.53
    assert final.loc["rloo", "reward (last 5)"] == pytest.approx(0.515)
    samples = at.dataframe[1].value
    assert samples["completion"].tolist() == ["5", "9"]
    assert samples["reward"].tolist() == [1.0, 0.0] and samples["advantage"].tolist() == [0.5, -0.5]
    assert at.selectbox(key=f"compare_sample_step:{group[0]}").value == 3


def test_new_steps_of_a_live_run_reach_the_chart(home, store):
    live = LiveRun(store, name="live", total=50)
    try:
        for step in range(3):
            live.step(step)
        sync(store)
        at = page("compare_page").run()
        assert charts(at)["Reward (batch mean)"][0]["x"] == [0.0, 1.0, 2.0]
        assert "live** running · step 3/50" in at.markdown[0].value
        live.step(3)
        sync(store)
        at.run()
        assert charts(at)["Reward (batch mean)"][0]["x"] == [0.0, 1.0, 2.0, 3.0]
    finally:
        live.stop()


def test_empty_store_says_what_to_do(home):
    at = page("compare_page").run()
    assert "No runs yet" in at.info[0].value


def test_a_resume_that_redoes_steps_is_drawn_with_the_new_values(home, store):
    """A running run resumed from step 2 that redoes steps 2 and 3 ends at the same last step,
    reward and status as before; only its metrics generation tells the page its rows changed. The
    open page draws the redone step's new value (it kept the old frame when its stamp lacked that)."""
    from tests.ui.seed import metrics_event

    run_id = add_run(store, name="live", steps=4, total=10, status="running", t0=1000.0)
    at = page("compare_page").run()
    at.slider(key="compare_smoothing").set_value(0.0).run()
    assert charts(at)["Reward (batch mean)"][0]["y"] == [0.0, 0.01, 0.02, 0.03]
    redo = metrics_event(2, 1010.0, offset=0.5)  # step 2 now 0.52; step 3 as before
    store.ingest(run_id, [{"kind": "resume", "step": 2, "time": 1009.0}, redo, metrics_event(3, 1011.0)])
    run = store.get_run(run_id)
    assert (run["last_step"], run["reward"], run["status"]) == (3, 0.03, "running")
    at.run()
    assert not at.exception
    assert charts(at)["Reward (batch mean)"][0]["y"] == [0.0, 0.01, 0.52, 0.03]
