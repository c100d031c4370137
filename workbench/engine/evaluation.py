"""Held-out evaluation: prompts never trained on, scored by the task's verifier.

The recipe's ``eval`` section (``every`` N steps, ``num_prompts``, ``pass_k``, ``temperature``)
turns it on. At step s with ``s % every == 0`` the policy that samples step s (after s updates)
is evaluated before the step's rollout; after the last step's update the final policy is
evaluated too, and its figures replace the last step's (``eval/updates`` records which policy a
line holds). The figures go into that step's ``metrics`` line:

- ``eval/pass@1``: fraction of prompts whose greedy completion is correct;
- ``eval/pass@k``: the unbiased pass@k of Chen et al. (2021) over ``pass_k`` completions sampled
  at ``eval.temperature`` (with n = k samples: the fraction of prompts with any correct one);
- ``eval/reward``: mean total (weighted) reward of the greedy completions;
- ``eval/mean_length``: mean greedy completion length in tokens (EOS included);
- ``eval/updates``, ``eval/num_prompts``, ``perf/eval_time``.

"Correct" means the task's correctness reward (``task.correct_reward``: the verifier, e.g.
``exact_match`` or ``reasoning_gym``) is at its maximum, 1.0. When the recipe names its own reward
functions without the task's verifier, the first of them is the correctness one.

Evaluation changes nothing in training: it samples from its own fixed seeds (the same draws at
every evaluation, so curves compare policies rather than luck) and restores every global RNG
(torch, CUDA, Python, NumPy) afterwards. With eval on, a built-in task's held-out prompts are
removed from its training pool (that is what held out means); that is the only difference.
"""

from __future__ import annotations

import math
import random
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch

from workbench.engine.rewards import RewardFn, compute_rewards, reward_name
from workbench.engine.rollout import valid_token_lists
from workbench.engine.seeds import eval_seed
from workbench.recipe import Recipe

#: A completion is correct when the correctness reward reaches this (its maximum).
CORRECT_AT = 1.0


def pass_at_k(n: int, c: int, k: int) -> float:
    """Unbiased pass@k (Chen et al. 2021, eq. 1) from n samples of which c are correct:
    1 - C(n - c, k) / C(n, k); 1.0 when fewer than k samples are wrong."""
    if not 1 <= k <= n:
        raise ValueError(f"pass@k needs 1 <= k <= n, got k={k}, n={n}")
    return 1.0 if n - c < k else 1.0 - math.comb(n - c, k) / math.comb(n, k)


def eval_due(step: int, every: int) -> bool:
    """Evaluate before step ``step``'s rollout (every > 0: steps 0, every, 2 * every, ...)."""
    return every > 0 and step % every == 0


def correct_index(funcs: Sequence[RewardFn], correct_reward: str | None) -> int:
    """Position of the correctness reward among the run's reward functions: the task's verifier
    when the run uses it, else the first function."""
    names = [reward_name(f) for f in funcs]
    return names.index(correct_reward) if correct_reward in names else 0


@contextmanager
def preserved_rng(device: torch.device) -> Iterator[None]:
    """Every global RNG (torch CPU and ``device``'s, Python, NumPy) as it was before the block."""
    py_state, np_state = random.getstate(), np.random.get_state()
    devices = [device] if device.type == "cuda" else []
    try:
        with torch.random.fork_rng(devices=devices):
            yield
    finally:
        random.setstate(py_state)
        np.random.set_state(np_state)


@dataclass
class PromptScores:
    """One held-out prompt's results (a plain object: gathered across ranks with gather_object)."""

    greedy_correct: bool
    greedy_reward: float
    greedy_length: int
    sampled_correct: int


class Evaluator:
    """Scores the policy on a fixed set of held-out rows (this rank's share of them)."""

    def __init__(self, recipe: Recipe, rows: list[dict[str, Any]], reward_funcs: Sequence[RewardFn],
                 reward_weights: Sequence[float], correct_reward: str | None, *, rank: int = 0, world: int = 1) -> None:
        self.recipe = recipe
        self.rows = rows[rank::world]  # this rank's prompts; the figures are over all ranks'
        self.num_prompts = len(rows)
        self.reward_funcs, self.reward_weights = list(reward_funcs), list(reward_weights)
        self.correct = correct_index(self.reward_funcs, correct_reward)
        self.seed = eval_seed(recipe.train.seed, rank, world)
        self.sampled_seed = eval_seed(recipe.train.seed, rank, world, sampled=True)

    def _generate(self, backend, model, tokenizer, rows: list[dict], temperature: float, seed: int):
        """(completions, token lists, per-function rewards (F, B), total rewards (B,)) in chunks
        of the training batch size (the memory a step's rollout already needs)."""
        r = self.recipe
        chunk = r.batch_size
        texts, ids, per_fn, totals = [], [], [], []
        for start in range(0, len(rows), chunk):
            part = rows[start:start + chunk]
            out = backend.generate(
                model, tokenizer, [row["prompt"] for row in part], temperature=temperature, top_p=r.sampling.top_p,
                max_new_tokens=r.sampling.max_completion_length, seed=seed + start,
                system_prompt=r.system_prompt, max_prompt_length=r.sampling.max_prompt_length)
            tokens = valid_token_lists(out.completion_ids.cpu(), out.completion_mask.cpu())
            columns = {k: [row.get(k) for row in part] for k in part[0] if k != "prompt"}
            total, by_fn = compute_rewards(self.reward_funcs, self.reward_weights, [row["prompt"] for row in part],
                                           out.completions, tokens, columns, trainer_state={"eval": True})
            texts += out.completions
            ids += tokens
            per_fn.append(torch.stack(list(by_fn.values())))
            totals.append(total)
        return texts, ids, torch.cat(per_fn, dim=1), torch.cat(totals)

    @torch.no_grad()
    def scores(self, backend, model, tokenizer, device: torch.device) -> list[PromptScores]:
        """Greedy and pass@k completions of this rank's prompts, scored (global RNGs untouched)."""
        k = self.recipe.eval.pass_k
        if not self.rows:
            return []
        with preserved_rng(device):
            _, greedy_ids, greedy_fn, greedy_total = self._generate(backend, model, tokenizer, self.rows, 0.0, self.seed)
            repeated = [row for row in self.rows for _ in range(k)]  # groups contiguous
            _, _, sampled_fn, _ = self._generate(backend, model, tokenizer, repeated, self.recipe.eval.temperature,
                                                 self.sampled_seed)
        greedy_ok = greedy_fn[self.correct] >= CORRECT_AT  # NaN (None) is never correct
        sampled_ok = (sampled_fn[self.correct] >= CORRECT_AT).view(len(self.rows), k).sum(dim=1)
        return [PromptScores(bool(greedy_ok[i]), float(greedy_total[i]), len(greedy_ids[i]), int(sampled_ok[i]))
                for i in range(len(self.rows))]

    def metrics(self, scores: Sequence[PromptScores], updates: int) -> dict[str, float]:
        """The ``eval/...`` figures over every rank's prompt scores."""
        k, n = self.recipe.eval.pass_k, len(scores)
        return {
            "eval/pass@1": sum(s.greedy_correct for s in scores) / n,
            "eval/pass@k": sum(pass_at_k(k, s.sampled_correct, k) for s in scores) / n,
            "eval/reward": sum(s.greedy_reward for s in scores) / n,
            "eval/mean_length": sum(s.greedy_length for s in scores) / n,
            "eval/num_prompts": float(n),
            "eval/updates": float(updates),
        }
