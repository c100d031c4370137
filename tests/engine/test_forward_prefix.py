"""The training forward's two speed levers (issue 20) change no result, on the tiny model in fp32:

- logits only at the completion positions (``logits_to_keep``) and the row-chunked log-softmax /
  entropy give the full forward's numbers (1e-6) and gradients;
- the shared-prefix forward (each distinct prompt once, its KV cache indexed to its rows) gives
  the repeated-prompt forward's log-probs, entropies and parameter gradients to 1e-5: groups in
  shuffled row order, left-padded prompts of different lengths, completions of different lengths,
  one-token completions, LoRA (and its adapters-off reference), the PPO critic;
- it falls back to the plain forward, bit for bit, under gradient checkpointing and when every
  prompt is unique; ``train.shared_prefix=false`` is the plain forward;
- a 3-step CLI run with the switch on and off logs the same rewards and losses.
"""

import os
import math
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from tests.engine.test_trainer import metrics_of
from workbench.core import entropy_from_logits, logprobs_from_logits
from workbench.engine import forward
from workbench.engine.forward import (ValueModel, _shares_prefixes, completion_logits, logprobs_and_entropy,
                                      logprobs_and_sum_pi_squared, prompt_groups)
from workbench.engine.models import AdapterDisabledReference, load_policy, prepare_policy
from workbench.engine.rollout import Rollout
from workbench.recipe import Lora

ROOT = Path(__file__).resolve().parents[2]
PROMPTS = ["3+2=", "17-4=", "6+1=", "123-45="]  # 4, 5, 4, 7 characters: left padding differs


def _grouped_batch(tok, G=3, T=9, lengths=None, seed=0):
    """len(PROMPTS) x G rows in a shuffled order (as after the minibatch shuffle), left-padded
    prompts, completions of random valid lengths 1..T (or ``lengths``) padded with arbitrary ids."""
    enc = tok(PROMPTS, return_tensors="pt", padding=True, add_special_tokens=False)
    assert enc["attention_mask"].sum(1).unique().numel() > 1  # prompts of different lengths
    gen = torch.Generator().manual_seed(seed)
    B = len(PROMPTS) * G
    order = torch.randperm(B, generator=gen)
    ids, mask = enc["input_ids"].repeat_interleave(G, 0)[order], enc["attention_mask"].repeat_interleave(G, 0)[order]
    completion = torch.randint(5, 60, (B, T), generator=gen)
    n = torch.randint(1, T + 1, (B,), generator=gen) if lengths is None else torch.as_tensor(lengths)
    cmask = (torch.arange(T)[None] < n[:, None]).float()
    return Rollout(ids, mask, completion, cmask, torch.zeros(B, dtype=torch.bool), None, [""] * B)


def _policy_pass(model, batch, shared):
    """(log-probs, entropies, {name: grad}) of loss = sum(logp) + 0.1 sum(H) over valid tokens."""
    model.zero_grad(set_to_none=True)
    logp, ent = logprobs_and_entropy(model, batch, 0.7, entropy_grad=True, shared_prefix=shared)
    m = batch.completion_mask
    ((logp * m).sum() + 0.1 * (ent * m).sum()).backward()
    grads = {n: p.grad.clone() for n, p in model.named_parameters() if p.requires_grad}
    return logp.detach(), ent.detach(), grads


#: fp32's relative rounding allowance (torch.testing's float32 default): a log-prob of -13.8 summed
#: in another order differs by a few ulps (~1.6e-6 each), which an absolute 1e-5 alone refused on
#: one CPU (1.05e-05 there, relative 7.6e-07)
FP32_RTOL = 1.3e-6


def _assert_same(a, b, atol):
    """Log-probs and entropies to ``atol`` + ``FP32_RTOL`` x |value|; each gradient to ``atol``
    relative to its largest entry."""
    torch.testing.assert_close(a[0], b[0], atol=atol, rtol=FP32_RTOL)
    torch.testing.assert_close(a[1], b[1], atol=atol, rtol=FP32_RTOL)
    assert a[2].keys() == b[2].keys() and a[2]
    for name, g in a[2].items():
        torch.testing.assert_close(b[2][name], g, atol=atol * max(1.0, float(g.abs().max())), rtol=0, msg=name)


@pytest.fixture
def tiny(wb_home):
    torch.set_num_threads(1)
    torch.manual_seed(0)
    return load_policy("tiny")


