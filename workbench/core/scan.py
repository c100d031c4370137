"""Discounted reverse cumulative sums, vectorised over the batch *and* over time.

    y_t = sum_{t' >= t} c^(t' - t) x_t'            (over valid positions only)

This one primitive gives returns-to-go (c = gamma) and GAE (c = gamma * lambda, on TD errors).
Rows are first packed so that valid positions are contiguous on the left (a stable sort of the
mask), which makes a mask with holes behave like verl's loops: masked positions are skipped, not
treated as zero-reward steps. The packed sum is computed block-wise: inside a block of K steps a
(K, K) matrix of powers of c does the sum in one matmul, and a reverse loop over T/K blocks carries
the tail. That is O(B T K) work with T/K Python iterations instead of T.
"""

from __future__ import annotations

import torch

from .masked import zero_padding

BLOCK = 64


def is_prefix_mask(mask: torch.Tensor) -> bool:
    """True when every row is 1...1 0...0 (right padding), so no packing is needed."""
    m = mask.bool()
    return bool((m[:, 1:] <= m[:, :-1]).all()) if m.shape[1] > 1 else True


def pack_left(mask: torch.Tensor) -> torch.Tensor:
    """(B, T) mask -> (B, T) gather index that moves valid positions to the left, in order."""
    return torch.argsort((~mask.bool()).to(torch.int8), dim=1, stable=True)


def _reverse_discounted_cumsum_dense(x: torch.Tensor, discount: float, block: int = BLOCK) -> torch.Tensor:
    """y_t = sum_{t'>=t} discount^(t'-t) x_t' for every row of x (B, T), no mask."""
    B, T = x.shape
    K = min(block, T)
    pad = (-T) % K
    xb = torch.nn.functional.pad(x, (0, pad)).view(B, -1, K)  # trailing zeros change nothing
    idx = torch.arange(K, device=x.device)
    exponent = idx[None, :] - idx[:, None]  # [j, k] = k - j
    c = torch.tensor(discount, dtype=x.dtype, device=x.device)
    within = torch.where(exponent >= 0, c.pow(exponent.clamp(min=0).to(x.dtype)), torch.zeros((), dtype=x.dtype))
    local = xb @ within.T  # local[..., j] = sum_{k >= j} c^(k-j) x_k inside the block
    carry_weight = c.pow((K - idx).to(x.dtype))  # c^(K-j): how the next block's y_0 reaches position j
    out = torch.empty_like(local)
    carry = torch.zeros(B, dtype=x.dtype, device=x.device)
    for b in range(local.shape[1] - 1, -1, -1):
        out[:, b] = local[:, b] + carry_weight * carry[:, None]
        carry = out[:, b, 0]
    return out.reshape(B, -1)[:, :T]


def reverse_discounted_cumsum(x: torch.Tensor, discount: float, mask: torch.Tensor) -> torch.Tensor:
    """Masked discounted reverse cumsum. x, mask: (B, T) -> (B, T), 0 on masked positions."""
    x = zero_padding(x, mask)
    if is_prefix_mask(mask):
        return zero_padding(_reverse_discounted_cumsum_dense(x, discount), mask)
    order = pack_left(mask)
    packed = _reverse_discounted_cumsum_dense(x.gather(1, order), discount)
    return zero_padding(torch.zeros_like(x).scatter(1, order, packed), mask)


def next_valid_value(values: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """V at the next *valid* position after t (0 after the last one). values, mask: (B, T)."""
    m = mask.to(values.dtype)
    zeros = torch.zeros_like(values)
    if is_prefix_mask(mask):
        return torch.cat([(values * m)[:, 1:], zeros[:, :1]], dim=1)
    order = pack_left(mask)
    packed = (values * m).gather(1, order)  # valid values first, then zeros
    return zeros.scatter(1, order, torch.cat([packed[:, 1:], zeros[:, :1]], dim=1))


def reverse_discounted_cumsum_reset(x: torch.Tensor, discount: float, keep: torch.Tensor) -> torch.Tensor:
    """verl's REINFORCE++ return loop, holes included: G_t = x_t + discount * G_{t+1}, then the
    running return is multiplied by keep_t, so a hole (keep_t = 0) resets it and the tokens
    before a hole never see the rewards after it. x, keep: (B, T) -> (B, T), G_t kept on holes.

    Why a loop: this reproduces ``compute_reinforce_plus_plus_outcome_advantage`` exactly; only
    the rollout-rejection path (a holed mask) takes it, the prefix-mask path stays the scan."""
    out = torch.zeros_like(x)
    running = torch.zeros_like(x[:, 0])
    k = keep.to(x.dtype)
    for t in reversed(range(x.shape[1])):
        running = x[:, t] + discount * running
        out[:, t] = running
        running = running * k[:, t]
    return out
