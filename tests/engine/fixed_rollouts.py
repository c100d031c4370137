"""Rollouts of fixed completion lengths for the trainer's batch tests.

A tiny model's samples can be uniformly short on one CPU and long on another (every completion
ended after 2 tokens on one machine), so a test that needs, say, tokens after a hole must not
depend on what the model happened to sample: these keep the step's prompts and put completions
of given lengths after them, scored by the trainer's own policy."""

import torch

from workbench.engine.forward import logprobs_and_entropy
from workbench.engine.rollout import Rollout


def rollout_of_lengths(trainer, out: Rollout, lengths, seed: int = 0) -> Rollout:
    """``out``'s prompts (B rows) with completions of valid lengths ``lengths`` (B,): ids drawn
    with ``seed`` among the tokenizer's non-special tokens, each completion closed by EOS on its
    last valid token, pad after it (T = max length). ``rollout_logp`` (B, T) is the trainer's own
    log-probs of the ids (an exact rollout engine), so a test's shift of it is the whole of
    old - rollout, with no sampling noise."""
    tok = trainer.tokenizer
    n = torch.as_tensor(lengths, dtype=torch.long)
    B, T = out.prompt_ids.shape[0], int(n.max())
    assert n.shape == (B,) and int(n.min()) >= 1
    special = set(tok.all_special_ids)
    ordinary = torch.tensor([i for i in range(len(tok)) if i not in special])
    ids = ordinary[torch.randint(len(ordinary), (B, T), generator=torch.Generator().manual_seed(seed))]
    positions = torch.arange(T)[None]
    mask = (positions < n[:, None]).float()
    ids = torch.where(positions == (n[:, None] - 1), tok.eos_token_id, ids)
    ids = torch.where(mask.bool(), ids, tok.pad_token_id)
    fixed = Rollout(out.prompt_ids, out.prompt_mask, ids, mask, torch.zeros(B, dtype=torch.bool), None, [""] * B)
    r = trainer.recipe
    with torch.no_grad():
        fixed.rollout_logp = logprobs_and_entropy(trainer.policy, fixed, r.sampling.temperature, False,
                                                  shared_prefix=r.train.shared_prefix)[0]
    return fixed


def cycling_lengths(B: int, T: int) -> list[int]:
    """1, 2, ..., T, 1, 2, ... over B rows: one-token completions and T-token ones in every batch."""
    return [1 + i % T for i in range(B)]
