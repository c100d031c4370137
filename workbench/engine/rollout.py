"""Rollout backends: prompts in, completions (right-padded to L_max) and their log-probs out.

One contract: a backend is built once per run, ``ROLLOUT_BACKENDS.get(name)(model_path,
precision=..., seed=...)`` (the recipe's ``train.rollout``), and then
``backend.generate(policy, tokenizer, prompts, temperature=, top_p=, max_new_tokens=, seed=)``
returns a ``Rollout`` sampled from the policy's *current* weights; ``backend.close()`` frees it.

- ``hf``: transformers ``generate`` on the policy module itself (nothing to sync).
- ``vllm``: an in-process vLLM engine that copies the policy's weights in before every
  generation (``workbench/engine/vllm_rollout.py``; vllm is imported only when chosen).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable, Protocol

import torch

from workbench.core import Registry, logprobs_from_logits


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


class RolloutBackend(Protocol):
    def generate(self, model, tokenizer, prompts: list[str], *, temperature: float, top_p: float,
                 max_new_tokens: int, seed: int) -> Rollout: ...

    def close(self) -> None: ...


#: name -> factory(model_path: str, *, precision: str, seed: int) -> RolloutBackend
ROLLOUT_BACKENDS: Registry[Callable[..., RolloutBackend]] = Registry("rollout backend")


def completion_mask_from_ids(ids: torch.Tensor, eos_id: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Mask up to and including the first EOS; (B, T) -> mask (B, T) float, truncated (B,) bool."""
    is_eos = ids == eos_id
    has_eos = is_eos.any(dim=1)
    first_eos = torch.where(has_eos, is_eos.int().argmax(dim=1), torch.full_like(has_eos, ids.shape[1], dtype=torch.long))
    positions = torch.arange(ids.shape[1], device=ids.device)[None]
    return (positions <= first_eos[:, None]).float(), ~has_eos


def valid_token_lists(ids: torch.Tensor, mask: torch.Tensor) -> list[list[int]]:
    """(B, T) ids and mask -> B lists of the valid token ids (TRL's ``completion_ids``)."""
    return [row[m.bool()].tolist() for row, m in zip(ids, mask)]


def _pad_right(ids: torch.Tensor, length: int, pad_id: int) -> torch.Tensor:
    if ids.shape[1] >= length:
        return ids[:, :length]
    return torch.nn.functional.pad(ids, (0, length - ids.shape[1]), value=pad_id)


@torch.no_grad()
def hf_generate(model, tokenizer, prompts: list[str], *, temperature: float, top_p: float, max_new_tokens: int, seed: int) -> Rollout:
    """transformers ``generate`` with KV cache and left padding; sampled with a seeded generator."""
    enc = tokenizer(prompts, return_tensors="pt", padding=True, add_special_tokens=False)
    device = next(model.parameters()).device
    input_ids, attention_mask = enc["input_ids"].to(device), enc["attention_mask"].to(device)
    torch.manual_seed(seed)
    was_training = model.training
    model.eval()
    out = model.generate(
        input_ids=input_ids,
        attention_mask=attention_mask,
        do_sample=True,
        temperature=temperature,
        top_p=top_p,
        top_k=0,
        max_new_tokens=max_new_tokens,
        pad_token_id=tokenizer.pad_token_id,
        eos_token_id=tokenizer.eos_token_id,
        return_dict_in_generate=True,
        output_logits=True,
    )
    model.train(was_training)
    P = input_ids.shape[1]
    completion_ids = _pad_right(out.sequences[:, P:], max_new_tokens, tokenizer.pad_token_id)
    mask, truncated = completion_mask_from_ids(completion_ids, tokenizer.eos_token_id)
    logits = torch.stack(out.logits, dim=1)  # (B, T', V) raw logits of each generated position
    logp = logprobs_from_logits(logits, completion_ids[:, : logits.shape[1]], temperature)
    logp = _pad_right(logp, max_new_tokens, 0) * mask
    texts = tokenizer.batch_decode(valid_token_lists(completion_ids, mask), skip_special_tokens=True)
    return Rollout(input_ids, attention_mask, completion_ids, mask.to(device), truncated, logp, texts)


@ROLLOUT_BACKENDS.register("hf")
class HFRollout:
    """Backend ``hf``: ``hf_generate`` on the policy module itself, so it always samples the
    current weights (nothing to sync, nothing to free)."""

    def __init__(self, model_path: str, *, precision: str, seed: int) -> None:
        pass

    def generate(self, model, tokenizer, prompts: list[str], **sampling) -> Rollout:
        return hf_generate(model, tokenizer, prompts, **sampling)

    def close(self) -> None:
        pass


@ROLLOUT_BACKENDS.register("vllm")
def vllm_backend(model_path: str, *, precision: str, seed: int) -> RolloutBackend:
    """Backend ``vllm`` (imported here: vllm is optional and slow to import)."""
    from workbench.engine.vllm_rollout import VLLMRollout

    return VLLMRollout(model_path, precision=precision, seed=seed)
