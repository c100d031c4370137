"""Live / Compare's arms view on a real store: per arm the mean over seeds with its 95% band (band
traces read back from the plotly spec as the browser gets them), seeds at different steps, the
verdict table and the sweep view."""

from __future__ import annotations

import json
import math

import pytest

from tests.ui.conftest import page
from tests.ui.figspec import decode, traces
from tests.ui.seed import metrics_event, run_dir
from workbench.recipe import load_recipe

T2 = 4.302652729749464  # t_{0.975, 2}: the 95% band's quantile with 3 seeds
T1 = 12.706204736174698  # t_{0.975, 1}: with 2 seeds


def add_seed(store, arm: str, seed: int, steps: int, offset: float, *, group: str = "cmp", sweep=None,
             status: str = "finished", drop: tuple[str, ...] = ()) -> str:
    """One run of ``arm`` trained with ``seed``: reward = offset + 0.1 step + 0.1 seed; the
    metrics named in ``drop`` not logged."""
    recipe = load_recipe("grpo").with_overrides([f"train.seed={seed}"])
    run_id = f"{arm.split(' ')[0]}-{len(store.runs())}"
    store.create_run(run_id=run_id, name=arm.split(" ")[0], algorithm="grpo", recipe_yaml=recipe.to_yaml(),
                     total_steps=6, target="local", launcher="local", host="localhost", created_by="alice",
                     run_dir=str(run_dir(run_id)), group=group, arm=arm, sweep=sweep)
    events = [{"kind": "status", "step": 0, "time": 1000.0, "status": "running"}]
    for step in range(steps):
        event = metrics_event(step, 1000.0 + step)
        event["metrics"]["reward"] = round(offset + 0.1 * step + 0.1 * seed, 9)
        for name in drop:
            event["metrics"].pop(name)
        events.append(event)
    store.ingest(run_id, events)
    if status != "running":
        store.set_status(run_id, status)
    return run_id


@pytest.fixture
def arms(store):
    """grpo: seeds 0, 1, 2 with 6, 6 and 4 steps (a live arm); rloo: 3 seeds x 6 steps, offset 0.5."""
    for seed, steps in zip(range(3), (6, 6, 4)):
        add_seed(store, "grpo", seed, steps, 0.0)
    for seed in range(3):
        add_seed(store, "rloo", seed, 6, 0.5)


def charts(at) -> dict[str, list[dict]]:
    return {json.loads(c.proto.spec)["layout"]["title"]["text"]: traces(c.proto.spec) for c in at.get("plotly_chart")}


def by_name(figure: list[dict]) -> dict[str, dict]:
    return {t["name"]: t for t in figure}


def test_a_group_with_seeds_opens_on_the_arms_view_with_mean_and_band(home, arms):
    at = page("compare_page").run()
    assert not at.exception
    assert at.radio(key="compare_view").value == "arms"  # an arm with > 1 seed: arms by default
    at.slider(key="compare_smoothing").set_value(0.0).run()
    reward = by_name(charts(at)["Reward (batch mean)"])
    assert list(reward) == ["grpo (95% CI)", "grpo", "rloo (95% CI)", "rloo"]
    # steps 0-3: 3 seeds (offsets 0, 0.1, 0.2: mean 0.1 t + 0.1, s = 0.1); steps 4-5: seeds 0 and 1
    # (mean 0.1 t + 0.05, s = 0.1 / sqrt 2)
    mean = reward["grpo"]
    assert mean["x"] == [0, 1, 2, 3, 4, 5]
    assert mean["y"] == pytest.approx([0.1, 0.2, 0.3, 0.4, 0.45, 0.55])
    assert decode(mean["customdata"]) == [3, 3, 3, 3, 2, 2]  # seeds behind each point, in the hover
    assert mean["hovertemplate"] == "%{y:.4g} (mean of %{customdata} seeds)<extra>grpo</extra>"
    # rloo's 3 seeds reached every step: the count is written into the hover, no array sent for it
    assert "customdata" not in reward["rloo"]
    assert reward["rloo"]["hovertemplate"] == "%{y:.4g} (mean of 3 seeds)<extra>rloo</extra>"
    half = [T2 * 0.1 / math.sqrt(3)] * 4 + [T1 * (0.1 / math.sqrt(2)) / math.sqrt(2)] * 2
    band = reward["grpo (95% CI)"]
    assert band["fill"] == "toself" and band["showlegend"] is False
    assert band["fillcolor"] == "rgba(99,110,250,0.2)" and mean["line"]["color"] == "#636efa"
    assert band["x"] == [0, 1, 2, 3, 4, 5, 5, 4, 3, 2, 1, 0]  # along the top, back along the bottom
    highs = [m + h for m, h in zip(mean["y"], half)]
    lows = [m - h for m, h in zip(mean["y"], half)]
    assert band["y"] == pytest.approx(highs + lows[::-1])
    # the chart says what it aggregates
    assert any(c.value.startswith("Mean over seeds per arm: grpo: 3 seeds to step 3, then 2 to step 5 · rloo: 3 seeds")
               for c in at.caption), [c.value for c in at.caption]


