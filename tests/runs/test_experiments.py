"""The canned experiments: valid plans, metrics the trainer really logs, derived metrics by hand."""

import math

import numpy as np
import pandas as pd
import pytest
import yaml

from workbench.runs import RunStore
from workbench.runs.experiments import (DERIVED_METRICS, EXPERIMENTS, Expectation, experiment_frame, experiment_groups,
                                        experiment_plan, get_experiment, logged_metric_inputs, next_group, reproduced,
                                        step_change, wrong_mean_length)


@pytest.mark.parametrize("key", list(EXPERIMENTS))
def test_every_experiment_is_a_valid_plan_of_its_arms_x_seeds(key):
    experiment = EXPERIMENTS[key]
    planned = experiment_plan(experiment)  # validates every (arm, seed) recipe for this machine
    arms = list(dict.fromkeys(p.arm for p in planned))
    n_arms = len(experiment.presets) * math.prod(len(v) for v in experiment.sweep.values())
    assert len(arms) == n_arms == 2 and len(planned) == n_arms * experiment.seeds
    assert {arm: [p.seed for p in planned if p.arm == arm] for arm in arms} == {arm: [0, 1, 2] for arm in arms}
    # the paper's direction names two of the arms this plan launches
    assert {experiment.expect.higher, experiment.expect.lower} == set(arms)
    for p in planned:  # the shared overrides and the swept values reach every recipe
        data = p.recipe.to_dict()
        for item in experiment.overrides:
            key_path, value = item.split("=", 1)  # top-level fields (model=...) and sections (train.steps=...)
            assert field_value(data, key_path) == yaml.safe_load(value), item
        for field, value in p.sweep.items():
            assert field_value(data, field) == value


def field_value(data: dict, dotted: str):
    """A recipe dict's value at a dotted field path ('train.steps', 'model')."""
    for name in dotted.split("."):
        data = data[name]
    return data


def test_experiment_plans_differ_only_where_the_experiment_says():
    """The two arms of each experiment share everything but the tested axes (and the name)."""
    differing = {}
    for key, experiment in EXPERIMENTS.items():
        first, *_, last = experiment_plan(experiment, seeds=1)
        a, b = first.recipe.to_dict(), last.recipe.to_dict()
        differing[key] = sorted(f"{s}.{k}" for s in a if isinstance(a[s], dict) for k in a[s] if a[s][k] != b[s][k])
    assert differing == {
        "clip-higher": ["algorithm.eps_high"],
        "dr-grpo-length": ["algorithm.aggregation", "algorithm.grpo_scale"],
        "mu-reuse": ["train.mu"],
        "kl-k1-vs-k3": ["algorithm.kl_estimator"],
        "smollm2-arithmetic": ["optim.lr"],
    }


def test_the_trainer_logs_every_metric_the_experiments_read(fresh_home):
    """One real 3-step run of each experiment's last arm: every metric the experiment reads (or
    derives from) is in the trainer's metrics events, and each of its metrics, derived ones
    included, has finite values once the events are ingested into a real store."""
    from workbench.engine.events import read_events
    from workbench.engine.trainer import train

    store = RunStore()
    for key, experiment in EXPERIMENTS.items():
        run = experiment_plan(experiment, seeds=1)[-1]
        recipe = run.recipe.with_overrides(["train.steps=3", "logging.diagnostics_every=0"])
        run_dir = fresh_home / "runs" / key
        train(recipe, run_dir)
        events = read_events(run_dir)
        logged = set().union(*(e["metrics"] for e in events if e["kind"] == "metrics"))
        assert logged_metric_inputs(experiment) <= logged, key
        store.create_run(run_id=key, name=key, algorithm=recipe.name, recipe_yaml=recipe.to_yaml(), total_steps=3,
                         target="local", launcher="local", host="localhost", created_by="t", run_dir=str(run_dir),
                         group=f"exp-{key}-1", arm=run.arm)
        store.ingest(key, events)
        frame = experiment_frame(store, [key], experiment)
        for metric in experiment.metrics:
            assert np.isfinite(frame[metric].to_numpy(dtype=float)).any(), (key, metric)


