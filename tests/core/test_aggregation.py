"""Loss aggregation: the RLHF book's example, hand values, global-batch normalisation."""

import pytest
import torch

from tests.helpers import assert_values
from workbench.core import aggregate_loss, batch_normalizers

# The RLHF book (policy-gradient chapter, "loss aggregation"): two completions of 4 and 7 tokens,
# ratio = 1 everywhere, advantage 2, L_max = 7. Loss = ratio * advantage.
BOOK_MASK = torch.tensor([[1, 1, 1, 1, 0, 0, 0], [1, 1, 1, 1, 1, 1, 1]], dtype=torch.float64)
BOOK_ADV = 2.0


def book_grad(mode, advantage=BOOK_ADV):
    ratio = torch.ones(2, 7, dtype=torch.float64, requires_grad=True)
    aggregate_loss(mode, ratio * advantage, BOOK_MASK, max_len=7).backward()
    return ratio.grad


def test_book_seq_mean_token_mean():
    # mean_i( sum_t 2 r / n_i ): 2 / (2 * 4) = 0.25 and 2 / (2 * 7) = 0.1429
    assert_values(book_grad("seq-mean-token-mean"), [[0.25] * 4 + [0] * 3, [2 / 14] * 7], atol=1e-12)


def test_book_seq_mean_token_sum_norm():
    # sum(2 r) / (B * L_max) = 2 / 14 = 0.1429 for every token of both sequences
    assert_values(book_grad("seq-mean-token-sum-norm"), [[1 / 7] * 4 + [0] * 3, [1 / 7] * 7], atol=1e-12)


def test_book_token_mean():
    # The book's token-level line aggregates the ratio alone (advantage 1): 1 / 11 = 0.0909
    assert_values(book_grad("token-mean", advantage=1.0), [[1 / 11] * 4 + [0] * 3, [1 / 11] * 7], atol=1e-12)
    # with the advantage of 2 the weight simply doubles
    assert_values(book_grad("token-mean"), [[2 / 11] * 4 + [0] * 3, [2 / 11] * 7], atol=1e-12)


LOSS = torch.tensor([[1.0, 2.0, 3.0, 4.0], [5.0, 6.0, 99.0, 99.0]])  # 99 sits in padding
MASK = torch.tensor([[1.0, 1.0, 1.0, 1.0], [1.0, 1.0, 0.0, 0.0]])


@pytest.mark.parametrize(
    "mode,expected",
    [
        ("token-mean", 21 / 6),  # (10 + 11) / 6 tokens
        ("seq-mean-token-mean", (10 / 4 + 11 / 2) / 2),  # = 4
        ("seq-mean-token-sum", (10 + 11) / 2),
        ("seq-mean-token-sum-norm", 21 / (2 * 4)),  # TRL dr_grpo, verl >= 0.9: / (B * L_max)
        ("token-sum-norm", 21 / 4),  # verl < 0.9's seq-mean-token-sum-norm: / L_max
    ],
)
def test_hand_values(mode, expected):
    assert aggregate_loss(mode, LOSS, MASK, max_len=4).item() == pytest.approx(expected)


@pytest.mark.parametrize("mode", ["token-mean", "seq-mean-token-mean", "seq-mean-token-sum", "seq-mean-token-sum-norm", "token-sum-norm"])
def test_micro_batches_with_global_denominators_sum_to_full_batch(mode):
    g = torch.Generator().manual_seed(0)
    loss = torch.randn(8, 10, generator=g)
    mask = (torch.arange(10)[None] < torch.randint(0, 11, (8,), generator=g)[:, None]).float()
    full = aggregate_loss(mode, loss, mask, max_len=10)
    num_tokens, num_seqs = batch_normalizers(mask)
    parts = [
        aggregate_loss(mode, loss[i : i + 3], mask[i : i + 3], max_len=10, num_tokens=num_tokens, num_seqs=num_seqs)
        for i in range(0, 8, 3)
    ]
    assert sum(parts).item() == pytest.approx(full.item(), abs=1e-6)


def test_local_denominators_would_differ():
    # the bug this API exists to prevent: averaging micro-batch means with local token counts
    a = aggregate_loss("token-mean", LOSS[:1], MASK[:1]) + aggregate_loss("token-mean", LOSS[1:], MASK[1:])
    assert a.item() / 2 != pytest.approx(aggregate_loss("token-mean", LOSS, MASK).item())


def test_empty_mask_gives_zero_not_nan():
    for mode in ("token-mean", "seq-mean-token-mean", "seq-mean-token-sum", "seq-mean-token-sum-norm", "token-sum-norm"):
        assert aggregate_loss(mode, LOSS, torch.zeros_like(MASK), max_len=4).item() == 0.0


def test_masked_out_completion_still_counts_as_a_sequence():
    # row 1 is a truncated completion whose loss is masked (DAPO overlong filtering): it gives no
    # tokens but is still one of the B = 2 sequences (TRL's dr_grpo divides by B * L_max)
    completion_mask = torch.tensor([[1.0, 1.0, 0.0, 0.0], [1.0, 1.0, 1.0, 1.0]])
    loss_mask = torch.tensor([[1.0, 1.0, 0.0, 0.0], [0.0, 0.0, 0.0, 0.0]])
    num_tokens, num_seqs = batch_normalizers(loss_mask, completion_mask)
    assert (num_tokens.item(), num_seqs.item()) == (2, 2)
    assert batch_normalizers(loss_mask)[1].item() == 1  # the loss mask alone sees one sequence
    norm = dict(max_len=4, num_tokens=num_tokens, num_seqs=num_seqs)
    # row 0 sums to 1 + 2 = 3
    assert aggregate_loss("seq-mean-token-sum-norm", LOSS, loss_mask, **norm).item() == pytest.approx(3 / (2 * 4))
    assert aggregate_loss("seq-mean-token-sum", LOSS, loss_mask, **norm).item() == pytest.approx(3 / 2)
    assert aggregate_loss("seq-mean-token-mean", LOSS, loss_mask, **norm).item() == pytest.approx((3 / 2) / 2)
    assert aggregate_loss("token-mean", LOSS, loss_mask, **norm).item() == pytest.approx(3 / 2)


def test_sum_norm_requires_max_len():
    with pytest.raises(ValueError, match="needs max_len"):
        aggregate_loss("seq-mean-token-sum-norm", LOSS, MASK)


def test_sum_norm_is_verl_0_9_with_an_empty_row():
    # verl 0.9.1 agg_loss("seq-mean-token-sum-norm"): the sum over the non-empty rows / their
    # number / loss_scale_factor (L_max). A third, empty row adds neither tokens nor a sequence:
    # (10 + 11) / (2 * 4), not / (3 * 4); verl before 0.9 gave (10 + 11) / 4 = token-sum-norm.
    loss = torch.cat([LOSS, torch.full((1, 4), 7.0)])
    mask = torch.cat([MASK, torch.zeros(1, 4)])
    assert aggregate_loss("seq-mean-token-sum-norm", loss, mask, max_len=4).item() == 21 / 8
    assert aggregate_loss("token-sum-norm", loss, mask, max_len=4).item() == 21 / 4
