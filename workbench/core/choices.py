"""The names and settings of the core's families, in pure Python (no torch).

The recipe validates against these, so commands that do not train (``runs list``, ``export``,
``recipes list``) never load torch. The name tuples and capability sets are read from the
algorithm specs (``workbench.algorithms``: one spec per registered function, in registry order;
tests/test_algorithms.py checks specs and registries agree), so adding an algorithm = one
registered function + its spec + a recipe file + its tests; nothing here changes.
"""

from __future__ import annotations

import math
import sys
from dataclasses import dataclass

from workbench.algorithms import (  # noqa: F401 (re-exported: the core and the recipe read them here)
    CISPO_BOUNDS,
    DISTILL_MODES,
    DPPO_TIS_CAP,
    GPG_ALPHAS,
    GRPO_SCALES,
    GSPO_VARIANTS,
    KL_PLACEMENTS,
    REINFORCE_FORMS,
    names,
    with_capability,
)

from .registry import check_choice

# ---- registry names (advantages.py, policy_losses.py, aggregation.py, kl.py, distillation.py) --
ADVANTAGE_NAMES: tuple[str, ...] = names("advantage")
POLICY_LOSS_NAMES: tuple[str, ...] = names("policy_loss")
AGGREGATION_NAMES: tuple[str, ...] = names("aggregation")
KL_ESTIMATOR_NAMES: tuple[str, ...] = names("kl_estimator")
#: Names registered in core.distillation.ADVANTAGE_SHAPINGS.
SHAPING_NAMES: tuple[str, ...] = names("shaping")

# ---- advantage estimators' capabilities (advantages.py) ----------------------------------------
TOKEN_LEVEL_ESTIMATORS: frozenset[str] = with_capability("advantage", level="token")
# Estimators whose baseline is the other completions of the prompt's group: they need G >= 2.
GROUP_ESTIMATORS: frozenset[str] = with_capability("advantage", needs_groups=True)
# Estimators that read a critic's values (B, T).
CRITIC_ESTIMATORS: frozenset[str] = with_capability("advantage", needs_critic=True)
# Estimators that read a per-completion baseline reward (B,) supplied by the caller: ReMax's is the
# reward of one greedy completion of the same prompt (an extra rollout per prompt).
BASELINE_ESTIMATORS: frozenset[str] = with_capability("advantage", needs_baseline_rollout=True)
# Estimators that read the policy's own statistics of the sampled tokens (B, T), supplied by the
# caller: the old log-probs and sum_v pi_v^2 (from the logits), optionally the rollout IS weights.
POLICY_STAT_ESTIMATORS: frozenset[str] = with_capability("advantage", needs_policy_stats=True)
# How several reward functions' scores (B, F) become one reward per completion (``combine_rewards``).
MULTI_REWARD_MODES: tuple[str, ...] = ("sum_then_normalize", "normalize_then_sum")

# ---- rollout / trainer mismatch (correction.py) ---------------------------------------------------
IS_LEVELS: tuple[str, ...] = ("token", "sequence")
IS_MODES: tuple[str, ...] = ("truncate", "mask")
# The recipe's ``algorithm.rollout_correction``: off, or "{level}_{mode}" (TRL's
# ``vllm_importance_sampling_mode`` spelling: token_truncate, token_mask, sequence_truncate, sequence_mask).
ROLLOUT_CORRECTIONS: tuple[str, ...] = ("none", *(f"{level}_{mode}" for level in IS_LEVELS for mode in IS_MODES))
# verl's rollout rejection sampling (``rollout_rs``): "{token|seq_sum|seq_mean|seq_max}_{k1|k2|k3}"
# without seq_max_k1, in verl 0.9.1's SUPPORTED_ROLLOUT_RS_OPTIONS order (correction.rejection_mask).
REJECTION_MODES: tuple[str, ...] = (
    "token_k1", "token_k2", "token_k3", "seq_sum_k1", "seq_sum_k2", "seq_sum_k3",
    "seq_mean_k1", "seq_mean_k2", "seq_mean_k3", "seq_max_k2", "seq_max_k3")
# The recipe's ``algorithm.rollout_rejection``: off, or one of the modes above (verl ``rollout_rs``).
ROLLOUT_REJECTIONS: tuple[str, ...] = ("none", *REJECTION_MODES)


