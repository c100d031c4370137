"""Specs of the policy losses (``workbench.core.policy_losses.POLICY_LOSSES``), one per registered
name, in registry order, and their knobs: ``KNOBS`` declares every ``PolicyLossConfig`` field once
(type, default, bounds, help); the recipe generates its ``algorithm.<knob>`` fields from it."""

from __future__ import annotations

from dataclasses import replace

from .rules import at_ratio_one, off_at, single_pass
from .spec import MAX_COEF, MAX_SEED, Knob, LabSlider, RecipeData, RegionLab, Spec, Walkthrough, by_name, setting

CORE = "workbench.core.policy_losses"

#: Settings of the rollout-mismatch corrections that weigh or mask the policy loss, inert while
#: their switch is off (verl rollout_is / rollout_rs at null): a sweep over them would give equal arms.
FAMILY_INERT = {
    **{f"algorithm.rollout_correction_{knob}": off_at("algorithm.rollout_correction", "none", "no importance weights to bound or normalise")
       for knob in ("min", "max", "batch_normalize")},
    **{f"algorithm.rollout_rejection_{knob}": off_at("algorithm.rollout_rejection", "none", "no rejection to bound")
       for knob in ("min", "max")},
}

GSPO_VARIANTS: tuple[str, ...] = ("sequence", "token")
CISPO_BOUNDS: tuple[str, ...] = ("relative", "absolute")
# DPPO's cap C of the detached ratio when clip_c is unset. verl's compute_policy_loss_dppo_* read
# config.get("clip_ratio_c", 20.0), but ActorConfig always holds the key, so a verl run that leaves
# it unset truncates at 3.0; the 20.0 fallback is reached only by a config without the field. The
# DPPO paper (Sec. 5.4) recommends a large cap, since truncation biases the gradient: set clip_c
# (the dppo preset uses 1e4, as verl's example).
DPPO_TIS_CAP = 3.0
REINFORCE_FORMS: tuple[str, ...] = ("logp", "ratio")

# Each bound is far outside what the maths is used with, and inside what it survives (1e300 is
# finite, passes allow_inf_nan=False, and overflowed at step 0).
MAX_EPS = 10.0  # eps_low / eps_high: PPO 0.2, DAPO 0.28, GMPO 0.4 (log-ratio), CISPO's absolute cap ~5
MAX_RATIO_CAP = 1e6  # clip_c / delta (verl clip_ratio_c 3: dual clip and DPPO's TIS cap; the dppo preset 1e4 = "no cap"): > 1 + eps_high
MAX_SAPO_TAU = 100.0  # SAPO gate temperatures (TRL / verl 1.0, 1.05); the gate is 4/tau sigmoid(tau (r - 1))
MAX_COV_BOUND = 1e6  # Clip-Cov covariance bounds (verl 1, 5): (A - mean A)(logp - mean logp)


def _k(name: str, type_, default, help_: str, **kw) -> Knob:
    return Knob(f"algorithm.{name}", type_, default, help_, **kw)


