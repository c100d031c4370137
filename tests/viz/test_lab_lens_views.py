"""The lens views on lens payloads shaped as the engine writes them: the line chart's default top
rows and the sentence for an empty heatmap row."""

import json
import math

import pytest

from workbench.viz.lab_lens import DEFAULT_TOP, empty_rows, lens_frame, lens_over_run_figure, top_combos

ESTIMATORS = ("grpo", "rloo", "grpo_passk", "opo")
LOSSES = ("clip", "gspo", "cispo")


def payload(step: int, cos: dict[str, float | None], grad: dict[str, float]) -> dict:
    """One lens event: every estimator x loss at 'before', the run = grpo x clip."""
    rows = [{"advantage": a, "policy_loss": p, "loss": 0.1, "grad_norm": grad[a], "cos_run": cos[a],
             "cos_update": cos[a], "zero_grad": 0.0} for a in ESTIMATORS for p in LOSSES]
    return {"step": step, "run": {"advantage": "grpo", "policy_loss": "clip"}, "points": {"before": rows}}


def frame():
    grad = {"grpo": 1.0, "rloo": 1.0, "grpo_passk": 0.0, "opo": 1.0}
    return lens_frame([payload(0, {"grpo": 1.0, "rloo": -0.9, "grpo_passk": None, "opo": 0.2}, grad),
                       payload(1, {"grpo": 0.1, "rloo": -0.95, "grpo_passk": None, "opo": 0.5}, grad)])


def test_top_combos_are_the_largest_at_the_last_step_and_the_runs_own():
    f = frame()
    part = f[f["point"] == "before"]
    top = top_combos(part, "cos_run", 4)
    # |cos| at step 1: rloo 0.95 (x3 losses), opo 0.5, grpo 0.1 (the run's own, kept), passk NaN (last)
    assert top == ["rloo x clip", "rloo x gspo", "rloo x cispo", "grpo x clip"]
    assert len(top_combos(part, "cos_run", None)) == len(ESTIMATORS) * len(LOSSES)
    fig = json.loads(lens_over_run_figure(f, "cos_run", "before", top=DEFAULT_TOP).to_json())
    assert len(fig["data"]) == DEFAULT_TOP and "grpo x clip (this run)" in {t["name"] for t in fig["data"]}
    assert len(json.loads(lens_over_run_figure(f, "cos_run").to_json())["data"]) == len(ESTIMATORS) * len(LOSSES)


def test_an_empty_heatmap_row_says_why():
    """grpo_passk's row was blank without a word: its advantages were all 0 (ties for each group's
    best), so its gradient is 0 and a cosine is undefined."""
    f = frame()
    why = empty_rows(f, 1, "cos_run", "before")
    assert list(why) == ["grpo_passk"]
    assert why["grpo_passk"] == ("its gradient is 0 on this batch: every advantage it gave is 0, and no other term "
                                 "of the run's objective moves the weights here, so there is no direction to take a "
                                 "cosine of")
    assert empty_rows(f, 1, "grad_norm", "before") == {}  # a 0 norm is a value, not a blank
    f.loc[f["advantage"] == "opo", "cos_update"] = math.nan
    assert empty_rows(f, 0, "cos_update")["opo"].startswith("the step made no update")
    with pytest.raises(ValueError, match="lens metric='nope' is not allowed"):
        empty_rows(f, 0, "nope")
