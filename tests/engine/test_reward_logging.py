"""Reward functions' log_extra / log_metric, as TRL 1.16 hands them to reward functions
(GRPOTrainer._calculate_rewards: reward_kwargs["log_extra"], reward_kwargs["log_metric"])."""

import math

import pytest

from tests.engine.logging_rewards import exact_with_logs, exact_without_logging_kwargs
from workbench.engine.events import read_events
from workbench.engine.rewards import RewardFunctionError, RewardLogs, compute_rewards
from workbench.engine.trainer import train
from workbench.recipe import load_recipe

PROMPTS = ["3+2=", "7-4="]
COMPLETIONS = [" 5 ", "4"]
COLUMNS = {"answer": ["5", "3"]}


def test_compute_rewards_collects_what_the_functions_log():
    logs = RewardLogs(2)
    total, per_fn = compute_rewards([exact_with_logs, exact_without_logging_kwargs], None, PROMPTS, COMPLETIONS,
                                    [[1], [2]], COLUMNS, logs=logs)
    assert total.tolist() == [2.0, 0.0]
    assert logs.extra == {"stripped": ["5", "4"], "n_chars": [3, 1]}
    # (3 + 1) / 2 = 2 chars; 1.0 and 3.0 logged under one name: both kept (the trainer's step
    # metric is their mean, 2.0, checked in the run below)
    assert logs.metrics == {"custom/mean_chars": [2.0], "custom/twice": [1.0, 3.0]}


def test_the_callables_reach_only_functions_that_take_them():
    # without **kwargs or those parameter names a function gets neither callable (it would raise
    # TypeError on the unexpected keyword otherwise); with no collector the logs are discarded
    total, _ = compute_rewards([exact_without_logging_kwargs], None, PROMPTS, COMPLETIONS, [[1], [2]], COLUMNS)
    assert total.tolist() == [1.0, 0.0]


@pytest.mark.parametrize("call, message", [
    (lambda log_extra, log_metric: log_extra("x", [1]), r"log_extra\('x'\) got 1 values; expected 2"),
    (lambda log_extra, log_metric: log_extra("reward", [1, 2]), "other than prompt, completion, reward"),
    (lambda log_extra, log_metric: log_metric("m", math.nan), r"log_metric\('m', nan\)"),
    (lambda log_extra, log_metric: log_metric("m", "high"), r"log_metric\('m', 'high'\)"),
])
def test_bad_logging_names_the_function_and_what_is_allowed(call, message):
    def bad_logger(prompts, completions, completion_ids, **kwargs):
        call(kwargs["log_extra"], kwargs["log_metric"])
        return [0.0] * len(prompts)

    with pytest.raises(RewardFunctionError, match=message) as err:
        compute_rewards([bad_logger], None, PROMPTS, COMPLETIONS, [[1], [2]], COLUMNS, logs=RewardLogs(2))
    assert "bad_logger" in str(err.value)


def test_a_run_logs_the_metrics_under_their_names_and_the_columns_in_its_samples(few_problems, tmp_path):
    from workbench.runs import RunStore

    recipe = load_recipe("grpo", [f"dataset={few_problems}", "train.steps=2", "logging.samples_per_step=32",
                                  "reward_funcs=['tests.engine.logging_rewards:exact_with_logs']"])
    assert recipe.batch_size == 32  # every completion of the step is a sample: the metric is checkable exactly
    assert train(recipe, tmp_path / "run") == "finished"
    events = read_events(tmp_path / "run")
    metrics = [e["metrics"] for e in events if e["kind"] == "metrics"]
    samples = [e["samples"] for e in events if e["kind"] == "samples"]
    assert len(metrics) == len(samples) == 2
    for m, rows in zip(metrics, samples):
        assert m["custom/twice"] == 2.0
        assert m["custom/mean_chars"] == pytest.approx(sum(len(r["completion"]) for r in rows) / 32)
        assert [r["stripped"] for r in rows] == [r["completion"].strip() for r in rows]
        assert [r["n_chars"] for r in rows] == [len(r["completion"]) for r in rows]
    # the run store (a real SQLite file) keeps the extra columns beside the built-in ones
    store = RunStore(tmp_path / "runs.db")
    store.create_run(run_id="r1", name="grpo", algorithm="grpo", recipe_yaml="name: grpo\n", total_steps=2,
                     target="local", launcher="local", host="localhost", created_by="t", run_dir=str(tmp_path / "run"))
    store.ingest("r1", events)
    frame = store.samples("r1", step=1)
    assert list(frame.columns[-2:]) == ["stripped", "n_chars"]
    assert frame.stripped.tolist() == [r["completion"].strip() for r in samples[1]]