#: Every PolicyLossConfig field, in its order (tests/test_algorithms.py checks they are equal).
KNOBS: dict[str, Knob] = {k.name: k for k in (
    _k("eps_low", float, 0.2, "Lower clip: ratio below 1 - eps_low stops negative-advantage updates (PPO 0.2).",
       ge=0, le=MAX_EPS),
    _k("eps_high", float, 0.2, "Upper clip (DAPO clip-higher 0.28 keeps exploration; GSPO ~4e-4; CISPO absolute cap ~5).",
       ge=0, le=MAX_EPS),
    _k("clip_c", float | None, None, "Dual clip (verl clip_ratio_c, e.g. 3): caps the loss of A<0 tokens whose ratio exploded.",
       gt=1, le=MAX_RATIO_CAP),
    _k("delta", float | None, None, "TRL's two-sided clip: caps the unclipped ratio at delta (same forward values as clip_c).",
       gt=1, le=MAX_RATIO_CAP),
    _k("gspo_variant", str, "sequence", "GSPO sequence ratio (paper) or verl's token variant (same value, per-token gradient).",
       choices=GSPO_VARIANTS),
    _k("cispo_bounds", str, "relative",
       "CISPO weight bounds: relative [1-eps_low, 1+eps_high] (verl) or absolute cap eps_high (TRL).", choices=CISPO_BOUNDS),
    _k("reinforce_form", str, "logp", "Vanilla PG surrogate: -A logp or -A ratio (same gradient on-policy).",
       choices=REINFORCE_FORMS),
    _k("sapo_tau_pos", float, 1.0, "SAPO gate temperature for A > 0 (TRL sapo_temperature_pos, verl tau_pos): higher closes "
       "the soft trust region faster.", gt=0, le=MAX_SAPO_TAU),
    _k("sapo_tau_neg", float, 1.05, "SAPO gate temperature for A <= 0 (TRL sapo_temperature_neg, verl tau_neg; > tau_pos "
       "damps negative updates sooner).", gt=0, le=MAX_SAPO_TAU),
    _k("clip_cov_ratio", float, 2e-4, "Clip-Cov: fraction of tokens, drawn among those with covariance in (clip_cov_lb, "
       "clip_cov_ub), whose gradient is cut (verl 2e-4).", gt=0, le=1),
    _k("clip_cov_lb", float, 1.0, "Clip-Cov lower covariance bound (verl 1.0).", ge=-MAX_COV_BOUND, le=MAX_COV_BOUND),
    _k("clip_cov_ub", float, 5.0, "Clip-Cov upper covariance bound (verl 5.0).", ge=-MAX_COV_BOUND, le=MAX_COV_BOUND),
    _k("kl_cov_ratio", float, 2e-4, "KL-Cov: fraction of tokens with the highest covariance that get the |log ratio| "
       "penalty (verl 2e-4).", gt=0, le=1),
    _k("kl_cov_coef", float, 0.1, "KL-Cov penalty coefficient (verl 0.9.1 ppo_kl_coef 0.1).", ge=0, le=MAX_COEF),
    _k("cov_seed", int | None, None, "Clip-Cov's random draw: None = torch's generator seeded by train.seed (steps differ); "
       "an int = a fixed seed.", ge=0, le=MAX_SEED),
    _k("vespo_k_pos", float, 2.0, "VESPO (policy_loss=vespo) power k of its Gamma weight for A >= 0 (TRL vespo_k_pos 2): "
       "larger cuts sequences whose ratio fell below 1 harder.", ge=0, le=MAX_COEF),
    _k("vespo_lambda_pos", float, 3.0, "VESPO decay lambda for A >= 0 (TRL vespo_lambda_pos 3): larger cuts sequences "
       "whose ratio grew above 1 harder.", gt=0, le=MAX_COEF),
    _k("vespo_k_neg", float, 3.0, "VESPO power k for A < 0 (TRL vespo_k_neg 3).", ge=0, le=MAX_COEF),
    _k("vespo_lambda_neg", float, 2.0, "VESPO decay lambda for A < 0 (TRL vespo_lambda_neg 2).", gt=0, le=MAX_COEF),
    _k("dro_beta", float, 0.05, "DRO (policy_loss=dro) quadratic log-ratio penalty beta: larger pulls the policy back to "
       "the old one harder (verl policy_loss.dro_beta, required there; 0.05 in verl's usage example).", gt=0, le=MAX_COEF),
)}
K = KNOBS
TRUST_REGION = (K["eps_low"], K["eps_high"], K["clip_c"], K["delta"])
CLIP_FIELDS = tuple(k.field for k in TRUST_REGION)
VESPO_KNOBS = (K["vespo_k_pos"], K["vespo_lambda_pos"], K["vespo_k_neg"], K["vespo_lambda_neg"])


