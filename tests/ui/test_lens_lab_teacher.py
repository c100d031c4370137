"""The lens lab on a real run with a teacher (launched through workbench.runs, tiny model and the
built-in tiny teacher): the OPD-shaped row of the run's estimator appears in both figures, as the run."""

import pytest

from tests.ui.test_labs import chart, lab, launched_run


@pytest.fixture(scope="module")
def teacher_run(tmp_path_factory, tiny_model_dir):
    """GRPO + OPD (the opd preset), 2 steps, lens every step; the teacher is built inside the run's
    subprocess on first use (~40 s)."""
    yield from launched_run(tmp_path_factory, tiny_model_dir, "lens-teacher", "opd",
                            ["train.steps=2", "logging.lens_every=1", "sampling.prompts_per_step=2",
                             "sampling.num_generations=4"])


def test_lens_lab_shows_the_opd_shaped_row_of_a_teacher_run(teacher_run):
    from workbench.core import POLICY_LOSSES

    store, run_id = teacher_run
    lenses = store.lens(run_id)  # the store hands the shaped rows on as the engine wrote them
    assert [lens["step"] for lens in lenses] == [0, 1]
    assert all(lens["run"]["advantage"] == "grpo + opd" for lens in lenses)
    assert lenses[0]["teacher"] == {"shaping": "opd", "coef": 0.1, "discount": 0.0, "mode": "shaped"}
    at = lab("lab-lens").run()
    at.selectbox(key="lens_run").select(run_id).run()
    assert not at.exception
    at.segmented_control(key="lens_top").set_value("all").run()  # the top 8 lines by default
    names = {t["name"] for t in chart(at, "lens_over_run")["data"]}
    assert "grpo + opd x clip (this run)" in names and "grpo x clip" in names
    assert {f"grpo + opd x {loss}" for loss in POLICY_LOSSES.names() if loss != "clip"} <= names
    heat = chart(at, "lens_heatmap")["data"][0]
    assert heat["y"][0] == "grpo + opd" and "grpo" in heat["y"]
    assert any("'grpo + opd' is grpo's advantage shaped by opd, A - lambda D, with lambda = 0.1 and D = d" in c.value
               for c in at.caption)
