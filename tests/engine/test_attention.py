"""Grouped-query attention read in place (``engine.attention``): passes without gradients skip
transformers' ``repeat_kv`` copy and give the same numbers bit for bit; passes with gradients
stay transformers' ``sdpa``. The built-in tiny model has as many key / value heads as query
heads, so a small random Llama with 2 key / value heads for 4 query heads stands in for
SmolLM2's 3 for 9 (its tokenizer is the tiny model's)."""

import copy
import json

import pytest
import torch
from transformers import LlamaForCausalLM
from transformers.integrations import sdpa_attention

from workbench.engine.attention import WORKBENCH_SDPA, use_grouped_attention
from workbench.engine.forward import logprobs_and_entropy
from workbench.engine.models import load_policy
from workbench.engine.rollout import hf_generate

PROMPTS = [p for p in ("3+2=", "17-4=", "6+1=9-") for _ in range(4)]  # left padding differs, G = 4 copies


@pytest.fixture
def gqa_pair(wb_home):
    """(stock model, grouped model, tokenizer): one random GQA Llama, twice."""
    torch.set_num_threads(1)
    tiny, tok = load_policy("tiny", grouped_attention=False)
    config = copy.deepcopy(tiny.config)
    config.num_key_value_heads = config.num_attention_heads // 2
    torch.manual_seed(0)
    stock = LlamaForCausalLM(config).eval()
    assert stock.config._attn_implementation == "sdpa"
    grouped = copy.deepcopy(stock)
    assert use_grouped_attention(grouped) and grouped.config._attn_implementation == WORKBENCH_SDPA
    return stock, grouped, tok


@pytest.fixture
def repeat_kv_calls(monkeypatch):
    """Counts transformers' key / value copies (``repeat_kv`` as sdpa attention calls it)."""
    calls = []
    original = sdpa_attention.repeat_kv
    monkeypatch.setattr(sdpa_attention, "repeat_kv", lambda *a: calls.append(1) or original(*a))
    return calls


def _rollouts(stock, grouped, tok, **kw):
    kw = dict(temperature=1.0, top_p=1.0, max_new_tokens=12, seed=3) | kw
    return hf_generate(stock, tok, PROMPTS, **kw), hf_generate(grouped, tok, PROMPTS, **kw)


@pytest.mark.parametrize("share_prefill", [True, False])
def test_grouped_generation_samples_the_same_tokens_and_logprobs_without_the_copy(gqa_pair, repeat_kv_calls, share_prefill):
    stock, grouped, tok = gqa_pair
    a = hf_generate(stock, tok, PROMPTS, temperature=1.0, top_p=1.0, max_new_tokens=12, seed=3, share_prefill=share_prefill,
                    min_saved_tokens=0)
    copies = len(repeat_kv_calls)
    b = hf_generate(grouped, tok, PROMPTS, temperature=1.0, top_p=1.0, max_new_tokens=12, seed=3, share_prefill=share_prefill,
                    min_saved_tokens=0)
    assert copies > 0 and len(repeat_kv_calls) == copies  # the stock model copies, the grouped one never does
    assert b.completion_mask.sum() > len(PROMPTS)  # completions longer than one token: decoding steps ran
    for name in ("completion_ids", "completion_mask", "rollout_logp"):
        assert torch.equal(getattr(a, name), getattr(b, name)), name


def test_grouped_generation_under_bf16_autocast_samples_the_same(gqa_pair):
    stock, grouped, tok = gqa_pair
    with torch.autocast("cpu", dtype=torch.bfloat16):
        a, b = _rollouts(stock, grouped, tok, seed=2)
    assert torch.equal(a.completion_ids, b.completion_ids) and torch.equal(a.rollout_logp, b.rollout_logp)


@pytest.mark.parametrize("shared_prefix", [True, False])
def test_logprobs_without_gradients_are_equal_bit_for_bit(gqa_pair, repeat_kv_calls, shared_prefix):
    stock, grouped, tok = gqa_pair
    rollout, _ = _rollouts(stock, grouped, tok)
    with torch.no_grad():
        a = logprobs_and_entropy(stock, rollout, 1.0, shared_prefix=shared_prefix)
        copies = len(repeat_kv_calls)
        b = logprobs_and_entropy(grouped, rollout, 1.0, shared_prefix=shared_prefix)
    assert copies > 0 and len(repeat_kv_calls) == copies
    assert torch.equal(a[0], b[0]) and torch.equal(a[1], b[1])


@pytest.mark.parametrize("shared_prefix", [True, False])
@pytest.mark.parametrize("adapted", [None, ["v_proj"]])
def test_a_training_pass_is_transformers_sdpa_with_equal_gradients(gqa_pair, repeat_kv_calls, shared_prefix, adapted):
    """Full fine-tuning, and LoRA on the value projection alone (the query then needs no grad)."""
    stock, grouped, tok = gqa_pair
    rollout, _ = _rollouts(stock, grouped, tok)
    if adapted:
        from peft import LoraConfig, get_peft_model

        def lora(model):
            torch.manual_seed(1)  # the same nonzero adapters on both
            return get_peft_model(model, LoraConfig(r=2, lora_alpha=4, target_modules=adapted, init_lora_weights=False))

        stock, grouped = lora(stock), lora(copy.deepcopy(stock))
        assert use_grouped_attention(grouped)
    grads, copies = [], []
    for model in (stock, grouped):
        model.zero_grad()
        before = len(repeat_kv_calls)
        logp, _ = logprobs_and_entropy(model, rollout, 1.0, shared_prefix=shared_prefix)
        (logp * rollout.completion_mask).sum().backward()
        copies.append(len(repeat_kv_calls) - before)
        grads.append([p.grad.clone() for p in model.parameters() if p.requires_grad])
    assert copies[0] > 0 and copies[1] == copies[0]  # with gradients every layer takes transformers' path
    assert all(torch.equal(x, y) for x, y in zip(*grads))


def test_only_a_cpu_sdpa_model_is_switched_and_a_saved_model_does_not_name_it(gqa_pair, tmp_path):
    stock, grouped, _ = gqa_pair
    eager = LlamaForCausalLM._from_config(stock.config, attn_implementation="eager")
    assert not use_grouped_attention(eager) and eager.config._attn_implementation == "eager"
    grouped.save_pretrained(tmp_path)  # loadable by plain transformers, which has no such attention
    assert WORKBENCH_SDPA not in json.dumps(json.loads((tmp_path / "config.json").read_text()))
    assert LlamaForCausalLM.from_pretrained(tmp_path).config._attn_implementation == "sdpa"
    assert load_policy("tiny")[0].config._attn_implementation == WORKBENCH_SDPA  # the workbench's default
