"""The Recipe: everything that defines a run, validated up front, with a YAML round trip.

An algorithm is a *composition* of axes (advantage estimator x policy loss x aggregation x KL x
extras), not a class: the presets in ``recipes/`` are named values of these fields. Every field's
docstring says what it does, its trade-off and where it comes from (TRL-style), and a bad value
fails with an error naming the field, the value and what is allowed.
"""

from __future__ import annotations

import re
import unicodedata
from urllib.parse import urlsplit
from dataclasses import fields
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any, Callable, Literal, get_args

import yaml
from pydantic import BaseModel, ConfigDict, Field, ValidationError, ValidationInfo, create_model, field_validator, model_validator

# Torch-free: the algorithm specs (names, capabilities, policy-loss knobs) and the core's option
# lists and PolicyLossConfig; validating a recipe must not load the maths, so `runs list`,
# `export` and `recipes list` stay light.
from workbench.algorithms import FAMILIES, MAX_COEF, MAX_SEED, Knob, choice_help, spec
from workbench.algorithms.policy_losses import KNOBS as POLICY_LOSS_KNOBS
from workbench.algorithms.policy_losses import MAX_COV_BOUND, MAX_EPS, MAX_RATIO_CAP, MAX_SAPO_TAU  # noqa: F401 (bounds, named here too)
from workbench.core.choices import (
    DISTILL_MODES,
    GPG_ALPHAS,
    GRPO_SCALES,
    KL_PLACEMENTS,
    MULTI_REWARD_MODES,
    ROLLOUT_CORRECTIONS,
    ROLLOUT_REJECTIONS,
    PolicyLossConfig,
)
from workbench.core.kl_control import ADAPTIVE_KL_ERROR_CLIP, KL_CONTROLLERS
from workbench.core.registry import check_choice
from workbench.home import confined_path, workbench_home
from workbench.yamlsafe import MAX_FILE_BYTES, YamlInputError, load_yaml, read_yaml_file, short
from workbench.model_facts import LLAMA_LINEAR_MODULES, TINY_MAX_POSITIONS, TINY_MODEL, builtin_model_names, model_facts

if TYPE_CHECKING:
    from workbench.core.advantages import AdvantageConfig
    from workbench.core.distillation import DistillationConfig

RECIPES_DIR = Path(__file__).resolve().parents[1] / "recipes"


class RecipeError(ValueError):
    """A recipe that does not validate; the message lists every field at fault."""


# ---- upper bounds ---------------------------------------------------------------------------
# Far above any run this workbench is for (TRL / verl use G = 4-64, a few hundred prompts per step,
# mu <= 4), low enough that a typo fails here, naming its field, instead of as an out-of-memory
# kill or an integer overflow after the run has started.
MAX_STEPS = 1_000_000
MAX_GENERATIONS = 1024  # G
MAX_PROMPTS_PER_STEP = 4096
MAX_BATCH = 65_536  # completions per step: prompts_per_step x G
MAX_COMPLETION_LENGTH = 131_072  # the longest contexts of current models; the model's own is checked too
MAX_MU = 64
MAX_THREADS = 256  # the machine's CPUs are checked where the run starts (machine.check_fits_machine)
MAX_LOGGED_ROWS = 4096  # samples / diagnostics sequences per step
# MAX_SEED (numpy's limit, 2**32 - 1) and MAX_COEF come from workbench.algorithms (knobs use them too).
MAX_STALENESS = 64  # train.staleness: k + 1 CPU copies of the policy are kept
MAX_LORA_RANK = 4096  # lora.r: above any adapter in use (typical 8-256)
MAX_LORA_ALPHA = 16 * MAX_LORA_RANK  # lora.alpha: alpha / r scales the update (typical alpha = r to 2r)
MAX_LR = 1.0  # optim.lr / critic_lr: AdamW steps of ~lr per parameter; LM RL uses 1e-7 to 1e-3
MAX_TEMPERATURE = 10.0  # sampling / eval temperature: above ~2 the samples are already near uniform
# The rest of the numbers: each bound is far outside what the maths is used with, and inside what it
# survives (1e300 is finite, passes allow_inf_nan=False, and overflowed at step 0). A test tries
# +-1e300 on every numeric field of the schema, so a new field needs its bounds too.
# The policy-loss knobs' bounds (MAX_EPS, MAX_RATIO_CAP, MAX_SAPO_TAU, MAX_COV_BOUND) are declared
# with the knobs, in workbench/algorithms/policy_losses.py.
MAX_NATS = 100.0  # entropy target, OPSM / off-policy mask thresholds: per-token nats (ln(vocab) ~ 12)
MAX_KL_HORIZON = 10**9  # algorithm.kl_horizon, in completions (verl 10000; Ziegler et al. 10000)
MAX_IS_WEIGHT = 1000.0  # rollout_correction bounds (TRL 3, verl 2, IcePop 5)
MAX_REJECTION_THRESHOLD = 1000.0  # rollout_rejection bounds: ratios (k1, verl e.g. 2) or divergences (k2 / k3, e.g. 0.01)
MAX_VALUE_CLIP = 1e4  # PPO value clip, in reward units (0.2 usual)
MAX_GRAD_NORM = 1e6  # optim.max_grad_norm (1.0 usual)
MAX_WEIGHT_DECAY = 1.0  # AdamW's decoupled decay multiplies the weights by 1 - lr * wd each step (0.0-0.1 usual)
MAX_REWARD_FUNCS = 64
MAX_NAME_CHARS = 64  # Recipe.name: the run directory is a slug of it (runs/names.py slug)
MAX_TEXT_CHARS = 1 << 16  # description, system_prompt
MAX_REF_CHARS = 4096  # model, task, dataset paths and references

MAX_EVAL_PROMPTS = 4096
MAX_URL_CHARS = 2048  # logging.mlflow_tracking_uri (the common limit of browsers and proxies)
# logging.project: one name every tracker accepts (an MLflow experiment, a trackio project, a W&B
# project, the TensorBoard folder run_dir/PROJECT), so never a path
_PROJECT_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]{0,127}$")
#: schemes of a tracking server the recipe may name; a local store (file:, sqlite:) is the run's
#: environment's to choose (MLFLOW_TRACKING_URI), since a recipe from the Launch form must not
#: pick paths on the host
MLFLOW_URI_SCHEMES = ("http", "https")
#: Tasks named ``reasoning_gym/<dataset>`` come from PyPI reasoning-gym (engine/reasoning.py).
REASONING_GYM_PREFIX = "reasoning_gym/"


def _admits_bool(annotation: Any) -> bool:
    """Whether a field's type accepts a boolean anywhere (bool, bool | None, list[bool], ...)."""
    return annotation is bool or any(_admits_bool(arg) for arg in get_args(annotation))


def _holds_bool(value: Any) -> bool:
    return isinstance(value, bool) or (isinstance(value, (list, tuple)) and any(map(_holds_bool, value)))


class _Section(BaseModel):
    # allow_inf_nan=False: every float of the schema, in lists and tuples too, must be finite
    # (optim.lr=.inf used to fail later with a sampling error naming nothing).
    model_config = ConfigDict(extra="forbid", validate_assignment=True, use_attribute_docstrings=True,
                              allow_inf_nan=False)

    @field_validator("*", mode="before")
    @classmethod
    def _no_booleans_for_numbers(cls, value: Any, info: ValidationInfo) -> Any:
        """YAML ``true`` is not a number, but pydantic's lax mode reads it as 1 (train.steps=true ran
        one step). One check for every field: a boolean only where the field's type names bool."""
        if _holds_bool(value) and not _admits_bool(cls.model_fields[info.field_name].annotation):
            raise ValueError("a boolean is not a number here; give a number")
        return value