def test_prompt_groups_find_each_prompt_in_any_row_order(tiny):
    batch = _grouped_batch(tiny[1])
    u_ids, u_mask, inverse = prompt_groups(batch.prompt_ids, batch.prompt_mask)
    assert u_ids.shape[0] == len(PROMPTS)
    assert torch.equal(u_ids[inverse], batch.prompt_ids) and torch.equal(u_mask[inverse], batch.prompt_mask)


@pytest.mark.parametrize("case", ["shuffled", "one_token", "full_length"])
def test_shared_prefix_equals_the_repeated_prompt_forward(tiny, case):
    model, tok = tiny
    lengths = {"shuffled": None, "one_token": [1] * 12, "full_length": [9] * 12}[case]
    batch = _grouped_batch(tok, lengths=lengths)
    assert _shares_prefixes(model, batch.prompt_ids, batch.prompt_mask) is not None
    _assert_same(_policy_pass(model, batch, False), _policy_pass(model, batch, True), 1e-5)


def test_shared_prefix_with_lora_and_its_adapters_off_reference(tiny):
    model, tok = tiny
    model = prepare_policy(model, Lora(r=4, alpha=8.0), False)
    with torch.no_grad():  # adapters B start at 0: move them so the adapters act
        for name, p in model.named_parameters():
            if "lora_B" in name:
                p.normal_(0, 0.05)
    batch = _grouped_batch(tok)
    plain, shared = _policy_pass(model, batch, False), _policy_pass(model, batch, True)
    assert all("lora_" in n for n in plain[2])
    _assert_same(plain, shared, 1e-5)
    reference = AdapterDisabledReference(model)
    with torch.no_grad():
        ref = [logprobs_and_entropy(reference, batch, 0.7, False, shared_prefix=s)[0] for s in (False, True)]
    torch.testing.assert_close(ref[1], ref[0], atol=1e-5, rtol=FP32_RTOL)
    assert (ref[0] - shared[0]).abs().max() > 1e-3  # the reference is the base, not the adapted policy


def test_old_logprobs_and_policy_statistics_under_no_grad(tiny):
    model, tok = tiny
    batch = _grouped_batch(tok)
    a, b = (logprobs_and_sum_pi_squared(model, batch, 0.7, shared_prefix=s) for s in (False, True))
    torch.testing.assert_close(b[0], a[0], atol=1e-5, rtol=FP32_RTOL)
    torch.testing.assert_close(b[1], a[1], atol=1e-5, rtol=FP32_RTOL)


def test_shared_prefix_critic_values_and_gradients(tiny):
    """The value head's inputs (the backbone's hidden states at the value positions, O(1) after the
    final norm) agree to 1e-5 + fp32's relative allowance; each value V = w . h + b then agrees to
    what that allowance carries through the head, sum_i |w_i| (1e-5 + FP32_RTOL |h_i|) (a head of
    N(0, 0.5) weights sums the tiny model's 128 terms into values of ~10, so one fixed bound on V would be either
    too loose for a wrong position or, on some CPU, tighter than fp32); gradients as elsewhere."""
    model, tok = tiny
    batch = _grouped_batch(tok)
    critic = ValueModel(model)
    with torch.no_grad():
        critic.head.weight.normal_(0, 0.5)
    heads_input = []
    critic.head.register_forward_hook(lambda module, inputs, output: heads_input.append(inputs[0].detach()))
    results = []
    for shared in (False, True):
        critic.shared_prefix = shared
        critic.zero_grad(set_to_none=True)
        values = critic(batch.prompt_ids, batch.prompt_mask, batch.completion_ids, batch.completion_mask)
        (values * batch.completion_mask).square().sum().backward()
        results.append((values.detach(), {n: p.grad.clone() for n, p in critic.named_parameters()}))
    (plain, plain_grads), (shared, shared_grads) = results
    assert plain.shape == batch.completion_mask.shape and heads_input[0].shape == (*plain.shape, model.config.hidden_size)
    atol = 1e-5
    torch.testing.assert_close(heads_input[1], heads_input[0], atol=atol, rtol=FP32_RTOL)
    carried = (atol + FP32_RTOL * heads_input[0].abs()) @ critic.head.weight.detach().abs().squeeze(0)
    assert torch.all((shared - plain).abs() <= carried), float(((shared - plain).abs() - carried).max())
    assert plain_grads.keys() == shared_grads.keys()
    for name, g in plain_grads.items():
        torch.testing.assert_close(shared_grads[name], g, atol=atol * max(1.0, float(g.abs().max())), rtol=0, msg=name)


