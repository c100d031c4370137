"""Seeds as an axis and sweeps: the plan (every arm x seed validated before anything starts), the
real CLI launching it into a real store, the store's arms and long metrics frame feeding
workbench.analysis, the migration of older store files, and the `compare` verdict table.

Launched runs never train here: a `sleep` process holds the only CPU slot (a real local run as far
as the queue can tell), so every run this test launches waits in the queue and is cancelled.
"""

from __future__ import annotations

import math
import sqlite3
from pathlib import Path

import pytest
import yaml

from tests.runs.helpers import held_cpu_slot
from tests.runs.test_store import OLDEST_RUNS_TABLE
from tests.test_cli import assert_one_line_error, cli, leftovers
from workbench.analysis import final_window_values, pairwise
from workbench.runs import (MAX_RUNS_PER_LAUNCH, RunError, RunStore, parse_sweep, plan_runs,
                            quickstart_plan)
from workbench.runs.authz import local_principal

# ---- the plan: pure, validated, torch-free -----------------------------------------------------


def test_plan_is_recipes_x_grid_x_paired_seeds():
    planned = plan_runs(["grpo", "rloo"], seeds=2, overrides=["train.seed=5", "train.mu=2"],  # mu 2: the clip acts
                        sweep=parse_sweep(["algorithm.eps_high=0.2,0.28", "algorithm.aggregation=token-mean"]))
    got = [(p.arm, p.seed, p.recipe.train.seed, p.recipe.algorithm.eps_high, p.recipe.algorithm.aggregation)
           for p in planned]
    assert got == [
        ("grpo · eps_high=0.2 · aggregation=token-mean", 5, 5, 0.2, "token-mean"),
        ("grpo · eps_high=0.2 · aggregation=token-mean", 6, 6, 0.2, "token-mean"),
        ("grpo · eps_high=0.28 · aggregation=token-mean", 5, 5, 0.28, "token-mean"),
        ("grpo · eps_high=0.28 · aggregation=token-mean", 6, 6, 0.28, "token-mean"),
        ("rloo · eps_high=0.2 · aggregation=token-mean", 5, 5, 0.2, "token-mean"),
        ("rloo · eps_high=0.2 · aggregation=token-mean", 6, 6, 0.2, "token-mean"),
        ("rloo · eps_high=0.28 · aggregation=token-mean", 5, 5, 0.28, "token-mean"),
        ("rloo · eps_high=0.28 · aggregation=token-mean", 6, 6, 0.28, "token-mean"),
    ]
    assert planned[2].sweep == {"algorithm.eps_high": 0.28, "algorithm.aggregation": "token-mean"}
    assert {p.recipe.algorithm.advantage for p in planned[:4]} == {"grpo"}
    assert {p.recipe.algorithm.advantage for p in planned[4:]} == {"rloo"}


def test_a_sweep_of_a_field_with_no_effect_in_any_arm_is_refused_with_the_specs_reason(tmp_path):
    # grpo: mu = 1, one minibatch: every ratio is 1, so the clip's eps_high changes nothing
    with pytest.raises(RunError, match=r"--sweep algorithm.eps_high has no effect in any arm \(train.mu=1 and "
                                       r"train.minibatches=1 \(one update per batch\)"):
        plan_runs(["grpo"], seeds=2, sweep={"algorithm.eps_high": [0.2, 0.28]})
    with pytest.raises(RunError, match=r"--sweep algorithm.sapo_tau_pos has no effect in any arm \(algorithm.policy_loss='clip' "
                                       r"does not read it"):
        plan_runs(["grpo"], sweep={"algorithm.sapo_tau_pos": [1.0, 2.0]}, overrides=["train.mu=2"])
    # it acts in the mu = 2 arms: allowed, every arm planned
    assert len(plan_runs(["grpo"], sweep={"train.mu": [1, 2], "algorithm.eps_high": [0.2, 0.28]})) == 4
    assert len(plan_runs(["grpo"], sweep={"algorithm.eps_high": [0.2, 0.28]}, overrides=["train.minibatches=2"])) == 2
    res = cli(tmp_path, "launch", "grpo", "--sweep", "algorithm.eps_high=0.2,0.28")
    assert_one_line_error(res, "--sweep algorithm.eps_high has no effect in any arm")