def test_smoothing_applies_to_each_seed_and_seeds_show_on_demand(home, arms):
    at = page("compare_page").run()  # EMA 0.6 by default
    at.toggle(key="compare_seeds").set_value(True).run()
    reward = by_name(charts(at)["Reward (batch mean)"])
    assert [n for n in reward if n.startswith("rloo")] == ["rloo · seed 0", "rloo · seed 1", "rloo · seed 2",
                                                          "rloo (95% CI)", "rloo"]
    seed0 = reward["rloo · seed 0"]
    assert seed0["opacity"] == 0.3 and seed0["y"][:2] == pytest.approx([0.5, 0.5 + 0.4 * 0.1 / 0.64])  # debiased EMA
    # each seed's EMA is its own + 0.1 seed (the EMA of a constant is the constant): the mean is
    # seed 1's curve and the band keeps its width
    assert reward["rloo"]["y"] == pytest.approx(reward["rloo · seed 1"]["y"])
    band = reward["rloo (95% CI)"]["y"]
    assert band[0] - band[-1] == pytest.approx(2 * T2 * 0.1 / math.sqrt(3))


def test_every_x_axis_draws_bands(home, arms):
    at = page("compare_page").run()
    for x in ("tokens", "wall time"):
        at.radio(key="compare_x").set_value(x).run()
        reward = by_name(charts(at)["Reward (batch mean)"])
        assert {"grpo (95% CI)", "rloo (95% CI)"} <= set(reward), x
        assert max(reward["rloo"]["x"]) == {"tokens": 6 * 160.0, "wall time": 5.0}[x]  # 5 tokens x 32 per step
    assert any("grpo: 3 seeds to 3 s, then 2 to 5 s" in c.value for c in at.caption)  # seed 2 stops at 3 s


def test_verdict_table_per_arm_and_per_pair(home, arms):
    at = page("compare_page").run()
    assert at.selectbox(key="verdict_metric").value == "reward"
    assert at.slider(key="verdict_window").value == 0.1
    # window 10%: the last step of each run. grpo: 0.5, 0.6, 0.5 (seed 2 stopped at step 3); rloo: 1.0, 1.1, 1.2
    per_arm, pairs = (d.value for d in at.dataframe[:2])
    assert per_arm["arm"].tolist() == ["grpo", "rloo"] and per_arm["seeds"].tolist() == [3, 3]
    assert per_arm["mean"].tolist() == pytest.approx([1.6 / 3, 1.1])
    assert per_arm["95% CI"].tolist()[1] == f"[{1.1 - T2 * 0.1 / math.sqrt(3):.3g}, {1.1 + T2 * 0.1 / math.sqrt(3):.3g}]"
    assert per_arm["IQM"].tolist() == pytest.approx([1.6 / 3, 1.1])  # 3 seeds: nothing trimmed
    row = pairs.iloc[0]
    assert (row["A"], row["B"]) == ("grpo", "rloo")
    assert row["A − B"] == pytest.approx(1.6 / 3 - 1.1) and row["P(A > B)"] == 0.0
    assert row["verdict"] == "rloo > grpo: the interval excludes 0"
    assert "last 10% of each run's logged steps: 1 step" in " ".join(c.value for c in at.caption)
    # a window over every step: grpo 0.25, 0.35, 0.15 + 0.2; rloo 0.75, 0.85, 0.95
    at.slider(key="verdict_window").set_value(1.0).run()
    assert at.dataframe[0].value["mean"].tolist() == pytest.approx([0.95 / 3, 0.85])