def test_falls_back_to_the_plain_forward_exactly(tiny):
    """Gradient checkpointing in training mode (transformers then drops the cache) and a batch of
    unique prompts take the plain path: the very same numbers, bit for bit."""
    model, tok = tiny
    unique = _grouped_batch(tok, G=1)
    assert _shares_prefixes(model, unique.prompt_ids, unique.prompt_mask) is None
    p, s = _policy_pass(model, unique, False), _policy_pass(model, unique, True)
    assert torch.equal(p[0], s[0]) and all(torch.equal(p[2][n], s[2][n]) for n in p[2])

    checkpointed = prepare_policy(model, Lora(), True)
    batch = _grouped_batch(tok)
    assert checkpointed.training and _shares_prefixes(checkpointed, batch.prompt_ids, batch.prompt_mask) is None
    p, s = _policy_pass(checkpointed, batch, False), _policy_pass(checkpointed, batch, True)
    assert torch.equal(p[0], s[0]) and all(torch.equal(p[2][n], s[2][n]) for n in p[2])


def _full_forward(model, batch, temperature):
    """The forward before issue 20: the LM head at all P + L positions, sliced; unchunked maths."""
    L = int(batch.completion_mask.sum(1).max())
    ids = batch.completion_ids[:, :L]
    logits = completion_logits(model, batch.prompt_ids, batch.prompt_mask, ids, batch.completion_mask[:, :L], keep_only=False)
    logp = logprobs_from_logits(logits, ids, temperature)
    return torch.nn.functional.pad(logp, (0, batch.completion_ids.shape[1] - L)), \
        torch.nn.functional.pad(entropy_from_logits(logits, temperature), (0, batch.completion_ids.shape[1] - L))


@pytest.mark.parametrize("chunk_rows", [None, 5], ids=["one_chunk", "chunks_of_5_rows"])
def test_switch_off_is_the_full_forward_with_logits_kept_and_chunked_rows(tiny, monkeypatch, chunk_rows):
    """shared_prefix=False: logits at the completion positions only, log-softmax / entropy by
    row chunks (5 rows: checkpointed chunks under autograd) equal the full forward to 1e-6."""
    model, tok = tiny
    if chunk_rows:
        monkeypatch.setattr(forward, "LOGIT_CHUNK_ELEMENTS", chunk_rows * model.config.vocab_size)
    batch = _grouped_batch(tok)
    model.zero_grad(set_to_none=True)
    logp, ent = _full_forward(model, batch, 0.7)
    m = batch.completion_mask
    ((logp * m).sum() + 0.1 * (ent * m).sum()).backward()
    full = (logp.detach() * m, ent.detach() * m, {n: p.grad.clone() for n, p in model.named_parameters()})
    kept = _policy_pass(model, batch, False)
    _assert_same(full, (kept[0] * m, kept[1] * m, kept[2]), 1e-6)


def _train_cli(home, run_dir, *sets):
    env = {**os.environ, "WORKBENCH_HOME": str(home), "PYTHONPATH": str(ROOT)}
    args = [sys.executable, "-m", "workbench", "train", "grpo", "--run-dir", str(run_dir)]
    for s in sets:
        args += ["--set", s]
    res = subprocess.run(args, capture_output=True, text=True, timeout=300, env=env, cwd=ROOT)
    assert res.returncode == 0, res.stderr[-2000:]
    return metrics_of(run_dir)


def test_a_run_with_the_switch_on_and_off_logs_the_same(wb_home, few_problems, tmp_path):
    """3 steps, 2 passes over 2 shuffled minibatches. Step 0 samples from the same weights, so its
    samples (rewards, lengths) are the same and its loss and entropy agree to 1e-5. Later steps
    are not compared value by value: Adam's first steps are ~lr * sign(g), so a gradient entry that
    is rounding noise in both forwards (1e-6 relative, as the unit tests above) moves its weight by
    +-lr either way, and another CPU's floats may then sample another token. Both runs finish with
    finite figures."""
    sets = ["train.steps=3", "train.mu=2", "train.minibatches=2", f"dataset={few_problems}"]
    on = _train_cli(wb_home, tmp_path / "on", *sets)
    off = _train_cli(wb_home, tmp_path / "off", *sets, "train.shared_prefix=false")
    assert len(on) == len(off) == 3
    a, b = on[0], off[0]
    for key in ("reward", "reward_std", "completions/mean_length"):
        assert a[key] == b[key], (key, a[key], b[key])
    for key in ("loss/policy", "entropy"):
        assert abs(a[key] - b[key]) <= 1e-5 * max(1.0, abs(b[key])), (key, a[key], b[key])
    assert all(math.isfinite(m[k]) for m in on + off for k in ("reward", "loss/policy", "entropy", "grad_norm"))
