"""``workbench.core``: the estimator maths, as pure tensor functions.

No I/O, no models, no global state. The engine, the teaching pages and the tests call these same
functions; there is no second copy of any formula. Families are registries with one signature
each (see each module's docstring); unknown names fail with the list of registered names, and
shapes that do not fit fail naming the tensor and both shapes.
"""

import importlib

# Public name -> the submodule defining it. The submodules import torch, so nothing is imported
# until a name is first used (PEP 562): the recipe reads the torch-free ``choices`` and
# ``registry`` modules, and commands that do not train never load torch.
_EXPORTS: dict[str, tuple[str, ...]] = {
    "advantages": ("ADVANTAGE_ESTIMATORS", "REWARD_DTYPE", "AdvantageConfig", "Advantages", "combine_rewards",
                   "compute_advantages", "equal_groups", "kl_shaped_sequence_rewards", "path_variance",
                   "sum_pi_squared_from_logits", "token_level_rewards"),
    "aggregation": ("LOSS_AGGREGATIONS", "aggregate_loss", "batch_normalizers"),
    "choices": ("BASELINE_ESTIMATORS", "CRITIC_ESTIMATORS", "GROUP_ESTIMATORS", "GPG_ALPHAS", "GRPO_SCALES", "DISTILL_MODES", "IS_LEVELS", "IS_MODES",
                "MULTI_REWARD_MODES", "POLICY_STAT_ESTIMATORS", "REJECTION_MODES", "TOKEN_LEVEL_ESTIMATORS", "KL_PLACEMENTS", "PolicyLossConfig"),
    "correction": ("REJECTIONS", "batch_normalize_is_weights", "rejection_mask", "rollout_correction"),
    "distillation": ("ADVANTAGE_SHAPINGS", "DistillationConfig", "distillation_metrics", "opd_advantages",
                     "reverse_kl_per_token", "shape_advantages"),
    "diagnostics": ("length_metrics", "reward_function_metrics", "reward_metrics", "terminated_length_metrics",
                    "token_mean_metric", "token_std_metric"),
    "kl": ("KL_ESTIMATORS", "adaptive_kl_coef", "kl_per_token", "sequence_mean_kl", "straight_through_k2"),
    "kl_control": ("KL_CONTROLLERS",),
    "masked": ("masked_mean", "masked_sum", "masked_var", "masked_whiten"),
    "masks": ("high_entropy_mask", "opsm_mask", "truncation_mask"),
    "objective": ("Objective", "ObjectiveConfig", "TopEntropyRule", "policy_objective", "token_objective"),
    "policy_losses": ("PADDING", "POLICY_LOSSES", "REGION_NAMES", "PolicyDiagnostics", "clipped_objective", "compute_policy_loss",
                      "dual_clip_cap", "ppo_regions", "sequence_clip_fractions", "sequence_log_ratio", "token_covariance",
                      "vespo_gamma_weights"),
    "registry": ("Registry", "UnknownNameError", "check_choice"),
    "scan": ("reverse_discounted_cumsum",),
    "shapes": ("ShapeError",),
    "tokens": ("entropy_from_logits", "logprobs_from_logits"),
    "value_loss": ("clipped_value_loss",),
}
_MODULE_OF = {name: module for module, names in _EXPORTS.items() for name in names}

__all__ = list(_MODULE_OF)


def __getattr__(name: str):
    if name not in _MODULE_OF:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    value = getattr(importlib.import_module(f".{_MODULE_OF[name]}", __name__), name)
    globals()[name] = value  # later look-ups skip this function
    return value


def __dir__() -> list[str]:
    return sorted({*globals(), *__all__})
