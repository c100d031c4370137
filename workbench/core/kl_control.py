"""How the KL coefficient beta moves between steps: the KL controllers (pure floats, no torch).

verl 0.9.1 ``algorithm.kl_ctrl.type`` (``core_algos.get_kl_controller``): ``fixed`` keeps beta,
``adaptive`` is Ziegler et al. (2019)'s proportional controller. verl adapts only the KL *in the
reward* (``ray_trainer.apply_kl_penalty``; its comment: "kl loss control currently not supported"):
once per step, after the step's rewards were shaped with beta, it updates beta from

    current_kl = mean over the batch of each completion's mean per-token KL (old vs reference log-probs)
    n_steps    = the batch's completions

and logs ``actor/reward_kl_penalty`` (current_kl) and ``actor/reward_kl_penalty_coeff`` (the beta
the step used). Every controller has one signature, ``(beta, current_kl, n_steps, *, target_kl,
horizon) -> beta'``, registered by verl's name. Torch-free: the recipe validates against the
registry's names without loading the maths.
"""

from __future__ import annotations

import math

from .registry import Registry

KL_CONTROLLERS: Registry = Registry("KL controller")

# The proportional error of the adaptive controller is clipped to +-0.2 (Ziegler et al. 2019; verl).
ADAPTIVE_KL_ERROR_CLIP = 0.2


@KL_CONTROLLERS.register("fixed")
def fixed_kl_coef(value: float, current_kl: float, n_steps: int, *, target_kl: float, horizon: int) -> float:
    """beta unchanged (verl ``FixedKLController.update`` is a no-op); the other arguments are unread."""
    return value


@KL_CONTROLLERS.register("adaptive")
def adaptive_kl_coef(value: float, current_kl: float, n_steps: int, *, target_kl: float, horizon: int) -> float:
    """The adaptive KL coefficient after one update (Ziegler et al. 2019, arXiv 1909.08593, Sec. 2.2;
    verl 0.9.1 ``AdaptiveKLController.update``, ``algorithm.kl_ctrl.type="adaptive"``):

        e      = clip(current_kl / target_kl - 1, -0.2, 0.2)
        beta' = beta (1 + e n_steps / horizon)

    beta grows while the measured KL is above target and shrinks below it, by at most 20% of
    n_steps / horizon per update. verl calls it once per step with n_steps = the batch's
    completions and current_kl = the batch mean of each completion's mean in-reward KL, and logs
    them as ``actor/reward_kl_penalty`` (current_kl) and ``actor/reward_kl_penalty_coeff`` (the beta
    the step used). Defaults in verl: kl_coef 0.001, target_kl 0.1, horizon 10000. Pure floats.
    """
    if not target_kl > 0:
        raise ValueError(f"target_kl={target_kl} must be > 0")
    if not horizon > 0:
        raise ValueError(f"horizon={horizon} must be > 0")
    if not math.isfinite(current_kl):
        raise ValueError(f"current_kl={current_kl} is not finite: the coefficient would stay {current_kl} for good")
    # verl multiplies without a check: with n_steps / horizon >= 1 / 0.2 = 5 a KL below target makes
    # beta <= 0 (a reward for drifting away), and a multiplicative controller never leaves 0 again
    if not n_steps / horizon < 1.0 / ADAPTIVE_KL_ERROR_CLIP:
        raise ValueError(f"n_steps / horizon = {n_steps}/{horizon} must be < {1.0 / ADAPTIVE_KL_ERROR_CLIP:g}: one update "
                         "with the KL below target would take the coefficient to 0 (verl: below 0) for good; raise horizon")
    error = min(max(current_kl / target_kl - 1.0, -ADAPTIVE_KL_ERROR_CLIP), ADAPTIVE_KL_ERROR_CLIP)
    return value * (1.0 + error * n_steps / horizon)