def test_a_swept_shared_field_is_not_forced_to_the_first_recipes_value():
    """prompts_per_step is shared across a group (same prompts per step) unless it is what is swept."""
    planned = plan_runs(["grpo", "rloo"], sweep={"sampling.prompts_per_step": [2, 8]})
    assert [(p.arm, p.recipe.sampling.prompts_per_step) for p in planned] == [
        ("grpo · prompts_per_step=2", 2), ("grpo · prompts_per_step=8", 8),
        ("rloo · prompts_per_step=2", 2), ("rloo · prompts_per_step=8", 8)]


def test_seeds_of_a_group_are_paired_across_arms_not_shared():
    """The seed used to be forced to the first recipe's for the whole group; now each arm gets the
    same list s0 .. s0 + N - 1, s0 being the first recipe's seed."""
    planned = plan_runs(["grpo", "rloo", "ppo"], seeds=3)
    assert [(p.arm, p.seed) for p in planned] == [(a, s) for a in ("grpo", "rloo", "ppo") for s in (0, 1, 2)]


@pytest.mark.parametrize("kwargs, message", [
    (dict(sweep={"algorithm.eps_high": [0.2, -1]}), "arm 'grpo · eps_high=-1' seed 0 is not allowed"),
    (dict(sweep={"algorithm.eps_hi": [1]}), "--sweep algorithm.eps_hi: unknown field"),
    (dict(sweep={"train.seed": [1, 2]}), "use --seeds N"),
    (dict(sweep={"algorithm.eps_high": [0.2, 0.2]}), "lists 0.2 twice"),
    (dict(seeds=0), "--seeds=0 is not allowed"),
    (dict(seeds=MAX_RUNS_PER_LAUNCH + 1), f"at most {MAX_RUNS_PER_LAUNCH} per launch"),
    (dict(overrides=["train.seed=4294967295"], seeds=2), "seed 4294967296 is not allowed"),
])
def test_invalid_plans_name_what_is_wrong(kwargs, message):
    with pytest.raises(ValueError) as err:
        plan_runs(["grpo"], **kwargs)
    assert message in str(err.value)


def test_sweep_values_are_one_yaml_list():
    assert parse_sweep(["optim.betas=[0.9,0.99],[0.9,0.999]", "algorithm.aggregation=token-mean,seq-mean-token-mean"]) == {
        "optim.betas": [[0.9, 0.99], [0.9, 0.999]], "algorithm.aggregation": ["token-mean", "seq-mean-token-mean"]}
    with pytest.raises(RunError, match="given twice"):
        parse_sweep(["train.mu=1", "train.mu=2"])


def test_quick_comparison_is_three_arms_by_three_seeds():
    planned = quickstart_plan()
    assert [(p.arm, p.seed) for p in planned] == [(a, s) for a in ("grpo", "rloo", "ppo") for s in (0, 1, 2)]
    assert {(p.recipe.task, p.recipe.train.steps) for p in planned} == {("arithmetic_four", 60)}
    assert len(quickstart_plan(seeds=5)) == 15


# ---- the real CLI into a real store -----------------------------------------------------------


@pytest.fixture
def full_queue(tmp_path, monkeypatch):
    """A home whose only CPU slot is held by a live `sleep` posing as a running local run."""
    monkeypatch.setenv("WORKBENCH_HOME", str(tmp_path))
    with held_cpu_slot(tmp_path, local_principal()) as store:
        yield store


