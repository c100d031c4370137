"""The Experiments lab in a real streamlit AppTest over a real run store: the launch button makes
the experiment's group (queued behind a full CPU slot, so nothing trains), and a finished group
shows its verdict table."""

import pytest
from streamlit.testing.v1 import AppTest

from tests.runs.test_arms import full_queue  # noqa: F401  (a home whose one CPU slot is held: launches queue)
from workbench.runs import RunStore
from workbench.runs.experiments import EXPERIMENTS, experiment_plan

PAGE = "from workbench.ui.labs import experiments\nexperiments.render()\n"


def experiments_page() -> AppTest:
    return AppTest.from_string(PAGE, default_timeout=60)


def test_launch_button_creates_the_experiments_group_of_arms_x_seeds(home, full_queue):
    at = experiments_page().run()
    assert not at.exception
    at.selectbox(key="exp_pick").set_value("mu-reuse").run()
    assert "Not launched yet" in " ".join(c.value for c in at.caption)
    at.button(key="exp_launch_mu-reuse").click().run()
    assert not at.exception and not at.error, [e.value for e in at.error]
    arms = full_queue.arms("exp-mu-reuse-1")
    assert {arm: [r["seed"] for r in runs] for arm, runs in arms.items()} == {"grpo · mu=1": [0, 1, 2],
                                                                             "grpo · mu=4": [0, 1, 2]}
    assert {r["status"] for runs in arms.values() for r in runs} == {"queued"}
    # the page now follows that group; a second click makes the next group, not copies in the first
    assert at.selectbox(key="exp_run_mu-reuse").value == "exp-mu-reuse-1"
    at.button(key="exp_launch_mu-reuse").click().run()
    assert len(full_queue.list_runs(group="exp-mu-reuse-2")) == 6 and len(full_queue.list_runs(group="exp-mu-reuse-1")) == 6


ENTROPY = {"dapo · eps_high=0.2": [0.10, 0.12, 0.14], "dapo · eps_high=0.28": [0.30, 0.33, 0.36]}


def add_finished_group(store: RunStore, steps: int = 10, entropy_of=ENTROPY, running: int = 0) -> None:
    """The clip-higher experiment's 2 arms x 3 seeds, finished (the last ``running`` of them still
    running, at step ``steps`` of 2 x ``steps``), each logging a constant entropy."""
    experiment = EXPERIMENTS["clip-higher"]
    planned = experiment_plan(experiment)
    for i, p in enumerate(planned):
        live = i >= len(planned) - running
        run_id = f"run-{p.arm[-4:]}-{p.seed}"
        store.create_run(run_id=run_id, name="dapo", algorithm="dapo", recipe_yaml=p.recipe.to_yaml(), total_steps=2 * steps if live else steps,
                         target="local", launcher="local", host="localhost", created_by="t", run_dir="/nowhere",
                         group="exp-clip-higher-1", arm=p.arm, sweep=p.sweep)
        entropy = entropy_of[p.arm][p.seed]
        store.ingest(run_id, [{"kind": "metrics", "step": s, "time": 1.0 + s, "metrics": {
            "entropy": entropy, "reward": 0.5, "clip_ratio/high_mean": 0.0}} for s in range(steps)])
        store.set_status(run_id, "running" if live else "finished")


def test_a_finished_group_shows_its_verdict_table(store):
    add_finished_group(store)
    at = experiments_page().run()
    at.selectbox(key="exp_pick").set_value("clip-higher").run()
    assert not at.exception
    assert at.selectbox(key="exp_run_clip-higher").value == "exp-clip-higher-1"
    # per metric: the arms table then the pairs table; entropy first
    arms, pairs = at.dataframe[0].value, at.dataframe[1].value
    assert arms["arm"].tolist() == list(ENTROPY)
    assert arms["mean"].tolist() == pytest.approx([0.12, 0.33])
    assert arms["seeds"].tolist() == [3, 3]
    # 0.2 - 0.28 = -0.21; stds 0.02 and 0.03, se = sqrt((0.02^2 + 0.03^2) / 3) = 0.020817, Welch
    # nu = se^4 / ((0.02^2/3)^2/2 + (0.03^2/3)^2/2) = 3.4845, t_{0.975, 3.4845} = 2.93: half-width 0.0610
    assert pairs["A − B"].tolist() == pytest.approx([-0.21])
    assert pairs["95% CI"].tolist() == ["[-0.271, -0.149]"]
    assert pairs["verdict"].tolist() == ["dapo · eps_high=0.28 > dapo · eps_high=0.2: the interval excludes 0"]
    assert pairs["P(A > B)"].tolist() == [0.0]
    # every metric of the experiment gets a chart with a band per arm and its own table
    assert [s.value for s in at.subheader] == ["entropy", "clip_ratio/high_mean", "reward"]
    assert len(at.dataframe) == 6
    assert [s.value for s in at.success] == ["Reproduced here: `dapo · eps_high=0.28` > `dapo · eps_high=0.2` on "
                                             "`entropy`, the 95% interval of the difference excludes 0."]


def test_the_page_opens_without_any_launch(store):
    at = experiments_page().run()
    assert not at.exception
    assert "DAPO clip-higher" in at.selectbox(key="exp_pick").format_func(at.selectbox(key="exp_pick").value)



def test_a_gap_whose_interval_includes_0_is_not_called_reproduced(store):
    add_finished_group(store, entropy_of={"dapo · eps_high=0.2": [0.10, 0.30, 0.20],
                                          "dapo · eps_high=0.28": [0.25, 0.15, 0.35]})
    at = experiments_page().run()
    at.selectbox(key="exp_pick").set_value("clip-higher").run()
    assert not at.exception and not at.success
    assert at.dataframe[1].value["verdict"].tolist() == ["no difference detectable with 3 seeds"]
    assert [w.value.split(":")[0] for w in at.warning] == ["Not reproduced here"]


def test_a_running_group_shows_its_progress_and_defers_the_papers_check(store):
    add_finished_group(store, running=1)  # 5 runs at 10/10 steps, 1 at 10/20
    at = experiments_page().run()
    at.selectbox(key="exp_pick").set_value("clip-higher").run()
    assert not at.exception
    bar = at.get("progress")[0]
    assert bar.proto.value == int(100 * (5 + 0.5) / 6)  # percent of all steps done (streamlit truncates)
    assert "1 running" in bar.proto.text and "5 finished" in bar.proto.text
    assert any("decided when the runs end" in c.value for c in at.caption) and not at.success and not at.warning
