"""Every seed stream of a run, named, in one place (pure integers, no torch).

A run draws randomness for several independent purposes: the prompt order, each step's sampling,
dynamic sampling's extra rounds, ReMax's greedy baselines, the minibatch order, the held-out eval,
the tiny model's warm-up data and vLLM's per-completion seeds. Each gets its own stream so that
changing one (e.g. turning eval on) never shifts another's numbers, and each is a pure function
of its inputs so that a resumed run or a rerun draws the same values.

The shared construction is ``stream(seed, i) = seed * SEED_STRIDE + i``: distinct (seed, i) pairs
with 0 <= i < SEED_STRIDE never collide. The salts added to i (DYNAMIC_ROUND_SEED times the round,
EVAL_SEED_SALT) keep streams apart only for runs shorter than the salt: dynamic sampling's round
r >= 1 of step k draws what round 0 of step k + r * 104,729 draws (a run of more than 104,729
steps), and the eval's indices start at 7,777,777, beyond any step (at most 1,000,000) but past
the stride, so seed s's eval draws seed s + 7's stream at a step index. The values are those the
runs were recorded with, so they stay. Spread
over data-parallel ranks as ``stream * world + rank`` (each rank samples different completions,
and one process reproduces rank 0 of a world-1 run).
"""

from __future__ import annotations

#: Multiplies the run seed before an index is added (a prime; seed s at index i and seed s + 1 at
#: index i - stride would collide, which needs an index of at least the stride).
SEED_STRIDE = 1_000_003
#: Offsets the prompt order and sampling seeds of dynamic sampling's later rounds (a prime).
DYNAMIC_ROUND_SEED = 104_729
#: Offsets the held-out eval's stream from training's (and its sampled pass@k from its greedy pass).
EVAL_SEED_SALT = 7_777_777
#: vLLM seeds are 64-bit; per-completion seeds are kept in a safe positive range.
VLLM_SEED_MODULUS = 2**31 - 1
#: The tiny model's warm-up draws each of its (at most this many) tasks' rows from its own stream.
WARMUP_TASK_SLOTS = 7
#: Multipliers of the two plain streams (primes; the values the runs were recorded with).
EPOCH_ORDER_STRIDE = 7919
MINIBATCH_ORDER_STRIDE = 31


def stream(seed: int, i: int) -> int:
    """Index ``i`` of run seed ``seed``'s stream: seed * 1_000_003 + i."""
    return seed * SEED_STRIDE + i


def rank_stream(seed: int, i: int, rank: int, world: int) -> int:
    """``stream(seed, i)`` for rank ``rank`` of ``world`` processes: stream * world + rank."""
    return stream(seed, i) * world + rank


def rollout_seed(seed: int, step: int, rank: int, world: int, round_: int = 0) -> int:
    """The generation seed of step ``step`` on one rank; dynamic sampling's round r >= 1 draws
    from index step + r * DYNAMIC_ROUND_SEED (round 0 is the step's ordinary rollout)."""
    return rank_stream(seed, step + round_ * DYNAMIC_ROUND_SEED, rank, world)


def greedy_baseline_seed(seed: int, step: int, rank: int, world: int) -> int:
    """ReMax's greedy baseline generation of step ``step`` (the step's round-0 rollout seed:
    greedy decoding draws nothing, the seed only fixes the backend's state)."""
    return rollout_seed(seed, step, rank, world)


def prompt_order_seed(seed: int, round_: int = 0) -> int:
    """The seed of the prompt stream's shuffles; dynamic sampling's later rounds read another order."""
    return seed + round_ * DYNAMIC_ROUND_SEED


def epoch_order_seed(seed: int, epoch: int) -> int:
    """The shuffle of epoch ``epoch`` of the prompt stream: seed * 7919 + epoch."""
    return seed * EPOCH_ORDER_STRIDE + epoch


def minibatch_order_seed(seed: int, step: int) -> int:
    """The permutation of step ``step``'s rows into minibatches (every pass of the step draws
    from this one generator): seed * 31 + step."""
    return seed * MINIBATCH_ORDER_STRIDE + step


def eval_seed(seed: int, rank: int, world: int, sampled: bool = False) -> int:
    """The held-out eval's generation seed on one rank: the greedy pass, or with ``sampled`` the
    pass@k samples (EVAL_SEED_SALT further on). Chunks of the eval add their row offset."""
    greedy = rank_stream(seed, EVAL_SEED_SALT, rank, world)
    return greedy + EVAL_SEED_SALT if sampled else greedy


def completion_seeds(seed: int, batch: int) -> list[int]:
    """One vLLM sampling seed per completion of a batch: distinct within the batch, a pure function
    of (``seed``, row), so a rerun with the same seed draws the same completions.

    seed_i = (seed * 1_000_003 + i) mod (2^31 - 1), i = 0..batch-1."""
    return [stream(seed, i) % VLLM_SEED_MODULUS for i in range(batch)]


def warmup_data_seed(seed: int, step: int, task_index: int) -> int:
    """The tiny model's warm-up rows of task ``task_index`` (sorted task order) at step ``step``
    of the build with seed ``seed``: stream(seed, step) * 7 + task_index."""
    return stream(seed, step) * WARMUP_TASK_SLOTS + task_index