def _algorithm_knobs() -> tuple[Knob, ...]:
    """Every knob of every family that sets an ``algorithm.*`` field (once each)."""
    seen: dict[str, Knob] = {}
    for family in FAMILIES.values():
        for knob in family.knobs():
            if knob.field.startswith("algorithm."):
                seen.setdefault(knob.field, knob)
    return tuple(seen.values())


# Algorithm fields whose values are names: the family switches (the specs' names, i.e. what the
# core registries hold) and every knob with a fixed set of choices.
_NAMED_CHOICES: dict[str, Callable[[], tuple[str, ...]]] = {
    **{f.switch.removeprefix("algorithm."): (lambda f=f: tuple(f.specs)) for f in FAMILIES.values()
       if f.switch.startswith("algorithm.")},
    **{k.field.removeprefix("algorithm."): (lambda k=k: k.choices) for k in _algorithm_knobs() if k.choices},
    "kl_placement": lambda: KL_PLACEMENTS,
    "kl_controller": KL_CONTROLLERS.names,
    "rollout_correction": lambda: ROLLOUT_CORRECTIONS,
    "rollout_rejection": lambda: ROLLOUT_REJECTIONS,
    "multi_objective_aggregation": lambda: MULTI_REWARD_MODES,
}


def knob_fields(knobs: dict[str, Knob]) -> dict[str, Any]:
    """Pydantic field definitions of declared knobs, in order: type, default, bounds and help
    (the field's description) as the spec writes them once."""
    return {k.name: (k.type, Field(k.default, description=k.help, **k.bounds)) for k in knobs.values()}


class _AlgorithmHead(_Section):
    """The algorithm fields before the policy-loss knobs (the field order is the YAML's)."""

    advantage: str = Field("grpo", description=choice_help("advantage", "Advantage estimator"))
    grpo_scale: str = "group"
    """GRPO std: group (GRPO), batch (TRL scale_rewards='batch'), none (Dr. GRPO, no std bias)."""
    gpg_alpha: str = "paper"
    """advantage=gpg only: batch rescaling alpha: paper (B / (B - M), M = completions of all-equal groups), verl (B / non-zero rewards, verl's compute_gpg_outcome_advantage), none."""
    adv_eps: float = Field(1e-6, ge=0, le=1)
    """Added to the std in GRPO (TRL 1e-4, verl 1e-6); matters only for near-constant groups."""
    whiten_advantages: bool = False
    """Masked whitening of advantages over the batch (usual for PPO/GAE); rescales the step."""
    policy_loss: str = Field("clip", description=choice_help("policy_loss", "Policy loss"))


# The policy-loss knobs (PolicyLossConfig's fields), generated from their specs between the
# fields above and below, so presets dump in the same order as ever.
_AlgorithmPolicyLoss = create_model("_AlgorithmPolicyLoss", __base__=_AlgorithmHead, __module__=__name__,
                                    **knob_fields(POLICY_LOSS_KNOBS))


