"""Specs of the advantage shapings (``workbench.core.distillation.ADVANTAGE_SHAPINGS``): applied to
any estimator's advantage when the recipe names a teacher. Their knobs are ``DistillationConfig``
attributes set by ``teacher.*`` fields the recipe declares."""

from __future__ import annotations

from .spec import Knob, Spec, by_name

CORE = "workbench.core.distillation"

#: shaped = slime OPD, the teacher term added to the estimator's advantage; only = pure
#: distillation (Thinking Machines), the reward advantage dropped.
DISTILL_MODES: tuple[str, ...] = ("shaped", "only")

COEF = Knob("teacher.kl_coef", config="coef")
DISCOUNT = Knob("teacher.kl_discount", config="discount")
MODE = Knob("teacher.mode", config="mode", choices=DISTILL_MODES)

SPECS: dict[str, Spec] = by_name(
    Spec("shaping", "opd", "On-policy distillation (OPD)", f"{CORE}:opd_advantages",
         (r"d_t = \log\pi_\theta(o_t) - \log\pi_T(o_t) \quad (o \sim \pi_\theta)",
          r"D_t = \sum_{k \ge t} \gamma^{k-t} d_k", r"A'_t = [\text{shaped}]\,A_t - \lambda D_t"),
         "RL's reward is one number per completion; a teacher grades every token the student sampled, on the "
         "student's own completions (on-policy, so it learns to recover from its own mistakes): the gradient of "
         "the reverse KL(pi_theta || pi_T), mode-seeking (Agarwal et al. 2024; Thinking Machines, Lu et al. 2025).",
         "slime --use-opd --opd-kl-coef (A - lambda d, any estimator, before its advantage normalisation); "
         "tinker-cookbook distillation kl_penalty_coef / kl_discount_factor (reward 0: pure distillation); "
         "here teacher.model / kl_coef / kl_discount / mode.",
         (COEF, DISCOUNT, MODE),
         ("One-sample estimate: d_t < 0 on tokens the teacher likes more than the student; the KL's mean is >= 0.",
          "The teacher must share the student's tokenizer (checked before training).",
          "Added after the estimator and its whitening: lambda is in nats per token whatever the estimator.",
          "On the tiny model the teacher is near-deterministic (reverse KL ~4 nats per token at first): the opd "
          "preset uses lambda = 0.1; pure distillation (mode only) did not learn there in 30 steps."),
         preset="opd", level="token"),
)