def test_cli_seeds_2_sweep_2_values_launches_exactly_4_runs(full_queue, tmp_path):
    res = cli(tmp_path, "launch", "grpo", "--seeds", "2", "--sweep", "algorithm.eps_high=0.2,0.28", "--group", "g",
              "--set", "train.steps=1", "--set", "train.mu=2")
    assert res.returncode == 0, res.stderr
    ids = res.stdout.split()
    assert len(ids) == 4
    arms = full_queue.arms("g")
    assert {arm: [r["seed"] for r in runs] for arm, runs in arms.items()} == {
        "grpo · eps_high=0.2": [0, 1], "grpo · eps_high=0.28": [0, 1]}
    for arm, runs in arms.items():
        for run in runs:  # what the run will train with is what the row says
            recipe = yaml.safe_load((Path(run["run_dir"]) / "recipe.yaml").read_text())
            assert (recipe["train"]["seed"], recipe["algorithm"]["eps_high"]) == (run["seed"], run["sweep"]["algorithm.eps_high"])
            assert arm.endswith(f"eps_high={run['sweep']['algorithm.eps_high']}") and run["status"] == "queued"
    assert sorted(r["id"] for runs in arms.values() for r in runs) == sorted(ids)

    listed = cli(tmp_path, "runs", "arms", "g")
    assert listed.returncode == 0, listed.stderr
    lines = listed.stdout.splitlines()
    assert lines[0] == "grpo · eps_high=0.2  (2 runs; seeds 0, 1)" and "grpo · eps_high=0.28  (2 runs; seeds 0, 1)" in lines
    assert sum(line.startswith("  grpo-") and "queued" in line for line in lines) == 4
    table = cli(tmp_path, "runs", "list", "--group", "g").stdout.splitlines()
    assert table[0].split()[:3] == ["id", "arm", "seed"] and len(table) == 5


def test_cli_launches_a_canned_experiment_as_its_page_does_into_numbered_groups(full_queue, tmp_path):
    from workbench.runs.experiments import experiment_plan, get_experiment

    experiment = get_experiment("smollm2-arithmetic")
    first = cli(tmp_path, "launch", "--experiment", "smollm2-arithmetic")
    assert first.returncode == 0, first.stderr
    arms = full_queue.arms("exp-smollm2-arithmetic-1")
    assert {arm: [r["seed"] for r in runs] for arm, runs in arms.items()} == {
        "grpo · lr=1e-07": [0, 1, 2], "grpo · lr=2e-05": [0, 1, 2]}
    planned = {(p.arm, p.seed): p.recipe.to_dict() for p in experiment_plan(experiment)}
    for arm, runs in arms.items():  # each run trains the experiment's recipe for its arm and seed, nothing else
        for run in runs:
            assert yaml.safe_load((Path(run["run_dir"]) / "recipe.yaml").read_text()) == planned[(arm, run["seed"])]
    second = cli(tmp_path, "launch", "--experiment", "smollm2-arithmetic", "--seeds", "2")
    assert second.returncode == 0, second.stderr
    assert len(second.stdout.split()) == 4 and len(full_queue.arms("exp-smollm2-arithmetic-2")) == 2


def test_cli_experiment_refuses_recipes_or_settings_beside_it_and_unknown_keys(full_queue, tmp_path):
    before = leftovers(tmp_path)
    assert_one_line_error(cli(tmp_path, "launch", "grpo", "--experiment", "mu-reuse"),
                          "--experiment='mu-reuse' takes no recipes", "an experiment fixes its recipes and settings")
    assert_one_line_error(cli(tmp_path, "launch", "--experiment", "mu-reuse", "--set", "train.steps=2"),
                          "takes no --set")
    assert_one_line_error(cli(tmp_path, "launch", "--experiment", "nope"), "experiment='nope' is not allowed",
                          "mu-reuse")
    assert_one_line_error(cli(tmp_path, "launch"), "launch needs recipes", "or --experiment KEY")
    assert_one_line_error(cli(tmp_path, "launch", "grpo", "--seeds", "0"), "seeds")
    assert leftovers(tmp_path) == before == ["blocker"]
    fresh = tmp_path / "fresh"  # a home with no store yet: no refused launch creates one
    fresh.mkdir()
    for argv, says in ((["--experiment", "nope"], "experiment='nope' is not allowed"),
                       (["grpo", "--seeds", "0"], "seeds"),
                       (["grpo", "--seeds", "2", "--name", "x"], "--name names one run"),
                       (["grpo", "--group", "g", "--name", "x"], "--name names one run"),
                       (["--experiment", "smollm2-arithmetic", "--name", "x"], "or --experiment, use --group")):
        assert_one_line_error(cli(fresh, "launch", *argv), says)
        assert not (fresh / "runs.db").exists() and leftovers(fresh) == [], argv