class Algorithm(_AlgorithmPolicyLoss):
    """The algorithm axes. Defaults are GRPO as in DeepSeekMath / TRL."""

    aggregation: str = Field("seq-mean-token-mean", description=choice_help("aggregation", "Loss aggregation"))
    kl_coef: float = Field(0.0, ge=0, le=MAX_COEF)
    """beta. 0 = no KL and no reference model loaded (saves memory and a forward pass)."""
    kl_estimator: str = Field("k3", description=choice_help("kl_estimator", "Per-token KL estimator"))
    kl_placement: str = "in_loss"
    """in_loss (GRPO: beta*KL added per token) or in_reward (PPO/RLOO/REINFORCE++: reward shaped first)."""
    kl_controller: str = "fixed"
    """How beta moves between steps (verl algorithm.kl_ctrl.type, default fixed; TRL's old PPOTrainer adap_kl_ctrl): fixed keeps kl_coef; adaptive (Ziegler et al. 2019, verl AdaptiveKLController) starts at kl_coef and after each step multiplies it by 1 + clip(KL / kl_target - 1, -0.2, 0.2) x batch / kl_horizon, with KL the batch mean of each completion's mean per-token KL to the reference (the estimator's, of the step's old log-probs): up while the policy drifts past the target, down below it. verl adapts only the KL in the reward, so adaptive needs kl_placement=in_reward and kl_coef > 0. Matters for long runs whose KL would drift with a fixed beta. Logged as actor/reward_kl_penalty (the KL) and actor/reward_kl_penalty_coeff (the beta the step used); the coefficient is checkpointed, so a resume continues it."""
    kl_target: float = Field(0.1, gt=0, le=MAX_NATS)
    """Target of the adaptive controller: the per-token KL it steers toward, in the units of kl_estimator (verl algorithm.kl_ctrl.target_kl, default 0.1). Read only with kl_controller=adaptive."""
    kl_horizon: int = Field(10000, ge=1, le=MAX_KL_HORIZON)
    """Horizon of the adaptive controller in completions (verl algorithm.kl_ctrl.horizon, default 10000): one step moves beta by at most 20% x batch / kl_horizon, so it reacts over ~kl_horizon / batch steps. batch / kl_horizon must be < 5 (beyond, one step below target takes beta to 0 for good). Read only with kl_controller=adaptive."""
    entropy_coef: float = Field(0.0, ge=0, le=MAX_COEF)
    """Entropy bonus coefficient (against entropy collapse); 0 in TRL and verl by default. With use_adaptive_entropy, the coefficient's start value."""
    use_adaptive_entropy: bool = False
    """Adaptive entropy control (Skywork-OR1; TRL use_adaptive_entropy): after each optimiser update the coefficient moves by entropy_coef_delta, up while the update's mean loss-token entropy is <= entropy_target and down otherwise, within [entropy_coef_min, entropy_coef_max]; the bonus applies only while entropy is <= entropy_target. Logged as entropy_coef."""
    entropy_target: float = Field(0.2, ge=0, le=MAX_NATS)
    """Target mean per-token entropy in nats (TRL 0.2, Skywork-OR1 0.2); set it near the entropy of the first steps."""
    entropy_coef_delta: float = Field(0.005, ge=0, le=MAX_COEF)
    """Step of the adaptive coefficient per optimiser update (TRL 0.005; Skywork-OR1 1e-4)."""
    entropy_coef_min: float = Field(0.0, ge=0, le=MAX_COEF)
    """Lower bound of the adaptive coefficient (TRL 0.0)."""
    entropy_coef_max: float = Field(1.0, ge=0, le=MAX_COEF)
    """Upper bound of the adaptive coefficient (TRL 1.0; Skywork-OR1 5e-3)."""
    opsm_delta: float | None = Field(None, ge=0, le=MAX_NATS)
    """Off-policy sequence masking (slime): drop A<0 sequences whose mean drift mean_t(old_logp - logp) exceeds delta (old_logp: the trainer's own log-probs of the behaviour policy)."""
    off_policy_mask_threshold: float | None = Field(None, ge=0, le=MAX_NATS)
    """TRL's off-policy sequence mask (DeepSeek-V3.2 Eq. 9; TRL off_policy_mask_threshold, e.g. 0.5): drop sequences whose mean KL mean_t(sampling_logp - logp) exceeds it and whose advantage is negative; sampling_logp is the rollout engine's log-probs when it reports them (vLLM), else old_logp, so it also catches rollout/trainer mismatch. None = off."""
    mask_truncated: bool = False
    """DAPO overlong filtering: completions cut at max length get no loss."""
    rollout_correction: str = "none"
    """Importance-sampling correction for rollout / trainer mismatch (TRL vllm_importance_sampling_mode, verl rollout_is, OpenRLHF is_correction_type): each token's policy loss is multiplied by w = pi_old / pi_rollout of the trainer's and the rollout engine's log-probs. none, token_truncate (TIS: w clamped to [min, max]), token_mask (MIS / IcePop: w = 0 outside [min, max]), sequence_truncate / sequence_mask (one w per completion, the product of its token ratios). Matters with vLLM, bf16 rollouts or train.staleness > 0."""
    rollout_correction_min: float | None = Field(None, ge=0, le=MAX_IS_WEIGHT)
    """Lower bound of the IS weight (TRL vllm_importance_sampling_clip_min, default None = no bound; IcePop 0.5)."""
    rollout_correction_max: float | None = Field(3.0, gt=0, le=MAX_IS_WEIGHT)
    """Upper bound of the IS weight (TRL vllm_importance_sampling_clip_max 3.0; verl rollout_is_threshold 2.0; IcePop 5)."""
    rollout_correction_batch_normalize: bool = False
    """Rescale the bounded IS weights to mean 1 over the step's batch (verl rollout_is_batch_normalize, default False; no TRL / OpenRLHF setting): over valid tokens at token level, over completions at sequence level. Truncation pulls the mean weight below 1 and so shrinks every step; normalising keeps the direction and restores the step size. Needs rollout_correction != none; logged as rollout_corr/rollout_is_batch_norm_factor (the mean before it)."""
    rollout_rejection: str = "none"
    """Rejection sampling of rollout / trainer mismatch (verl rollout_rs, default None = off; no TRL / OpenRLHF setting): tokens or whole completions whose divergence between the trainer's and the rollout engine's log-probs leaves a trust region get no loss and count in no denominator (verl masks its response_mask). Mode {level}_{k}: level token (each token its own statistic), seq_sum / seq_mean / seq_max (one statistic per completion over its tokens); k of l = log(pi_old / pi_rollout): k1 = -l (a log-ratio, kept within [log min, log max]; no seq_max_k1), k2 = l^2 / 2, k3 = e^l - 1 - l (divergences, kept <= max). Independent of rollout_correction (both may be on). Matters with vLLM, bf16 rollouts or train.staleness > 0; logged as rollout_corr/rollout_rs_{mode}_{mean,masked_fraction,seq_masked_fraction}."""
    rollout_rejection_max: float | None = Field(None, gt=0, le=MAX_REJECTION_THRESHOLD)
    """Upper threshold of rollout_rejection (verl rollout_rs_threshold, required when on): a ratio for k1 modes (e.g. 2.0: keep pi_rollout / pi_old = e^k1 within [rollout_rejection_min, 2], by default [0.5, 2]), a divergence for k2 / k3 modes (e.g. 0.01)."""
    rollout_rejection_min: float | None = Field(None, gt=0, le=MAX_REJECTION_THRESHOLD)
    """Lower ratio threshold of a k1 rollout_rejection (verl rollout_rs_threshold "lower_upper"; default None = 1 / rollout_rejection_max, verl's default). k2 / k3 modes take no lower bound."""
    bypass_mode: bool = False
    """DPPO's bypass mode (verl algorithm.rollout_correction.bypass_mode, default False, with its default loss_type ppo_clip; no TRL / OpenRLHF setting): the old log-probs ARE the rollout engine's (two policies instead of three), so the old log-prob forward is skipped and the policy ratio pi_theta / pi_rollout carries the rollout / trainer mismatch into the clip, also at train.mu = 1 where the recomputed ratio is 1. The KL in the reward reads them too (verl's apply_kl_penalty reads old_log_probs). Saves one forward of the batch per step; matters with vLLM, bf16 rollouts or train.staleness > 0. Needs the rollout engine's log-probs (as rollout_correction). With it, rollout_rejection and rollout_correction act inside the loss, as verl's bypass loss: each micro-batch compares the CURRENT policy's log-probs (detached) with the rollout's, so they follow the policy through the epochs; rejected tokens stay in the normalisers (verl counts its batch before the loss). rollout_correction's IS weights then need policy_loss=reinforce with reinforce_form=logp (verl loss_type=reinforce: -w A log pi); a ratio loss already carries pi_theta / pi_rollout (verl's ppo_clip applies no weights). Estimators that read the policy's own statistics need the forward it skips."""
    top_entropy_quantile: float = Field(1.0, ge=0, le=1)
    """Train only on the highest-entropy tokens ("Beyond the 80/20 Rule", Wang et al. 2025; TRL top_entropy_quantile rho): tokens below the (1 - rho) entropy quantile of the batch's loss tokens get no policy loss. 1.0 = off (every token); the paper uses 0.2."""
    multi_objective_aggregation: str = "sum_then_normalize"
    """Several reward functions (TRL multi_objective_aggregation): sum_then_normalize (the weighted sum is the reward, the estimator normalises it) or normalize_then_sum (GDPO, verl gdpo: each function's scores are standardised within their group first, so one with a large scale cannot drown the others). Logged reward stays the weighted sum."""
    critic: bool = False
    """Train a value head (PPO). Required by advantage=gae; costs a second model's memory."""
    gamma: float = Field(1.0, ge=0, le=1)
    """Discount (token-level estimators). LM RL uses 1.0."""
    lam: float = Field(1.0, ge=0, le=1)
    """GAE lambda: lower = less variance, more bias from the critic (PPO for LMs ~0.95)."""
    value_clip: float | None = Field(0.2, gt=0, le=MAX_VALUE_CLIP)
    """PPO value clipping range around the old values (None = off)."""
    vf_coef: float = Field(0.5, ge=0, le=MAX_COEF)
    """Scale of the critic's gradient. The critic is a separate model with its own AdamW, so unlike shared-backbone PPO nothing is traded against the policy loss: Adam ignores a constant gradient scale, and vf_coef only changes where the critic's own gradient clipping (optim.max_grad_norm) starts to bite. loss/value is logged unscaled. Kept for parity with TRL / verl PPO configs."""

    @field_validator(*[name for name in _NAMED_CHOICES])
    @classmethod
    def _registered_name(cls, value: str, info: ValidationInfo) -> str:
        """Named options must be registered in workbench.core (the registry is the source of truth)."""
        return check_choice(f"algorithm.{info.field_name}", value, _NAMED_CHOICES[info.field_name]())

    @model_validator(mode="after")
    def _cross(self):
        estimator = spec("advantage", self.advantage)
        if estimator.needs_critic and not self.critic:
            raise ValueError(f"algorithm.advantage={self.advantage!r} needs algorithm.critic=true (it uses the critic's values)")
        if self.critic and not estimator.needs_critic:
            critics = sorted(n for n, s in FAMILIES["advantage"].specs.items() if s.needs_critic)
            raise ValueError(
                f"algorithm.critic=true is only used by advantage={' / '.join(map(repr, critics))}, not {self.advantage!r}"
            )
        PolicyLossConfig(**self.policy_loss_kwargs())  # clip_c/delta vs eps_high, with the field names
        lo, hi = self.rollout_correction_min, self.rollout_correction_max
        if lo is not None and hi is not None and lo > hi:
            raise ValueError(f"algorithm.rollout_correction_min={lo} must not exceed algorithm.rollout_correction_max={hi}")
        self._check_rollout_rejection()
        self._check_kl_controller()
        self._check_bypass_mode(estimator)
        if self.entropy_coef_min > self.entropy_coef_max:
            raise ValueError(f"algorithm.entropy_coef_min={self.entropy_coef_min} must not exceed "
                             f"algorithm.entropy_coef_max={self.entropy_coef_max}")
        if estimator.needs_baseline_rollout and self.multi_objective_aggregation != "sum_then_normalize":
            raise ValueError(
                f"algorithm.advantage={self.advantage!r} subtracts a greedy completion's reward: it needs "
                f"multi_objective_aggregation='sum_then_normalize', not {self.multi_objective_aggregation!r}")
        return self

    def _check_rollout_rejection(self) -> None:
        """Batch normalisation needs IS weights; rejection needs its upper threshold, and a lower
        one only for k1 modes (a ratio <= the upper; by default 1 / upper, so then upper >= 1)."""
        if self.rollout_correction_batch_normalize and self.rollout_correction == "none":
            raise ValueError("algorithm.rollout_correction_batch_normalize=True needs IS weights to normalise; "
                             "set algorithm.rollout_correction to one of " + ", ".join(ROLLOUT_CORRECTIONS[1:]))
        mode, lo, hi = self.rollout_rejection, self.rollout_rejection_min, self.rollout_rejection_max
        if mode == "none":  # thresholds are ignored, as rollout_correction's bounds are when it is off
            return
        if hi is None:
            raise ValueError(f"algorithm.rollout_rejection={mode!r} needs algorithm.rollout_rejection_max "
                             "(verl rollout_rs_threshold): a ratio > 0 for k1 modes, a divergence > 0 for k2 / k3")
        if not mode.endswith("k1"):
            if lo is not None:
                raise ValueError(f"algorithm.rollout_rejection_min={lo} is allowed only with a k1 mode; "
                                 f"algorithm.rollout_rejection={mode!r} keeps a divergence <= rollout_rejection_max only")
            return
        if lo is None and hi < 1:
            raise ValueError(f"algorithm.rollout_rejection_max={hi} with k1 mode {mode!r} needs a ratio >= 1 "
                             f"(the lower bound defaults to 1 / max = {1 / hi:g}), or set algorithm.rollout_rejection_min")
        if lo is not None and lo > hi:
            raise ValueError(f"algorithm.rollout_rejection_min={lo} must not exceed algorithm.rollout_rejection_max={hi}")

    def _check_kl_controller(self) -> None:
        """An adaptive beta needs a KL in the reward to adapt (verl adapts only that one) and a
        start above 0 (a multiplicative controller never leaves 0)."""
        if self.kl_controller == "fixed":
            return
        if self.kl_placement != "in_reward":
            raise ValueError(f"algorithm.kl_controller={self.kl_controller!r} with algorithm.kl_placement={self.kl_placement!r}: "
                             "allowed only with kl_placement='in_reward' (verl adapts the KL in the reward; its in-loss KL keeps kl_coef)")
        if self.kl_coef == 0:
            raise ValueError(f"algorithm.kl_controller={self.kl_controller!r} with algorithm.kl_coef=0: the coefficient "
                             "it adapts starts at kl_coef and never leaves 0; set kl_coef > 0 (verl 0.001)")

    def _check_bypass_mode(self, estimator) -> None:
        """Bypass mode takes old := the rollout engine's log-probs: IS weights on top of a ratio loss
        would count pi_theta / pi_rollout twice (verl's bypass applies them only with loss_type
        reinforce), and the skipped forward's statistics are not there."""
        if not self.bypass_mode:
            return
        if self.rollout_correction != "none" and (self.policy_loss, self.reinforce_form) != ("reinforce", "logp"):
            raise ValueError(f"algorithm.rollout_correction={self.rollout_correction!r} with algorithm.bypass_mode=True and "
                             f"policy_loss={self.policy_loss!r}"
                             + (f", reinforce_form={self.reinforce_form!r}" if self.policy_loss == "reinforce" else "")
                             + ": allowed only with policy_loss='reinforce', reinforce_form='logp' (verl loss_type=reinforce); "
                             "a ratio loss's pi_theta / pi_rollout is the correction already (verl's ppo_clip applies no weights)")
        if estimator.needs_policy_stats:
            raise ValueError(f"algorithm.advantage={self.advantage!r} with algorithm.bypass_mode=True: it reads "
                             "sum_v pi_v^2 from the old log-prob forward that bypass mode skips; allowed: bypass_mode=False")

    def policy_loss_kwargs(self) -> dict[str, Any]:
        """The fields PolicyLossConfig has (same names), so a new loss setting needs no list here."""
        return {f.name: getattr(self, f.name) for f in fields(PolicyLossConfig)}

    @property
    def uses_reference(self) -> bool:
        """A reference model is loaded only when a KL term needs it."""
        return self.kl_coef > 0


