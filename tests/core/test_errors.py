"""Unknown names list the registered ones; mismatched shapes name the tensor and the shapes."""

import pytest
import torch

from workbench.core import (
    ADVANTAGE_ESTIMATORS,
    KL_ESTIMATORS,
    LOSS_AGGREGATIONS,
    POLICY_LOSSES,
    AdvantageConfig,
    ShapeError,
    UnknownNameError,
    aggregate_loss,
    compute_advantages,
    compute_policy_loss,
    kl_per_token,
)


def test_registries_hold_every_required_name():
    assert set(ADVANTAGE_ESTIMATORS.names()) >= {"grpo", "rloo", "reinforce", "reinforce_pp", "reinforce_pp_baseline", "gae"}
    assert set(POLICY_LOSSES.names()) >= {"clip", "gspo", "cispo", "reinforce"}
    assert set(LOSS_AGGREGATIONS.names()) >= {"token-mean", "seq-mean-token-mean", "seq-mean-token-sum", "seq-mean-token-sum-norm"}
    assert set(KL_ESTIMATORS.names()) >= {"k1", "k2", "k3"}


@pytest.mark.parametrize(
    "call,listed",
    [
        (lambda: compute_advantages("grp0", torch.zeros(2), torch.ones(2, 3)), "grpo, rloo"),
        (lambda: compute_policy_loss("ppo", torch.zeros(1, 2), torch.zeros(1, 2), torch.zeros(1, 2), torch.ones(1, 2)), "clip, gspo, cispo, reinforce"),
        (lambda: aggregate_loss("mean", torch.zeros(1, 2), torch.ones(1, 2)), "token-mean, seq-mean-token-mean"),
        (lambda: kl_per_token("k4", torch.zeros(1, 2), torch.zeros(1, 2), torch.ones(1, 2)), "k1, k2, k3"),
    ],
)
def test_unknown_name_lists_registered(call, listed):
    with pytest.raises(UnknownNameError, match="registered: " + listed):
        call()


def test_shape_errors_name_tensors():
    with pytest.raises(ShapeError, match=r"advantages has shape \(2, 4\) but logp has shape \(2, 3\)"):
        compute_policy_loss("clip", torch.zeros(2, 3), torch.zeros(2, 3), torch.zeros(2, 4), torch.ones(2, 3))
    with pytest.raises(ShapeError, match=r"rewards must have shape \(B,\) = \(2,\), got \(3,\)"):
        compute_advantages("grpo", torch.zeros(3), torch.ones(2, 5))
    with pytest.raises(ShapeError, match="group_size=3 must be >= 1 and divide the batch size B=4"):
        compute_advantages("grpo", torch.zeros(4), torch.ones(4, 2), AdvantageConfig(group_size=3))
    with pytest.raises(ShapeError, match=r"mask must have shape \(B, T\), got shape \(4,\)"):
        compute_advantages("grpo", torch.zeros(4), torch.ones(4))


def test_gae_without_values_and_kl_coef_without_kl():
    with pytest.raises(ValueError, match="needs values"):
        compute_advantages("gae", torch.zeros(2), torch.ones(2, 3))
    with pytest.raises(ValueError, match="kl_coef=0.1 puts the KL in the reward"):
        compute_advantages("rloo", torch.zeros(2), torch.ones(2, 3), AdvantageConfig(group_size=2, kl_coef=0.1))


def test_bad_grpo_scale_names_field():
    with pytest.raises(ValueError, match="scale='std' is not allowed; choose one of: group, batch, none"):
        compute_advantages("grpo", torch.zeros(2), torch.ones(2, 3), AdvantageConfig(group_size=2, scale="std"))