def test_cli_an_invalid_combination_launches_nothing(full_queue, tmp_path):
    before = leftovers(tmp_path)
    res = cli(tmp_path, "launch", "grpo", "rloo", "--seeds", "2", "--sweep", "algorithm.eps_high=0.2,-1")
    assert_one_line_error(res, "arm 'grpo · eps_high=-1' seed 0 is not allowed", "algorithm.eps_high=-1",
                          "greater than or equal to 0")
    assert leftovers(tmp_path) == before == ["blocker"]
    too_many = cli(tmp_path, "launch", "grpo", "rloo", "--seeds", "51")
    assert_one_line_error(too_many, "2 arms x 51 seeds = 102 runs", f"at most {MAX_RUNS_PER_LAUNCH} per launch")
    assert_one_line_error(cli(tmp_path, "launch", "grpo", "--sweep", "train.seed=1,2"), "use --seeds N")
    assert leftovers(tmp_path) == ["blocker"]


# ---- the store: arms, the long frame, migration -------------------------------------------------

SCORES = {"grpo": [0.5, 0.6, 0.7], "rloo": [0.1, 0.2, 0.3]}  # per seed: the final-window mean of reward


def _synthetic_group(store: RunStore, group: str = "g", steps: int = 10) -> None:
    """Finished runs of two arms x three seeds, metrics ingested as events. Reward is 0 except at the
    last two steps (score - 0.05, score + 0.05), so a 20 % window's mean is exactly the score."""
    for arm, scores in SCORES.items():
        for seed, score in enumerate(scores):
            run_id = f"{arm}-s{seed}"
            store.create_run(run_id=run_id, name=arm, algorithm=arm, recipe_yaml=f"name: {arm}\ntrain:\n  seed: {seed}\n",
                             total_steps=steps, target="local", launcher="local", host="localhost", created_by="t",
                             run_dir="/nonexistent", group=group, arm=arm)
            rewards = [0.0] * (steps - 2) + [score - 0.05, score + 0.05]
            store.ingest(run_id, [{"kind": "metrics", "step": t, "time": 1.0 + t, "metrics": {"reward": r, "kl": 0.01}}
                                  for t, r in enumerate(rewards)])
            store.set_status(run_id, "finished")
    store.create_run(run_id="other", name="grpo", algorithm="grpo", recipe_yaml="name: grpo\n", total_steps=steps,
                     target="local", launcher="local", host="localhost", created_by="t", run_dir="/nonexistent",
                     group="elsewhere")
    store.set_status("other", "finished")


def test_arms_and_the_long_frame_feed_pairwise(tmp_path):
    store = RunStore(tmp_path / "runs.db")
    _synthetic_group(store)
    arms = store.arms("g")
    assert {arm: [(r["id"], r["seed"]) for r in runs] for arm, runs in arms.items()} == {
        "grpo": [("grpo-s0", 0), ("grpo-s1", 1), ("grpo-s2", 2)], "rloo": [("rloo-s0", 0), ("rloo-s1", 1), ("rloo-s2", 2)]}
    assert store.arms("nope") == {}
    frame = store.arm_metrics([r["id"] for runs in arms.values() for r in runs])
    assert list(frame.columns[:5]) == ["run_id", "arm", "seed", "step", "time"] and len(frame) == 60
    assert set(frame.columns[5:]) == {"reward", "kl"}
    scores = final_window_values(frame, "reward", 0.2)
    assert {arm: [round(v, 12) for v in values] for arm, values in scores.items()} == SCORES
    pair = pairwise(scores).iloc[0]
    # Welch by hand: diff 0.4, s_a^2 = s_b^2 = 0.01, se = sqrt(2 * 0.01 / 3), nu = 4, t_{0.975,4} = 2.776445
    half = 2.7764451051977987 * math.sqrt(0.02 / 3)
    assert (pair["a"], pair["b"]) == ("grpo", "rloo")
    assert pair["diff"] == pytest.approx(0.4)
    assert (pair["diff_ci_low"], pair["diff_ci_high"]) == (pytest.approx(0.4 - half), pytest.approx(0.4 + half))
    assert pair["p_improvement"] == 1.0 and pair["verdict"] == "grpo > rloo: the interval excludes 0"


