"""Named seed streams (engine/seeds.py): the exact integers each returns, worked by hand, and the
single-process fast path of the rank plumbing (engine/ranks.py)."""

import torch

from workbench.engine import seeds
from workbench.engine.ranks import Ranks, global_counts


def test_stream_and_rank_stream():
    assert seeds.stream(2, 5) == 2_000_011  # 2 * 1_000_003 + 5
    assert seeds.rank_stream(2, 5, 1, 4) == 8_000_045  # 2_000_011 * 4 + 1
    assert seeds.rank_stream(2, 5, 0, 1) == seeds.stream(2, 5)  # one process: rank 0 of world 1


def test_rollout_and_greedy_baseline_seeds():
    assert seeds.rollout_seed(3, 7, 0, 1) == 3_000_016  # 3 * 1_000_003 + 7
    assert seeds.rollout_seed(3, 7, 1, 2, round_=1) == 6_209_491  # (3_000_009 + 7 + 104_729) * 2 + 1
    assert seeds.greedy_baseline_seed(3, 7, 1, 2) == 6_000_033  # 3_000_016 * 2 + 1


def test_order_seeds():
    assert seeds.prompt_order_seed(5) == 5
    assert seeds.prompt_order_seed(5, 2) == 209_463  # 5 + 2 * 104_729
    assert seeds.epoch_order_seed(2, 3) == 15_841  # 2 * 7919 + 3
    assert seeds.minibatch_order_seed(4, 9) == 133  # 4 * 31 + 9


def test_eval_seeds():
    assert seeds.eval_seed(1, 0, 1) == 8_777_780  # 1_000_003 + 7_777_777
    assert seeds.eval_seed(1, 0, 1, sampled=True) == 16_555_557  # 8_777_780 + 7_777_777
    assert seeds.eval_seed(1, 1, 2) == 17_555_561  # 8_777_780 * 2 + 1


def test_completion_and_warmup_seeds():
    assert seeds.completion_seeds(0, 4) == [0, 1, 2, 3]
    assert seeds.completion_seeds(2, 2) == [2_000_006, 2_000_007]
    assert seeds.completion_seeds(5000, 1) == [705_047_706]  # 5_000_015_000 - 2 * (2^31 - 1)
    assert seeds.warmup_data_seed(0, 3, 2) == 23  # 3 * 7 + 2
    assert seeds.warmup_data_seed(1, 0, 6) == 7_000_027  # 1_000_003 * 7 + 6


def test_one_process_ranks_return_their_input_untouched():
    ranks = Ranks(accelerator=None)  # never touched with one process
    t = torch.tensor([1.5, -2.0])
    assert ranks.gather(t) is t and ranks.sum(t) is t and ranks.reduce(t, "min") is t
    assert ranks.gather_objects([1, "a"]) == [1, "a"]
    assert ranks.rows(3) == slice(0, 3) and Ranks(None, rank=2, world=4).rows(3) == slice(6, 9)
    loss_mask = torch.tensor([[1.0, 1.0, 0.0], [0.0, 0.0, 0.0]])
    completion_mask = torch.tensor([[1.0, 1.0, 0.0], [1.0, 0.0, 0.0]])
    num_tokens, num_seqs = global_counts(ranks, loss_mask, completion_mask)
    assert (float(num_tokens), float(num_seqs)) == (2.0, 2.0)  # the masked-out completion still counts
