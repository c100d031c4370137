"""Adaptive entropy control and TRL's off-policy sequence mask in real runs of the tiny model
(one CPU thread: runs repeat exactly)."""

import shutil

import pytest

from workbench.engine.events import read_events
from workbench.engine.trainer import train
from workbench.recipe import load_recipe

ENTROPY = ["algorithm.use_adaptive_entropy=true", "algorithm.entropy_coef_delta=0.01", "algorithm.entropy_coef_max=0.02"]


def _run(few_problems, path, *overrides, steps=3):
    recipe = load_recipe("grpo", [f"dataset={few_problems}", f"train.steps={steps}", "train.threads=1", *overrides])
    assert train(recipe, path) == "finished"
    return {e["step"]: e["metrics"] for e in read_events(path) if e["kind"] == "metrics"}


def test_entropy_coefficient_rises_below_the_target_and_the_bonus_starts_after_the_first_measurement(few_problems, tmp_path):
    plain = _run(few_problems, tmp_path / "plain")
    # every entropy of the tiny model is below a target of 100 nats: +0.01 per update up to 0.02
    high = _run(few_problems, tmp_path / "high", *ENTROPY, "algorithm.entropy_target=100")
    assert [high[s]["entropy_coef"] for s in range(3)] == pytest.approx([0.01, 0.02, 0.02])
    assert "entropy_coef" not in plain[0]
    # step 0's update applies no bonus (nothing measured yet, TRL's start) and step 1 is sampled
    # by the same weights; step 1's update applies 0.01, so step 2 samples another policy
    for step in (0, 1):
        assert {k: high[step][k] for k in ("reward", "entropy", "loss/policy")} == \
               {k: plain[step][k] for k in ("reward", "entropy", "loss/policy")}
    assert high[2]["entropy"] != plain[2]["entropy"]


def test_entropy_coefficient_falls_above_the_target_to_its_floor(few_problems, tmp_path):
    low = _run(few_problems, tmp_path / "low", *ENTROPY, "algorithm.entropy_target=0", "algorithm.entropy_coef=0.015",
               "algorithm.entropy_coef_min=0.001")
    assert [low[s]["entropy_coef"] for s in range(3)] == pytest.approx([0.005, 0.001, 0.001])


def resumed_after_step_1(straight, cut) -> dict[int, dict]:
    """Resume, in ``cut``, a run that stopped after the step-1 checkpoint of the run in ``straight``
    (its recipe, that checkpoint and the events up to it); its metrics by step."""
    (cut / "checkpoints").mkdir(parents=True)
    shutil.copy(straight / "recipe.yaml", cut / "recipe.yaml")
    shutil.copytree(straight / "checkpoints" / "step-00000001", cut / "checkpoints" / "step-00000001")
    lines = (straight / "events.jsonl").read_text().splitlines(keepends=True)
    (cut / "events.jsonl").write_text("".join(line for line in lines if '"step": 0' in line or '"step": 1,' in line))
    assert train(load_recipe(str(cut / "recipe.yaml")), cut, resume=True) == "finished"
    return {e["step"]: e["metrics"] for e in read_events(cut) if e["kind"] == "metrics"}


def test_resume_restores_the_entropy_controller_exactly(few_problems, tmp_path):
    overrides = [*ENTROPY, "algorithm.entropy_target=100", "algorithm.entropy_coef_delta=0.004", "checkpoint.every=2",
                 "checkpoint.keep_last=2"]
    straight = _run(few_problems, tmp_path / "straight", *overrides, steps=4)
    resumed = resumed_after_step_1(tmp_path / "straight", tmp_path / "cut")
    assert [straight[s]["entropy_coef"] for s in range(4)] == pytest.approx([0.004, 0.008, 0.012, 0.016])
    for step in (2, 3):
        drop = lambda m: {k: v for k, v in m.items() if not k.startswith("perf/")}  # noqa: E731
        assert drop(resumed[step]) == drop(straight[step])


def test_off_policy_mask_threshold_masks_only_when_the_drift_exceeds_it(few_problems, tmp_path):
    base = ["train.mu=2"]
    off = _run(few_problems, tmp_path / "off", *base, steps=2)
    never = _run(few_problems, tmp_path / "never", *base, "algorithm.off_policy_mask_threshold=100", steps=2)  # the bound: 100 nats
    strict = _run(few_problems, tmp_path / "strict", *base, "algorithm.off_policy_mask_threshold=0", steps=2)
    drop = lambda m: {k: v for k, v in m.items() if not k.startswith("perf/")}  # noqa: E731
    assert drop(never[1]) == drop(off[1])  # a threshold nothing exceeds changes nothing
    # threshold 0: the second pass drops every A < 0 sequence the first update moved away from
    assert strict[0]["loss/policy"] != off[0]["loss/policy"]