def test_wrong_mean_length_averages_only_the_wrong_samples_of_each_step():
    samples = pd.DataFrame({
        "run_id": ["r", "r", "r", "r", "r", "q"],
        "step": [0, 0, 0, 1, 1, 0],
        "reward": [1.2, 0.2, 0.0, 1.0, 1.2, 0.2],  # 1.0 and 1.2: right (exact_match 1 + format 0.2)
        "length": [2, 5, 8, 3, 4, 6],
    })
    out = wrong_mean_length(samples)
    # run r step 0: wrong lengths 5 and 8 -> 6.5; step 1 has no wrong answer: no row; run q step 0: 6
    assert out.sort_values(["run_id", "step"]).to_dict("records") == [
        {"run_id": "q", "step": 0, "completions/wrong_mean_length": 6.0},
        {"run_id": "r", "step": 0, "completions/wrong_mean_length": 6.5}]


def test_step_change_is_the_absolute_difference_within_each_run():
    frame = pd.DataFrame({"run_id": ["a", "b", "a", "a", "b"], "step": [1, 0, 0, 2, 1],
                          "kl": [0.5, 1.0, 0.2, 0.1, -1.0]})
    change = step_change(frame, "kl")
    # a: steps 0, 1, 2 = 0.2, 0.5, 0.1 -> NaN, 0.3, 0.4; b: 1.0, -1.0 -> NaN, 2.0 (aligned with the rows)
    np.testing.assert_allclose(change.to_numpy(), [0.3, np.nan, np.nan, 0.4, 2.0])


def test_group_names_count_up_per_experiment():
    e = get_experiment("mu-reuse")
    groups = ["exp-mu-reuse-2", "exp-mu-reuse-10", "exp-mu-reuse", "exp-mu-reuse-x", "exp-clip-higher-7", "other"]
    assert experiment_groups(e, groups) == ["exp-mu-reuse-10", "exp-mu-reuse-2"]
    assert next_group(e, groups) == "exp-mu-reuse-11"
    assert next_group(e, []) == "exp-mu-reuse-1"
    with pytest.raises(ValueError, match="experiment='nope' is not allowed"):
        get_experiment("nope")


def test_reproduced_reads_the_interval_in_the_papers_direction_either_way_round():
    expect = Expectation(higher="A", lower="B")

    def pairs(a, b, low, high):
        return pd.DataFrame({"a": [a], "b": [b], "diff_ci_low": [low], "diff_ci_high": [high]})

    assert reproduced(pairs("A", "B", 0.1, 0.3), expect) is True
    assert reproduced(pairs("A", "B", -0.1, 0.3), expect) is False  # interval includes 0
    assert reproduced(pairs("B", "A", -0.3, -0.1), expect) is True  # the mirror row
    assert reproduced(pairs("B", "A", 0.1, 0.3), expect) is False  # the opposite direction
    assert reproduced(pairs("A", "B", math.nan, math.nan), expect) is False  # one seed: no interval
    assert reproduced(pairs("A", "C", 0.1, 0.3), expect) is None


def test_derived_metrics_name_their_inputs():
    assert {name: sorted(d.inputs) for name, d in DERIVED_METRICS.items()} == {
        "completions/wrong_mean_length": ["reward"], "kl/step_change": ["kl"]}


def test_quick_comparison_plan_can_start_at_another_seed():
    """bench/learning_bench.py --first-seed 3 checks the Quick comparison on seeds it was not tuned on."""
    from workbench.runs import quickstart_plan

    planned = quickstart_plan(seeds=3, first_seed=3)
    assert [(p.arm, p.seed, p.recipe.train.seed) for p in planned] == [
        (a, s, s) for a in ("grpo", "rloo", "ppo") for s in (3, 4, 5)]