def _reads_as(knob: Knob, help_: str) -> Knob:
    """``knob`` as one loss reads it: the same recipe field, bounds and default, this loss's own
    text. GMPO's eps bounds the log-ratio and DPPO's the probability's move, not the ratio the
    shared text (PPO's) describes; the walkthrough shows each spec's own knob text."""
    return replace(knob, help=help_)


GMPO_KNOBS = (
    _reads_as(K["eps_low"], "GMPO: lower clip of each token's log-ratio log(pi/pi_old) at -eps_low (the log-ratio, "
              "not the ratio): an A < 0 token below it gets no gradient. The paper's 0.4 keeps the ratio above e^-0.4."),
    _reads_as(K["eps_high"], "GMPO: upper clip of each token's log-ratio log(pi/pi_old) at +eps_high (the log-ratio, "
              "not the ratio): an A > 0 token above it gets no gradient. The paper's 0.4 keeps the ratio below e^0.4."),
)
# DPPO (TV and KL): thresholds on the probability's move, and the cap C of the detached ratio.
DPPO_CAP = _reads_as(K["clip_c"], "DPPO: the cap C of the detached ratio, sg(min(rho, C)), that weights each valid "
                     f"token's gradient (truncated IS, verl clip_ratio_c); none = {DPPO_TIS_CAP:g}, verl's default; the "
                     "dppo preset's 1e4 = no truncation. It only caps that weight: which tokens get a gradient is "
                     "decided by eps_low / eps_high, never by C.")
DPPO_TV_KNOBS = (
    _reads_as(K["eps_low"], "DPPO (TV): how far an A <= 0 token's probability may fall, p - p_old >= -eps_low; past "
              "it the token gets no gradient (a bound on the probability difference, not the ratio; paper 0.15)."),
    _reads_as(K["eps_high"], "DPPO (TV): how far an A > 0 token's probability may rise, p - p_old <= eps_high; past "
              "it the token gets no gradient (a bound on the probability difference, not the ratio; paper 0.15)."),
    DPPO_CAP,
)
DPPO_KL_KNOBS = (
    _reads_as(K["eps_low"], "DPPO (KL): the binary KL(p_old || p) an A <= 0 token whose probability fell may reach; "
              "past it the token gets no gradient (a bound on the divergence of the probabilities, not the ratio; "
              "paper 0.05)."),
    _reads_as(K["eps_high"], "DPPO (KL): the binary KL(p_old || p) an A > 0 token whose probability rose may reach; "
              "past it the token gets no gradient (a bound on the divergence of the probabilities, not the ratio; "
              "paper 0.05)."),
    DPPO_CAP,
)
CISPO_KNOBS = (
    _reads_as(K["eps_low"], "CISPO: lower bound 1 - eps_low of the detached importance weight (relative bounds; "
              "unread with absolute ones). The token keeps its gradient: only its weight is clipped."),
    _reads_as(K["eps_high"], "CISPO: upper bound of the detached importance weight, 1 + eps_high (relative, verl) or "
              "eps_high itself (absolute, TRL epsilon_high ~5). The token keeps its gradient: only its weight is clipped."),
    K["cispo_bounds"],
)
DPPO_AT_RATIO_ONE = at_ratio_one(*(k.field for k in DPPO_TV_KNOBS), what="no probability moves and the cap never bites")


def _cispo_at_ratio_one(data: RecipeData) -> dict[str, str]:
    """CISPO's weight clip(1) = 1 with relative bounds; the absolute cap min(rho, eps_high) has no
    lower bound at all (eps_low is never read) and bites at ratio 1 only when eps_high < 1."""
    absolute = setting(data, "algorithm.cispo_bounds") == "absolute"
    out = {"algorithm.eps_low": "algorithm.cispo_bounds='absolute': the weight has no lower bound"} if absolute else {}
    reason = single_pass(data)
    if reason is None:
        return out
    if not absolute:
        return dict.fromkeys(("algorithm.eps_low", "algorithm.eps_high"), f"{reason}, so the weight is never clipped")
    if setting(data, "algorithm.eps_high") >= 1:
        out["algorithm.eps_high"] = f"{reason}, and the absolute cap eps_high >= 1 never bites"
    return out