class Sampling(_Section):
    """Rollout settings."""

    num_generations: int = Field(8, ge=1, le=MAX_GENERATIONS)
    """G completions per prompt. Group baselines need G >= 2; larger G = better baselines, more compute."""
    prompts_per_step: int = Field(4, ge=1, le=MAX_PROMPTS_PER_STEP)
    """Prompts per step; the batch is prompts_per_step x G completions."""
    temperature: float = Field(1.0, gt=0, le=MAX_TEMPERATURE)
    """Sampling temperature (log-probs are computed at the same temperature)."""
    top_p: float = Field(1.0, gt=0, le=1)
    """Nucleus sampling; < 1 makes the rollout policy differ from the trained one (off-policy)."""
    max_completion_length: int = Field(8, ge=1, le=2**31 - 1)  # the real bound, the model's context, in Recipe._cross
    """L_max: completions are cut here (and the Dr. GRPO normaliser uses it). Prompt + completion must fit the model's positions."""
    max_prompt_length: int | None = Field(None, ge=1, le=MAX_COMPLETION_LENGTH)
    """Longer prompts keep their last tokens (left truncation, as TRL; counted in prompts/truncated_ratio). None = no limit."""
    dynamic_sampling: bool = False
    """DAPO dynamic sampling (Yu et al. 2025; verl filter_groups): groups whose G rewards are all equal (no learning signal) are dropped and more prompts sampled until prompts_per_step groups have a spread. Costs extra rollouts; the rounds it took are logged (dynamic_sampling/rounds)."""
    dynamic_sampling_max_rounds: int = Field(4, ge=1, le=MAX_MU)
    """Cap on rollout rounds per step with dynamic_sampling (verl max_num_gen_batches): after it, dropped groups fill the batch (logged as dynamic_sampling/filled_groups)."""


Beta = Annotated[float, Field(ge=0, lt=1)]


class Optim(_Section):
    """Optimiser (AdamW) and schedule."""

    lr: float = Field(1e-3, gt=0, le=MAX_LR)
    """Policy learning rate (the tiny model likes 1e-3; billion-parameter models ~1e-6)."""
    critic_lr: float | None = Field(None, gt=0, le=MAX_LR)
    """Critic learning rate (default: lr)."""
    schedule: Literal["constant", "linear", "cosine"] = "constant"
    """LR schedule after warm-up."""
    warmup_steps: int = Field(0, ge=0, le=MAX_STEPS)
    """Linear warm-up steps."""
    max_grad_norm: float | None = Field(1.0, gt=0, le=MAX_GRAD_NORM)
    """Gradient clipping by global norm (None = off)."""
    weight_decay: float = Field(0.0, ge=0, le=MAX_WEIGHT_DECAY)
    """AdamW weight decay."""
    betas: tuple[Beta, Beta] = (0.9, 0.999)
    """AdamW betas, each in [0, 1) (Adam's moving averages; 1 never forgets and its bias correction divides by 0)."""


