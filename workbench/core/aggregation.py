"""Loss aggregation: how per-token losses (B, T) become one scalar (names as in verl).

    token-mean               sum(l m) / sum(m)                     [TRL dapo / bnpo]
    seq-mean-token-mean      mean_i( sum_t l m / n_i )             [TRL grpo]
    seq-mean-token-sum       mean_i( sum_t l m )
    seq-mean-token-sum-norm  sum(l m) / (B * L_max)                [TRL dr_grpo; verl >= 0.9]
    token-sum-norm           sum(l m) / L_max                      [verl < 0.9's seq-mean-token-sum-norm]
    token-sum                sum(l m)                              [verl 0.9.1 token-sum]

seq-mean-token-mean gives each token of a short sequence more weight than one of a long
sequence (1/n_i): a length bias (Dr. GRPO). token-mean and the *-norm modes give every token the
same weight. Dr. GRPO's normaliser has two conventions. TRL (``loss_type="dr_grpo"``) divides
by B * L_max; verl 0.9's ``seq-mean-token-sum-norm`` is its seq-mean-token-sum divided by
``loss_scale_factor`` (default: the padded length), i.e. by (non-empty rows) * L_max, the same
number when every row has a token and L_max is passed as the scale factor. verl before 0.9
divided by ``loss_scale_factor`` alone, with no division by the batch: that convention is kept
here as ``token-sum-norm``. The two differ only by the constant factor B, i.e. the step size.

Global-batch normalisation: when a batch is split into micro-batches (gradient accumulation,
several ranks), pass the *global* denominators ``num_tokens`` (sum of the loss mask over the whole
batch) and ``num_seqs`` (number of completions in it); summing the micro-batch losses then gives
exactly the full-batch loss (the bug of TRL #3021 / verl #5625 is dividing by local counts).
``batch_normalizers`` takes the sequences from the *completion* mask: a completion whose loss is
masked out (DAPO truncation masking, OPSM) still counts as one of the B sequences, as TRL divides
Dr. GRPO's loss by B (ESTIMATORS.md); it only stops contributing tokens.
"""

from __future__ import annotations

from typing import Callable

import torch

from .masked import masked_sum
from .registry import Registry
from .shapes import check_2d, check_like

AggregationFn = Callable[..., torch.Tensor]
LOSS_AGGREGATIONS: Registry[AggregationFn] = Registry("loss aggregation")


def _as_tensor(x, like: torch.Tensor) -> torch.Tensor:
    return torch.as_tensor(x, dtype=like.dtype, device=like.device)


@LOSS_AGGREGATIONS.register("token-mean")
def token_mean(loss, mask, *, num_tokens, num_seqs, max_len):
    """sum(l m) / num_tokens."""
    return masked_sum(loss, mask) / _as_tensor(num_tokens, loss).clamp(min=1)


@LOSS_AGGREGATIONS.register("seq-mean-token-mean")
def seq_mean_token_mean(loss, mask, *, num_tokens, num_seqs, max_len):
    """sum_i (sum_t l m / n_i) / num_seqs."""
    per_seq = masked_sum(loss, mask, dim=1) / mask.sum(dim=1).clamp(min=1).to(loss.dtype)
    return per_seq.sum() / _as_tensor(num_seqs, loss).clamp(min=1)


@LOSS_AGGREGATIONS.register("seq-mean-token-sum")
def seq_mean_token_sum(loss, mask, *, num_tokens, num_seqs, max_len):
    """sum_i (sum_t l m) / num_seqs."""
    return masked_sum(loss, mask) / _as_tensor(num_seqs, loss).clamp(min=1)


def _require_max_len(max_len, mode: str) -> float:
    if max_len is None or max_len <= 0:
        raise ValueError(f"loss aggregation {mode!r} needs max_len (L_max, the recipe's max completion length) > 0, got {max_len!r}")
    return float(max_len)


@LOSS_AGGREGATIONS.register("seq-mean-token-sum-norm")
def seq_mean_token_sum_norm(loss, mask, *, num_tokens, num_seqs, max_len):
    """sum(l m) / (num_seqs * L_max)  (Dr. GRPO: TRL's dr_grpo, verl >= 0.9)."""
    L = _require_max_len(max_len, "seq-mean-token-sum-norm")
    return masked_sum(loss, mask) / (_as_tensor(num_seqs, loss).clamp(min=1) * L)


@LOSS_AGGREGATIONS.register("token-sum-norm")
def token_sum_norm(loss, mask, *, num_tokens, num_seqs, max_len):
    """sum(l m) / L_max  (verl < 0.9's seq-mean-token-sum-norm: no division by the batch)."""
    return masked_sum(loss, mask) / _require_max_len(max_len, "token-sum-norm")


@LOSS_AGGREGATIONS.register("token-sum")
def token_sum(loss, mask, *, num_tokens, num_seqs, max_len):
    """sum(l m), no normaliser (verl 0.9.1 ``token-sum``: every token's gradient counts in full,
    so the step grows with the batch's token count; verl multiplies by dp_size to undo the
    ranks' gradient averaging, as the trainer does for every mode here)."""
    return masked_sum(loss, mask)


def aggregate_loss(
    mode: str,
    loss: torch.Tensor,
    mask: torch.Tensor,
    *,
    max_len: int | None = None,
    num_tokens: float | torch.Tensor | None = None,
    num_seqs: float | torch.Tensor | None = None,
) -> torch.Tensor:
    """Aggregate per-token losses (B, T) to a scalar with the registered ``mode``.

    num_tokens / num_seqs default to ``batch_normalizers(mask)``; pass global counts when this
    batch is one micro-batch of a larger one, or when masked-out completions must still count as
    sequences (see module docstring).
    """
    fn = LOSS_AGGREGATIONS.get(mode)
    check_2d("loss", loss)
    check_like("loss", loss, mask=mask)
    if num_tokens is None or num_seqs is None:
        own_tokens, own_seqs = batch_normalizers(mask)
        num_tokens = own_tokens if num_tokens is None else num_tokens
        num_seqs = own_seqs if num_seqs is None else num_seqs
    return fn(loss, mask, num_tokens=num_tokens, num_seqs=num_seqs, max_len=max_len)


def batch_normalizers(loss_mask: torch.Tensor, completion_mask: torch.Tensor | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    """(num_tokens, num_seqs) of one (micro-)batch, to sum across micro-batches / ranks.

    num_tokens = sum(loss_mask); num_seqs = rows of ``completion_mask`` (default: ``loss_mask``)
    with at least one token, so a completion whose loss is masked out still counts as a sequence.
    loss_mask, completion_mask: (B, T) -> two scalars."""
    rows = loss_mask if completion_mask is None else completion_mask
    return loss_mask.sum(), (rows.sum(dim=1) > 0).sum()
