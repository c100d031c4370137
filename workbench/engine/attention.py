"""Grouped-query attention without copying the keys and values once per query head.

transformers' ``sdpa`` attention repeats each key / value head ``num_key_value_groups`` times
(``repeat_kv``: a copy of the cache, per layer and per decoding step) whenever an attention mask
is passed on a CPU or CUDA device, since on CUDA a masked GQA call falls back to the math kernel.
Every batch of the trainer is masked (left-padded prompts) and the CPU kernel takes the grouped
heads itself (``enable_gqa=True``), so there the copy is pure cost: SmolLM2-135M (9 query heads,
3 key / value heads) generated 32 completions x 32 tokens in 12.3 s instead of 14.9. The
forward gives the same numbers bit for bit (the kernel reads key head h // groups for query head
h, as the repeated copy holds; tests/engine/test_attention.py compares samples and log-probs).

Only calls through which no gradient flows take the grouped kernel (generation, the old,
reference and teacher log-probs): its backward sums each key head's gradient over its query
heads in another order than ``repeat_kv``'s backward (equal to float rounding, not bit for bit)
and measured no faster on the shared-prefix training forward, so a training pass stays
transformers' ``sdpa`` and every trained number is unchanged. Every other call (no mask, no
grouped heads, a paged cache, a position bias, a CUDA device) is transformers' ``sdpa`` too.

``WORKBENCH_SDPA`` is registered in transformers' ``AttentionInterface`` (the function) and
``AttentionMaskInterface`` (sdpa's masks); :func:`use_grouped_attention` switches a model to it
where it applies (a CPU model whose config uses ``sdpa``).
"""

from __future__ import annotations

from typing import Any

WORKBENCH_SDPA = "workbench_sdpa_gqa"


def grouped_sdpa_attention(module, query, key, value, attention_mask, dropout: float = 0.0, scaling: float | None = None,
                           is_causal: bool | None = None, **kwargs) -> tuple[Any, None]:
    """softmax(q k^T * scaling + mask) v with key / value head h // groups for query head h.

    query (B, H, Tq, D); key, value (B, Hkv, Tk, D) with H = groups * Hkv; attention_mask (B, 1, Tq,
    Tk) bool (True: attend) or additive float -> ((B, Tq, H, D), None), as transformers' sdpa.
    With a mask ``is_causal`` is False there too (the mask carries causality). A query, key or
    value that requires grad goes through transformers' ``sdpa_attention_forward`` (module docstring)."""
    import torch
    from transformers.integrations.sdpa_attention import sdpa_attention_forward

    grouped = getattr(module, "num_key_value_groups", 1) > 1
    gradient = query.requires_grad or key.requires_grad or value.requires_grad  # LoRA may adapt k / v alone
    if (attention_mask is None or not grouped or gradient or query.device.type != "cpu" or kwargs.get("cache") is not None
            or kwargs.get("position_bias") is not None or kwargs.get("output_attentions", False)):
        return sdpa_attention_forward(module, query, key, value, attention_mask, dropout=dropout, scaling=scaling,
                                      is_causal=is_causal, **kwargs)
    out = torch.nn.functional.scaled_dot_product_attention(query, key, value, attn_mask=attention_mask, dropout_p=dropout,
                                                           scale=scaling, is_causal=False, enable_gqa=True)
    return out.transpose(1, 2).contiguous(), None


def _register() -> None:
    """``WORKBENCH_SDPA`` in transformers' attention and mask registries (idempotent)."""
    from transformers import AttentionInterface
    from transformers.masking_utils import AttentionMaskInterface, sdpa_mask

    AttentionInterface.register(WORKBENCH_SDPA, grouped_sdpa_attention)
    AttentionMaskInterface.register(WORKBENCH_SDPA, sdpa_mask)


def use_grouped_attention(model) -> bool:
    """Switch ``model`` (a transformers model, or a PEFT wrapper of one; call it before DDP wraps it) to
    ``WORKBENCH_SDPA`` when it runs on a CPU with ``sdpa`` attention; True when switched. A model
    with other attention (eager, flash) or on an accelerator is left as it is."""
    base = model.get_base_model() if hasattr(model, "get_base_model") else model
    config = getattr(base, "config", None)
    if config is None or getattr(config, "_attn_implementation", None) != "sdpa" or base.device.type != "cpu":
        return False
    _register()
    base.set_attn_implementation(WORKBENCH_SDPA)
    return base.config._attn_implementation == WORKBENCH_SDPA
