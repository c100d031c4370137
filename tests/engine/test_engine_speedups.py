"""The engine's speed-ups (bench/engine_vs_trl.py) change no result:

- the training forward covers only the longest valid completion: the log-probs and entropies of
  valid tokens, and the gradient, are those of the full L_max-long forward; padding holds 0;
- the per-epoch prompt order is computed once, and is the order the per-prompt reshuffle gave.
"""

import random

import torch

from workbench.core import entropy_from_logits, logprobs_from_logits
from workbench.engine.forward import completion_logits, logprobs_and_entropy
from workbench.engine.rollout import Rollout
from workbench.engine.models import load_policy
from workbench.engine.trainer import prompts_for_step


def _batch(tok, lengths, T=12):
    """Prompts '3+2=' etc., completions of the given valid lengths (last valid token = EOS),
    padded to T with arbitrary non-pad tokens (they must not matter)."""
    enc = tok(["3+2=", "17-4=", "6+1=", "9-5="], return_tensors="pt", padding=True, add_special_tokens=False)
    gen = torch.Generator().manual_seed(0)
    ids = torch.randint(5, 60, (4, T), generator=gen)
    mask = (torch.arange(T)[None] < torch.tensor(lengths)[:, None]).float()
    for i, n in enumerate(lengths):
        ids[i, n - 1] = tok.eos_token_id
    return Rollout(enc["input_ids"], enc["attention_mask"], ids, mask, torch.zeros(4, dtype=torch.bool), None, [""] * 4)


def test_trimmed_forward_equals_the_full_forward_on_valid_tokens(wb_home):
    torch.set_num_threads(1)
    model, tok = load_policy("tiny")
    batch = _batch(tok, [3, 5, 1, 2])  # longest valid completion 5 of T = 12
    logp, ent = logprobs_and_entropy(model, batch, 0.7, with_entropy=True)
    full_logits = completion_logits(model, batch.prompt_ids, batch.prompt_mask, batch.completion_ids, batch.completion_mask)
    full_logp = logprobs_from_logits(full_logits, batch.completion_ids, 0.7)
    full_ent = entropy_from_logits(full_logits.detach(), 0.7)
    m = batch.completion_mask.bool()
    assert logp.shape == ent.shape == (4, 12)
    torch.testing.assert_close(logp[m], full_logp[m], atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(ent[m], full_ent[m], atol=1e-5, rtol=1e-5)
    assert float(logp[:, 5:].abs().sum()) == 0.0 and float(ent[:, 5:].abs().sum()) == 0.0

    # the same gradient as the full-length forward
    (logp * batch.completion_mask).sum().backward()
    g_trim = [p.grad.clone() for p in model.parameters()]
    model.zero_grad()
    (full_logp * batch.completion_mask).sum().backward()
    for a, b in zip(g_trim, (p.grad for p in model.parameters())):
        torch.testing.assert_close(a, b, atol=1e-5, rtol=1e-4)


def _reference_prompts_for_step(rows, step, prompts_per_step, rank, world, seed):
    """The original implementation: reshuffle the whole epoch for every prompt."""
    per_rank = prompts_per_step // world
    start = step * prompts_per_step + rank * per_rank
    out = []
    for k in range(start, start + per_rank):
        epoch, i = divmod(k, len(rows))
        order = list(range(len(rows)))
        random.Random(seed * 7919 + epoch).shuffle(order)
        out.append(rows[order[i]])
    return out


def test_cached_epoch_order_gives_the_same_prompt_stream():
    rows = [{"prompt": str(i)} for i in range(10)]
    for step in range(8):  # 4 prompts a step over 10 rows: crosses three epoch boundaries
        for rank, world in ((0, 1), (0, 2), (1, 2)):
            got = prompts_for_step(rows, step, 4, rank, world, seed=3)
            assert got == _reference_prompts_for_step(rows, step, 4, rank, world, seed=3)
