"""Held-out evaluation on the tiny model: when it runs, what it logs, what it never changes."""

from __future__ import annotations

import json

import pytest
import torch

from workbench.engine.evaluation import correct_index, eval_due, pass_at_k
from workbench.engine.events import read_events
from workbench.engine.rewards import load_reward_function
from workbench.engine.trainer import Trainer, load_splits, parameter_digest
from workbench.recipe import Recipe, RecipeError

EVAL_KEYS = {"eval/pass@1", "eval/pass@k", "eval/reward", "eval/mean_length", "eval/num_prompts", "eval/updates"}


def metrics_by_step(run_dir):
    return {e["step"]: e["metrics"] for e in read_events(run_dir) if e["kind"] == "metrics"}


def test_pass_at_k_is_the_unbiased_estimator():
    # 1 - C(n-c, k) / C(n, k), by hand
    assert pass_at_k(4, 1, 2) == pytest.approx(1 - 3 / 6)
    assert pass_at_k(5, 2, 3) == pytest.approx(1 - 1 / 10)
    assert pass_at_k(4, 0, 4) == 0.0 and pass_at_k(4, 1, 4) == 1.0  # n = k: any correct one
    assert pass_at_k(3, 2, 2) == 1.0  # fewer than k wrong samples
    with pytest.raises(ValueError, match="k=5, n=4"):
        pass_at_k(4, 1, 5)


def test_eval_steps_and_the_correctness_reward():
    assert [s for s in range(7) if eval_due(s, 3)] == [0, 3, 6]
    assert not any(eval_due(s, 0) for s in range(5))
    funcs = [load_reward_function("format"), load_reward_function("exact_match")]
    assert correct_index(funcs, "exact_match") == 1  # the task's verifier, wherever it is
    assert correct_index(funcs, "reasoning_gym") == 0  # not among the run's functions: the first


def tiny_recipe(*overrides):
    return Recipe().with_overrides([
        "train.steps=5", "sampling.num_generations=4", "sampling.prompts_per_step=2", "logging.diagnostics_every=0",
        "logging.samples_per_step=8", *overrides])


def test_eval_runs_at_step_0_every_n_and_at_the_end_on_held_out_prompts(wb_home, tmp_path):
    recipe = tiny_recipe("task=arithmetic", "eval.every=2", "eval.num_prompts=6", "eval.pass_k=3")
    train_rows, eval_rows = load_splits(recipe)
    held_out = {row["prompt"] for row in eval_rows}
    assert len(held_out) == 6 and not held_out & {row["prompt"] for row in train_rows}

    assert Trainer(recipe, tmp_path).run() == "finished"
    metrics = metrics_by_step(tmp_path)
    # steps 0 and 2 hold the policy that sampled them; the last line holds the final policy
    assert {s: m.get("eval/updates") for s, m in metrics.items()} == {0: 0.0, 1: None, 2: 2.0, 3: None, 4: 5.0}
    for step in (0, 2, 4):
        m = metrics[step]
        assert EVAL_KEYS <= set(m) and m["eval/num_prompts"] == 6
        assert all(v in {i / 6 for i in range(7)} for v in (m["eval/pass@1"], m["eval/pass@k"]))
        assert 1 <= m["eval/mean_length"] <= recipe.sampling.max_completion_length
        assert 0 <= m["eval/reward"] <= 1.2  # exact_match + 0.2 format
    trained = {s["prompt"] for e in read_events(tmp_path) if e["kind"] == "samples" for s in e["samples"]}
    assert trained and not trained & held_out


def test_eval_changes_nothing_in_training(wb_home, few_problems, tmp_path):
    """Same recipe with eval off and on (its prompts from eval.dataset, so the training pool is the
    same): bit-identical parameters and identical training metrics at every step."""
    held_out = tmp_path / "held_out.jsonl"
    held_out.write_text("".join(json.dumps({"prompt": p, "answer": a}) + "\n" for p, a in [("2+2=", "4"), ("8-3=", "5")]))
    base = ["task=arithmetic", f"dataset={few_problems}", "train.steps=4", "train.mu=2"]
    runs = {}
    for every in (0, 1):
        recipe = tiny_recipe(*base, f"eval.every={every}", f"eval.dataset={held_out}", "eval.num_prompts=2", "eval.pass_k=2")
        trainer = Trainer(recipe, tmp_path / f"eval{every}")
        assert trainer.run() == "finished"
        runs[every] = (parameter_digest(trainer.accelerator.unwrap_model(trainer.policy)), metrics_by_step(tmp_path / f"eval{every}"))
    (digest_off, off), (digest_on, on) = runs[0], runs[1]
    assert all(EVAL_KEYS <= set(m) for m in on.values()) and not any(EVAL_KEYS & set(m) for m in off.values())
    assert digest_on == digest_off
    for step in off:
        for key in ("reward", "loss/policy", "grad_norm", "completions/mean_length", "kl"):
            assert on[step][key] == off[step][key], (step, key)


def test_eval_rng_is_its_own(wb_home, tmp_path):
    """Evaluating leaves torch's global generator where it was."""
    recipe = tiny_recipe("task=arithmetic", "eval.every=1", "eval.num_prompts=2", "eval.pass_k=2", "train.steps=1")
    trainer = Trainer(recipe, tmp_path)
    trainer.setup()
    torch.manual_seed(123)
    expected = torch.rand(3)
    torch.manual_seed(123)
    first = trainer.evaluate(0)
    assert torch.equal(torch.rand(3), expected)
    assert {k: v for k, v in trainer.evaluate(0).items() if k != "perf/eval_time"} == \
        {k: v for k, v in first.items() if k != "perf/eval_time"}  # fixed eval seeds: same draws each time


@pytest.mark.parametrize(("overrides", "message"), [
    (["eval.every=-1"], "eval.every=-1"),
    (["eval.pass_k=0"], "eval.pass_k=0"),
    (["eval.temperature=0"], "eval.temperature=0"),
    (["eval.num_prompts=100000"], "eval.num_prompts=100000"),
    (["dataset=x.jsonl", "eval.every=5"], "eval.every=5 with dataset='x.jsonl': set eval.dataset"),
])
def test_bad_eval_settings_name_the_field(overrides, message):
    with pytest.raises(RecipeError, match=message.replace(".", r"\.").replace("(", r"\(")):
        Recipe().with_overrides(overrides)


def test_a_fixed_set_task_has_nothing_to_hold_out(wb_home, tmp_path):
    recipe = tiny_recipe("task=arithmetic_four", "eval.every=1", "eval.num_prompts=4")
    with pytest.raises(ValueError, match="eval.num_prompts=4: task 'arithmetic_four' has no prompt left to train on"):
        load_splits(recipe)


def test_an_evaluation_at_the_defaults_costs_at_most_one_steps_generation():
    """num_prompts x (1 greedy + pass_k sampled) completions <= prompts_per_step x G (issue 20: a
    step-0 eval of 32 prompts x 5 took 161 s of a 441 s SmolLM2 run)."""
    r = Recipe()
    assert r.eval.num_prompts * (1 + r.eval.pass_k) <= r.sampling.prompts_per_step * r.sampling.num_generations