class Train(_Section):
    """Loop settings."""

    steps: int = Field(30, ge=1, le=MAX_STEPS)
    """Optimisation steps (each: one rollout batch, mu passes over it)."""
    mu: int = Field(1, ge=1, le=MAX_MU)
    """Passes over each batch (GRPO's mu / TRL num_iterations / PPO epochs). > 1 makes the ratio move and clipping bite."""
    minibatches: int = Field(1, ge=1, le=MAX_BATCH)
    """Optimizer steps per pass: the batch is split into this many minibatches."""
    grad_accum: int = Field(1, ge=1, le=MAX_BATCH)
    """Micro-batches per minibatch (memory); the loss is normalised over the whole minibatch."""
    seed: int = Field(0, ge=0, le=MAX_SEED)
    """Seed for sampling, data order and initialisation."""
    rollout: Literal["hf", "vllm"] = "hf"
    """Generation backend: hf (transformers generate) or vllm (colocated, weights synced each step)."""
    precision: Literal["fp32", "bf16", "fp16"] = "fp32"
    """Mixed precision (accelerate). CPU runs use fp32."""
    staleness: int = Field(0, ge=0, le=MAX_STALENESS)
    """Rollouts are generated by the policy of k optimiser updates ago, as in asynchronous trainers (the RLHF book, asynchronicity): the trainer's log-probs then differ from the rollout's, which rollout_correction and the off-policy mask see. The ratio of the clip is still 1 at train.mu = 1 with one minibatch (old log-probs are recomputed with the current weights); the clip acts with mu > 1 or several minibatches. 0 = on-policy generation (today's runs, exactly); k keeps k + 1 CPU copies of the weights."""
    threads: int = Field(1, ge=1, le=MAX_THREADS)
    """torch threads per CPU process (on 2 cores, 1 is fastest for generation); at most the CPUs of the machine it runs on."""
    gradient_checkpointing: bool = False
    """Recompute each decoder layer's activations in the backward pass instead of keeping them (transformers gradient_checkpointing_enable, use_reentrant=False, as TRL): activation memory ~1/num_layers for ~30% more compute; same loss and gradients."""
    shared_prefix: bool = True
    """Training, old / reference log-prob and critic forwards run each distinct prompt once per micro-batch and its completions against its cached keys / values (the idea of Prefix Grouper, 2025; TRL and verl repeat the prompt per completion): prompt tokens cost ~1/G. Same log-probs, losses and gradients as the repeated-prompt forward up to float rounding (1e-5 in fp32). Falls back to the plain forward under gradient checkpointing, for models without a KV cache, and when every prompt of a micro-batch is unique. false = the plain forward."""

    @property
    def single_pass(self) -> bool:
        """One optimiser update per batch: the old policy is the current one, so the ratio is
        logp / sg(logp) = 1 and no separate old log-prob pass is needed for it."""
        return self.mu == 1 and self.minibatches == 1


class Logging(_Section):
    """What the run records."""

    log_with: list[Literal["tensorboard", "wandb", "trackio", "mlflow"]] = Field(default_factory=list)
    """Trackers via accelerate, besides the run's own event stream: each receives the recipe as flat section.field parameters, every metric of each step under its TRL name, and at the end a link to the final policy (MLflow: run tags workbench.final_model and workbench.host; trackio: a reference artifact policy-RUN of type model). The tracker's package must be installed where the run trains (pip install mlflow / trackio / wandb / tensorboard)."""
    project: str | None = Field(None, min_length=1, max_length=128)
    """Project the trackers file the run under (MLflow experiment, trackio project, W&B project, TensorBoard folder run_dir/PROJECT); empty: the recipe's name. Letters, digits, '.', '_', '-'. MLflow's MLFLOW_EXPERIMENT_NAME in the run's environment wins over it (accelerate's rule). The tracker's run is named after the run directory (the run id)."""
    mlflow_tracking_uri: str | None = Field(None, min_length=1, max_length=MAX_URL_CHARS)
    """MLflow tracking server for log_with [mlflow], http(s)://HOST:PORT; empty: MLFLOW_TRACKING_URI of the run's environment, else MLflow's local default in the run's working directory. Credentials never go here (the recipe is saved with the run and exported): set MLFLOW_TRACKING_USERNAME / MLFLOW_TRACKING_PASSWORD or MLFLOW_TRACKING_TOKEN where the run trains."""
    samples_per_step: int = Field(4, ge=0, le=MAX_LOGGED_ROWS)
    """Prompt / completion / reward rows recorded per step."""
    diagnostics_every: int = Field(1, ge=0, le=MAX_STEPS)
    """Per-token diagnostics (ratio, advantage, region) every N steps (0 = never)."""
    diagnostics_sequences: int = Field(8, ge=0, le=MAX_LOGGED_ROWS)
    """How many sequences of the batch those diagnostics cover."""
    lens_every: int = Field(0, ge=0, le=MAX_STEPS)
    """Same-batch lens every N steps (0 = off): every advantage estimator x policy loss on the step's batch (loss, grad norm, cosine with the update taken), in that step's diagnostics event. One extra forward and ~30 backward passes per lens step, so off by default (see bench/lens_bench.py)."""

    @field_validator("project")
    @classmethod
    def _project_name(cls, value: str | None) -> str | None:
        if value is not None and not _PROJECT_NAME.match(value):
            raise ValueError("not allowed; a name of letters, digits, '.', '_', '-' (at most 128 characters, "
                             "starting with a letter or digit), e.g. rl-sweeps")
        return value

    @field_validator("mlflow_tracking_uri")
    @classmethod
    def _tracking_server(cls, value: str | None) -> str | None:
        if value is not None:
            check_tracking_uri(value)
        return value


def check_tracking_uri(uri: str) -> None:
    """Refuse an MLflow tracking URI the recipe may not hold (ValueError saying what is allowed): a
    scheme other than http(s), no host, a password in it, or whitespace / control characters."""
    if any(c.isspace() or unicodedata.category(c).startswith("C") for c in uri):
        raise ValueError("not allowed; one URL without spaces or control characters, e.g. http://mlflow.internal:5000")
    try:
        parts = urlsplit(uri)
        parts.port  # noqa: B018 (raises on a port that is not a number in 0-65535)
    except ValueError as err:
        raise ValueError(f"not a URL ({err}); e.g. http://mlflow.internal:5000") from None
    if parts.scheme not in MLFLOW_URI_SCHEMES or not parts.hostname:
        raise ValueError(f"not allowed; a tracking server {' or '.join(s + '://HOST[:PORT]' for s in MLFLOW_URI_SCHEMES)} "
                         "(a local store: set MLFLOW_TRACKING_URI where the run trains)")
    if parts.password is not None or parts.username is not None:
        raise ValueError("not allowed: credentials in the URL would be saved with the recipe; set "
                         "MLFLOW_TRACKING_USERNAME / MLFLOW_TRACKING_PASSWORD or MLFLOW_TRACKING_TOKEN where the run trains")


class Checkpoint(_Section):
    """What the run saves to continue after a crash (``train --resume RUN_DIR``)."""

    every: int = Field(0, ge=0, le=MAX_STEPS)
    """A checkpoint (policy, tokenizer, optimiser, scheduler, RNG states, step) every N steps; 0 = only at the end. With LoRA the checkpoint holds the adapters (the base is frozen). The finished policy is always saved as a plain Hugging Face directory, run_dir/final (LoRA: merged; the adapters alone in run_dir/final_adapter)."""
    keep_last: int = Field(1, ge=1, le=1000)
    """How many of the newest checkpoints are kept (older ones are deleted once a newer one is complete)."""


