"""Generation prefills each distinct prompt once (``rollout.shared_prompt_cache``): GRPO's G copies
of a prompt share one prefill. The completions, their log-probs and the Rollout are those of the
plain path (every copy prefilled): same tokens, logits within float rounding.
"""

import pytest
import torch

from workbench.recipe import Lora
from workbench.engine.models import apply_lora, load_policy
from workbench.engine.forward import prompt_groups
from workbench.engine.rollout import encode_batch, hf_generate, model_stop_ids, shared_prompt_cache

# three prompts of different lengths (left padding differs), G = 4 copies each
PROMPTS = ["3+2=", "17-4=", "6+1=9-"]


def _generate_both(model, tok, prompts, **sampling):
    kw = dict(temperature=1.0, top_p=1.0, max_new_tokens=10, seed=0) | sampling
    return (hf_generate(model, tok, prompts, share_prefill=True, min_saved_tokens=0, **kw),
            hf_generate(model, tok, prompts, share_prefill=False, **kw))


def _assert_same_rollout(shared, plain):
    for name in ("prompt_ids", "prompt_mask", "completion_ids", "completion_mask", "truncated"):
        assert torch.equal(getattr(shared, name), getattr(plain, name)), name
    # fp32 rounding relative to the log-prob's size (torch.testing's float32 rtol): 1.14e-05 on a
    # log-prob of ~2.8 was refused by an absolute 1e-5 alone on one CPU
    torch.testing.assert_close(shared.rollout_logp, plain.rollout_logp, atol=1e-5, rtol=1.3e-6)
    assert shared.completions == plain.completions and shared.prompts_truncated == plain.prompts_truncated


def test_prompt_groups_map_every_row_back():
    ids = torch.tensor([[0, 5, 6], [7, 8, 9], [0, 5, 6], [0, 5, 6], [7, 8, 9]])
    mask = (ids != 0).long()
    u_ids, u_mask, inverse = prompt_groups(ids, mask)
    assert u_ids.shape == (2, 3)
    assert torch.equal(u_ids[inverse], ids) and torch.equal(u_mask[inverse], mask)
    # same ids, different mask: two rows (a real pad token equal to a content token must not merge them)
    u_ids, _, _ = prompt_groups(torch.tensor([[1, 2], [1, 2]]), torch.tensor([[1, 1], [0, 1]]))
    assert u_ids.shape[0] == 2


@pytest.mark.parametrize("order", ["contiguous", "interleaved"])
@pytest.mark.parametrize("seed", [0, 1, 2])
def test_shared_prefill_samples_what_the_plain_path_samples(wb_home, order, seed):
    torch.set_num_threads(1)
    model, tok = load_policy("tiny")
    prompts = ([p for p in PROMPTS for _ in range(4)] if order == "contiguous"
               else [p for _ in range(4) for p in PROMPTS])
    _assert_same_rollout(*_generate_both(model, tok, prompts, seed=seed))


def test_shared_prefill_greedy_and_top_p(wb_home):
    torch.set_num_threads(1)
    model, tok = load_policy("tiny")
    prompts = [p for p in PROMPTS for _ in range(3)]
    _assert_same_rollout(*_generate_both(model, tok, prompts, temperature=0.0))
    _assert_same_rollout(*_generate_both(model, tok, prompts, temperature=0.7, top_p=0.9, seed=5))


def test_shared_prefill_with_lora_adapters(wb_home):
    torch.set_num_threads(1)
    model = apply_lora(load_policy("tiny")[0], Lora(r=2, alpha=4.0))
    for name, p in model.named_parameters():  # B starts at 0: make the adapters act
        if "lora_B" in name:
            torch.nn.init.normal_(p, std=0.2, generator=torch.Generator().manual_seed(1))
    tok = load_policy("tiny")[1]
    _assert_same_rollout(*_generate_both(model, tok, [p for p in PROMPTS for _ in range(4)], seed=3))


