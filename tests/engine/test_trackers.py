"""Trackers through accelerate: ``logging.log_with=[tensorboard]`` receives the very metric dict
of the run's own event stream, step for step (read back from the TensorBoard event files)."""

import struct

import pytest
from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

from tests.engine.test_trainer import metrics_of
from workbench.engine.trainer import Trainer, tracker_config
from workbench.recipe import load_recipe

STEPS = 4


def as_float32(x: float) -> float:
    """TensorBoard stores scalars as float32: the value it must hold for ``x``."""
    return struct.unpack("f", struct.pack("f", x))[0]


@pytest.fixture(scope="module")
def tensorboard_run(wb_home, few_problems, tmp_path_factory):
    run_dir = tmp_path_factory.mktemp("tb")
    recipe = load_recipe("grpo", [f"dataset={few_problems}", f"train.steps={STEPS}", "logging.log_with=[tensorboard]"])
    assert Trainer(recipe, run_dir).run() == "finished"
    # accelerate's tracker writes scalars to <run dir>/<recipe name>/ (and the hparams of the
    # recipe to a timestamped sub-directory of it)
    acc = EventAccumulator(str(run_dir / recipe.name), size_guidance={"scalars": 0})  # 0 = keep every point
    acc.Reload()
    return run_dir, acc


def test_reward_per_step_equals_the_event_stream(tensorboard_run):
    run_dir, acc = tensorboard_run
    events = metrics_of(run_dir)
    assert [m["step"] for m in events] == list(range(STEPS))
    board = [(s.step, s.value) for s in acc.Scalars("reward")]
    assert board == [(m["step"], as_float32(m["reward"])) for m in events]
    assert len({v for _, v in board}) > 1  # real per-step values, not one repeated number


def test_every_metric_of_the_event_stream_is_a_tensorboard_scalar(tensorboard_run):
    run_dir, acc = tensorboard_run
    events = metrics_of(run_dir)
    tags = set(acc.Tags()["scalars"])
    names = set().union(*events) - {"step"}  # step is the x axis, not a scalar
    assert names == tags, names ^ tags
    for name in ("kl", "loss/policy", "completions/mean_length", "sampling/sampling_logp_difference/max"):
        assert [s.value for s in acc.Scalars(name)] == [as_float32(m[name]) for m in events], name


def test_tracker_config_is_flat_scalars():
    """TensorBoard's hparams take only int / float / str / bool: nested sections become
    ``section.field`` keys, None and lists their text."""
    cfg = {"name": "grpo", "reward_weights": None, "algorithm": {"kl_coef": 0.04, "critic": False, "clip_c": None},
           "optim": {"betas": [0.9, 0.999], "lr": 0.001}, "logging": {"log_with": ["tensorboard"]}}
    assert tracker_config(cfg) == {
        "name": "grpo", "reward_weights": "None", "algorithm.kl_coef": 0.04, "algorithm.critic": False,
        "algorithm.clip_c": "None", "optim.betas": "[0.9, 0.999]", "optim.lr": 0.001, "logging.log_with": "['tensorboard']",
    }


def test_the_recipe_reaches_tensorboard_as_hparams(tensorboard_run):
    run_dir, _ = tensorboard_run
    (hparams,) = list((run_dir / "grpo").glob("*/hparams.yml"))
    text = hparams.read_text()
    assert "algorithm.kl_coef: 0.04" in text and "sampling.num_generations: 8" in text