class Lora(_Section):
    """LoRA adapters through PEFT (Hu et al. 2021): the base weights stay frozen and only
    low-rank adapters train; the reference log-probs come from the same model with its adapters
    disabled (no second copy, as TRL does). Also spelled ``model: {name: ..., lora: {...}}``."""

    r: int = Field(0, ge=0, le=MAX_LORA_RANK)
    """Adapter rank; 0 = off (full fine-tuning). Typical 8-64 (TRL's ModelConfig lora_r 16)."""
    alpha: float = Field(32.0, gt=0, le=MAX_LORA_ALPHA)
    """lora_alpha: the adapter's update B @ A is scaled by alpha / r (TRL's ModelConfig 32)."""
    dropout: float = Field(0.0, ge=0, lt=1)
    """Dropout on the adapter's input (PEFT lora_dropout, default 0). > 0 runs the policy's forward passes in training mode, so old and new log-probs see different dropout masks."""
    target_modules: str | list[str] = "all-linear"
    """Modules that get adapters: 'all-linear' (every linear layer but the output head, as QLoRA / TRL recommend) or names such as [q_proj, v_proj] (PEFT target_modules)."""

    @field_validator("target_modules")
    @classmethod
    def _some_modules(cls, value: str | list[str]) -> str | list[str]:
        if not value or (isinstance(value, list) and not all(isinstance(v, str) and v for v in value)):
            raise ValueError("name at least one module ('all-linear' or a list such as [q_proj, v_proj])")
        return value

    @property
    def enabled(self) -> bool:
        return self.r > 0


class Eval(_Section):
    """Held-out evaluation: prompts never trained on, scored by the task's verifier."""

    every: int = Field(0, ge=0, le=MAX_STEPS)
    """Evaluate every N steps (0 = off): at step 0 (the untrained policy), every N steps, and the final policy in the last step's line (eval/updates says how many updates the evaluated policy had)."""
    # An evaluation generates num_prompts x (1 + pass_k) completions: the defaults, 8 x (1 + 3) = 32, cost
    # one default step's generation (4 prompts x G = 8), so eval every N steps adds ~1/N to a run.
    num_prompts: int = Field(8, ge=1, le=MAX_EVAL_PROMPTS)
    """Held-out prompts: reasoning-gym's eval split, prompts of a built-in task that training never sees, or the first rows of eval.dataset. One evaluation generates num_prompts x (1 + pass_k) completions (the defaults: 32, one default step's); more prompts narrow the figures' noise (pass@1's standard error is up to 0.5 / sqrt(num_prompts))."""
    pass_k: int = Field(3, ge=1, le=MAX_GENERATIONS)
    """k of pass@k: k completions per prompt at eval.temperature; correct if any is (the greedy completion gives pass@1)."""
    temperature: float = Field(1.0, gt=0, le=MAX_TEMPERATURE)
    """Sampling temperature of the pass@k completions (greedy decoding for pass@1). Completions are at most sampling.max_completion_length tokens."""
    dataset: str | None = Field(None, max_length=MAX_REF_CHARS)
    """JSONL / CSV / saved datasets dir of held-out prompts; required to evaluate a run whose prompts come from `dataset`."""

    @property
    def enabled(self) -> bool:
        return self.every > 0


#: Built-in teachers for on-policy distillation: the built-in tiny model trained longer (by
#: engine/distill.py, on first use, cached under <workbench home>/models).
TINY_TEACHER = "tiny-teacher"
BUILTIN_TEACHERS = (TINY_TEACHER,)


def teacher_reference(value: str) -> str:
    """A teacher model reference, checked: a built-in name (tiny-teacher, tiny, smollm2-135m), a
    path inside the workbench home (relative to it, or absolute; e.g. a run's ``runs/<id>/final``;
    returned resolved), or a hub id ('org/name', passed on). A path outside the home or missing
    raises ValueError naming teacher.model."""
    text = value.strip()
    if not text:
        raise ValueError("teacher.model='' is empty: name a model (e.g. tiny-teacher) or null for no teacher")
    if text in BUILTIN_TEACHERS or text in builtin_model_names():
        return text
    home = workbench_home()
    if text.startswith(("/", "~", ".")) or text.endswith(".gguf") or (home / text).exists():
        path = confined_path(Path(text).expanduser(), field="teacher.model")
        if not path.exists():
            raise ValueError(f"teacher.model={text!r}: no such file or directory in the workbench home {str(home)!r}")
        return str(path)
    return text


class Teacher(_Section):
    """On-policy distillation (slime OPD; Thinking Machines' "On-Policy Distillation", Lu et al. 2025): the student's advantage is shaped by the per-token reverse KL to a teacher, A' = A - kl_coef * (log pi_theta - log pi_T), with any estimator."""

    model: str | None = None
    """Teacher model (None = no distillation): tiny-teacher (the built-in tiny model trained longer by the grpo preset, built on first use), a run's final/ directory or another model directory inside the workbench home, or a hub id. It must share the student's tokenizer (checked before training)."""
    kl_coef: float = Field(1.0, ge=0, le=MAX_COEF)
    """lambda: weight of the teacher's reverse KL in the advantage (slime --opd-kl-coef, tinker kl_penalty_coef; both 1.0). In nats per token, added after the estimator (and its whitening)."""
    kl_discount: float = Field(0.0, ge=0, le=1)
    """gamma of the KL's discounted future sum, D_t = sum_{k>=t} gamma^(k-t) d_k (tinker kl_discount_factor). 0 = per token (slime, and tinker's default)."""
    mode: Literal[DISTILL_MODES] = "shaped"
    """shaped: A' = A - lambda D (slime OPD: the reward still trains); only: A' = -lambda D, pure distillation (Thinking Machines; the reward is logged, not trained on)."""

    @field_validator("model")
    @classmethod
    def _model_reference(cls, value: str | None) -> str | None:
        return None if value is None else teacher_reference(value)

    @model_validator(mode="after")
    def _cross(self):
        if self.model is not None and self.mode == "only" and self.kl_coef == 0:
            raise ValueError("teacher.mode='only' with teacher.kl_coef=0 leaves no learning signal: set kl_coef > 0 or mode='shaped'")
        return self

    @property
    def enabled(self) -> bool:
        return self.model is not None


def lift_shorthands(data: Any) -> Any:
    """The recipe's short spellings in their full form (a new dict; other input unchanged):
    ``model: {name: X, lora: {...}}`` -> ``model: X`` + ``lora: {...}``, and ``teacher: X`` ->
    ``teacher: {model: X}``. Run before validation and after every ``--set``, so a later
    ``--set lora.r=8`` or ``--set teacher.kl_coef=0.5`` finds its section."""
    if not isinstance(data, dict):
        return data
    data = dict(data)
    if isinstance(data.get("teacher"), str):
        data["teacher"] = {"model": data["teacher"]}
    if not isinstance(data.get("model"), dict):
        return data
    spec = dict(data["model"])
    unknown = sorted(set(spec) - {"name", "lora"})
    if unknown:
        raise ValueError(f"model.{unknown[0]}: unknown field; model as a mapping takes name and lora")
    if "name" not in spec:
        raise ValueError("model: a mapping needs name (e.g. model: {name: smollm2-135m, lora: {r: 16}})")
    if "lora" in spec and "lora" in data:
        raise ValueError("lora is given twice (model.lora and lora): give one")
    data["model"] = spec["name"]
    if "lora" in spec:
        data["lora"] = spec["lora"]
    return data


