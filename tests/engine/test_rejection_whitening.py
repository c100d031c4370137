"""A reinforce_pp run with token-level rollout rejection whitens over the kept tokens only, as
verl's driver (rejection holes response_mask before compute_advantage): the built-in tiny model's
step-0 prompts with completions of 1..6 tokens (fixed, not sampled) and a hole punched at token 1
of every completion."""

import math

import pytest
import torch

from tests.engine.fixed_rollouts import cycling_lengths, rollout_of_lengths
from workbench.engine.trainer import Trainer
from workbench.recipe import load_recipe


def holed_step(few_problems, tmp_path):
    """A reinforce_pp trainer with token_k1 rejection at max e^0.25 and its step-0 prompts with
    completions of lengths 1, 2, ..., 6, 1, ... (``rollout_of_lengths``), whose rollout log-probs
    are the trainer's own raised by 0.1 on every token and by 0.5 on token 1: k1 = 0.1 or 0.5, so
    token 1 alone is rejected. -> (trainer, rollout, positions)."""
    recipe = load_recipe("grpo", [f"dataset={few_problems}", "algorithm.advantage=reinforce_pp", "algorithm.kl_coef=0",
                                  "algorithm.rollout_rejection=token_k1", f"algorithm.rollout_rejection_max={math.exp(0.25)}",
                                  "train.threads=1"])
    t = Trainer(recipe, tmp_path)
    t.setup()
    _, sampled = t.rollout(0)
    out = rollout_of_lengths(t, sampled, cycling_lengths(sampled.prompt_ids.shape[0], 6))
    position = torch.arange(out.completion_mask.shape[1], dtype=out.rollout_logp.dtype)[None, :]
    out.rollout_logp = out.rollout_logp + torch.where(position == 1, 0.5, 0.1) * out.completion_mask
    return t, out, position


def test_reinforce_pp_with_token_rejection_whitens_over_kept_tokens(wb_home, few_problems, tmp_path):
    t, out, position = holed_step(few_problems, tmp_path)
    mask = out.completion_mask
    rewards = torch.linspace(0.0, 1.0, mask.shape[0])
    batch, _ = t.prepare_batch(out, rewards)
    kept = (mask * (position != 1)).bool()
    assert (mask.bool() & ~kept).any() and (mask.sum(1) == 1).any()  # holed rows and one-token rows
    torch.testing.assert_close(batch.loss_mask, kept.to(batch.loss_mask.dtype))
    a = batch.advantages.double()
    assert a[kept].mean().item() == pytest.approx(0.0, abs=1e-6)
    assert a[kept].std().item() == pytest.approx(1.0, abs=1e-4)  # masked_whiten: unbiased variance, as verl
    assert torch.all(a[~kept] == 0)
    # the return resets at the hole (verl): token 0 sees only its own reward, which is 0 under no KL,
    # so every kept token 0 carries the same advantage (-mean / std)
    first = a[:, 0][mask[:, 1].bool()]  # rows of 2+ tokens: their reward sits at or after the hole
    torch.testing.assert_close(first, torch.full_like(first, first[0].item()))


def test_the_lens_rows_see_the_runs_rejection(wb_home, few_problems, tmp_path):
    """The lens compares every estimator on the run's batch; under rollout rejection each row is what
    a run with that estimator would train on: the row of the run's own estimator (reinforce_pp, whose
    whitening and return read the keep-mask) equals the advantages the run trained on, and a row
    without the keep-mask differs from it."""
    from workbench.engine.lens import lens_advantages

    t, out, _ = holed_step(few_problems, tmp_path)
    batch, g = t.prepare_batch(out, torch.linspace(0.0, 1.0, out.completion_mask.shape[0]))
    assert g.keep is not None and (g.keep * g.mask).sum() < g.mask.sum()
    rows = lens_advantages(g.rewards, g.mask, t.advantage_config(), kl=g.kl, keep=g.keep)
    torch.testing.assert_close(rows["reinforce_pp"], batch.advantages, rtol=0, atol=0)
    blind = lens_advantages(g.rewards, g.mask, t.advantage_config(), kl=g.kl)
    assert not torch.allclose(blind["reinforce_pp"] * g.keep, batch.advantages)
    assert set(rows) == set(blind)  # every estimator's row, with or without rejection
