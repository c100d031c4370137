"""Per-token quantities from logits: log-probabilities of the sampled tokens and entropy."""

from __future__ import annotations

import torch


def logprobs_from_logits(logits: torch.Tensor, token_ids: torch.Tensor, temperature: float = 1.0) -> torch.Tensor:
    """log pi(token) = logit[token]/tau - logsumexp(logits/tau). logits (B, T, V), ids (B, T) -> (B, T).

    Dividing by the sampling temperature makes the trainer's log-probs those of the distribution
    the rollout actually sampled from (TRL and verl do the same).
    """
    scaled = logits.float() / temperature
    chosen = scaled.gather(-1, token_ids.long().unsqueeze(-1)).squeeze(-1)
    return chosen - torch.logsumexp(scaled, dim=-1)


def entropy_from_logits(logits: torch.Tensor, temperature: float = 1.0) -> torch.Tensor:
    """H = logsumexp(z) - sum softmax(z) z with z = logits / tau. (B, T, V) -> (B, T)."""
    z = logits.float() / temperature
    return torch.logsumexp(z, dim=-1) - (torch.softmax(z, dim=-1) * z).sum(dim=-1)