class Recipe(_Section):
    """A whole run. ``name`` identifies the preset or run."""

    name: str = Field("grpo", min_length=1, max_length=MAX_NAME_CHARS)
    """Names the run (its directory is a safe slug of it, runs/names.py): no path separators or control characters."""
    description: str = Field("", max_length=MAX_TEXT_CHARS)
    model: str = Field("tiny", max_length=MAX_REF_CHARS)
    """'tiny' (built locally) or a Hugging Face causal LM path / hub id. Also spelled model: {name: ..., lora: {...}} (see lora)."""
    task: str | None = Field("arithmetic", max_length=MAX_REF_CHARS)
    """Built-in task or reasoning_gym/<dataset> (e.g. reasoning_gym/basic_arithmetic); its prompts and reward functions are used unless overridden."""
    task_config: dict[str, Any] = Field(default_factory=dict)
    """reasoning-gym dataset config keys (e.g. {min_terms: 2, max_terms: 2}); size and seed are set by the workbench."""
    system_prompt: str | None = Field(None, max_length=MAX_TEXT_CHARS)
    """System message of conversational prompts (replaces the dataset's); needs a model with a chat template."""
    dataset: str | None = Field(None, max_length=MAX_REF_CHARS)
    """JSONL / CSV / saved `datasets` dir with a 'prompt' column (replaces the task's prompts)."""
    reward_funcs: list[Annotated[str, Field(max_length=MAX_REF_CHARS)]] = Field(default_factory=list, max_length=MAX_REWARD_FUNCS)
    """Reward functions by built-in name or import path 'package.module:function' (default: the task's)."""
    reward_weights: list[Annotated[float, Field(ge=-MAX_COEF, le=MAX_COEF)]] | None = Field(None, max_length=MAX_REWARD_FUNCS)
    """One weight per reward function (default 1 each; with reward_funcs empty, for the task's functions). Checked against the functions when the run starts."""
    algorithm: Algorithm = Field(default_factory=Algorithm)
    sampling: Sampling = Field(default_factory=Sampling)
    optim: Optim = Field(default_factory=Optim)
    train: Train = Field(default_factory=Train)
    logging: Logging = Field(default_factory=Logging)
    checkpoint: Checkpoint = Field(default_factory=Checkpoint)
    eval: Eval = Field(default_factory=Eval)
    lora: Lora = Field(default_factory=Lora)
    teacher: Teacher = Field(default_factory=Teacher)

    @field_validator("name")
    @classmethod
    def _plain_name(cls, value: str) -> str:
        """A name is a label, never a path: the run directory is ``slug(name)`` (runs/names.py),
        and a separator or control character here is refused rather than silently rewritten."""
        bad = next((c for c in value if c in "/\\" or unicodedata.category(c).startswith("C")), None)
        if bad is not None or not value.strip(". "):
            what = f"character {bad!r}" if bad is not None else "only dots and spaces"
            raise ValueError(f"{what} is not allowed; a label of at most {MAX_NAME_CHARS} characters "
                             "without path separators or control characters, e.g. grpo-lr3")
        return value

    @model_validator(mode="before")
    @classmethod
    def _short_spellings(cls, data: Any) -> Any:
        """``model: {name, lora}`` and ``teacher: X`` in their full form (lift_shorthands)."""
        return lift_shorthands(data)

    @model_validator(mode="after")
    def _cross(self):
        if self.task is None and self.dataset is None:
            raise ValueError("task and dataset are both empty: set one of them")
        batch = self.batch_size
        if batch > MAX_BATCH:
            raise ValueError(
                f"sampling.prompts_per_step x sampling.num_generations = {self.sampling.prompts_per_step} x "
                f"{self.sampling.num_generations} = {batch} completions per step: at most {MAX_BATCH}")
        _check_model(self)
        _check_task(self)
        per_update = self.train.minibatches * self.train.grad_accum
        if batch % per_update != 0:
            raise ValueError(
                f"the batch (sampling.prompts_per_step x sampling.num_generations = {batch}) must divide into "
                f"train.minibatches x train.grad_accum = {per_update} equal parts"
            )
        a = self.algorithm
        if a.kl_controller == "adaptive" and not batch / a.kl_horizon < 1.0 / ADAPTIVE_KL_ERROR_CLIP:
            raise ValueError(f"algorithm.kl_horizon={a.kl_horizon}: must exceed {ADAPTIVE_KL_ERROR_CLIP:g} x the batch "
                             f"({batch} completions), i.e. be > {ADAPTIVE_KL_ERROR_CLIP * batch:g}: one step below the "
                             "target would take the adaptive coefficient to 0 for good (verl 10000)")
        if spec("advantage", self.algorithm.advantage).needs_groups and self.sampling.num_generations < 2:
            raise ValueError(
                f"algorithm.advantage={self.algorithm.advantage!r} needs a group baseline: sampling.num_generations must be >= 2"
            )
        return self

    @property
    def batch_size(self) -> int:
        return self.sampling.prompts_per_step * self.sampling.num_generations

    # ---- core configs -------------------------------------------------------------------
    def advantage_config(self) -> "AdvantageConfig":
        from workbench.core.advantages import AdvantageConfig  # torch: only the engine and the labs call this

        a = self.algorithm
        return AdvantageConfig(
            group_size=self.sampling.num_generations,
            scale=a.grpo_scale,
            eps=a.adv_eps,
            gamma=a.gamma,
            lam=a.lam,
            kl_coef=a.kl_coef if a.kl_placement == "in_reward" else 0.0,
            whiten=a.whiten_advantages,
            gpg_alpha=a.gpg_alpha,
        )

    def distillation_config(self) -> "DistillationConfig":
        from workbench.core.distillation import DistillationConfig  # torch: only the engine and the labs call this

        t = self.teacher
        return DistillationConfig(coef=t.kl_coef, discount=t.kl_discount, mode=t.mode)

    def policy_loss_config(self) -> PolicyLossConfig:
        return PolicyLossConfig(**self.algorithm.policy_loss_kwargs())

    @property
    def token_level(self) -> bool:
        return spec("advantage", self.algorithm.advantage).level == "token"

    # ---- YAML ---------------------------------------------------------------------------
    def to_dict(self) -> dict[str, Any]:
        return self.model_dump(mode="json")

    def to_yaml(self) -> str:
        return yaml.safe_dump(self.to_dict(), sort_keys=False)

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> "Recipe":
        try:
            return cls.model_validate(data)
        except ValidationError as err:
            raise RecipeError(format_validation_error(err)) from None

    @classmethod
    def from_yaml(cls, text: str, source: str = "recipe YAML") -> "Recipe":
        """Parse and validate; ``source`` (e.g. the file) names where a YAML syntax error is."""
        data = _yaml_value(text, source, max_chars=MAX_FILE_BYTES) or {}
        if not isinstance(data, dict):
            raise RecipeError(f"a recipe is a YAML mapping, got {type(data).__name__}")
        return cls.from_dict(data)

    def with_overrides(self, overrides: list[str]) -> "Recipe":
        """Apply ``key.path=value`` strings (value parsed as YAML) and re-validate."""
        data = self.to_dict()
        for whole in overrides:
            key, sep, raw = whole.partition("=")
            item = short(whole)  # errors quote at most a prefix of what was typed
            if not sep or not key:
                raise RecipeError(f"--set {item}: expected key=value, e.g. algorithm.kl_coef=0.04")
            node = data
            parts = key.strip().split(".")
            for part in parts[:-1]:
                if not isinstance(node.get(part), dict):
                    raise RecipeError(f"--set {item}: {short(part)} is not a section of the recipe")
                node = node[part]
            if parts[-1] not in node:
                raise RecipeError(f"--set {item}: unknown field {short(key)}; fields here: {', '.join(node)}")
            node[parts[-1]] = _yaml_value(raw, f"--set {item}", root=key.strip()[:80], hint="; quote text, e.g. name='my run'")
            if parts == ["model"] and isinstance(node["model"], dict) and "lora" in node["model"]:
                data.pop("lora", None)  # --set model={name, lora} replaces the lora section it carries
            try:
                data = _section_defaults(lift_shorthands(data))
            except ValueError as err:
                raise RecipeError(f"--set {item}: {err}") from None
        return Recipe.from_dict(data)