# The PPO-region lab's widgets for each loss's own settings (the clip is drawn with the page's own).
_GSPO_HELP = "The paper uses eps_low = 3e-4 and eps_high = 4e-4 on its sequence ratio; widened here so the band is visible"
GSPO_REGION = RegionLab((LabSlider("gspo_low", "GSPO eps_low", ("eps_low",), 0.0, 0.9, 0.05, 0.01, _GSPO_HELP, "%.4f"),
                         LabSlider("gspo_high", "GSPO eps_high", ("eps_high",), 0.0, 0.9, 0.05, 0.01, _GSPO_HELP, "%.4f")))
CISPO_REGION = RegionLab((LabSlider("cispo_high", "CISPO eps_high (weight cap 1 + eps_high)", ("eps_high",),
                                    0.0, 4.0, 0.28, 0.01),), fixed=(("eps_low", 1.0),))
SAPO_REGION = RegionLab((LabSlider("sapo_pos", "SAPO tau_pos (A > 0)", ("sapo_tau_pos",), 0.1, 10.0, 1.0, 0.05,
                                   "TRL / verl default 1.0"),
                         LabSlider("sapo_neg", "SAPO tau_neg (A < 0)", ("sapo_tau_neg",), 0.1, 10.0, 1.05, 0.05,
                                   "TRL / verl default 1.05")))
GMPO_REGION = RegionLab((LabSlider("gmpo_eps", "GMPO eps (on the log-ratio)", ("eps_low", "eps_high"), 0.0, 1.0, 0.4, 0.01,
                                   "The GMPO paper's 0.4: the ratio stays in [e^-0.4, e^0.4]"),))