def test_sweep_view_plots_the_final_metric_against_each_swept_value(home, store):
    for value, offset in ((0.2, 0.0), (0.28, 0.3)):
        for seed in range(3):
            add_seed(store, f"grpo · eps_high={value}", seed, 6, offset, group="sweep",
                     sweep={"algorithm.eps_high": value})
    at = page("compare_page").run()
    sweep = charts(at)["reward (final window) vs algorithm.eps_high"]
    [trace] = sweep
    assert trace["x"] == [0.2, 0.28] and trace["y"] == pytest.approx([0.6, 0.9])  # last step: 0.5 + 0.1 seed
    half = T2 * 0.1 / math.sqrt(3)
    assert decode(trace["error_y"]["array"]) == pytest.approx([half, half])


def test_many_arms_compare_against_the_first_by_default(home, store):
    """10 arms gave 45 pair rows; beyond 4 arms the default is each arm against the first."""
    for a in range(5):
        for seed in range(2):
            add_seed(store, f"arm{a}", seed, 3, 0.1 * a)
    at = page("compare_page").run()
    assert at.selectbox(key="verdict_pairs").value == "arm0"
    pairs = at.dataframe[1].value
    assert list(zip(pairs["A"], pairs["B"])) == [(f"arm{a}", "arm0") for a in range(1, 5)]


def test_a_chart_caption_that_comes_and_goes_does_not_change_the_pages_shape(home, store, arms):
    """Each chart of the arms view has a caption element, empty when it says what the page's
    common caption says: when a run that does not log entropy arrives, the entropy chart's caption
    gets text but no element is added, so no chart after it is remounted (drawn blank) on the next
    live redraw."""
    at = page("compare_page").run()
    shape = [c.value for c in at.caption]
    n_charts = len(at.get("plotly_chart"))
    assert len(shape) > n_charts and not at.exception  # the page's common caption, then one per chart
    add_seed(store, "rloo", 3, 6, 0.5, drop=("entropy",))
    at.run()
    after = [c.value for c in at.caption]
    assert len(after) == len(shape) and len(at.get("plotly_chart")) == n_charts
    assert any(c.startswith("rloo: 3 seeds") or "rloo: 3 seeds" in c for c in after if c), after


def test_captions_name_the_smoothing_and_the_verdict_scores_raw_values(home, arms):
    """Smoothing acts on each seed before the mean and band, and the caption gives its weight; the
    verdict table is of the raw values whatever the slider says, and its caption says so."""
    at = page("compare_page").run()  # EMA 0.6 by default
    assert any(c.value.startswith("Mean over seeds per arm: ") and c.value.endswith(
        "each seed smoothed first (EMA weight 0.6, debiased as in TensorBoard), then averaged: the band spreads the "
        "smoothed seeds") for c in at.caption), [c.value for c in at.caption]
    assert any("score of a run = its mean over the" in c.value and c.value.endswith(
        "verdicts use the raw logged values (smoothing applies to the curves only).") for c in at.caption)
    verdict = at.dataframe[0].value.to_dict()
    at.slider(key="compare_smoothing").set_value(0.99).run()  # the slider's end
    assert not at.exception
    assert any("(EMA weight 0.99," in c.value for c in at.caption)
    assert at.dataframe[0].value.to_dict() == verdict
    at.slider(key="compare_smoothing").set_value(0.0).run()
    assert not any("smoothed" in c.value for c in at.caption)
    assert at.dataframe[0].value.to_dict() == verdict