def _section_defaults(data: dict[str, Any]) -> dict[str, Any]:
    """Every section of ``data`` with its missing fields at their defaults (a short spelling such
    as ``teacher: X`` names one field; the next ``--set`` may name another)."""
    sections = {name: f.annotation for name, f in Recipe.model_fields.items()
                if isinstance(f.annotation, type) and issubclass(f.annotation, BaseModel)}
    return {key: ({**sections[key]().model_dump(mode="json"), **value} if key in sections and isinstance(value, dict) else value)
            for key, value in data.items()}


def _yaml_value(text: str, where: str, hint: str = "", *, max_chars: int | None = None, root: str = "") -> Any:
    """``text`` parsed as YAML by the limited loader (workbench.yamlsafe: no aliases, bounded
    size, depth and integers); RecipeError naming ``where`` and the problem in one line."""
    try:
        return load_yaml(text, root=root, **({"max_chars": max_chars} if max_chars else {}))
    except YamlInputError as err:
        syntax = str(err).startswith("not valid YAML")
        raise RecipeError(f"{where}: {err}{hint if syntax else ''}") from None


# ---- what the model and the machine allow ---------------------------------------------------------

def model_positions(model: str) -> int | None:
    """The context length (positions) of ``model`` without loading it; None where it is not known
    (``workbench.model_facts`` reads it: nothing is downloaded and torch is not imported)."""
    facts = model_facts(model)
    return facts.max_positions if facts is not None else None


def conversational_task(recipe: "Recipe") -> bool:
    """The recipe's prompts are messages to render with a chat template (reasoning-gym tasks;
    the built-in tasks are text; a dataset's format is known only once it is read)."""
    return recipe.dataset is None and (recipe.task or "").startswith(REASONING_GYM_PREFIX)


def _check_model(recipe: "Recipe") -> None:
    """What the model allows, read from its files when they are here (``model_facts``):
    prompt + completion fit its positions (max_prompt_length + L_max <= positions; without
    max_prompt_length the prompt takes at least 1 token), and conversational prompts or a system
    prompt need its chat template. Where nothing is known, L_max <= MAX_COMPLETION_LENGTH."""
    s, model = recipe.sampling, recipe.model
    facts = model_facts(model)
    positions = facts.max_positions if facts is not None else None
    if positions is not None and s.max_prompt_length is None and s.max_completion_length > positions - 1:
        raise ValueError(
            f"sampling.max_completion_length={s.max_completion_length}: at most {positions - 1} "
            f"(model {model!r} has {positions} positions, and the prompt takes at least 1)")
    if positions is not None and s.max_prompt_length is not None and s.max_prompt_length + s.max_completion_length > positions:
        raise ValueError(
            f"sampling.max_prompt_length + sampling.max_completion_length = {s.max_prompt_length} + "
            f"{s.max_completion_length}: at most {positions} in all (the positions of model {model!r})")
    if positions is None and s.max_completion_length > MAX_COMPLETION_LENGTH:
        raise ValueError(
            f"sampling.max_completion_length={s.max_completion_length}: at most {MAX_COMPLETION_LENGTH} "
            f"(the context of model {model!r} is not known before it loads)")
    targets = recipe.lora.target_modules
    llama_layout = model == TINY_MODEL or (facts is not None and facts.shape is not None)  # other layouts: PEFT checks
    unknown = sorted(set(targets) - set(LLAMA_LINEAR_MODULES)) if targets != "all-linear" else []
    if recipe.lora.enabled and llama_layout and unknown:
        raise ValueError(f"lora.target_modules={targets}: {unknown[0]!r} is not a linear layer of model {model!r}; "
                         f"allowed: all-linear or names among {', '.join(LLAMA_LINEAR_MODULES)}")
    templated = conversational_task(recipe) or recipe.system_prompt is not None
    if facts is not None and templated and not facts.has_chat_template:
        what = "system_prompt" if recipe.system_prompt is not None else f"task={recipe.task!r} (conversational prompts)"
        raise ValueError(f"{what} needs a chat template, and model {model!r} has none: use a model with one (e.g. smollm2-135m)")


def _check_task(recipe: "Recipe") -> None:
    """Fields that only some tasks read: task_config (reasoning-gym), system_prompt (conversational
    prompts), an eval set for a dataset run."""
    rg = conversational_task(recipe)
    if recipe.task_config and not rg:
        raise ValueError(f"task_config={short(recipe.task_config)} is read only by reasoning_gym/<dataset> tasks, not task={recipe.task!r}")
    if recipe.system_prompt is not None and recipe.dataset is None and not rg:
        raise ValueError(
            f"system_prompt: task={recipe.task!r} has text prompts (standard format), which are not templated; "
            "a system prompt needs conversational prompts (reasoning_gym/<dataset> or a dataset of messages)")
    if recipe.eval.enabled and recipe.dataset is not None and recipe.eval.dataset is None:
        raise ValueError(
            f"eval.every={recipe.eval.every} with dataset={recipe.dataset!r}: set eval.dataset to held-out prompts "
            "(prompts that training never sees), or eval.every=0")


def format_validation_error(err: ValidationError, model: type[BaseModel] | None = None) -> str:
    """One line per problem: 'field.path=value: what is allowed'.

    An unknown key (``extra='forbid'``) lists the fields allowed at that place of ``model``
    (default: Recipe); a message that already starts with the field name is not prefixed twice.
    """
    lines = []
    for e in err.errors():
        loc = ".".join(str(p) for p in e["loc"])
        msg = e["msg"].removeprefix("Value error, ")
        if e["type"] == "extra_forbidden":
            allowed = _fields_at(model or Recipe, e["loc"][:-1])
            msg = f"unknown field; allowed here: {', '.join(allowed)}" if allowed else msg
        value = e.get("input")
        shown = "" if isinstance(value, dict) or not loc else f"={short(value)}"
        if loc and msg.startswith(f"{loc}{shown}"):
            lines.append(msg)
        else:
            lines.append(f"{loc}{shown}: {msg}" if loc else msg)
    return "invalid recipe:\n  " + "\n  ".join(lines)


def _fields_at(model: type[BaseModel], path: tuple) -> list[str]:
    """Field names of the (nested) section of ``model`` at ``path``; [] if it is not a section."""
    for part in path:
        field = model.model_fields.get(str(part))
        annotation = getattr(field, "annotation", None)
        if not (isinstance(annotation, type) and issubclass(annotation, BaseModel)):
            return []
        model = annotation
    return list(model.model_fields)


# ---- presets --------------------------------------------------------------------------------


def preset_names() -> list[str]:
    return sorted(p.stem for p in RECIPES_DIR.glob("*.yaml"))


def preset_path(name: str) -> Path:
    path = RECIPES_DIR / f"{name}.yaml"
    if name not in preset_names():
        raise RecipeError(f"unknown preset {name!r}; presets: {', '.join(preset_names())}")
    return path


def load_recipe(name_or_path: str, overrides: list[str] | None = None) -> Recipe:
    """A preset name (``grpo``) or a YAML file path, with optional ``--set`` overrides."""
    path = Path(name_or_path)
    if not (path.suffix in (".yaml", ".yml") and path.exists()):
        path = preset_path(name_or_path)
    try:
        data = read_yaml_file(path) or {}
    except YamlInputError as err:
        raise RecipeError(f"{short(str(path))}: {err}") from None
    if not isinstance(data, dict):
        raise RecipeError(f"a recipe is a YAML mapping, got {type(data).__name__}")
    recipe = Recipe.from_dict(data)
    return recipe.with_overrides(overrides) if overrides else recipe