#: VESPO's weight phi(w) = e^lambda w^k e^(-lambda w) multiplies a sequence's policy gradient; its
#: peak (at w = k / lambda) is bounded so that no knob setting turns it into a huge factor
#: (k = 0, lambda = 50 would give e^50 as w -> 0).
VESPO_MAX_PEAK = 10.0


def vespo_log_peak(k: float, lam: float) -> float:
    """log sup_w phi(w) = lambda - k + k log(k / lambda) for k > 0, lambda (as w -> 0) for k = 0:
    the bound is checked in log space, since exp overflows at settings the knobs' bounds allow."""
    return lam if k == 0 else lam - k + k * math.log(k / lam)


def vespo_peak(k: float, lam: float) -> float:
    """sup_w phi(w) = exp(``vespo_log_peak``); inf where that overflows a float."""
    log_peak = vespo_log_peak(k, lam)
    return math.exp(log_peak) if log_peak < math.log(sys.float_info.max) else math.inf


@dataclass(frozen=True)
class PolicyLossConfig:
    """Settings of the policy losses (each loss reads the ones it needs).

    eps_low, eps_high: the trust region [1 - eps_low, 1 + eps_high] of the ratio (PPO,
        Schulman et al. 2017: 0.2/0.2). DAPO's clip-higher (Yu et al. 2025) raises eps_high to
        0.28 so low-probability tokens can grow, against entropy collapse. GSPO works on a
        sequence ratio and uses tiny values (3e-4 / 4e-4). CISPO bounds its weight with them.
    clip_c: dual clip (Ye et al. 2020, verl ``clip_ratio_c``, e.g. 3.0): for A < 0 the loss is
        capped at -c A, so a token whose ratio exploded cannot produce an unbounded update.
        None = off. Must exceed 1 + eps_high.
    delta: TRL's two-sided clipping (``delta``): the ratio in the unclipped term is capped at
        delta. With delta = c its forward values equal verl's dual clip. None = off.
    gspo_variant: ``sequence`` (GSPO paper, Zheng et al. 2025: one ratio s_i per sequence, its
        gradient spread over all tokens) or ``token`` (verl's GSPO-token: same forward value,
        log s_it = sg(log s_i) + logp_t - sg(logp_t), per-token gradient).
    cispo_bounds: CISPO (MiniMax-M1, 2025) weight bounds. ``relative`` clips the ratio to
        [1 - eps_low, 1 + eps_high] (verl); ``absolute`` caps it at eps_high with no lower bound
        (TRL, where epsilon_high ~ 5).
    reinforce_form: vanilla policy gradient as -A logp (``logp``) or -A rho with rho from a
        stop-grad old policy (``ratio``); same gradient on-policy, different loss values.
    sapo_tau_pos, sapo_tau_neg: SAPO's gate temperatures for A > 0 and A <= 0 (Gao et al. 2025;
        TRL ``sapo_temperature_pos/neg``, verl ``tau_pos/neg``: 1.0 / 1.05). Higher = the gate
        closes faster as the ratio leaves 1; tau_neg > tau_pos damps negative updates sooner.
    clip_cov_ratio, clip_cov_lb, clip_cov_ub: Clip-Cov (Cui et al. 2025): a fraction
        ``clip_cov_ratio`` of the valid tokens, drawn among those whose covariance
        (A - mean A)(logp - mean logp) lies in (lb, ub), loses its gradient (verl: 2e-4, 1, 5).
    kl_cov_ratio, kl_cov_coef: KL-Cov (same paper): the top ``kl_cov_ratio`` of tokens by that
        covariance get the penalty kl_cov_coef * |logp - old| (verl 0.9.1 ``kl_cov_ratio`` 2e-4,
        ``ppo_kl_coef`` 0.1: the config defaults; the function's own fallback of 1.0, which its
        docstring calls the default, applies only when the config field is None).
    cov_seed: Clip-Cov draws its tokens at random (verl: ``torch.randperm``). None draws from
        torch's global generator (seeded by the run, so runs repeat and steps differ); an int
        draws from a generator seeded with it (exactly reproducible, e.g. for tests).
    vespo_k_pos, vespo_lambda_pos, vespo_k_neg, vespo_lambda_neg: VESPO's Gamma weight
        phi(w) = e^lambda w^k e^(-lambda w) of the sequence ratio w (TRL ``vespo_k_pos`` ... with
        TRL 1.16's defaults 2 / 3 for A >= 0 and 3 / 2 for A < 0). k (>= 0) sets how fast phi falls
        as w drops below 1, lambda (> 0) how fast it falls as w grows above 1; phi(1) = 1.
    dro_beta: DRO's quadratic log-ratio penalty, > 0 (verl ``policy_loss.dro_beta``: null in its
        config and required by "dro"; 0.05 is the value of verl's usage example, PR #7245).
    For ``gmpo`` eps_low / eps_high bound the token *log*-ratio (GMPO paper: 0.4); for
    ``dppo_tv`` / ``dppo_kl`` they are the divergence thresholds (DPPO: TV 0.15, KL 0.05) and
    clip_c truncates the detached ratio (unset: DPPO_TIS_CAP = 3, verl's clip_ratio_c).
    """

    eps_low: float = 0.2
    eps_high: float = 0.2
    clip_c: float | None = None
    delta: float | None = None
    gspo_variant: str = "sequence"
    cispo_bounds: str = "relative"
    reinforce_form: str = "logp"
    sapo_tau_pos: float = 1.0
    sapo_tau_neg: float = 1.05
    clip_cov_ratio: float = 2e-4
    clip_cov_lb: float = 1.0
    clip_cov_ub: float = 5.0
    kl_cov_ratio: float = 2e-4
    kl_cov_coef: float = 0.1
    cov_seed: int | None = None
    vespo_k_pos: float = 2.0
    vespo_lambda_pos: float = 3.0
    vespo_k_neg: float = 3.0
    vespo_lambda_neg: float = 2.0
    dro_beta: float = 0.05

    def __post_init__(self) -> None:
        if self.eps_low < 0 or self.eps_high < 0:
            raise ValueError(f"eps_low={self.eps_low}, eps_high={self.eps_high}: both must be >= 0")
        for name, cap in (("clip_c", self.clip_c), ("delta", self.delta)):
            if cap is not None and cap <= 1.0 + self.eps_high:
                raise ValueError(f"{name}={cap} must be greater than 1 + eps_high = {1.0 + self.eps_high}")
        check_choice("gspo_variant", self.gspo_variant, GSPO_VARIANTS)
        check_choice("cispo_bounds", self.cispo_bounds, CISPO_BOUNDS)
        check_choice("reinforce_form", self.reinforce_form, REINFORCE_FORMS)
        for name in ("sapo_tau_pos", "sapo_tau_neg", "clip_cov_ratio", "kl_cov_ratio"):
            if not getattr(self, name) > 0:
                raise ValueError(f"{name}={getattr(self, name)} must be > 0")
        for name in ("clip_cov_ratio", "kl_cov_ratio"):
            if getattr(self, name) > 1:
                raise ValueError(f"{name}={getattr(self, name)} is a fraction of the tokens: at most 1")
        if not self.clip_cov_lb < self.clip_cov_ub:
            raise ValueError(f"clip_cov_lb={self.clip_cov_lb} must be less than clip_cov_ub={self.clip_cov_ub}")
        if self.kl_cov_coef < 0:
            raise ValueError(f"kl_cov_coef={self.kl_cov_coef} must be >= 0")
        for name in ("vespo_k_pos", "vespo_k_neg"):
            if not getattr(self, name) >= 0:
                raise ValueError(f"{name}={getattr(self, name)} must be >= 0 (with k < 0, phi = e^lambda w^k e^(-lambda w) "
                                 "grows without bound as w -> 0)")
        for name in ("vespo_lambda_pos", "vespo_lambda_neg"):
            if not getattr(self, name) > 0:
                raise ValueError(f"{name}={getattr(self, name)} must be > 0")
        for sign in ("pos", "neg"):  # phi's height: the largest factor the weight can put on a sequence
            k, lam = getattr(self, f"vespo_k_{sign}"), getattr(self, f"vespo_lambda_{sign}")
            if vespo_log_peak(k, lam) > math.log(VESPO_MAX_PEAK):
                raise ValueError(f"vespo_k_{sign}={k}, vespo_lambda_{sign}={lam}: phi peaks at {vespo_peak(k, lam):.3g} "
                                 f"(w = k / lambda); at most {VESPO_MAX_PEAK} (TRL's 2 / 3 and 3 / 2 peak at 1.21 and 1.24)")
        if not self.dro_beta > 0:
            raise ValueError(f"dro_beta={self.dro_beta} must be > 0")

