"""The behaviour forwards (old / reference log-probs, values, KL) run while the reward functions score
(``Trainer.sample(step, alongside_scoring=...)``), on the built-in tiny model, one thread: a reward that
can only finish once the forwards started does finish, the rewards stay on the main thread (SIGALRM
timeouts), and the numbers equal scoring first and forwarding after, bit for bit."""

import threading

import pytest
import torch

from tests.engine import overlap_rewards
from workbench.engine.rewards import RewardFunctionError
from workbench.engine.trainer import Trainer
from workbench.recipe import load_recipe

WAITING = "reward_funcs=['tests.engine.overlap_rewards:waits_for_the_forwards']"


def _trainer(few_problems, path, *overrides):
    """The rloo preset (a reference model: KL k1 in the reward) on the four problems, one thread."""
    t = Trainer(load_recipe("rloo", [f"dataset={few_problems}", "train.steps=1", "train.threads=1", *overrides]), path)
    t.setup()
    return t


def test_the_rewards_score_while_the_forwards_run_and_give_the_same_numbers(wb_home, few_problems, tmp_path):
    overlap_rewards.FORWARDS_STARTED.clear()
    overlap_rewards.SCORED_ON.clear()
    overlap_rewards.SAW_FORWARDS.clear()
    t = _trainer(few_problems, tmp_path / "overlapped", WAITING)
    forwarded_on = []

    def forwards(out):
        forwarded_on.append(threading.current_thread().name)
        overlap_rewards.FORWARDS_STARTED.set()
        return t.behaviour_forwards(out)

    overlapped = t.sample(0, forwards)
    # the reward waited for the forwards (at most 60 s): scoring first and forwarding after, it waits in vain
    assert overlap_rewards.SAW_FORWARDS == [True]
    assert overlap_rewards.SCORED_ON == [threading.main_thread().name]
    assert forwarded_on and forwarded_on[0].startswith("behaviour-forwards")

    overlap_rewards.FORWARDS_STARTED.set()  # one after the other: the reward does not wait
    s = _trainer(few_problems, tmp_path / "sequential", WAITING)
    sequential = s.sample(0)
    forwards_after = s.behaviour_forwards(sequential.out)
    assert torch.equal(overlapped.rewards, sequential.rewards)
    for name, got, want in zip(forwards_after._fields, overlapped.alongside, forwards_after):
        assert (got is None) == (want is None), name
        if want is not None:
            torch.testing.assert_close(got, want, atol=0, rtol=0, msg=name)
    assert overlapped.alongside.ref_logp is not None and overlapped.alongside.kl is not None  # rloo's KL in the reward
    # and the step's batch from them equals the batch computed in one go
    batch, _ = t.prepare_batch(overlapped.out, overlapped.rewards, None, overlapped.alongside)
    again, _ = s.prepare_batch(sequential.out, sequential.rewards)
    for name in ("advantages", "old_logp", "ref_logp", "loss_mask"):
        torch.testing.assert_close(getattr(batch, name), getattr(again, name), atol=0, rtol=0, msg=name)


def test_a_reward_that_raises_while_the_forwards_run_fails_the_step_naming_it(wb_home, few_problems, tmp_path):
    t = _trainer(few_problems, tmp_path, "reward_funcs=['tests.engine.faulty_rewards:raises_at_step_2']")
    assert t.sample(0, t.behaviour_forwards).alongside.old_logp is not None
    with pytest.raises(RewardFunctionError, match="raises_at_step_2"):
        t.sample(2, t.behaviour_forwards)