SPECS: dict[str, Spec] = by_name(
    Spec("policy_loss", "clip", "PPO clip", f"{CORE}:clip_policy_loss",
         (r"\ell_t = -\min\big(\rho_t A_t,\ \operatorname{clip}(\rho_t, 1-\varepsilon_{low}, 1+\varepsilon_{high}) A_t\big)",),
         "A trust region without a KL constraint: a token whose ratio left [1 - eps_low, 1 + eps_high] in the "
         "direction of its advantage gets no gradient (Schulman et al. 2017).",
         "TRL loss_type grpo / bnpo / dr_grpo / dapo (the same clip, different aggregation); verl policy_loss vanilla "
         "(clip_ratio_c = dual clip); OpenRLHF PolicyLoss.",
         TRUST_REGION,
         ("Zero gradient for clipped tokens: rare 'fork' tokens stop learning once their ratio grows (DAPO's clip-higher "
          "raises eps_high to 0.28).",), preset="grpo", level="token", ratio_curve=True, region_lab=RegionLab(),
         inert_when=at_ratio_one(*CLIP_FIELDS, what="the clip never bites"),
         helpers=(f"{CORE}:clipped_objective",)),
    Spec("policy_loss", "gspo", "GSPO", f"{CORE}:gspo_policy_loss",
         (r"s_i = \exp\Big(\frac{1}{|o_i|}\sum_t \log\rho_{i,t}\Big)",
          r"\ell_i = -\min\big(s_i A_i,\ \operatorname{clip}(s_i, 1-\varepsilon_{low}, 1+\varepsilon_{high}) A_i\big)"),
         "The importance ratio at the level the reward is given (the sequence): one outlier token moves s_i only by "
         "1/|o_i| (Zheng et al. 2025).",
         "TRL importance_sampling_level='sequence'; verl policy_loss gspo (gspo_variant token = GSPO-token). "
         "TRL loss_type='luspo' (LUSPO, arXiv 2602.05261) is GSPO with aggregation seq-mean-token-sum.",
         (*TRUST_REGION, K["gspo_variant"]),
         ("Tiny clip ranges (3e-4 / 4e-4): s_i is a per-token geometric mean.",), preset="gspo", ratio_curve=True,
         region_lab=GSPO_REGION,
         inert_when=at_ratio_one(*CLIP_FIELDS, what="the clip never bites"),
         walkthroughs=(Walkthrough("gspo", "GSPO", "gspo", "One length-normalised sequence ratio, clipped per sequence "
                                   "(Zheng et al. 2025).", inputs="ratios",
                                   helpers=(f"{CORE}:sequence_log_ratio", f"{CORE}:clipped_objective")),)),
    Spec("policy_loss", "cispo", "CISPO", f"{CORE}:cispo_policy_loss",
         (r"\ell_t = -\operatorname{sg}\big(\operatorname{clip}(\rho_t, 1-\varepsilon_{low}, 1+\varepsilon_{high})\big) A_t \log\pi_\theta(o_t)",),
         "Clip the importance weight, not the update: every token keeps a gradient (MiniMax-M1, 2025).",
         "TRL loss_type='cispo' (absolute cap epsilon_high); verl-style relative bounds (cispo_bounds).",
         CISPO_KNOBS, ("The weight is biased (truncated IS) but bounded.",),
         preset="cispo", level="token", ratio_curve=True, inert_when=_cispo_at_ratio_one, region_lab=CISPO_REGION,
         walkthroughs=(Walkthrough("cispo", "CISPO", "cispo", "Clip the importance weight, not the update: every token "
                                   "keeps a gradient (MiniMax-M1, 2025).", inputs="ratios"),)),
    Spec("policy_loss", "reinforce", "REINFORCE (no clip)", f"{CORE}:reinforce_policy_loss",
         (r"\ell_t = -A_t \log\pi_\theta(o_t) \quad\text{or}\quad -A_t \rho_t",),
         "The plain policy gradient, no trust region (Williams 1992).",
         "Any framework with clipping off.", (K["reinforce_form"],),
         ("Off-policy (mu > 1) nothing stops a token's ratio from running away.",), level="token", ratio_curve=True,
         inert_when=at_ratio_one("algorithm.reinforce_form", what="both forms have the same gradient")),
    Spec("policy_loss", "sapo", "SAPO", f"{CORE}:sapo_policy_loss",
         (r"\ell_t = -\frac{4}{\tau}\,\sigma\big(\tau(\rho_t - 1)\big) A_t,\quad \tau = \tau_{pos} \text{ if } A_t > 0 \text{ else } \tau_{neg}",
          r"\frac{\partial J}{\partial \log\pi} = 4\sigma(x)(1-\sigma(x))\,\rho_t A_t,\quad x = \tau(\rho_t - 1)"),
         "A soft trust region: the gradient fades smoothly as the ratio leaves 1 instead of dropping to 0 at a hard "
         "clip, so no token loses its signal abruptly (Gao et al. 2025).",
         "TRL loss_type='sapo' (sapo_temperature_pos / _neg); verl policy_loss sapo (tau_pos / tau_neg).",
         (K["sapo_tau_pos"], K["sapo_tau_neg"]),
         ("Equals the policy gradient at rho = 1 (on-policy); tau_neg > tau_pos damps negative updates sooner.",),
         preset="sapo", level="token", ratio_curve=True, region_lab=SAPO_REGION,
         inert_when=at_ratio_one("algorithm.sapo_tau_pos", "algorithm.sapo_tau_neg",
                                 what="the gate passes the whole policy gradient whatever tau")),
    Spec("policy_loss", "gmpo", "GMPO", f"{CORE}:gmpo_policy_loss",
         (r"\tilde l_t = \operatorname{sign}(A)\min\big(\operatorname{sign}(A)\log\rho_t,\ \operatorname{sign}(A)\operatorname{clip}(\log\rho_t, -\varepsilon_{low}, \varepsilon_{high})\big)",
          r"\ell_i = -A_i \exp\Big(\frac{1}{|o_i|}\sum_t \tilde l_t\Big)"),
         "GRPO averages token ratios arithmetically, so one outlier ratio dominates; the geometric mean of "
         "log-clipped ratios is robust to it and allows a wider clip (Zhao et al. 2025).",
         "verl policy_loss geo_mean.", GMPO_KNOBS,
         ("eps bounds the log-ratio: the paper's 0.4 keeps the ratio in [e^-0.4, e^0.4].",
          "verl averages per sequence: aggregate with seq-mean-token-mean for its number."),
         preset="gmpo", ratio_curve=True, region_lab=GMPO_REGION,
         inert_when=at_ratio_one("algorithm.eps_low", "algorithm.eps_high", what="the log-ratio clip never bites")),
    Spec("policy_loss", "dppo_tv", "DPPO (TV)", f"{CORE}:dppo_tv_policy_loss",
         (r"\ell_t = -A_t\,\operatorname{sg}(\min(\rho_t, C))\log\pi_\theta(o_t)\,[\text{valid}_t]",
          r"\text{valid}_t:\ p_t - p^{old}_t \le \varepsilon_{high}\ (A>0),\quad \ge -\varepsilon_{low}\ (A \le 0)"),
         "A trust region on the change of the token's probability, not its ratio: 1e-5 -> 1e-3 (ratio 100) is a tiny "
         "move, 0.99 -> 0.8 a large one.",
         "verl policy_loss dppo_tv (clip_ratio_low / _high are the TV threshold, clip_ratio_c the ratio cap C).",
         DPPO_TV_KNOBS,
         ("The region depends on p_old, not only on the ratio: no single ratio curve.",
          "The paper's settings (verl example): TV 0.15, C = 10000 (no truncation), Dr. GRPO advantages and "
          "seq-mean-token-sum-norm, several mini-batches per rollout batch: the dppo preset."), preset="dppo",
         level="token",
         inert_when=DPPO_AT_RATIO_ONE),
    Spec("policy_loss", "dppo_kl", "DPPO (KL)", f"{CORE}:dppo_kl_policy_loss",
         (r"\mathrm{KL}_b = p^{old}\log\frac{p^{old}}{p} + (1-p^{old})\log\frac{1-p^{old}}{1-p}",
          r"\text{valid}_t:\ \mathrm{KL}_b \le \varepsilon \text{ or } p \text{ moved against } A"),
         "As DPPO (TV) with the binary KL between the old and new probability of the sampled token.",
         "verl policy_loss dppo_kl.", DPPO_KL_KNOBS,
         ("The region depends on p_old, not only on the ratio: no single ratio curve.",
          "The paper's KL threshold is 0.05 (verl example): the dppo preset with policy_loss=dppo_kl, eps 0.05."),
         level="token",
         inert_when=DPPO_AT_RATIO_ONE),
    Spec("policy_loss", "clip_cov", "Clip-Cov", f"{CORE}:clip_cov_policy_loss",
         (r"\mathrm{Cov}_t = (A_t - \bar A)(\log\pi_t - \overline{\log\pi})",
          r"\ell_t = \ell^{clip}_t\,(1 - \text{selected}_t)"),
         "Entropy collapses in proportion to the covariance of advantage and log-probability: cutting the gradient "
         "of a few high-covariance tokens keeps entropy up (Cui et al. 2025).",
         "verl policy_loss clip_cov (clip_cov_ratio, clip_cov_lb, clip_cov_ub).",
         (K["eps_low"], K["eps_high"], K["clip_cov_ratio"], K["clip_cov_lb"], K["clip_cov_ub"], K["cov_seed"]),
         ("The selection is random and depends on the whole batch: no single ratio curve.",
          "Statistics are per call (per micro-batch), as in verl."), preset="clip_cov", level="token",
         inert_when=at_ratio_one("algorithm.eps_low", "algorithm.eps_high", what="the clip never bites")),
    Spec("policy_loss", "kl_cov", "KL-Cov", f"{CORE}:kl_cov_policy_loss",
         (r"\ell_t = -A_t\rho_t + \beta_{cov}\,|\log\rho_t|\,[t \in \text{top-}k\ \mathrm{Cov}]",),
         "Same diagnosis as Clip-Cov, softer cure: a KL penalty on the highest-covariance tokens (Cui et al. 2025).",
         "verl policy_loss kl_cov (kl_cov_ratio, ppo_kl_coef).", (K["kl_cov_ratio"], K["kl_cov_coef"]),
         ("The penalised tokens depend on the whole batch: no single ratio curve.",), preset="kl_cov", level="token",
         inert_when=at_ratio_one("algorithm.kl_cov_ratio", "algorithm.kl_cov_coef",
                                 what="the |log ratio| penalty is 0 with no gradient")),
    Spec("policy_loss", "gpg", "GPG", f"{CORE}:gpg_policy_loss",
         (r"\ell_t = -A_t \log\pi_\theta(o_t)",),
         "Drops the surrogate, the clip, the reference model and the KL: the plain policy gradient with a group "
         "baseline is a strong baseline (Chu et al. 2025).",
         "verl policy_loss gpg.", (),
         ("No trust region: keep mu = 1 (one pass per batch).",), preset="gpg", level="token", ratio_curve=True),
    Spec("policy_loss", "vespo", "VESPO", f"{CORE}:vespo_policy_loss",
         (r"w_i = \prod_t \rho_{i,t},\qquad \phi(w) = e^{\lambda}\, w^{k} e^{-\lambda w}\quad"
          r"(k, \lambda) = (k_+, \lambda_+) \text{ if } A \ge 0 \text{ else } (k_-, \lambda_-)",
          r"\ell_{i,t} = -\operatorname{sg}\big(\phi(w_i)\big) A_{i,t} \log\pi_\theta(o_{i,t})"),
         "A hard clip zeroes a token's gradient abruptly; a smooth, asymmetric Gamma-shaped weight of the sequence "
         "ratio (phi(1) = 1, peak at w = k / lambda) damps off-policy sequences instead (Variational Sequence-Level "
         "Soft Policy Optimization, arXiv 2602.10693).",
         "TRL loss_type='vespo' (vespo_k_pos / vespo_lambda_pos / vespo_k_neg / vespo_lambda_neg, with "
         "importance_sampling_level='token'); not in verl 0.9.1.",
         VESPO_KNOBS,
         ("w is the product of the token ratios, clamped to [1e-8, e^20]; phi is detached.",
          "TRL folds token-level rollout IS weights into w and refuses sequence-level ones; here the IS weight "
          "multiplies the loss as for every loss.",
          "The peak of phi (at w = k / lambda) is at most 10: TRL's defaults peak at 1.21 (A >= 0) and 1.24 (A < 0).",
          "TRL aggregates it by token-mean."), preset="vespo", level="token",
         inert_when=at_ratio_one(*(k.field for k in VESPO_KNOBS), what="w = 1 and phi(1) = 1 whatever k and lambda")),
    Spec("policy_loss", "dro", "DRO", f"{CORE}:dro_policy_loss",
         (r"\ell_t = -\Big(A_t \log\pi_\theta(o_t) - \frac{\beta}{2}\big(\log\pi_\theta(o_t) - \log\pi_{old}(o_t)\big)^2\Big)",
          r"\frac{\partial \ell_t}{\partial \log\pi_\theta} = -A_t + \beta\,\log\rho_t"),
         "No hard clip: a quadratic (k2) penalty on the log-ratio pulls the policy back to the old one in proportion "
         "to its drift, so no token loses its gradient (Direct Reward Optimization).",
         "verl policy_loss dro (policy_loss.dro_beta, required; docs/algo/dro.md).", (K["dro_beta"],),
         ("verl has no default beta; 0.05 is the value of its usage example.",), preset="dro", level="token",
         ratio_curve=True,
         inert_when=at_ratio_one("algorithm.dro_beta", what="the penalty's gradient beta log rho is 0")),
)
