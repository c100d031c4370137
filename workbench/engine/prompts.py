"""Prompts in TRL's dataset formats -> token ids for generation, and the ids generation stops at.

TRL's two prompt formats (``trl.data_utils.is_conversational``):

- standard: ``prompt`` is text. It is tokenised as is (TRL does not template standard prompts),
  with the tokenizer's own special tokens (``add_special_tokens=True``, as TRL does);
- conversational: ``prompt`` is a list of ``{"role", "content"}`` messages, rendered with the
  tokenizer's chat template and the generation prompt (``add_generation_prompt=True``). The
  rendered text already holds the template's special tokens, so it is tokenised without adding
  more.

An optional ``system_prompt`` becomes the conversation's first message (replacing a system
message the dataset brought: the recipe's explicit setting wins). Standard prompts have no
messages to put it in, so a system prompt with a standard prompt is an error rather than a
guess. ``max_prompt_length`` keeps the LAST tokens of a longer prompt (left truncation, as TRL's
``prompt_ids[:, -max_prompt_length:]``: the question's end and the generation prompt survive)
and counts the prompts it cut, for a ``prompts/truncated_ratio``-style metric.

No torch here: ids are Python lists; ``tokenizer.pad({"input_ids": ids}, return_tensors="pt")``
with ``padding_side="left"`` turns them into a batch.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from workbench.model_facts import merge_eos_ids  # noqa: F401  (one rule for the validator and the engine)

Message = dict[str, Any]
Prompt = str | list[Message]


def is_conversational(prompt: Any) -> bool:
    """True for a list of ``{"role", "content"}`` messages (TRL's conversational format)."""
    return isinstance(prompt, list) and bool(prompt) and all(isinstance(m, dict) and "role" in m for m in prompt)


def with_system_prompt(messages: list[Message], system_prompt: str | None) -> list[Message]:
    """``messages`` with ``system_prompt`` as the first (system) message; unchanged when None.

    A leading system message in ``messages`` is replaced, never duplicated.
    """
    if system_prompt is None:
        return list(messages)
    rest = messages[1:] if messages and messages[0].get("role") == "system" else messages
    return [{"role": "system", "content": system_prompt}, *rest]


def render_prompt(tokenizer: Any, prompt: Prompt, *, system_prompt: str | None = None) -> str:
    """The text the model continues from: a standard prompt as is, a conversational one through
    the chat template with the generation prompt. ValueError for a system prompt on a standard
    prompt, a malformed prompt, or a conversational prompt for a tokenizer without a template."""
    if isinstance(prompt, str):
        if system_prompt is not None:
            raise ValueError(
                "system_prompt needs conversational prompts (a list of {role, content} messages); "
                "standard prompts are plain text and are not templated (as in TRL)"
            )
        return prompt
    if not is_conversational(prompt):
        raise ValueError(
            f"prompt {str(prompt)[:80]!r} is neither text (standard format) nor a list of "
            "{role, content} messages (conversational format)"
        )
    if not getattr(tokenizer, "chat_template", None):
        raise ValueError(
            f"the model's tokenizer ({getattr(tokenizer, 'name_or_path', '?')}) has no chat template, "
            "so conversational prompts cannot be rendered; use standard (text) prompts"
        )
    return tokenizer.apply_chat_template(
        with_system_prompt(prompt, system_prompt), tokenize=False, add_generation_prompt=True
    )


def left_truncate(ids: Sequence[int], max_length: int | None) -> list[int]:
    """The last ``max_length`` ids (all of them when None or already short enough)."""
    if max_length is not None and max_length < 1:
        raise ValueError(f"max_prompt_length={max_length} must be a positive number of tokens")
    return list(ids) if max_length is None or len(ids) <= max_length else list(ids[len(ids) - max_length :])


@dataclass(frozen=True)
class EncodedPrompts:
    """A batch of prompts ready for generation.

    Attributes:
        texts: B rendered prompts (before truncation: what a person reads).
        input_ids: B lists of token ids, each at most ``max_prompt_length`` long.
        num_truncated: how many of the B prompts lost tokens to ``max_prompt_length``.
    """

    texts: list[str]
    input_ids: list[list[int]]
    num_truncated: int


def encode_prompts(
    tokenizer: Any, prompts: Sequence[Prompt], *, system_prompt: str | None = None,
    max_prompt_length: int | None = None,
) -> EncodedPrompts:
    """Render (see :func:`render_prompt`), tokenise and left-truncate B prompts of either format.
    Each distinct prompt is rendered and tokenised once (GRPO's batch repeats each G times); the
    rows are the same lists either way."""
    encoded: dict[str, tuple[str, list[int]]] = {}  # repr(prompt) -> (text, ids): a prompt of either format as a key

    def encode(prompt: Prompt) -> tuple[str, list[int]]:
        key = repr(prompt)
        if key not in encoded:
            text = render_prompt(tokenizer, prompt, system_prompt=system_prompt)
            # a rendered chat template already holds its special tokens; plain text gets the tokenizer's
            encoded[key] = text, tokenizer(text, add_special_tokens=isinstance(prompt, str))["input_ids"]
        return encoded[key]

    texts, full = zip(*map(encode, prompts)) if prompts else ((), ())
    kept = [left_truncate(ids, max_prompt_length) for ids in full]  # a list of its own per row
    return EncodedPrompts(list(texts), kept, sum(len(k) < len(f) for k, f in zip(kept, full)))


def stop_token_ids(tokenizer: Any, generation_config: Any = None) -> list[int]:
    """The ids generation ends at for a loaded tokenizer and ``model.generation_config``."""
    return merge_eos_ids(tokenizer.eos_token_id, getattr(generation_config, "eos_token_id", None))
