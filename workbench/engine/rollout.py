"""Rollout backends: prompts in, completions (right-padded to L_max) and their log-probs out.

One contract: a backend is built once per run, ``ROLLOUT_BACKENDS.get(name)(model_path,
precision=..., seed=...)`` (the recipe's ``train.rollout``), and then
``backend.generate(policy, tokenizer, prompts, temperature=, top_p=, max_new_tokens=, seed=,
system_prompt=, max_prompt_length=)`` returns a ``Rollout`` sampled from the policy's *current*
weights; ``backend.close()`` frees it. ``temperature=0`` is greedy decoding (held-out eval).

Both backends share the prompt side (:func:`encode_batch`): prompts in TRL's standard (text) or
conversational (messages, rendered with the chat template) format, left-truncated to
``max_prompt_length`` and left-padded with ``tokenizer.pad``; and the stop side: generation ends at
any of the model's EOS / end-of-turn ids (:func:`workbench.engine.prompts.stop_token_ids`), and the
completion mask covers the tokens up to and including the first of them.

- ``hf``: transformers ``generate`` on the policy module itself (nothing to sync).
- ``vllm``: an in-process vLLM engine that copies the policy's weights in before every
  generation (``workbench/engine/vllm_rollout.py``; vllm is imported only when chosen).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, Callable, Protocol

import torch

from transformers import Cache

from workbench.core import Registry, logprobs_from_logits
from workbench.engine.forward import _accepts, mask_positions, prompt_groups
from workbench.engine.prompts import Prompt, encode_prompts, stop_token_ids


@dataclass
class Rollout:
    """A generated batch. B = number of prompts given (already repeated G times)."""

    prompt_ids: torch.Tensor  # (B, P) left-padded
    prompt_mask: torch.Tensor  # (B, P)
    completion_ids: torch.Tensor  # (B, T = L_max), pad after EOS
    completion_mask: torch.Tensor  # (B, T) 1 up to and including EOS
    truncated: torch.Tensor  # (B,) bool: no EOS within L_max
    rollout_logp: torch.Tensor | None  # (B, T) log-probs as the rollout engine saw them
    completions: list[str]
    prompts_truncated: int = 0  # how many of the B prompts lost tokens to max_prompt_length


class RolloutBackend(Protocol):
    def generate(self, model, tokenizer, prompts: list[Prompt], *, temperature: float, top_p: float,
                 max_new_tokens: int, seed: int, system_prompt: str | None = None,
                 max_prompt_length: int | None = None) -> Rollout: ...

    def close(self) -> None: ...


#: name -> factory(model_path: str, *, precision: str, seed: int) -> RolloutBackend
ROLLOUT_BACKENDS: Registry[Callable[..., RolloutBackend]] = Registry("rollout backend")


def completion_mask_from_ids(ids: torch.Tensor, stop_ids: int | Sequence[int]) -> tuple[torch.Tensor, torch.Tensor]:
    """Mask up to and including the first stop token (any of ``stop_ids``: EOS, end-of-turn);
    (B, T) -> mask (B, T) float, truncated (B,) bool (no stop token within T)."""
    stop = torch.as_tensor([stop_ids] if isinstance(stop_ids, int) else list(stop_ids), device=ids.device)
    is_stop = torch.isin(ids, stop)
    has_stop = is_stop.any(dim=1)
    first = torch.where(has_stop, is_stop.int().argmax(dim=1), torch.full_like(has_stop, ids.shape[1], dtype=torch.long))
    positions = torch.arange(ids.shape[1], device=ids.device)[None]
    return (positions <= first[:, None]).float(), ~has_stop


def encode_batch(tokenizer, prompts: Sequence[Prompt], *, system_prompt: str | None = None,
                 max_prompt_length: int | None = None) -> tuple[torch.Tensor, torch.Tensor, int]:
    """B prompts of either TRL format -> (input_ids (B, P), attention_mask (B, P), number truncated):
    rendered and left-truncated by ``encode_prompts``, left-padded by ``tokenizer.pad``."""
    enc = encode_prompts(tokenizer, prompts, system_prompt=system_prompt, max_prompt_length=max_prompt_length)
    side, tokenizer.padding_side = tokenizer.padding_side, "left"
    try:
        batch = tokenizer.pad({"input_ids": enc.input_ids}, return_tensors="pt")
    finally:
        tokenizer.padding_side = side
    return batch["input_ids"], batch["attention_mask"], enc.num_truncated


def model_stop_ids(model, tokenizer) -> list[int]:
    """The ids generation stops at for this policy: tokenizer EOS + generation config's (TRL's rule)."""
    ids = stop_token_ids(tokenizer, getattr(model, "generation_config", None))
    if not ids:
        raise ValueError(f"tokenizer {getattr(tokenizer, 'name_or_path', '?')!r} has no EOS token: generation could not stop")
    return ids


def valid_token_lists(ids: torch.Tensor, mask: torch.Tensor) -> list[list[int]]:
    """(B, T) ids and mask -> B lists of the valid token ids (TRL's ``completion_ids``)."""
    return [row[m.bool()].tolist() for row, m in zip(ids, mask)]


def concat_rollouts(parts: Sequence[Rollout], pad_id: int) -> Rollout:
    """One Rollout of several (rows in order). Prompts are left-padded again to the widest (extra
    pad is masked out and positions follow the mask, so log-probs do not change); completions
    are all L_max wide already. ``prompts_truncated`` adds up."""
    width = max(p.prompt_ids.shape[1] for p in parts)

    def left(t: torch.Tensor, value) -> torch.Tensor:
        return torch.nn.functional.pad(t, (width - t.shape[1], 0), value=value)

    logps = [p.rollout_logp for p in parts]
    return Rollout(
        torch.cat([left(p.prompt_ids, pad_id) for p in parts]), torch.cat([left(p.prompt_mask, 0) for p in parts]),
        torch.cat([p.completion_ids for p in parts]), torch.cat([p.completion_mask for p in parts]),
        torch.cat([p.truncated for p in parts]), None if any(x is None for x in logps) else torch.cat(logps),
        [c for p in parts for c in p.completions], sum(p.prompts_truncated for p in parts))


def select_rows(out: Rollout, idx: Sequence[int], prompts_truncated: int) -> Rollout:
    """The rows ``idx`` of a Rollout (a truncated-prompt count per row is not kept: the caller says it)."""
    t = torch.as_tensor(list(idx), dtype=torch.long, device=out.completion_ids.device)
    return Rollout(out.prompt_ids[t], out.prompt_mask[t], out.completion_ids[t], out.completion_mask[t], out.truncated[t],
                   None if out.rollout_logp is None else out.rollout_logp[t], [out.completions[i] for i in idx],
                   prompts_truncated)


def _pad_right(ids: torch.Tensor, length: int, pad_id: int) -> torch.Tensor:
    if ids.shape[1] >= length:
        return ids[:, :length]
    return torch.nn.functional.pad(ids, (0, length - ids.shape[1]), value=pad_id)


def _sampling_kwargs(temperature: float, top_p: float) -> dict[str, Any]:
    """``generate`` settings: temperature 0 -> greedy (argmax), else pure sampling (top_k off)."""
    if temperature == 0:
        return {"do_sample": False, "temperature": None, "top_p": None, "top_k": None}
    return {"do_sample": True, "temperature": temperature, "top_p": top_p, "top_k": 0}


def generation_config(max_new_tokens: int, pad_id: int, stop_ids: list[int], temperature: float, top_p: float):
    """The ``GenerationConfig`` of one ``hf_generate`` call, passed whole as TRL passes its own:
    given settings as keyword arguments instead, ``generate`` first checks the model's config for
    legacy generation fields (~3 ms a call on the tiny model, a few % of its step). The model's
    ``generation_config`` still fills every field this leaves unset (defaults_only), as with
    keyword arguments."""
    from transformers import GenerationConfig

    return GenerationConfig(max_new_tokens=max_new_tokens, pad_token_id=pad_id, eos_token_id=stop_ids,
                            return_dict_in_generate=True, output_logits=True, **_sampling_kwargs(temperature, top_p))


#: Prompt tokens a shared prefill must save to be used: below this the extra forward call costs
#: more than it saves (bench/generation_prefill_bench.py: the tiny model's 16 completions of 2
#: prompts save ~70 tokens and generate 1.07x slower; SmolLM2's chat prompts save ~1,500 tokens
#: and generate in 0.68x the time).
SHARED_PREFILL_MIN_TOKENS = 256


def shared_prompt_cache(model, input_ids: torch.Tensor, attention_mask: torch.Tensor, *,
                        min_saved_tokens: int = SHARED_PREFILL_MIN_TOKENS):
    """The KV cache of the B left-padded prompts' first P - 1 positions, computed ONCE per distinct
    prompt and expanded to the B rows (a transformers Cache), or None where it saves fewer than
    ``min_saved_tokens`` prompt tokens ((B - distinct prompts) x (P - 1); none when no prompt
    repeats or P < 2).

    ``generate`` given this cache runs only the last prompt position and the new tokens: the
    prefill of a group's G copies costs one copy's (G x fewer prompt tokens; TRL, verl and the
    plain path prefill every copy). The last position is left to ``generate`` because it must
    produce the first token's logits itself. Positions follow the mask as in ``generate``
    (cumsum - 1 over left padding), so the cached keys / values equal the batched prefill's up
    to float rounding (~1e-6 in fp32). input_ids, attention_mask: (B, P)."""
    # a model without a transformers KV cache, or one whose generation config names its own cache
    # (generate refuses both a cache_implementation and past_key_values): the plain prefill
    if (input_ids.shape[1] < 2 or not _accepts(model, "past_key_values")
            or getattr(getattr(model, "generation_config", None), "cache_implementation", None) is not None):
        return None
    ids, mask, inverse = prompt_groups(input_ids, attention_mask)
    if ids.shape[0] == input_ids.shape[0] or (input_ids.shape[0] - ids.shape[0]) * (input_ids.shape[1] - 1) < min_saved_tokens:
        return None
    cache = model(input_ids=ids[:, :-1], attention_mask=mask[:, :-1], position_ids=mask_positions(mask)[:, :-1],
                  use_cache=True).past_key_values
    if not isinstance(cache, Cache):
        return None
    cache.reorder_cache(inverse.to(ids.device))  # index_select along the batch: (U, ...) -> (B, ...)
    return cache


@torch.no_grad()
def hf_generate(model, tokenizer, prompts: list[Prompt], *, temperature: float, top_p: float, max_new_tokens: int,
                seed: int, system_prompt: str | None = None, max_prompt_length: int | None = None,
                share_prefill: bool = True, min_saved_tokens: int = SHARED_PREFILL_MIN_TOKENS) -> Rollout:
    """transformers ``generate`` with KV cache and left padding; sampled with a seeded generator
    (greedy when ``temperature == 0``; its log-probs are then those of temperature 1).
    ``share_prefill``: repeated prompts are prefilled once where that saves at least
    ``min_saved_tokens`` prompt tokens (``shared_prompt_cache``); the random
    draws are the same (one batch of B rows), so the completions are those of the plain path
    unless a float-rounding difference of ~1e-6 moves a sampling boundary."""
    input_ids, attention_mask, n_truncated = encode_batch(
        tokenizer, prompts, system_prompt=system_prompt, max_prompt_length=max_prompt_length)
    device = next(model.parameters()).device
    input_ids, attention_mask = input_ids.to(device), attention_mask.to(device)
    stop_ids = model_stop_ids(model, tokenizer)
    torch.manual_seed(seed)
    was_training = model.training
    model.eval()
    cache = shared_prompt_cache(model, input_ids, attention_mask, min_saved_tokens=min_saved_tokens) if share_prefill else None
    out = model.generate(input_ids=input_ids, attention_mask=attention_mask, past_key_values=cache,
                         generation_config=generation_config(max_new_tokens, tokenizer.pad_token_id, stop_ids, temperature, top_p))
    model.train(was_training)
    P = input_ids.shape[1]
    completion_ids = _pad_right(out.sequences[:, P:], max_new_tokens, tokenizer.pad_token_id)
    mask, truncated = completion_mask_from_ids(completion_ids, stop_ids)
    logits = torch.stack(out.logits, dim=1)  # (B, T', V) raw logits of each generated position
    logp = logprobs_from_logits(logits, completion_ids[:, : logits.shape[1]], temperature or 1.0)
    logp = _pad_right(logp, max_new_tokens, 0) * mask
    texts = tokenizer.batch_decode(valid_token_lists(completion_ids, mask), skip_special_tokens=True)
    return Rollout(input_ids, attention_mask, completion_ids, mask.to(device), truncated, logp, texts, n_truncated)


@ROLLOUT_BACKENDS.register("hf")
class HFRollout:
    """Backend ``hf``: ``hf_generate`` on the policy module itself, so it always samples the
    current weights (nothing to sync, nothing to free)."""

    def __init__(self, model_path: str, *, precision: str, seed: int) -> None:
        pass

    def generate(self, model, tokenizer, prompts: list[Prompt], **sampling) -> Rollout:
        return hf_generate(model, tokenizer, prompts, **sampling)

    def close(self) -> None:
        pass


@ROLLOUT_BACKENDS.register("vllm")
def vllm_backend(model_path: str, *, precision: str, seed: int) -> RolloutBackend:
    """Backend ``vllm`` (imported here: vllm is optional and slow to import)."""
    from workbench.engine.vllm_rollout import VLLMRollout

    return VLLMRollout(model_path, precision=precision, seed=seed)
