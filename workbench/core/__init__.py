"""``workbench.core``: the estimator maths, as pure tensor functions.

No I/O, no models, no global state. The engine, the teaching pages and the tests call these same
functions; there is no second copy of any formula. Families are registries with one signature
each (see each module's docstring); unknown names fail with the list of registered names, and
shapes that do not fit fail naming the tensor and both shapes.
"""

from .advantages import (
    ADVANTAGE_ESTIMATORS,
    CRITIC_ESTIMATORS,
    GROUP_ESTIMATORS,
    GRPO_SCALES,
    TOKEN_LEVEL_ESTIMATORS,
    AdvantageConfig,
    Advantages,
    compute_advantages,
    kl_shaped_sequence_rewards,
    token_level_rewards,
)
from .aggregation import LOSS_AGGREGATIONS, aggregate_loss, batch_normalizers
from .diagnostics import length_metrics, reward_metrics, token_mean_metric
from .kl import KL_ESTIMATORS, KL_PLACEMENTS, kl_per_token
from .masked import masked_mean, masked_sum, masked_var, masked_whiten
from .masks import opsm_mask, truncation_mask
from .objective import token_objective
from .policy_losses import (
    POLICY_LOSSES,
    REGION_NAMES,
    PolicyDiagnostics,
    PolicyLossConfig,
    clipped_objective,
    compute_policy_loss,
    dual_clip_cap,
    ppo_regions,
    sequence_log_ratio,
)
from .registry import Registry, UnknownNameError, check_choice
from .scan import reverse_discounted_cumsum
from .shapes import ShapeError
from .tokens import entropy_from_logits, logprobs_from_logits
from .value_loss import clipped_value_loss

__all__ = [
    "ADVANTAGE_ESTIMATORS", "CRITIC_ESTIMATORS", "GROUP_ESTIMATORS", "GRPO_SCALES", "TOKEN_LEVEL_ESTIMATORS", "AdvantageConfig", "Advantages",
    "compute_advantages", "kl_shaped_sequence_rewards", "token_level_rewards",
    "LOSS_AGGREGATIONS", "aggregate_loss", "batch_normalizers",
    "length_metrics", "reward_metrics", "token_mean_metric",
    "KL_ESTIMATORS", "KL_PLACEMENTS", "kl_per_token",
    "masked_mean", "masked_sum", "masked_var", "masked_whiten",
    "opsm_mask", "truncation_mask", "token_objective",
    "POLICY_LOSSES", "REGION_NAMES", "PolicyDiagnostics", "PolicyLossConfig", "clipped_objective",
    "compute_policy_loss", "dual_clip_cap", "ppo_regions", "sequence_log_ratio",
    "Registry", "UnknownNameError", "check_choice", "reverse_discounted_cumsum", "ShapeError",
    "entropy_from_logits", "logprobs_from_logits", "clipped_value_loss",
]