def test_shared_prompt_cache_only_where_it_saves(wb_home):
    model, tok = load_policy("tiny")
    ids, mask, _ = encode_batch(tok, PROMPTS)  # no prompt repeats: nothing to share
    assert shared_prompt_cache(model, ids, mask) is None
    # a generation config that names its own cache: generate refuses a second one, so none is made
    repeated, repeated_mask, _ = encode_batch(tok, PROMPTS * 2)
    model.generation_config.cache_implementation = "static"
    try:
        assert shared_prompt_cache(model, repeated, repeated_mask, min_saved_tokens=0) is None
    finally:
        model.generation_config.cache_implementation = None
    ids, mask, _ = encode_batch(tok, PROMPTS * 2)
    saved = 3 * (ids.shape[1] - 1)  # 3 repeated rows x P - 1 cached positions each
    assert shared_prompt_cache(model, ids, mask, min_saved_tokens=saved + 1) is None
    with torch.no_grad():
        cache = shared_prompt_cache(model, ids, mask, min_saved_tokens=saved)
    assert cache.get_seq_length() == ids.shape[1] - 1  # the last position is generate's
    assert cache.layers[0].keys.shape[0] == 6


def test_shared_prefill_on_the_real_model(smollm2):
    """SmolLM2-135M (grouped-query attention, a chat template, a 100+ token system prompt)."""
    model, tok = smollm2
    prompts = [[{"role": "user", "content": q}] for q in ("What is 7 times 8?", "Name a prime above 20.")
               for _ in range(3)]
    _assert_same_rollout(*_generate_both(model, tok, prompts, max_new_tokens=6, seed=4))


def test_shared_prefill_runs_each_prompt_once(wb_home):
    """The saving itself: tokens through the embedding = each distinct prompt's P - 1 positions
    once, then B rows x (last prompt position + new tokens); the plain path embeds B x P first."""
    torch.set_num_threads(1)
    model, tok = load_policy("tiny")
    prompts = [p for p in PROMPTS for _ in range(4)]
    B, P = 12, encode_batch(tok, prompts)[0].shape[1]
    counted = []
    hook = model.get_input_embeddings().register_forward_hook(lambda m, args, out: counted.append(args[0].numel()))
    try:
        for share in (True, False):
            counted.clear()
            hf_generate(model, tok, prompts, temperature=1.0, top_p=1.0, max_new_tokens=10, seed=0,
                        share_prefill=share, min_saved_tokens=0)
            steps = len(counted) - (2 if share else 1)
            first = counted[:2] if share else counted[:1]
            assert first == ([len(PROMPTS) * (P - 1), B] if share else [B * P]), (share, counted[:3])
            assert counted[len(first):] == [B] * steps  # then one token per row per step
    finally:
        hook.remove()


@pytest.mark.parametrize("temperature", [0.0, 0.8])
def test_hf_generate_samples_as_generate_given_its_settings_as_keywords(wb_home, temperature):
    """hf_generate hands ``generate`` one GenerationConfig (``rollout.generation_config``, as TRL
    does) instead of keyword settings: the same tokens, and the model's own generation config
    still fills what the call leaves unset (here a minimum length, which changes them)."""
    torch.set_num_threads(1)
    model, tok = load_policy("tiny")
    prompts = [p for p in PROMPTS for _ in range(3)]
    ids, mask, _ = encode_batch(tok, prompts)
    sampling = ({"do_sample": False, "temperature": None, "top_p": None, "top_k": None} if temperature == 0
                else {"do_sample": True, "temperature": temperature, "top_p": 0.9, "top_k": 0})

    def both():
        out = hf_generate(model, tok, prompts, temperature=temperature, top_p=0.9, max_new_tokens=8, seed=4, share_prefill=False)
        torch.manual_seed(4)
        ref = model.generate(input_ids=ids, attention_mask=mask, max_new_tokens=8, pad_token_id=tok.pad_token_id,
                             eos_token_id=model_stop_ids(model, tok), **sampling)[:, ids.shape[1]:]
        ref = torch.nn.functional.pad(ref, (0, 8 - ref.shape[1]), value=tok.pad_token_id)
        assert torch.equal(out.completion_ids * out.completion_mask.long(), ref * out.completion_mask.long())
        return out.completion_ids

    plain = both()
    model.generation_config.min_new_tokens = 4  # no stop token before the 4th
    longer = both()
    assert (plain[:, 1] == model_stop_ids(model, tok)[0]).any() and not torch.equal(plain, longer)
