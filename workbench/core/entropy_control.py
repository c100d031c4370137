"""Adaptive entropy coefficient with a target (Skywork-OR1; TRL ``use_adaptive_entropy``).

Pure Python, no torch: the state is two floats, carried from one optimiser update to the next
(and through checkpoints). The rule, as Skywork-OR1 (He et al. 2025, arXiv 2505.22312, Sec. 3.2
"adaptive entropy control") states it and TRL 1.16 ``GRPOTrainer._compute_loss`` implements it:

    after update k, with H_k the token-weighted mean entropy of the update's loss tokens:
        c_{k+1} = min(c_k + delta, c_max)   if H_k <= H_target
        c_{k+1} = max(c_k - delta, c_min)   otherwise
    the bonus applied during update k+1:
        alpha_{k+1} = c_{k+1} * 1[H_k <= H_target]         (0 before the first measurement: H_{-1} = inf)

so the coefficient grows while entropy sits at or below the target and decays above it, and
the bonus acts only while entropy is at or below the target (Skywork-OR1: "the entropy loss is
activated only when the current entropy is lower than the target"). Names and defaults are
TRL's (``entropy_coef`` start value, ``entropy_target`` 0.2, ``entropy_coef_delta`` 0.005,
``entropy_coef_min`` 0.0, ``entropy_coef_max`` 1.0); Skywork-OR1's own scripts
(``or1_scripts/train/7b_8k.sh``) use target 0.2, delta 1e-4, c in [0, 5e-3], c_0 = 0.
"""

from __future__ import annotations

import math
from dataclasses import dataclass


@dataclass(frozen=True)
class EntropyControl:
    """The controller's settings (TRL's names without the ``entropy_`` prefix).

    target: H_target, nats per token. delta: the step of the coefficient per update.
    coef_min, coef_max: the bounds of the coefficient (0 <= coef_min <= coef_max).
    """

    target: float = 0.2
    delta: float = 0.005
    coef_min: float = 0.0
    coef_max: float = 1.0

    def __post_init__(self) -> None:
        for name in ("target", "delta", "coef_min", "coef_max"):
            value = getattr(self, name)
            if not (math.isfinite(value) and value >= 0):
                raise ValueError(f"entropy control {name}={value} must be a finite number >= 0")
        if self.coef_min > self.coef_max:
            raise ValueError(f"entropy_coef_min={self.coef_min} must not exceed entropy_coef_max={self.coef_max}")


@dataclass(frozen=True)
class EntropyControlState:
    """coef: c_k, the coefficient now. last_entropy: H of the previous update (inf before any:
    TRL's conservative start, no bonus until a real measurement arrives)."""

    coef: float
    last_entropy: float = math.inf


def applied_entropy_coef(state: EntropyControlState, control: EntropyControl) -> float:
    """alpha = c * 1[H_prev <= H_target]: the coefficient the current update's loss uses."""
    return state.coef if state.last_entropy <= control.target else 0.0


def update_entropy_control(state: EntropyControlState, entropy: float, control: EntropyControl) -> EntropyControlState:
    """The state after an update whose loss tokens had mean entropy ``entropy`` (state in, state out).

    c + delta (at most coef_max) when entropy <= target, c - delta (at least coef_min) otherwise.
    A non-finite entropy is refused: it would freeze or corrupt the controller silently.
    """
    if not math.isfinite(entropy):
        raise ValueError(f"entropy={entropy} is not finite; the entropy controller needs a measured mean entropy")
    if entropy <= control.target:
        coef = min(state.coef + control.delta, control.coef_max)
    else:
        coef = max(state.coef - control.delta, control.coef_min)
    return EntropyControlState(coef=coef, last_entropy=float(entropy))