def test_store_file_without_arms_gains_arm_and_seed_from_its_runs(tmp_path):
    """A file made before arms (and before skipped_events and warnings): its runs' arm is their name,
    their seed their recipe's."""
    path = tmp_path / "runs.db"
    with sqlite3.connect(path) as db:
        db.execute(OLDEST_RUNS_TABLE)
        rows = [("a", "grpo", "name: grpo\ntrain:\n  seed: 7\n"), ("b", "rloo", "name: rloo\n"), ("c", "ppo", "not: [valid")]
        for i, (run_id, name, recipe) in enumerate(rows):
            db.execute("INSERT INTO runs (id, name, algorithm, status, target, launcher, host, created_by, created_at, grp,"
                       " recipe, run_dir, total_steps) VALUES (?,?,?,'finished','local','local','h','t',?, 'old', ?, '/x', 3)",
                       (run_id, name, name, float(i), recipe))
    store = RunStore(path)
    assert [(r["id"], r["arm"], r["seed"], r["sweep"], r["warnings"]) for r in store.runs()] == [
        ("a", "grpo", 7, {}, []), ("b", "rloo", 0, {}, []), ("c", "ppo", None, {}, [])]
    assert list(store.arms("old")) == ["grpo", "rloo", "ppo"]
    assert list(store.list_runs()[["arm", "seed"]].iloc[-1]) == ["grpo", 7]
    RunStore(path)  # opening it again changes nothing
    assert store.get_run("a")["seed"] == 7


# ---- compare: the verdict table on the command line --------------------------------------------


def test_compare_prints_the_verdict_table(tmp_path):
    _synthetic_group(RunStore(tmp_path / "runs.db"))
    res = cli(tmp_path, "compare", "g", "--window", "0.2")
    assert res.returncode == 0, res.stderr
    out = res.stdout.splitlines()
    assert out[0].startswith("reward: mean over the last 0.2")
    grpo = next(line.split() for line in out if line.split()[:1] == ["grpo"])
    assert grpo[:3] == ["grpo", "3", "0.6000"]
    verdict = next(line for line in out if line.strip().startswith("grpo") and "rloo" in line)
    half = 2.7764451051977987 * math.sqrt(0.02 / 3)
    assert verdict.split()[:5] == ["grpo", "rloo", "0.4000", f"{0.4 - half:.4f}", f"{0.4 + half:.4f}"]
    assert verdict.rstrip().endswith("grpo > rloo: the interval excludes 0")
    assert_one_line_error(cli(tmp_path, "compare", "g", "--metric", "entropy"), "metric='entropy'", "logged: reward, kl")
    assert_one_line_error(cli(tmp_path, "compare", "nope"), "group='nope' has no runs", "g")
    assert_one_line_error(cli(tmp_path, "compare", "g", "--window", "2"), "window_frac=2.0")


def test_a_group_keeps_its_arms_honest(full_queue):
    """More seeds of an arm may join its group; the same label for another recipe, or a seed the arm
    already has (a copy, not a replicate), is refused and nothing is launched."""
    from workbench.runs import launch_planned

    first = launch_planned(plan_runs(["grpo"], seeds=2), group="g", principal=local_principal(), store=full_queue)
    other = plan_runs(["grpo"], overrides=["algorithm.eps_high=0.3"])
    with pytest.raises(RunError, match=r"already has arm 'grpo' with algorithm.eps_high=0.2, this launch has algorithm.eps_high=0.3"):
        launch_planned(other, group="g", principal=local_principal(), store=full_queue)
    with pytest.raises(RunError, match=r"arm 'grpo' with seed\(s\) \[0, 1\].*--set train.seed=2"):
        launch_planned(plan_runs(["grpo"], seeds=3), group="g", principal=local_principal(), store=full_queue)
    assert sorted(r["id"] for r in full_queue.arms("g")["grpo"]) == sorted(first)
    more = launch_planned(plan_runs(["grpo"], seeds=2, overrides=["train.seed=2"]), group="g", principal=local_principal(), store=full_queue)
    assert [r["seed"] for r in full_queue.arms("g")["grpo"]] == [0, 1, 2, 3] and len(more) == 2
