"""Forward passes over prompt + completion: per-token log-probs, entropy, values."""

from __future__ import annotations

import copy

import torch
from torch import nn

from workbench.core import entropy_from_logits, logprobs_from_logits, sum_pi_squared_from_logits


def sequence_inputs(prompt_ids, prompt_mask, completion_ids, completion_mask):
    """Concatenate prompt and completion; position ids follow the attention mask, as in
    ``generate`` with left padding (so trainer and rollout log-probs agree)."""
    input_ids = torch.cat([prompt_ids, completion_ids], dim=1)
    attention_mask = torch.cat([prompt_mask, completion_mask.to(prompt_mask.dtype)], dim=1)
    position_ids = (attention_mask.long().cumsum(-1) - 1).clamp(min=0)
    return input_ids, attention_mask, position_ids


def completion_logits(model, prompt_ids, prompt_mask, completion_ids, completion_mask) -> torch.Tensor:
    """Logits that predict each completion token. -> (B, T, V)."""
    input_ids, attention_mask, position_ids = sequence_inputs(prompt_ids, prompt_mask, completion_ids, completion_mask)
    P, T = prompt_ids.shape[1], completion_ids.shape[1]
    logits = model(input_ids=input_ids, attention_mask=attention_mask, position_ids=position_ids).logits
    return logits[:, P - 1 : P - 1 + T]


def logprobs_and_entropy(model, batch, temperature: float, with_entropy: bool = True, entropy_grad: bool = False):
    """Per-token log pi(token) (B, T) and entropy (B, T) (None if not asked; differentiable only
    with ``entropy_grad``, for an entropy bonus). Padding positions hold 0.

    The forward pass covers only the first L = (longest valid completion) positions: completions
    are padded to L_max but usually end far earlier, and with causal attention and padded keys
    masked out, the valid positions' values do not depend on the padding (same values, ~2x less
    compute on short answers). Outputs are padded back to T.

    ``batch``: anything with prompt_ids, prompt_mask, completion_ids, completion_mask (a Rollout
    or a StepBatch)."""
    T, ids, logits = _valid_logits(model, batch)
    L = ids.shape[1]
    logp = nn.functional.pad(logprobs_from_logits(logits, ids, temperature), (0, T - L))
    entropy = None
    if with_entropy or entropy_grad:
        entropy = nn.functional.pad(entropy_from_logits(logits if entropy_grad else logits.detach(), temperature), (0, T - L))
    return logp, entropy


def _valid_logits(model, batch) -> tuple[int, torch.Tensor, torch.Tensor]:
    """(T, completion ids (B, L), logits (B, L, V)) over the first L = longest valid completion
    positions (see ``logprobs_and_entropy``)."""
    T = batch.completion_ids.shape[1]
    L = max(1, int(batch.completion_mask.sum(dim=1).max()))
    ids, mask = batch.completion_ids[:, :L], batch.completion_mask[:, :L]
    return T, ids, completion_logits(model, batch.prompt_ids, batch.prompt_mask, ids, mask)


@torch.no_grad()
def logprobs_and_sum_pi_squared(model, batch, temperature: float) -> tuple[torch.Tensor, torch.Tensor]:
    """Per-token log pi(token) (B, T), as ``logprobs_and_entropy``, and sum_v pi_v^2 (B, T) of the
    sampling distribution softmax(logits / temperature) at each position, from the same forward:
    the policy statistics the optimal token baselines weigh paths by. Padding positions hold 0."""
    T, ids, logits = _valid_logits(model, batch)
    L = ids.shape[1]
    logp = nn.functional.pad(logprobs_from_logits(logits, ids, temperature), (0, T - L))
    sum_pi_squared = sum_pi_squared_from_logits(logits / temperature) * batch.completion_mask[:, :L].to(logits.dtype)
    return logp, nn.functional.pad(sum_pi_squared, (0, T - L))


class ValueModel(nn.Module):
    """PPO critic: a copy of the policy's backbone with a scalar head (initialised at 0).

    V(s_t) is read at the position *before* completion token t (the state that token is
    chosen in), so values line up with the completion's log-probs.
    """

    def __init__(self, policy: nn.Module) -> None:
        super().__init__()
        self.backbone = copy.deepcopy(policy.get_decoder() if hasattr(policy, "get_decoder") else policy.model)
        hidden = policy.config.hidden_size
        self.head = nn.Linear(hidden, 1)
        nn.init.zeros_(self.head.weight)
        nn.init.zeros_(self.head.bias)

    def forward(self, prompt_ids, prompt_mask, completion_ids, completion_mask) -> torch.Tensor:
        input_ids, attention_mask, position_ids = sequence_inputs(prompt_ids, prompt_mask, completion_ids, completion_mask)
        hidden = self.backbone(input_ids=input_ids, attention_mask=attention_mask, position_ids=position_ids).last_hidden_state
        P, T = prompt_ids.shape[1], completion_ids.shape[1]
        return self.head(hidden[:, P - 1 : P - 1 + T]).squeeze(-1).float()
