"""Specs of the per-token KL estimators (``workbench.core.kl.KL_ESTIMATORS``), one per registered
name, in registry order, and the KL family's knobs (placement, coefficient, controller)."""

from __future__ import annotations

from .rules import off_unless, zero
from .spec import Spec, by_name

CORE = "workbench.core.kl"

#: Where the KL term goes: the reward, shaped before the advantages (PPO, RLOO, REINFORCE++), or each token's loss (GRPO).
KL_PLACEMENTS: tuple[str, ...] = ("in_reward", "in_loss")

#: KL-family settings that have no effect without a KL term (kl_coef = 0 also loads no reference model).
FAMILY_INERT = {"algorithm.kl_estimator": zero("algorithm.kl_coef", "no KL term, no reference model"),
                "algorithm.kl_placement": zero("algorithm.kl_coef", "no KL term, no reference model"),
                "algorithm.kl_controller": zero("algorithm.kl_coef", "no KL term, no coefficient to adapt"),
                # the adaptive controller's settings (verl algorithm.kl_ctrl.target_kl / horizon)
                **{f"algorithm.kl_{knob}": off_unless("algorithm.kl_controller", "adaptive", f"only the adaptive controller reads a {knob}")
                   for knob in ("target", "horizon")}}

D = r"d = \log\pi_{ref}(x) - \log\pi_\theta(x)"

SPECS: dict[str, Spec] = by_name(
    Spec("kl_estimator", "k1", "k1", f"{CORE}:kl_k1", (r"k_1 = -d,\quad " + D,),
         "The plain log-ratio: unbiased, high variance, can be negative (Schulman 2020).",
         "verl kl_loss_type / kl_penalty kl; TRL RLOOTrainer / PPOTrainer kl_estimator='k1'.", level="token"),
    Spec("kl_estimator", "k2", "k2", f"{CORE}:kl_k2", (r"k_2 = \tfrac{1}{2} d^2",),
         "Biased, low variance; its gradient is the KL's gradient (Schulman 2020).",
         "verl kl_loss_type / kl_penalty mse.", level="token"),
    Spec("kl_estimator", "k3", "k3", f"{CORE}:kl_k3", (r"k_3 = e^{d} - d - 1",),
         "Unbiased, low variance, always >= 0: GRPO's choice (Schulman 2020).",
         "verl kl_loss_type low_var_kl; TRL GRPOTrainer's KL (beta), RLOOTrainer / PPOTrainer kl_estimator='k3'.",
         notes=("Clamped at |k3| <= 10 as in verl, which biases it when one token's KL is huge.",), preset="grpo",
         level="token"),
    Spec("kl_estimator", "abs", "abs", f"{CORE}:kl_abs", (r"|d| = |\log\pi_\theta(x) - \log\pi_{ref}(x)|",),
         "The absolute log-ratio: biased, always >= 0.", "verl kl_loss_type / kl_penalty abs.", level="token"),
    *(Spec("kl_estimator", f"{base}+", f"{base}+ (straight-through)", f"{CORE}:{fn}",
           (rf"{base}^{{+}} = k_2 - \operatorname{{sg}}(k_2) + \operatorname{{sg}}({base})",),
           f"The value of {base}, the gradient of k2: {base}'s value is what is logged and added, while k2's "
           "gradient is the KL's own (k1 and k3 are unbiased in value, not in gradient).",
           f"verl kl_loss_type {verl}.",
           notes=("Differs from the base estimator only in its gradient: with kl_placement in_reward it is the same.",),
           level="token", same_value_as=base)
      for base, fn, verl in (("k1", "kl_k1_plus", "kl+ / k1+"), ("k3", "kl_k3_plus", "low_var_kl+ / k3+"),
                             ("abs", "kl_abs_plus", "abs+"))),
)
